"""The claims catalogue (other tools' conditions and taints, and the test that settles each), the
judgment of a claim from a sweep's checks, the history's record of judgments on both backends, and
the report's per-source precision.

The claims are the tools' own shapes: the EKS node monitoring agent sets
AcceleratedHardwareReady=False with reasons such as NvidiaXID79Error and DCGMDiagnosticFailure
(https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html), which Karpenter's node
repair replaces a node on (https://docs.aws.amazon.com/eks/latest/userguide/node-repair.html);
NVSentinel one condition per check, status True, reason <Check>IsNotHealthy (NVIDIA/NVSentinel#911,
#1471; 77 healthy nodes flagged in #1629, #1710); NVIDIA's DRA driver a device taint
gpu.nvidia.com/xid=<code>, NoSchedule for a fatal XID and None for the others, with no recovery
(kubernetes-sigs/dra-driver-nvidia-gpu#1455)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from sweeper.claims import Claim, claims_on, judge, judge_pair, load_catalog, parse_catalog, precision, safe
from sweeper.errors import ConfigError
from sweeper.history import History
from sweeper.kube.dra import DEVICES, fold_devices
from sweeper.report.claims import by_source, claims_section

T0 = 1_800_000_000.0


def node(conditions: list[dict[str, Any]] = (), taints: list[dict[str, Any]] = (),  # type: ignore[assignment]
         **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": "gpu-00"}, "spec": {"taints": list(taints)},
            "status": {"conditions": [{"type": "Ready", "status": "True"}, *conditions]}, **extra}


def test_the_shipped_catalogue_knows_each_source() -> None:
    cat = load_catalog()
    assert set(cat.sources) == {"eks-node-monitoring-agent", "nvsentinel", "node-problem-detector",
                                "nvidia-dra-driver"}
    assert all(s.doc.startswith("https://") and s.clear_doc.startswith("https://") for s in cat.sources.values())
    # only NVIDIA's DRA driver documents a recovery Sweeper may take: a restart of its kubelet plugin
    # (dra-driver-nvidia-gpu, docs/guides/gpu-health-checking.md, "Recovering from an unhealthy device");
    # NVSentinel's documented uncordon cancels a quarantine of a cordoned node, which Sweeper never
    # takes (https://docs.nvidia.com/nvsentinel/components/cancelling-breakfix); AWS and
    # node-problem-detector document none.
    assert {k: s.clear for k, s in cat.sources.items()} == {
        "eks-node-monitoring-agent": "never", "nvsentinel": "never", "node-problem-detector": "never",
        "nvidia-dra-driver": "restart-plugin"}
    assert {r.test for r in cat.rules} <= set(cat.tests)
    assert {k for k, t in cat.tests.items() if t.pair} == {"nvlink"}
    assert {k for k, t in cat.tests.items() if t.boot} == {"xid", "gpu"}


def test_a_clearing_source_names_the_owners_documentation() -> None:
    raw = {"sources": {"x": {"doc": "https://example.com", "clear": "restart-plugin"}},
           "tests": {"t": {"checks": ["xid"], "needs": ["xid"]}}, "rules": [{"source": "x", "condition": "C", "test": "t"}]}
    with pytest.raises(ConfigError, match="clear_doc"):
        parse_catalog(raw)
    with pytest.raises(ConfigError, match="clear"):
        parse_catalog({**raw, "sources": {"x": {"doc": "https://example.com", "clear": "patch-the-condition"}}})
    raw["sources"]["x"]["clear_doc"] = "https://example.com/recovery"
    assert parse_catalog(raw).sources["x"].clear == "restart-plugin"


def test_the_eks_agent_claims_with_a_false_condition_and_its_reason_picks_the_test() -> None:
    cat = load_catalog()
    xid = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
           "lastTransitionTime": "2027-01-15T08:00:00Z"}
    got = claims_on(node([xid]), cat)
    assert [(c.source, c.code, c.test) for c in got] == [
        ("eks-node-monitoring-agent", "AcceleratedHardwareReady:NvidiaXID79Error", "xid")]
    assert got[0].since > 0
    assert claims_on(node([{**xid, "status": "True", "reason": "AcceleratedHardwareIsReady"}]), cat) == []
    dcgm = claims_on(node([{**xid, "reason": "DCGMDiagnosticFailure"}]), cat)
    assert [c.test for c in dcgm] == ["dcgm"]
    other = claims_on(node([{**xid, "reason": "NeuronDMAError"}]), cat)
    assert [c.test for c in other] == ["gpu"]


def test_nvsentinel_and_npd_conditions_claim_when_true() -> None:
    cat = load_catalog()
    conds = [{"type": "GpuMemWatch", "status": "True", "reason": "GpuMemWatchIsNotHealthy"},
             {"type": "SysLogsXIDError", "status": "False", "reason": "SysLogsXIDErrorIsHealthy"},
             {"type": "GpuNvlink", "status": "True", "reason": "NVLinkDown"}]
    got = claims_on(node(conds, [{"key": "AggregatedNodeHealth", "value": "False", "effect": "NoSchedule"}]), cat)
    assert [(c.source, c.code, c.test) for c in got] == [
        ("node-problem-detector", "GpuNvlink:NVLinkDown", "nvlink"),
        ("nvsentinel", "AggregatedNodeHealth=False", "gpu"),
        ("nvsentinel", "GpuMemWatch:GpuMemWatchIsNotHealthy", "memory")]


def test_dra_device_taints_are_folded_in_and_only_scheduling_ones_claim() -> None:
    """A fatal XID taints NoSchedule; a non-fatal one carries effect None (informational): only
    the first is a claim of a broken GPU."""
    slices = [{"spec": {"driver": "gpu.nvidia.com", "nodeName": "gpu-00", "pool": {"name": "gpu-00", "generation": 1},
                        "devices": [{"name": "gpu-0", "taints": [{"key": "gpu.nvidia.com/xid", "value": "13",
                                                                   "effect": "None"}]},
                                    {"name": "gpu-3", "taints": [{"key": "gpu.nvidia.com/xid", "value": "79",
                                                                   "effect": "NoSchedule"}]}]}}]
    [folded] = fold_devices([node()], slices)
    assert folded[DEVICES]["gpu.nvidia.com"]["devices"] == ["gpu-0", "gpu-3"]
    got = claims_on(folded, load_catalog())
    assert [(c.source, c.code, c.detail) for c in got] == [("nvidia-dra-driver", "gpu.nvidia.com/xid=79",
                                                            "device gpu-3")]


def test_the_kubelets_conditions_are_never_claims(tmp_path) -> None:
    raw = {"sources": {"x": {"doc": "https://example.org"}}, "tests": {"t": {"checks": ["xid"], "needs": ["xid"]}},
           "rules": [{"source": "x", "condition": "DiskPressure", "test": "t"}]}
    with pytest.raises(ConfigError, match="kubelet"):
        parse_catalog(raw)
    with pytest.raises(ConfigError, match="nope"):
        parse_catalog({**raw, "rules": [{"source": "x", "condition": "GpuX", "test": "nope"}]})
    with pytest.raises(ConfigError, match="exactly one"):
        parse_catalog({**raw, "rules": [{"source": "x", "condition": "GpuX", "taint": "k", "test": "t"}]})
    with pytest.raises(ConfigError, match="clear"):
        parse_catalog({**raw, "sources": {"x": {"doc": "https://e", "clear": "delete-condition"}}, "rules": []})
    # a Ready=False written by anyone is the kubelet's business, not a claim
    assert claims_on(node([{"type": "Ready", "status": "False", "reason": "NvidiaXID79Error"}]), load_catalog()) == []


def test_judging_a_claim_from_the_checks() -> None:
    cat = load_catalog()
    claim = Claim("eks-node-monitoring-agent", "condition", "AcceleratedHardwareReady:NvidiaXID79Error", "xid")
    test = cat.tests["xid"]
    clean = [{"name": "xid", "status": "pass", "message": "no XID"}, {"name": "gpu.count", "status": "pass"}]
    assert judge(claim, test, clean, "pass")[0] == "refuted"
    found = [{"name": "xid", "status": "fail", "message": "XID 79 on GPU 3"}]
    assert judge(claim, test, found, "replace") == ("confirmed", "xid fail: XID 79 on GPU 3")
    # the check could not read the kernel log: never refuted
    assert judge(claim, test, [{"name": "xid", "status": "error", "message": "unreadable"}], "error")[0] == \
        "inconclusive"
    assert judge(claim, test, [{"name": "xid", "status": "skip", "message": "not read"}], "pass")[0] == "inconclusive"
    # a clean DCGM run does not refute an XID claim the kernel log was not read for
    assert judge(claim, test, [{"name": "dcgm.memory", "status": "pass"}], "pass")[0] == "inconclusive"
    assert judge(claim, test, clean, "inconclusive")[0] == "inconclusive"
    assert judge(claim, test, [], "error")[0] == "inconclusive"


def test_a_clean_kernel_log_does_not_refute_a_claim_made_before_the_boot() -> None:
    """`journalctl -b` and dmesg read the current boot only
    (https://www.freedesktop.org/software/systemd/man/latest/journalctl.html): an XID claim made
    before the node's current boot is out of their reach, so a clean log leaves it inconclusive; a
    check that finds the fault still confirms it. A claim made after the boot is refuted as before."""
    cat = load_catalog()
    test = cat.tests["xid"]
    before = Claim("eks-node-monitoring-agent", "condition", "AcceleratedHardwareReady:NvidiaXID79Error", "xid",
                   since=T0)
    clean = [{"name": "xid", "status": "pass", "message": "no XID"}]
    outcome, evidence = judge(before, test, clean, "pass", boot=T0 + 600)
    assert outcome == "inconclusive" and "before the node's current boot" in evidence
    assert judge(before, test, clean, "pass", boot=T0 - 600)[0] == "refuted"
    assert judge(before, test, clean, "pass")[0] == "refuted", "no boot time read: the claim's own time rules"
    dcgm = [*clean, {"name": "dcgm.memory", "status": "fail", "message": "GPU 3 failed"}]
    assert judge(before, test, dcgm, "quarantine", boot=T0 + 600)[0] == "confirmed"
    # a memory claim reads counters that outlive a reboot: its test is no `boot` test
    memory = Claim("nvsentinel", "condition", "GpuMemWatch:GpuMemWatchIsNotHealthy", "memory", since=T0)
    counters = [{"name": "ecc.volatile_uncorrected", "status": "pass"}, {"name": "row_remap", "status": "pass"}]
    assert judge(memory, cat.tests["memory"], counters, "pass", boot=T0 + 600)[0] == "refuted"


def test_an_nvlink_claim_is_refuted_only_when_its_own_checks_and_the_pair_passed() -> None:
    own_clean = ("refuted", "3 result(s) of nvlink.state passed")
    assert judge_pair(own_clean, "pass", "busbw 370 GB/s", "gpu-02")[0] == "refuted"
    assert judge_pair(own_clean, "fail", "busbw 148 GB/s below 300", "gpu-02") == (
        "confirmed", "pair with known-good gpu-02 failed: busbw 148 GB/s below 300")
    assert judge_pair(("confirmed", "nvlink.state fail: link 3 down"), "", "no partner", "")[0] == "confirmed"
    for status, why in (("", "no known-good partner of its group is idle"), ("error", "image not found"),
                        ("inconclusive", "stopped for pending work")):
        outcome, evidence = judge_pair(own_clean, status, why, "gpu-02" if status else "")
        assert outcome == "inconclusive" and why in evidence
    assert judge_pair(("inconclusive", "nvlink.state error"), "pass", "ok", "gpu-02")[0] == "inconclusive"


def test_outside_text_is_kept_to_a_safe_alphabet() -> None:
    assert safe("NvidiaXID<script>{{ 7*7 }}") == "NvidiaXID?script????7?7???"
    assert len(safe("x" * 500)) == 80


def test_the_history_keeps_judgments_per_source_and_code(new_state: Callable[[str], str]) -> None:
    h = History(new_state("h.db"), cluster="a")
    try:
        xid = {"source": "nvsentinel", "code": "GpuXidError:GpuXidErrorIsNotHealthy", "kind": "condition",
               "test": "xid", "since": T0}
        h.claim_result("r1", 1, "gpu-00", T0 + 10, xid, "refuted", "xid passed")
        h.claim_result("r1", 2, "gpu-01", T0 + 20, xid, "confirmed", "xid fail")
        h.claim_result("r1", 3, "gpu-02", T0 + 30, xid, "inconclusive", "xid error")
        h.claim_result("r1", 4, "gpu-03", T0 + 40, {**xid, "source": "eks-node-monitoring-agent"}, "refuted", "")
        with pytest.raises(ValueError):
            h.claim_result("r1", 5, "gpu-03", T0, xid, "cleared", "")
        assert h.claims_settled(["gpu-00", "gpu-02"]) == {("gpu-00", "nvsentinel", xid["code"]): T0 + 10}
        rows = h.claim_precision()
        assert [(r["source"], r["confirmed"], r["refuted"], r["inconclusive"], r["nodes"]) for r in rows] == [
            ("eks-node-monitoring-agent", 0, 1, 0, 1), ("nvsentinel", 1, 1, 1, 1)]
        assert h.claim_precision(since=T0 + 25)[1]["inconclusive"] == 1
        assert [r["outcome"] for r in h.node_claims("gpu-00")] == ["refuted"]
        other = h.for_cluster("b")
        assert other.claim_precision() == [] and other.claims_settled(["gpu-00"]) == {}
    finally:
        h.close()


def test_the_report_shows_each_sources_precision_escaped() -> None:
    rows = [{"source": "nvsentinel", "code": "GpuNvlinkWatch:GpuNvlinkWatchIsNotHealthy", "confirmed": 1,
             "refuted": 3, "inconclusive": 2, "nodes": 4, "last": T0},
            {"source": "nvsentinel", "code": "GpuXidError:<b>x</b>", "confirmed": 1, "refuted": 0, "inconclusive": 0,
             "nodes": 1, "last": T0},
            {"source": "eks-node-monitoring-agent", "code": "AcceleratedHardwareReady:NvidiaXID79Error",
             "confirmed": 0, "refuted": 0, "inconclusive": 1, "nodes": 1, "last": T0}]
    [eks, nvs] = by_source(rows)
    assert (nvs["confirmed"], nvs["refuted"], nvs["precision"]) == (2, 3, 0.4)
    assert eks["precision"] is None and precision({"confirmed": 3, "refuted": 1}) == 0.75
    page = claims_section(rows, {"nvsentinel": "https://github.com/NVIDIA/NVSentinel", "x": "javascript:alert(1)"})
    assert "<b>x</b>" not in page and "GpuXidError:&lt;b&gt;x&lt;/b&gt;" in page
    assert "<td><b>40%</b></td>" in page and '<a href="https://github.com/NVIDIA/NVSentinel">' in page
    assert "No other tool" in claims_section([])

"""Other tools' conditions and taints are claims: an idle node carrying one is swept first, and
the claim is recorded confirmed, refuted or inconclusive by Sweeper's own checks.

Why a claim is not trusted: NVSentinel flagged 77 healthy nodes at once (NVIDIA/NVSentinel#1629)
and kept healthy nodes flagged (NVIDIA/NVSentinel#1710); it reports GpuNvlinkWatch=True on healthy
single-node NVSwitch systems where IMEX does not apply (NVIDIA/NVSentinel#1471, NVIDIA/aicr#2641).
The EKS node monitoring agent's AcceleratedHardwareReady=False is what Karpenter's and EKS Auto
Mode's node repair replace a node on, after 10 minutes
(https://docs.aws.amazon.com/eks/latest/userguide/node-repair.html,
https://docs.aws.amazon.com/eks/latest/userguide/node-health-nma.html). NVIDIA's DRA driver taints
a device gpu.nvidia.com/xid=<code>:NoSchedule in its ResourceSlice and has no recovery: the taint
stays until its kubelet plugin restarts (kubernetes-sigs/dra-driver-nvidia-gpu#1455, #983;
KEP-5055 device taints)."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.errors import ConfigError
from sweeper.history import History
from sweeper.sim.rbac import allowed, attributes, object_name, rules_from_manifests
from sweeper.sweep import Sweep
from tests.cluster.test_rbac import manifest
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

NMA = {"condition": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
       "message": "NVIDIA XID 79 detected"}
XID79 = {"xids": [{"code": 79, "gpu": 3, "text": "GPU has fallen off the bus."}]}


def judged(history: History) -> dict[tuple[str, str, str], str]:
    """(node, source, code) -> outcome of every claim judged."""
    return {(r["node"], r["source"], r["code"]): r["outcome"]
            for r in history.query("select node, source, code, outcome from claims order by id")}


def test_a_false_accelerated_hardware_claim_is_refuted_and_a_true_one_confirmed(make_sim, history: History) -> None:
    """EKS node monitoring agent: AcceleratedHardwareReady=False, reason NvidiaXID79Error, on a node
    whose kernel log holds no XID (false) and on one whose GPU 3 fell off the bus (true). Under
    Karpenter node repair both would be replaced; Sweeper's kernel log check tells them apart."""
    sim: Sim = make_sim(fleet_spec(nodes=3, faults={"gpu-00": {"outside_claims": [NMA]},
                                                    "gpu-01": {**XID79, "outside_claims": [NMA]}}))
    run_sweep(sim, history)
    code = "AcceleratedHardwareReady:NvidiaXID79Error"
    assert judged(history) == {("gpu-00", "eks-node-monitoring-agent", code): "refuted",
                               ("gpu-01", "eks-node-monitoring-agent", code): "confirmed"}
    verdicts = {r["node"]: r["verdict"] for r in history.query("select node, verdict from node_sweeps")}
    assert verdicts["gpu-00"] == "pass" and verdicts["gpu-01"] in ("replace", "reboot", "quarantine")
    rows = history.claim_precision()
    assert [(r["source"], r["confirmed"], r["refuted"]) for r in rows] == [("eks-node-monitoring-agent", 1, 1)]
    # never cleared: the agent owns its condition
    cond = [c for c in sim.core.read_node("gpu-00").status.conditions if c.type == "AcceleratedHardwareReady"]
    assert cond and cond[0].status == "False"
    # `sweeper history NODE` says what became of the claim
    res = CliRunner().invoke(main, ["history", "gpu-00", "--state", str(history.path), "-o", "json"])
    assert res.exit_code == 0, res.output
    [claim] = json.loads(res.stdout)["claims"]
    assert (claim["source"], claim["code"], claim["outcome"]) == ("eks-node-monitoring-agent", code, "refuted")
    text = CliRunner().invoke(main, ["history", "gpu-00", "--state", str(history.path)]).stdout
    assert "other tools' claims, tested" in text and "refuted" in text


def test_a_node_carrying_a_claim_is_swept_first(make_sim, history: History) -> None:
    """With one slot, the node NVSentinel flags (GpuNvlinkWatch=True, NVIDIA/NVSentinel#1471's false
    positive) is taken before the never-swept others, and its NVLink check refutes the claim."""
    nvs = {"condition": "GpuNvlinkWatch", "status": "True", "reason": "GpuNvlinkWatchIsNotHealthy",
           "message": "ErrorCode:DCGM_FR_IMEX_UNHEALTHY GPU:0 IMEX daemon status is -3 (not READY)"}
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-03": {"outside_claims": [nvs]}}))
    run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=1))
    first = history.query("select node from node_sweeps order by id limit 1")
    assert first == [{"node": "gpu-03"}]
    assert judged(history) == {("gpu-03", "nvsentinel", "GpuNvlinkWatch:GpuNvlinkWatchIsNotHealthy"): "refuted"}


def test_a_dra_device_taint_is_tested_by_the_kernel_log(make_sim, history: History) -> None:
    """NVIDIA's DRA driver taints a device gpu.nvidia.com/xid=79:NoSchedule in its ResourceSlice and
    never takes it off by itself (dra-driver-nvidia-gpu#1455): Sweeper tests it. A true taint (the
    GPU did fall off the bus) is confirmed, a false one refuted."""
    taint = {"device_taint": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "device": "gpu-3"}
    spec = fleet_spec(nodes=2, faults={"gpu-00": {"outside_claims": [taint]},
                                       "gpu-01": {**XID79, "outside_claims": [taint]}})
    spec["node_groups"][0]["dra"] = True
    sim: Sim = make_sim(spec)
    run_sweep(sim, history)
    assert judged(history) == {("gpu-00", "nvidia-dra-driver", "gpu.nvidia.com/xid=79"): "refuted",
                               ("gpu-01", "nvidia-dra-driver", "gpu.nvidia.com/xid=79"): "confirmed"}


def device_taints(sim: Sim, node: str) -> list[tuple[str, str]]:
    """(device, taint key) in the node's ResourceSlice, from the simulated cluster's store."""
    with sim.cluster.store.lock:
        rslice = next(s for s in sim.cluster.store.iter("resourceslices") if s["spec"]["nodeName"] == node)
        return [(d["name"], t["key"]) for d in rslice["spec"]["devices"] for t in d.get("taints") or []]


def plugin_pods(sim: Sim, node: str) -> list[str]:
    with sim.cluster.store.lock:
        return [p["metadata"]["uid"] for p in sim.cluster.store.iter("pods")
                if p["metadata"].get("namespace") == "dra-driver-nvidia-gpu" and p["spec"].get("nodeName") == node]


def test_a_refuted_dra_device_taint_is_cleared_only_where_configured(make_sim, history: History) -> None:
    """The DRA driver's guide documents its recovery: device taints stay until the GPU kubelet plugin
    restarts, which re-evaluates health and taints again only what NVML still reports
    (https://github.com/kubernetes-sigs/dra-driver-nvidia-gpu/blob/main/site/content/docs/guides/gpu-health-checking.md,
    "Recovering from an unhealthy device"). With `claims_clear: [nvidia-dra-driver]` Sweeper restarts
    the plugin on the node whose taint it refuted (its pod there; the DaemonSet starts another), and
    leaves the confirmed one alone; by default it clears nothing."""
    taint = {"device_taint": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "device": "gpu-3"}
    spec = fleet_spec(nodes=2, faults={"gpu-00": {"outside_claims": [taint]},
                                       "gpu-01": {**XID79, "outside_claims": [taint]}})
    spec["node_groups"][0]["dra"] = True
    sim: Sim = make_sim(spec)
    sim.wait_for(lambda: all(plugin_pods(sim, n) for n in ("gpu-00", "gpu-01")), what="the plugin pods")
    before = {n: plugin_pods(sim, n) for n in ("gpu-00", "gpu-01")}
    start = len(sim.cluster.store.requests)
    run_sweep(sim, history, replace(TEST_CONFIG, claims_clear=("nvidia-dra-driver",)))
    # the one call beyond the ClusterRole is the plugin pod's delete, which deploy/claims/dra-plugin.yaml grants
    calls = {(*a, object_name(p)) for m, p in sim.cluster.store.requests[start:]
             if (a := attributes(m, p)) is not None}
    base = rules_from_manifests(manifest(), "sweeper", "sweeper")
    extra = rules_from_manifests(manifest("claims/dra-plugin.yaml"), "sweeper", "sweeper")
    beyond = {c[:4] for c in calls if allowed(base, *c) is None}
    assert beyond == {("", "pods", "delete", "dra-driver-nvidia-gpu")}, beyond
    assert all(allowed(base + extra, *c) is not None for c in calls)
    code = "gpu.nvidia.com/xid=79"
    assert judged(history)[("gpu-00", "nvidia-dra-driver", code)] == "refuted"
    assert judged(history)[("gpu-01", "nvidia-dra-driver", code)] == "confirmed"
    sim.wait_for(lambda: plugin_pods(sim, "gpu-00") and plugin_pods(sim, "gpu-00") != before["gpu-00"],
                 what="gpu-00's kubelet plugin restarted")
    assert device_taints(sim, "gpu-00") == [], "the restarted plugin publishes no taint NVML does not report"
    assert device_taints(sim, "gpu-01") == [("gpu-3", "gpu.nvidia.com/xid")], "a confirmed claim is never cleared"
    assert plugin_pods(sim, "gpu-01") == before["gpu-01"]
    cleared = history.query("select node, action, detail from actions where action like 'claim-%'")
    assert [(r["node"], r["action"]) for r in cleared] == [("gpu-00", "claim-cleared")], cleared
    assert "kubelet plugin dra-driver-nvidia-gpu/" in cleared[0]["detail"]


def test_claims_are_never_cleared_by_default_nor_for_an_owner_that_documents_no_way(make_sim,
                                                                                  history: History) -> None:
    """By default (`claims_clear` empty) a refuted device taint stays; and naming a source whose owner
    documents no way Sweeper may take (the EKS agent, NVSentinel, node-problem-detector) is refused."""
    taint = {"device_taint": "gpu.nvidia.com/xid", "value": "79", "effect": "NoSchedule", "device": "gpu-3"}
    spec = fleet_spec(nodes=1, faults={"gpu-00": {"outside_claims": [taint]}})
    spec["node_groups"][0]["dra"] = True
    sim: Sim = make_sim(spec)
    sim.wait_for(lambda: plugin_pods(sim, "gpu-00"), what="the plugin pod")
    before = plugin_pods(sim, "gpu-00")
    run_sweep(sim, history)
    assert judged(history) == {("gpu-00", "nvidia-dra-driver", "gpu.nvidia.com/xid=79"): "refuted"}
    assert device_taints(sim, "gpu-00") == [("gpu-3", "gpu.nvidia.com/xid")]
    assert plugin_pods(sim, "gpu-00") == before
    for source in ("eks-node-monitoring-agent", "nvsentinel", "node-problem-detector", "no-such-tool"):
        with pytest.raises(ConfigError, match=f"claims_clear: {source}"):
            run_sweep(sim, history, replace(TEST_CONFIG, claims_clear=(source,)))


def test_a_claim_whose_test_did_not_run_is_inconclusive_never_refuted(make_sim, history: History) -> None:
    """AcceleratedHardwareReady=False with reason DCGMDiagnosticFailure is DCGM's word: the light
    sweep runs no DCGM diagnostic, so the claim stays inconclusive, and is tested again next time."""
    dcgm = {**NMA, "reason": "DCGMDiagnosticFailure", "message": "a DCGM diagnostic test failed"}
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-00": {"outside_claims": [dcgm]}}))
    run_sweep(sim, history)
    rows = history.query("select outcome, evidence from claims")
    assert [r["outcome"] for r in rows] == ["inconclusive"]
    assert "dcgm.*" in rows[0]["evidence"]
    assert history.claims_settled(["gpu-00"]) == {}


def test_a_settled_claim_does_not_jump_the_queue_again(make_sim, history: History) -> None:
    """Once refuted, a claim that stays on the node (the owner never clears it) is not a reason to
    sweep the node again before it is due."""
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-00": {"outside_claims": [NMA]}}))
    run_sweep(sim, history)
    assert history.claims_settled(["gpu-00"])
    sim.cluster.clock.advance(3600)
    again = run_sweep(sim, history)
    skipped = {d.node.name: d.reason for d in again.plan.skip}
    assert skipped.get("gpu-00") == "not-due", skipped


def test_claim_text_is_data_kept_to_a_safe_alphabet(make_sim, history: History) -> None:
    """A condition's reason and message are written by whoever can patch the node: what is stored
    and shown of them is letters, digits and a few marks, never markup or template source."""
    hostile: dict[str, Any] = {**NMA, "reason": "NvidiaXID<script>alert(1)</script>{{ 7*7 }}",
                               "message": "{% for x in range(9) %}<img src=x onerror=alert(1)>"}
    sim: Sim = make_sim(fleet_spec(nodes=1, faults={"gpu-00": {"outside_claims": [hostile]}}))
    run_sweep(sim, history)
    rows = history.query("select code, outcome from claims")
    assert len(rows) == 1 and rows[0]["outcome"] == "refuted"
    assert "<" not in rows[0]["code"] and "{" not in rows[0]["code"] and " " not in rows[0]["code"]
    assert rows[0]["code"].startswith("AcceleratedHardwareReady:NvidiaXID?script?")


def test_a_claim_on_a_busy_node_waits_for_it_to_be_idle(make_sim, history: History) -> None:
    """A claim never makes Sweeper disturb running work: the node with a training pod on all its
    GPUs is skipped as busy (at most the light check, which holds nothing), and its claim waits,
    untested."""
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-00": {"outside_claims": [NMA]}},
                                   workloads=[{"node": "gpu-00", "gpus": 8}]))
    sim.wait_for(lambda: any(p.status.phase == "Running" for p in sim.core.list_pod_for_all_namespaces().items
                             if p.spec.node_name == "gpu-00"), what="the training pod running")
    report = run_sweep(sim, history)
    assert {d.node.name: d.reason for d in report.plan.skip}.get("gpu-00") == "busy"
    assert [r["kind"] for r in history.query("select kind from node_sweeps where node = 'gpu-00'")] in ([], ["light"])
    assert judged(history) == {}


# An NVLink or fabric claim: the node's NVLink check, and a pair with a known-good partner.
# NVSentinel's GpuNvlinkWatch (NVIDIA/NVSentinel#1471) and node-problem-detector's GpuNvlink
# condition are NVLink claims; the fault that only a pair finds is the simulator's degraded link
# (`link_degraded`: a pair runs at the slower node's fabric rate, nccl-tests' busbw). A pair's
# verdict is its slower node's, so only a partner known to be good names the node
# (test_pair_sweep.test_a_degraded_link_is_named_through_re_pairing).
NVLINK = {"condition": "GpuNvlink", "status": "True", "reason": "NVLinkDown", "message": "NVLink errors"}
NVLINK_CODE = "GpuNvlink:NVLinkDown"


def with_pairs(**kw: Any) -> Any:
    return replace(TEST_CONFIG, claims_pair_playbook="pair-fabric.yaml", light_playbook="", **kw)


def known_good(sim: Sim, history: History, *nodes: str) -> None:
    """`nodes` passed a pair sweep together an hour ago (what the history of a pair schedule holds)."""
    history.pair_result("earlier", sim.cluster.clock.now() - 3600, nodes[0], nodes[1], "pass", "sweep", 380.0, "")


def claim_rows(history: History) -> list[dict[str, Any]]:
    return history.query("select node, outcome, evidence from claims order by id")


def test_the_claims_pair_playbook_is_the_pair_schedules_unless_named(make_sim, history: History) -> None:
    """`auto` takes the pair playbook of a `sweeper serve` schedule; a named one must be a pair
    playbook; none configured, the NVLink checks alone settle an NVLink claim (as on a fleet with
    no pair sweeps: test_a_node_carrying_a_claim_is_swept_first)."""
    sim: Sim = make_sim(fleet_spec(nodes=1))
    fabric = {"name": "fabric", "cron": "0 2 * * *", "playbook": "pair-fabric.yaml"}
    light = {"name": "full", "cron": "*/30 * * * *", "playbook": "sweep-light.yaml"}
    book = Sweep(sim.kube, replace(TEST_CONFIG, schedules=(light, fabric)), history).claims_pair_playbook
    assert book is not None and book.pair and book.name == "pair fabric"
    assert Sweep(sim.kube, replace(TEST_CONFIG, schedules=(light,)), history).claims_pair_playbook is None
    assert Sweep(sim.kube, TEST_CONFIG, history).claims_pair_playbook is None
    with pytest.raises(ConfigError, match="not a pair playbook"):
        Sweep(sim.kube, replace(TEST_CONFIG, claims_pair_playbook="sweep-light.yaml"), history)


def test_an_nvlink_claim_the_nvlink_check_misses_is_confirmed_by_a_pair(make_sim, history: History) -> None:
    """The node's own NVLink check passes (its links are up); its fabric is degraded. Paired with an
    idle known-good partner, the pair fails: the claim is confirmed, and the node goes through the
    policy with the pair's verdict, as Sweeper's own finding."""
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-00": {"link_degraded": 0.4, "outside_claims": [NVLINK]}}))
    known_good(sim, history, "gpu-02", "gpu-03")
    run_sweep(sim, history, with_pairs())
    assert judged(history) == {("gpu-00", "node-problem-detector", NVLINK_CODE): "confirmed"}
    [row] = claim_rows(history)
    assert "pair with known-good gpu-0" in row["evidence"] and "failed" in row["evidence"], row
    repairs = [(r["node"], r["partner"], r["status"], r["mode"])
               for r in history.query("select * from pairs where run_id != 'earlier' order by id")]
    assert len(repairs) == 1 and repairs[0][0] == "gpu-00" and repairs[0][1] in ("gpu-02", "gpu-03")
    assert repairs[0][2:] == ("fail", "repair")
    rows = history.query("select verdict, kind from node_sweeps where node = 'gpu-00' order by id")
    assert [r["kind"] for r in rows] == ["sweep", "pair"] and rows[0]["verdict"] == "pass"
    assert rows[1]["verdict"] in ("reboot", "replace", "quarantine")


def test_an_nvlink_claim_is_refuted_only_when_the_nvlink_check_and_the_pair_both_pass(make_sim,
                                                                                     history: History) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-00": {"outside_claims": [NVLINK]}}))
    known_good(sim, history, "gpu-02", "gpu-03")
    report = run_sweep(sim, history, with_pairs())
    assert judged(history) == {("gpu-00", "node-problem-detector", NVLINK_CODE): "refuted"}, claim_rows(history)
    [row] = claim_rows(history)
    assert "nvlink.state" in row["evidence"] and "pair with known-good gpu-0" in row["evidence"], row
    assert {(o.node, o.action) for o in report.outcomes if o.node == "gpu-00"} == {("gpu-00", "released")}
    assert history.claims_settled(["gpu-00"])


def test_an_nvlink_claim_with_no_known_good_partner_is_inconclusive(make_sim, history: History) -> None:
    """No pair passed in the history: no partner can name the node, so the NVLink check alone does
    not refute the claim; it stays untested and is tried again next time."""
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-00": {"outside_claims": [NVLINK]}}))
    run_sweep(sim, history, with_pairs())
    assert judged(history) == {("gpu-00", "node-problem-detector", NVLINK_CODE): "inconclusive"}
    [row] = claim_rows(history)
    assert "no known-good partner" in row["evidence"], row
    assert history.query("select * from pairs") == []
    assert history.claims_settled(["gpu-00"]) == {}


def test_an_nvlink_claim_whose_pair_errs_is_inconclusive(make_sim, history: History) -> None:
    """A pair that could not run (a fault of the check: its image cannot be pulled) is no word on
    the node: the claim stays inconclusive, never refuted."""
    sim: Sim = make_sim(fleet_spec(nodes=4, faults={"gpu-00": {"outside_claims": [NVLINK]}},
                                   registry={"missing": [TEST_CONFIG.pair_image]}))
    known_good(sim, history, "gpu-02", "gpu-03")
    run_sweep(sim, history, with_pairs())
    assert judged(history) == {("gpu-00", "node-problem-detector", NVLINK_CODE): "inconclusive"}
    [row] = claim_rows(history)
    assert "error" in row["evidence"], row


# A claim made before the node's current boot. The kubelet reports a boot only as
# NodeSystemInfo.bootID, a UUID with no time
# (https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/node-v1/#NodeSystemInfo);
# the check reads when the running kernel booted from the node itself (/proc/uptime, as
# node_exporter's node_boot_time_seconds does from /proc/stat), and journalctl -b and dmesg read
# this boot only (https://www.freedesktop.org/software/systemd/man/latest/journalctl.html).


def test_an_xid_claim_made_before_the_nodes_current_boot_is_not_refuted_by_its_kernel_log(
        make_sim, history: History) -> None:
    """gpu-00 had XID 79 and the agent said so; the node then rebooted, and this boot's kernel log
    holds no XID. Without a check that exercises the hardware, that is no refutation: inconclusive,
    with the reason. gpu-01, also rebooted, never had the XID: the log cannot tell it apart, so it
    is inconclusive too. gpu-02 did not reboot: its log holds the XID, confirmed."""
    sim: Sim = make_sim(fleet_spec(nodes=3, faults={"gpu-00": {**XID79, "outside_claims": [NMA]},
                                                    "gpu-01": {"outside_claims": [NMA]},
                                                    "gpu-02": {**XID79, "outside_claims": [NMA]}}))
    sim.cluster.clock.advance(1800)
    boot_ids = {n: sim.core.read_node(n).status.node_info.boot_id for n in ("gpu-00", "gpu-01", "gpu-02")}
    with sim.cluster.store.lock:
        for node in ("gpu-00", "gpu-01"):
            sim.cluster.reboot(node, sim.cluster.clock.now())
    # what the kubelet says of a boot: a new ID, no time
    assert [n for n in boot_ids if sim.core.read_node(n).status.node_info.boot_id != boot_ids[n]] == ["gpu-00", "gpu-01"]
    run_sweep(sim, history)
    code = "AcceleratedHardwareReady:NvidiaXID79Error"
    assert judged(history) == {("gpu-00", "eks-node-monitoring-agent", code): "inconclusive",
                               ("gpu-01", "eks-node-monitoring-agent", code): "inconclusive",
                               ("gpu-02", "eks-node-monitoring-agent", code): "confirmed"}
    evidence = {r["node"]: r["evidence"] for r in claim_rows(history)}
    assert "before the node's current boot" in evidence["gpu-00"], evidence
    assert history.claims_settled(["gpu-00", "gpu-01"]) == {}


def test_a_claim_made_before_the_boot_is_confirmed_by_dcgm(make_sim, history: History) -> None:
    """The same rebooted node under the DCGM playbook: DCGM exercises the GPU and finds the fault
    the reboot did not cure, which confirms the claim whatever this boot's log holds."""
    sim: Sim = make_sim(fleet_spec(nodes=2, faults={"gpu-00": {**XID79, "dcgm_fail": {3: "memory"},
                                                               "outside_claims": [NMA]}}))
    sim.cluster.clock.advance(1800)
    with sim.cluster.store.lock:
        sim.cluster.reboot("gpu-00", sim.cluster.clock.now())
    run_sweep(sim, history, replace(TEST_CONFIG, playbook="sweep-dcgm.yaml"))
    assert judged(history) == {("gpu-00", "eks-node-monitoring-agent", "AcceleratedHardwareReady:NvidiaXID79Error"):
                               "confirmed"}
    [row] = claim_rows(history)
    assert row["evidence"].startswith("dcgm"), row

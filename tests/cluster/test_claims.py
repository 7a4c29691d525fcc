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

from click.testing import CliRunner

from sweeper.cli import main
from sweeper.history import History
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

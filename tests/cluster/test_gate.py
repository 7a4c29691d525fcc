"""The gate for new nodes (issue 25), against the simulated cluster: a node that joins with Sweeper's
startup taint is swept with the deep playbook within the gate's own budget, and the taint comes off
only after a pass is in the history; a failure holds it and replaces it; a node back from Sweeper's
reboot is soaked under load before hand-back.

Karpenter's NodePool `startupTaints`: "If Karpenter encounters a startup taint in the NodePool it
will be applied to nodes that are provisioned, but pods do not need to tolerate the taint.
Karpenter assumes that the taint is temporary and some other system will remove the taint"
(https://karpenter.sh/docs/concepts/nodepools/). An EKS node group's taints are the other way in
(https://docs.aws.amazon.com/eks/latest/userguide/node-taints-managed-node-groups.html). NVIDIA's
GPU Operator keeps a startup taint on until the node is ready (NVIDIA/gpu-operator PR#2573);
NVSentinel validates new nodes (NVIDIA/NVSentinel PR#1821)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from sweeper.cli import main
from sweeper.fleet import NodeView
from sweeper.history import History
from tests import procs
from tests.cluster.test_safety import _sweep_cmd, kill_sweep_at
from tests.conftest import TEST_CONFIG, Sim, run_sweep

GATE = "sweeper.dev/unvalidated"
CFG = replace(TEST_CONFIG, gate_taint=GATE, max_nodes=0)  # the fleet may take no node: the gate has its own budget
KARPENTER = replace(CFG, remediation={"default": "manual", "by_pool": {"gpu": "karpenter"}, "by_profile": {}},
                    replacement_wait=300, remediate_reboots=True)


def gated_fleet(new: int = 1, faults: dict[str, Any] | None = None, boot: str = "0s", old: int = 2,
                **extra: Any) -> dict[str, Any]:
    pool = {"karpenter.sh/nodepool": "gpu"}
    return {"name": "gate", "seed": 3, "speed": 600, "faults": faults or {}, **extra,
            "node_groups": [{"name_prefix": "gpu-", "count": old, "age": "2d", "labels": pool},
                            {"name_prefix": "new-", "count": new, "age": 0, "boot": boot, "labels": pool,
                             "startup_taints": [{"key": GATE, "effect": "NoSchedule"}]}]}


def taints(sim: Sim, name: str) -> list[dict[str, Any]]:
    return list(sim.kube.get_node(name)["spec"].get("taints") or [])


def test_a_new_node_is_swept_deep_and_its_taint_removed_only_after_the_pass(make_sim, history: History) -> None:
    """Karpenter startupTaints: the taint Karpenter expects another controller to remove; Sweeper
    removes its own (and only its own) once the deep sweep's pass is recorded."""
    sim: Sim = make_sim(gated_fleet())
    other = {"key": "example.com/dedicated", "value": "ml", "effect": "PreferNoSchedule"}
    sim.kube.patch_node("new-00", [{"op": "add", "path": "/spec/taints/-", "value": other}])
    report = run_sweep(sim, history, CFG)
    assert report.plan.budget == 0 and report.plan.gate_budget == CFG.gate_max_nodes
    assert {o.node: o.verdict for o in report.outcomes} == {"new-00": "pass"}, report.outcomes
    assert taints(sim, "new-00") == [other], "the gate's taint is off; a taint Sweeper does not own stays"
    sweep = history.db.query("select * from node_sweeps where node = 'new-00'")
    [row] = list(sweep)
    assert row["playbook"] == "deep quarantine check" and row["verdict"] == "pass"
    ops = [(r["op"], r["phase"], r["ts"]) for r in history.db.query(
        "select * from intents where node = 'new-00' order by id")]
    assert ops[-2:][0][:2] == ("ungate", "before") and ops[-1][:2] == ("ungate", "after")
    assert row["finished"] <= ops[-2][2], "the pass was recorded before the taint came off"


def test_main_leaves_a_startup_tainted_node_alone_and_without_the_gate_it_stays_tainted(make_sim,
                                                                                       history: History) -> None:
    """With the gate off (gate_taint ""), the startup taint is someone else's: never removed."""
    sim: Sim = make_sim(gated_fleet())
    report = run_sweep(sim, history, replace(CFG, gate_taint="", max_nodes=8))
    assert "new-00" not in {o.node for o in report.outcomes}
    assert [t["key"] for t in taints(sim, "new-00")] == [GATE]


def test_a_new_node_that_fails_is_held_and_replaced_not_rebooted(make_sim, history: History) -> None:
    """A new node serves no work yet: one that fails its gate goes to its NodeClaim's deletion."""
    sim: Sim = make_sim(gated_fleet(faults={"new-00": {"remap_pending": [5]}}))  # a GPU reset, on a fleet node
    claim = next(c["metadata"]["name"] for c in sim.kube.list_nodeclaims() if c["status"]["nodeName"] == "new-00")
    report = run_sweep(sim, history, KARPENTER)
    [out] = report.outcomes
    assert (out.node, out.verdict, out.action) == ("new-00", "replace", "held")
    assert any("replaced, not rebooted" in r for r in out.reasons)
    assert claim not in {c["metadata"]["name"] for c in sim.kube.list_nodeclaims()}, "its NodeClaim is deleted"
    assert not sim.kube.list_jobs(KARPENTER.remediation_namespace, ""), "no reboot Job"
    acts = {a["action"] for a in history.db.query("select action from actions where node = 'new-00'")}
    assert "remediate-karpenter" in acts and "ungate" not in acts
    # issue 25, point 3: the evidence is kept before Karpenter takes the node away, as for a fleet node
    assert [r["run_id"] for r in history.evidence_runs("new-00")] == [report.run_id]


def test_a_node_not_ready_waits_then_fails_past_the_deadline(make_sim, history: History) -> None:
    """Not Ready, or no GPU advertised (device plugin not up), is no failure of the node until gate_deadline."""
    # The first look must fall before the deadline and the second before the node is Ready. At 600x a
    # deadline of 1200 simulated seconds was 2 s of real time, which a loaded machine spent between the
    # node's join and the plan ("not Ready 1778s after it joined"): 2 hours (12 s) and a boot of 6 hours
    # leave each look room for a machine six times slower.
    sim: Sim = make_sim(gated_fleet(boot="6h"))
    cfg = replace(KARPENTER, gate_deadline=7200)
    first = run_sweep(sim, history, cfg)
    assert first.outcomes == []
    [d] = first.plan.gate
    assert d.reason == "gate-waiting" and "not Ready" in d.detail
    assert [t["key"] for t in taints(sim, "new-00")] == [GATE]
    sim.cluster.clock.advance(7300)
    second = run_sweep(sim, history, cfg)
    [out] = second.outcomes
    assert (out.node, out.verdict) == ("new-00", "replace") and "gate_deadline" in out.reasons[0]
    assert "new-00" not in {c["status"]["nodeName"] for c in sim.kube.list_nodeclaims()}
    sim.cluster.clock.advance(900)
    sim.wait_for(lambda: any(c.get("spec", {}).get("startupTaints") for c in sim.kube.list_nodeclaims()
                             if c["status"]["nodeName"] not in ("gpu-00", "gpu-01", "new-00")),
                 what="Karpenter's replacement, launched with the startup taint")


def test_a_gated_node_with_work_on_it_is_not_disturbed(make_sim, history: History) -> None:
    """Someone tolerated the taint and runs a pod there: the gate leaves the node (and its taint) be."""
    sim: Sim = make_sim(gated_fleet())
    sim.cluster.start_training(8, None, node="new-00", running=True)
    report = run_sweep(sim, history, CFG)
    assert report.outcomes == []
    [d] = report.plan.gate
    assert d.reason == "gate-occupied"
    assert [t["key"] for t in taints(sim, "new-00")] == [GATE]
    assert not [w for w in sim.writes_to("new-00")], "not one write to the node"


def test_the_gate_has_its_own_budget(make_sim, history: History) -> None:
    """gate_max_nodes bounds the gate; the fleet's budget and floor neither count nor bind it."""
    sim: Sim = make_sim(gated_fleet(new=3))
    sweep = run_sweep(sim, history, replace(CFG, gate_max_nodes=1, min_healthy_nodes=5), dry_run=True)
    reasons = sorted(d.reason for d in sweep.plan.gate)
    assert reasons == ["gate", "gate-queued", "gate-queued"], "one at a time, though the floor forbids the fleet any"
    assert sweep.plan.budget == 0 and sweep.plan.gpu_nodes == 2, "gated nodes are not the fleet's yet"


def test_a_gate_in_flight_when_sweeper_died_is_picked_up_again(make_sim, history: History) -> None:
    """A run killed mid-gate leaves its taint and an open sweep row: the next run's reconcile hands the
    node back to the gate (its startup taint stays on), which sweeps it again."""
    sim: Sim = make_sim(gated_fleet())
    now = sim.cluster.clock.now()
    history.run_started("dead-run", now - 600, "sweep")
    history.sweep_started("dead-run", "new-00", now - 590, "deep quarantine check", "p5.48xlarge")
    history.intent("dead-run", "new-00", now - 595, "taint", "after", "")
    sim.kube.patch_node("new-00", [{"op": "add", "path": "/spec/taints/-",
                                    "value": {"key": "sweeper.dev/sweep", "value": "dead-run", "effect": "NoSchedule"}}])
    report = run_sweep(sim, history, CFG)
    assert {"node": "new-00", "action": "released", "why": "run dead-run stopped before its checks finished"} \
        in report.reconciled
    assert {o.node: o.verdict for o in report.outcomes} == {"new-00": "pass"}
    assert taints(sim, "new-00") == []
    verdicts = [r["verdict"] for r in history.db.query("select verdict from node_sweeps where node = 'new-00' "
                                                        "order by id")]
    assert verdicts == ["inconclusive", "pass"]


def test_a_node_back_from_its_reboot_is_soaked_before_hand_back(make_sim, history: History) -> None:
    """NVIDIA/NVSentinel#1427: a node passes the first check after its remediation and fails under
    longer load. Sweeper gates it again before the reboot; on its return the soak (DCGM level 4, whose
    memtest is the test that fails here) runs before any work may land, and the failure holds it."""
    sim: Sim = make_sim(gated_fleet(new=0, old=1, faults={"gpu-00": {"xids": [{"code": 79, "gpu": 2}],
                                                                    "dcgm_fail": {5: "memtest"}}}))
    cfg = replace(CFG, max_nodes=4, remediate_reboots=True)
    clock = sim.cluster.clock
    first = run_sweep(sim, history, cfg)
    assert {o.node: o.verdict for o in first.outcomes} == {"gpu-00": "reboot"}
    assert GATE in [t["key"] for t in taints(sim, "gpu-00")], "gated again before its reboot"
    old_boot = sim.kube.get_node("gpu-00")["metadata"]["annotations"]["sweeper.dev/boot-id"]

    def back() -> bool:
        node = NodeView.from_obj(sim.kube.get_node("gpu-00"))
        if node.boot_id != old_boot and node.ready:
            return True
        clock.advance(30)
        return False

    sim.wait_for(back, timeout=30, what="the reboot and the node Ready again")
    again = run_sweep(sim, history, cfg)
    [d] = [d for d in again.plan.gate if d.node.name == "gpu-00"]
    assert d.reason == "soak"
    [out] = again.outcomes
    assert out.node == "gpu-00" and out.verdict not in ("pass", "warn"), out
    assert any("memtest" in r for r in out.reasons), out.reasons
    assert GATE in [t["key"] for t in taints(sim, "gpu-00")], "no hand-back: the gate's taint stays"
    row = list(history.db.query("select playbook from node_sweeps where node = 'gpu-00' order by id"))[-1]
    assert row["playbook"] == "soak after remediation"


def test_sweeper_plan_shows_the_gates_queue(make_sim, tmp_path: Path) -> None:
    """`sweeper plan` lists the gated nodes apart from the fleet: taken, waiting (not Ready yet) or
    queued beyond gate_max_nodes, each with its reason; as a table and as JSON."""
    spec = gated_fleet(new=2)
    spec["node_groups"].append({"name_prefix": "boot-", "count": 1, "age": 0, "boot": "1h",
                                "startup_taints": [{"key": GATE}]})
    sim: Sim = make_sim(spec)
    # boot-00's hour of booting is 6 s of real time at 600x, which two `sweeper plan` runs on a loaded
    # machine outlasted (it was Ready, and no longer gate-waiting, by the table): simulated time stands.
    sim.cluster.clock.freeze()
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"gate_max_nodes": 1}))
    base = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"), "--config", str(cfg)]
    res = CliRunner().invoke(main, ["plan", *base, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["gpu_nodes"] == 2 and {n["node"] for n in doc["nodes"]} == {"gpu-00", "gpu-01"}
    gate = {n["node"]: n["reason"] for n in doc["gate"]["nodes"]}
    assert gate == {"new-00": "gate", "new-01": "gate-queued", "boot-00": "gate-waiting"}, gate
    assert doc["gate"]["taint"] == GATE and doc["gate"]["budget"] == 1
    res = CliRunner().invoke(main, ["plan", *base])
    assert f"3 gated node(s) ({GATE}), gate budget 1" in res.stdout
    assert "gate-waiting" in res.stdout and "not Ready" in res.stdout


def test_a_fault_of_the_check_is_no_pass_and_no_failure_of_the_node(make_sim, history: History) -> None:
    """DCGM that cannot run at all is a fault of the tool: the verdict is `error`, the node is neither
    replaced nor handed to work (its startup taint stays), and the next run gates it again."""
    sim: Sim = make_sim(gated_fleet(faults={"new-00": {"dcgm_runtime_error": True}}))
    report = run_sweep(sim, history, KARPENTER)
    [out] = report.outcomes
    assert (out.node, out.verdict, out.action) == ("new-00", "error", "released"), out
    assert [t["key"] for t in taints(sim, "new-00")] == [GATE], "its sweep taint is off, the gate's stays"
    assert "new-00" in {c["status"]["nodeName"] for c in sim.kube.list_nodeclaims()}, "not replaced"
    again = run_sweep(sim, history, replace(KARPENTER, interval=0), dry_run=True)
    assert [(d.node.name, d.reason) for d in again.plan.gate] == [("new-00", "gate")]


GATE_STEPS = [
    ("after", "PATCH", "/nodes/new-00", 1),   # held for its gate, nothing run yet
    ("after", "POST", "/jobs", 1),            # its first check Job created
    ("after", "PATCH", "/nodes/new-00", 2),   # its sweep taint off after the pass, the pass not yet recorded
    ("before", "PATCH", "/nodes/new-00", 3),  # the pass recorded, the gate's taint not yet off
    ("after", "PATCH", "/nodes/new-00", 3),   # the gate's taint off
]


@pytest.mark.realtime("a sweep in a process of its own, SIGKILLed at a chosen API request, and its 1 s lock left to expire")
@pytest.mark.parametrize("stage,method,fragment,nth", GATE_STEPS)
def test_sigkill_mid_gate_then_run_again(make_sim, tmp_path: Path, stage: str, method: str, fragment: str,
                                         nth: int) -> None:
    """Killed at any step of a gate, Sweeper never leaves the node handed to work without a recorded
    pass, and the next run finishes the story: the node ends validated and ungated."""
    sim: Sim = make_sim(gated_fleet())
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"max_nodes": 0, "poll_interval": 0.05, "check_timeout": 1800, "lock_ttl": 1,
                                   "api_attempts": 3, "gate_playbook": "sweep-light.yaml"}))  # one Job: quicker
    state = tmp_path / "h.db"
    kill_sweep_at(sim, state, cfg, stage, method, fragment, nth, timeout=60)

    def passed() -> bool:
        h = History(state)
        try:
            return any(r["verdict"] == "pass" for r in h.db.query(
                "select verdict from node_sweeps where node = 'new-00' and finished is not null"))
        finally:
            h.close()

    assert GATE in [t["key"] for t in taints(sim, "new-00")] or passed(), "ungated without a recorded pass"
    time.sleep(1.2)  # the dead run's lock expires (lock_ttl 1s)
    again = procs.run(_sweep_cmd(sim.kubeconfig, state, cfg), timeout=60)
    assert again.returncode == 0, again.stderr
    assert taints(sim, "new-00") == [] or GATE in [t["key"] for t in taints(sim, "new-00")] and not passed()
    if GATE in [t["key"] for t in taints(sim, "new-00")]:  # the pass was cut short before the kill: one more run
        again = procs.run(_sweep_cmd(sim.kubeconfig, state, cfg), timeout=60)
        assert again.returncode == 0, again.stderr
    assert taints(sim, "new-00") == [] and passed()
    h = History(state)
    assert list(h.db.query("select node from node_sweeps where finished is null")) == []
    h.close()


def test_an_old_node_tainted_later_waits_its_deadline_from_when_runs_first_saw_the_taint(make_sim,
                                                                                        history: History) -> None:
    """A node two days old gets the gate's taint from someone else (a person sending it back
    through validation) while it is not Ready: its wait counts from the first run that saw it at
    the gate, not from its creation, which would fail it `gate-late` (and replace it) at first sight."""
    sim: Sim = make_sim(gated_fleet(new=0, faults={"gpu-01": {"not_ready": True}}))
    sim.kube.patch_node("gpu-01", [{"op": "add", "path": "/spec/taints", "value": [
        {"key": GATE, "effect": "NoSchedule"}]}])
    cfg = replace(KARPENTER, gate_deadline=7200)
    first = run_sweep(sim, history, cfg)
    assert first.outcomes == []
    [d] = first.plan.gate
    assert d.reason == "gate-waiting" and "not Ready" in d.detail, d
    sim.cluster.clock.advance(3600)
    second = run_sweep(sim, history, cfg)
    assert second.outcomes == [] and [d.reason for d in second.plan.gate] == ["gate-waiting"], second.plan.gate
    sim.cluster.clock.advance(3700)
    third = run_sweep(sim, history, cfg)
    [out] = third.outcomes
    assert (out.node, out.verdict) == ("gpu-01", "replace") and "since runs first saw its gate taint" in out.reasons[0]


def test_gate_seen_is_the_start_of_the_unbroken_stretch_of_runs_that_listed_the_node(history: History) -> None:
    """A run that did not list the node breaks its stretch (its taint came off); a run that recorded
    no gate at all neither extends nor breaks it; the search reaches one run before `since`."""
    listed = {"r1": ["n"], "r2": [], "r3": ["n", "m"], "r4": None, "r5": ["n", "m"], "r6": ["n"]}
    for i, (run, nodes) in enumerate(listed.items()):
        history.run_started(run, 1000.0 * i, "sweep")
        summary = {} if nodes is None else {"gate": [{"node": n, "reason": "gate-waiting"} for n in nodes]}
        history.run_finished(run, 1000.0 * i + 10, "done", 0, summary)
    assert history.gate_seen(["n", "m", "x"], since=0.0) == {"n": 2000.0}, "m's stretch ended at r6"
    assert history.gate_seen(["n"], since=4500.0) == {"n": 4000.0}, "r5, the run before since"

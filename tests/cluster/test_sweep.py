"""A full sweep against the simulated cluster: what it takes, what it leaves, what it records."""

from __future__ import annotations

import json
from dataclasses import replace

from sweeper.history import History
from sweeper.sim.server import running_pods_on
from tests.conftest import TEST_CONFIG, Sim, fleet_spec, run_sweep

PREFIX = TEST_CONFIG.prefix
TAINT = TEST_CONFIG.taint_key


def taints(sim: Sim, node: str) -> list[str]:
    return [t.key for t in sim.core.read_node(node).spec.taints or []]


def annotations(sim: Sim, node: str) -> dict[str, str]:
    return sim.core.read_node(node).metadata.annotations or {}


def outcome(report, node: str):
    return next(o for o in report.outcomes if o.node == node)


def test_healthy_nodes_are_handed_back_and_every_step_is_recorded(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=3)
    before = {n: annotations(sim, n) for n in ("gpu-00", "gpu-01", "gpu-02")}
    report = run_sweep(sim, history)
    assert sorted(o.node for o in report.outcomes) == ["gpu-00", "gpu-01", "gpu-02"]
    assert {o.verdict for o in report.outcomes} == {"pass"}
    assert {o.action for o in report.outcomes} == {"released"}
    for n in ("gpu-00", "gpu-01", "gpu-02"):
        assert TAINT not in taints(sim, n)
        after = annotations(sim, n)
        assert json.loads(after.pop("sweeper.dev/last-result"))["verdict"] == "pass"
        assert after == before[n], "everything Sweeper added is taken off again, but the last result"
        labels = sim.core.read_node(n).metadata.labels
        assert labels["sweeper.dev/status"] == "pass" and labels["sweeper.dev/last-sweep"].isdigit()
    assert sim.batch.list_namespaced_job("sweeper-checks").items == [], "check Jobs are deleted"
    assert sim.core.list_namespaced_pod("sweeper-checks").items == [], "and their pods with them"
    counts = history.counts()
    assert counts["runs"] == 1 and counts["node_sweeps"] == 3
    assert counts["checks"] >= 3 * 8 and counts["metrics"] > 0
    sweeps = list(history.db.query("select * from node_sweeps"))
    assert all(s["finished"] and s["verdict"] == "pass" for s in sweeps)
    acts = [(a["node"], a["action"]) for a in history.db.query("select * from actions order by id")]
    for n in ("gpu-00", "gpu-01", "gpu-02"):
        assert (n, "hold") in acts and (n, "release") in acts
    intents = {(i["node"], i["op"], i["phase"]) for i in history.db.query("select * from intents")}
    for n in ("gpu-00", "gpu-01", "gpu-02"):
        for op in ("taint", "create-job", "delete-job", "untaint"):
            assert (n, op, "before") in intents and (n, op, "after") in intents
    run = next(history.db.query("select * from runs"))
    assert run["status"] == "done" and run["taken"] == 3


def test_busy_node_is_never_tainted(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=3, workloads=[{"node": "gpu-01", "gpus": 2, "duration": None}])
    sim.wait_for(lambda: running_pods_on(sim.cluster, "gpu-01"), what="the training pod")
    report = run_sweep(sim, history)
    assert [o.action for o in report.outcomes if o.node == "gpu-01"] == ["light"], "only a read-only check"
    skipped = {d.node.name: d.reason for d in report.plan.skip}
    assert skipped["gpu-01"] == "busy"
    assert sim.writes_to("gpu-01") == [], "not one write to a node with a GPU pod"
    assert len(running_pods_on(sim.cluster, "gpu-01")) == 1


def test_a_pod_that_lands_during_the_taint_is_left_alone(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2, faults={"gpu-00": {"pod_lands_on_taint": 1}})
    report = run_sweep(sim, history)
    o = outcome(report, "gpu-00")
    assert o.action == "raced"
    pods = running_pods_on(sim.cluster, "gpu-00")
    assert len(pods) == 1 and pods[0]["metadata"]["namespace"] == "training", "the workload runs on, untouched"
    assert TAINT not in taints(sim, "gpu-00")
    assert "karpenter.sh/do-not-disrupt" not in annotations(sim, "gpu-00")
    assert sim.batch.list_namespaced_job("sweeper-checks").items == [], "no check was started on it"
    assert outcome(report, "gpu-01").verdict == "pass"
    assert ("gpu-00", "release") in [(a["node"], a["action"]) for a in history.db.query("select * from actions")]


def test_faulty_nodes_are_held_with_their_reason(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=4, faults={"gpu-01": {"xids": [{"code": 79, "gpu": 2, "text": "GPU has fallen off the bus."}]},
                                         "gpu-02": {"missing_gpus": 1},
                                         "gpu-03": {"remap_failure": [6]}})
    report = run_sweep(sim, history)
    assert outcome(report, "gpu-00").action == "released"
    expect = {"gpu-01": ("reboot", "XID 79"), "gpu-02": ("reboot", "7 GPUs visible"),
              "gpu-03": ("replace", "row remapping failure")}
    for node, (verdict, words) in expect.items():
        o = outcome(report, node)
        assert (o.verdict, o.action) == (verdict, "held"), node
        assert TAINT in taints(sim, node)
        ann = annotations(sim, node)
        assert ann[f"{PREFIX}/verdict"] == verdict and words in ann[f"{PREFIX}/reason"]
        assert "karpenter.sh/do-not-disrupt" not in ann
        rows = history.node_history(node)
        assert rows["sweeps"][0]["verdict"] == verdict
        assert any(words in p["message"] for p in rows["sweeps"][0]["problems"])
    xid = history.node_history("gpu-01")["sweeps"][0]["problems"][0]
    assert (xid["name"], xid["gpu"], xid["code"]) == ("xid", 2, "79")
    # A held node counts against the next run's budget and is not taken again.
    again = run_sweep(sim, history, replace(TEST_CONFIG, interval=0))
    assert again.plan.held == 3
    assert sorted(o.node for o in again.outcomes) == ["gpu-00"]


def test_a_hung_check_ends_at_its_deadline_as_a_failure(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"hung_check": True}})
    # A hung check is a container that ran and never finished; the deadline leaves the simulated
    # kubelet ample time (3 s of real time at 600x) to start it on a busy machine, so the check
    # is judged hung, never "never started".
    report = run_sweep(sim, history, replace(TEST_CONFIG, check_timeout=1800))
    o = outcome(report, "gpu-01")
    assert (o.verdict, o.action) == ("quarantine", "held")
    assert "did not finish within 1800s" in o.reasons[0]
    assert sim.batch.list_namespaced_job("sweeper-checks").items == [], "the hung Job is cleaned up"
    assert sim.core.list_namespaced_pod("sweeper-checks").items == [], "and its pod"
    check = history.node_history("gpu-01")["sweeps"][0]["problems"][0]
    assert (check["name"], check["status"], check["code"]) == ("check.deadline", "fail", "DeadlineExceeded")


def test_unreadable_output_is_an_error_never_a_pass(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2, faults={"gpu-00": {"garbage_output": True}, "gpu-01": {"check_crash": True}})
    report = run_sweep(sim, history)
    for node in ("gpu-00", "gpu-01"):
        o = outcome(report, node)
        assert o.verdict == "error", node
        assert o.action == "released", "a broken check is not evidence against the node"
        statuses = [c["status"] for c in history.db.query("select status from checks where node = ?", [node])]
        assert statuses and "pass" not in statuses
    assert "no JSON document" in outcome(report, "gpu-00").reasons[0]
    assert "exited 139" in outcome(report, "gpu-01").reasons[0]


def test_budget_and_ordering(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=6)
    cfg = replace(TEST_CONFIG, max_nodes=2, run_deadline=1)  # one plan's worth: no refill past 1 s
    first = run_sweep(sim, history, cfg)
    assert len(first.outcomes) == 2
    assert sum(1 for d in first.plan.skip if d.reason == "over-budget") == 4
    second = run_sweep(sim, history, cfg)
    assert not {o.node for o in first.outcomes} & {o.node for o in second.outcomes}, "never-swept nodes go first"
    pct = run_sweep(sim, history, replace(cfg, max_nodes=10, max_percent=34))
    assert len(pct.outcomes) == 2, "34% of 6 GPU nodes is 2"


def test_dry_run_writes_nothing_to_the_cluster(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=3)
    n = len(sim.cluster.store.requests)
    report = run_sweep(sim, history, dry_run=True)
    assert {o.action for o in report.outcomes} == {"would-take"}
    writes = [r for r in sim.cluster.store.requests[n:] if r[0] != "GET"]
    assert writes == []
    assert history.last_swept() == {}, "a dry run does not make a node look swept"


def test_skip_reasons(make_sim, history: History) -> None:
    sim: Sim = make_sim(fleet_spec(nodes=6, faults={"gpu-05": {"not_ready": True}}))
    sim.core.patch_node("gpu-00", {"spec": {"unschedulable": True}})
    sim.core.patch_node("gpu-01", {"spec": {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}})
    sim.core.patch_node("gpu-02", {"metadata": {"labels": {"sweeper.dev/opt-out": "true"}}})
    sim.core.patch_node("gpu-03", {"spec": {"taints": [{"key": "example.com/maintenance", "effect": "NoExecute"}]}})
    mark = len(sim.cluster.store.requests)
    report = run_sweep(sim, history)
    reasons = {d.node.name: d.reason for d in report.plan.skip}
    assert reasons == {"gpu-00": "cordoned", "gpu-01": "handled-elsewhere", "gpu-02": "opted-out",
                       "gpu-03": "foreign-taint", "gpu-05": "not-ready"}
    assert [o.node for o in report.outcomes] == ["gpu-04"]
    later = sim.cluster.store.requests[mark:]
    for n in reasons:
        assert [r for r in later if r[0] != "GET" and r[1] == f"/api/v1/nodes/{n}"] == [], n

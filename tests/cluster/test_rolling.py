"""A run as a rolling queue: freed slots go to the next due node, looked at again against the
budget and the gates, never past the budget at any instant, until none is due or the run's
deadline passes."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

from sweeper.history import History
from sweeper.sim.server import running_pods_on
from sweeper.sweep import Sweep
from tests.conftest import TEST_CONFIG, Sim, fleet_spec

TAINT = TEST_CONFIG.taint_key


def tainted(sim: Sim) -> dict[str, str]:
    """Node to the run named by its sweep taint, read from the simulated cluster's store under its
    lock: one consistent instant, cheap enough to sample every millisecond."""
    store = sim.cluster.store
    with store.lock:
        return {n["metadata"]["name"]: t.get("value", "")
                for n in store.iter("nodes") for t in (n.get("spec") or {}).get("taints") or []
                if t.get("key") == TAINT}


def sweep(sim: Sim, history: History, cfg: Any, on: dict[str, Any] | None = None) -> Any:
    """One run; `on` maps an event of the run (hold, done, ...) to a callback, called in the
    thread that emits it, so a test acts at a known step of the run instead of after a delay."""
    hooks = on or {}
    return Sweep(sim.kube, cfg, history, clock=sim.cluster.clock,
                 emit=lambda event, data: hooks[event](data) if event in hooks else None).run()


def test_a_rolling_run_never_holds_more_than_the_budget(make_sim, history: History) -> None:
    """12 nodes, max_nodes 4, one held by an earlier run: this run keeps 3 under test and refills
    as they finish. Sampled all through the run (every millisecond, and at each hold, the moment
    the count goes up), the tainted nodes never exceed 4, nor this run's 3; and every due node is
    swept in the one run."""
    sim: Sim = make_sim(nodes=12)
    sim.core.patch_node("gpu-11", {"metadata": {"annotations": {"sweeper.dev/verdict": "quarantine"}},
                                   "spec": {"taints": [{"key": TAINT, "value": "sw-earlier", "effect": "NoSchedule"}]}})
    cfg = replace(TEST_CONFIG, max_nodes=4, light_playbook="")
    samples: list[dict[str, str]] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(tainted(sim))
            time.sleep(0.001)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        report = sweep(sim, history, cfg, {"hold": lambda d: samples.append(tainted(sim))})
    finally:
        stop.set()
        sampler.join()
    assert sorted(o.node for o in report.outcomes) == [f"gpu-{i:02d}" for i in range(11)], \
        "every due node in one run, not one plan's worth"
    assert {o.action for o in report.outcomes} == {"released"}
    assert max(len(s) for s in samples) <= 4, "held by this run plus held by others: never past max_nodes"
    assert max(sum(1 for run in s.values() if run == report.run_id) for s in samples) <= 3
    assert all(s.get("gpu-11") == "sw-earlier" for s in samples), "the earlier run's hold stands throughout"
    assert tainted(sim) == {"gpu-11": "sw-earlier"}


def test_a_node_freed_mid_run_is_taken_in_the_same_run(make_sim, history: History) -> None:
    """gpu-03 runs a training pod when the run plans; its pod is deleted as the run holds its
    first node. The run looks at the cluster again as slots free up, and sweeps gpu-03 too."""
    sim: Sim = make_sim(nodes=4, workloads=[{"node": "gpu-03", "gpus": 8, "duration": None}])
    [pod] = sim.wait_for(lambda: running_pods_on(sim.cluster, "gpu-03"), what="the training pod")
    freed = threading.Event()

    def free(_: dict[str, Any]) -> None:
        if not freed.is_set():
            sim.core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                           grace_period_seconds=0)
            freed.set()

    report = sweep(sim, history, replace(TEST_CONFIG, max_nodes=1, light_playbook=""), {"hold": free})
    assert {d.node.name: d.reason for d in report.plan.skip}["gpu-03"] == "busy", "busy when the run planned"
    got = {o.node: (o.verdict, o.action) for o in report.outcomes}
    assert got == {f"gpu-0{i}": ("pass", "released") for i in range(4)}, got
    assert tainted(sim) == {}


def test_past_the_run_deadline_no_node_is_taken_and_those_under_test_finish(make_sim, history: History) -> None:
    """run_deadline 1 s: the first plan is taken at the start; a check lasts 45 simulated
    seconds, so every later look at the cluster is past the deadline: the nodes under test finish
    and are handed back, and no other node is taken."""
    sim: Sim = make_sim(nodes=6)
    report = sweep(sim, history, replace(TEST_CONFIG, max_nodes=2, light_playbook="", run_deadline=1))
    assert sorted(o.node for o in report.outcomes) == ["gpu-00", "gpu-01"]
    assert {o.action for o in report.outcomes} == {"released"}, "the nodes under test finished their checks"
    assert sum(1 for d in report.plan.skip if d.reason == "over-budget") == 4
    assert tainted(sim) == {}
    assert history.db.execute("select status from runs").fetchone()[0] == "done"


def test_a_drained_run_takes_no_new_node_and_finishes_those_under_test(make_sim, history: History) -> None:
    """`sweeper serve` drains the running sweep when another schedule's turn comes: drained as
    it holds its first node, the run sweeps its first plan's worth and no more."""
    sim: Sim = make_sim(nodes=5)
    cfg = replace(TEST_CONFIG, max_nodes=2, light_playbook="")
    sw = Sweep(sim.kube, cfg, history, clock=sim.cluster.clock,
               emit=lambda event, data: sw.drain.set() if event == "hold" else None)
    report = sw.run()
    assert sorted(o.node for o in report.outcomes) == ["gpu-00", "gpu-01"]
    assert {o.action for o in report.outcomes} == {"released"}
    assert tainted(sim) == {}


def test_serve_runs_one_queue_and_schedules_take_turns(make_sim, history: History) -> None:
    """Two schedules firing every second, each run lasting at least one 20-minute check (2 s of
    real time at the simulated cluster's 600x): a firing while the other schedule's sweep runs
    waits its turn (that sweep takes no new node meanwhile), so the serve never contends with
    itself for the Lease, and the runs never overlap."""
    from sweeper.serve import Server

    sim: Sim = make_sim(fleet_spec(nodes=4, check_seconds=1200))
    every_second = "* * * * * *"
    cfg = replace(TEST_CONFIG, max_nodes=1, light_playbook="", interval=1, poll_interval=0.05, check_timeout=7200,
                  schedules=(
        {"name": "a", "cron": every_second, "playbook": "sweep-light.yaml"},
        {"name": "b", "cron": every_second, "playbook": "sweep-light.yaml"}))
    logs: list[str] = []
    server = Server(cfg, sim.kube, history, port=0, host="127.0.0.1", log=logs.append)
    server.start()
    try:
        sim.wait_for(lambda: history.db.execute("select count(*) from runs where finished is not null").fetchone()[0]
                     >= 4, timeout=120, what="four finished runs")
    finally:
        server.stop()
    runs = list(history.db.query("select mode, started, finished, status from runs order by started"))
    assert all(r["finished"] is not None and r["status"] == "done" for r in runs), runs
    assert {r["mode"] for r in runs} == {"schedule:a", "schedule:b"}
    for x, y in zip(runs, runs[1:], strict=False):
        assert x["finished"] <= y["started"], f"runs overlap: {x} and {y}"
    assert "lock-held" not in server.metrics.exposition().decode(), logs
    assert not [m for m in logs if "holds the lock" in m], logs
    acts = list(history.db.query("select run_id, node, action, detail from actions order by id"))
    assert {a["action"] for a in acts} >= {"hold", "release"} and "keep-held" not in {a["action"] for a in acts}
    assert tainted(sim) == {}


def test_the_run_ends_when_its_last_node_is_handed_back_not_a_poll_interval_later(make_sim,
                                                                                   history: History) -> None:
    """Nodes finishing together share one look at the cluster, at most one per poll_interval;
    once none is under test the run looks at once (the same discovery and gates) and, with
    nothing more due, ends. With a poll_interval of an hour of simulated time and one node of a
    45 s check, the run ends within that hour, and the node was swept."""
    sim: Sim = make_sim(nodes=1)
    cfg = replace(TEST_CONFIG, max_nodes=1, light_playbook="", poll_interval=3600)
    report = sweep(sim, history, cfg)
    assert [(o.node, o.action) for o in report.outcomes] == [("gpu-00", "released")]
    assert report.finished - report.started < cfg.poll_interval, "no wait for a look that nothing shares"
    assert tainted(sim) == {}

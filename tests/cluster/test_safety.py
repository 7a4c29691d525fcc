"""Safety under concurrency and crashes: the lock, reconciling after a dead run, and a
sweeper killed with SIGKILL at every distinct step of a sweep."""

from __future__ import annotations

import itertools
import json
import os
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.actions import node as node_actions
from sweeper.backtest import backtest
from sweeper.clock import iso_micro
from sweeper.errors import LockHeld, LockLost
from sweeper.history import History
from sweeper.lock import SweepLock
from sweeper.policy import load_policy
from sweeper.sweep import Sweep
from tests import procs
from tests.cluster.test_control import set_switch, switch
from tests.conftest import TEST_CONFIG, Sim, held_then_released_by_a_person, run_sweep

TAINT = TEST_CONFIG.taint_key


def sweep_taints(sim: Sim) -> dict[str, str]:
    """Read from the simulated cluster's store: the truth, even while the API is faulting."""
    out = {}
    with sim.cluster.store.lock:
        for n in sim.cluster.store.iter("nodes"):
            for t in n["spec"].get("taints") or []:
                if t.get("key") == TAINT:
                    out[n["metadata"]["name"]] = t.get("value", "")
    return out


def jobs_left(sim: Sim) -> list[str]:
    with sim.cluster.store.lock:
        return [j["metadata"]["name"] for j in sim.cluster.store.iter("jobs")]


def test_the_lock_keeps_a_second_sweeper_out(sim: Sim, history: History) -> None:
    other = SweepLock(sim.kube, "sweeper", TEST_CONFIG.lock_name, "sw-other", 300, sim.cluster.clock)
    other.acquire()
    with pytest.raises(LockHeld) as exc:
        run_sweep(sim, history)
    assert exc.value.holder == "sw-other"
    assert sweep_taints(sim) == {}
    other.release()
    report = run_sweep(sim, history)
    assert len(report.outcomes) == 4


def test_an_expired_lock_is_taken_over(sim: Sim, history: History) -> None:
    from kubernetes import client

    coord = client.CoordinationV1Api(sim.api_client)
    stale = sim.cluster.clock.now() - 3600
    coord.create_namespaced_lease("sweeper", {"metadata": {"name": TEST_CONFIG.lock_name},
                                              "spec": {"holderIdentity": "sw-dead", "leaseDurationSeconds": 300,
                                                       "renewTime": iso_micro(stale)}})
    report = run_sweep(sim, history)
    assert len(report.outcomes) == 4
    lease = coord.read_namespaced_lease(TEST_CONFIG.lock_name, "sweeper")
    assert lease.spec.holder_identity == "" and lease.spec.lease_transitions == 1


def test_two_sweepers_started_together(make_sim, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=10)
    cfg = replace(TEST_CONFIG, max_nodes=3, run_deadline=1)  # one plan's worth: no refill past 1 s
    results: list[Any] = []

    def go(i: int) -> None:
        h = History(tmp_path / "shared.db")
        try:
            results.append(Sweep(sim.kube, cfg, h, clock=sim.cluster.clock).run())
        except LockHeld as exc:
            results.append(exc)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reports = [r for r in results if not isinstance(r, LockHeld)]
    assert len(results) == 2 and len(reports) >= 1
    swept = [o.node for r in reports for o in r.outcomes]
    assert len(swept) == len(set(swept)), "no node swept twice"
    holds = [(p, m) for m, p in sim.cluster.store.requests if m == "PATCH" and p.startswith("/api/v1/nodes/")]
    assert len({p for p, _ in holds}) <= 3 * len(reports)


def _record_dead_run(history: History, run: str, node: str, verdict: str | None) -> None:
    history.run_started(run, 1.0, "sweep")
    sid = history.sweep_started(run, node, 1.0, "light sweep", "p5.48xlarge")
    history.intent(run, node, 1.0, "taint", "after", "")
    if verdict:
        history.sweep_finished(sid, 2.0, verdict, ["xid (GPU 3): XID 79"])


def test_reconcile_finishes_the_story_of_a_dead_run(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=5)
    now = sim.cluster.clock.now()
    cfg = TEST_CONFIG
    for node, run, since in (("gpu-00", "sw-dead-a", now), ("gpu-01", "sw-dead-a", now),
                             ("gpu-02", "sw-lost", now - 60), ("gpu-03", "sw-lost", now - 7200)):
        obj = sim.kube.get_node(node)
        node_actions.hold(sim.kube, cfg, obj, run, since)
    _record_dead_run(history, "sw-dead-a", "gpu-00", None)        # died mid-check
    history.sweep_finished(history.sweep_started("sw-dead-a", "gpu-01", 1.0, "light sweep", "p5"), 2.0, "reboot",
                           ["XID 79"])                             # verdict recorded, never acted on
    sim.batch.create_namespaced_job("sweeper-checks", {"metadata": {"name": "left-over", "labels": {
        "app.kubernetes.io/managed-by": "sweeper", f"{cfg.prefix}/run-id": "sw-dead-a"}},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
            {"name": "c", "image": "i", "command": ["sleep", "inf"]}]}}}})
    report = run_sweep(sim, history, replace(cfg, interval=10**9))
    actions = {d["node"]: d["action"] for d in report.reconciled if "node" in d}
    assert actions == {"gpu-00": "released", "gpu-01": "kept held", "gpu-02": "left held", "gpu-03": "released"}
    assert [d["job"] for d in report.reconciled if "job" in d] == ["left-over"]
    taints = sweep_taints(sim)
    assert taints.get("gpu-01") == "sw-dead-a" and taints.get("gpu-02") == "sw-lost"
    assert "gpu-00" not in taints and "gpu-03" not in taints
    ann = sim.core.read_node("gpu-01").metadata.annotations
    assert ann[f"{cfg.prefix}/verdict"] == "reboot"
    dead = next(history.db.query("select * from node_sweeps where run_id = 'sw-dead-a' and node = 'gpu-00'"))
    assert dead["verdict"] == "inconclusive" and dead["finished"]
    assert history.unfinished_runs() == []
    assert next(history.db.query("select status from runs where id = 'sw-dead-a'"))["status"] == "crashed"
    assert report.plan.held == 2, "nodes kept held count against the budget"


def lost_verdicts(h: History) -> list[dict[str, Any]]:
    """Sweep rows whose verdict is not the one their run's intent log proves (a hand-back begins
    only after the verdict; a replacement capped into a quarantine is the run's own decision)."""
    out = []
    for row in h.db.query("select id, run_id, node, verdict from node_sweeps where finished is not null"):
        proven = h.proven_verdict(row["run_id"], row["node"])
        if proven and proven["verdict"] != row["verdict"] and (proven["verdict"], row["verdict"]) != \
                ("replace", "quarantine"):
            out.append({**row, "proven": proven["verdict"]})
    return out


# -- SIGKILL at every step ---------------------------------------------------------------------
STEPS = [
    ("after", "PUT", "/leases/", 1),       # lock taken, nothing else done
    ("after", "PATCH", "/nodes/", 1),      # first node tainted
    ("before", "POST", "/jobs", 1),        # tainted, Job not yet created
    ("after", "POST", "/jobs", 1),         # Job created
    ("after", "POST", "/jobs", 4),         # every Job created, the busy node's light check too
    ("after", "WATCH", "/jobs", 1),        # the run follows its check Jobs with a watch
    ("after", "GET", "/log", 1),           # mid-check: a first result read, its Job not yet deleted
    ("after", "GET", "/pods/sweep-gpu-03-", 1),     # the busy node's light check read, its Job not yet deleted
    ("after", "DELETE", "/jobs/sweep-gpu-03-", 1),  # light check done, its verdict not recorded
    ("after", "DELETE", "/jobs/", 1),      # Job deleted, verdict not acted on
    ("after", "PATCH", "/nodes/gpu-00", 2),  # a passing node untainted, its verdict not yet recorded
    ("after", "PATCH", "/nodes/", 3),      # some nodes handed back
]


def _sweep_cmd(kc: Path, state: Path, cfg: Path) -> list[str]:
    """`sweeper sweep`'s arguments, for `tests.procs` (a process of its own, forked pre-imported)."""
    return ["sweep", "--kubeconfig", str(kc), "--state", str(state), "--config", str(cfg), "--json"]


def kill_sweep_at(sim: Sim, state: Path, cfg: Path, stage: str, method: str, fragment: str, nth: int,
                  timeout: float) -> None:
    """Run `sweeper sweep` in a process of its own and SIGKILL it at the nth API request whose
    method and path match (before or after the simulated API server answers it)."""
    err = state.with_name(state.name + ".stderr")
    with err.open("wb") as sink:
        proc = procs.start(_sweep_cmd(sim.kubeconfig, state, cfg), stdout=procs.DEVNULL, stderr=sink)
    seen = {"n": 0, "killed": False}

    def hook(st: str, m: str, path: str) -> None:
        if st == stage and m == method and fragment in path and not seen["killed"]:
            seen["n"] += 1
            if seen["n"] == nth:
                seen["killed"] = True
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()

    sim.server.hooks.append(hook)
    proc.wait(timeout=timeout)
    sim.server.hooks.clear()
    assert seen["killed"], (f"the sweep never reached {stage} {method} {fragment} #{nth} (exit {proc.returncode}):\n"
                            + err.read_text(errors="replace")[-3000:])


@pytest.mark.realtime("a sweep in a process of its own, SIGKILLed at a chosen API request, and its 1 s lock left to expire")
@pytest.mark.parametrize("stage,method,fragment,nth", STEPS)
def test_sigkill_at_every_step_then_run_again(make_sim, tmp_path: Path, stage: str, method: str, fragment: str,
                                              nth: int) -> None:
    # gpu-03 is busy (a training job holds its GPUs), so the run also light-checks it.
    sim: Sim = make_sim(nodes=4, faults={"gpu-02": {"xids": [{"code": 79, "gpu": 1}]}},
                        workloads=[{"node": "gpu-03", "gpus": 8, "duration": None}])
    sim.wait_for(lambda: sim.core.list_namespaced_pod("training").items, what="the busy node's workload")
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"max_nodes": 3, "max_percent": 100, "poll_interval": 0.05,
                                   "check_timeout": 1800, "lock_ttl": 1, "api_attempts": 3}))
    state = tmp_path / "h.db"
    kill_sweep_at(sim, state, cfg, stage, method, fragment, nth, timeout=60)
    h = History(state)
    left_open = h.db.execute("select count(*) from node_sweeps where finished is null").fetchone()[0]
    h.close()
    time.sleep(1.2)  # the dead run's lock expires (lock_ttl 1s)
    again = procs.run(_sweep_cmd(sim.kubeconfig, state, cfg), timeout=60)
    assert again.returncode == 0, again.stderr
    taints = sweep_taints(sim)
    assert set(taints) <= {"gpu-02"}, f"only the faulty node may stay held: {taints}"
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []
    h = History(state)
    assert h.unfinished_runs() == []
    open_sweeps = list(h.db.query("select node, run_id, kind from node_sweeps where finished is null"))
    assert open_sweeps == [], f"every node's story is complete ({left_open} left open by the kill)"
    assert lost_verdicts(h) == [], "a verdict the intent log proves is the one recorded"
    if "gpu-02" in taints:
        last = h.node_history("gpu-02")["sweeps"][0]
        assert last["verdict"] == "reboot", "a held node has its reason on record"
    if (method, fragment, nth) == ("PATCH", "/nodes/gpu-00", 2):
        first = h.node_history("gpu-00")["sweeps"][-1]
        assert first["verdict"] == "pass", "the pass handed back before the kill is not lost"
    h.close()


def _wait_stopped(pid: int) -> None:
    """Until the kernel shows the process stopped (state T in /proc/PID/stat): kill() only sends."""
    for _ in range(1000):
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.001)


def _write_locked(state: Path) -> bool:
    """Whether some process holds the history's write lock now (BEGIN IMMEDIATE cannot start)."""
    import sqlite3

    conn = sqlite3.connect(str(state), timeout=0, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError:
        return True
    finally:
        conn.close()


@pytest.mark.realtime("a sweeper SIGSTOPped past its lock's TTL in real seconds while another runs")
def test_a_stalled_sweeper_does_not_hand_back_a_node_another_run_holds(make_sim, tmp_path: Path) -> None:
    """Sweeper A holds a failing node and is stopped (SIGSTOP: in production a frozen VM, a long
    pause or a partition) past its lock's TTL; B takes the expired Lease, reconciles A as dead and
    holds the same node for XID 79; A resumes. A finds the Lease no longer its own and stops
    writing (exit 4): B's taint stays, and a later run records no dismissal.

    A takes one node, so that it is stopped inside an HTTP call with no history write open (the
    history file is shared; a writer stopped mid-transaction would lock B out of it)."""
    sim: Sim = make_sim(nodes=3, faults={"gpu-00": {"xids": [{"code": 79, "gpu": 1}]}})
    base = {"max_percent": 100, "poll_interval": 0.05, "check_timeout": 300, "lock_ttl": 1, "api_attempts": 3}
    cfg_a, cfg_b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    cfg_a.write_text(yaml.safe_dump({**base, "max_nodes": 1}))
    cfg_b.write_text(yaml.safe_dump({**base, "max_nodes": 3}))
    state = tmp_path / "h.db"
    a = procs.start(_sweep_cmd(sim.kubeconfig, state, cfg_a), stdout=procs.PIPE, stderr=procs.PIPE)
    stopped = threading.Event()

    def hook(st: str, m: str, path: str) -> None:
        # A creates its check Job: the node is held and the check starts.
        if st == "after" and m == "POST" and path.endswith("/jobs") and not stopped.is_set():
            os.kill(a.pid, signal.SIGSTOP)
            stopped.set()

    sim.server.hooks.append(hook)
    try:
        assert stopped.wait(60), "sweeper A never created its check Job"
        sim.server.hooks.clear()
        # A is frozen inside its HTTP call, but another of its threads may be inside a history write
        # (more likely the busier the machine): B would then wait out SQLite's busy timeout, which
        # is not what this test is about. Let A run a moment until it is frozen with no write open.
        for _ in range(200):
            _wait_stopped(a.pid)
            if not _write_locked(state):
                break
            os.kill(a.pid, signal.SIGCONT)
            time.sleep(0.005)
            os.kill(a.pid, signal.SIGSTOP)
        else:
            raise AssertionError("sweeper A kept the history locked")
        # A's last renewal came before the stop: past lock_ttl (1s) the Lease has expired for B, and A,
        # once resumed, can no longer vouch for it without renewing.
        time.sleep(1.5)
        b = procs.run(_sweep_cmd(sim.kubeconfig, state, cfg_b), timeout=120)
        assert b.returncode == 0, b.stderr[-2000:]
        b_report = json.loads(b.stdout)
        assert {n["node"]: (n["verdict"], n["action"]) for n in b_report["nodes"]} == {
            "gpu-00": ("reboot", "held"), "gpu-01": ("pass", "released"), "gpu-02": ("pass", "released")}
        assert sweep_taints(sim) == {"gpu-00": b_report["run_id"]}
    finally:
        os.kill(a.pid, signal.SIGCONT)
    _out, err = a.communicate(timeout=120)
    assert sweep_taints(sim) == {"gpu-00": b_report["run_id"]}, "B's taint on the failing node stays"
    assert a.returncode == 4, err.decode()[-2000:]
    assert "stopped writing" in err.decode()
    assert jobs_left(sim) == []
    c = procs.run(_sweep_cmd(sim.kubeconfig, state, cfg_b), timeout=120)
    assert c.returncode == 0, c.stderr[-2000:]
    assert sweep_taints(sim) == {"gpu-00": b_report["run_id"]}
    h = History(state)
    try:
        acts = [a["action"] for a in h.db.query("select action from actions where node = 'gpu-00'")]
        assert "false-positive" not in acts, "nobody released the node: no dismissal"
        assert next(h.db.query("select status from runs where id != ? and id != ? order by started limit 1",
                               [b_report["run_id"], json.loads(c.stdout)["run_id"]]))["status"] == "fenced"
        assert list(h.db.query("select * from node_sweeps where finished is null")) == []
    finally:
        h.close()


def test_a_lock_taken_over_fences_every_write(make_sim) -> None:
    """Once another sweeper has taken the expired Lease, the old holder's writes stop before they
    reach the API server: the fence renews conditionally on the version it last wrote, and the
    conflict says the Lease is someone else's (Kubernetes optimistic concurrency:
    https://kubernetes.io/docs/reference/using-api/api-concepts/#resource-versions)."""
    sim: Sim = make_sim(nodes=1)
    clock = sim.cluster.clock
    a = SweepLock(sim.kube, "sweeper", TEST_CONFIG.lock_name, "sw-a", 300, clock)
    a.acquire()
    view = sim.kube.fenced(a.fence)
    view.create_event("default", {"metadata": {"generateName": "x."}, "involvedObject": {"kind": "Node",
                                                                                          "name": "gpu-00"}})
    a._stop.set()  # A stalls: no renewal from here on
    clock.advance(400)  # past its lease duration
    b = SweepLock(sim.kube, "sweeper", TEST_CONFIG.lock_name, "sw-b", 300, clock)
    b.acquire()
    writes = len(sim.writes_to("gpu-00"))
    with pytest.raises(LockLost, match="stopped writing"):
        view.patch_node("gpu-00", {"metadata": {"labels": {"x": "y"}}}, content_type="application/merge-patch+json")
    assert len(sim.writes_to("gpu-00")) == writes, "the write never reached the API server"
    assert not a.holds() and b.holds()
    b.release()


def test_a_stale_lock_that_nobody_took_renews_and_writes_on(make_sim) -> None:
    sim: Sim = make_sim(nodes=1)
    clock = sim.cluster.clock
    a = SweepLock(sim.kube, "sweeper", TEST_CONFIG.lock_name, "sw-a", 300, clock)
    a.acquire()
    a._stop.set()
    clock.advance(400)
    assert a.holds(), "a conditional renewal proves nobody took it in between"
    a.release()


def test_releasing_the_lock_stops_its_renewals_at_once(make_sim) -> None:
    """release() wakes the renewal thread instead of waiting out its sleep."""
    from sweeper.clock import WallClock

    sim: Sim = make_sim(nodes=1)
    lock = SweepLock(sim.kube, "sweeper", TEST_CONFIG.lock_name, "sw-a", 3000, WallClock())
    lock.acquire()
    lock.release()
    assert lock._thread is not None and not lock._thread.is_alive()


def test_a_hand_back_removes_only_its_own_runs_taint(make_sim) -> None:
    sim: Sim = make_sim(nodes=1)
    node_actions.hold(sim.kube, TEST_CONFIG, sim.kube.get_node("gpu-00"), "sw-b", sim.cluster.clock.now())
    done = node_actions.release(sim.kube, TEST_CONFIG, "gpu-00", "sw-a")
    assert (done.changed, done.left_to) == (False, "sw-b")
    assert not node_actions.keep_held(sim.kube, TEST_CONFIG, "gpu-00", "reboot", "XID 79", "sw-a")
    assert sweep_taints(sim) == {"gpu-00": "sw-b"}
    ann = sim.core.read_node("gpu-00").metadata.annotations
    assert ann["sweeper.dev/held-by"] == "sw-b" and "sweeper.dev/verdict" not in ann, "nothing else touched"
    done = node_actions.release(sim.kube, TEST_CONFIG, "gpu-00", "sw-b")
    assert (done.changed, done.left_to) == (True, "") and sweep_taints(sim) == {}


def test_a_kill_between_untaint_and_record_is_no_dismissal(make_sim, history: History) -> None:
    """A re-check of a held node passed and handed it back, and the run died before recording it:
    the next run records the pass from the intent log, and no person's dismissal."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"xids": [{"code": 79, "gpu": 3}]}})
    first = run_sweep(sim, history)
    assert {o.node: o.action for o in first.outcomes}["gpu-01"] == "held"
    # Run sw-dead held it again for a re-check, passed, untainted it, and was killed there.
    now = sim.cluster.clock.now()
    history.run_started("sw-dead", now, "sweep")
    sid = history.sweep_started("sw-dead", "gpu-01", now, "light sweep", "p5.48xlarge")
    node_actions.hold(sim.kube, TEST_CONFIG, sim.kube.get_node("gpu-01"), "sw-dead", now)
    history.intent("sw-dead", "gpu-01", now, "untaint", "before", "verdict pass")
    node_actions.release(sim.kube, TEST_CONFIG, "gpu-01", "sw-dead")
    second = run_sweep(sim, history)
    assert not any(d.get("action") == "marked a false positive" for d in second.reconciled)
    assert "false-positive" not in [a["action"] for a in history.node_history("gpu-01")["actions"]]
    row = next(history.db.query("select verdict, finished from node_sweeps where id = ?", [sid]))
    assert row["verdict"] == "pass" and row["finished"]
    assert lost_verdicts(history) == []


def test_api_faults_at_five_percent(make_sim, history: History) -> None:
    from tests.conftest import fleet_spec

    sim: Sim = make_sim(fleet_spec(nodes=12, faults={"gpu-03": {"remap_failure": [2]}},
                                   api_faults={"rate": 0.05, "lost_reply_rate": 0.05, "drop_rate": 0.02}))
    cfg = replace(TEST_CONFIG, max_nodes=6)
    reports = [run_sweep(sim, history, cfg) for _ in range(3)]
    outcomes = {o.node: o for r in reports for o in r.outcomes}
    assert len(outcomes) == 12, "every node was swept once across the runs"
    assert sim.kube.errors > 10, "faults were injected and retried"
    taints = sweep_taints(sim)
    passed = {n for n, o in outcomes.items() if o.action == "released"}
    assert not passed & set(taints), "no Sweeper taint on a node that passed"
    assert set(taints) <= {"gpu-03"}
    assert jobs_left(sim) == []
    assert outcomes["gpu-03"].verdict == "replace"
    assert list(history.db.query("select * from node_sweeps where finished is null")) == []


def test_dropped_watches_and_a_compacted_history_lose_nothing(make_sim, history: History) -> None:
    """The run's watches of its Jobs and pods are cut by the server, their history compacted at
    the same moment (a watch from the last version seen is then 410 Gone), three times over: the
    run lists again and every check still ends in its verdict, with nothing left behind. The
    simulator's api_faults.drop_rate also cuts streams at random (test_api_faults_at_five_percent)."""
    from tests.conftest import fleet_spec

    sim: Sim = make_sim(fleet_spec(nodes=6, faults={"gpu-02": {"xids": [{"code": 79, "gpu": 1}]}},
                                   check_seconds=300))
    drops = itertools.count(1)
    dropped = []

    def cut(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "WATCH" and next(drops) <= 3:
            sim.cluster.store.compact()
            sim.server.drop_watches()  # this stream too: it hangs up before its first event
            dropped.append(path)

    sim.server.hooks.append(cut)
    report = run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=6, check_timeout=3000))
    assert dropped, "a watch was cut"
    got = {o.node: (o.verdict, o.action) for o in report.outcomes}
    assert got == {**{f"gpu-0{i}": ("pass", "released") for i in (0, 1, 3, 4, 5)}, "gpu-02": ("reboot", "held")}
    assert set(sweep_taints(sim)) == {"gpu-02"}
    assert jobs_left(sim) == []
    assert list(history.db.query("select * from node_sweeps where finished is null")) == []


def test_a_hundred_races_disturb_no_pod(make_sim, history: History) -> None:
    faults = {f"gpu-{i:03d}": {"pod_lands_on_taint": 1} for i in range(100)}
    sim: Sim = make_sim(nodes=100, faults=faults)
    cfg = replace(TEST_CONFIG, max_nodes=50, light_playbook="")
    raced = 0
    for _ in range(2):
        report = run_sweep(sim, history, cfg)
        raced += sum(1 for o in report.outcomes if o.action == "raced")
    assert raced == 100
    pods = sim.core.list_namespaced_pod("training").items
    assert len(pods) == 100 and all(p.status.phase == "Running" for p in pods), "every workload runs on"
    assert not any(m == "POST" and "eviction" in p for m, p in sim.cluster.store.requests)
    assert not any(m == "DELETE" and "/pods/" in p for m, p in sim.cluster.store.requests)
    assert not any(m == "POST" and p.endswith("/jobs") for m, p in sim.cluster.store.requests), "no check started"
    assert sweep_taints(sim) == {}


def test_the_breaker_opens_on_a_burst_of_failures_and_stays_open(make_sim, history: History) -> None:
    faults = {f"gpu-{i:02d}": {"remap_pending": [0]} for i in range(6)}
    sim: Sim = make_sim(nodes=10, faults=faults)
    cfg = replace(TEST_CONFIG, max_nodes=10, breaker_failures=3, breaker_percent=10)
    first = run_sweep(sim, history, cfg)
    assert sum(1 for o in first.outcomes if o.action == "held") == 6
    assert ("breaker", ) == tuple(e for e, _ in first.events if e == "breaker")
    assert switch(sim, "breaker")["state"] == "open"
    for n in ("gpu-06", "gpu-07"):   # make two healthy nodes due again
        history.db.execute("update node_sweeps set started = 0, finished = 1 where node = ?", [n])
    history.db.conn.commit()
    later = run_sweep(sim, history, replace(cfg, interval=60))
    assert later.outcomes == [] and {d.reason for d in later.plan.skip} >= {"breaker-open"}
    assert switch(sim, "breaker")["state"] == "open", "it does not close itself"
    from click.testing import CliRunner

    from sweeper.cli import main
    res = CliRunner().invoke(main, ["breaker", "status", "--kubeconfig", str(sim.kubeconfig)])
    assert res.exit_code == 0 and "open" in res.stdout and "failing verdicts" in res.stdout
    res = CliRunner().invoke(main, ["breaker", "reset", "--reason", "bad driver rolled back",
                                    "--kubeconfig", str(sim.kubeconfig), "--state", str(history.path)])
    assert res.exit_code == 0, res.output
    closed = switch(sim, "breaker")
    assert closed["state"] == "closed" and closed["close_reason"] == "bad driver rolled back"
    # The CLI stamps the reset with the wall clock; restamp it on the simulated clock the sweep uses.
    set_switch(sim, "breaker", {**closed, "closed_at": sim.cluster.clock.now()})
    after = run_sweep(sim, history, replace(cfg, interval=60))
    assert len(after.outcomes) == 1, "one node at a time during the cooldown"


def test_pause_floor_and_attempts(make_sim, history: History, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sweeper.cli import main
    sim: Sim = make_sim(nodes=6)
    kc = ["--kubeconfig", str(sim.kubeconfig)]
    res = CliRunner().invoke(main, ["pause", "--reason", "maintenance window", "--state", str(history.path), *kc])
    assert res.exit_code == 0
    paused = run_sweep(sim, history)
    assert paused.outcomes == [] and {d.reason for d in paused.plan.skip} == {"paused"}
    CliRunner().invoke(main, ["resume", "--state", str(history.path), *kc])
    floor = run_sweep(sim, history, replace(TEST_CONFIG, min_healthy_nodes=4, run_deadline=1))  # one plan's worth
    assert len(floor.outcomes) == 2, "6 healthy, a floor of 4: two may be taken"
    history.db.execute("update node_sweeps set verdict = 'quarantine'")
    for _ in range(2):
        history.db.table("node_sweeps").insert({"run_id": "x", "node": "gpu-05", "started": 1.0,
                                                "finished": sim.cluster.clock.now(), "verdict": "reboot",
                                                "reasons": "[]", "dry_run": 0, "playbook": "", "profile": "",
                                                "cluster": history.cluster})
    history.db.table("node_sweeps").insert({"run_id": "x", "node": "gpu-05", "started": 1.0,
                                            "finished": sim.cluster.clock.now(), "verdict": "error",
                                            "reasons": "[]", "dry_run": 0, "playbook": "", "profile": "",
                                            "cluster": history.cluster})
    p = run_sweep(sim, history, replace(TEST_CONFIG, breaker_failures=100))
    reasons = {d.node.name: d.reason for d in p.plan.skip}
    assert reasons.get("gpu-05") == "attempts-exhausted"


@pytest.mark.realtime("a SIGTERM or Ctrl-C to a sweep process mid-check")
@pytest.mark.parametrize("sig,code", [(signal.SIGTERM, 0), (signal.SIGINT, 130)], ids=["sigterm", "ctrl-c"])
def test_sigterm_hands_every_node_back_and_exits(make_sim, tmp_path: Path, sig: int, code: int) -> None:
    """SIGTERM (the CronJob's pod deleted) and Ctrl-C (a person at a terminal) stop the run the same
    way: every node handed back, the run recorded and reported. Ctrl-C exits 130, as a shell reports a
    command it stopped, never 1 (findings) as click's own "Aborted!" did."""
    sim: Sim = make_sim(nodes=3, faults={f"gpu-0{i}": {"hung_check": True} for i in range(3)})
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"max_nodes": 3, "max_percent": 100, "poll_interval": 0.05,
                                   "check_timeout": 86400, "lock_ttl": 5}))
    state = tmp_path / "h.db"
    proc = procs.start(_sweep_cmd(sim.kubeconfig, state, cfg), stdout=procs.PIPE, stderr=procs.PIPE)
    created = threading.Event()

    def hook(st: str, m: str, path: str) -> None:
        if st == "after" and m == "POST" and path.endswith("/jobs"):
            created.set()

    sim.server.hooks.append(hook)
    assert created.wait(30), "no check Job was started"
    time.sleep(0.3)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == code, err.decode()[-2000:]
    assert (b"error: interrupted" in err) == (sig == signal.SIGINT), err.decode()[-2000:]
    report = json.loads(out)
    assert {n["verdict"] for n in report["nodes"]} == {"inconclusive"}
    assert {n["action"] for n in report["nodes"]} == {"released"}
    assert sweep_taints(sim) == {} and jobs_left(sim) == []
    h = History(state)
    assert list(h.db.query("select * from node_sweeps where finished is null")) == []
    assert h.last_swept() == {}, "an interrupted sweep does not count as a sweep"
    h.close()


def test_release_is_a_panic_button_that_needs_no_history(make_sim, history: History, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sweeper.cli import main
    sim: Sim = make_sim(nodes=4, faults={"gpu-01": {"missing_gpus": 1}, "gpu-02": {"remap_failure": [0]}})
    run_sweep(sim, history)
    assert set(sweep_taints(sim)) == {"gpu-01", "gpu-02"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text("api_attempts: 2\n")
    base = ["--kubeconfig", str(sim.kubeconfig), "--config", str(cfg), "--reason", "incident 42", "--json"]
    res = CliRunner().invoke(main, ["release", "gpu-01", "--state", str(tmp_path / "missing.db"), *base])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)[0]["action"] == "released"
    assert set(sweep_taints(sim)) == {"gpu-02"}
    # issue 24, point 7: the release leaves an Event on the node, as a sweep's hold and verdict do (an Event
    # names its node in involvedObject: https://kubernetes.io/docs/reference/kubernetes-api/cluster-resources/event-v1/)
    events = [e for e in sim.core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-01").items
              if e.reason == "SweepReleased"]
    assert len(events) == 1 and "released by hand: incident 42" in events[0].message, events
    assert events[0].involved_object.kind == "Node" and events[0].type == "Normal"
    res = CliRunner().invoke(main, ["release", "--all", "--dry-run", "--state", str(history.path), *base])
    assert [r["action"] for r in json.loads(res.stdout)] == ["would release"]
    assert set(sweep_taints(sim)) == {"gpu-02"}
    res = CliRunner().invoke(main, ["release", "--all", "--state", str(history.path), *base])
    assert res.exit_code == 0 and sweep_taints(sim) == {}
    ann = sim.core.read_node("gpu-02").metadata.annotations or {}
    # what is left: the last result, the release's own mark, and why it is a suspect now: released
    # after its failing verdict, the next sweep checks it first (tests/cluster/test_release.py)
    assert not [k for k in ann if k.startswith("sweeper.dev/") and k not in (
        "sweeper.dev/last-result", "sweeper.dev/released", "sweeper.dev/suspect-reason")]
    assert "karpenter.sh/do-not-disrupt" not in ann and "incident 42" in ann["sweeper.dev/released"]
    acts = [a["detail"] for a in history.db.query("select detail from actions where run_id = 'manual'")]
    assert acts and "incident 42" in acts[0]
    res = CliRunner().invoke(main, ["release", "--state", str(history.path), *base])
    assert res.exit_code == 2


def test_demand_and_suspects(make_sim, history: History) -> None:
    from kubernetes import client

    sim: Sim = make_sim(nodes=4)
    for n in ("gpu-00", "gpu-01", "gpu-02"):
        sim.core.patch_node(n, {"spec": {"taints": [{"key": "maint", "effect": "NoSchedule"}]}})
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="big", namespace="training"),
                       spec=client.V1PodSpec(containers=[client.V1Container(
                           name="c", image="i", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "16"}))]))
    sim.core.create_namespaced_pod("training", pod)
    sim.wait_for(lambda: sim.core.read_namespaced_pod("big", "training").status.conditions, what="unschedulable")
    waiting = run_sweep(sim, history, replace(TEST_CONFIG, allowed_taint_keys=("maint",)))
    assert waiting.outcomes == [] and "demand" in {d.reason for d in waiting.plan.skip}
    sim.core.delete_namespaced_pod("big", "training")
    sim.core.patch_node_status("gpu-03", {"status": {"conditions": [
        {"type": "Ready", "status": "True"}, {"type": "GpuXid", "status": "True", "reason": "XidFound"}]}})
    first = run_sweep(sim, history, replace(TEST_CONFIG, allowed_taint_keys=("maint",), max_nodes=1, run_deadline=1))
    assert [o.node for o in first.outcomes] == ["gpu-03"], "a suspect goes first"
    assert "suspect: condition GpuXid" in first.plan.take[0].detail
    again = run_sweep(sim, history, replace(TEST_CONFIG, allowed_taint_keys=("maint",), max_nodes=4,
                                            handled_conditions=("GpuXid",)))
    assert {d.node.name: d.reason for d in again.plan.skip}["gpu-03"] == "handled-elsewhere"


def _on_first_job(sim: Sim, action: Any) -> None:
    fired = {"done": False}

    def hook(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "POST" and path.endswith("/jobs") and not fired["done"]:
            fired["done"] = True
            action()

    sim.server.hooks.append(hook)


def test_a_node_deleted_mid_sweep(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=1)
    _on_first_job(sim, lambda: sim.cluster.store.delete("nodes", None, "gpu-00"))  # consolidation took it
    report = run_sweep(sim, history)
    o = report.outcomes[0]
    assert (o.verdict, o.action) == ("inconclusive", "released"), o.reasons
    assert "the node is gone" in o.reasons[0]
    assert jobs_left(sim) == []
    assert list(history.db.query("select * from node_sweeps where finished is null")) == []


def test_a_human_cordon_mid_sweep_is_left_in_place(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=1)

    def cordon() -> None:
        sim.cluster.store.mutate("nodes", None, "gpu-00", lambda n: n["spec"].__setitem__("unschedulable", True))

    _on_first_job(sim, cordon)
    report = run_sweep(sim, history)
    o = report.outcomes[0]
    assert o.verdict == "inconclusive" and "never scheduled" in o.reasons[0], "the check pod could not land"
    node = sim.core.read_node("gpu-00")
    assert node.spec.unschedulable is True, "the person's cordon stays"
    assert sweep_taints(sim) == {} and jobs_left(sim) == []
    assert history.last_swept() == {}, "an inconclusive check is no verdict on the node"


def test_simulated_faults_checks_never_schedule_lost_pods_slow_api(make_sim, history: History) -> None:
    from tests.conftest import fleet_spec

    sim: Sim = make_sim(fleet_spec(nodes=3, faults={"gpu-00": {"checks_never_schedule": True},
                                                    "gpu-01": {"lose_check_pod": 1}},
                                   api_faults={"slow_rate": 0.1, "latency": 0.02}))
    report = run_sweep(sim, history)
    got = {o.node: (o.verdict, o.action) for o in report.outcomes}
    assert got == {"gpu-00": ("inconclusive", "released"), "gpu-01": ("pass", "released"),
                   "gpu-02": ("pass", "released")}
    assert sweep_taints(sim) == {} and jobs_left(sim) == []


def test_a_person_releasing_a_held_node_marks_a_false_positive(make_sim, history: History) -> None:
    sim, cfg, second = held_then_released_by_a_person(make_sim, history)
    o = {x.node: x for x in second.outcomes}["gpu-01"]
    assert (o.verdict, o.action) == ("warn", "released"), "the same XID does not hold it again"
    assert "dismissed by a person" in o.reasons[0]
    acts = [a["action"] for a in history.node_history("gpu-01")["actions"]]
    assert "false-positive" in acts
    # New evidence: another fault on another GPU holds it as usual.
    sim.cluster.specs["gpu-01"].faults.remap_failure = [5]
    third = run_sweep(sim, history, cfg)
    o = {x.node: x for x in third.outcomes}["gpu-01"]
    assert (o.verdict, o.action) == ("replace", "held")
    # A backtest of the same policy replays the dismissal as it happened.
    bt = backtest(history, load_policy(TEST_CONFIG.path("policies") / TEST_CONFIG.policy), 0.0)
    assert [(d.recorded, d.replayed) for d in bt.decisions if d.node == "gpu-01"] == \
        [("reboot", "reboot"), ("warn", "warn"), ("replace", "replace")]
    assert not [d for d in bt.decisions if d.differs]


def test_light_checks_on_busy_nodes_make_suspects(make_sim, history: History) -> None:
    # An NVML finding: the light check is unprivileged and does not read the kernel log (XIDs).
    sim: Sim = make_sim(nodes=3, faults={"gpu-01": {"remap_pending": [2]}},
                        workloads=[{"node": "gpu-01", "gpus": 8, "duration": None},
                                   {"node": "gpu-02", "gpus": 8, "duration": None}])
    sim.wait_for(lambda: len(sim.core.list_namespaced_pod("training").items) == 2, what="workloads")
    first = run_sweep(sim, history)
    got = {o.node: (o.verdict, o.action) for o in first.outcomes}
    assert got == {"gpu-00": ("pass", "released"), "gpu-01": ("reboot", "light"), "gpu-02": ("pass", "light")}
    node = sim.core.read_node("gpu-01")
    assert node.metadata.labels.get("sweeper.dev/suspect") == "true" and not node.spec.taints
    events = sim.core.list_namespaced_event("default", field_selector="involvedObject.name=gpu-01").items
    events = [e for e in events if e.reason == "SweeperSuspect"]
    assert len(events) == 1 and "row remap" in events[0].message.lower()
    assert all(p.status.phase == "Running" for p in sim.core.list_namespaced_pod("training").items)
    assert history.last_swept().keys() == {"gpu-00"}, "a light check is not a sweep"
    light_jobs = [p for m, p in sim.cluster.store.requests if m == "POST" and p.endswith("/jobs")]
    assert len(light_jobs) == 3
    again = run_sweep(sim, history)
    assert [o.node for o in again.outcomes] == [], "light checks wait for light_interval"
    for pod in sim.core.list_namespaced_pod("training").items:  # the jobs end
        sim.core.delete_namespaced_pod(pod.metadata.name, "training")
    later = run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=1))
    assert [d.node.name for d in later.plan.take] == ["gpu-01"]
    assert "suspect: a light check failed" in later.plan.take[0].detail
    assert (later.outcomes[0].verdict, later.outcomes[0].action) == ("reboot", "held")


def test_abort_on_demand_and_the_replacement_cap(make_sim, history: History) -> None:
    from kubernetes import client

    sim: Sim = make_sim(nodes=4, faults={"gpu-01": {"remap_failure": [1]}, "gpu-02": {"remap_failure": [2]},
                                         "gpu-03": {"hung_check": True}})
    cfg = replace(TEST_CONFIG, max_replacements_per_hour=1, check_timeout=3000, abort_on_demand=True)

    def demand() -> None:  # a job that only the hung check's node can host arrives while that check runs
        pod = client.V1Pod(metadata=client.V1ObjectMeta(name="big", namespace="training"),
                           spec=client.V1PodSpec(node_selector={"kubernetes.io/hostname": "gpu-03"},
                                                 containers=[client.V1Container(
                               name="c", image="i", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "8"}))]))
        threading.Thread(target=lambda: sim.core.create_namespaced_pod("training", pod)).start()

    # When the three checks that finish have had their Jobs deleted (their results are read), not
    # after a real-time delay that a busy machine may outlast while a check still runs.
    deleted = itertools.count(1)  # next() is atomic: the server answers on several threads

    def after_three_checks(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "DELETE" and "/jobs/" in path and next(deleted) == 3:
            demand()

    sim.server.hooks.append(after_three_checks)
    report = run_sweep(sim, history, cfg)
    got = {o.node: o for o in report.outcomes}
    assert got["gpu-03"].verdict == "inconclusive" and "pending GPU pod" in got["gpu-03"].reasons[0]
    replaced = [o for o in report.outcomes if o.verdict == "replace"]
    capped = [o for o in report.outcomes if o.verdict == "quarantine"]
    assert len(replaced) == 1 and len(capped) == 1, [(o.node, o.verdict) for o in report.outcomes]
    assert "replacement cap reached" in capped[0].reasons[-1]


class _Signals:
    """A stand-in Prometheus and Loki on a loopback port, answering canned documents."""

    def __init__(self, prom: dict[str, Any], loki: dict[str, Any]) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        docs = {"/api/v1/query": prom, "/loki/api/v1/query_range": loki}
        self.seen: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return None

            def do_GET(self) -> None:  # noqa: N802
                outer.seen.append(self.path)
                body = json.dumps(docs[self.path.split("?")[0]]).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_the_default_prometheus_query_reads_both_host_labels() -> None:
    """dcgm-exporter renamed its host label `Hostname` to `hostname` (NVIDIA/dcgm-exporter#655): a
    fleet mid-upgrade has both; the default query groups by both and each series is read by the one
    it carries."""
    from sweeper import signals

    prom = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"hostname": "gpu-new"}, "value": [0, "79"]},
        {"metric": {"Hostname": "gpu-old"}, "value": [0, "48"]}]}}
    fake = _Signals(prom, {})
    try:
        source = signals.Source.from_dict({"type": "prometheus", "url": fake.url})
        found = signals.query(source)
    finally:
        fake.close()
    assert set(found) == {"gpu-new", "gpu-old"}
    assert "by (Hostname, hostname)" in source.query


def test_prometheus_and_loki_name_suspects(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=4)
    run_sweep(sim, history)  # every node swept: none is due for a day
    prom = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"Hostname": "gpu-02", "gpu": "3"}, "value": [0, "79"]}]}}
    line79 = "NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    line43 = "NVRM: Xid (PCI:0000:18:00): 43, pid=1, name=python, Ch 00000010"
    loki = {"status": "success", "data": {"resultType": "streams", "result": [
        {"stream": {"node": "gpu-03"}, "values": [["1", line79]]},
        {"stream": {"node": "gpu-01"}, "values": [["1", line43]]}]}}
    signals = _Signals(prom, loki)
    try:
        sources = ({"type": "prometheus", "url": signals.url}, {"type": "loki", "url": signals.url},
                   {"type": "prometheus", "url": "http://127.0.0.1:9"})
        report = run_sweep(sim, history, replace(TEST_CONFIG, suspect_sources=sources))
    finally:
        signals.close()
    assert {o.node: o.action for o in report.outcomes} == {"gpu-02": "released", "gpu-03": "released"}, \
        "suspects are due at once"
    details = {d.node.name: d.detail for d in report.plan.take}
    assert "Prometheus" in details["gpu-02"] and "Loki: XID 79" in details["gpu-03"]
    assert any("suspect source unavailable" in d.get("msg", "") for e, d in report.events if e == "log")
    for n in ("gpu-02", "gpu-03"):
        events = sim.core.list_namespaced_event("default", field_selector=f"involvedObject.name={n}").items
        assert [e.reason for e in events].count("SweeperSuspect") == 1
        assert "sweeper.dev/suspect" not in (sim.core.read_node(n).metadata.labels or {}), "a pass clears it"
    assert "sweeper.dev/suspect" not in (sim.core.read_node("gpu-01").metadata.labels or {}), "XID 43 is no signal"

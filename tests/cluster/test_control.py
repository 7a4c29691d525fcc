"""The switches people flip (pause, breaker, dismissals) live in the cluster, in the
`sweeper-control` ConfigMap, so that they work from any machine with the kubeconfig: an
operator's laptop with its own history file, the CronJob with the one on its volume."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from sweeper.backtest import backtest
from sweeper.cli import main
from sweeper.control import Controls
from sweeper.history import History
from sweeper.policy import load_policy
from tests.conftest import TEST_CONFIG, Sim, held_then_released_by_a_person, run_sweep

TAINT = TEST_CONFIG.taint_key
NS, NAME = TEST_CONFIG.namespace, TEST_CONFIG.control_name


def switch(sim: Sim, key: str) -> dict[str, Any] | None:
    """A switch as the cluster holds it, read with the official client."""
    cm = sim.core.read_namespaced_config_map(NAME, NS)
    text = (cm.data or {}).get(key)
    return json.loads(text) if text is not None else None


def set_switch(sim: Sim, key: str, value: dict[str, Any]) -> None:
    """A switch written as a person with kubectl would (a merge patch of one data key)."""
    sim.core.patch_namespaced_config_map(NAME, NS, {"data": {key: json.dumps(value)}})


def cli(*args: str) -> Any:
    return CliRunner().invoke(main, list(args))


def control_writes(sim: Sim) -> list[tuple[str, str]]:
    return [(m, p) for m, p in sim.cluster.store.requests if "/configmaps" in p and m != "GET"]


def seen(history: History) -> list[str]:
    return [r["detail"] for r in history.db.query("select detail from actions where action = 'control-seen' "
                                                   "order by id")]


def test_an_operators_pause_from_a_laptop_stops_a_sweep_with_another_history(make_sim, history: History,
                                                                             tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=3)
    kc = ["--kubeconfig", str(sim.kubeconfig)]
    laptop = tmp_path / "elsewhere" / "laptop.db"
    laptop.parent.mkdir()
    res = cli("pause", "--reason", "driver rollout", "--state", str(laptop), *kc)
    assert res.exit_code == 0, res.output
    assert switch(sim, "pause")["reason"] == "driver rollout"
    assert not laptop.exists(), "no history file is made where there was none"

    paused = run_sweep(sim, history)
    assert paused.outcomes == [] and {d.reason for d in paused.plan.skip} == {"paused"}
    assert all("driver rollout" in d.detail for d in paused.plan.skip)
    assert len(seen(history)) == 1 and seen(history)[0].startswith("pause: ") and "driver rollout" in seen(history)[0]

    # what people see, from any machine: the breaker status and the plan (which only reads)
    writes = len(control_writes(sim))
    res = cli("breaker", "status", "--state", str(laptop), *kc)
    assert res.exit_code == 0 and "closed" in res.stdout and "paused" in res.stdout and "driver rollout" in res.stdout
    res = cli("breaker", "status", "--json", *kc)
    assert json.loads(res.stdout)["paused"]["reason"] == "driver rollout"
    res = cli("plan", "--json", "--state", str(tmp_path / "third.db"), *kc)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert "driver rollout" in doc["paused"] and {n["reason"] for n in doc["nodes"]} == {"paused"}
    res = cli("plan", "--state", str(tmp_path / "third.db"), *kc)
    assert "paused by" in res.stdout and "driver rollout" in res.stdout
    dry = run_sweep(sim, history, dry_run=True)
    assert dry.outcomes == [] and {d.reason for d in dry.plan.skip} == {"paused"}
    assert len(control_writes(sim)) == writes, "status, plan and --dry-run write nothing"

    again = run_sweep(sim, history)
    assert again.outcomes == [] and len(seen(history)) == 1, "an unchanged switch is recorded once"

    res = cli("resume", "--state", str(laptop), *kc)
    assert res.exit_code == 0 and switch(sim, "pause") is None
    resumed = run_sweep(sim, history)
    assert {o.node: o.action for o in resumed.outcomes} == {f"gpu-0{i}": "released" for i in range(3)}
    assert seen(history)[-1] == "pause: cleared"


def test_a_breaker_a_run_opened_is_seen_and_reset_from_another_machine(make_sim, history: History,
                                                                      tmp_path: Path) -> None:
    faults = {f"gpu-{i:02d}": {"remap_pending": [0]} for i in range(6)}
    sim: Sim = make_sim(nodes=10, faults=faults)
    cfg = replace(TEST_CONFIG, max_nodes=10, breaker_failures=3, breaker_percent=10)
    run_sweep(sim, history, cfg)
    assert switch(sim, "breaker")["state"] == "open"
    assert history.get_control("breaker") is None, "nothing is kept in the history file"

    laptop = ["--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "laptop.db")]
    res = cli("breaker", "status", *laptop)
    assert res.exit_code == 0 and "open" in res.stdout and "failing verdicts" in res.stdout
    res = cli("plan", "--json", *laptop)
    assert "failing verdicts" in json.loads(res.stdout)["breaker"]

    # A second sweeper with an empty history of its own is stopped by the same breaker.
    other = History(tmp_path / "other.db")
    try:
        stopped = run_sweep(sim, other, cfg)
        assert stopped.outcomes == [] and "breaker-open" in {d.reason for d in stopped.plan.skip}
        assert [d for d in seen(other) if d.startswith("breaker: ")], "the run recorded the breaker it saw"

        res = cli("breaker", "reset", "--reason", "bad driver rolled back", *laptop)
        assert res.exit_code == 0, res.output
        closed = switch(sim, "breaker")
        assert closed["state"] == "closed" and closed["close_reason"] == "bad driver rolled back"
        # The rolling run opens the breaker at its first look past the threshold: 3 to 6 failures in.
        assert re.match(r"[3-6] failing verdicts", closed["reason"]), f"the reset keeps why it opened: {closed}"
        # The CLI stamps the reset with the wall clock; restamp it on the simulated clock the sweep uses.
        set_switch(sim, "breaker", {**closed, "closed_at": sim.cluster.clock.now()})
        after = run_sweep(sim, other, cfg)
        assert len(after.outcomes) == 1, "one node at a time during the cooldown"
    finally:
        other.close()


def test_a_dismissal_holds_across_history_files(make_sim, history: History, tmp_path: Path) -> None:
    sim, cfg, second = held_then_released_by_a_person(make_sim, history)
    assert switch(sim, "dismissed.gpu-01")["keys"], "the dismissal lives in the cluster"
    assert [d["node"] for d in history.dismissals()] == ["gpu-01"], "and its record in the history, for backtests"
    assert seen(history) == [], "a switch a run flips itself is not news to its own history"

    other = History(tmp_path / "other.db")
    try:
        third = run_sweep(sim, other, cfg)
        o = {x.node: x for x in third.outcomes}["gpu-01"]
        assert (o.verdict, o.action) == ("warn", "released"), "the same XID does not hold it from another history"
        assert "dismissed by a person" in o.reasons[0]
        acts = {a["action"]: a["detail"] for a in other.node_history("gpu-01")["actions"]}
        assert acts["control-seen"].startswith("dismissed.gpu-01: ")
        # A backtest of this other history replays the dismissal it saw in the cluster.
        bt = backtest(other, load_policy(TEST_CONFIG.path("policies") / TEST_CONFIG.policy), 0.0)
        assert [(d.recorded, d.replayed) for d in bt.decisions if d.node == "gpu-01"] == [("warn", "warn")]
    finally:
        other.close()


def test_a_pause_in_an_old_history_file_is_carried_to_the_cluster(make_sim, history: History,
                                                                  tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=2)
    now = sim.cluster.clock.now()
    history.set_control("pause", {"by": "ops", "reason": "kept by an older version"}, now)  # the old table
    history.set_control("dismissed/gpu-01", {"keys": ["xid|79"], "verdict": "reboot"}, now)
    kc = ["--kubeconfig", str(sim.kubeconfig), "--state", str(history.path)]
    res = cli("plan", "--json", *kc)
    assert "kept by an older version" in json.loads(res.stdout)["paused"], "plan shows it before any run"
    assert control_writes(sim) == []

    paused = run_sweep(sim, history)
    assert paused.outcomes == [] and {d.reason for d in paused.plan.skip} == {"paused"}
    carried = switch(sim, "pause")
    assert carried["reason"] == "kept by an older version" and carried["carried_from"] == "history"
    assert history.get_control("pause") is None
    migrated = [r["detail"] for r in history.db.query("select detail from actions where action = 'control-migrated'")]
    assert len(migrated) == 1 and "pause carried from the history file" in migrated[0]

    assert cli("resume", *kc).exit_code == 0
    resumed = run_sweep(sim, history)
    assert len(resumed.outcomes) == 2
    assert switch(sim, "dismissed.gpu-01")["keys"] == ["xid|79"], "a dismissal is carried when first needed"
    assert history.get_control("dismissed/gpu-01") is None


def test_writes_to_different_switches_do_not_lose_each_other(sim: Sim) -> None:
    a = Controls(sim.kube, NS, NAME)
    b = Controls(sim.kube, NS, NAME)
    assert a.refresh() == {} and b.refresh() == {}
    a.set("pause", {"by": "a", "reason": "one"}, 1.0)   # creates the ConfigMap
    b.set("breaker", {"state": "open"}, 2.0)            # b's view is stale: its create conflicts, it re-reads
    a.set("dismissed.gpu-00", {"keys": ["x"]}, 3.0)     # a's version is stale: its patch's test fails, it re-reads
    assert set(Controls(sim.kube, NS, NAME).refresh()) == {"pause", "breaker", "dismissed.gpu-00"}
    b.set("pause", None, 4.0)
    assert switch(sim, "pause") is None and switch(sim, "breaker") == {"state": "open", "ts": 2.0}
    b.set("pause", None, 5.0)  # removing what is not there changes nothing
    assert a.refresh()["dismissed.gpu-00"]["keys"] == ["x"]


def test_control_commands_without_a_cluster_exit_3(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kc = tmp_path / "kubeconfig"
    kc.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    cfg = tmp_path / "config.yaml"
    cfg.write_text("api_attempts: 1\n")
    opts = ["--kubeconfig", str(kc), "--config", str(cfg), "--state", str(tmp_path / "h.db")]
    for cmd in (["pause", "--reason", "x"], ["resume"], ["breaker", "status"], ["breaker", "reset", "--reason", "x"]):
        res = CliRunner().invoke(main, [*cmd, *opts])
        assert res.exit_code == 3, (cmd, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and "connection failed" in res.stderr

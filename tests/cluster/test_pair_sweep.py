"""Pair sweeps end to end against the simulated cluster: two nodes held together, one pair run
of the shipped pair-fabric.yaml over the simulated fabric, re-pairing a failed pair's nodes with
known-good partners, races, the budget, and SIGKILL at every step of a pair sweep.

Some tests use a stand-in pair playbook whose check is the node-local one on `node` alone (a
fault the simulator already models, XID 79): they pin the engine's holding, re-pairing and
verdicts apart from the pair Job."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sweeper.config import Config
from sweeper.history import History
from sweeper.sim.server import running_pods_on
from tests import procs
from tests.cluster.test_safety import _sweep_cmd, kill_sweep_at
from tests.conftest import TEST_CONFIG, Sim, run_sweep

TAINT = TEST_CONFIG.taint_key
XID79 = {"xids": [{"code": 79, "gpu": 2}]}

STANDIN = """name: stand-in pair
pair: true
tasks:
  - name: the node-local checks of node A, as the pair's check
    run_job: {template: sweeper-check.yaml.j2, timeout: 15m}
    register: a
    ignore_errors: true
  - name: verdict
    decide: {results: ["{{ a }}"]}
"""


def standin(tmp_path: Path, **kw: Any) -> Any:
    (tmp_path / "pb").mkdir(exist_ok=True)
    (tmp_path / "pb" / "standin.yaml").write_text(STANDIN)
    return replace(TEST_CONFIG, playbook="standin.yaml", playbook_dir=str(tmp_path / "pb"), light_playbook="",
                   **kw)


def fabric(**kw: Any) -> Any:
    return replace(TEST_CONFIG, playbook="pair-fabric.yaml", light_playbook="", **kw)


def services_left(sim: Sim) -> list[str]:
    with sim.cluster.store.lock:
        return [v["metadata"]["name"] for v in sim.cluster.store.iter("services")]


def tainted(sim: Sim) -> set[str]:
    """From the simulated cluster's store: the truth."""
    with sim.cluster.store.lock:
        return {n["metadata"]["name"] for n in sim.cluster.store.iter("nodes")
                if any(t.get("key") == TAINT for t in n["spec"].get("taints") or [])}


def actions_of(report: Any) -> dict[str, list[tuple[str, str]]]:
    out: dict[str, list[tuple[str, str]]] = {}
    for o in report.outcomes:
        out.setdefault(o.node, []).append((o.verdict, o.action))
    return out


def pairs(history: History) -> list[tuple[str, str, str, str]]:
    return [(r["node"], r["partner"], r["status"], r["mode"]) for r in history.db.query("select * from pairs order by id")]


def test_a_pair_passes_and_both_nodes_go_back(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2)
    report = run_sweep(sim, history, fabric())
    assert actions_of(report) == {"gpu-00": [("pass", "released")], "gpu-01": [("pass", "released")]}
    (row,) = history.db.query("select * from pairs")
    assert (row["node"], row["partner"], row["status"], row["mode"]) == ("gpu-00", "gpu-01", "pass", "sweep")
    assert row["busbw"] > 350, "above the p5 profile's floor"
    assert history.known_good(0) == {"gpu-00", "gpu-01"}
    for node, sweep_id in (("gpu-00", row["node_sweep_id"]), ("gpu-01", row["partner_sweep_id"])):
        sweep = history.node_history(node)["sweeps"][0]
        assert (sweep["id"], sweep["kind"], sweep["verdict"]) == (sweep_id, "pair", "pass")
        names = {r["name"] for r in history.db.query("select name from checks where sweep_id = ?", [sweep_id])}
        assert {"pair.nccl", "pair.mtu"} <= names, node
    assert tainted(sim) == set() and services_left(sim) == []
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []


def test_node_sweeps_and_pair_sweeps_keep_their_own_cadence(make_sim, history: History) -> None:
    """A node swept by the daily node playbook an hour ago is still due its pair sweep, and the
    pair sweep does not put off its node sweep: with one shared `last swept`, a schedule that
    sweeps nodes more often than `interval` would never let the pair schedule take a node."""
    sim: Sim = make_sim(nodes=2)
    single = replace(TEST_CONFIG, light_playbook="")
    first = run_sweep(sim, history, single)
    assert {o.node for o in first.outcomes if o.action == "released"} == {"gpu-00", "gpu-01"}
    sim.cluster.clock.advance(3600)
    pair = run_sweep(sim, history, fabric())
    assert actions_of(pair) == {"gpu-00": [("pass", "released")], "gpu-01": [("pass", "released")]}
    sim.cluster.clock.advance(3600)
    assert not [o for o in run_sweep(sim, history, fabric()).outcomes if o.action != "light"], \
        "pair-swept an hour ago: not due a pair sweep again"
    assert not [o for o in run_sweep(sim, history, single).outcomes if o.action != "light"], \
        "node-swept two hours ago: not due a node sweep again"
    sim.cluster.clock.advance(TEST_CONFIG.interval)
    again = run_sweep(sim, history, single)
    assert {o.node for o in again.outcomes if o.action == "released"} == {"gpu-00", "gpu-01"}


def test_a_degraded_link_is_named_through_re_pairing(make_sim, history: History) -> None:
    """A pair's bandwidth is its slower node's: a failed pair names neither node until each is
    re-paired with a node that passed."""
    sim: Sim = make_sim(nodes=4, faults={"gpu-00": {"link_degraded": 0.4}})
    report = run_sweep(sim, history, fabric())
    got = actions_of(report)
    assert got["gpu-00"][0] == ("inconclusive", "suspect") and got["gpu-00"][-1][1] == "held"
    assert got["gpu-00"][-1][0] in ("reboot", "replace", "quarantine")
    assert got["gpu-01"] == [("inconclusive", "suspect"), ("pass", "released")], "its first partner goes back"
    repairs = {r[0]: r for r in pairs(history) if r[3] == "repair"}
    assert repairs["gpu-00"][1:3] in {("gpu-02", "fail"), ("gpu-03", "fail")}
    assert got[repairs["gpu-00"][1]][-1] == ("inconclusive", "released")
    reasons = history.node_history("gpu-00")["sweeps"][0]["reasons"]
    assert any("pair.nccl" in r for r in reasons) and f"failed again with known-good partner {repairs['gpu-00'][1]}" \
        in reasons
    assert tainted(sim) == {"gpu-00"} and services_left(sim) == []
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []


def test_the_engine_re_pairs_a_failed_pair_and_names_the_culprit(make_sim, history: History, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=6, faults={"gpu-00": XID79})
    report = run_sweep(sim, history, standin(tmp_path, max_nodes=4))
    got = actions_of(report)
    assert got["gpu-00"] == [("inconclusive", "suspect"), ("reboot", "held")]
    assert got["gpu-01"] == [("inconclusive", "suspect"), ("pass", "released")], "its first partner goes back"
    done = pairs(history)
    assert set(done[:2]) == {("gpu-02", "gpu-03", "pass", "sweep"), ("gpu-00", "gpu-01", "fail", "sweep")}
    repairs = {r[0]: r for r in done if r[3] == "repair"}
    assert repairs["gpu-00"][1] in {"gpu-02", "gpu-03"} and repairs["gpu-00"][2] == "fail"
    assert repairs["gpu-01"][1] in {"gpu-02", "gpu-03"} and repairs["gpu-01"][2] == "pass"
    k = repairs["gpu-00"][1]
    assert got[k][-1] == ("inconclusive", "released"), "the known-good partner of the culprit goes back"
    assert ("gpu-04", "gpu-05", "pass", "sweep") in done, "new pairs after the re-pairs"
    assert tainted(sim) == {"gpu-00"}
    rows = history.node_history("gpu-01")["sweeps"]
    assert [(r["verdict"], r["kind"]) for r in rows][:2] == [("pass", "pair"), ("inconclusive", "pair")]
    assert rows[1]["reasons"][0].startswith("pair with gpu-00 failed: xid")
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []


def test_no_known_good_partner_sends_both_back_inconclusive(make_sim, history: History) -> None:
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"link_degraded": 0.4}})
    report = run_sweep(sim, history, fabric())
    got = actions_of(report)
    assert got["gpu-00"][-1] == ("inconclusive", "released") and got["gpu-01"][-1] == ("inconclusive", "released")
    assert "no known-good partner" in report.outcomes[-1].reasons[0]
    assert tainted(sim) == set()
    assert pairs(history) == [("gpu-00", "gpu-01", "fail", "sweep")]
    assert history.pair_suspects(0) == {"gpu-00": "gpu-01", "gpu-01": "gpu-00"}


def test_a_raced_pair_disturbs_no_pod_and_hands_both_back(make_sim, history: History) -> None:
    """`pod_lands_on_taint`: a training pod is bound to the node just as Sweeper's taint lands
    (the scheduler's bind and the taint race; a NoSchedule taint does not evict a bound pod,
    kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/)."""
    sim: Sim = make_sim(nodes=2, faults={"gpu-01": {"pod_lands_on_taint": 1}})
    report = run_sweep(sim, history, fabric())
    got = actions_of(report)
    assert got == {"gpu-00": [("", "skipped")], "gpu-01": [("", "raced")]}
    pods = running_pods_on(sim.cluster, "gpu-01")
    assert len(pods) == 1 and pods[0]["metadata"]["namespace"] == "training", "the workload runs on, untouched"
    assert tainted(sim) == set()
    assert sim.batch.list_namespaced_job("sweeper-checks").items == [] and services_left(sim) == [] and pairs(history) == []
    assert history.db.execute("select count(*) from node_sweeps").fetchone()[0] == 0


def test_a_pair_counts_two_against_max_nodes_the_floor_and_demand(make_sim, history: History,
                                                                   tmp_path: Path) -> None:
    from kubernetes import client

    sim: Sim = make_sim(nodes=6)
    most = {"n": 0}

    def count(stage: str, method: str, path: str) -> None:
        if stage == "after" and method == "PATCH" and "/nodes/" in path:
            most["n"] = max(most["n"], len(tainted(sim)))

    sim.server.hooks.append(count)
    report = run_sweep(sim, history, standin(tmp_path, max_nodes=3))
    assert most["n"] == 2, "room for three nodes holds one pair at a time"
    assert sorted(o.node for o in report.outcomes) == [f"gpu-0{i}" for i in range(6)]
    sim.server.hooks.clear()
    again = replace(standin(tmp_path), interval=1)
    floor = run_sweep(sim, history, replace(again, min_healthy_nodes=5))
    assert floor.plan.budget == 1 and floor.outcomes == [], "room for one node takes no pair"
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="big", namespace="training"),
                       spec=client.V1PodSpec(containers=[client.V1Container(
                           name="c", image="i", resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": "16"}))]))
    sim.core.create_namespaced_pod("training", pod)
    sim.wait_for(lambda: sim.core.read_namespaced_pod("big", "training").status.conditions, what="unschedulable")
    demand = run_sweep(sim, history, again)
    assert demand.outcomes == [] and "demand" in {d.reason for d in demand.plan.skip}


def test_an_odd_node_of_a_group_waits(make_sim, history: History, tmp_path: Path) -> None:
    sim: Sim = make_sim(nodes=3)
    report = run_sweep(sim, history, standin(tmp_path))
    assert sorted(o.node for o in report.outcomes) == ["gpu-00", "gpu-01"]
    assert tainted(sim) == set()


def test_a_node_that_failed_with_enough_partners_is_held_without_a_re_pair(make_sim, history: History,
                                                                           tmp_path: Path) -> None:
    """The shipped policy's `pair_failures` rule (three different partners within 7 days)."""
    sim: Sim = make_sim(nodes=4, faults={"gpu-00": XID79})
    now = sim.cluster.clock.now()
    for i, other in enumerate(("gpu-x1", "gpu-x2")):
        history.pair_result(f"sw-old-{i}", now - 3600 * (i + 1), "gpu-00", other, "fail", "sweep", 100.0, "low")
    report = run_sweep(sim, history, standin(tmp_path))
    got = actions_of(report)
    assert got["gpu-00"] == [("quarantine", "held")], "the rule condemns it at once"
    assert got["gpu-01"] == [("inconclusive", "suspect"), ("pass", "released")]
    repairs = [r for r in pairs(history) if r[3] == "repair"]
    assert len(repairs) == 1 and repairs[0][0] == "gpu-01" and repairs[0][1] in {"gpu-02", "gpu-03"}
    assert repairs[0][2] == "pass"
    why = next(o for o in report.outcomes if o.node == "gpu-00").reasons[0]
    assert why.startswith("fails-with-three-partners: failed pairs with 3 different partners")
    assert tainted(sim) == {"gpu-00"}
    held = history.node_history("gpu-00")["sweeps"][0]
    assert held["verdict"] == "quarantine" and held["rules"] == ["fails-with-three-partners"], \
        "the history names the pair rule that held the node"
    # issue 25, point 3: a node a pair sweep holds keeps its evidence too; its partner, handed back, none
    assert [r["run_id"] for r in history.evidence_runs("gpu-00")] == [report.run_id]
    assert history.evidence_runs("gpu-01") == []


# -- SIGKILL at every step of a pair sweep -------------------------------------------------------
# gpu-00's link is degraded: its first pair fails, both nodes wait held for a re-pair, and the
# re-pairs run, so every intent of a pair sweep (taint, create-service, create-job, delete-job,
# delete-service, keep-held, untaint) and the suspects' wait are cut somewhere.
PAIR_STEPS = [
    ("after", "PUT", "/leases/", 1),          # lock taken, nothing else done
    ("after", "PATCH", "/nodes/", 1),         # the first node of a pair tainted, its partner not yet
    ("after", "PATCH", "/nodes/", 2),         # a pair held, nothing started
    ("before", "POST", "/services", 1),       # held, the Service not yet created
    ("after", "POST", "/services", 1),        # the Service created, its Job not yet
    ("after", "POST", "/jobs", 1),            # the pair's Job created
    ("after", "GET", "/log", 1),              # rank 0's log read, rank 1's not yet
    ("after", "DELETE", "/jobs/", 1),         # the Job deleted, its Service not yet
    ("after", "DELETE", "/services/", 1),     # both deleted, the verdicts not acted on
    ("after", "DELETE", "/services/", 2),     # both pairs done: a failed pair's suspects wait held
    ("after", "POST", "/jobs", 3),            # a re-pair's Job created
    ("after", "DELETE", "/services/", 3),     # a re-pair done, its verdicts not acted on
    ("after", "PATCH", "/nodes/", 8),         # mid hand-back of the re-pairs
]


def lost_verdicts(h: History) -> list[dict[str, Any]]:
    """Sweep rows whose verdict is not the one their hand-back's intent proves, or that reconcile
    recorded from a hand-back that was not theirs. A pair sweep may give a node two rows in one
    run (a suspect and then its re-pair, or a known-good partner taken again): each row's
    hand-back is the one between its start and the next row's of that node."""
    out = []
    rows = list(h.db.query("select id, run_id, node, started, verdict, reasons from node_sweeps "
                           "where finished is not null order by id"))
    for row in rows:
        later = [r["started"] for r in rows if (r["run_id"], r["node"]) == (row["run_id"], row["node"])
                 and r["id"] > row["id"]]
        proven = None
        for i in h.db.query("select op, detail from intents where run_id = ? and node = ? and ts >= ? and ts < ? "
                            "and op in ('untaint', 'keep-held') order by id",
                            [row["run_id"], row["node"], row["started"], min(later, default=float("inf"))]):
            if i["op"] == "keep-held" and i["detail"]:
                proven = i["detail"]
            elif i["op"] == "untaint" and (i["detail"] or "").startswith("verdict "):
                proven = i["detail"][len("verdict "):]
        if proven and proven != row["verdict"] and (proven, row["verdict"]) != ("replace", "quarantine"):
            out.append({**row, "proven": proven})
        elif not proven and "recorded by reconcile" in (row["reasons"] or ""):
            out.append({**row, "proven": None})
    return out


@pytest.mark.realtime("a pair sweep in a process of its own, SIGKILLed at a chosen API request, and its 1 s lock left to expire")
@pytest.mark.parametrize("stage,method,fragment,nth", PAIR_STEPS)
def test_sigkill_at_every_step_of_a_pair_sweep(make_sim, tmp_path: Path, stage: str, method: str, fragment: str,
                                               nth: int) -> None:
    sim: Sim = make_sim(nodes=4, faults={"gpu-00": {"link_degraded": 0.4}})
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"max_nodes": 4, "max_percent": 100, "poll_interval": 0.05, "check_timeout": 1800,
                                   "lock_ttl": 1, "api_attempts": 3, "playbook": "pair-fabric.yaml",
                                   "light_playbook": ""}))
    state = tmp_path / "h.db"
    kill_sweep_at(sim, state, cfg, stage, method, fragment, nth, timeout=120)
    time.sleep(1.2)  # the dead run's lock expires (lock_ttl 1s)
    again = procs.run(_sweep_cmd(sim.kubeconfig, state, cfg), timeout=120)
    assert again.returncode == 0, again.stderr
    assert set(tainted(sim)) <= {"gpu-00"}, f"only the degraded node may stay held: {tainted(sim)}"
    assert sim.batch.list_namespaced_job("sweeper-checks").items == []
    assert services_left(sim) == []
    h = History(state)
    try:
        assert h.unfinished_runs() == []
        assert list(h.db.query("select node, run_id from node_sweeps where finished is null")) == []
        assert lost_verdicts(h) == [], "a verdict the intent log proves is the one recorded"
        if "gpu-00" in tainted(sim):
            assert h.node_history("gpu-00")["sweeps"][0]["verdict"] in ("reboot", "replace", "quarantine")
    finally:
        h.close()


def test_sweeper_run_a_pair_playbook_by_hand(make_sim, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from sweeper.cli import main

    sim: Sim = make_sim(nodes=3, faults={"gpu-02": {"link_degraded": 0.4}})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"poll_interval": 0.02}))
    state = tmp_path / "h.db"
    common = ["--config", str(config), "--kubeconfig", str(sim.kubeconfig), "--state", str(state)]
    runner = CliRunner()
    alone = runner.invoke(main, ["run", "pair-fabric.yaml", "--node", "gpu-00", *common])
    assert alone.exit_code == 2 and "--node A --partner B" in alone.stderr, alone.output
    single = runner.invoke(main, ["run", "sweep-light.yaml", "--node", "gpu-00", "--partner", "gpu-01", *common])
    assert single.exit_code == 2 and "--partner is for a pair playbook" in single.stderr, single.output
    ok = runner.invoke(main, ["run", "pair-fabric.yaml", "--node", "gpu-00", "--partner", "gpu-01", *common])
    assert ok.exit_code == 0, ok.output
    slow = runner.invoke(main, ["run", "pair-fabric.yaml", "--node", "gpu-00", "--partner", "gpu-02", *common])
    assert slow.exit_code == 0, slow.output  # the play ran; its verdict is a finding
    h = History(state)
    try:
        assert pairs(h) == [("gpu-00", "gpu-01", "pass", "sweep"), ("gpu-00", "gpu-02", "fail", "sweep")]
        rows = {r["node"]: r for r in h.db.query("select * from node_sweeps order by id")}
        assert {r["kind"] for r in rows.values()} == {"pair"}
        assert rows["gpu-01"]["verdict"] == "pass" and rows["gpu-02"]["verdict"] in ("reboot", "replace", "quarantine")
    finally:
        h.close()
    assert tainted(sim) == set() and services_left(sim) == []


def test_an_earlier_runs_suspect_is_re_paired_with_a_known_good_partner(make_sim, history: History) -> None:
    """A suspect let go for want of a known-good partner (the history's pair_suspects) is re-paired
    with one in a later run, before any new pair, rather than paired with another unknown node."""
    sim: Sim = make_sim(nodes=4, faults={"gpu-00": {"link_degraded": 0.4}})
    now = sim.cluster.clock.now()
    history.pair_result("sw-old", now - 7200, "gpu-00", "gpu-x", "fail", "sweep", 190.0, "low")
    history.pair_result("sw-old", now - 7000, "gpu-03", "gpu-y", "pass", "sweep", 440.0, "")
    report = run_sweep(sim, history, fabric())
    got = actions_of(report)
    assert set(pairs(history)[2:]) == {("gpu-00", "gpu-03", "fail", "repair"), ("gpu-01", "gpu-02", "pass", "sweep")}
    assert got["gpu-00"][-1][0] in ("reboot", "replace", "quarantine") and got["gpu-00"][-1][1] == "held"
    assert got["gpu-03"] == [("inconclusive", "released")]
    assert tainted(sim) == {"gpu-00"}


def test_suspects_still_waiting_when_the_run_stops_taking_nodes_go_back(make_sim, history: History) -> None:
    """run_deadline: the first plan is taken, no refill after it, so no re-pair either."""
    sim: Sim = make_sim(nodes=4, faults={"gpu-00": {"link_degraded": 0.4}})
    report = run_sweep(sim, history, fabric(max_nodes=2, run_deadline=1))
    got = actions_of(report)
    assert got == {"gpu-00": [("inconclusive", "suspect"), ("inconclusive", "released")],
                   "gpu-01": [("inconclusive", "suspect"), ("inconclusive", "released")]}
    assert "the run stopped taking nodes before its re-pair" in report.outcomes[-1].reasons[0]
    assert tainted(sim) == set() and history.pair_suspects(0) == {"gpu-00": "gpu-01", "gpu-01": "gpu-00"}


def test_plan_shows_the_pairs_a_pair_playbook_would_take(make_sim, tmp_path: Path) -> None:
    """`sweeper plan` with a pair playbook: each node's partner, and the odd node of its placement
    group waiting (here gpu-04, alone in its zone)."""
    import json

    from click.testing import CliRunner

    from sweeper.cli import main

    spec = {"name": "test", "seed": 3, "speed": 600, "node_groups": [
        {"name_prefix": "gpu-", "count": 4, "instance_type": "p5.48xlarge", "age": "2d", "zone": "us-east-1a"},
        {"name_prefix": "gpu-b", "count": 1, "instance_type": "p5.48xlarge", "age": "2d", "zone": "us-east-1b"}]}
    sim: Sim = make_sim(spec)
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"playbook": "pair-fabric.yaml", "max_percent": 100, "max_nodes": 10}))
    base = ["plan", "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"), "--config", str(cfg)]
    res = CliRunner().invoke(main, [*base, "--json"])
    assert res.exit_code == 0, res.output
    rows = {r["node"]: r for r in json.loads(res.stdout)["nodes"]}
    partners = {n: r["partner"] for n, r in rows.items() if r["take"]}
    assert sorted(partners) == ["gpu-00", "gpu-01", "gpu-02", "gpu-03"]
    assert all(partners[p] == n for n, p in partners.items()), "partners are mutual"
    lone = next(n for n in rows if n not in partners)
    assert rows[lone]["reason"] == "no-partner" and rows[lone]["partner"] == ""
    text = CliRunner().invoke(main, base)
    assert "PARTNER" in text.stdout and "no-partner" in text.stdout


def test_after_a_fault_of_the_check_the_next_pair_run_tries_one_pair_first(make_sim, tmp_path: Path) -> None:
    """As a node sweep does after a run stopped on the same fault of the check on several nodes
    (an unpullable image here): the next run takes one pair first, and stops again if that pair's
    check cannot run either; once the image is fixed, the probe pair and then the rest are swept."""
    import json

    from click.testing import CliRunner

    from sweeper.cli import main

    image = Config().pair_image
    sim: Sim = make_sim(nodes=8, registry={"missing": [image]})
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump({"playbook": "pair-fabric.yaml", "max_nodes": 8, "max_percent": 100,
                                   "poll_interval": 0.02, "interval": "1s", "light_playbook": ""}))
    base = ["sweep", "--kubeconfig", str(sim.kubeconfig), "--state", str(tmp_path / "h.db"), "--config", str(cfg),
            "--json"]
    first = CliRunner().invoke(main, base)
    assert first.exit_code == 5, first.output
    assert {n["verdict"] for n in json.loads(first.stdout)["nodes"]} == {"error"}
    again = CliRunner().invoke(main, base)
    assert again.exit_code == 5, again.output
    nodes = json.loads(again.stdout)["nodes"]
    assert sorted(n["action"] for n in nodes) == ["released", "released"], "one pair, then the run stops"
    assert "this run's first node ended with one too" in again.stderr
    sim.cluster.missing_images.clear()
    fixed = CliRunner().invoke(main, base)
    assert fixed.exit_code == 0, fixed.output
    assert [n["verdict"] for n in json.loads(fixed.stdout)["nodes"]] == ["pass"] * 8
    assert tainted(sim) == set()


@pytest.mark.parametrize("seed", [0, 11])
def test_a_fleet_with_two_degraded_links_names_both_within_the_bound(seed: int) -> None:
    """The benchmark's fleet, two seeds of it (python -m benchmarks.pair_sweep prints twenty): 32
    nodes, two with a degraded link placed by the seed (seed 11 puts both in one pair), one
    rolling run: both named, no healthy node held, at most ceil(32/2) + 4 pair runs."""
    from benchmarks.pair_sweep import one

    got = one(seed, nodes=32, degraded=2, factor=0.4, max_nodes=8, speed=600.0)
    assert sorted(got.culprits) == got.degraded and got.healthy_held == [] and got.missed == []
    assert got.pair_runs <= got.bound == 20


def test_a_pair_that_cannot_use_the_fabric_has_no_bandwidth_floor(make_sim, history: History) -> None:
    """Karpenter gives a p5 EFA interfaces only when a pod that requests `vpc.amazonaws.com/efa`
    made it launch (https://docs.aws.amazon.com/eks/latest/userguide/device-management-efa.html).
    A pair with such a node requests no EFA device (each pod asks for what both nodes advertise), so
    NCCL runs on TCP sockets, a few GB/s where EFA gives hundreds: the profile's floor, a figure of
    the fabric, is not applied, and both nodes go back as they came, not as suspects."""
    spec = {"name": "test", "seed": 3, "speed": 600, "faults": {"gpu-01": {"nics_missing": 32}},
            "node_groups": [{"name_prefix": "gpu-", "count": 2, "instance_type": "p5.48xlarge", "age": "2d",
                             "labels": {"karpenter.sh/nodepool": "gpu"}}]}
    sim: Sim = make_sim(spec)
    report = run_sweep(sim, history, fabric())
    assert actions_of(report) == {"gpu-00": [("pass", "released")], "gpu-01": [("pass", "released")]}, \
        report.outcomes
    (row,) = history.db.query("select * from pairs")
    assert row["status"] == "pass" and row["busbw"] < 10, "TCP sockets, not EFA"
    (nccl,) = [r for r in history.db.query("select status, message from checks where name = 'pair.nccl' and "
                                           "sweep_id = ? and status = 'skip'", [row["node_sweep_id"]])]
    assert "requests no fabric device" in nccl["message"]


def test_a_run_whose_every_pair_fails_is_a_fault_of_the_check(make_sim, history: History) -> None:
    """Every pair of the run failing (two or more distinct pairs, none passing) is what a broken
    pair Job looks like (a transport NCCL cannot use, a wrong image or template), and says nothing
    of the nodes: no new pair is taken, the suspects go back `error` instead of being re-paired and
    condemned, the run says why, and the next run tries one pair first. Here every node's fabric is
    slow, as a transport misconfigured for the whole fleet makes it; a single failed pair stays a
    pair's business (test_no_known_good_partner_sends_both_back_inconclusive)."""
    slow = {"link_degraded": 0.4}
    sim: Sim = make_sim(nodes=6, faults={f"gpu-0{i}": slow for i in range(6)})
    report = run_sweep(sim, history, fabric(max_nodes=4))
    assert report.tool_stop.startswith("run stopped: every pair of this run failed"), report.tool_stop
    got = actions_of(report)
    swept = [n for n in got if got[n][0] == ("inconclusive", "suspect")]
    assert len(swept) == 4, got
    for node in swept:
        assert got[node][-1] == ("error", "released"), got[node]
    assert {s for _, _, s, _ in pairs(history)} == {"fail"} and len(pairs(history)) == 2, "no re-pair, no third pair"
    assert tainted(sim) == set()
    assert not [o for o in report.outcomes if o.verdict in ("reboot", "replace", "quarantine")]

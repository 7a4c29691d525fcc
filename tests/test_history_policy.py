"""The history decides: trends, escalation, peers, backtesting, on histories built by the
simulated fleet over simulated weeks (tests/weeks.py); the policy file; retention."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

from sweeper.backtest import backtest
from sweeper.cli import main
from sweeper.errors import ConfigError, StateError
from sweeper.history import KNOWN, MIGRATIONS_TABLE, History, is_url, migrate
from sweeper.policy import BUILT_IN, load_policy, parse_policy, slope_per_day
from tests.history_backends import BACKENDS, state_factory
from tests.weeks import ROOT, Weeks

SHIPPED = load_policy(ROOT / "policies" / "default.yaml")


# Built once per backend in a process: pytest-xdist hands a worker its tests a few at a time, and a
# worker that holds no next test yet tears a module's fixtures down, so a module-scoped fixture
# alone can be rebuilt (about 30 s on SQLite, 60 s on PostgreSQL).
_BUILT: dict[str, Weeks] = {}


@pytest.fixture(scope="module", params=BACKENDS)
def weeks(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Weeks:
    """Four simulated weeks of a 24-node fleet: two healthy groups, and one node each for a
    rising ECC count, a recurring XID 79, a single XID 79 and a bandwidth straggler; recorded in a
    SQLite file and in a PostgreSQL database."""
    if request.param in _BUILT:
        return _BUILT[request.param]
    h = History(state_factory(request.param, request, tmp_path_factory.mktemp("weeks"))("h.db"))
    w = Weeks({"seed": 3, "node_groups": [{"name_prefix": "p5-", "count": 12, "instance_type": "p5.48xlarge"},
                                          {"name_prefix": "b2-", "count": 12, "instance_type": "p6-b200.48xlarge"}],
               "faults": {"p5-01": {"ecc_growth": {2: 50}, "ecc_fail_at": "20d"},
                          "p5-02": {"xids": [{"code": 79, "gpu": 3, "at": "2d"}, {"code": 79, "gpu": 3, "at": "5d"}]},
                          "p5-03": {"xids": [{"code": 79, "gpu": 1, "at": "4d"}]},
                          "b2-07": {"low_bandwidth": 0.85}}}, h, nccl_every=2)
    w.run(28)
    _BUILT[request.param] = w
    return w


def events(w: Weeks, node: str) -> list[tuple[int, str, tuple[str, ...]]]:
    return [(int(e.day), e.verdict, tuple(e.rules)) for e in w.events if e.node == node]


def test_rising_corrected_ecc_is_replaced_on_its_trend_before_it_fails(weeks: Weeks) -> None:
    verdict, day = weeks.out["p5-01"]
    assert verdict == "replace" and day < 20, "replaced before the simulated failure on day 20"
    assert events(weeks, "p5-01") == [(3, "replace", ("corrected-ecc-rising",))]
    reason = next(e.reasons for e in weeks.events if e.node == "p5-01")[0]
    assert re.search(r"GPU 2 rising 50\.\d/day", reason)


def test_an_xid_79_reboots_and_the_second_within_the_window_replaces(weeks: Weeks) -> None:
    assert events(weeks, "p5-02") == [(2, "reboot", ()), (5, "replace", ("second-reboot-same-cause",))]
    assert events(weeks, "p5-03") == [(4, "reboot", ())], "one XID 79: rebooted, then passes again"
    assert "p5-03" not in weeks.out


def test_a_bandwidth_straggler_is_found_among_its_peers(weeks: Weeks) -> None:
    ev = events(weeks, "b2-07")
    assert ev and ev[0][1:] == ("quarantine", ("nccl-straggler",))
    reason = next(e.reasons for e in weeks.events if e.node == "b2-07")[0]
    assert "below the p6-b200.48xlarge median" in reason and "2 consecutive sweeps" in reason
    profile = SHIPPED.peers[0]
    assert profile.consecutive == 2, "one low reading is never enough"


def test_a_healthy_fleet_has_zero_replacements(weeks: Weeks) -> None:
    faulty = {"p5-01", "p5-02", "p5-03", "b2-07"}
    assert [e for e in weeks.events if e.node not in faulty] == []
    assert weeks.history.counts()["node_sweeps"] > 24 * 25


def test_backtesting_the_shipped_policy_reproduces_the_recorded_decisions(weeks: Weeks) -> None:
    bt = backtest(weeks.history, SHIPPED, 0.0)
    assert len(bt.decisions) == weeks.history.counts()["node_sweeps"]
    assert [d for d in bt.decisions if d.differs] == []
    assert bt.counts("replayed") == bt.counts("recorded")
    assert {n: d.replayed for n, d in bt.first_holds("replayed").items()} == {
        "p5-01": "replace", "p5-02": "reboot", "p5-03": "reboot", "b2-07": "quarantine"}


def test_backtesting_another_policy_shows_what_it_would_have_done(weeks: Weeks, tmp_path: Path) -> None:
    raw = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    raw["trends"] = [t for t in raw["trends"] if t["name"] != "corrected-ecc-rising"]
    raw["ladders"][0]["allowed"] = 2
    looser = parse_policy(raw, "looser")
    bt = backtest(weeks.history, looser, 0.0)
    differ = {(d.node, d.recorded, d.replayed) for d in bt.decisions if d.differs}
    assert ("p5-01", "replace", "pass") in differ, "without the trend rule the ECC node would have passed"
    assert ("p5-02", "replace", "reboot") in differ, "two reboots allowed: the second XID 79 only reboots"
    # and through the CLI, as JSON
    pfile = tmp_path / "looser.yaml"
    pfile.write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(main, ["backtest", "--state", weeks.history.state, "--policy", str(pfile),
                                    "--since", "3650d", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["differ"] == len([d for d in bt.decisions if d.differs]) and doc["differ"] > 0


def test_history_report_and_nodes_commands(weeks: Weeks, tmp_path: Path) -> None:
    hist = weeks.history.node_history("p5-01", check="ecc")
    assert set(hist["metrics"]) == {"ecc.aggregate_corrected", "ecc.aggregate_uncorrected"}
    assert hist["sweeps"][0]["rules"] == ["corrected-ecc-rising"]
    state = weeks.history.state
    res = CliRunner().invoke(main, ["history", "p5-01", "--state", state, "--check", "ecc", "--json"])
    assert res.exit_code == 0, res.output
    h = json.loads(res.stdout)
    assert set(h["metrics"]) == {"ecc.aggregate_corrected", "ecc.aggregate_uncorrected"}
    assert h["sweeps"][0]["rules"] == ["corrected-ecc-rising"]
    res = CliRunner().invoke(main, ["history", "p5-01", "--state", state], env={"COLUMNS": "250"})
    assert res.exit_code == 0 and "corrected-ecc-rising" in res.stdout and "ecc.aggregate_corrected" in res.stdout
    res = CliRunner().invoke(main, ["nodes", "--offline", "--state", state, "--json"])
    rows = {r["node"]: r for r in json.loads(res.stdout)["nodes"]}
    assert len(rows) == 24 and rows["p5-02"]["verdict"] == "replace" and rows["p5-00"]["verdict"] == "pass"
    out = tmp_path / "r.html"
    res = CliRunner().invoke(main, ["report", "--state", state, "--since", "3650d", "-o", str(out)])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page and "<script" not in page
    for text in ("Nodes held, and why", "second-reboot-same-cause", "nccl-straggler", "p6-b200.48xlarge",
                 "swept within interval", "<svg"):
        assert text in page


def test_a_live_sweep_decides_with_the_history(make_sim, new_state: Callable[[str], str]) -> None:
    """The `decide` action in a real sweep reads the history: a reboot for XID 79 recorded two
    days ago makes today's XID 79 a replacement, and the decision is recorded for backtests."""
    from tests.conftest import TEST_CONFIG, run_sweep

    sim = make_sim(nodes=2, faults={"gpu-01": {"xids": [{"code": 79, "gpu": 2}]}})
    history = History(new_state("h.db"))
    now = sim.cluster.clock.now()
    sid = history.sweep_started("sw-old", "gpu-01", now - 2 * 86400, "sweep-light", "p5.48xlarge")
    history.sweep_finished(sid, now - 2 * 86400 + 60, "reboot", ["xid (GPU 2): XID 79"],
                           {"verdict": "reboot", "causes": ["xid|79"], "rules": [], "decided": now - 2 * 86400 + 50,
                            "policy": "default"})
    report = run_sweep(sim, history, replace(TEST_CONFIG, max_nodes=2))
    got = {o.node: o.verdict for o in report.outcomes}
    assert got == {"gpu-00": "pass", "gpu-01": "replace"}, report.outcomes
    (row,) = history.query("select * from node_sweeps where node = 'gpu-01' and run_id != 'sw-old'")
    # XID 79 also makes the device plugin hold the GPU back from allocatable: its symptom, never a cause
    assert json.loads(row["rules"]) == ["second-reboot-same-cause"]
    assert json.loads(row["causes"]) == ["xid|79"]
    assert row["policy"] == "default" and row["policy_verdict"] == "replace" and row["decided"] <= row["finished"]


def test_the_built_in_findings_are_the_shipped_policy_s() -> None:
    assert BUILT_IN.findings == SHIPPED.findings


@pytest.mark.parametrize("patch,message", [
    ({"trends": [{"name": "x", "metric": "m", "slope_per_day": 1, "window": "7d", "min_points": 3,
                  "then": "explode"}]}, "trends[0].then: 'explode' is not one of"),
    ({"ladders": [{"name": "x", "verdicts": ["reboot"], "allowed": 1, "then": "replace"}]}, "missing ['window']"),
    ({"peers": [{"name": "x", "metric": "m", "below_median_by": 0.1, "consecutive": 2, "min_peers": 3,
                 "window": "soon", "then": "warn"}]}, "not a duration"),
    ({"failure_rates": [{"name": "x", "k": 6, "n": 5, "then": "warn"}]}, "k must be between 1 and n"),
    ({"pair_failures": [{"name": "x", "partners": 0, "window": "7d", "then": "quarantine"}]},
     "partners must be 1 or more"),
    ({"pair_failures": [{"name": "x", "partners": 2, "window": "7d", "then": "pass"}]},
     "pair_failures[0].then: 'pass' is not one of"),
    ({"trendz": []}, "unknown key(s) ['trendz']"),
    ({"findings": {"codes": {"DBE": "nuke"}}}, "findings.codes.DBE"),
])
def test_a_bad_policy_is_refused_with_where(patch: dict, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_policy({"name": "bad", **patch}, "bad.yaml")
    assert message in str(exc.value) and "bad.yaml" in str(exc.value)


def test_slope() -> None:
    assert slope_per_day([(0.0, 0.0), (86400.0, 50.0), (172800.0, 100.0)]) == pytest.approx(50.0)
    assert slope_per_day([(5.0, 3.0), (5.0, 9.0)]) == 0.0


def test_prune_keeps_daily_summaries(new_state: Callable[[str], str]) -> None:
    h = History(new_state("p.db"))
    w = Weeks({"node_groups": [{"name_prefix": "p5-", "count": 3, "instance_type": "p5.48xlarge"}]}, h)
    w.run(10)
    before = h.counts()
    start = w.sim.started
    assert h.prune(start + 5 * 86400, dry_run=True)["node_sweeps"] == 15 and h.counts() == before, \
        "a dry run deletes nothing"
    res = CliRunner().invoke(main, ["state", "prune", "--state", h.state, "--older-than", "1d", "--dry-run",
                                    "--json"])
    assert res.exit_code == 0 and h.counts() == before, "a dry run deletes nothing"
    counts = h.prune(start + 5 * 86400)
    after = h.counts()
    assert counts["node_sweeps"] == 15 and after["node_sweeps"] == before["node_sweeps"] - 15
    assert after["summaries"] == 15 and counts["checks"] > 0
    assert after["checks"] == before["checks"] - counts["checks"]
    (row,) = h.query("select * from summaries where node = 'p5-00' order by day limit 1")
    assert row["sweeps"] == 1 and json.loads(row["verdicts"]) == {"pass": 1}
    assert json.loads(row["metrics"])["gpu.count"] == {"min": 8.0, "max": 8.0, "last": 8.0}
    hist = h.node_history("p5-00")
    assert len(hist["pruned_days"]) == 5 and len(hist["sweeps"]) == 5
    h.close()


def test_a_newer_history_is_refused(new_state: Callable[[str], str]) -> None:
    state = new_state("n.db")
    h = History(state)
    with h._link.transaction() as conn:
        conn.execute(sa.insert(sa.table(MIGRATIONS_TABLE, sa.column("migration_set"), sa.column("name"),
                                        sa.column("applied_at"))).values(
            migration_set="sweeper", name="m999_from_the_future", applied_at="2030-01-01"))
    h.close()
    with pytest.raises(StateError, match="newer Sweeper"):
        History(state)
    res = CliRunner().invoke(main, ["history", "x", "--state", state])
    assert res.exit_code == 3 and "newer Sweeper" in res.stderr


def test_an_older_history_is_migrated_on_open_and_read_then_written(new_state: Callable[[str], str]) -> None:
    """A store that lacks later migrations (here: a file or a database as Sweeper left it before
    the policy's columns, the pairs and the cluster names) is brought up to date when opened, its
    rows taken to be the opening cluster's; reads and writes then share the one connection."""
    state = new_state("old.db")
    engine = sa.create_engine(f"sqlite:///{state}") if not is_url(state) else \
        sa.create_engine(sa.engine.make_url(state).set(drivername="postgresql+psycopg"))
    with engine.begin() as conn:
        assert migrate(conn, "", stop_before="m004_policy") == KNOWN[:3]
        conn.execute(sa.text("insert into node_sweeps (run_id, node, started, finished, verdict, reasons, dry_run, "
                             "kind) values ('sw-0', 'gpu-09', 10.0, 20.0, 'pass', '[]', 0, 'sweep')"))
        assert "causes" not in {c["name"] for c in sa.inspect(conn).get_columns("node_sweeps")}
    engine.dispose()
    h = History(state, cluster="eu-1")
    assert h._applied() == KNOWN
    assert h.node_history("gpu-00")["sweeps"] == [] and not h.knows("gpu-00")
    (old,) = h.node_history("gpu-09")["sweeps"]
    assert old["cluster"] == "eu-1" and old["causes"] == [] and h.clusters() == ["eu-1"]
    h.run_started("sw-1", 100.0, "sweep")
    sid = h.sweep_started("sw-1", "gpu-00", 100.0, "sweep-light.yaml", "p5.48xlarge")
    h.sweep_finished(sid, 160.0, "pass", ["all checks passed"], {"causes": ["xid|79"], "decided": 150.0})
    (row,) = h.node_history("gpu-00")["sweeps"]
    assert row["verdict"] == "pass" and row["causes"] == ["xid|79"] and h.knows("gpu-00")
    h.pair_result("sw-1", 160.0, "gpu-00", "gpu-01", "pass", "sweep", 180.0, "")
    assert h.known_good(0.0) == {"gpu-00", "gpu-01"}
    if h.backend == "sqlite":
        assert h.conn.execute("pragma journal_mode").fetchone()[0] == "wal"
    h.close()


def test_a_file_written_by_sqlite_utils_migrations_is_read_and_migrated(tmp_path: Path) -> None:
    """Files written before the history moved to SQLAlchemy: sqlite_utils made their tables and
    recorded its migrations in `_sqlite_migrations`; they open, and gain the cluster column."""
    from sqlite_utils import Database

    path = tmp_path / "v4.db"
    db = Database(path)
    db["_sqlite_migrations"].insert_all([{"migration_set": "sweeper", "name": n, "applied_at": "2026-01-01T00:00:00"}
                                         for n in KNOWN[:5]], pk=("migration_set", "name"))
    db["runs"].insert({"id": "sw-0", "started": 1.0, "finished": 2.0, "status": "done", "mode": "sweep",
                       "host": "h", "taken": 1, "summary": "{}"}, pk="id")
    db["node_sweeps"].insert({"id": 1, "run_id": "sw-0", "node": "gpu-00", "started": 1.0, "finished": 2.0,
                              "playbook": "p", "profile": "p5", "verdict": "pass", "reasons": "[]", "dry_run": 0,
                              "kind": "sweep", "causes": "[]", "rules": "[]", "decided": None, "policy": None,
                              "policy_verdict": None}, pk="id")
    for table, row, pk in (("checks", {"id": 1, "sweep_id": 1, "node": "gpu-00", "ts": 1.0, "source": "s", "name": "n",
                                        "status": "pass", "severity": "info", "gpu": 0, "code": "", "message": ""}, "id"),
                           ("metrics", {"id": 1, "sweep_id": 1, "node": "gpu-00", "ts": 1.0, "name": "m", "gpu": 0,
                                        "value": 1.0, "unit": ""}, "id"),
                           ("actions", {"id": 1, "run_id": "sw-0", "node": "gpu-00", "ts": 1.0, "action": "a",
                                        "detail": "", "dry_run": 0}, "id"),
                           ("intents", {"id": 1, "run_id": "sw-0", "node": "gpu-00", "ts": 1.0, "op": "taint",
                                        "phase": "before", "detail": ""}, "id"),
                           ("controls", {"key": "pause", "value": "{}", "ts": 1.0}, "key"),
                           ("summaries", {"node": "gpu-00", "day": "2026-01-01", "sweeps": 1, "verdicts": "{}",
                                          "metrics": "{}"}, ("node", "day")),
                           ("pairs", {"id": 1, "run_id": "sw-0", "ts": 1.0, "node": "gpu-00", "partner": "gpu-01",
                                      "status": "pass", "mode": "sweep", "busbw": 1.0, "detail": "",
                                      "node_sweep_id": 1, "partner_sweep_id": None}, "id"),
                           ("pair_latest", {"node": "gpu-00", "ts": 1.0, "pair_id": 1, "partner": "gpu-01",
                                            "status": "pass", "mode": "sweep", "role": "node"}, "node")):
        db[table].insert(row, pk=pk)
    db.close()
    h = History(path, cluster="prod")
    assert h._applied() == KNOWN and h.clusters() == ["prod"]
    for table in ("runs", "node_sweeps", "checks", "metrics", "actions", "intents", "controls", "summaries",
                  "pairs", "pair_latest"):
        assert [r["cluster"] for r in h.query(f"select cluster from {table}")] == ["prod"], table
    assert h.known_good(0.0) == {"gpu-00"} and h.get_control("pause") == {"ts": 1.0}
    h.close()


def test_xids_are_cleared_by_a_passing_sweep_or_a_gpu_reset_only(new_state: Callable[[str], str]) -> None:
    """The time the sweep passes as --xid-since: the start of the node's latest passing (or warning)
    real sweep, or its latest GPU reset by Sweeper. A held, inconclusive, dry-run, light or unfinished
    sweep, or a reset that failed, clears nothing: the kernel log keeps an XID until a reboot."""
    h = History(new_state("h.db"))
    assert h.xids_cleared("n1") is None
    for started, verdict, dry, kind in ((100.0, "pass", False, "sweep"), (200.0, "reboot", False, "sweep"),
                                        (300.0, "inconclusive", False, "sweep"), (400.0, "pass", True, "sweep"),
                                        (500.0, "pass", False, "light")):
        sid = h.sweep_started("r", "n1", started, "p", "default", dry_run=dry, kind=kind)
        h.sweep_finished(sid, started + 10, verdict, [])
    h.sweep_started("r", "n1", 600.0, "p", "default")  # still running
    assert h.xids_cleared("n1") == 100.0
    sid = h.sweep_started("r", "n1", 700.0, "p", "default", kind="pair")
    h.sweep_finished(sid, 710.0, "warn", [])
    assert h.xids_cleared("n1") == 700.0
    h.action("r", "n1", 800.0, "remediate-gpu-reset", "would-reset: GPU(s) 3", dry_run=True)
    h.action("r", "n1", 850.0, "remediate-reboot", "reboot-started: the reset did not take")
    assert h.xids_cleared("n1") == 700.0
    h.action("r", "n1", 900.0, "remediate-gpu-reset", "gpus-reset: GPU(s) 3 reset by sweeper-reset-x")
    assert h.xids_cleared("n1") == 900.0 and h.xids_cleared("n2") is None
    h.close()

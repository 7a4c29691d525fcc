"""node_latest, each node's latest conclusive sweep kept as sweeps are written (migration
m012_node_latest), on both backends: after every write it says what the query it replaced says
(each node's sweep at its latest start, over every sweep) and what the planner's `last_swept` says,
whatever order the sweeps finish in, for two clusters that both have a `gpu-00`, for a node whose
sweeps were all inconclusive, after a prune, and in a store whose sweeps were there before the
migration."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from sweeper.config import Config
from sweeper.history import KNOWN, History, is_url, migrate
from sweeper.history.schema import CONCLUSIVE_SWEEP
from sweeper.policy import HOLDING
from sweeper.views import fleet_rows

T0 = 1_800_000_000.0
# The query fleet() ran before node_latest: each (cluster, node)'s conclusive sweep at its latest start.
SLOW = ("select s.id, s.node, s.cluster, s.run_id, s.profile, s.started, s.finished, s.verdict, s.reasons, s.rules, "
        "s.kind from node_sweeps s join (select cluster, node, max(started) as last from node_sweeps where "
        f"{CONCLUSIVE_SWEEP} group by cluster, node) l on s.cluster = l.cluster and s.node = l.node "
        "and s.started = l.last order by s.node, s.cluster")


def _agrees(h: History) -> list[dict[str, Any]]:
    """fleet() (read from node_latest) against the slow query and last_swept, every cluster and each."""
    every = h.for_cluster(None)
    slow = every.query(SLOW)
    for r in slow:
        r["reasons"], r["rules"] = json.loads(r["reasons"] or "[]"), json.loads(r["rules"] or "[]")
    fast = every.fleet()
    assert [{k: v for k, v in r.items() if k != "swept"} for r in fast] == slow
    overview = {r["cluster"]: r for r in every.cluster_overview(0.0, HOLDING)}
    for cluster in every.clusters():
        one = every.for_cluster(cluster)
        mine = [r for r in slow if r["cluster"] == cluster]
        assert [r["node"] for r in one.fleet()] == [r["node"] for r in mine]
        assert {r["node"]: r["swept"] for r in one.fleet() if r["swept"] is not None} == one.last_swept()
        if mine:
            assert (overview[cluster]["nodes"], overview[cluster]["held"]) == \
                (len(mine), sum(r["verdict"] in HOLDING for r in mine))
        else:
            assert cluster not in overview
    return fast


def _sweep(h: Any, node: str, started: float, verdict: str | None, kind: str = "sweep", dry_run: bool = False,
           run: str = "sw-1") -> int:
    sid = int(h.sweep_started(run, node, started, "sweep-light.yaml", "p5.48xlarge", dry_run=dry_run, kind=kind))
    if verdict is not None:
        h.sweep_finished(sid, started + 60, verdict, [f"{node} {verdict}"],
                         {"rules": ["xid-ladder"] if verdict in HOLDING else [], "verdict": verdict})
    return sid


def _latest(rows: list[dict[str, Any]], cluster: str, node: str) -> dict[str, Any] | None:
    return next((r for r in rows if r["cluster"] == cluster and r["node"] == node), None)


def test_node_latest_agrees_with_every_sweep_after_each_write(new_state: Callable[[str], str]) -> None:
    h = History(new_state("latest.db"), cluster="us-east")
    west = h.for_cluster("eu-west")
    h.run_started("sw-1", T0, "sweep")
    assert _agrees(h) == []
    _sweep(h, "gpu-00", T0 + 100, "pass")
    _agrees(h)
    # a sweep finished after a later one (a reconcile closing an old row, a slow node): it stays behind
    _sweep(h, "gpu-00", T0 + 50, "reboot")
    row = _latest(_agrees(h), "us-east", "gpu-00")
    assert row is not None and (row["started"], row["verdict"], row["swept"]) == (T0 + 100, "pass", T0 + 100)
    # the same node name in another cluster is another node
    _sweep(west, "gpu-00", T0 + 10, "replace")
    rows = _agrees(h)
    assert [(r["cluster"], r["verdict"]) for r in rows if r["node"] == "gpu-00"] == \
        [("eu-west", "replace"), ("us-east", "pass")]
    # only inconclusive sweeps: shown as its latest, never as swept (the planner keeps it due)
    _sweep(h, "gpu-01", T0 + 30, "inconclusive")
    _sweep(h, "gpu-01", T0 + 20, "inconclusive")
    row = _latest(_agrees(h), "us-east", "gpu-01")
    assert row is not None and (row["started"], row["verdict"], row["swept"]) == (T0 + 30, "inconclusive", None)
    # a full sweep, then a light check of the busy node: the check shows, the full sweep keeps it not due
    _sweep(h, "gpu-02", T0 + 150, "warn")
    _sweep(h, "gpu-02", T0 + 200, "pass", kind="light")
    # neither a dry run nor a sweep still running says anything yet
    _sweep(h, "gpu-02", T0 + 300, "reboot", dry_run=True)
    running = _sweep(h, "gpu-02", T0 + 400, None)
    row = _latest(_agrees(h), "us-east", "gpu-02")
    assert row is not None and (row["kind"], row["started"], row["swept"]) == ("light", T0 + 200, T0 + 150)
    cfg = Config()
    (nodes_row,) = [r for r in fleet_rows(h.for_cluster("us-east"), cfg, None, T0 + 500) if r["node"] == "gpu-02"]
    assert nodes_row["verdict"] == "pass" and nodes_row["due"] == max(T0 + 150 + cfg.interval, T0 + 500)
    h.sweep_finished(running, T0 + 460, "quarantine", ["held"])
    row = _latest(_agrees(h), "us-east", "gpu-02")
    assert row is not None and (row["verdict"], row["swept"], row["rules"]) == ("quarantine", T0 + 400, [])
    # a pair sweep is the node's latest, but not a full sweep of its own
    _sweep(h, "gpu-02", T0 + 500, "pass", kind="pair")
    _agrees(h)
    # pruning: a node whose sweeps all went has no row; one whose full sweeps went has no `swept`
    _sweep(h, "gpu-03", T0 + 120, "pass")
    _sweep(h, "gpu-03", T0 + 600, "pass", kind="light")
    h.for_cluster(None).prune(T0 + 140)
    rows = _agrees(h)
    assert {(r["cluster"], r["node"]) for r in rows} == {("us-east", "gpu-02"), ("us-east", "gpu-03")}
    row = _latest(rows, "us-east", "gpu-03")
    assert row is not None and row["swept"] is None
    h.close()


def test_a_store_with_sweeps_before_the_migration_fills_node_latest(new_state: Callable[[str], str]) -> None:
    """Sweeps written before m012_node_latest (raw rows, ids out of time order, two clusters, dry runs,
    light checks, a node with only inconclusive sweeps, a sweep still open) are read into node_latest
    as the store is opened; writes after keep it."""
    state = new_state("old.db")
    engine = sa.create_engine(f"sqlite:///{state}") if not is_url(state) else \
        sa.create_engine(sa.engine.make_url(state).set(drivername="postgresql+psycopg"))
    rows = [  # cluster, node, started, finished, verdict, kind, dry_run
        ("a", "gpu-00", 300.0, 360.0, "pass", "sweep", 0),
        ("a", "gpu-00", 100.0, 160.0, "reboot", "sweep", 0),  # older, written after
        ("a", "gpu-00", 400.0, 460.0, "pass", "light", 0),
        ("a", "gpu-00", 500.0, 560.0, "replace", "sweep", 1),  # a dry run
        ("b", "gpu-00", 200.0, 260.0, "replace", "sweep", 0),
        ("a", "gpu-01", 50.0, 110.0, "inconclusive", "sweep", 0),
        ("a", "gpu-01", 70.0, 130.0, "inconclusive", "pair", 0),
        ("a", "gpu-02", 90.0, None, None, "sweep", 0),  # still open
        ("b", "gpu-03", 80.0, 140.0, "error", "pair", 0),
    ]
    with engine.begin() as conn:
        assert migrate(conn, "a", stop_before="m012_node_latest") == KNOWN[:-1]
        for i, (cluster, node, started, finished, verdict, kind, dry) in enumerate(rows):
            conn.execute(sa.text(
                "insert into node_sweeps (cluster, run_id, node, started, finished, playbook, profile, verdict, reasons, "
                "dry_run, kind, causes, rules) values (:c, :run, :node, :s, :f, 'p', 'p5', :v, :r, :d, :k, '[]', :rules)"),
                {"c": cluster, "run": f"sw-{i}", "node": node, "s": started, "f": finished, "v": verdict,
                 "r": json.dumps([str(verdict)]), "d": dry, "k": kind, "rules": json.dumps([f"rule-{i}"])})
    engine.dispose()
    h = History(state, cluster="a")
    assert h._applied() == KNOWN
    got = {(r["cluster"], r["node"]): (r["started"], r["verdict"], r["kind"], r["swept"]) for r in _agrees(h)}
    assert got == {("a", "gpu-00"): (400.0, "pass", "light", 300.0), ("b", "gpu-00"): (200.0, "replace", "sweep", 200.0),
                   ("a", "gpu-01"): (70.0, "inconclusive", "pair", None), ("b", "gpu-03"): (80.0, "error", "pair", None)}
    h.run_started("sw-9", 1000.0, "sweep")
    _sweep(h, "gpu-01", 1000.0, "pass", run="sw-9")
    _sweep(h, "gpu-00", 350.0, "reboot", run="sw-9")  # late: older than the light check
    got = {(r["cluster"], r["node"]): (r["started"], r["verdict"], r["swept"]) for r in _agrees(h)}
    assert got[("a", "gpu-01")] == (1000.0, "pass", 1000.0) and got[("a", "gpu-00")] == (400.0, "pass", 350.0)
    h.close()


def test_a_bulk_load_makes_node_latest_from_the_rows_loaded(new_state: Callable[[str], str]) -> None:
    """Rows loaded in bulk (an import, the benchmarks) pass no Recorder: analyze() makes node_latest
    from them, as the migration does."""
    h = History(new_state("bulk.db"), cluster="a")
    h.insert_rows("node_sweeps", [
        {"cluster": c, "run_id": "sw-0", "node": f"gpu-{n}", "started": float(t), "finished": float(t) + 60,
         "playbook": "p", "profile": "p5", "verdict": v, "reasons": "[]", "dry_run": 0, "kind": k, "causes": "[]",
         "rules": "[]"}
        for c in ("a", "b") for n in range(3)
        for t, v, k in ((300 - 100 * n, "pass", "sweep"), (100, "reboot", "sweep"), (200 + n, "inconclusive", "pair"))])
    assert h.fleet() == []
    h.analyze()
    assert len(_agrees(h)) == 6
    h.close()

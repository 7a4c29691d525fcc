"""One history, two backends: the same migrations leave the same tables on SQLite and PostgreSQL;
several clusters' Sweepers write one store at once without mixing their rows; each reads its own
cluster, a report reads one or all; and a store holding what the migrations never make is refused
on both (docs/security-data.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from sweeper.errors import StateError
from sweeper.history import CURRENT, History, is_url, redact, state_exists
from sweeper.result import CheckResult, Metric, Result

T0 = 1_800_000_000.0


def _engine(state: str) -> sa.Engine:
    if is_url(state):
        return sa.create_engine(sa.engine.make_url(state).set(drivername="postgresql+psycopg"))
    return sa.create_engine(f"sqlite:///{state}")


def test_the_migrations_leave_the_declared_tables(new_state: Callable[[str], str]) -> None:
    state = new_state("h.db")
    History(state).close()
    engine = _engine(state)
    with engine.connect() as conn:
        inspector = sa.inspect(conn)
        for name, table in CURRENT.tables.items():
            assert [c["name"] for c in inspector.get_columns(name)] == [c.name for c in table.columns], name
            assert sorted(inspector.get_pk_constraint(name)["constrained_columns"]) == \
                sorted(c.name for c in table.primary_key), name
    engine.dispose()


def test_a_new_sqlite_file_made_by_replay_is_what_the_migrations_make(tmp_path, monkeypatch) -> None:
    """The first new SQLite history a process opens is migrated from empty, and its schema remembered;
    the next is made by replaying that schema. Both have the same tables, columns, keys and indexes
    (partial ones included) as SQLite keeps them, the same migrations recorded, and the replayed one
    still takes an older file's migration path (test_history_policy's, test_security_data's)."""
    from sweeper.history import store

    monkeypatch.setattr(store, "_SQLITE_NEW", None)  # as in a new process
    History(str(tmp_path / "migrated.db")).close()
    assert store._SQLITE_NEW, "the migrated file's schema is remembered"
    History(str(tmp_path / "replayed.db")).close()

    def schema(name: str) -> tuple[list[tuple[str, ...]], list[str]]:
        engine = _engine(str(tmp_path / name))
        with engine.connect() as conn:
            objects = sorted(tuple(r) for r in conn.exec_driver_sql(
                "select type, name, tbl_name, sql from sqlite_master order by name"))
            ran = [r[0] for r in conn.exec_driver_sql("select name from _sqlite_migrations order by name")]
        engine.dispose()
        return objects, ran

    migrated, replayed = schema("migrated.db"), schema("replayed.db")
    assert migrated == replayed
    assert any("where finished is not null" in (o[3] or "") for o in replayed[0]), "the partial index is there"
    h = History(str(tmp_path / "replayed.db"))  # opened again: nothing left to migrate, rows write and read
    _sweep_run(h, "r1", 3, 1_780_000_000.0)
    assert [s["verdict"] for s in h.node_history("gpu-00")["sweeps"]] == ["reboot"]
    h.close()


def _sweep_run(h: History, run: str, nodes: int, at: float) -> None:
    """What one sweep run writes: its run, a sweep with results per node, the intent log, a pair,
    a control."""
    h.run_started(run, at, "sweep")
    for i in range(nodes):
        node = f"gpu-{i:02d}"
        h.intent(run, node, at, "taint", "before")
        sid = h.sweep_started(run, node, at + i, "sweep-light.yaml", "p5.48xlarge")
        h.result(sid, Result(node=node, source="sweeper", started=at, finished=at + i + 30,
                             checks=(CheckResult("gpu.count", "pass", message=h.cluster),),
                             metrics=(Metric("ecc.aggregate_corrected", float(i), "", gpu=0),)))
        h.sweep_finished(sid, at + i + 60, "pass" if i % 5 else "reboot", [h.cluster])
        h.intent(run, node, at + i + 61, "untaint", "after", "verdict pass")
        h.action(run, node, at + i + 62, "release", h.cluster)
    h.pair_result(run, at + 100, "gpu-00", "gpu-01", "pass", "sweep", 180.0, h.cluster)
    h.set_control("pause", {"by": h.cluster}, at)
    h.run_finished(run, at + 200, "done", nodes, {"cluster": h.cluster})


def test_two_clusters_write_one_store_at_once_without_mixing_rows(new_state: Callable[[str], str]) -> None:
    """Two Sweepers, each with its own connection and cluster name, open a new store together (one
    migrates, the other waits) and write the same node names at the same moments."""
    state = new_state("fleet.db")
    errors: list[BaseException] = []
    opened: dict[str, History] = {}
    start = threading.Barrier(2)

    def sweeper(name: str) -> None:
        try:
            start.wait()
            h = opened[name] = History(state, cluster=name)
            for r in range(3):
                _sweep_run(h, f"{name}-run-{r}", 20, T0 + r * 86400)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=sweeper, args=(n,)) for n in ("us-east", "eu-west")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, h in opened.items():
        assert h.counts() == {"runs": 3, "node_sweeps": 60, "checks": 60, "metrics": 60, "actions": 60,
                              "intents": 120, "summaries": 0, "pairs": 3}, name
        assert {r["cluster"] for r in h.fleet()} == {name} and len(h.fleet()) == 20
        assert {c["message"] for s in h.node_history("gpu-03")["sweeps"] for c in s["problems"]} == set()
        assert {tuple(s["reasons"]) for s in h.node_history("gpu-03")["sweeps"]} == {(name,)}
        assert h.get_control("pause")["by"] == name and h.last_run()["summary"] == {"cluster": name}
        assert h.known_good(0) == {"gpu-00", "gpu-01"} and h.unfinished_runs() == []
        assert h.failures_since(0, ("reboot",)) == {f"gpu-{i:02d}": 3 for i in range(0, 20, 5)}
        assert {m for _, _, m in h.series("gpu-04", "ecc.aggregate_corrected", 0, T0 * 2)} == {4.0}
    both = History(state)
    assert both.clusters() == ["eu-west", "us-east"]
    assert both.counts()["node_sweeps"] == 120 and len(both.fleet()) == 40
    assert both.for_cluster("eu-west").counts()["node_sweeps"] == 60
    rows = both.query("select cluster, count(*) as n, min(id) as lo, max(id) as hi from node_sweeps group by cluster")
    assert {r["cluster"]: r["n"] for r in rows} == {"eu-west": 60, "us-east": 60}
    both.close()
    for h in opened.values():
        h.close()


def test_a_sweep_reads_only_its_own_cluster(new_state: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A history opened without a cluster name reads every cluster (a report of the fleet), until a
    run starts: from then on it reads only the cluster it writes as."""
    monkeypatch.delenv("SWEEPER_CLUSTER", raising=False)
    state = new_state("h.db")
    other = History(state, cluster="other")
    _sweep_run(other, "o-1", 3, T0)
    other.close()
    h = History(state)
    assert h.scope is None and h.cluster != "other" and len(h.fleet()) == 3
    assert h.for_cluster("other").last_swept() == {f"gpu-{i:02d}": T0 + i for i in range(3)}
    h.run_started("mine-1", T0 + 1000, "sweep")
    assert h.scope == h.cluster and h.fleet() == [] and h.last_swept() == {} and h.known_good(0) == set()
    assert h.get_control("pause") is None and h.last_run() is None
    h.close()
    monkeypatch.setenv("SWEEPER_CLUSTER", "other")
    named = History(state)
    assert named.cluster == "other" and named.scope == "other" and len(named.fleet()) == 3
    named.close()


def test_the_state_names_a_file_or_a_url(tmp_path) -> None:
    assert is_url("postgresql://u:secret@db:5432/sweeper") and not is_url(tmp_path / "h.db")
    assert redact("postgresql://u:secret@db:5432/sweeper") == "postgresql://u:***@db:5432/sweeper"
    assert state_exists("postgresql://db/sweeper") and not state_exists(tmp_path / "h.db")


def test_an_unreachable_server_is_a_state_error() -> None:
    with pytest.raises(StateError, match=r"cannot open the history at postgresql://u:\*\*\*@127.0.0.1:9/x"):
        History("postgresql://u:secret@127.0.0.1:9/x")


PG_FOREIGN = [
    "create function f() returns trigger language plpgsql as $$ begin new.status := 'pass'; return new; end $$; "
    "create trigger t before insert on checks for each row execute function f()",
    "create view v as select 1 as x",
    "create table extra (x int)",
    "create rule r as on insert to checks do instead nothing",
    "alter table checks enable row level security",
    "create function g() returns text language sql as $$ select 'x' $$; "
    "alter table checks alter column code set default g()",
]


@pytest.mark.parametrize("ddl", PG_FOREIGN)
def test_a_postgresql_history_with_objects_its_migrations_never_make_is_refused(
        postgres_database: str, ddl: str) -> None:
    """As a SQLite file's (tests/test_security_data.py): a trigger could turn a recorded `fail`
    into a `pass`, a rule swallow every insert, row security hide rows from the sweep, a view or
    a default run a function; whatever the migrations never make is refused before a read."""
    from tests.history_backends import fresh_schema

    state = fresh_schema(postgres_database)
    History(state, cluster="c").close()
    engine = _engine(state)
    with engine.begin() as conn:
        conn.exec_driver_sql(ddl)
    engine.dispose()
    with pytest.raises(StateError, match="not a Sweeper history"):
        History(state, cluster="c")


def test_the_postgres_overlay_patches_the_generated_cronjob() -> None:
    """deploy/postgres/: the CronJob reads its history URL from a Secret ($SWEEPER_STATE, read when
    --state is not given) and names its cluster; every `test` of the JSON patch (RFC 6902,
    https://datatracker.ietf.org/doc/html/rfc6902) holds against the generated deploy/cronjob.yaml."""
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent
    (cronjob,) = [d for d in yaml.safe_load_all((root / "deploy" / "cronjob.yaml").read_text())
                  if d and d["kind"] == "CronJob"]
    kustomization = yaml.safe_load((root / "deploy" / "postgres" / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../cronjob.yaml"]
    for op in yaml.safe_load((root / "deploy" / "postgres" / "cronjob-postgres.yaml").read_text()):
        *parents, last = op["path"].strip("/").split("/")
        node: Any = cronjob
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        if op["op"] == "test":
            assert (node[int(last)] if isinstance(node, list) else node[last]) == op["value"], op
        elif op["op"] == "remove":
            del node[int(last) if isinstance(node, list) else last]
        else:
            assert op["op"] == "add" and last == "-"
            node.append(op["value"])
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert "--state" not in container["command"] and "state" not in {v["name"] for v in pod["volumes"]}
    env = {e["name"]: e for e in container["env"]}
    assert env["SWEEPER_STATE"]["valueFrom"]["secretKeyRef"] == {"name": "sweeper-history", "key": "url"}
    assert env["SWEEPER_CLUSTER"]["value"]


def test_idle_spells_as_of_a_moment_and_their_pruning(new_state: Callable[[str], str]) -> None:
    """What the idle-window estimate reads (sweeper.window): a spell opened by a discovery that saw
    the node idle, closed by one that saw it busy, read as it stood at any moment (a backtest asks
    as of then), on both backends; pruning drops closed spells with the old sweeps."""
    h = History(new_state("h.db"), cluster="a")
    try:
        pool = "karpenter.sh/nodepool=gpu"
        h.idle_seen(T0, {"n1": (pool, True), "n2": (pool, False)})
        h.idle_seen(T0 + 600, {"n1": (pool, True), "n2": (pool, True)})  # n1's spell goes on; n2's opens
        h.idle_seen(T0 + 1800, {"n1": (pool, False)})
        assert h.idle_spells(pool, T0 - 1, T0 + 3600) == [(T0, 1800.0, False), (T0 + 600, 3000.0, True)]
        assert h.idle_spells(pool, T0 - 1, T0 + 900) == [(T0, 900.0, True), (T0 + 600, 300.0, True)]
        assert h.idle_spells("other", T0 - 1, T0 + 3600) == []
        sid = h.sweep_started("r", "n1", T0, "p", "x")
        h.sweep_finished(sid, T0 + 60, "pass", [])
        h.prune(T0 + 2000)
        assert h.idle_spells(pool, T0 - 1, T0 + 3600) == [(T0 + 600, 3000.0, True)]
    finally:
        h.close()

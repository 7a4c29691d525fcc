"""The history's schema: its migrations, written once in SQLAlchemy Core and applied alike to a
SQLite file and to a PostgreSQL database, and the tables as the last migration leaves them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.schema import CreateColumn

# A row id: BIGSERIAL on PostgreSQL (a fleet's checks outgrow 2^31), SQLite's INTEGER rowid alias there.
RowId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
Text, Float, Int = sa.Text, sa.Float, sa.Integer

MIGRATIONS_TABLE = "_sqlite_migrations"  # the name sqlite_utils.Migrations gave it: files it wrote keep theirs
MIGRATION_SET = "sweeper"
CONCLUSIVE_PAIRS = ("pass", "warn", "fail")  # a pair's statuses that say something about the fabric
# A sweep that says something about its node (the readers' condition, and a partial index's)
CONCLUSIVE_SWEEP = "finished is not null and dry_run = 0 and kind in ('sweep', 'light', 'pair')"

Migration = Callable[[Connection, str], None]


def _create(conn: Connection, name: str, *columns: sa.Column, pk: Sequence[str] = ("id",),
            indexes: Sequence[Sequence[str]] = ()) -> sa.Table:
    """A table as it was when a migration made it, with its indexes (named as sqlite_utils named them)."""
    table = sa.Table(name, sa.MetaData(), *columns, sa.PrimaryKeyConstraint(*pk))
    table.create(conn)
    for cols in indexes:
        sa.Index(f"idx_{name}_{'_'.join(cols)}", *(table.c[c] for c in cols)).create(conn)
    return table


def _index(conn: Connection, table: str, *cols: str) -> None:
    t = sa.Table(table, sa.MetaData(), *(sa.Column(c) for c in cols))
    sa.Index(f"idx_{table}_{'_'.join(cols)}", *(t.c[c] for c in cols)).create(conn)


def _add_column(conn: Connection, table: str, column: sa.Column) -> None:
    """ALTER TABLE ... ADD COLUMN, the column's DDL compiled by the connection's own dialect."""
    sa.Table(table, sa.MetaData(), column)
    conn.execute(sa.text(f"alter table {table} add column {CreateColumn(column).compile(dialect=conn.dialect)}"))


def _id() -> sa.Column:
    return sa.Column("id", RowId, autoincrement=True)


def m001_initial(conn: Connection, cluster: str) -> None:
    C = sa.Column
    _create(conn, "runs", C("id", Text), C("started", Float), C("finished", Float), C("status", Text),
            C("mode", Text), C("host", Text), C("taken", Int), C("summary", Text))
    _create(conn, "node_sweeps", _id(), C("run_id", Text), C("node", Text), C("started", Float),
            C("finished", Float), C("playbook", Text), C("profile", Text), C("verdict", Text), C("reasons", Text),
            C("dry_run", Int), indexes=[("node", "started")])
    _create(conn, "checks", _id(), C("sweep_id", Int), C("node", Text), C("ts", Float), C("source", Text),
            C("name", Text), C("status", Text), C("severity", Text), C("gpu", Int), C("code", Text),
            C("message", Text), indexes=[("node", "ts"), ("sweep_id",)])
    _create(conn, "metrics", _id(), C("sweep_id", Int), C("node", Text), C("ts", Float), C("name", Text),
            C("gpu", Int), C("value", Float), C("unit", Text), indexes=[("node", "name", "ts"), ("name", "ts")])
    _create(conn, "actions", _id(), C("run_id", Text), C("node", Text), C("ts", Float), C("action", Text),
            C("detail", Text), C("dry_run", Int), indexes=[("node", "ts")])
    _create(conn, "intents", _id(), C("run_id", Text), C("node", Text), C("ts", Float), C("op", Text),
            C("phase", Text), C("detail", Text), indexes=[("run_id", "node")])


def m002_controls(conn: Connection, cluster: str) -> None:
    _create(conn, "controls", sa.Column("key", Text), sa.Column("value", Text), sa.Column("ts", Float), pk=("key",))
    _index(conn, "node_sweeps", "verdict", "finished")


def m003_sweep_kind(conn: Connection, cluster: str) -> None:
    # 'sweep': the node was held and checked; 'light': read-only checks on a busy node, never held.
    _add_column(conn, "node_sweeps", sa.Column("kind", Text, nullable=False, server_default="sweep"))


def m004_policy(conn: Connection, cluster: str) -> None:
    # What the policy decided on: the causes (check|code) behind the verdict, the history rules
    # that raised it, and when it was decided (what a backtest replays up to).
    _add_column(conn, "node_sweeps", sa.Column("causes", Text, nullable=False, server_default="[]"))
    _add_column(conn, "node_sweeps", sa.Column("rules", Text, nullable=False, server_default="[]"))
    _add_column(conn, "node_sweeps", sa.Column("decided", Float))
    _add_column(conn, "node_sweeps", sa.Column("policy", Text))
    _add_column(conn, "node_sweeps", sa.Column("policy_verdict", Text))  # before the safety caps
    # What `sweeper state prune` keeps of the sweeps it deletes: one row a node a day.
    _create(conn, "summaries", sa.Column("node", Text), sa.Column("day", Text), sa.Column("sweeps", Int),
            sa.Column("verdicts", Text), sa.Column("metrics", Text), pk=("node", "day"))
    _index(conn, "metrics", "sweep_id")
    _index(conn, "node_sweeps", "profile", "finished")


def m005_pairs(conn: Connection, cluster: str) -> None:
    # One row a pair run: node A and partner B (in a re-pair: the suspect and its known-good
    # partner), the pair's status, its mode (sweep | repair), the bus bandwidth and each side's
    # sweep row. Read from either side, by time.
    C = sa.Column
    _create(conn, "pairs", _id(), C("run_id", Text), C("ts", Float), C("node", Text), C("partner", Text),
            C("status", Text), C("mode", Text), C("busbw", Float), C("detail", Text), C("node_sweep_id", Int),
            C("partner_sweep_id", Int), indexes=[("node", "ts"), ("partner", "ts"), ("status", "mode", "ts"),
                                                 ("node_sweep_id",), ("partner_sweep_id",)])
    # Each node's latest conclusive pair result, kept as pairs are written.
    _create(conn, "pair_latest", C("node", Text), C("ts", Float), C("pair_id", Int), C("partner", Text),
            C("status", Text), C("mode", Text), C("role", Text), pk=("node",), indexes=[("ts",)])


ROW_TABLES = ("runs", "node_sweeps", "checks", "metrics", "actions", "intents", "pairs")
KEYED_TABLES = ("controls", "summaries", "pair_latest")  # keyed by (cluster, *their old key) from m006


def m006_cluster(conn: Connection, cluster: str) -> None:
    """Every row carries its cluster's name, so that several clusters' Sweepers share one database.
    The rows already there are the opening cluster's (a file served one cluster); the tables keyed by
    node or key are rebuilt keyed by cluster too (two clusters may both have a `gpu-00`)."""
    for table in ROW_TABLES:
        _add_column(conn, table, sa.Column("cluster", Text, nullable=False, server_default=""))
        conn.execute(sa.text(f"update {table} set cluster = :cluster"), {"cluster": cluster})
    for name in KEYED_TABLES:  # rebuilt from CURRENT, whose keys lead with the cluster
        old = CURRENT.tables[name]
        cols = [c.name for c in old.columns if c.name != "cluster"]
        new = old.to_metadata(sa.MetaData(), name=f"{name}_new")  # keyed (cluster, *key)
        new.create(conn)
        conn.execute(new.insert().from_select(cols, sa.select(*(sa.column(c) for c in cols))
                                             .select_from(sa.table(name))))
        conn.execute(sa.text(f"update {name}_new set cluster = :cluster"), {"cluster": cluster})
        sa.Table(name, sa.MetaData()).drop(conn)
        conn.execute(sa.text(f"alter table {name}_new rename to {name}"))
    _index(conn, "pair_latest", "ts")
    _index(conn, "runs", "cluster", "started")
    _index(conn, "node_sweeps", "cluster", "finished")


def m007_idle_spells(conn: Connection, cluster: str) -> None:
    # One row a spell a GPU node stayed idle (no GPU pod), as the sweeps' discoveries saw it, with
    # the node's pool: what the idle-window estimate reads (sweeper.window). `ended` null: still idle.
    C = sa.Column
    _create(conn, "idle_spells", _id(), C("node", Text), C("pool", Text), C("started", Float), C("ended", Float),
            C("cluster", Text, nullable=False, server_default=""),
            indexes=[("cluster", "pool", "started"), ("cluster", "node", "ended")])


def m008_claims(conn: Connection, cluster: str) -> None:
    # One row a judged outside claim: the node, the sweep that tested it, the claim's source and
    # code (a condition's type and reason, a taint's key and value), its kind, the test, when the
    # claim was made, and the outcome (confirmed | refuted | inconclusive) with its evidence.
    C = sa.Column
    _create(conn, "claims", _id(), C("run_id", Text), C("sweep_id", Int), C("node", Text), C("ts", Float),
            C("source", Text), C("code", Text), C("kind", Text), C("test", Text), C("since", Float),
            C("outcome", Text), C("evidence", Text), C("cluster", Text, nullable=False, server_default=""),
            indexes=[("node", "source", "code", "ts"), ("cluster", "ts"), ("sweep_id",)])


def m009_evidence(conn: Connection, cluster: str) -> None:
    # A held node's evidence bundle (a tar.gz the node made, never extracted), keyed by node and run,
    # not by the live Node: a node Karpenter removed keeps it. `data` is null where the bundle is in
    # object storage (`location`, s3://bucket/key) or was pruned by the size cap.
    C = sa.Column
    _create(conn, "evidence", _id(), C("run_id", Text), C("node", Text), C("ts", Float), C("bytes", Int),
            C("sha256", Text), C("location", Text), C("manifest", Text), C("data", sa.LargeBinary),
            C("cluster", Text, nullable=False, server_default=""), indexes=[("node", "run_id"), ("cluster", "ts")])


def m010_fleet_indexes(conn: Connection, cluster: str) -> None:
    """The reads of a store shared by a fleet key on (cluster, node): a node's story (`history NODE`),
    each node's latest sweep (`nodes`, the report) and each cluster's overview (the fleet page). Node
    names repeat across clusters, so an index led by the node alone walks every cluster's rows."""
    _index(conn, "node_sweeps", "cluster", "node", "started")
    # Each node's latest conclusive sweep and its verdict, and each cluster's failures a day, read from
    # the index alone: a partial index whose condition is the readers' own text (CONCLUSIVE_SWEEP:
    # SQLite matches a partial index by its terms).
    conn.execute(sa.text("create index idx_node_sweeps_conclusive on node_sweeps (cluster, node, started, verdict) "
                         f"where {CONCLUSIVE_SWEEP}"))
    _index(conn, "actions", "cluster", "node", "ts")
    _index(conn, "metrics", "cluster", "node", "ts")


def m011_facts(conn: Connection, cluster: str) -> None:
    # The node's hardware and software as a sweep read them (NVML's driver, CUDA, VBIOS, serials and
    # board; DCGM's version; the node's zone, instance type and topology labels), one row a fact a
    # node a run: what `sweeper cohorts` reads failures by. Older sweeps simply have none.
    C = sa.Column
    _create(conn, "facts", C("node", Text), C("run_id", Text), C("key", Text), C("value", Text), C("ts", Float),
            C("cluster", Text, nullable=False, server_default=""), pk=("cluster", "node", "run_id", "key"),
            indexes=[("cluster", "key", "node")])


# Each node's latest conclusive sweep (what `nodes` and the report name it by), and the start of its
# latest full sweep (kind 'sweep', not inconclusive: what makes it not due), from the rows there.
LATEST_COLUMNS = ("cluster", "node", "sweep_id", "run_id", "started", "finished", "verdict", "kind", "profile",
                  "reasons", "rules", "swept")
FILL_LATEST = (  # the latest of each node ranked over the narrow columns alone, its row then read by id;
    # then each node's latest full sweep, one index range a node (no join a stale plan could repeat per row)
    f"insert into node_latest ({', '.join(LATEST_COLUMNS)}) select s.cluster, s.node, s.id, s.run_id, s.started, "
    "s.finished, s.verdict, s.kind, s.profile, s.reasons, s.rules, null from (select id, row_number() over "
    "(partition by cluster, node order by started desc, id desc) as rk from node_sweeps "
    f"where {CONCLUSIVE_SWEEP}) as r join node_sweeps s on s.id = r.id where r.rk = 1",
    "update node_latest set swept = (select max(s.started) from node_sweeps s where s.cluster = node_latest.cluster "
    "and s.node = node_latest.node and s.finished is not null and s.dry_run = 0 and s.kind = 'sweep' "
    "and s.verdict != 'inconclusive')")


def m012_node_latest(conn: Connection, cluster: str) -> None:
    """One row a node of each cluster: its latest conclusive sweep (id, run, start, end, verdict, kind,
    profile, reasons, rules) and the start of its latest full sweep, kept as sweeps are written
    (sweeper.history.recorder) and filled here from the sweeps already there. `nodes` and the fleet
    page read a fleet's nodes from it, not from every sweep the fleet ever made."""
    C = sa.Column
    _create(conn, "node_latest", C("node", Text), C("sweep_id", RowId), C("run_id", Text), C("started", Float),
            C("finished", Float), C("verdict", Text), C("kind", Text), C("profile", Text), C("reasons", Text),
            C("rules", Text), C("swept", Float), C("cluster", Text, nullable=False, server_default=""),
            pk=("cluster", "node"), indexes=[("started",)])
    for sql in FILL_LATEST:
        conn.execute(sa.text(sql))


MIGRATIONS: tuple[Migration, ...] = (m001_initial, m002_controls, m003_sweep_kind, m004_policy, m005_pairs,
                                     m006_cluster, m007_idle_spells, m008_claims, m009_evidence,
                                     m010_fleet_indexes, m011_facts, m012_node_latest)
KNOWN = [m.__name__ for m in MIGRATIONS]


def _current() -> sa.MetaData:
    """The tables as the last migration leaves them: what the writes are built from."""
    md, C = sa.MetaData(), sa.Column

    def table(name: str, *cols: sa.Column, pk: Sequence[str] = ("id",)) -> None:
        sa.Table(name, md, *cols, C("cluster", Text, nullable=False, server_default=""), sa.PrimaryKeyConstraint(*pk))

    table("runs", C("id", Text), C("started", Float), C("finished", Float), C("status", Text), C("mode", Text),
          C("host", Text), C("taken", Int), C("summary", Text))
    table("node_sweeps", _id(), C("run_id", Text), C("node", Text), C("started", Float), C("finished", Float),
          C("playbook", Text), C("profile", Text), C("verdict", Text), C("reasons", Text), C("dry_run", Int),
          C("kind", Text), C("causes", Text), C("rules", Text), C("decided", Float), C("policy", Text),
          C("policy_verdict", Text))
    table("checks", _id(), C("sweep_id", Int), C("node", Text), C("ts", Float), C("source", Text), C("name", Text),
          C("status", Text), C("severity", Text), C("gpu", Int), C("code", Text), C("message", Text))
    table("metrics", _id(), C("sweep_id", Int), C("node", Text), C("ts", Float), C("name", Text), C("gpu", Int),
          C("value", Float), C("unit", Text))
    table("actions", _id(), C("run_id", Text), C("node", Text), C("ts", Float), C("action", Text),
          C("detail", Text), C("dry_run", Int))
    table("intents", _id(), C("run_id", Text), C("node", Text), C("ts", Float), C("op", Text), C("phase", Text),
          C("detail", Text))
    table("controls", C("key", Text), C("value", Text), C("ts", Float), pk=("cluster", "key"))
    table("summaries", C("node", Text), C("day", Text), C("sweeps", Int), C("verdicts", Text), C("metrics", Text),
          pk=("cluster", "node", "day"))
    table("pairs", _id(), C("run_id", Text), C("ts", Float), C("node", Text), C("partner", Text), C("status", Text),
          C("mode", Text), C("busbw", Float), C("detail", Text), C("node_sweep_id", Int), C("partner_sweep_id", Int))
    table("pair_latest", C("node", Text), C("ts", Float), C("pair_id", Int), C("partner", Text), C("status", Text),
          C("mode", Text), C("role", Text), pk=("cluster", "node"))
    table("idle_spells", _id(), C("node", Text), C("pool", Text), C("started", Float), C("ended", Float))
    table("claims", _id(), C("run_id", Text), C("sweep_id", Int), C("node", Text), C("ts", Float), C("source", Text),
          C("code", Text), C("kind", Text), C("test", Text), C("since", Float), C("outcome", Text),
          C("evidence", Text))
    table("evidence", _id(), C("run_id", Text), C("node", Text), C("ts", Float), C("bytes", Int),
          C("sha256", Text), C("location", Text), C("manifest", Text), C("data", sa.LargeBinary))
    table("facts", C("node", Text), C("run_id", Text), C("key", Text), C("value", Text), C("ts", Float),
          pk=("cluster", "node", "run_id", "key"))
    table("node_latest", C("node", Text), C("sweep_id", RowId), C("run_id", Text), C("started", Float),
          C("finished", Float), C("verdict", Text), C("kind", Text), C("profile", Text), C("reasons", Text),
          C("rules", Text), C("swept", Float), pk=("cluster", "node"))
    return md


CURRENT = _current()
KNOWN_TABLES = frozenset({*CURRENT.tables, MIGRATIONS_TABLE})

_migrations_table = sa.Table(MIGRATIONS_TABLE, sa.MetaData(), sa.Column("migration_set", Text),
                             sa.Column("name", Text), sa.Column("applied_at", Text),
                             sa.PrimaryKeyConstraint("migration_set", "name"))


def applied(conn: Connection) -> list[str]:
    """The names of the migrations the database has, in the order they were applied."""
    if not sa.inspect(conn).has_table(MIGRATIONS_TABLE):
        return []
    t = _migrations_table
    return list(conn.execute(sa.select(t.c.name).where(t.c.migration_set == MIGRATION_SET)
                             .order_by(t.c.name)).scalars())


def migrate(conn: Connection, cluster: str, stop_before: str | None = None) -> list[str]:
    """Apply the pending migrations inside the caller's transaction (all or none), each recorded as
    sqlite_utils.Migrations recorded them. The names applied."""
    _migrations_table.create(conn, checkfirst=True)
    done, ran = set(applied(conn)), []
    now = datetime.now(UTC).replace(tzinfo=None).isoformat()
    for fn in MIGRATIONS:
        if fn.__name__ == stop_before:
            break
        if fn.__name__ in done:
            continue
        fn(conn, cluster)
        conn.execute(_migrations_table.insert().values(
            migration_set=MIGRATION_SET, name=fn.__name__,
            applied_at=now))
        ran.append(fn.__name__)
    return ran


# -- a new SQLite file at the last migration -----------------------------------------------------
def sqlite_schema(conn: Connection) -> tuple[str, ...]:
    """The statements that make this SQLite database's tables and indexes, as SQLite keeps them after
    every ALTER (`sqlite_master`): tables first, then indexes, each in the order they were made."""
    rows = conn.exec_driver_sql("select type, sql from sqlite_master where sql is not null "
                                "and name not like 'sqlite_%' order by rowid").all()
    return tuple(sql for kind in ("table", "index") for t, sql in rows if t == kind)


def replay(conn: Connection, statements: tuple[str, ...]) -> list[str]:
    """Make an empty SQLite database what the migrations made of another empty one (`sqlite_schema` of
    it), each migration recorded as applied: the same tables, indexes and rows (an empty database has
    none for a migration to move), without SQLAlchemy compiling some fifty DDL statements again."""
    for sql in statements:
        conn.exec_driver_sql(sql)
    now = datetime.now(UTC).replace(tzinfo=None).isoformat()
    conn.execute(_migrations_table.insert(), [{"migration_set": MIGRATION_SET, "name": n, "applied_at": now}
                                             for n in KNOWN])
    return list(KNOWN)

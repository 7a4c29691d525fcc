"""A history is input someone else may have written (docs/security-data.md): before anything is
read, a store holding objects that Sweeper's migrations never make is refused. A trigger could
rewrite what is recorded (a `fail` into a `pass`) or loop on every insert, a view or a rule could
stand in for a table, a function could run as a default: nothing of the kind is let run."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sweeper.errors import StateError
from sweeper.history.schema import KNOWN_TABLES, MIGRATIONS_TABLE, migrate


def refuse_foreign_schema(conn: Connection, where: str) -> None:
    """Raise StateError naming what is foreign, for a SQLite file or a PostgreSQL schema."""
    foreign = _sqlite(conn) if conn.dialect.name == "sqlite" else _postgresql(conn)
    if foreign:
        raise StateError(f"{where} is not a Sweeper history as its migrations make it (it has "
                         f"{', '.join(foreign[:5])}); refused, so that nothing in it runs")


def _extra(tables: set[str]) -> list[str]:
    extra = tables - KNOWN_TABLES
    if extra:  # a migration newer than KNOWN_TABLES may have made it: ask the migrations themselves
        extra = tables - migration_tables()
    return [f"table {name!r}" for name in sorted(extra)]


def migration_tables() -> frozenset[str]:
    """The tables the migrations make, read from a fresh in-memory SQLite database."""
    engine = sa.create_engine("sqlite://")
    with engine.begin() as conn:
        migrate(conn, "")
        names = frozenset(sa.inspect(conn).get_table_names())
    engine.dispose()
    return names | {MIGRATIONS_TABLE}


def _sqlite(conn: Connection) -> list[str]:
    rows = conn.exec_driver_sql("select type, name, tbl_name, sql from sqlite_master").fetchall()
    foreign = [f"{kind} {name!r}" for kind, name, _, sql in rows
               if kind not in ("table", "index") or (kind == "table" and str(sql or "").lstrip().upper()
                                                      .startswith("CREATE VIRTUAL"))]
    tables = {name for kind, name, _, _ in rows if kind == "table" and not name.startswith("sqlite_")}
    return foreign + _extra(tables)


# The catalogs of the schema the connection writes to (https://www.postgresql.org/docs/current/catalogs.html).
# Sequences (a serial column's) and indexes are what the migrations make besides tables.
_PG_RELATIONS = """select c.relname, c.relkind from pg_class c join pg_namespace n on n.oid = c.relnamespace
where n.nspname = current_schema() and c.relkind not in ('i', 'S', 'I')"""
_PG_OTHERS = """
select 'trigger ' || quote_literal(t.tgname) from pg_trigger t join pg_class c on c.oid = t.tgrelid
  join pg_namespace n on n.oid = c.relnamespace where n.nspname = current_schema() and not t.tgisinternal
union all
select 'rule ' || quote_literal(r.rulename) from pg_rewrite r join pg_class c on c.oid = r.ev_class
  join pg_namespace n on n.oid = c.relnamespace where n.nspname = current_schema()
union all
select 'policy ' || quote_literal(p.polname) from pg_policy p join pg_class c on c.oid = p.polrelid
  join pg_namespace n on n.oid = c.relnamespace where n.nspname = current_schema()
union all
select 'function ' || quote_literal(p.proname) from pg_proc p join pg_namespace n on n.oid = p.pronamespace
  where n.nspname = current_schema()
union all
select 'event trigger ' || quote_literal(e.evtname) from pg_event_trigger e
union all
select 'default calling ' || quote_literal(p.proname) from pg_attrdef d
  join pg_class c on c.oid = d.adrelid join pg_namespace n on n.oid = c.relnamespace
  join pg_depend dep on dep.classid = 'pg_attrdef'::regclass and dep.objid = d.oid
  join pg_proc p on dep.refclassid = 'pg_proc'::regclass and dep.refobjid = p.oid
  join pg_namespace pn on pn.oid = p.pronamespace
  where n.nspname = current_schema() and pn.nspname <> 'pg_catalog'
"""
_KINDS = {"r": "table", "p": "partitioned table", "v": "view", "m": "materialized view", "f": "foreign table",
          "c": "type", "t": "toast table"}


def _postgresql(conn: Connection) -> list[str]:
    if conn.execute(sa.text("select current_schema()")).scalar() is None:
        return ["no schema to write to (the search_path names none that exists)"]
    rels = conn.execute(sa.text(_PG_RELATIONS)).fetchall()
    foreign = [f"{_KINDS.get(kind, kind)} {name!r}" for name, kind in rels if kind != "r"]
    foreign += [r[0] for r in conn.execute(sa.text(_PG_OTHERS))]
    # Row-level security could hide rows from the sweep; an inherited child could add rows of its own.
    foreign += [f"row security on {r[0]!r}" for r in conn.execute(sa.text(
        "select c.relname from pg_class c join pg_namespace n on n.oid = c.relnamespace "
        "where n.nspname = current_schema() and c.relkind = 'r' and c.relrowsecurity"))]
    foreign += [f"inheritance into {r[0]!r}" for r in conn.execute(sa.text(
        "select c.relname from pg_inherits i join pg_class c on c.oid = i.inhparent "
        "join pg_namespace n on n.oid = c.relnamespace where n.nspname = current_schema()"))]
    return foreign + _extra({name for name, kind in rels if kind == "r"})

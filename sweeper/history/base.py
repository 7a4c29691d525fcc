"""What every part of the history shares: the link to the store, the cluster it writes as and the
clusters it reads, and rows read as dicts."""

from __future__ import annotations

import copy
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from sweeper.errors import StateError
from sweeper.history.schema import CURRENT
from sweeper.history.store import Link, is_url


@lru_cache(maxsize=1024)
def _text(sql: str) -> sa.TextClause:
    """A statement, parsed once: sa.text scans the string for its :names at each call, and a sweep
    runs the same few dozen statements again and again (a TextClause is immutable: one serves all)."""
    return sa.text(sql)


class Base:
    """A history's link and scope. `cluster` is the name written on every row; `scope` the cluster
    whose rows are read (None: every cluster in the store)."""

    _link: Link
    cluster: str
    scope: str | None

    @property
    def state(self) -> str:
        """The SQLite path or the PostgreSQL URL this history was opened at."""
        return self._link.state

    @property
    def path(self) -> Path:
        """The SQLite file (a PostgreSQL history has none: see `state`)."""
        if is_url(self._link.state):
            raise StateError(f"{self._link.where} is a PostgreSQL database, not a file")
        return Path(self._link.state)

    @property
    def backend(self) -> str:
        """'sqlite' or 'postgresql'."""
        return self._link.backend

    def for_cluster(self, cluster: str | None) -> Any:
        """The same history read as one cluster's (None: every cluster's); writes keep this one's name
        unless a cluster is named. Shares the connection: closing either closes both."""
        view = copy.copy(self)
        view.scope = cluster
        if cluster:
            view.cluster = cluster
        return view

    def clusters(self) -> list[str]:
        """Every cluster that has recorded a run or a sweep, by name."""
        # node_sweeps' clusters by a walk of its (cluster, ...) index, one step a cluster: a fleet's
        # million sweeps are never read for ten names (the same SQL on both backends)
        with self._link.transaction() as conn:
            return list(conn.execute(sa.text(
                "with recursive c(name) as (select min(cluster) from node_sweeps union all select (select "
                "min(cluster) from node_sweeps where cluster > c.name) from c where c.name is not null) "
                "select cluster from runs union select name from c where name is not null order by 1")).scalars())

    # -- SQL helpers ----------------------------------------------------------------------
    @property
    def _conn(self) -> Connection:
        return self._link.conn

    def _in(self, alias: str = "") -> str:
        """The clause that keeps a query to the clusters read (with `:cluster` bound by `_rows`)."""
        return f" and {alias}cluster = :cluster" if self.scope is not None else ""

    def _run(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self._conn.execute(_text(sql), {"cluster": self.scope, **(params or {})})

    def _rows(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows as dicts (zipped with the result's column names once, rather than a mapping a row
        asked for its keys: a backtest reads tens of thousands of rows)."""
        result = self._run(sql, params)
        keys = tuple(result.keys())
        return [dict(zip(keys, r, strict=True)) for r in result]

    def _tuples(self, sql: str, params: dict[str, Any] | None = None) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self._run(sql, params)]

    def _scalar(self, sql: str, params: dict[str, Any] | None = None) -> Any:
        return self._run(sql, params).scalar()

    def _write(self, table: str, row: dict[str, Any], where_id: Any = None) -> int:
        """Insert `row` into `table` (stamped with the cluster), or update the row whose id is
        `where_id`; lists and dicts are stored as JSON. The new row's id."""
        t = CURRENT.tables[table]
        values = {k: json.dumps(v) if isinstance(v, (dict, list, tuple)) else v for k, v in row.items()}
        if where_id is not None:
            self._conn.execute(sa.update(t).where(t.c.id == where_id).values(**values))
            return 0
        res = self._conn.execute(sa.insert(t).values(**values, cluster=self.cluster))
        key = res.inserted_primary_key
        return int(key[0]) if key and isinstance(key[0], int) else 0

    def _insert_many(self, table: str, rows: list[dict[str, Any]]) -> None:
        if rows:
            self._conn.execute(sa.insert(CURRENT.tables[table]), [{**r, "cluster": self.cluster} for r in rows])

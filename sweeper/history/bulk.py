"""Loading a history in bulk, for benchmarks and for importing another store's rows: rows inserted
in large batches through the same engine, set-based statements (INSERT ... SELECT) run as they
are, and the planner's statistics refreshed. Both backends; no row passes through the policy."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any

import sqlalchemy as sa

from sweeper.history.base import Base
from sweeper.history.schema import CURRENT, FILL_LATEST
from sweeper.history.store import locked

BATCH = 20_000  # rows a round trip: executemany on SQLite, psycopg's pipelined executemany on PostgreSQL


def _batches(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    it = iter(rows)
    while batch := list(islice(it, size)):
        yield batch


class Bulk(Base):
    def insert_rows(self, table: str, rows: Iterable[dict[str, Any]], batch: int = BATCH) -> int:
        """Insert `rows` (each with its own `cluster`, else this history's) into `table`, `batch`
        rows a transaction. The rows inserted."""
        t, n = CURRENT.tables[table], 0
        for chunk in _batches(rows, batch):
            self._bulk(sa.insert(t), [{"cluster": self.cluster, **r} for r in chunk])
            n += len(chunk)
        return n

    @locked
    def _bulk(self, stmt: Any, rows: list[dict[str, Any]]) -> None:
        self._conn.execute(stmt, rows)

    @locked
    def execute(self, sql: str, params: dict[str, Any] | None = None) -> int:
        """One set-based write (`INSERT ... SELECT`, `UPDATE`) with `:name` parameters, in a
        transaction of its own. The rows it touched."""
        return int(self._conn.execute(sa.text(sql), params or {}).rowcount or 0)

    def analyze(self) -> None:
        """After a bulk load: each row id's sequence moved past the ids loaded (PostgreSQL's BIGSERIAL
        does not see ids given explicitly; SQLite's rowid needs nothing), each node's latest sweep
        (node_latest, which the Recorder keeps as it writes) made again from the sweeps loaded, and
        the query planner's statistics refreshed."""
        with self._link.transaction() as conn:
            conn.exec_driver_sql("analyze")  # the fill's plan needs the loaded rows' statistics
            conn.exec_driver_sql("delete from node_latest")
            for sql in FILL_LATEST:
                conn.execute(sa.text(sql))
            if self.backend == "postgresql":
                for t in CURRENT.tables.values():
                    if "id" in t.c and t.c.id.autoincrement is True:
                        conn.exec_driver_sql(f"select setval(pg_get_serial_sequence('{t.name}', 'id'), "
                                             f"coalesce((select max(id) from {t.name}), 0) + 1, false)")
            conn.exec_driver_sql("analyze")

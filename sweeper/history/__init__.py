"""The history: runs, node sweeps, checks, metrics, actions, pair results and the intent log, in a
SQLite file (embedded, the default) or a PostgreSQL database that a fleet of clusters shares. The
only importer of SQLAlchemy and of the database drivers; the sweep sees it through the Recorder
protocol. Every row carries its cluster's name.

- `schema`: the migrations, one set for both backends, and the tables they leave;
- `store` and `refusals`: opening (and refusing a store that holds what the migrations never make);
- `recorder`: the sweep's writes and what it reads back; `reading`: a node's story and the
  policy's past; `fleet`: the report's, the fleet page's and the backtest's reads; `retention`: pruning;
  `idle`: the nodes' idle spells and depths of test, for the idle-window estimate; `claims`: outside
  claims judged, and each source's precision; `evidence`: held nodes' evidence bundles; `bulk`: loading
  many rows at once (benchmarks, imports)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sweeper.history.bulk import Bulk
from sweeper.history.claims import Claims
from sweeper.history.cohorts import Cohorts
from sweeper.history.evidence import Evidence
from sweeper.history.fleet import Fleet
from sweeper.history.idle import Idle
from sweeper.history.reading import Reading
from sweeper.history.recorder import Recorder
from sweeper.history.refusals import migration_tables
from sweeper.history.retention import Retention
from sweeper.history.schema import (
    CONCLUSIVE_PAIRS,
    CURRENT,
    KNOWN,
    KNOWN_TABLES,
    MIGRATIONS,
    MIGRATIONS_TABLE,
    applied,
    migrate,
)
from sweeper.history.store import Link, cluster_name, is_url, redact, state_exists


class History(Recorder, Reading, Fleet, Cohorts, Retention, Idle, Claims, Evidence, Bulk):
    """The history at `state`: a SQLite path (`:memory:` for none) or a `postgresql://` URL.

    `cluster`: the name written on every row, and the only cluster read. Without it the name is
    $SWEEPER_CLUSTER's (which then also limits the reads), else the kubeconfig context's, else
    `default`, and every cluster in the store is read, until a run starts: a sweep reads its own
    cluster's rows only. `for_cluster(name)` reads one cluster (None: all)."""

    def __init__(self, state: str | Path, cluster: str | None = None) -> None:
        import os

        named = cluster or os.environ.get("SWEEPER_CLUSTER") or None
        self.cluster = cluster_name(named)
        self.scope = named
        self._link = Link(str(state), self.cluster)
        self._sqlite_db: Any = None

    def close(self) -> None:
        with self._link.lock:
            self._link.conn.close()
            self._link.engine.dispose()

    def _applied(self) -> list[str]:
        """The names of the migrations this store has."""
        with self._link.transaction() as conn:
            return applied(conn)

    # -- the SQLite file itself, for tests and benchmarks ---------------------------------
    @property
    def conn(self) -> Any:
        """The sqlite3 connection under a SQLite history (the one its reads and writes use)."""
        if self.backend != "sqlite":
            raise AttributeError("conn: a PostgreSQL history has no sqlite3 connection")
        return self._link.conn.connection.driver_connection

    @property
    def db(self) -> Any:
        """The SQLite file as a sqlite_utils Database over the same connection (made on first use)."""
        if self._sqlite_db is None:
            from sqlite_utils import Database

            self._sqlite_db = Database(self.conn, execute_plugins=False)
        return self._sqlite_db

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Every call inside, one transaction: committed at the end, rolled back if it fails (for tests,
        benchmarks and bulk imports that write many sweeps; a sweep commits each call by itself)."""
        with self._link.transaction():
            yield

    def query(self, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a read-only SQL statement with `:name` parameters, on either backend (for tests,
        benchmarks and one-off questions; the commands use the methods above)."""
        with self._link.transaction():
            return self._rows(sql, params)


__all__ = ["CONCLUSIVE_PAIRS", "CURRENT", "KNOWN", "KNOWN_TABLES", "MIGRATIONS", "MIGRATIONS_TABLE", "History",
           "applied", "cluster_name", "is_url", "migrate", "migration_tables", "redact", "state_exists"]

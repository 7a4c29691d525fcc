"""Where the history is kept: a SQLite file (embedded, the default) or a PostgreSQL database (a
fleet of clusters), opened through one SQLAlchemy engine. Opening refuses a store that holds
anything its migrations never make, and brings an older one up to date."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.pool import NullPool

from sweeper.errors import StateError
from sweeper.history.schema import (
    KNOWN,
    KNOWN_TABLES,
    MIGRATIONS_TABLE,
    applied,
    migrate,
    replay,
    sqlite_schema,
)
from sweeper.output import hide_password

URL_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://")
# The schema an empty SQLite file had once this process migrated it (sqlite_schema): a later new file
# here is made by replaying it (schema.replay), a tenth of the CPU. A process that opens one new
# history (a CronJob's run) migrates it as ever; the suite opens hundreds.
_SQLITE_NEW: tuple[str, ...] | None = None
MIGRATION_LOCK = 0x5357_4545_5045_52  # 'SWEEPER': the advisory lock two PostgreSQL openers migrate under


def is_url(state: str | Path) -> bool:
    """Whether `state` names a PostgreSQL database rather than a SQLite file."""
    return str(state).startswith(URL_SCHEMES)


def state_exists(state: str | Path) -> bool:
    """Whether there is a history at `state` to read: a SQLite file that exists, or any PostgreSQL URL
    (opening it says whether the server answers)."""
    return is_url(state) or Path(state).exists()


def redact(state: str) -> str:
    """`state` fit for a message: a URL without its password (in its user part or its query)."""
    return hide_password(state) if is_url(state) else state


def cluster_name(configured: str | None = None) -> str:
    """The name a history writes on its rows: the one configured (`cluster_name`), else
    $SWEEPER_CLUSTER, else the kubeconfig's current context, else `default` (in a pod)."""
    from sweeper.kubeconfig import current_context

    return configured or os.environ.get("SWEEPER_CLUSTER") or current_context(os.environ.get("KUBECONFIG")) \
        or "default"


def _engine(state: str) -> Engine:
    """One engine per history, one connection held for its life (as a CronJob's run needs)."""
    if is_url(state):
        url = sa.engine.make_url(state)
        if url.drivername in ("postgresql", "postgres"):
            url = url.set(drivername="postgresql+psycopg")
        return sa.create_engine(url, poolclass=NullPool, connect_args={"connect_timeout": 10})
    if state != ":memory:":
        Path(state).parent.mkdir(parents=True, exist_ok=True)
    return sa.create_engine(f"sqlite:///{state}", poolclass=NullPool,
                            connect_args={"check_same_thread": False, "timeout": 30})


class Link:
    """The engine, the one connection and the lock that a history and its views share."""

    def __init__(self, state: str, cluster: str) -> None:
        self.state = state
        self.where = redact(state)
        self.lock = threading.RLock()
        self.depth = 0
        try:
            self.engine = _engine(state)
            self.conn: Connection = self.engine.connect()
        except (OSError, SQLAlchemyError) as exc:
            raise StateError(f"cannot open the history at {self.where}: {_reason(exc)}") from exc
        self.backend = self.conn.dialect.name  # 'sqlite' | 'postgresql'
        # Switching to WAL and migrating take locks that SQLite does not wait for through its busy
        # timeout; a second process opening a new file at the same moment retries here.
        for attempt in range(50):
            try:
                self._open(cluster)
                return
            except sa.exc.OperationalError as exc:
                if "locked" not in str(exc.orig) or attempt == 49:
                    self.conn.close()
                    raise StateError(f"cannot open the history at {self.where}: {_reason(exc)}") from exc
                time.sleep(0.1)
            except sa.exc.DatabaseError as exc:  # "file is not a database": a corrupt or foreign file
                self.conn.close()
                raise StateError(f"cannot open the history at {self.where}: {_reason(exc)} (a corrupt file, or "
                                 "not a Sweeper history)") from exc
            except StateError:
                self.conn.close()
                raise

    def _open(self, cluster: str) -> None:
        conn = self.conn
        with conn.begin():
            if self.backend == "sqlite":
                conn.exec_driver_sql("PRAGMA busy_timeout = 30000")
                # No SQL function runs from the file's own schema (a view, trigger or default) unless
                # it is harmless; and a file with objects the migrations never make is refused.
                conn.exec_driver_sql("PRAGMA trusted_schema = OFF")
            from sweeper.history.refusals import refuse_foreign_schema

            refuse_foreign_schema(conn, self.where)
        if self.backend == "sqlite" and conn.exec_driver_sql("PRAGMA journal_mode").scalar() != "wal":
            conn.exec_driver_sql("PRAGMA journal_mode = wal")
        conn.commit()
        with conn.begin():
            done = applied(conn)
        self._refuse_newer(done)
        if len(set(done)) < len(KNOWN):
            with conn.begin():
                # One opener migrates at a time; the others wait, then find nothing left to do.
                if self.backend == "sqlite":
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                else:
                    conn.execute(sa.text("select pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK})
                done = applied(conn)
                self._refuse_newer(done)
                empty = self.backend == "sqlite" and not done and not conn.exec_driver_sql(
                    "select count(*) from sqlite_master").scalar()
                if empty and _SQLITE_NEW is not None:
                    replay(conn, _SQLITE_NEW)
                    return
                migrate(conn, cluster)
                if empty:
                    _remember_new(sqlite_schema(conn))

    def _refuse_newer(self, done: list[str]) -> None:
        unknown = [n for n in done if n not in KNOWN]
        if unknown:
            raise StateError(f"{self.where} was written by a newer Sweeper (migrations {unknown} are unknown "
                             "to this version); upgrade Sweeper or point --state at another history")

    @contextmanager
    def transaction(self) -> Iterator[Connection]:
        """The connection, alone, inside one transaction: committed when the outermost caller is done,
        rolled back if it fails (a nested call joins the caller's)."""
        with self.lock:
            if self.depth:
                yield self.conn
                return
            self.depth += 1
            try:
                with self.conn.begin():
                    yield self.conn
            finally:
                self.depth -= 1


def _remember_new(statements: tuple[str, ...]) -> None:
    global _SQLITE_NEW  # noqa: PLW0603 - one schema for the process, set once
    _SQLITE_NEW = statements


def _reason(exc: BaseException) -> str:
    """A database error's own words, without SQLAlchemy's statement and parameters (which may quote
    what the history holds) or its help link."""
    if isinstance(exc, DBAPIError) and exc.orig is not None:
        return str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else type(exc.orig).__name__
    return str(exc).split("\n")[0]


F = TypeVar("F", bound=Callable[..., Any])


def locked(fn: F) -> F:
    """One connection is shared by the sweep's threads: each call holds it alone, in a transaction of
    its own, and a database error becomes a StateError."""
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            with self._link.transaction():
                return fn(self, *args, **kwargs)
        except SQLAlchemyError as exc:
            raise StateError(f"history {self._link.where}: {_reason(exc)}") from exc
    wrapper.__name__ = fn.__name__
    wrapper.__qualname__ = fn.__qualname__
    wrapper.__doc__ = fn.__doc__
    return wrapper  # type: ignore[return-value]


__all__ = ["KNOWN_TABLES", "MIGRATIONS_TABLE", "Link", "cluster_name", "is_url", "locked", "redact",
           "state_exists"]

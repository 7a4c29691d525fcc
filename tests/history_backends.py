"""The history tests' stores: each runs against a SQLite file and against a real PostgreSQL
server (never a mock). The server is the one $SWEEPER_TEST_POSTGRES_URL names (.ci/run starts one
from Debian's `postgresql` package where none answers), else the one on 127.0.0.1:5432. A
database of its own, randomly named, is made for the test session and dropped after; each test
gets a fresh schema in it. Where no server answers, the PostgreSQL cases skip, saying why.

tests/conftest.py names this module in `pytest_plugins`, so any test may ask for `new_state`,
`backend` or `postgres_database`."""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

DEFAULT_SERVER = "postgresql://postgres@127.0.0.1:5432/postgres"
BACKENDS = ("sqlite", "postgresql")


def _admin(url: str) -> Any:
    import sqlalchemy as sa

    u = sa.engine.make_url(url).set(drivername="postgresql+psycopg")
    return sa.create_engine(u, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 3})


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A PostgreSQL database made for this session (and dropped after): its URL."""
    import sqlalchemy as sa

    server = os.environ.get("SWEEPER_TEST_POSTGRES_URL") or DEFAULT_SERVER
    try:
        engine = _admin(server)
        with engine.connect() as conn:
            conn.execute(sa.text("select 1"))
    except Exception as exc:  # noqa: BLE001 - any reason the server cannot be used is a reason to skip
        pytest.skip(f"no PostgreSQL server answers at {sa.engine.make_url(server).render_as_string()} "
                    f"({str(exc).splitlines()[0]}); .ci/run starts one, or set SWEEPER_TEST_POSTGRES_URL")
    name = f"sweeper_test_{secrets.token_hex(6)}"
    with engine.connect() as conn:
        conn.execute(sa.text(f'create database "{name}"'))
    url = sa.engine.make_url(server).set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with engine.connect() as conn:
            conn.execute(sa.text(f'drop database if exists "{name}" with (force)'))
        engine.dispose()


def fresh_schema(database: str) -> str:
    """A new, empty schema in the session's database: the URL of a store that reads and writes it."""
    import sqlalchemy as sa

    schema = f"t_{secrets.token_hex(6)}"
    engine = _admin(database)
    with engine.connect() as conn:
        conn.execute(sa.text(f"create schema {schema}"))
    engine.dispose()
    return sa.engine.make_url(database).update_query_dict({"options": f"-csearch_path={schema}"}) \
        .render_as_string(hide_password=False)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def new_state(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """`new_state(name)`: where a new, empty history is, on this test's backend (a SQLite file named
    `name` in tmp_path, or a fresh PostgreSQL schema)."""
    if backend == "sqlite":
        return lambda name="h.db": str(tmp_path / name)
    database = request.getfixturevalue("postgres_database")
    return lambda name="h.db": fresh_schema(database)


def state_factory(backend: str, request: pytest.FixtureRequest, base: Path) -> Callable[[str], str]:
    """The same as new_state for a fixture of a wider scope (a module's `base` directory)."""
    if backend == "sqlite":
        return lambda name="h.db": str(base / name)
    database = request.getfixturevalue("postgres_database")
    return lambda name="h.db": fresh_schema(database)

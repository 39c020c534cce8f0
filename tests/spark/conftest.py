"""Every test starts with no pooled Kafka client (what a fresh Python worker has), no driver-side
preparation and no transaction-timeout guess kept from another test, and leaves no client behind
talking to a broker that its fixture has stopped."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.spark import sink
from oncelog.spark.clients import clear_all


@pytest.fixture(autouse=True)
def _no_pooled_clients() -> Iterator[None]:
    clear_all()
    sink._PREPARED.clear()
    sink._SIZED_MS.clear()
    yield
    clear_all()
    sink._PREPARED.clear()
    sink._SIZED_MS.clear()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A SQLite file, then a fresh PostgreSQL database (``postgres_url``; skipped without PostgreSQL)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))

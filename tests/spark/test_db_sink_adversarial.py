"""The database sinks against the cases a probe found them wrong in: a query id reused by a fresh
checkpoint, NULL keys, first batches racing on CREATE TABLE, a least-privilege PostgreSQL role,
NUL characters, in-memory and relative SQLite URLs, long PostgreSQL names, marker pruning, and one
target written twice in a batch. Each test drives ``apply`` directly (no Spark)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from oncelog.spark.foreach_batch import database_sink


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'db.sqlite'}"
    return str(request.getfixturevalue("postgres_url"))


def query(url: str, sql: str) -> list[tuple[Any, ...]]:
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            return conn.execute(sql).fetchall()
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute(sql).fetchall()


def test_a_reused_query_id_is_not_taken_for_a_replay(db_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A query restarted from a fresh checkpoint under the same query id writes batch 0 again: a
    later batch's marker exists, so it is no replay, even when the row counts happen to match."""
    old = database_sink(db_url, "totals", "totals-v1", key_columns=["account"])
    for b in range(3):
        assert old.apply([{"account": x, "total": 10 * (b + 1)} for x in "abc"], b)
    new = database_sink(db_url, "totals", "totals-v1", key_columns=["account"])
    with pytest.raises(RuntimeError, match=r"batch 2 is already applied while Spark writes batch 0"):
        new.apply([{"account": x, "total": 100} for x in "xyz"], 0)  # same row count as the old batch 0
    lenient = database_sink(db_url, "totals", "totals-v1", key_columns=["account"],
                            fail_on_higher_committed_batch=False)
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        assert not lenient.apply([{"account": "p", "total": 1}, {"account": "q", "total": 1}], 0), \
            "lenient mode skips such a batch, whatever its row count"
    assert "batch 2 already applied; skipping batch 0" in caplog.text
    assert query(db_url, "SELECT COUNT(*) FROM totals WHERE account IN ('x', 'y', 'z', 'p', 'q')") == [(0,)]

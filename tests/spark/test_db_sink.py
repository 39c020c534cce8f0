"""The idempotent SQLite sink: upsert by key, replayed batches skipped (no Spark needed)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from oncelog.spark.foreach_batch import SqliteUpsertSink, database_sink


def test_upsert_by_user_key_and_skip_replayed_batch(tmp_path: Path) -> None:
    sink = database_sink(f"sqlite:///{tmp_path / 'db.sqlite'}", "totals", "q", key_columns=["account"])
    assert sink.apply([{"account": "a", "total": 5}, {"account": "b", "total": 1}], 0)
    assert not sink.apply([{"account": "a", "total": 999}], 0), "a replayed batch must be skipped"
    assert sink.apply([{"account": "a", "total": 7}], 1)
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        assert dict(conn.execute("SELECT account, total FROM totals").fetchall()) == {"a": 7, "b": 1}
        assert conn.execute("SELECT COUNT(*) FROM oncelog_batches").fetchone() == (2,)


def test_kafka_coordinates_are_the_default_key(tmp_path: Path) -> None:
    sink = SqliteUpsertSink(tmp_path / "db.sqlite", "events", "q")
    row = {"topic": "t", "partition": 0, "offset": 3, "value": b"x"}
    sink.apply([row], 0)
    sink.apply([row, {**row, "offset": 4}], 1)
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        assert conn.execute("SELECT COUNT(*) FROM events").fetchone() == (2,)
    with pytest.raises(ValueError):
        sink.apply([{"value": 1}], 2)


def test_postgres_url_is_refused_explicitly(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError):
        database_sink("postgresql://localhost/db", "t", "q")

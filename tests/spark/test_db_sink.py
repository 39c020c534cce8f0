"""The idempotent database sinks, SQLite and a real PostgreSQL: upsert by key, replayed batches
skipped, racing attempts applied once, a failed batch rolled back (no Spark needed)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from oncelog.spark.foreach_batch import PostgresUpsertSink, SqliteUpsertSink, UpsertSink, database_sink
from tests.spark.db_helpers import query


def test_url_picks_the_backend(tmp_path: Path) -> None:
    assert isinstance(database_sink(f"sqlite:///{tmp_path}/a.db", "t", "q"), SqliteUpsertSink)
    assert isinstance(database_sink(str(tmp_path / "a.db"), "t", "q"), SqliteUpsertSink)
    assert isinstance(database_sink("postgresql://u@127.0.0.1:1/db", "t", "q"), PostgresUpsertSink)
    assert isinstance(database_sink("postgres://u@127.0.0.1:1/db", "t", "q"), PostgresUpsertSink)
    with pytest.raises(ValueError, match="unsupported database URL"):
        database_sink("mysql://localhost/db", "t", "q")
    with pytest.raises(ValueError, match="identifiers"):
        database_sink(str(tmp_path / "a.db"), "t; DROP TABLE x", "q")


def test_upsert_by_user_key_and_skip_replayed_batch(db_url: str) -> None:
    sink = database_sink(db_url, "totals", "q", key_columns=["account"])
    assert sink.apply([{"account": "a", "total": 5}, {"account": "b", "total": 1}], 0)
    assert not sink.apply([{"account": "a", "total": 999}, {"account": "b", "total": 0}], 0), \
        "a replayed batch (same row count) must be skipped, even with other values"
    assert sink.apply([{"account": "a", "total": 7}], 1)
    assert dict(query(db_url, "SELECT account, total FROM totals")) == {"a": 7, "b": 1}  # type: ignore[arg-type]
    assert query(db_url, "SELECT COUNT(*) FROM oncelog_sink_batches") == [(2,)]
    other = database_sink(db_url, "totals", "another-query", key_columns=["account"])
    assert other.apply([{"account": "c", "total": 3}], 0), "batch ids are per query"


def test_kafka_coordinates_are_the_default_key(db_url: str) -> None:
    sink = database_sink(db_url, "events", "q")
    row = {"topic": "t", "partition": 0, "offset": 3, "value": b"x", "ratio": 0.5, "ok": True}
    assert sink.apply([row], 0)
    assert sink.apply([row, {**row, "offset": 4, "value": bytearray(b"y")}], 1)
    got = query(db_url, 'SELECT "topic", "partition", "offset", "value" FROM events ORDER BY "offset"')
    assert [(t, p, o, bytes(v)) for t, p, o, v in got] == [("t", 0, 3, b"x"), ("t", 0, 4, b"y")]


def test_a_failed_batch_is_rolled_back_whole(db_url: str) -> None:
    sink = database_sink(db_url, "totals", "q", key_columns=["account"])
    sink.apply([{"account": "a", "total": 1}], 0)
    with pytest.raises(ValueError, match="key columns"):
        sink.apply([{"total": 2}], 1)
    with pytest.raises(ValueError, match="same columns"):
        sink.apply([{"account": "a", "total": 2}, {"account": "b", "other": 1}], 1)
    assert query(db_url, "SELECT COUNT(*) FROM oncelog_sink_batches") == [(1,)], "no marker for a failed batch"
    assert sink.apply([{"account": "a", "total": 2}], 1), "the retry of the failed batch is applied"
    assert dict(query(db_url, "SELECT account, total FROM totals")) == {"a": 2}  # type: ignore[arg-type]


def test_racing_attempts_of_one_batch_apply_it_once(db_url: str) -> None:
    """A zombie attempt and its retry write the same batch at the same time: one wins, one skips."""
    sinks = [database_sink(db_url, "totals", "q", key_columns=["account"]) for _ in range(4)]
    sinks[0].apply([{"account": "warmup", "total": 0}], 0)  # tables exist before the race
    results: list[bool] = []
    barrier = threading.Barrier(len(sinks))

    def attempt(s: UpsertSink, n: int) -> None:
        barrier.wait()
        results.append(s.apply([{"account": "a", "total": n}], 1))

    threads = [threading.Thread(target=attempt, args=(s, n)) for n, s in enumerate(sinks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(results) == [False, False, False, True]
    assert query(db_url, "SELECT COUNT(*) FROM oncelog_sink_batches WHERE batch_id = 1") == [(1,)]


def test_postgres_sink_reports_an_unreachable_server() -> None:
    import psycopg

    from oncelog.testing.broker_process import free_port

    sink = database_sink(f"postgresql://nobody@127.0.0.1:{free_port()}/db?connect_timeout=2", "t", "q")
    with pytest.raises(psycopg.OperationalError):
        sink.apply([{"topic": "t", "partition": 0, "offset": 0}], 0)


def test_two_tables_of_one_query_id_both_apply(db_url: str) -> None:
    """One query writing each batch to two tables under one query id: the second is not skipped."""
    first = database_sink(db_url, "t1", "q", key_columns=["k"])
    second = database_sink(db_url, "t2", "q", key_columns=["k"])
    assert first.apply([{"k": "a", "v": 1}], 0)
    assert second.apply([{"k": "a", "v": 2}], 0), "second table's batch skipped"
    assert query(db_url, "SELECT k, v FROM t2") == [("a", 2)]


def test_a_higher_applied_batch_fails_unless_accepted(db_url: str) -> None:
    sink = database_sink(db_url, "t", "q", key_columns=["k"])
    assert sink.apply([{"k": "a", "v": 1}], 5)
    with pytest.raises(RuntimeError, match=r"batch 5 is already applied while Spark writes batch 3.*rewound"):
        sink.apply([{"k": "a", "v": 9}], 3)
    lenient = database_sink(db_url, "t", "q", key_columns=["k"], fail_on_higher_committed_batch=False)
    assert not lenient.apply([{"k": "a", "v": 9}], 3)
    assert query(db_url, "SELECT k, v FROM t") == [("a", 1)]


def test_a_replay_with_another_row_count_fails(db_url: str) -> None:
    sink = database_sink(db_url, "t", "q", key_columns=["k"])
    assert sink.apply([{"k": "a"}, {"k": "b"}], 0)
    assert not sink.apply([{"k": "a"}, {"k": "b"}], 0)
    with pytest.raises(RuntimeError, match="applied with 2 rows but its replay has 3"):
        sink.apply([{"k": "a"}, {"k": "b"}, {"k": "c"}], 0)

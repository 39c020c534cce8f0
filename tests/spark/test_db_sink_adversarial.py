"""The database sinks against the cases a probe found them wrong in: a query id reused by a fresh
checkpoint, NULL keys, first batches racing on CREATE TABLE, a least-privilege PostgreSQL role,
NUL characters, in-memory and relative SQLite URLs, long PostgreSQL names, marker pruning, and one
target written twice in a batch. Each test drives ``apply`` directly (no Spark)."""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from oncelog.spark.foreach_batch import database_sink
from oncelog.testing.postgres import PostgresServer
from tests.spark.db_helpers import query


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


def test_null_is_a_key_value_like_any_other(db_url: str) -> None:
    """Spark's groupBy emits a NULL group, updated each batch: one row for it (SQLite held a new row
    per batch, PostgreSQL refused the batch for ever)."""
    totals = database_sink(db_url, "totals", "q", key_columns=["account"])
    for b in range(3):
        assert totals.apply([{"account": "a", "total": b + 1}, {"account": None, "total": 100 * (b + 1)}], b)
    assert sorted(query(db_url, "SELECT account, total FROM totals"), key=repr) == [("a", 3), (None, 300)]
    pairs = database_sink(db_url, "pairs", "q", key_columns=["k", "j"])  # NULL in one part of a composite key
    for b in range(2):
        assert pairs.apply([{"k": None, "j": 1, "v": b}, {"k": "a", "j": None, "v": b},
                            {"k": None, "j": None, "v": b}, {"k": "a", "j": 1, "v": b}], b)
    assert query(db_url, "SELECT COUNT(*), SUM(v) FROM pairs") == [(4, 4)]


def test_a_nan_key_in_sqlite_is_the_null_key(tmp_path: Path) -> None:
    sink = database_sink(str(tmp_path / "db.sqlite"), "t", "q", key_columns=["k"])
    assert sink.apply([{"k": float("nan"), "v": 1}], 0)
    assert sink.apply([{"k": float("nan"), "v": 2}], 1)
    assert sink.apply([{"k": None, "v": 3}, {"k": 0.0, "v": 4}], 2)
    with sqlite3.connect(tmp_path / "db.sqlite") as conn:
        assert sorted(conn.execute("SELECT k, v FROM t").fetchall(), key=repr) == [(0.0, 4), (None, 3)]


def test_an_old_sqlite_table_gets_the_null_key_index(tmp_path: Path) -> None:
    """A table created by the earlier sink (PRIMARY KEY) gets the index in its next batch; one that
    already holds repeated NULL keys fails saying which rows to delete, and rolls back."""
    db = tmp_path / "db.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute('CREATE TABLE "old" ("account", "total", PRIMARY KEY ("account"))')
        conn.execute("INSERT INTO old VALUES ('a', 1)")
        conn.execute('CREATE TABLE "dup" ("account", "total", PRIMARY KEY ("account"))')
        conn.executemany("INSERT INTO dup VALUES (?, ?)", [(None, 1), (None, 2)])
    old = database_sink(str(db), "old", "q", key_columns=["account"])
    for b in range(2):
        assert old.apply([{"account": "a", "total": 10 + b}, {"account": None, "total": 20 + b}], b)
    dup = database_sink(str(db), "dup", "q", key_columns=["account"])
    with pytest.raises(RuntimeError, match=r"several rows with one key.*delete the older duplicates"):
        dup.apply([{"account": None, "total": 3}], 0)
    with sqlite3.connect(db) as conn:
        assert sorted(conn.execute("SELECT * FROM old").fetchall(), key=repr) == [("a", 11), (None, 21)]
        assert conn.execute("SELECT COUNT(*) FROM oncelog_sink_batches WHERE target = 'dup'").fetchone() == (0,)
        conn.execute("DELETE FROM dup WHERE total = 1")
    assert dup.apply([{"account": None, "total": 3}], 0), "applied once the duplicates are gone"


def test_an_old_postgres_table_refuses_null_keys_clearly(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE old (account text PRIMARY KEY, total bigint)")
    sink = database_sink(postgres_url, "old", "q", key_columns=["account"])
    with pytest.raises(ValueError, match=r"\['account'\] are NULL.*NOT NULL.*NULLS NOT DISTINCT"):
        sink.apply([{"account": None, "total": 1}], 0)
    assert sink.apply([{"account": "a", "total": 1}], 0), "non-NULL keys still work"


def fresh_database(server: PostgresServer) -> str:
    import psycopg

    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return server.url.rsplit("/", 1)[0] + "/" + name


def test_first_batches_racing_on_postgres_create_table(postgres_server: PostgresServer) -> None:
    """Queries started together on a database the sink never used: their first batches create the
    markers table (and a shared table) at once. PostgreSQL does not serialise CREATE TABLE IF NOT
    EXISTS of one name: without a lock the losers failed (UniqueViolation on pg_type)."""
    errors: list[str] = []
    for trial in range(4):
        url = fresh_database(postgres_server)
        tables = [f"t{i}" for i in range(4)] if trial % 2 == 0 else ["shared"] * 4
        sinks = [database_sink(url, t, f"q{i}", key_columns=["k"]) for i, t in enumerate(tables)]
        barrier = threading.Barrier(len(sinks))

        def run(sink: Any, barrier: threading.Barrier) -> None:
            barrier.wait()
            try:
                sink.apply([{"k": "a", "v": 1}], 0)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}")

        threads = [threading.Thread(target=run, args=(s, barrier)) for s in sinks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert query(url, "SELECT COUNT(*) FROM oncelog_sink_batches") == [(4,)]


def test_a_least_privilege_postgres_role(postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A role with DML on tables created beforehand and no CREATE on the schema (PostgreSQL 15's
    default on public): every batch used to run CREATE TABLE IF NOT EXISTS and was refused."""
    import psycopg

    role = f"app_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"REVOKE CREATE ON SCHEMA public FROM PUBLIC, {role}")
        conn.execute("CREATE TABLE oncelog_sink_batches (target text, query_id text, batch_id bigint, rows bigint, "
                     "PRIMARY KEY (target, query_id, batch_id))")
        conn.execute("CREATE TABLE totals (account text PRIMARY KEY, total bigint)")
        conn.execute(f"GRANT SELECT, INSERT, UPDATE ON oncelog_sink_batches, totals TO {role}")
    url = postgres_url.replace("oncelog@", f"{role}@")
    sink = database_sink(url, "totals", "q", key_columns=["account"])
    assert sink.apply([{"account": "a", "total": 1}], 0)
    assert sink.apply([{"account": "a", "total": 2}], 1)
    assert not sink.apply([{"account": "a", "total": 2}], 1)
    assert query(postgres_url, "SELECT account, total FROM totals") == [("a", 2)]
    assert query(postgres_url, "SELECT COUNT(*) FROM oncelog_sink_batches") == [(2,)]
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):  # no DELETE granted: markers kept
        assert database_sink(url, "totals", "q", key_columns=["account"], retain_batches=1).apply(
            [{"account": "a", "total": 3}], 2)
    assert "no DELETE privilege" in caplog.text
    assert query(postgres_url, "SELECT COUNT(*) FROM oncelog_sink_batches") == [(3,)]
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # a missing table still needs CREATE
        database_sink(url, "other", "q", key_columns=["account"]).apply([{"account": "a"}], 0)


def test_a_schema_qualified_postgres_table(postgres_url: str) -> None:
    import psycopg

    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA analytics")
    sink = database_sink(postgres_url, "analytics.totals", "q", key_columns=["account"])
    assert sink.apply([{"account": "a", "total": 1}], 0)
    assert not sink.apply([{"account": "a", "total": 5}], 0)
    assert query(postgres_url, "SELECT account, total FROM analytics.totals") == [("a", 1)]
    assert query(postgres_url, "SELECT target, batch_id FROM analytics.oncelog_sink_batches") == \
        [("analytics.totals", 0)], "the markers live beside the table"
    assert query(postgres_url, "SELECT to_regclass('public.oncelog_sink_batches') IS NULL, "
                               "to_regclass('public.totals') IS NULL") == [(True, True)]
    for bad in ("a.b.c", "analytics.", "x.tot als"):
        with pytest.raises(ValueError, match=r"schema\.table"):
            database_sink(postgres_url, bad, "q")
    with pytest.raises(ValueError, match="identifiers"):
        database_sink("sqlite:///x.db", "main.totals", "q")  # SQLite: no schemas


def test_a_nul_character_in_postgres_text_is_explained(postgres_url: str) -> None:
    """A Kafka value cast to a string may hold NUL, which PostgreSQL text cannot: the batch failed
    at every attempt with a bare DataError; now the error names the table, column and the remedy."""
    sink = database_sink(postgres_url, "events", "q")
    row = {"topic": "t", "partition": 0, "offset": 0, "value": "a\x00b"}
    with pytest.raises(ValueError, match=r"'events'.*column 'value'.*NUL.*CAST\(value AS BINARY\)"):
        sink.apply([row], 0)
    assert query(postgres_url, "SELECT COUNT(*) FROM oncelog_sink_batches") == [(0,)], "rolled back"
    binary = database_sink(postgres_url, "events_bin", "q")
    assert binary.apply([{**row, "value": b"a\x00b"}], 0), "as binary it is stored losslessly"
    assert [bytes(v) for (v,) in query(postgres_url, "SELECT value FROM events_bin")] == [b"a\x00b"]
    with pytest.raises(ValueError, match="query id"):
        database_sink(postgres_url, "events", "q\x00")


def test_in_memory_sqlite_is_refused(tmp_path: Path) -> None:
    """Every batch would open a new in-memory database: a replay was applied again."""
    for url in ("sqlite:///:memory:", "sqlite://", ":memory:", ""):
        with pytest.raises(ValueError, match="in-memory"):
            database_sink(url, "t", "q", key_columns=["k"])


def test_sqlite_paths_follow_sqlalchemy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sqlite:///tmp/x.db is the relative path tmp/x.db (SQLAlchemy's convention), resolved when
    the sink is made; a file that cannot be opened is named by its resolved path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tmp").mkdir()
    sink = database_sink("sqlite:///tmp/x.db", "t", "q", key_columns=["k"])
    monkeypatch.chdir("/")
    assert sink.apply([{"k": 1}], 0)
    assert (tmp_path / "tmp" / "x.db").exists()
    monkeypatch.chdir(tmp_path)
    missing = database_sink("sqlite:///no/such/dir/x.db", "t", "q", key_columns=["k"])
    where = re.escape(f"cannot open the SQLite database {tmp_path}/no/such/dir/x.db")
    with pytest.raises(sqlite3.OperationalError, match=where):
        missing.apply([{"k": 1}], 0)


def test_postgres_names_longer_than_63_bytes_are_refused(tmp_path: Path) -> None:
    """PostgreSQL truncates identifiers to 63 bytes: two long table names were one table."""
    url = "postgresql://u@127.0.0.1:1/db"  # refused before any connection
    assert database_sink(url, "t" * 63, "q")
    assert database_sink(url, "s" * 63 + "." + "t" * 63, "q")
    for table, keys in (("t" * 63 + "_alpha", ["k"]), ("s" * 64 + ".t", ["k"]), ("é" * 32, ["k"]),
                        ("t", ["k" * 64])):
        with pytest.raises(ValueError, match="truncates names to 63 bytes"):
            database_sink(url, table, "q", key_columns=keys)
    with pytest.raises(ValueError, match="truncates names to 63 bytes"):
        database_sink(url, "t", "q", key_columns=["k"]).apply([{"k": 1, "v" * 64: 2}], 0)
    assert database_sink(str(tmp_path / "db.sqlite"), "t" * 100, "q", key_columns=["k"]).apply([{"k": 1}], 0), \
        "SQLite has no such limit"


def test_markers_are_pruned_and_the_later_batch_check_still_holds(db_url: str) -> None:
    """One marker per batch per sink was kept for ever; now those older than the newest
    ``retain_batches`` go in the batch's transaction, and the newest still stops a reused query id."""
    sink = database_sink(db_url, "t", "q", key_columns=["k"], retain_batches=3)
    other = database_sink(db_url, "t", "other", key_columns=["k"], retain_batches=3)
    for b in range(10):
        assert sink.apply([{"k": "a", "v": b}], b)
    assert other.apply([{"k": "b", "v": 0}], 0)
    assert query(db_url, "SELECT query_id, batch_id FROM oncelog_sink_batches ORDER BY 1, 2") == \
        [("other", 0), ("q", 7), ("q", 8), ("q", 9)], "only this sink's older markers go"
    assert not sink.apply([{"k": "a", "v": 99}], 9), "the replay of the newest batch is still skipped"
    with pytest.raises(RuntimeError, match="batch 9 is already applied while Spark writes batch 0"):
        sink.apply([{"k": "a", "v": 99}], 0)
    with pytest.raises(RuntimeError, match="batch 9 is already applied while Spark writes batch 8"):
        sink.apply([{"k": "a", "v": 99}], 8)
    with pytest.raises(ValueError, match="retain_batches"):
        database_sink(db_url, "t", "q", retain_batches=0)


def test_one_target_written_twice_in_a_batch_is_warned_about(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Two writes of one batch into one table under one query id: the second is taken for a replay
    (the documented rule: one write per table and query id per batch). The sink object that
    committed the batch itself says so; another object (a restarted driver's replay) does not."""
    url = str(tmp_path / "db.sqlite")
    to_db = database_sink(url, "events", "q")
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        assert to_db.apply([{"topic": "A", "partition": 0, "offset": 0}], 0)
        assert not to_db.apply([{"topic": "B", "partition": 0, "offset": 0}], 0)
    assert "batch 0 was applied by this sink object in this process and is written again" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        assert not database_sink(url, "events", "q").apply([{"topic": "A", "partition": 0, "offset": 0}], 0)
    assert caplog.text == ""
    assert database_sink(url, "events", "q-b").apply([{"topic": "B", "partition": 0, "offset": 0}], 0), \
        "a query id of its own per write: both are applied"


def test_a_recreated_topics_records_do_not_overwrite_rows_keyed_by_coordinates(db_url: str) -> None:
    """Rows keyed by Kafka coordinates (the default) were upserted, so a topic deleted and created
    again (its offsets start over) replaced the old topic's rows with its own: 300 + 100 records,
    300 rows (probe s37 s2c). They are now inserted and never overwritten: the same record written
    again passes (another query re-reading the topic, a copy in one batch), and other values under
    stored coordinates fail the batch, naming them, with nothing of it applied. A user key is
    still upserted."""
    def record(offset: int, tag: str, partition: int | None = 0) -> dict[str, Any]:
        return {"topic": "A", "partition": partition, "offset": offset, "value": f"{tag}-{offset}".encode(),
                "text": tag, "ratio": offset / 2, "ok": offset % 2 == 0}

    sink = database_sink(db_url, "events", "q")
    for b in range(3):
        assert sink.apply([record(o, "old") for o in range(100 * b, 100 * (b + 1))], b)
    with pytest.raises(RuntimeError, match=r"batch 3 writes the record at \{'topic': 'A', 'partition': 0, 'offset': "
                                           r"0\} with other values .*'text': 'old'.* stored, .*'text': 'new'"):
        sink.apply([record(o, "new") for o in range(100)], 3)
    assert query(db_url, "SELECT COUNT(*), MIN(text), MAX(text) FROM events") == [(300, "old", "old")]
    assert query(db_url, "SELECT MAX(batch_id) FROM oncelog_sink_batches WHERE query_id = 'q'") == [(2,)]
    again = database_sink(db_url, "events", "q-reread")
    assert again.apply([record(o, "old") for o in range(100)] + [record(0, "old")], 0), "the same records again"
    assert sink.apply([record(300, "old"), record(300, "old")], 3), "a copy of a record in one batch"
    with pytest.raises(RuntimeError, match="other values"):
        sink.apply([record(301, "old"), record(301, "new")], 4)
    assert sink.apply([record(7, "old", partition=None)], 4)
    with pytest.raises(RuntimeError, match="other values"):
        sink.apply([record(7, "new", partition=None)], 5)
    assert query(db_url, "SELECT COUNT(*), MIN(text), MAX(text) FROM events") == [(302, "old", "old")]
    totals = database_sink(db_url, "totals", "q", key_columns=["topic", "partition"])
    assert totals.apply([{"topic": "A", "partition": 0, "total": 1}], 0)
    assert totals.apply([{"topic": "A", "partition": 0, "total": 2}], 1)
    assert query(db_url, "SELECT total FROM totals") == [(2,)]

"""``foreachBatch`` helpers: the sink protocol for update-mode queries, and an idempotent DB sink.

A Python streaming sink accepts append and complete output modes only; stateful queries in update
mode go through ``foreachBatch``. :func:`kafka_foreach_batch` runs the very same per-task protocol
as the ``oncelog`` sink (see :mod:`oncelog.spark.sink`), with the batch id Spark hands to the
function and a ``query_id`` the caller keeps stable across restarts (Spark does not expose its own
query id to the foreachBatch function reliably).

:class:`SqliteUpsertSink` is the "write to a system with unique keys" approach: rows are upserted by
(topic, partition, offset) or by a user key, and the batch id is recorded in the same database
transaction, so a replayed batch is skipped and a non-idempotent write is still applied once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from oncelog.spark.guarantees import Guarantee
from oncelog.spark.sink import SinkCommitMessage, SinkSettings, TaskIdentity, records_from_rows, write_partition


def kafka_foreach_batch(bootstrap: str, topic: str, query_id: str, guarantee: str = "exactly_once",
                        options: Mapping[str, str] | None = None) -> Callable[[Any, int], None]:
    """A ``foreachBatch`` function writing each micro-batch to ``topic`` under ``guarantee``.

    The DataFrame needs a ``value`` column (and optionally key, topic, partition, headers). Its
    partitioning must be the same when Spark replays a batch (true for the output of a shuffle or a
    stateful operator), because the skip-on-replay decision is made per (batch, partition).
    """
    opts = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "processing.guarantee": guarantee,
            **(options or {})}
    settings = SinkSettings.from_options(opts)
    if settings.guarantee is not Guarantee.at_least_once:
        settings.progress().ensure_topic()

    def write_batch(df: Any, batch_id: int) -> None:
        s = settings

        def task(index: int, rows: Iterator[Any]) -> Iterator[SinkCommitMessage]:
            yield write_partition(records_from_rows(rows), TaskIdentity(query_id, int(batch_id), index), s)

        df.rdd.mapPartitionsWithIndex(task).collect()

    return write_batch


class SqliteUpsertSink:
    """``foreachBatch`` sink into SQLite: upsert by key columns, batch ids recorded atomically.

    Table ``table`` gets the DataFrame's columns (created on first use, all typed loosely); the
    primary key is ``key_columns`` (default: Kafka's coordinates topic, partition, offset). Table
    ``oncelog_batches(query_id, batch_id)`` records applied batches. Runs on the driver: the batch is
    collected, which suits the small, aggregated outputs this is meant for.
    """

    def __init__(self, path: str | Path, table: str, query_id: str,
                 key_columns: Sequence[str] = ("topic", "partition", "offset")) -> None:
        self.path = str(path)
        self.table = table
        self.query_id = query_id
        self.key_columns = list(key_columns)
        if not table.isidentifier() or not all(c.isidentifier() for c in self.key_columns):
            raise ValueError("table and key column names must be plain identifiers")

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = [r.asDict() if hasattr(r, "asDict") else dict(r) for r in df.collect()]
        self.apply(rows, int(batch_id))

    def apply(self, rows: list[dict[str, Any]], batch_id: int) -> bool:
        """Upsert ``rows`` as batch ``batch_id``; False if that batch was applied before."""
        conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("CREATE TABLE IF NOT EXISTS oncelog_batches (query_id TEXT, batch_id INTEGER, "
                         "PRIMARY KEY (query_id, batch_id))")
            seen = conn.execute("SELECT 1 FROM oncelog_batches WHERE query_id = ? AND batch_id = ?",
                                (self.query_id, batch_id)).fetchone()
            if seen:
                conn.execute("ROLLBACK")
                return False
            if rows:
                cols = list(rows[0])
                missing = [k for k in self.key_columns if k not in cols]
                if missing:
                    raise ValueError(f"rows lack key columns {missing}")
                if not all(c.isidentifier() for c in cols):
                    raise ValueError("column names must be plain identifiers")
                conn.execute(f"CREATE TABLE IF NOT EXISTS {self.table} ({', '.join(cols)}, "
                             f"PRIMARY KEY ({', '.join(self.key_columns)}))")
                updates = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in self.key_columns)
                conflict = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
                conn.executemany(
                    f"INSERT INTO {self.table} ({', '.join(cols)}) VALUES ({', '.join('?' for _ in cols)}) "
                    f"ON CONFLICT ({', '.join(self.key_columns)}) {conflict}",
                    [tuple(_sqlite_value(r.get(c)) for c in cols) for r in rows])
            conn.execute("INSERT INTO oncelog_batches VALUES (?, ?)", (self.query_id, batch_id))
            conn.execute("COMMIT")
            return True
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            conn.close()


def _sqlite_value(v: Any) -> Any:
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    if v is None or isinstance(v, (int, float, str, bytes)):
        return v
    return str(v)


def database_sink(url: str, table: str, query_id: str,
                  key_columns: Sequence[str] = ("topic", "partition", "offset")) -> SqliteUpsertSink:
    """``sqlite:///path`` (or a bare path). PostgreSQL URLs are not supported yet (no driver here)."""
    if url.startswith(("postgresql:", "postgres:")):
        raise NotImplementedError("PostgreSQL sink not implemented yet: needs a PostgreSQL driver (psycopg)")
    path = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url
    return SqliteUpsertSink(path, table, query_id, key_columns)

"""``foreachBatch`` helpers: the sink protocol for update-mode queries, and an idempotent DB sink.

A Python streaming sink accepts append and complete output modes only; stateful queries in update
mode go through ``foreachBatch``. :func:`kafka_foreach_batch` runs the very same per-task protocol
as the ``oncelog`` sink (see :mod:`oncelog.spark.sink`), with the batch id Spark hands to the
function and a ``query_id`` the caller keeps stable across restarts (Spark does not expose its own
query id to the foreachBatch function reliably).

:mod:`oncelog.spark.db_sink` (re-exported here) is the "write to a system with unique keys"
approach: rows are upserted into SQLite or PostgreSQL by (topic, partition, offset) or by a user key,
and the batch id is recorded in the same database transaction, so a replayed batch is skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from oncelog.spark.db_sink import PostgresUpsertSink, SqliteUpsertSink, UpsertSink, database_sink
from oncelog.spark.guarantees import Guarantee
from oncelog.spark.sink import SinkCommitMessage, SinkSettings, TaskIdentity, records_from_rows, write_partition

__all__ = ["PostgresUpsertSink", "SqliteUpsertSink", "UpsertSink", "database_sink", "kafka_foreach_batch"]


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

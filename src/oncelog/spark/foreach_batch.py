"""``foreachBatch`` helpers: the sink protocol for update-mode queries, and idempotent DB sinks.

A Python streaming sink accepts append and complete output modes only; stateful queries in update
mode go through ``foreachBatch``. :func:`kafka_foreach_batch` runs the very same per-task protocol
as the ``oncelog`` sink (see :mod:`oncelog.spark.sink`), with the batch id Spark hands to the
function and a ``query_id`` the caller keeps stable across restarts (Spark does not expose its own
query id to the foreachBatch function reliably). Its identity is ``(query_id, topic)``: one query
may write each batch to several topics (and tables) under one query id.

:mod:`oncelog.spark.db_sink` (re-exported here) is the "write to a system with unique keys"
approach: rows are upserted into SQLite or PostgreSQL by (topic, partition, offset) or by a user key,
and the batch id is recorded in the same database transaction, so a replayed batch is skipped.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import Any

from oncelog.spark.db_sink import PostgresUpsertSink, SqliteUpsertSink, UpsertSink, database_sink
from oncelog.spark.guarantees import Guarantee
from oncelog.spark.options import get_option
from oncelog.spark.sink import (
    ArrowRecords,
    CommitSummary,
    SinkHooks,
    SinkSettings,
    TaskIdentity,
    check_output_schema,
    compacted_inputs,
    records_from_rows,
    summarize,
    write_partition,
)

__all__ = ["KafkaForeachBatch", "PostgresUpsertSink", "SqliteUpsertSink", "UpsertSink", "database_sink",
           "kafka_foreach_batch"]


class KafkaForeachBatch:
    """The callable :func:`kafka_foreach_batch` returns: ``fn(df, batch_id)``.

    Runs one task per partition of ``df``, each writing its partition with :func:`write_partition`,
    and keeps the batch's :class:`~oncelog.spark.sink.CommitSummary` in ``last_commit``. Classic
    Spark: through the RDD of rows (no pandas needed). Spark Connect has no RDD API: there it goes
    through ``DataFrame.mapInArrow`` (same partitions; needs pandas, which a Connect client has).
    """

    def __init__(self, settings: SinkSettings, query_id: str, hooks: SinkHooks | None = None,
                 checkpoint: str | None = None) -> None:
        if not query_id:
            raise ValueError("kafka_foreach_batch needs a non-empty query_id, stable across restarts")
        self.settings = settings
        self.query_id = query_id
        self.hooks = hooks
        #: the query's checkpoint location (option ``checkpointLocation``), where the input topics
        #: of each batch are found (:func:`~oncelog.spark.sink.compacted_inputs`)
        self.checkpoint = checkpoint
        self.last_commit: CommitSummary | None = None

    def batch_settings(self, batch_id: int) -> SinkSettings:
        """The settings for batch ``batch_id``'s tasks: with the input topics found compacted in its
        offset log entry, when the checkpoint location is known (exactly_once only)."""
        if self.checkpoint is None or self.settings.guarantee is not Guarantee.exactly_once:
            return self.settings
        return replace(self.settings, compacted_inputs=compacted_inputs(
            self.checkpoint, self.settings.client, self.settings.connect_timeout_s, batch_id))

    def task_function(self, batch_id: int) -> Callable[[Iterator[Any]], Iterator[Any]]:
        settings, hooks, query_id = self.batch_settings(batch_id), self.hooks, self.query_id

        def task(batches: Iterator[Any]) -> Iterator[Any]:
            import pyarrow as pa
            from pyspark import TaskContext

            tc = TaskContext.get()
            ident = TaskIdentity(query_id, batch_id, tc.partitionId() if tc is not None else 0,
                                 tc.attemptNumber() if tc is not None else 0)
            msg = write_partition(ArrowRecords(batches), ident, settings, hooks)
            yield pa.RecordBatch.from_pydict({"message": [pickle.dumps(msg)]},
                                             schema=pa.schema([("message", pa.binary())]))

        return task

    def row_task_function(self, batch_id: int) -> Callable[[int, Iterator[Any]], Iterator[Any]]:
        settings, hooks, query_id = self.batch_settings(batch_id), self.hooks, self.query_id

        def task(index: int, rows: Iterator[Any]) -> Iterator[Any]:
            from pyspark import TaskContext

            tc = TaskContext.get()
            ident = TaskIdentity(query_id, batch_id, index, tc.attemptNumber() if tc is not None else 0)
            yield write_partition(records_from_rows(rows), ident, settings, hooks)

        return task

    def __call__(self, df: Any, batch_id: int) -> None:
        check_output_schema(df.schema, topic_option=self.settings.topic is not None)
        if type(df).__module__.startswith("pyspark.sql.connect"):
            rows = df.mapInArrow(self.task_function(int(batch_id)), "message binary").collect()
            messages = [pickle.loads(r.message) for r in rows]
        else:
            messages = df.rdd.mapPartitionsWithIndex(self.row_task_function(int(batch_id))).collect()
        self.last_commit = summarize(messages, int(batch_id),
                                     f"kafka_foreach_batch {self.settings.sink_id(self.query_id)} "
                                     f"({self.settings.guarantee})")


def kafka_foreach_batch(bootstrap: str, topic: str, query_id: str, guarantee: str = "exactly_once",
                        options: Mapping[str, str] | None = None,
                        hooks: SinkHooks | None = None) -> KafkaForeachBatch:
    """A ``foreachBatch`` function writing each micro-batch to ``topic`` under ``guarantee``.

    The DataFrame needs a ``value`` column (and optionally key, topic, partition, headers). Its
    partitioning must be the same when Spark replays a batch (true for the output of a shuffle or a
    stateful operator), because the skip-on-replay decision is made per (batch, partition); a replay
    whose partition holds other rows (another count, or another digest) fails instead of being
    skipped. ``options`` takes the sink's options (``progress.topic``, ``kafka.*``, ...), and the
    query's ``checkpointLocation``: given it, a replay with fewer rows is skipped when the batch's
    input topics are compacted, as by the ``oncelog`` sink (docs/design/spark-sink.md). ``hooks`` is
    for tests and the demo. The progress topic is created or adopted (with its partition count)
    here, on the driver.
    """
    opts = {"kafka.bootstrap.servers": bootstrap, "topic": topic, "processing.guarantee": guarantee,
            **(options or {})}
    settings = SinkSettings.from_options(opts).prepare()
    return KafkaForeachBatch(settings, query_id, hooks, get_option(opts, "checkpointLocation"))

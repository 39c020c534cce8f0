"""The `oncelog` Spark sink: micro-batch output to Kafka with a chosen delivery guarantee.

Every task writes one Spark partition of one micro-batch with :func:`write_partition`, identified by
``TaskIdentity(query_id, batch_id, partition_id)``. Spark's query id is stored in the checkpoint, so
it is the same after a restart; on replay Spark re-plans the same batch id over the same input
offsets, so (batch_id, partition_id) names the same output. The protocol per guarantee is in
:mod:`oncelog.spark.guarantees` and docs/design/spark-sink.md.

Output rows carry ``value`` (binary or string, required) and optionally ``key``, ``topic`` (else the
``topic`` option), ``partition`` and ``headers`` (array of struct<key string, value binary>).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from oncelog.spark.guarantees import Guarantee, producer_config
from oncelog.spark.options import client_config, get_int, get_option
from oncelog.spark.progress import DEFAULT_PARTITIONS, DEFAULT_TOPIC, ProgressLog, progress_key, progress_value

#: (key, value, topic, partition, headers) — the shape every writer reduces its input to.
OutRecord = tuple[bytes | None, bytes | None, str | None, int | None, list[tuple[str, bytes]] | None]

try:  # pragma: no cover - exercised only with pyspark installed
    from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
except ImportError:  # pragma: no cover
    DataSourceStreamArrowWriter = WriterCommitMessage = object  # type: ignore[assignment,misc]


@dataclass(frozen=True)
class TaskIdentity:
    query_id: str
    batch_id: int
    partition_id: int


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What a task reports to the driver; ``skipped`` means the pair was already committed."""

    query_id: str
    batch_id: int
    partition_id: int
    rows: int
    skipped: bool
    guarantee: str
    transactional_id: str | None = None


@dataclass(frozen=True)
class SinkSettings:
    """Everything a task needs, parsed on the driver and shipped with the writer."""

    client: dict[str, Any]
    guarantee: Guarantee
    topic: str | None
    progress_topic: str = DEFAULT_TOPIC
    progress_partitions: int = DEFAULT_PARTITIONS
    transactional_id_prefix: str = "oncelog-spark-"
    transaction_timeout_ms: int = 60_000
    timeout_s: float = 120.0
    #: fault injection for tests and the demo: pause after the output is flushed, before it commits.
    delay_before_commit_ms: int = 0

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkSettings:
        return cls(
            client=client_config(options),
            guarantee=Guarantee.parse(get_option(options, "processing.guarantee")),
            topic=get_option(options, "topic"),
            progress_topic=get_option(options, "progress.topic", DEFAULT_TOPIC) or DEFAULT_TOPIC,
            progress_partitions=get_int(options, "progress.partitions", DEFAULT_PARTITIONS) or DEFAULT_PARTITIONS,
            transactional_id_prefix=get_option(options, "transactional.id.prefix", "oncelog-spark-") or "",
            transaction_timeout_ms=get_int(options, "transaction.timeout.ms", 60_000) or 60_000,
            timeout_s=(get_int(options, "timeout.ms", 120_000) or 120_000) / 1000,
            delay_before_commit_ms=get_int(options, "fault.delayBeforeCommitMs", 0) or 0,
        )

    def progress(self) -> ProgressLog:
        return ProgressLog(self.client, self.progress_topic, self.progress_partitions, self.timeout_s)

    def transactional_id(self, ident: TaskIdentity) -> str:
        """Stable per (query, partition): a retry, a replay after restart and a zombie all share it,
        so ``init_transactions()`` of the newest attempt fences every older one."""
        return f"{self.transactional_id_prefix}{ident.query_id}-{ident.partition_id}"


def _as_bytes(v: Any) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, (bytearray, memoryview)):
        return bytes(v)
    return str(v).encode()


def _headers(v: Any) -> list[tuple[str, bytes]] | None:
    if not v:
        return None
    out = []
    for h in v:
        k, val = (h["key"], h["value"]) if isinstance(h, Mapping) else (h[0], h[1])
        out.append((str(k), _as_bytes(val) or b""))
    return out


def records_from_arrow(batches: Iterable[Any]) -> Iterator[OutRecord]:
    for batch in batches:
        names = batch.schema.names
        if "value" not in names:
            raise ValueError("the oncelog sink needs a 'value' column")
        cols = {n: batch.column(n).to_pylist() for n in ("key", "value", "topic", "partition", "headers")
                if n in names}
        n = batch.num_rows
        none = [None] * n
        for k, v, t, p, h in zip(cols.get("key", none), cols["value"], cols.get("topic", none),
                                 cols.get("partition", none), cols.get("headers", none), strict=True):
            yield _as_bytes(k), _as_bytes(v), t, p, _headers(h)


def records_from_rows(rows: Iterable[Any]) -> Iterator[OutRecord]:
    for row in rows:
        d = row.asDict() if hasattr(row, "asDict") else dict(row)
        if "value" not in d:
            raise ValueError("the oncelog sink needs a 'value' column")
        yield (_as_bytes(d.get("key")), _as_bytes(d["value"]), d.get("topic"), d.get("partition"),
               _headers(d.get("headers")))


class _Delivery:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def __call__(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))


def _produce_all(producer: Any, records: Iterable[OutRecord], default_topic: str | None,
                 on_delivery: _Delivery | None) -> int:
    n = 0
    for key, value, topic, partition, headers in records:
        target = topic or default_topic
        if not target:
            raise ValueError("no topic: set option 'topic' or add a 'topic' column")
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = int(partition)
        if headers:
            kwargs["headers"] = headers
        if on_delivery is not None:
            kwargs["on_delivery"] = on_delivery
        while True:
            try:
                producer.produce(target, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
        n += 1
        if n % 1000 == 0:
            producer.poll(0)
    return n


def write_partition(records: Iterable[OutRecord], ident: TaskIdentity, settings: SinkSettings) -> SinkCommitMessage:
    """Write one (batch, partition) under ``settings.guarantee``; runs on an executor.

    exactly_once: init_transactions (fences older attempts of this (query, partition) and completes
    or aborts their transaction) -> read the progress log -> skip if this batch is committed ->
    begin -> output + progress record -> commit. The transaction commits in the task, so the
    batch's output is visible once its last task committed, before Spark's own commit log says so;
    a replay finds the progress records and writes nothing.
    """
    from confluent_kafka import Producer

    g = settings.guarantee
    progress = settings.progress()
    tid = settings.transactional_id(ident) if g is Guarantee.exactly_once else None
    conf = producer_config(g, settings.client, tid, settings.transaction_timeout_ms)
    key = progress_key(ident.query_id, ident.partition_id)
    ppart = progress.partition_for(ident.partition_id)

    def message(rows: int, skipped: bool) -> SinkCommitMessage:
        if skipped:
            # Spark streams the task's input to this worker; reading it to the end keeps the worker
            # protocol in step (and the worker reusable) even though nothing is written.
            for _ in records:
                pass
        return SinkCommitMessage(ident.query_id, ident.batch_id, ident.partition_id, rows, skipped, g.value, tid)

    if g is Guarantee.exactly_once:
        producer = Producer(conf)
        producer.init_transactions(settings.timeout_s)
        if progress.last_committed(ident.query_id, ident.partition_id) >= ident.batch_id:
            return message(0, True)
        producer.begin_transaction()
        try:
            rows = _produce_all(producer, records, settings.topic, None)
            producer.produce(progress.topic, key=key.encode(), value=progress_value(ident.batch_id, rows),
                             partition=ppart)
            if settings.delay_before_commit_ms:
                producer.flush(settings.timeout_s)
                time.sleep(settings.delay_before_commit_ms / 1000)
            producer.commit_transaction(settings.timeout_s)
        except BaseException:
            try:
                producer.abort_transaction(10)
            except Exception:  # fenced or broker gone: the coordinator aborts it (fencing/timeout)
                pass
            raise
        return message(rows, False)

    if g is Guarantee.at_most_once:
        if progress.last_committed(ident.query_id, ident.partition_id) >= ident.batch_id:
            return message(0, True)
        # The mark goes first and synchronously: after a crash the replay is skipped, never repeated.
        marker = Producer(producer_config(Guarantee.at_least_once, settings.client, None, 0))
        done = _Delivery()
        marker.produce(progress.topic, key=key.encode(), value=progress_value(ident.batch_id, -1),
                       partition=ppart, on_delivery=done)
        if marker.flush(settings.timeout_s) or done.errors:
            raise RuntimeError(f"progress record not written: {done.errors}")
        if settings.delay_before_commit_ms:
            # The window in which a crash loses the batch: marked done, output not yet sent.
            time.sleep(settings.delay_before_commit_ms / 1000)
        producer = Producer(conf)
        rows = _produce_all(producer, records, settings.topic, None)
        producer.flush(settings.timeout_s)
        return message(rows, False)

    producer = Producer(conf)
    done = _Delivery()
    rows = _produce_all(producer, records, settings.topic, done)
    if producer.flush(settings.timeout_s) or done.errors:
        raise RuntimeError(f"{len(done.errors)} records not delivered: {done.errors[:3]}")
    if settings.delay_before_commit_ms:
        time.sleep(settings.delay_before_commit_ms / 1000)
    return message(rows, False)


def current_task_identity() -> TaskIdentity:
    """(query id, batch id, partition id) of the running Spark streaming write task."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        raise RuntimeError("not inside a Spark task")
    query_id = tc.getLocalProperty("sql.streaming.queryId")
    batch_id = tc.getLocalProperty("streaming.sql.batchId")
    if not query_id or batch_id is None:
        raise RuntimeError("the oncelog sink runs only in a streaming query (no query or batch id)")
    return TaskIdentity(query_id, int(batch_id), tc.partitionId())


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """``write`` runs on executors (one call per task); ``commit``/``abort`` on the driver."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.settings = SinkSettings.from_options(options)
        self.last_commit: tuple[int, int, int] | None = None
        if self.settings.guarantee is not Guarantee.at_least_once:
            progress = self.settings.progress()
            progress.ensure_topic()
            self.settings = _with_partitions(self.settings, progress.partitions)

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return write_partition(records_from_arrow(iterator), current_task_identity(), self.settings)

    def commit(self, messages: list[Any], batchId: int) -> None:
        # Visibility already happened in the tasks (exactly_once) or needs nothing (the others);
        # the driver only keeps counts for observability.
        got = [m for m in messages if m is not None]
        self.last_commit = (batchId, sum(m.rows for m in got), sum(1 for m in got if m.skipped))

    def abort(self, messages: list[Any], batchId: int) -> None:
        # Open transactions of failed tasks are aborted when the retry (or the replay after a
        # restart) calls init_transactions with the same transactional id, or by the broker's
        # transaction timeout if the query never comes back.
        return None


def _with_partitions(settings: SinkSettings, partitions: int) -> SinkSettings:
    from dataclasses import replace

    return replace(settings, progress_partitions=partitions)

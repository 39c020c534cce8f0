"""The `oncelog` Spark sink: micro-batch output to Kafka with a chosen delivery guarantee.

Every task writes one Spark partition of one micro-batch with :func:`write_partition`, identified by
``TaskIdentity(query_id, batch_id, partition_id)`` and the sink's target (the ``topic`` option, or
``*`` when rows carry their topic). Spark's query id is stored in the checkpoint, so it is the same
after a restart; on replay Spark re-plans the same batch id over the same input offsets, so
(batch_id, partition_id) names the same output. The protocol per guarantee is in
:mod:`oncelog.spark.guarantees` and docs/design/spark-sink.md.

Output rows carry ``value`` (binary or string, required) and optionally ``key``, ``topic`` (used when
there is no ``topic`` option, which overrides it, as in Spark's Kafka sink), ``partition`` and
``headers`` (array of struct<key string, value binary>).

Fault injection is not an option: tests and the demo pass a :class:`SinkHooks` to
:func:`write_partition` (or subclass :class:`KafkaStreamWriter`, see ``oncelog.demo.fault_sink``).
"""

from __future__ import annotations

import logging
import os
import pickle
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import IO, Any

from oncelog.spark.guarantees import Guarantee, marker_config, producer_config, transaction_timeout_ms
from oncelog.spark.options import (
    DEFAULT_CONNECT_TIMEOUT_MS,
    SINK_OPTIONS,
    check_client_config,
    check_known,
    client_config,
    get_bool,
    get_int,
    get_option,
)
from oncelog.spark.progress import (
    DEFAULT_PARTITIONS,
    DEFAULT_TOPIC,
    SNAPSHOT_KEY,
    Committed,
    ProgressLog,
    progress_key,
    progress_value,
    sink_identity,
)

log = logging.getLogger("oncelog.spark")

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
    """What a task reports to the driver; ``skipped`` means the pair was already committed
    (``reason`` says how: ``replay`` — this very batch, row count checked — or ``higher`` — a later
    batch, accepted because failOnHigherCommittedBatch=false)."""

    query_id: str
    batch_id: int
    partition_id: int
    rows: int
    skipped: bool
    guarantee: str
    transactional_id: str | None = None
    target: str = ""
    reason: str = ""


@dataclass(frozen=True)
class CommitSummary:
    """The driver's view of one committed micro-batch."""

    batch_id: int
    rows: int
    written: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)


class SinkHooks:
    """Injection points for tests and the demo, called on the executor; the defaults do nothing.

    ``before_commit`` runs at the moment a crash hurts each guarantee most: exactly_once — output
    and progress record flushed, transaction still open; at_least_once — output acknowledged, Spark
    not yet told; at_most_once — batch marked committed, output not yet sent. ``after_commit`` runs
    once the task's work is durable, before its message goes back to Spark.
    """

    def before_commit(self, ident: TaskIdentity, guarantee: Guarantee) -> None:
        return None

    def after_commit(self, ident: TaskIdentity, message: SinkCommitMessage) -> None:
        return None


@dataclass(frozen=True)
class SinkSettings:
    """Everything a task needs, parsed on the driver and shipped with the writer."""

    client: dict[str, Any]
    guarantee: Guarantee
    topic: str | None
    progress_topic: str = DEFAULT_TOPIC
    progress_partitions: int = DEFAULT_PARTITIONS
    transactional_id_prefix: str = "oncelog-spark-"
    #: None: sized per task from the spooled input (:func:`~oncelog.spark.guarantees.transaction_timeout_ms`)
    transaction_timeout_ms: int | None = None
    timeout_s: float = 120.0
    progress_replication_factor: int = -1
    fail_on_higher_committed_batch: bool = True
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_MS / 1000

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SinkSettings:
        check_known(options, SINK_OPTIONS, "sink")
        return cls(
            client=client_config(options),
            guarantee=Guarantee.parse(get_option(options, "processing.guarantee")),
            topic=get_option(options, "topic") or None,
            progress_topic=get_option(options, "progress.topic", DEFAULT_TOPIC) or DEFAULT_TOPIC,
            progress_partitions=get_int(options, "progress.partitions", DEFAULT_PARTITIONS, minimum=1)
            or DEFAULT_PARTITIONS,
            transactional_id_prefix=get_option(options, "transactional.id.prefix", "oncelog-spark-") or "",
            transaction_timeout_ms=get_int(options, "transaction.timeout.ms", None, minimum=1000),
            timeout_s=(get_int(options, "timeout.ms", 120_000, minimum=1) or 120_000) / 1000,
            progress_replication_factor=_replication_factor(options),
            fail_on_higher_committed_batch=get_bool(options, "failOnHigherCommittedBatch", True),
            connect_timeout_s=(get_int(options, "connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS, minimum=1)
                               or DEFAULT_CONNECT_TIMEOUT_MS) / 1000,
        )

    @property
    def target(self) -> str:
        """What the sink writes to: its topic, or ``*`` when each row names its topic."""
        return self.topic or "*"

    def sink_id(self, query_id: str) -> str:
        return sink_identity(query_id, self.target)

    def progress(self) -> ProgressLog:
        return ProgressLog(self.client, self.progress_topic, self.progress_partitions, self.timeout_s,
                           self.progress_replication_factor)

    def transactional_id(self, ident: TaskIdentity) -> str:
        """Stable per (sink, partition): a retry, a replay after restart and a zombie all share it,
        so ``init_transactions()`` of the newest attempt fences every older one. Topic names have
        no ``/``, so ``query/target/partition`` read from the right is unambiguous."""
        return f"{self.transactional_id_prefix}{self.sink_id(ident.query_id)}/{ident.partition_id}"

    def prepare(self) -> SinkSettings:
        """Driver side, once per query start (and per commit): check the ``kafka.*`` settings, reach
        the cluster within ``connect_timeout_s``, and create or adopt the progress topic."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        from oncelog.spark.progress import admin_config, connect_error

        check_client_config(self.client, producer=True)
        admin = AdminClient(admin_config(self.client))
        if not self.guarantee.uses_progress:
            try:
                admin.list_topics(timeout=self.connect_timeout_s)
            except KafkaException as exc:
                raise connect_error(str(self.client.get("bootstrap.servers")), self.connect_timeout_s, exc,
                                    "connectTimeoutMs") from None
            return self
        progress = self.progress()
        partitions = progress.ensure_topic(admin, self.connect_timeout_s)
        if partitions != self.progress_partitions:
            log.info("progress topic %s has %d partitions; using them (progress.partitions=%d ignored)",
                     self.progress_topic, partitions, self.progress_partitions)
        return replace(self, progress_partitions=partitions)


def _replication_factor(options: Mapping[str, str]) -> int:
    rf = get_int(options, "progress.replicationFactor", -1)
    if rf is None or rf == -1:
        return -1
    if rf < 1:
        raise ValueError(f"option 'progress.replicationFactor' must be -1 (the cluster's default) or >= 1, not {rf}")
    return rf


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


class Spool:
    """A task's input, taken in full before any transaction opens: chunks in memory up to
    ``memory_bytes``, the rest pickled to a temporary file (in Spark's local dir when known).

    Spooling puts the upstream computation (reading the source, transforming) outside the
    transaction, so the transaction lasts only as long as producing, and its timeout can be sized
    from the row count; it also gives the row count a replay is checked against.
    """

    CHUNK_ROWS = 4096

    def __init__(self, memory_bytes: int = 64 << 20) -> None:
        self.memory_bytes = memory_bytes
        self.rows = 0
        self.nbytes = 0
        self._chunks: list[list[OutRecord]] = []
        self._in_memory = 0
        self._file: IO[bytes] | None = None

    def extend(self, records: Iterable[OutRecord]) -> None:
        chunk: list[OutRecord] = []
        for rec in records:
            chunk.append(rec)
            size = len(rec[0] or b"") + len(rec[1] or b"") + sum(len(k) + len(v) for k, v in rec[4] or ())
            self.nbytes += size
            self._in_memory += size + 64
            if len(chunk) >= self.CHUNK_ROWS:
                self._add(chunk)
                chunk = []
        if chunk:
            self._add(chunk)

    def _add(self, chunk: list[OutRecord]) -> None:
        self.rows += len(chunk)
        self._chunks.append(chunk)
        if self._in_memory > self.memory_bytes:
            if self._file is None:
                local = (os.environ.get("SPARK_LOCAL_DIRS") or "").split(",")[0] or None
                self._file = tempfile.TemporaryFile(prefix="oncelog-spool-", dir=local)  # noqa: SIM115
            for c in self._chunks:
                pickle.dump(c, self._file, protocol=pickle.HIGHEST_PROTOCOL)
            self._chunks = []
            self._in_memory = 0

    def __iter__(self) -> Iterator[OutRecord]:
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            while True:
                try:
                    chunk = pickle.load(self._file)
                except EOFError:
                    break
                yield from chunk
        for chunk in self._chunks:
            yield from chunk

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._chunks = []

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        target = default_topic or topic  # as in Spark's Kafka sink, the topic option overrides the column
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


def flush(producer: Any, timeout_s: float, what: str, clock: Any = time.monotonic) -> None:
    """Flush until nothing is in flight; TimeoutError naming the undelivered count if nothing was
    delivered for ``timeout_s`` (a stall timeout: a large batch may take longer in total)."""
    remaining = len(producer)
    last_move = clock()
    while remaining > 0:
        now_remaining = producer.flush(min(1.0, timeout_s))
        if now_remaining < remaining:
            last_move = clock()
        remaining = now_remaining
        if remaining > 0 and clock() - last_move > timeout_s:
            raise TimeoutError(f"{what}: {remaining} records still undelivered after {timeout_s:g}s without "
                               "progress (option timeout.ms)")


def close_producer(producer: Any) -> None:
    """Release a producer now (threads, sockets) instead of whenever a traceback lets go of it;
    anything still queued belongs to a failed attempt and is dropped."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "abort_transaction failed during close" of a fenced producer
            if len(producer):
                producer.purge()
            producer.close()
    except Exception:  # closing a fenced or broken producer must not hide the original error
        pass


def _check_replay(last: Committed | None, ident: TaskIdentity, rows: int, settings: SinkSettings) -> str:
    """'' to write; 'replay' or 'higher' to skip; raises when skipping or writing would be wrong."""
    if last is None or last.batch_id < ident.batch_id:
        return ""
    where = (f"sink {settings.sink_id(ident.query_id)} partition {ident.partition_id} "
             f"(progress topic {settings.progress_topic})")
    if last.batch_id > ident.batch_id:
        if settings.fail_on_higher_committed_batch:
            raise RuntimeError(
                f"{where}: batch {last.batch_id} is already committed while Spark writes batch {ident.batch_id}. "
                "Spark never replays below its last committed batch, so the checkpoint was rewound or restored "
                "from an older copy, or another query reuses this query id (foreachBatch helpers: the query_id "
                "argument). Writing would duplicate output and skipping would drop this batch. Use a new "
                "checkpoint or query id, or set failOnHigherCommittedBatch=false to skip every batch up to "
                f"{last.batch_id} (their output stays as first written).")
        log.warning("%s: batch %d already committed; skipping batch %d (failOnHigherCommittedBatch=false)",
                    where, last.batch_id, ident.batch_id)
        return "higher"
    if last.rows >= 0 and last.rows != rows:
        raise RuntimeError(
            f"{where}: batch {ident.batch_id} was committed with {last.rows} rows but its replay has {rows}. "
            "The replay is not the same data (a non-deterministic expression such as rand() or "
            "current_timestamp(), failOnDataLoss=false with records removed by retention, or changed "
            "partitioning), so neither skipping nor writing it again would be exactly once.")
    return "replay"


def write_partition(records: Iterable[OutRecord], ident: TaskIdentity, settings: SinkSettings,
                    hooks: SinkHooks | None = None) -> SinkCommitMessage:
    """Write one (batch, partition) under ``settings.guarantee``; runs on an executor.

    exactly_once: spool the input -> init_transactions (fences older attempts of this sink
    partition and completes or aborts their transaction) -> read the progress log -> skip if this
    batch is committed with the same row count (fail if the count differs or a later batch is
    committed) -> begin -> output + progress record -> commit. The transaction commits in the
    task, so the batch's output is visible once its last task committed, before Spark's own commit
    log says so; a replay finds the progress records and writes nothing.

    at_most_once: the same, but the transaction holds only the progress record, and the output
    follows it with acks=0.
    """
    from confluent_kafka import Producer

    hooks = hooks or SinkHooks()
    g = settings.guarantee
    if g is Guarantee.at_least_once:
        return _write_at_least_once(records, ident, settings, hooks)

    with Spool() as spool:
        spool.extend(records)  # the upstream computation runs now, outside any transaction
        tid = settings.transactional_id(ident)
        timeout_ms = transaction_timeout_ms(spool.rows, spool.nbytes, settings.transaction_timeout_ms)

        def message(rows: int, reason: str) -> SinkCommitMessage:
            return SinkCommitMessage(ident.query_id, ident.batch_id, ident.partition_id, rows, bool(reason),
                                     g.value, tid, settings.target, reason)

        producer = Producer(marker_config(settings.client, tid, timeout_ms))
        try:
            return _write_with_progress(producer, spool, ident, settings, hooks, message, tid, timeout_ms)
        finally:
            close_producer(producer)


def _write_with_progress(producer: Any, spool: Spool, ident: TaskIdentity, settings: SinkSettings,
                         hooks: SinkHooks, message: Any, tid: str, timeout_ms: int) -> SinkCommitMessage:
    from confluent_kafka import KafkaError, KafkaException, Producer

    g = settings.guarantee
    progress = settings.progress()
    key = progress_key(settings.sink_id(ident.query_id), ident.partition_id)
    try:
        producer.init_transactions(settings.timeout_s)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            raise RuntimeError(
                f"the broker refused transaction.timeout.ms={timeout_ms} for {spool.rows} rows (above its "
                "transaction.max.timeout.ms): set option transaction.timeout.ms, or lower "
                "maxOffsetsPerTrigger so micro-batches are smaller") from exc
        raise RuntimeError(f"transactional id {tid} at {settings.client.get('bootstrap.servers')}: "
                           f"init_transactions failed (timeout.ms={settings.timeout_s * 1000:g}): {exc}") from exc
    state = progress.read(ident.partition_id)
    reason = _check_replay(state.latest.get(key), ident, spool.rows, settings)
    if reason:
        msg: SinkCommitMessage = message(0 if reason == "higher" else spool.rows, reason)
        hooks.after_commit(ident, msg)
        return msg
    producer.begin_transaction()
    try:
        if g is Guarantee.exactly_once:
            _produce_all(producer, spool, settings.topic, None)
        producer.produce(progress.topic, key=key.encode(), partition=progress.partition_for(ident.partition_id),
                         value=progress_value(ident.batch_id, spool.rows, progress.partitions))
        if progress.snapshot_due(state):
            snapshot = progress.snapshot_record(state)
            if snapshot is not None:
                producer.produce(progress.topic, key=SNAPSHOT_KEY.encode(), value=snapshot,
                                 partition=progress.partition_for(ident.partition_id))
        if g is Guarantee.exactly_once:
            flush(producer, settings.timeout_s, f"transaction {tid}")
            hooks.before_commit(ident, g)
        producer.commit_transaction(settings.timeout_s)
    except BaseException:
        try:
            producer.abort_transaction(10)
        except Exception:  # fenced or broker gone: the coordinator aborts it (fencing/timeout)
            pass
        raise
    if g is Guarantee.at_most_once:
        # The window in which a crash loses the batch: marked committed, output not yet sent.
        hooks.before_commit(ident, g)
        out = Producer(producer_config(g, settings.client, None, 0))
        try:
            done = _Delivery()
            _produce_all(out, spool, settings.topic, done)
            flush(out, settings.timeout_s, f"at_most_once output of {key}")
        finally:
            close_producer(out)
        if done.errors:
            raise RuntimeError(f"{len(done.errors)} records not sent (at_most_once: not retried): {done.errors[:3]}")
    msg = message(spool.rows, "")
    hooks.after_commit(ident, msg)
    return msg


def _write_at_least_once(records: Iterable[OutRecord], ident: TaskIdentity, settings: SinkSettings,
                         hooks: SinkHooks) -> SinkCommitMessage:
    from confluent_kafka import Producer

    producer = Producer(producer_config(Guarantee.at_least_once, settings.client, None, 0))
    try:
        done = _Delivery()
        rows = _produce_all(producer, records, settings.topic, done)
        flush(producer, settings.timeout_s, f"at_least_once output of partition {ident.partition_id}")
    finally:
        close_producer(producer)
    if done.errors:
        raise RuntimeError(f"{len(done.errors)} of {rows} records not delivered: {done.errors[:3]}")
    hooks.before_commit(ident, Guarantee.at_least_once)
    msg = SinkCommitMessage(ident.query_id, ident.batch_id, ident.partition_id, rows, False,
                            Guarantee.at_least_once.value, None, settings.target, "")
    hooks.after_commit(ident, msg)
    return msg


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


def summarize(messages: Iterable[Any], batch_id: int, what: str) -> CommitSummary:
    """Count a batch's commit messages and log them; a replay that skipped partitions is a warning."""
    got = [m for m in messages if m is not None]
    summary = CommitSummary(batch_id, sum(m.rows for m in got if not m.skipped),
                            sorted(m.partition_id for m in got if not m.skipped),
                            sorted(m.partition_id for m in got if m.skipped))
    if summary.skipped:
        log.warning("%s batch %d: partitions %s were already committed and skipped (replay), partitions %s "
                    "written (%d rows)", what, batch_id, summary.skipped, summary.written, summary.rows)
    else:
        log.info("%s batch %d: partitions %s written (%d rows)", what, batch_id, summary.written, summary.rows)
    return summary


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """``write`` runs on executors (one call per task); ``commit``/``abort`` on the driver.

    Spark builds a fresh writer for every commit, so the driver keeps nothing between batches here.
    ``hooks`` is for subclasses in tests and the demo; no option sets it.
    """

    hooks: SinkHooks | None = None

    def __init__(self, options: Mapping[str, str]) -> None:
        self.settings = SinkSettings.from_options(options).prepare()
        self.last_commit: CommitSummary | None = None

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        return write_partition(records_from_arrow(iterator), current_task_identity(), self.settings, self.hooks)

    def commit(self, messages: list[Any], batchId: int) -> None:
        # Visibility already happened in the tasks (exactly_once) or needs nothing (the others); the
        # driver reports what the tasks did, skipped partitions included.
        query = next((m.query_id for m in messages if m is not None), "?")
        self.last_commit = summarize(messages, batchId,
                                     f"oncelog sink {self.settings.sink_id(query)} ({self.settings.guarantee})")

    def abort(self, messages: list[Any], batchId: int) -> None:
        # Open transactions of failed tasks are aborted when the retry (or the replay after a
        # restart) calls init_transactions with the same transactional id, or by the broker's
        # transaction timeout if the query never comes back.
        return None

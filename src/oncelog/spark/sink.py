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

import itertools
import json
import logging
import operator
import os
import pickle
import re
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any, cast
from urllib.parse import urlsplit

from oncelog.spark.clients import ClientPool, config_key, settle_worker
from oncelog.spark.guarantees import (
    BASE_TRANSACTION_TIMEOUT_MS,
    Guarantee,
    marker_config,
    producer_config,
    transaction_timeout_ms,
)
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
    SNAPSHOT_EVERY,
    SNAPSHOT_KEY,
    Committed,
    PartitionState,
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
    """Which (query, batch, partition) a task writes; ``attempt`` is Spark's attempt number of the
    task (a retry or a speculative copy is above 0). Two attempts of one partition are the same
    identity: they share its transactional id and progress."""

    query_id: str
    batch_id: int
    partition_id: int
    attempt: int = field(default=0, compare=False)


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
    #: seconds per phase of the task (spool, init, progress, produce, flush, commit, ...), and
    #: whether its producer was reused from an earlier task in the same Python worker
    phases: dict[str, float] = field(default_factory=dict)
    reused_producer: bool = False


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
    #: False: a committed batch whose replay is not the same data (other count or digest) is skipped
    #: with a warning instead of failing the task (a query known not to be deterministic)
    fail_on_changed_replay: bool = True
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_MS / 1000
    #: keep a task's transactional producer in its Python worker for the next task of the same sink
    #: partition (see :class:`PooledProducer`); off by default: Spark hands a partition's tasks to
    #: its Python workers in turn, so the producer found is mostly one a newer task elsewhere has
    #: fenced, and finding that out costs more than it saves (docs/design/spark-sink.md, Performance)
    reuse_transactional_producers: bool = False
    #: input topics found compacted (:func:`compacted_inputs`, on the driver): a committed batch
    #: whose replay has fewer rows is then skipped, its records taken to be compacted away
    compacted_inputs: tuple[str, ...] = ()

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
            fail_on_changed_replay=get_bool(options, "failOnChangedReplay", True),
            connect_timeout_s=(get_int(options, "connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS, minimum=1)
                               or DEFAULT_CONNECT_TIMEOUT_MS) / 1000,
            reuse_transactional_producers=get_bool(options, "reuseTransactionalProducers", False),
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
        the cluster within ``connect_timeout_s``, and create or adopt the progress topic.

        Spark makes a new writer for every micro-batch; the checks ran for the first one, so later
        ones in the same process reuse the result (about 60 ms a batch: a producer, an admin client
        and two metadata requests). A progress topic deleted meanwhile is not created again: tasks
        then fail reading it, where an empty new one would have lost the progress it held."""
        cache_key = repr(self)
        with _PREPARED_LOCK:
            done = _PREPARED.get(cache_key)
        if done is not None:
            return done
        prepared = self._prepare()
        with _PREPARED_LOCK:
            _PREPARED[cache_key] = prepared
        return prepared

    def _check_output_topic(self, admin: Any) -> None:
        """Reach the cluster within ``connect_timeout_s`` (ConnectionError naming it otherwise), and
        check that the ``topic`` option's topic can be written: it exists, or the cluster creates it
        on use (this metadata request asks for that, as a producer's first one would). Otherwise the
        query fails at its start naming the topic, instead of each task waiting for its records to
        time out (``UNKNOWN_TOPIC_OR_PART`` for 30 s, under exactly_once reported as "N message(s)
        failed delivery"). Topics named in a ``topic`` column are met by the tasks."""
        from confluent_kafka import KafkaError, KafkaException

        from oncelog.spark.progress import connect_error

        try:  # topic=None: every topic's metadata, which proves only that the cluster answers
            md = admin.list_topics(topic=self.topic, timeout=self.connect_timeout_s)
        except KafkaException as exc:
            raise connect_error(str(self.client.get("bootstrap.servers")), self.connect_timeout_s, exc,
                                "connectTimeoutMs") from None
        if not self.topic:
            return
        found = md.topics.get(self.topic)
        error = found.error if found is not None else KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)
        if error is None or error.code() == KafkaError.LEADER_NOT_AVAILABLE:  # just made on use
            return
        if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
            raise ValueError(f"the output topic {self.topic!r} does not exist, and the cluster does not create "
                             f"topics on use: create it first (e.g. oncelog topics create {self.topic})")
        raise ValueError(f"the output topic {self.topic!r} cannot be written: {error.str()}")

    def _prepare(self) -> SinkSettings:
        from confluent_kafka.admin import AdminClient

        from oncelog.spark.progress import admin_config

        check_client_config(self.client, producer=True)
        admin = AdminClient(admin_config(self.client))
        if not self.guarantee.uses_progress:
            self._check_output_topic(admin)  # reaches the cluster too
            return self
        progress = self.progress()
        partitions = progress.ensure_topic(admin, self.connect_timeout_s)
        self._check_output_topic(admin)
        if partitions != self.progress_partitions:
            log.info("progress topic %s has %d partitions; using them (progress.partitions=%d ignored)",
                     self.progress_topic, partitions, self.progress_partitions)
        return replace(self, progress_partitions=partitions)


#: Settings already prepared in this process (driver side), by their repr.
_PREPARED: dict[str, SinkSettings] = {}
_PREPARED_LOCK = threading.Lock()


#: (bootstrap servers, topics) -> (monotonic time, the compacted ones): Spark makes a writer for
#: every commit, in reused Python workers; the topics' configs are asked at most once a minute.
_COMPACTED: dict[tuple[str, frozenset[str]], tuple[float, tuple[str, ...]]] = {}
_COMPACTED_TTL_S = 60.0


def _local_path(location: str) -> Path | None:
    """A checkpoint location this process can read: a plain path or a ``file:`` URI (not hdfs:, s3a:, ...)."""
    if location.startswith("file:"):
        return Path(urlsplit(location).path)
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", location):
        return None
    return Path(location)


def _topics_in(value: Any, into: set[str]) -> None:
    """Topic names of Kafka offsets (``{topic: {partition: offset}}``, the format of this source and
    of Spark's Kafka source) anywhere in a JSON value of Spark's offset log."""
    if not isinstance(value, dict):
        return
    if value and all(isinstance(v, dict) and v and all(isinstance(p, str) and p.lstrip("-").isdigit()
                                                         and type(o) is int for p, o in v.items())
                     for v in value.values()):
        into.update(str(t) for t in value)
        return
    for v in value.values():
        _topics_in(v, into)


def offset_log_topics(checkpoint: str, batch_id: int | None = None) -> set[str]:
    """The Kafka topics named by the query's offset log entry for ``batch_id`` (default: the newest
    entry, the batch Spark runs or replays next); empty when there is none or it cannot be read."""
    root = _local_path(checkpoint)
    if root is None:
        return set()
    offsets = root / "offsets"
    try:
        if batch_id is None:
            entries = [int(f) for f in os.listdir(offsets) if f.isdigit()]
            if not entries:
                return set()
            batch_id = max(entries)
        lines = (offsets / str(batch_id)).read_text().splitlines()
    except (OSError, ValueError):
        return set()
    topics: set[str] = set()
    for line in lines[1:]:  # the first is the format version ("v1")
        try:
            _topics_in(json.loads(line), topics)
        except ValueError:
            continue
    return topics


def compacted_inputs(checkpoint: str | None, client: Mapping[str, Any], timeout_s: float,
                     batch_id: int | None = None) -> tuple[str, ...]:
    """Driver side: the query's input topics (:func:`offset_log_topics`) whose ``cleanup.policy``
    includes ``compact``, asked of the sink's cluster; () when that cannot be established (no
    checkpoint location among the options, one on another file system, topics on another cluster,
    the cluster unreachable). The sink skips a committed batch's replay with fewer rows only for
    such a query (:func:`_check_replay`)."""
    if not checkpoint:
        return ()
    topics = frozenset(offset_log_topics(checkpoint, batch_id))
    if not topics:
        return ()
    cache_key = (str(client.get("bootstrap.servers")), topics)
    now = time.monotonic()
    with _PREPARED_LOCK:
        cached = _COMPACTED.get(cache_key)
    if cached is not None and now - cached[0] < _COMPACTED_TTL_S:
        return cached[1]
    from confluent_kafka.admin import AdminClient, ConfigResource

    from oncelog.spark.progress import admin_config

    found: list[str] = []
    try:
        admin = AdminClient(admin_config(dict(client)))
        futures = admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, t) for t in sorted(topics)],
                                         request_timeout=timeout_s)
        for resource, future in futures.items():
            try:
                policy = future.result(timeout=timeout_s).get("cleanup.policy")
            except Exception:  # a topic this cluster does not have (the input may be on another)
                continue
            if policy is not None and "compact" in str(policy.value or ""):
                found.append(resource.name)
    except Exception as exc:
        log.info("input topics %s: cleanup.policy not known (%s)", sorted(topics), exc)
        return ()
    result = tuple(sorted(found))
    with _PREPARED_LOCK:
        _COMPACTED[cache_key] = (now, result)
    return result


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


#: The columns a sink reads, and the types Spark's Kafka sink allows for each (``simpleString``).
OUTPUT_COLUMN_TYPES = {
    "key": ("string", "binary"),
    "value": ("string", "binary"),
    "topic": ("string",),
    "partition": ("int",),
    "headers": ("array<struct<key:string,value:binary>>",),
}


def check_output_schema(schema: Any, topic_option: bool) -> None:
    """Spark's Kafka sink's checks of the rows' schema (``KafkaWriter.validateQuery``), made when the
    query starts: a ``value`` column, a ``topic`` column unless the topic option is set, and each
    column the sink reads of a type it takes as it is. Raises ValueError naming the column. (A
    value of another type used to be sent as its ``str()``: an int as its digits, a struct as
    ``Row(...)``.) Other columns are ignored, as in Spark."""
    types = {f.name: f.dataType.simpleString() for f in schema.fields}
    if "value" not in types:
        raise ValueError("the oncelog sink needs a 'value' column (string or binary)")
    if not topic_option and "topic" not in types:
        raise ValueError("the oncelog sink needs the 'topic' option or a 'topic' column")
    for name, allowed in OUTPUT_COLUMN_TYPES.items():
        if name in types and types[name] not in allowed:
            if name == "topic" and topic_option:
                continue  # the option overrides the column, whatever it holds (as in Spark)
            cast = f": cast it, e.g. CAST({name} AS {allowed[-1].upper()})" if name != "headers" else ""
            raise ValueError(f"the oncelog sink's {name!r} column must be {' or '.join(allowed)}, not "
                             f"{types[name]}{cast}")


def records_from_rows(rows: Iterable[Any]) -> Iterator[OutRecord]:
    for row in rows:
        d = row.asDict() if hasattr(row, "asDict") else dict(row)
        if "value" not in d:
            raise ValueError("the oncelog sink needs a 'value' column")
        yield (_as_bytes(d.get("key")), _as_bytes(d["value"]), d.get("topic"), d.get("partition"),
               _headers(d.get("headers")))


class ArrowRecords:
    """A task's input as pyarrow RecordBatches, kept as Arrow all the way to ``produce``: the sink's
    fast path (no per-row tuple; column values come out of Arrow in one call per column). Iterating
    it yields :data:`OutRecord` tuples, for code that wants rows."""

    def __init__(self, batches: Iterable[Any]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[OutRecord]:
        return records_from_arrow(self.batches)


_BYTES_TYPES = ("binary", "large_binary", "string", "large_string")


def _column_values(col: Any) -> list[Any]:
    """A column as produce() arguments: bytes or str (librdkafka takes str as UTF-8), None for null."""
    if str(col.type) in _BYTES_TYPES:
        return col.to_pylist()  # one C-level pass (pyarrow builds the bytes; ~0.25 us a value)
    return [_as_bytes(v) for v in col.to_pylist()]


def _produce_when_full(producer: Any, *args: Any, **kwargs: Any) -> None:
    while True:
        producer.poll(0.05)
        try:
            producer.produce(*args, **kwargs)
            return
        except BufferError:
            continue


def _produce_arrow(producer: Any, batch: Any, default_topic: str | None) -> int:
    names = batch.schema.names
    if "value" not in names:
        raise ValueError("the oncelog sink needs a 'value' column")
    values = _column_values(batch.column(names.index("value")))
    keys: Iterable[Any] = (_column_values(batch.column(names.index("key"))) if "key" in names
                           else itertools.repeat(None))
    produce = producer.produce
    if default_topic is not None and "partition" not in names and "headers" not in names:
        # The tight loop: positional arguments, no per-row dict or tuple of ours.
        for v, k in zip(values, keys, strict=False):
            try:
                produce(default_topic, v, k)
            except BufferError:
                _produce_when_full(producer, default_topic, v, k)
        producer.poll(0)
        return len(values)
    n = len(values)
    topics = batch.column(names.index("topic")).to_pylist() if "topic" in names else itertools.repeat(None)
    parts = batch.column(names.index("partition")).to_pylist() if "partition" in names else itertools.repeat(None)
    heads = batch.column(names.index("headers")).to_pylist() if "headers" in names else itertools.repeat(None)
    _produce_all(producer, zip(keys, values, topics, parts, (_headers(h) for h in heads), strict=False),
                 default_topic)
    return n


#: An odd 64-bit constant (2**64 / golden ratio) that spreads ``Σh`` over the digest's bits.
_DIGEST_MULTIPLIER = 0x9E3779B97F4A7C15


def _digest_rows(batch: Any, names: list[str]) -> list[bytes]:
    """Each row's ``value + b"\\xff" + key`` (null as empty; strings as UTF-8, as produce sends them),
    joined by Arrow in one pass."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def column(name: str) -> Any:
        col = batch.column(names.index(name))
        if str(col.type) not in _BYTES_TYPES:
            col = pa.array([_as_bytes(v) for v in col.to_pylist()], pa.large_binary())
        return col.cast(pa.large_binary())

    key = column("key") if "key" in names else pa.scalar(b"", pa.large_binary())
    joined = pc.binary_join_element_wise(column("value"), key, pa.scalar(b"\xff", pa.large_binary()),
                                         null_handling="replace", null_replacement=b"")
    return cast(list[bytes], joined.to_pylist())


class Spool:
    """A task's input, taken in full before any transaction opens: chunks in memory up to
    ``memory_bytes``, the rest pickled to a temporary file (in Spark's local dir when known).

    Spooling puts the upstream computation (reading the source, transforming) outside the
    transaction, so the transaction lasts only as long as producing, and its timeout can be sized
    from the row count; it also gives the row count and the digest a replay is checked against.

    Arrow input (:class:`ArrowRecords`) is kept as the RecordBatches Spark handed over (counted by
    their buffer sizes); rows (:data:`OutRecord`) in chunks of lists.

    :attr:`digest` is an order-independent digest of the rows' keys and values, taken in the same
    pass: for each row ``h = crc32(value + b"\\xff" + key)`` (a null key or value counts as empty),
    and the digest combines ``Σh`` and ``Σh²`` (mod 2**64). Sums, because a replay after a shuffle
    may hand the rows over in another order; the squares, because CRC32 is linear, so the plain sum
    of CRCs of rows that trade equal-length pieces can agree (``{a-1, b-2}`` and ``{a-2, b-1}`` have
    equal XORs of CRCs). Arrow input: Arrow joins each row's value and key, and the CRCs and sums
    run in C loops (``map``) over one bytes object a row: 0.13 s of process CPU per 200,000 rows
    of 110 bytes, against 0.58 s for the whole task without it (docs/design/spark-sink.md).
    """

    CHUNK_ROWS = 4096

    def __init__(self, memory_bytes: int = 64 << 20) -> None:
        self.memory_bytes = memory_bytes
        self.rows = 0
        self.nbytes = 0
        self._sum = 0
        self._sum_squares = 0
        self._chunks: list[Any] = []
        self._in_memory = 0
        self._file: IO[bytes] | None = None

    def add(self, records: Iterable[OutRecord] | ArrowRecords) -> None:
        if isinstance(records, ArrowRecords):
            self.extend_arrow(records.batches)
        else:
            self.extend(records)

    @property
    def digest(self) -> int:
        """The rows' digest so far (see the class); 0 for no rows."""
        return (self._sum * _DIGEST_MULTIPLIER + self._sum_squares) % (1 << 64)

    def extend(self, records: Iterable[OutRecord]) -> None:
        chunk: list[OutRecord] = []
        crc32 = zlib.crc32
        for rec in records:
            chunk.append(rec)
            h = crc32(b"\xff" + (rec[0] or b""), crc32(rec[1] or b""))
            self._sum += h
            self._sum_squares += h * h
            size = len(rec[0] or b"") + len(rec[1] or b"") + sum(len(k) + len(v) for k, v in rec[4] or ())
            self.nbytes += size
            self._in_memory += size + 64
            if len(chunk) >= self.CHUNK_ROWS:
                self._add(chunk)
                chunk = []
        if chunk:
            self._add(chunk)

    def extend_arrow(self, batches: Iterable[Any]) -> None:
        for batch in batches:
            names = batch.schema.names
            if "value" not in names:
                raise ValueError("the oncelog sink needs a 'value' column")
            if not batch.num_rows:
                continue
            size = sum(batch.column(names.index(n)).nbytes for n in ("key", "value", "headers") if n in names)
            self.nbytes += size
            self._in_memory += batch.nbytes
            crcs = list(map(zlib.crc32, _digest_rows(batch, names)))
            self._sum += sum(crcs)
            self._sum_squares += sum(map(operator.mul, crcs, crcs))
            self._add(batch)

    def _add(self, chunk: Any) -> None:
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

    def chunks(self) -> Iterator[Any]:
        """Lists of rows and RecordBatches, in input order."""
        if self._file is not None:
            self._file.flush()
            self._file.seek(0)
            while True:
                try:
                    yield pickle.load(self._file)
                except EOFError:
                    break
        yield from self._chunks

    def __iter__(self) -> Iterator[OutRecord]:
        for chunk in self.chunks():
            yield from (chunk if isinstance(chunk, list) else records_from_arrow([chunk]))

    def produce(self, producer: Any, default_topic: str | None) -> int:
        return produce_records(producer, self.chunks(), default_topic)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        self._chunks = []

    def __enter__(self) -> Spool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def produce_records(producer: Any, chunks: Iterable[Any], default_topic: str | None) -> int:
    """Produce every record of ``chunks`` (RecordBatches, lists of :data:`OutRecord`, or single
    :data:`OutRecord` tuples); the number produced."""
    n = 0
    rows: list[OutRecord] = []
    for chunk in chunks:
        if isinstance(chunk, tuple):
            rows.append(chunk)
            if len(rows) >= Spool.CHUNK_ROWS:
                n += _produce_all(producer, rows, default_topic)
                rows = []
            continue
        if rows:
            n += _produce_all(producer, rows, default_topic)
            rows = []
        n += _produce_all(producer, chunk, default_topic) if isinstance(chunk, list) else \
            _produce_arrow(producer, chunk, default_topic)
    if rows:
        n += _produce_all(producer, rows, default_topic)
    return n


class _Delivery:
    """Delivery reports of one task: errors, and the offset of the last record delivered."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.offset = -1

    def __call__(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.errors.append(str(err))
        elif msg is not None:
            off = msg.offset()
            if off is not None and off > self.offset:
                self.offset = int(off)


class _DeliveryErrors(_Delivery):
    """A transactional producer's own delivery report callback: how many records failed, and how
    many with each of the first :data:`KEPT` distinct (topic, partition, error). Successes cost a
    call that returns at once."""

    KEPT = 3

    def __init__(self) -> None:
        super().__init__()
        self.failed = 0
        self.kinds: dict[str, int] = {}

    def __call__(self, err: Any, msg: Any) -> None:
        if err is None:
            return
        self.failed += 1
        topic, partition = (msg.topic(), msg.partition()) if msg is not None else (None, None)
        where = f"{topic}" + (f"-{partition}" if partition is not None and partition >= 0 else "")
        kind = f"{where}: {err.str() if hasattr(err, 'str') else err}"
        if kind in self.kinds or len(self.kinds) < self.KEPT:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def clear(self) -> None:
        self.kinds.clear()
        self.failed = 0

    def explain(self, exc: BaseException) -> BaseException:
        """``exc``, or when records failed delivery and ``exc`` is librdkafka's, the same error (code and
        flags kept) naming the failures: librdkafka's "N message(s) failed delivery (see individual
        delivery reports)" named none, and the sink kept no report."""
        from confluent_kafka import KafkaError, KafkaException

        if not self.failed or not isinstance(exc, KafkaException) or not exc.args \
                or not isinstance(exc.args[0], KafkaError):
            return exc
        err = exc.args[0]
        kinds = [f"{kind} ({n} record{'s' if n > 1 else ''})" for kind, n in self.kinds.items()]
        others = self.failed - sum(self.kinds.values())
        reports = "; ".join(kinds + ([f"{others} more records"] if others else []))
        return KafkaException(KafkaError(err.code(), f"{err.str()}; delivery reports: {reports}", fatal=err.fatal(),
                                         retriable=err.retriable(), txn_requires_abort=err.txn_requires_abort()))


def _produce_all(producer: Any, records: Iterable[OutRecord], default_topic: str | None) -> int:
    n = 0
    produce = producer.produce
    for key, value, topic, partition, headers in records:
        target = default_topic or topic  # as in Spark's Kafka sink, the topic option overrides the column
        if not target:
            raise ValueError("no topic: set option 'topic' or add a 'topic' column")
        kwargs: dict[str, Any] = {"key": key, "value": value}
        if partition is not None:
            kwargs["partition"] = int(partition)
        if headers:
            kwargs["headers"] = headers
        try:
            produce(target, **kwargs)
        except BufferError:
            _produce_when_full(producer, target, **kwargs)
        n += 1
        if n % 4096 == 0:
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


@dataclass
class PooledProducer:
    """A producer kept between tasks of one Python worker, with what its owner knows.

    Transactional (``tid`` set): made by ``init_transactions()`` of one epoch, given back only when
    every transaction it began has committed or aborted, so the next task starts from the state
    ``init_transactions()`` leaves, *unless another attempt with the same transactional id has
    called init_transactions since* and fenced it. ``last`` is the newest committed batch of its
    progress key as of its last progress read plus its own commits since: exact as long as the
    producer is not fenced, since only its transactional id writes that key. ``read_due`` asks the
    next task to read the progress partition (first use, or a snapshot is due).
    """

    producer: Any
    delivery: _Delivery
    tid: str | None = None
    timeout_ms: int = 0
    last: Committed | None = None
    read_due: bool = True
    snapshot_at: int = -1


def _close_pooled(p: PooledProducer) -> None:
    close_producer(p.producer)


#: Transactional producers by (transactional id, client settings), at most a few idle per worker.
TXN_PRODUCERS: ClientPool[PooledProducer] = ClientPool(_close_pooled, max_idle=8)
#: Plain producers (at_least_once, at_most_once's output) by settings.
PRODUCERS: ClientPool[PooledProducer] = ClientPool(_close_pooled, max_idle=4)

#: librdkafka settings the sink's producers get unless the user's kafka.* options set them:
#: - ``linger.ms``: wait up to 20 ms to fill a batch (the task flushes at its end, so this adds no
#:   latency to a batch's last records, and fewer, larger produce requests cost the broker less);
#: - ``reconnect.backoff.ms``: 20 (librdkafka's default is 100). librdkafka derives from it how
#:   long it holds back a new cluster connection after the last one (half of it, at least 11 ms).
#:   Every new producer meets that wait once: its first metadata answer retires the bootstrap
#:   connection, and its next request waited 50 ms for a connection to the broker it names. A new
#:   transactional producer per exactly_once and at_most_once task paid it in every task
#:   (``_connect_first``): 52 ms of the 57 ms before ``init_transactions``, now 12 ms. After a lost
#:   connection, reconnects start at 20 ms instead of 100 and still back off to
#:   ``reconnect.backoff.max.ms`` (10 s).
PRODUCER_DEFAULTS = {"linger.ms": 20, "reconnect.backoff.ms": 20}


def _with_defaults(conf: dict[str, Any]) -> dict[str, Any]:
    return {**PRODUCER_DEFAULTS, **conf}


def _send_plain(key: Hashable, pooled: PooledProducer, send: Callable[[Any], int], what: str,
                settings: SinkSettings, phases: _Phases) -> int:
    """Produce with a pooled plain producer (``send`` returns the rows it produced), flush, and
    give the producer back to the pool only when nothing failed (else it is closed); the caller
    reads ``pooled.delivery.errors``."""
    ok = False
    try:
        rows = send(pooled.producer)
        phases.lap("produce")
        flush(pooled.producer, settings.timeout_s, what)
        phases.lap("flush")
        ok = not pooled.delivery.errors
    finally:
        if ok:
            PRODUCERS.give(key, pooled)
        else:
            PRODUCERS.discard(pooled)
    return rows


def _plain_producer(guarantee: Guarantee, settings: SinkSettings) -> tuple[Hashable, PooledProducer, bool]:
    from confluent_kafka import Producer

    conf = _with_defaults(producer_config(guarantee, settings.client, None, 0))
    key = config_key(conf, "plain")
    pooled = PRODUCERS.take(key)
    reused = pooled is not None
    if pooled is None:
        delivery = _Delivery()
        pooled = PooledProducer(Producer({**conf, "on_delivery": delivery, "delivery.report.only.error": True}),
                                delivery)
        # An idempotent producer gets its producer id with its first records, and librdkafka meets the
        # race _connect_first describes there too: a new producer's first flush took 15 ms to 1 s
        # (100 records, median about 100 ms) against 15-16 ms every time once connected first.
        _connect_first(pooled.producer, settings)
    pooled.delivery.errors.clear()
    return key, pooled, reused


class _StaleProducer(Exception):
    """A transactional producer cannot serve this task: a newer attempt of the same id fenced it
    while it sat in the pool, or its transaction failed with an error a new producer may not meet
    (``_restartable``) and was aborted. The task starts over with a new producer."""


#: How many new producers a task tries after the one it began with could not serve it (``_StaleProducer``).
STALE_RESTARTS = 3


def _restartable(exc: BaseException) -> bool:
    """A librdkafka error inside a transaction after which a new producer may succeed: the broker's
    saying it forgot the producer, UNKNOWN_PRODUCER_ID (its state in a partition dropped: Kafka
    after ``producer.id.expiration.ms`` of silence there, ours also past
    ``producer_state_max_entries``; KIP-360) and INVALID_PRODUCER_ID_MAPPING (its transactional id
    expired: after ``transactional.id.expiration.ms``, or early past
    ``transactional_id_max_entries``), their kin (an epoch or a sequence the broker no longer
    matches), or an error librdkafka calls retriable. Starting over is what Spark's retry of the
    task does, and is as safe: the new producer's init_transactions fences this one and aborts what
    it left open, and its progress read decides whether the batch is written.

    Not restartable: a fatal error (fenced by a newer attempt, which carries the batch), and the
    others, which a new producer would meet again (records refused for their size or their topic:
    "N message(s) failed delivery"), so the task fails at once with the error instead of after
    1 + :data:`STALE_RESTARTS` tries."""
    from confluent_kafka import KafkaError, KafkaException

    if not isinstance(exc, KafkaException) or not exc.args or not isinstance(exc.args[0], KafkaError):
        return False
    err = exc.args[0]
    if err.fatal():
        return False
    return err.code() in (KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.INVALID_PRODUCER_ID_MAPPING,
                          KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER) \
        or err.retriable()


def _first_input_timed(records: Iterable[OutRecord] | ArrowRecords,
                       phases: _Phases) -> Iterable[OutRecord] | ArrowRecords:
    """The same input; the wait for its first Arrow batch (the upstream's start-up) is its own phase."""
    if not isinstance(records, ArrowRecords):
        return records

    def batches() -> Iterator[Any]:
        it = iter(records.batches)
        for first in it:
            phases.lap("first_input")
            yield first
            yield from it

    return ArrowRecords(batches())


class _Phases:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._t, 4)
        self._t = now


def _check_replay(last: Committed | None, ident: TaskIdentity, rows: int, settings: SinkSettings,
                  digest: int | None = None) -> str:
    """'' to write; 'replay' or 'higher' to skip; raises when skipping or writing would be wrong.

    A replay of the committed batch is skipped when it has the rows the batch was committed with:
    the same count and, where both are known, the same digest (a progress record written before
    digests existed has none: its count alone is compared). A replay with fewer rows is skipped
    only when an input topic of the query is compacted (``settings.compacted_inputs``): the cleaner
    removed records of the batch's range since it was committed, which Spark treats as normal, and
    the committed output stands. Anything else is not the same data, and fails the task, unless
    ``settings.fail_on_changed_replay`` is False (then it is skipped with a warning)."""
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
    if last.rows < 0 or rows < 0:  # -1: unknown (at_most_once marks before it reads)
        return "replay"
    same_digest = last.digest is None or digest is None or last.digest == digest
    if rows == last.rows and same_digest:
        return "replay"
    committed = f"{last.rows} rows" + ("" if last.digest is None else f" (digest {last.digest:016x})")
    replay = f"{rows} rows" + ("" if digest is None else f" (digest {digest:016x})")
    head = f"{where}: batch {ident.batch_id} was committed with {committed} but its replay has {replay}"
    if rows < last.rows and settings.compacted_inputs:
        log.warning("%s. The input topic(s) %s are compacted: records of the batch were compacted away since it "
                    "was committed. Skipping the replay; the batch's committed output stands",
                    head, ", ".join(settings.compacted_inputs))
        return "replay"
    if not settings.fail_on_changed_replay:
        log.warning("%s: not the same data. Skipping the replay (failOnChangedReplay=false); the batch's committed "
                    "output stands, and records only the replay has are not written", head)
        return "replay"
    if rows == last.rows:
        raise RuntimeError(
            f"{head}: as many rows, other records. The records under the batch's input offsets changed since "
            "it was committed (the log lost acknowledged records and others were written at their offsets: "
            "an unclean leader election, a truncated or restored log), or the query is not deterministic "
            "(uuid(), rand() without a seed, an external lookup). Skipping would drop the records only the "
            "replay has, and writing would repeat the others, so the sink stops here. A query that is not "
            "deterministic may set failOnChangedReplay=false to skip such replays (their output stays as "
            "first written).")
    why = ("fewer rows: records of its input are gone, and no input topic was found compacted (the sink looks "
           "for the topics in the checkpoint's offset log, option checkpointLocation on a local file system, "
           "and asks the sink's cluster for their cleanup.policy), so they may have been replaced by others"
           if rows < last.rows else "more rows")
    raise RuntimeError(
        f"{head}: {why}. The replay is not the same data (the input changed under the batch's offsets, "
        "failOnDataLoss=false with records removed by retention, a non-deterministic expression such as "
        "uuid(), or changed partitioning), so neither skipping nor writing it again would be exactly once. "
        "failOnChangedReplay=false skips such replays (the output stays as first written).")


def write_partition(records: Iterable[OutRecord] | ArrowRecords, ident: TaskIdentity, settings: SinkSettings,
                    hooks: SinkHooks | None = None) -> SinkCommitMessage:
    """Write one (batch, partition) under ``settings.guarantee``; runs on an executor.

    exactly_once: spool the input -> init_transactions (fences older attempts of this sink
    partition and completes or aborts their transaction) -> read the progress log -> skip if this
    batch is committed with the same row count (fail if the count differs or a later batch is
    committed) -> begin -> progress record + output -> commit. The transaction commits in the
    task, so the batch's output is visible once its last task committed, before Spark's own commit
    log says so; a replay finds the progress records and writes nothing.

    at_most_once: init_transactions and the progress read (or a pooled producer), then a
    transaction holding only the progress record, with the row count unknown (-1); only once it
    has committed is the input read, and sent as it comes with acks=0 (:func:`_write_at_most_once`).

    A transactional producer left by an earlier task of this Python worker (same transactional id
    and settings, see :class:`PooledProducer`) stands in for init_transactions and the progress
    read: its epoch is still the newest unless another attempt fenced it, and then nothing it sends
    can commit. Its progress record goes first and is flushed before any output, so a producer
    fenced while idle is found out before the task produced anything; the task then starts over
    with a new producer (init_transactions, progress read), as a task without a pooled one does.
    """
    hooks = hooks or SinkHooks()
    phases = _Phases()
    g = settings.guarantee
    if g is Guarantee.at_least_once:
        return _write_at_least_once(records, ident, settings, hooks, phases)
    if g is Guarantee.at_most_once:
        return _write_at_most_once(records, ident, settings, hooks, phases)

    with Spool() as spool:
        tid = settings.transactional_id(ident)
        key = config_key(settings.client, tid)
        pooled = TXN_PRODUCERS.take(key) if settings.reuse_transactional_producers else None
        prep = None
        if pooled is None and ident.attempt == 0:
            # A new producer's init_transactions and progress read run while the input spools; the
            # transaction itself opens only once the input is complete. Not for a later attempt (a
            # retry, or a speculative copy running beside the first): its init fences every older
            # attempt, so made at its start it would fence one still reading its input, which then
            # can only fail (a counted task failure; with a slow partition each new speculative
            # copy fenced the last until the query failed). Made once its input is in, it fences an
            # older attempt only if that one has not committed by then, and otherwise finds the
            # batch committed and skips it: the first attempt to finish wins.
            guess_ms = settings.transaction_timeout_ms or _SIZED_MS.get(key, 2 * BASE_TRANSACTION_TIMEOUT_MS)
            prep = _Preparation(_new_txn_producer(settings, tid, guess_ms), settings, ident.partition_id)
            prep.start()
        try:
            spool.add(_first_input_timed(records, phases))  # the upstream computation runs now, outside any transaction
        except BaseException:
            if prep is not None:
                prep.join()
                TXN_PRODUCERS.discard(prep.pooled)
            if pooled is not None:
                TXN_PRODUCERS.give(key, pooled)  # unused: still in the state it was given back in
            raise
        phases.lap("spool")

        def send(producer: Any) -> int:
            return spool.produce(producer, settings.topic)

        need_ms = transaction_timeout_ms(spool.rows, spool.nbytes, settings.transaction_timeout_ms)
        if settings.transaction_timeout_ms is None:
            # Sized for up to twice the largest batch seen, so one producer serves a stream's batches.
            _SIZED_MS[key] = max(_SIZED_MS.get(key, 0), transaction_timeout_ms(2 * spool.rows, 2 * spool.nbytes))
        if pooled is not None and pooled.timeout_ms < need_ms:
            TXN_PRODUCERS.discard(pooled)  # sized for smaller batches; a new one fences it anyway
            pooled = None
        digest = spool.digest
        if pooled is not None and (msg := _with_pooled(pooled, key, spool.rows, send, ident, settings, hooks,
                                                        phases, digest)) is not None:
            return msg
        if prep is not None:
            prep.finish(phases)
            if prep.error is None and prep.pooled.timeout_ms >= need_ms:
                return _with_new_producers(lambda: _new_txn_producer(settings, tid, need_ms), key, spool.rows,
                                           send, ident, settings, hooks, phases, prepared=prep, digest=digest)
            TXN_PRODUCERS.discard(prep.pooled)
            if prep.error is not None and not isinstance(prep.error, _TimeoutRefused):
                raise prep.error
        # Sized for exactly this batch (as a guess refused by the broker, or too small, would not be).
        return _with_new_producers(lambda: _new_txn_producer(settings, tid, need_ms), key, spool.rows, send,
                                   ident, settings, hooks, phases, digest=digest)


def _starting_over(pooled: PooledProducer, exc: _StaleProducer, phases: _Phases) -> None:
    phases.lap("stale")
    log.info("transactional id %s: the producer cannot serve this task (%s); starting over with a new one",
             pooled.tid, exc)


def _with_new_producers(make: Callable[[], PooledProducer], key: Hashable, rows: int, send: Callable[[Any], int],
                        ident: TaskIdentity, settings: SinkSettings, hooks: SinkHooks, phases: _Phases,
                        prepared: _Preparation | None = None, digest: int | None = None) -> SinkCommitMessage:
    """The task's write with ``prepared``'s producer (made, and its progress read, beside the task's
    input) if given, else with ``make()``'s; then, while one cannot serve it (``_StaleProducer``),
    with up to STALE_RESTARTS more from ``make`` (STALE_RESTARTS in all without ``prepared``). The
    last one's error then fails the task."""
    tries = STALE_RESTARTS + (prepared is not None)
    for attempt in range(tries):
        if attempt == 0 and prepared is not None:
            pooled, state = prepared.pooled, prepared.state
        else:
            pooled, state = make(), None
        try:
            return _write_with_progress(pooled, False, key, rows, send, ident, settings, hooks, phases, state, digest)
        except _StaleProducer as exc:
            if attempt == tries - 1:
                raise (exc.__cause__ or exc) from None
            _starting_over(pooled, exc, phases)
    raise AssertionError("unreachable")


#: Per process: the transaction timeout a new producer of a transactional id is made with (twice
#: the largest batch its tasks spooled), until the input is known; 2 minutes at first.
_SIZED_MS: dict[Hashable, int] = {}


def _with_pooled(pooled: PooledProducer, key: Hashable, rows: int, send: Callable[[Any], int], ident: TaskIdentity,
                 settings: SinkSettings, hooks: SinkHooks, phases: _Phases,
                 digest: int | None = None) -> SinkCommitMessage | None:
    """The task's write with a producer from the pool; None when the task must start over with a
    new one: a newer attempt had fenced it (found out before any output), or its transaction failed
    with an error a new producer may not meet and was aborted (``_restartable``)."""
    try:
        return _write_with_progress(pooled, True, key, rows, send, ident, settings, hooks, phases, digest=digest)
    except _StaleProducer as exc:
        _starting_over(pooled, exc, phases)
        return None


class _TimeoutRefused(RuntimeError):
    """The broker refused the transaction timeout (above its transaction.max.timeout.ms)."""


class _Preparation(threading.Thread):
    """init_transactions of a new producer, then the progress read, beside the task's spooling."""

    def __init__(self, pooled: PooledProducer, settings: SinkSettings, partition_id: int) -> None:
        super().__init__(name=f"oncelog-init-{pooled.tid}", daemon=True)
        self.pooled = pooled
        self.settings = settings
        self.partition_id = partition_id
        self.state: PartitionState | None = None
        self.error: BaseException | None = None
        self.seconds: dict[str, float] = {}

    def run(self) -> None:
        try:
            t0 = time.perf_counter()
            _init(self.pooled, None, self.settings)
            t1 = time.perf_counter()
            self.state = self.settings.progress().read(self.partition_id)
            t2 = time.perf_counter()
            self.seconds = {"init": round(t1 - t0, 4), "progress": round(t2 - t1, 4)}
        except BaseException as exc:  # handed to the task's thread, which raises it
            self.error = exc

    def finish(self, phases: _Phases) -> None:
        """Wait for it; its own phases go into the task's, and the wait is a phase of its own."""
        self.join()
        phases.seconds.update({f"{k}_overlapped": v for k, v in self.seconds.items()})
        phases.lap("wait_init")


def _new_txn_producer(settings: SinkSettings, tid: str, timeout_ms: int) -> PooledProducer:
    from confluent_kafka import Producer

    delivery = _DeliveryErrors()
    conf = _with_defaults(marker_config(settings.client, tid, timeout_ms))
    return PooledProducer(Producer({**conf, "on_delivery": delivery}), delivery, tid, timeout_ms)


def _connect_first(producer: Any, settings: SinkSettings) -> None:
    """Connect a new producer to the cluster before ``init_transactions`` (or, for a plain
    producer, before its first records), with two metadata requests. Without them, librdkafka
    (2.16) often stalls 500 ms in ``init_transactions``: the first metadata answer retires the
    bootstrap connection, the producer-id state machine then finds no broker up, and its request
    to connect one is dropped while the bootstrap connection still counts as up, so nothing
    connects until the coordinator query timer fires 500 ms later. The second request makes the
    client connect to a real broker and waits for it. Measured against our broker: 8 of 30 new
    producers took 505 ms in init_transactions, against 0 of 30 (56 ms each, the two requests
    included) with them; 12 ms since ``PRODUCER_DEFAULTS`` sets ``reconnect.backoff.ms``.

    The requests name no topic: a producer's metadata request for a topic may create it on a
    broker with auto.create.topics.enable, and the progress topic must never come back empty after
    a deletion. A failure here is left to init_transactions to report."""
    from confluent_kafka import KafkaException

    for _ in range(2):
        try:
            producer.list_topics(timeout=settings.connect_timeout_s)
        except KafkaException:
            return


def _init(pooled: PooledProducer, rows: int | None, settings: SinkSettings) -> None:
    from confluent_kafka import KafkaError, KafkaException

    _connect_first(pooled.producer, settings)
    try:
        pooled.producer.init_transactions(settings.timeout_s)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.INVALID_TRANSACTION_TIMEOUT:
            what = "this batch" if rows is None else f"{rows} rows"
            raise _TimeoutRefused(
                f"the broker refused transaction.timeout.ms={pooled.timeout_ms} for {what} (above its "
                "transaction.max.timeout.ms): set option transaction.timeout.ms, or lower "
                "maxOffsetsPerTrigger so micro-batches are smaller") from exc
        raise RuntimeError(f"transactional id {pooled.tid} at {settings.client.get('bootstrap.servers')}: "
                           f"init_transactions failed (timeout.ms={settings.timeout_s * 1000:g}): {exc}") from exc


def _write_with_progress(pooled: PooledProducer, reused: bool, pool_key: Hashable, rows: int,
                         send: Callable[[Any], int], ident: TaskIdentity, settings: SinkSettings, hooks: SinkHooks,
                         phases: _Phases, prepared: PartitionState | None = None,
                         digest: int | None = None) -> SinkCommitMessage:
    """The protocol from init_transactions on. ``rows``: the batch's row count, as the progress record
    states it (-1: unknown, at_most_once); ``digest``: its rows' digest (``Spool.digest``; None:
    unknown). ``send(producer)`` produces the output and returns how
    many rows it sent: into the transaction (exactly_once) or after it (at_most_once). ``prepared``:
    init_transactions has returned and this is the progress partition as read after it
    (:class:`_Preparation`)."""
    g = settings.guarantee
    tid = pooled.tid
    progress = settings.progress()
    key = progress_key(settings.sink_id(ident.query_id), ident.partition_id)
    producer = pooled.producer
    keep = False  # give the producer back to the pool: only when no transaction of it is open

    def message(rows: int, reason: str) -> SinkCommitMessage:
        return SinkCommitMessage(ident.query_id, ident.batch_id, ident.partition_id, rows, bool(reason), g.value,
                                 tid, settings.target, reason, phases.seconds, reused)

    if isinstance(pooled.delivery, _DeliveryErrors):
        pooled.delivery.clear()
    try:
        state = prepared
        if not reused and prepared is None:
            _init(pooled, rows if rows >= 0 else None, settings)
            phases.lap("init")
        if pooled.read_due and state is None:
            state = progress.read(ident.partition_id)
            phases.lap("progress")
        if state is not None:
            pooled.last, pooled.snapshot_at, pooled.read_due = state.latest.get(key), state.snapshot_at, False
        reason = _check_replay(pooled.last, ident, rows, settings, digest)
        if reason:
            keep = True
            msg = message(0 if reason == "higher" else max(rows, 0), reason)
            hooks.after_commit(ident, msg)
            return msg
        marker, snapshot_at = _Delivery(), -1
        producer.begin_transaction()
        try:
            part = progress.partition_for(ident.partition_id)
            producer.produce(progress.topic, progress_value(ident.batch_id, rows, progress.partitions, digest),
                             key.encode(), part, marker)
            if state is not None and progress.snapshot_due(state):
                snapshot = progress.snapshot_record(state)
                if snapshot is not None:
                    producer.produce(progress.topic, snapshot, SNAPSHOT_KEY.encode(), part)
                    snapshot_at = state.position  # at least; the record follows the progress record
            if reused:
                # Found out now, before any output, whether a newer attempt fenced this producer
                # while it sat in the pool. Whatever failed here, nothing of this task was produced:
                # starting over with a new producer (init_transactions, progress read) is safe.
                try:
                    flush(producer, settings.timeout_s, f"transaction {tid}")
                except Exception as exc:
                    raise _StaleProducer(str(exc)) from exc
                if marker.errors:
                    raise _StaleProducer(marker.errors[0])
            if g is Guarantee.exactly_once:
                send(producer)
                phases.lap("produce")
                flush(producer, settings.timeout_s, f"transaction {tid}")
                phases.lap("flush")
                hooks.before_commit(ident, g)
            producer.commit_transaction(settings.timeout_s)
            producer.poll(0)  # the progress record's delivery report: its offset
            phases.lap("commit")
        except BaseException as exc:
            try:
                producer.abort_transaction(10)
            except Exception:  # fenced or broker gone: the coordinator aborts it (fencing/timeout)
                pass
            explained = pooled.delivery.explain(exc) if isinstance(pooled.delivery, _DeliveryErrors) else exc
            if _restartable(exc):  # nothing of this transaction is visible: a new producer starts over
                raise _StaleProducer(str(explained)) from explained
            if explained is not exc:
                raise explained from exc
            raise
        pooled.last = Committed(ident.batch_id, rows, digest)
        if snapshot_at >= 0:
            pooled.snapshot_at = max(snapshot_at, marker.offset + 1)
        pooled.read_due = marker.offset < 0 or marker.offset - pooled.snapshot_at >= SNAPSHOT_EVERY
        keep = True
    finally:
        if keep and settings.reuse_transactional_producers:
            TXN_PRODUCERS.give(pool_key, pooled)
        else:
            TXN_PRODUCERS.discard(pooled)
    if g is Guarantee.at_most_once:
        # The window in which a crash loses the batch: marked committed, output not yet sent.
        hooks.before_commit(ident, g)
        out_key, out, _ = _plain_producer(g, settings)
        rows = _send_plain(out_key, out, send, f"at_most_once output of {key}", settings, phases)
        if out.delivery.errors:
            errors = out.delivery.errors
            raise RuntimeError(f"{len(errors)} records not sent (at_most_once: not retried): {errors[:3]}")
    msg = message(rows, "")
    hooks.after_commit(ident, msg)
    return msg


#: at_most_once: how many input rows a task may take from its upstream while its new producer's
#: init_transactions and progress read run (they are held in memory, and sent only after the mark).
AT_MOST_ONCE_EARLY_ROWS = 100_000


def _write_at_most_once(records: Iterable[OutRecord] | ArrowRecords, ident: TaskIdentity,
                        settings: SinkSettings, hooks: SinkHooks, phases: _Phases) -> SinkCommitMessage:
    """Mark the batch committed first, then send the input as it comes (acks=0).

    Nothing is spooled: the progress record says ``rows: -1`` (unknown), so a replay is skipped
    without a row-count check. Skipping is the whole of at_most_once's answer to a replay, whatever
    its data, and the check could only turn a skip into a failed query. The input is sent only
    after the mark has committed, as a Kafka consumer commits its offsets before it processes: a
    task that fails after the mark, for any reason, loses the batch, and its retry skips it.

    A new producer's init_transactions and progress read run on a thread (:class:`_Preparation`),
    while the task takes up to :data:`AT_MOST_ONCE_EARLY_ROWS` input rows from its upstream into
    memory; those go first once the batch is marked. The transaction holds one record, so its
    timeout is the base one, not one sized to the batch.
    """
    tid = settings.transactional_id(ident)
    key = config_key(settings.client, tid)
    timed = _first_input_timed(records, phases)
    chunks: Iterator[Any] = iter(timed.batches if isinstance(timed, ArrowRecords) else timed)
    early: list[Any] = []

    def send(producer: Any) -> int:
        return produce_records(producer, itertools.chain(early, chunks), settings.topic)

    pooled = TXN_PRODUCERS.take(key) if settings.reuse_transactional_producers else None
    if pooled is not None and (msg := _with_pooled(pooled, key, -1, send, ident, settings, hooks, phases)) is not None:
        return msg  # (a stale pooled producer is found out before anything was read or sent)
    prep = _Preparation(_new_txn_producer(settings, tid, settings.transaction_timeout_ms or
                                          BASE_TRANSACTION_TIMEOUT_MS), settings, ident.partition_id)
    prep.start()
    try:
        taken, end = 0, cast(Any, object())
        while prep.is_alive() and taken < AT_MOST_ONCE_EARLY_ROWS:
            chunk = next(chunks, end)
            if chunk is end:
                break
            early.append(chunk)
            taken += 1 if isinstance(chunk, tuple) else len(chunk)
    except BaseException:  # the upstream failed before the mark: the retry writes the batch
        prep.join()
        TXN_PRODUCERS.discard(prep.pooled)
        raise
    prep.finish(phases)
    if prep.error is not None:
        TXN_PRODUCERS.discard(prep.pooled)
        raise prep.error
    # (The input is sent after the mark's transaction: a start-over has read nothing more of it.)
    return _with_new_producers(
        lambda: _new_txn_producer(settings, tid, settings.transaction_timeout_ms or BASE_TRANSACTION_TIMEOUT_MS),
        key, -1, send, ident, settings, hooks, phases, prepared=prep)


def _write_at_least_once(records: Iterable[OutRecord] | ArrowRecords, ident: TaskIdentity,
                         settings: SinkSettings, hooks: SinkHooks, phases: _Phases) -> SinkCommitMessage:
    key, pooled, reused = _plain_producer(Guarantee.at_least_once, settings)
    chunks: Iterable[Any] = records.batches if isinstance(records, ArrowRecords) else records
    rows = _send_plain(key, pooled, lambda producer: produce_records(producer, chunks, settings.topic),
                       f"at_least_once output of partition {ident.partition_id}", settings, phases)
    if pooled.delivery.errors:
        errors = pooled.delivery.errors
        raise RuntimeError(f"{len(errors)} of {rows} records not delivered: {errors[:3]}")
    hooks.before_commit(ident, Guarantee.at_least_once)
    msg = SinkCommitMessage(ident.query_id, ident.batch_id, ident.partition_id, rows, False,
                            Guarantee.at_least_once.value, None, settings.target, "", phases.seconds, reused)
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
    return TaskIdentity(query_id, int(batch_id), tc.partitionId(), tc.attemptNumber())


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
        settings = SinkSettings.from_options(options).prepare()
        if settings.guarantee is Guarantee.exactly_once:
            # Made when the query starts (and for each commit): after a restart, the offset log's
            # newest entry is the batch Spark replays.
            settings = replace(settings, compacted_inputs=compacted_inputs(
                get_option(options, "checkpointLocation"), settings.client, settings.connect_timeout_s))
        self.settings = settings
        self.last_commit: CommitSummary | None = None

    def write(self, iterator: Iterator[Any]) -> SinkCommitMessage:
        settle_worker()
        return write_partition(ArrowRecords(iterator), current_task_identity(), self.settings, self.hooks)

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

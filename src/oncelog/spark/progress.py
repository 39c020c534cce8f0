"""The sink's progress log: which sink partition committed which micro-batch, with how many rows
and which digest of them.

A progress record is a Kafka record in a small topic (default ``oncelog-spark-progress``) with key
``"{query_id}/{target}/{partition_id}"`` (the *sink identity* ``query_id/target`` — target being the
output topic, ``*`` when rows carry their topic — plus the Spark partition) and value JSON
``{"batch_id": b, "rows": n, "parts": P, "digest": d}`` (``digest``: an order-independent digest of
the rows' keys and values, ``sink.Spool.digest``; records written before it existed have none). The
exactly-once sink writes it inside the same transaction as the partition's output, so the record is
visible (under read_committed) if and only if the output is. Spark partition ``p`` writes to progress
partition ``p % P``; with at least as many progress partitions as Spark partitions no two live
transactional ids of one sink share a progress partition. ``parts`` records ``P``: a reader finding
another count refuses to go on (added partitions would move keys and hide their history).

Invariant: :meth:`ProgressLog.read` returns, for every key of the partition, the highest committed
batch (and its row count and digest) among records committed before the call started, provided any
transaction of the caller's own transactional id has completed (``init_transactions()`` guarantees
that). It reads read_committed up to the high watermark taken at the start, so it waits until every
transaction open at that moment in the partition is decided.

Bounded reads. The state is a per-key maximum, so merging is order-free and idempotent, and a
*snapshot* record (key :data:`SNAPSHOT_KEY`, value ``{"upto": X, "state": {...}}``) can stand for
every committed record below ``X``. A writing task adds a snapshot to its own transaction once the
partition has grown :data:`SNAPSHOT_EVERY` offsets past the newest one. A reader with nothing cached
reads back from the high watermark until it meets a snapshot, so a fresh Python worker reads about
``2 * SNAPSHOT_EVERY`` offsets, not the whole topic; a reused worker reads on from its in-process
cache. With ``cleanup.policy=compact`` the topic itself stays one record per key; where the broker
refuses compaction the topic is created with retention off (progress must never expire) and grows
by one small record per task and batch while reads stay bounded.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oncelog.spark.clients import CONSUMERS
from oncelog.spark.ranges import consume_range

log = logging.getLogger("oncelog.spark")

DEFAULT_TOPIC = "oncelog-spark-progress"
DEFAULT_PARTITIONS = 16
#: Offsets a progress partition may grow past its newest snapshot before a writer adds another.
SNAPSHOT_EVERY = 500
SNAPSHOT_KEY = "__oncelog_snapshot__"
#: Snapshots larger than this are not written (reads then reach further back, still correct).
SNAPSHOT_MAX_BYTES = 512 * 1024
#: Configs tried in order when creating the progress topic: compacted, else retention off.
COMPACT_CONFIG = {"cleanup.policy": "compact"}
KEEP_FOREVER_CONFIG = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


@dataclass(frozen=True)
class Committed:
    """The newest committed batch of one sink partition; ``rows`` is -1 when unknown; ``digest`` is
    the digest of its rows (``sink.Spool.digest``), None when unknown (at_most_once, or a record
    written before progress records carried one: then only the row count can be compared)."""

    batch_id: int
    rows: int
    digest: int | None = None


@dataclass
class PartitionState:
    """What one progress partition says below ``position``; ``snapshot_at`` is the newest snapshot's offset."""

    position: int
    latest: dict[str, Committed] = field(default_factory=dict)
    snapshot_at: int = -1

    def merge(self, key: str, entry: Committed) -> None:
        have = self.latest.get(key)
        if have is None or entry.batch_id > have.batch_id:
            self.latest[key] = entry

    def copy(self) -> PartitionState:
        return PartitionState(self.position, dict(self.latest), self.snapshot_at)


def sink_identity(query_id: str, target: str) -> str:
    return f"{query_id}/{target}"


def progress_key(sink_id: str, partition_id: int) -> str:
    return f"{sink_id}/{partition_id}"


def progress_value(batch_id: int, rows: int, partitions: int, digest: int | None = None) -> bytes:
    value: dict[str, int] = {"batch_id": batch_id, "rows": rows, "parts": partitions}
    if digest is not None:
        value["digest"] = digest
    return json.dumps(value, separators=(",", ":")).encode()


def _entry(c: Committed) -> list[int]:
    return [c.batch_id, c.rows] if c.digest is None else [c.batch_id, c.rows, c.digest]


def snapshot_value(state: PartitionState) -> bytes:
    """``{"upto": X, "state": {key: [batch, rows] or [batch, rows, digest]}}``."""
    return json.dumps({"upto": state.position,
                       "state": {k: _entry(c) for k, c in sorted(state.latest.items())}},
                      separators=(",", ":")).encode()


class ProgressLayoutError(RuntimeError):
    """The progress topic's partition count is not the one its records were written with."""


# Per executor process: (bootstrap, topic, partition) -> state. The committed prefix of a partition
# never changes, so reading on from where the last task stopped is exact; the cache saves rereading.
_CACHE: dict[tuple[str, str, int], PartitionState] = {}
_CACHE_LOCK = threading.Lock()
_PROCESS_GROUP = f"oncelog-progress-{uuid.uuid4()}"


def clear_cache() -> None:
    """Forget every cached position (what a fresh Python worker starts with)."""
    with _CACHE_LOCK:
        _CACHE.clear()


def admin_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The subset of client settings an AdminClient accepts (connection and security)."""
    return {k: v for k, v in conf.items()
            if k in ("bootstrap.servers", "security.protocol", "client.id", "socket.timeout.ms",
                     "socket.connection.setup.timeout.ms", "broker.address.family")
            or k.startswith(("sasl.", "ssl."))}


def connect_error(bootstrap: str, timeout_s: float, exc: BaseException, option: str) -> ConnectionError:
    return ConnectionError(f"cannot reach the Kafka cluster at {bootstrap} within {timeout_s:g}s "
                           f"(option {option}): {exc}")


class _Reader:
    """A pooled read_committed consumer of the progress topic, renewed where it stands when
    librdkafka's fetch size ran out (MSG_SIZE_TOO_LARGE after fetches that yield nothing: a
    compacted progress topic's cleaned segments), as the source's executor reads do."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.consumer = CONSUMERS.take(config)

    def renew(self, spent: Any) -> Any:
        CONSUMERS.discard(spent)
        self.consumer = CONSUMERS.make(self.config)
        return self.consumer


def _parse(raw_key: bytes | None, raw_value: bytes | None) -> tuple[str, dict[str, Any]] | None:
    """A progress record's key and value as a sink writes them (``progress_value``,
    ``snapshot_value``), or None for anything else: bytes that are not UTF-8 or JSON, a value that
    is not an object, fields that are not integers where integers go. The reader skips such a
    record: no sink wrote it, so it says nothing about any batch, and failing on it would stop
    every query that shares the partition until someone deleted it."""
    try:
        key = (raw_key or b"").decode()
        value = json.loads(raw_value or b"{}")
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(value, dict):
        return None

    def ints(*xs: object) -> bool:
        return all(type(x) is int for x in xs)

    if key == SNAPSHOT_KEY:
        state, upto = value.get("state"), value.get("upto")
        if not isinstance(state, dict) or not ints(upto):
            return None
        for entry in state.values():
            if not (isinstance(entry, list) and len(entry) in (2, 3) and ints(*entry)):
                return None
        return key, value
    if not ints(value.get("batch_id", -1), value.get("rows", -1), value.get("parts", 0), value.get("digest", 0)):
        return None
    return key, value


class ProgressLog:
    def __init__(self, conf: Mapping[str, Any], topic: str = DEFAULT_TOPIC,
                 partitions: int = DEFAULT_PARTITIONS, timeout_s: float = 120.0,
                 replication_factor: int = -1) -> None:
        self.conf = {k: v for k, v in conf.items() if k != "isolation.level"}
        self.topic = topic
        self.partitions = partitions
        self.timeout_s = timeout_s
        self.replication_factor = replication_factor
        #: records fetched by the last :meth:`read` (how far back it had to go)
        self.last_read_records = 0
        #: records the last :meth:`read` skipped because no sink wrote them (``_parse``)
        self.foreign_records = 0

    def partition_for(self, partition_id: int) -> int:
        return partition_id % self.partitions

    def ensure_topic(self, admin: Any = None, connect_timeout_s: float = 30.0) -> int:
        """Create the progress topic if missing; return its partition count (an existing topic's wins).

        Created with ``cleanup.policy=compact`` (one record per key survives); a broker that
        refuses compaction (INVALID_CONFIG / POLICY_VIOLATION) gets the topic with retention off
        instead, and a warning. The replication factor is ``replication_factor`` (-1: the
        cluster's default, CreateTopics v4+).
        """
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import AdminClient, NewTopic

        bootstrap = str(self.conf.get("bootstrap.servers"))
        admin = admin or AdminClient(admin_config(self.conf))
        try:
            md = admin.list_topics(timeout=connect_timeout_s)
        except KafkaException as exc:
            raise connect_error(bootstrap, connect_timeout_s, exc, "connectTimeoutMs") from None
        existing = md.topics.get(self.topic)
        if existing is not None and existing.error is None:
            return len(existing.partitions)
        for config in (COMPACT_CONFIG, KEEP_FOREVER_CONFIG):
            topic = NewTopic(self.topic, num_partitions=self.partitions,
                             replication_factor=self.replication_factor, config=dict(config))
            try:
                admin.create_topics([topic])[self.topic].result(timeout=self.timeout_s)
                return self.partitions
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                code = err.code() if isinstance(err, KafkaError) else None
                if code == KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent task or query created it
                    return self._partition_count(admin)
                if config is COMPACT_CONFIG and code in (KafkaError.INVALID_CONFIG, KafkaError.POLICY_VIOLATION):
                    log.warning("progress topic %s: the cluster refused cleanup.policy=compact (%s); creating it "
                                "with retention off instead (retention.ms=-1): it grows by one small record per "
                                "task and batch, and reads stay bounded by snapshots", self.topic, err)
                    continue
                if code == KafkaError.INVALID_REPLICATION_FACTOR:
                    raise ValueError(f"progress topic {self.topic}: the cluster refused replication factor "
                                     f"{self.replication_factor} (option progress.replicationFactor): {err}") from None
                raise RuntimeError(f"cannot create progress topic {self.topic}: {err}") from None
        raise AssertionError("unreachable")

    def _partition_count(self, admin: Any) -> int:
        md = admin.list_topics(topic=self.topic, timeout=self.timeout_s)
        return len(md.topics[self.topic].partitions)

    def _consumer_config(self, isolation: str) -> dict[str, Any]:
        # Never joins the group or commits: the id matters only to clusters with group ACLs. One id
        # per process, so the pooled consumers serve every read (CONSUMERS).
        group = self.conf.get("group.id") or _PROCESS_GROUP
        # A read ends on a transaction marker (the commit of the newest record): a fetch at the end
        # must come back at once, not after librdkafka's default 500 ms wait for more data.
        return {"fetch.wait.max.ms": 5, "fetch.queue.backoff.ms": 5, **self.conf, "group.id": group,
                "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True,
                "auto.offset.reset": "earliest"}

    def read(self, partition_id: int) -> PartitionState:
        """The committed state of ``partition_id``'s progress partition (see the module invariant)."""
        from confluent_kafka import KafkaException, TopicPartition

        part = self.partition_for(partition_id)
        cache_key = (str(self.conf.get("bootstrap.servers")), self.topic, part)
        probe_config = self._consumer_config("read_uncommitted")
        probe = CONSUMERS.take(probe_config)
        try:
            low, high = probe.get_watermark_offsets(TopicPartition(self.topic, part), timeout=self.timeout_s,
                                                    cached=False)
        except KafkaException as exc:
            CONSUMERS.discard(probe)
            raise RuntimeError(f"progress partition {self.topic}-{part} at {cache_key[0]}: no offsets within "
                               f"{self.timeout_s:g}s: {exc}") from exc
        except BaseException:
            CONSUMERS.discard(probe)
            raise
        CONSUMERS.give(probe_config, probe)
        with _CACHE_LOCK:
            cached = _CACHE.get(cache_key)
            state = cached.copy() if cached is not None else None
        if state is not None and state.position > high:
            state = None  # the topic was deleted and created again: nothing cached is valid
        reader = _Reader(self._consumer_config("read_committed"))
        self.last_read_records = 0
        self.foreign_records = 0
        try:
            if state is not None:
                self._apply(reader, part, state, state.position, high)
            else:
                state = self._read_back(reader, part, low, high)
        except BaseException:
            CONSUMERS.discard(reader.consumer)
            raise
        CONSUMERS.give(reader.config, reader.consumer)
        state.position = high
        with _CACHE_LOCK:
            cached = _CACHE.get(cache_key)
            if cached is None or cached.position <= state.position:
                _CACHE[cache_key] = state.copy()
        return state

    def _read_back(self, reader: _Reader, part: int, low: int, high: int) -> PartitionState:
        """Read ``[lo, high)`` for ever lower ``lo`` until a snapshot covers what lies below it."""
        state = PartitionState(position=low)
        lo, end = max(low, high - 2 * SNAPSHOT_EVERY), high
        while True:
            upto = self._apply(reader, part, state, lo, end)
            if upto is not None:
                if upto < lo:  # the snapshot's cut lies below what was read: read the gap
                    self._apply(reader, part, state, upto, lo)
                return state
            if lo <= low:
                return state
            lo, end = max(low, lo - 2 * (high - lo)), lo

    def _apply(self, reader: _Reader, part: int, state: PartitionState, start: int, end: int) -> int | None:
        """Merge the committed records of ``[start, end)`` into ``state``; the newest snapshot's cut, if any."""
        upto: int | None = None
        if start >= end:
            return None
        for msgs in consume_range(reader.consumer, self.topic, part, start, end, self.timeout_s, 1000,
                                  poll_timeout_s=0.01, what=f"progress partition {self.topic}-{part}",
                                  renew=reader.renew):
            self.last_read_records += len(msgs)
            for m in msgs:
                parsed = _parse(m.key(), m.value())
                if parsed is None:
                    self.foreign_records += 1
                    if self.foreign_records == 1:  # once a read: a flood of them must not flood the log
                        log.warning("progress topic %s: the record at %d/%d is not a progress record (written "
                                    "by something other than an oncelog sink?): ignored, as are any more in "
                                    "this read. Only the sinks' principal should be allowed to write there "
                                    "(docs/design/spark-sink.md)", self.topic, part, m.offset())
                    continue
                key, value = parsed
                if key == SNAPSHOT_KEY:
                    for k, entry in value["state"].items():
                        state.merge(k, Committed(*entry))
                    if int(m.offset()) > state.snapshot_at:
                        state.snapshot_at = int(m.offset())
                        upto = value["upto"]
                    continue
                parts = value.get("parts")
                if parts is not None and parts != self.partitions:
                    raise ProgressLayoutError(
                        f"progress topic {self.topic} has {self.partitions} partitions but its record at "
                        f"{part}/{m.offset()} was written with {parts}: adding partitions moves keys away from "
                        "their history; restore the partition count or give the query a new progress.topic")
                state.merge(key, Committed(value.get("batch_id", -1), value.get("rows", -1), value.get("digest")))
        return upto

    def last_committed(self, key: str, partition_id: int) -> Committed | None:
        return self.read(partition_id).latest.get(key)

    @staticmethod
    def snapshot_due(state: PartitionState, low: int = 0) -> bool:
        """Whether a writer should add a snapshot of ``state`` to its transaction."""
        return state.position - max(state.snapshot_at, low) >= SNAPSHOT_EVERY

    @staticmethod
    def snapshot_record(state: PartitionState) -> bytes | None:
        value = snapshot_value(state)
        if len(value) > SNAPSHOT_MAX_BYTES:
            log.warning("progress snapshot of %d keys is %d bytes: not written (reads reach further back)",
                        len(state.latest), len(value))
            return None
        return value

"""The `oncelog` Spark source: streaming and batch reads of Kafka topics through confluent-kafka.

Offsets, as kept in Spark's offset log, are ``{topic: {"partition": next_offset}}`` (partition keys
are strings because the dict goes through JSON). A micro-batch reads, per partition, the half-open
range ``[start, end)``; ``end`` is never above the partition's last stable offset when the source
reads ``read_committed`` (the default), because librdkafka's watermark query answers the LSO then.

Invariants the reader keeps:
- A range is read by position, not by counting records: it ends when the consumer's position (or a
  partition-EOF event) reaches ``end``. Control markers and aborted records occupy offsets but are
  never delivered, so a range can start or end on them; records at or above ``end`` are dropped.
- Replaying a planned batch (Spark restarts from its offset log) reads the same committed records:
  below the LSO the committed content of a partition never changes.
- The driver-side consumer only answers metadata and watermarks; executors open their own consumer
  per range with ``assign()`` (no consumer group, no offset commits).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from oncelog.spark.options import (
    EARLIEST,
    LATEST,
    client_config,
    get_bool,
    get_int,
    get_option,
    parse_assign,
    parse_offsets_spec,
)
from oncelog.spark.ranges import consume_range

Offsets = dict[str, dict[str, int]]

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"

#: Records per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 8192


@dataclass(frozen=True)
class OffsetRange:
    """One partition's share of a batch: records with ``start <= offset < end``."""

    topic: str
    partition: int
    start: int
    end: int


def schema_ddl(include_headers: bool) -> str:
    return SCHEMA_DDL + (HEADERS_DDL if include_headers else "")


def plan_ranges(start: Offsets, end: Offsets) -> list[OffsetRange]:
    """The non-empty ranges between two offset dicts. Partitions new in ``end`` start at 0 only if
    the caller put them in ``start``; a partition missing from ``start`` is read from ``end`` (nothing)."""
    ranges = []
    for topic in sorted(end):
        for part, stop in sorted(end[topic].items(), key=lambda kv: int(kv[0])):
            begin = start.get(topic, {}).get(part, stop)
            if stop > begin:
                ranges.append(OffsetRange(topic, int(part), begin, stop))
    return ranges


def apply_max_rows(start: Offsets, latest: Offsets, max_rows: int) -> Offsets:
    """Cap the total span of a batch at ``max_rows`` offsets, shared across partitions in
    proportion to what each has available (each lagging partition advances by at least one)."""
    lag = {(t, p): latest[t][p] - start.get(t, {}).get(p, latest[t][p]) for t in latest for p in latest[t]}
    total = sum(v for v in lag.values() if v > 0)
    if total <= max_rows:
        return {t: dict(ps) for t, ps in latest.items()}
    capped: Offsets = {}
    for (t, p), available in sorted(lag.items()):
        begin = start.get(t, {}).get(p, latest[t][p])
        step = 0 if available <= 0 else max(1, min(available, available * max_rows // total))
        capped.setdefault(t, {})[p] = begin + step
    return capped


def min_offsets(a: Offsets, b: Offsets) -> Offsets:
    """Per partition, the smaller of two offset dicts (partitions only in ``a`` are kept)."""
    return {t: {p: min(o, b.get(t, {}).get(p, o)) for p, o in ps.items()} for t, ps in a.items()}


def arrow_timestamp_type(kafka_type: int) -> int:
    """librdkafka's TIMESTAMP_CREATE_TIME (1) / LOG_APPEND_TIME (2) as Spark's 0 / 1."""
    return 1 if kafka_type == 2 else 0


def read_range(conf: Mapping[str, Any], rng: OffsetRange, include_headers: bool, timeout_s: float,
               batch_rows: int = ARROW_BATCH_ROWS) -> Iterator[Any]:
    """Yield pyarrow RecordBatches holding exactly the deliverable records of ``rng``.

    Raises TimeoutError if the consumer cannot reach ``rng.end`` within ``timeout_s`` (it stalls
    only if the broker lost data or an open transaction moved the LSO below a planned end, which a
    correct broker never does).
    """
    import pyarrow as pa
    from confluent_kafka import Consumer

    consumer = Consumer({**conf, "group.id": f"oncelog-spark-reader-{uuid.uuid4()}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "auto.offset.reset": "error"})
    schema = pa.schema(_arrow_fields(pa, include_headers))
    cols: dict[str, list[Any]] = {f.name: [] for f in schema}

    def flush() -> Any:
        batch = pa.RecordBatch.from_pydict(cols, schema=schema)
        for v in cols.values():
            v.clear()
        return batch

    try:
        for msgs in consume_range(consumer, rng.topic, rng.partition, rng.start, rng.end, timeout_s, batch_rows,
                                  what=str(rng)):
            for m in msgs:
                ts_type, ts = cast(Any, m.timestamp())
                cols["key"].append(m.key())
                cols["value"].append(m.value())
                cols["topic"].append(rng.topic)
                cols["partition"].append(rng.partition)
                cols["offset"].append(int(m.offset()))
                cols["timestamp"].append(ts * 1000 if ts >= 0 else None)
                cols["timestampType"].append(arrow_timestamp_type(ts_type))
                if include_headers:
                    hs: list[Any] = list(m.headers() or [])
                    cols["headers"].append([{"key": h[0], "value": h[1]} for h in hs])
                if len(cols["offset"]) >= batch_rows:
                    yield flush()
        if cols["offset"]:
            yield flush()
    finally:
        consumer.close()


def _arrow_fields(pa: Any, include_headers: bool) -> list[Any]:
    fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
              pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
              pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestampType", pa.int32())]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
    return fields


class KafkaMetadata:
    """Driver-side view of topics and offsets, through one lazily created consumer.

    Not picklable state: the consumer is dropped when Spark ships the reader to executors.
    """

    def __init__(self, options: Mapping[str, str]) -> None:
        self.conf = client_config(options)
        self.conf.setdefault("isolation.level", "read_committed")
        self.subscribe = get_option(options, "subscribe")
        self.pattern = get_option(options, "subscribePattern")
        assign = get_option(options, "assign")
        self.assign = parse_assign(assign) if assign else None
        if sum(x is not None for x in (self.subscribe, self.pattern, self.assign)) != 1:
            raise ValueError("exactly one of 'subscribe', 'subscribePattern' or 'assign' is required")
        self.timeout_s = (get_int(options, "kafkaConsumer.pollTimeoutMs", 120_000) or 120_000) / 1000
        self._consumer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        return state

    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({**self.conf, "group.id": f"oncelog-spark-driver-{uuid.uuid4()}",
                                       "enable.auto.commit": False})
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def partitions(self) -> dict[str, list[int]]:
        if self.assign is not None:
            return {t: list(ps) for t, ps in self.assign.items()}
        md = self.consumer().list_topics(timeout=self.timeout_s)
        if self.subscribe is not None:
            wanted = [t.strip() for t in self.subscribe.split(",") if t.strip()]
        else:
            regex = re.compile(self.pattern or "")
            wanted = [t for t in md.topics if regex.fullmatch(t) and not t.startswith("__")]
        found: dict[str, list[int]] = {}
        for t in wanted:
            tm = md.topics.get(t)
            if tm is None or tm.error is not None:
                continue
            found[t] = sorted(tm.partitions)
        return found

    def watermarks(self, parts: Mapping[str, Sequence[int]]) -> dict[str, dict[str, tuple[int, int]]]:
        """(log start, end) per partition; the end is the LSO when reading read_committed."""
        from confluent_kafka import TopicPartition

        c = self.consumer()
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for t, ps in parts.items():
            for p in ps:
                low, high = c.get_watermark_offsets(TopicPartition(t, p), timeout=self.timeout_s, cached=False)
                out.setdefault(t, {})[str(p)] = (int(low), int(high))
        return out

    def resolve(self, spec: str | dict[str, dict[int, int]], default_new: str) -> Offsets:
        """Turn ``earliest`` / ``latest`` / JSON into concrete offsets for every current partition."""
        marks = self.watermarks(self.partitions())
        resolved: Offsets = {}
        for t, ps in marks.items():
            for p, (low, high) in ps.items():
                if isinstance(spec, str):
                    want = EARLIEST if spec == "earliest" else LATEST
                else:
                    want = spec.get(t, {}).get(int(p), EARLIEST if default_new == "earliest" else LATEST)
                resolved.setdefault(t, {})[p] = low if want == EARLIEST else high if want == LATEST else want
        return resolved


def _check_data_loss(start: Offsets, marks: dict[str, dict[str, tuple[int, int]]], fail: bool) -> Offsets:
    fixed: Offsets = {t: dict(ps) for t, ps in start.items()}
    for t, ps in marks.items():
        for p, (low, high) in ps.items():
            cur = fixed.get(t, {}).get(p)
            if cur is None:
                # A partition that appeared after the query started is read from its beginning.
                fixed.setdefault(t, {})[p] = low
            elif cur < low or cur > high:
                if fail:
                    raise RuntimeError(f"data loss on {t}-{p}: next offset {cur} is outside [{low}, {high}] "
                                       "(set failOnDataLoss=false to skip)")
                fixed[t][p] = low if cur < low else high
    return fixed


try:  # pragma: no cover - exercised only with pyspark installed
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover
    DataSourceReader = DataSourceStreamReader = InputPartition = object  # type: ignore[assignment,misc]
    ReadAllAvailable = ReadLimit = ReadMaxRows = SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]


class RangePartition(InputPartition):
    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.rng = rng


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Runs its planning methods on the driver, ``read`` on executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.meta = KafkaMetadata(options)
        self.include_headers = get_bool(options, "includeHeaders", False)
        self.fail_on_data_loss = get_bool(options, "failOnDataLoss", True)
        starting = get_option(options, "startingOffsets", "latest") or "latest"
        self.starting = parse_offsets_spec(starting, "startingOffsets")
        self.max_rows = get_int(options, "maxOffsetsPerTrigger", None)
        self._available_now: Offsets | None = None

    def initialOffset(self) -> dict:
        return self.meta.resolve(self.starting, "earliest")

    def getDefaultReadLimit(self) -> Any:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        marks = self.meta.watermarks(self.meta.partitions())
        self._available_now = {t: {p: hi for p, (_lo, hi) in ps.items()} for t, ps in marks.items()}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        marks = self.meta.watermarks(self.meta.partitions())
        start = _check_data_loss(start, marks, self.fail_on_data_loss)
        latest: Offsets = {t: {p: hi for p, (_lo, hi) in ps.items()} for t, ps in marks.items()}
        if self._available_now is not None:
            latest = min_offsets(latest, self._available_now)
        # Never move a partition backwards (an LSO query can race a truncation we chose to skip).
        latest = {t: {p: max(o, start.get(t, {}).get(p, o)) for p, o in ps.items()} for t, ps in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = apply_max_rows(start, latest, int(limit.max_rows))
        return latest

    def reportLatestOffset(self) -> dict | None:
        marks = self.meta.watermarks(self.meta.partitions())
        return {t: {p: hi for p, (_lo, hi) in ps.items()} for t, ps in marks.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[Any]:
        marks = self.meta.watermarks({t: [int(p) for p in ps] for t, ps in end.items()})
        start = _check_data_loss(start, marks, self.fail_on_data_loss)
        return [RangePartition(r) for r in plan_ranges(start, end)]

    def read(self, partition: Any) -> Iterator[Any]:
        return read_range(self.meta.conf, partition.rng, self.include_headers, self.meta.timeout_s)

    def commit(self, end: dict) -> None:
        return None

    def stop(self) -> None:
        self.meta.close()


class KafkaBatchReader(DataSourceReader):
    """Batch read of ``[startingOffsets, endingOffsets)`` (defaults: earliest, latest)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.meta = KafkaMetadata(options)
        self.include_headers = get_bool(options, "includeHeaders", False)
        self.starting = parse_offsets_spec(get_option(options, "startingOffsets", "earliest") or "earliest",
                                           "startingOffsets")
        self.ending = parse_offsets_spec(get_option(options, "endingOffsets", "latest") or "latest", "endingOffsets")
        if self.starting == "latest" or self.ending == "earliest":
            raise ValueError("batch reads need startingOffsets != latest and endingOffsets != earliest")

    def partitions(self) -> Sequence[Any]:
        try:
            start = self.meta.resolve(self.starting, "earliest")
            end = self.meta.resolve(self.ending, "latest")
        finally:
            self.meta.close()
        return [RangePartition(r) for r in plan_ranges(start, end)]

    def read(self, partition: Any) -> Iterator[Any]:
        return read_range(self.meta.conf, partition.rng, self.include_headers, self.meta.timeout_s)

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
- The driver-side consumer only answers metadata, watermarks and timestamp lookups; executors open
  their own consumer per range with ``assign()`` (never joining a group). Group ids follow Spark:
  ``kafka.group.id`` when set (clusters with group ACLs), else ``{groupIdPrefix}-{uuid}``.
- ``minPartitions`` and ``maxRecordsPerPartition`` split large ranges the way Spark's
  ``KafkaOffsetRangeCalculator`` does, a pure function of the planned offsets, so a replayed batch
  is split into the same Spark partitions.
- ``commitOffsetsToGroup`` mirrors the offsets of each batch Spark committed into a consumer group,
  for lag tools only: the query itself always resumes from its checkpoint.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from oncelog.spark.clients import CONSUMERS, settle_worker
from oncelog.spark.options import (
    BATCH_ONLY_OPTIONS,
    DEFAULT_CONNECT_TIMEOUT_MS,
    EARLIEST,
    LATEST,
    SOURCE_OPTIONS,
    check_client_config,
    check_known,
    client_config,
    get_bool,
    get_duration_ms,
    get_int,
    get_option,
    has_option,
    parse_assign,
    parse_offsets_spec,
    parse_partition_json,
)
from oncelog.spark.ranges import consume_range

log = logging.getLogger("oncelog.spark")

Offsets = dict[str, dict[str, int]]

SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
              "timestampType int")
HEADERS_DDL = ", headers array<struct<key: string, value: binary>>"

#: Records per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 8192
#: Executor consumer settings unless the user's ``kafka.*`` options say otherwise. A range's reader
#: is lent from a pool (:data:`~oncelog.spark.clients.CONSUMERS`) and reassigned to the next range,
#: so: prefetch at most 20,000 records past a range (librdkafka's 100,000 are mostly dropped), and
#: once that prefetch queue is full, try again after 20 ms, not librdkafka's 1 s, which the next
#: range of the same partition inherited (one range in five waited about a second for its first
#: record); a fetch at the end of the log comes back after 20 ms, not 500 (a range that ends on a
#: transaction marker is complete only once a fetch past the marker returns).
SOURCE_CONSUMER_DEFAULTS = {"queued.min.messages": 20_000, "fetch.queue.backoff.ms": 20, "fetch.wait.max.ms": 20}


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


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records: int | None = None) -> list[OffsetRange]:
    """Spark's ``KafkaOffsetRangeCalculator`` (4.x), a pure function of the offsets, so a replayed
    batch is split the same way (the sink's replay decisions are per task):

    - ``max_records`` (``maxRecordsPerPartition``): a range of more offsets is divided into
      ``ceil(size / max_records)`` nearly equal parts;
    - then, with fewer ranges than ``min_partitions``: a range whose share of the total would give
      it one part stays whole ("unsplit"), and each other range is divided into
      ``max(round(size / split_total * (min_partitions - unsplit)), 1)`` parts, where
      ``split_total`` leaves the unsplit ranges out (SPARK-36576).

    Empty ranges are dropped; the last part of a range takes the rounding's remainder."""
    ranges = [r for r in ranges if r.end > r.start]
    if max_records:
        ranges = [part for r in ranges for part in _divided(r, -(-(r.end - r.start) // max_records))]
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    unsplit = {i for i, r in enumerate(ranges) if _part_count(r.end - r.start, total, min_partitions) == 1}
    split_total = total - sum(ranges[i].end - ranges[i].start for i in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    return [part for i, r in enumerate(ranges)
            for part in _divided(r, 1 if i in unsplit else _part_count(r.end - r.start, split_total, split_min))]


def _part_count(size: int, total: int, min_parts: int) -> int:
    return max(_round_half_up(size / total * min_parts), 1)


def _divided(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``r`` in ``parts`` nearly equal, non-empty pieces (integer division; the last one takes the rest)."""
    out = []
    remaining, begin = r.end - r.start, r.start
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        stop = min(begin + this, r.end)
        if stop > begin:
            out.append(OffsetRange(r.topic, r.partition, begin, stop))
        begin = stop
    return out


def _round_half_up(x: float) -> int:
    """Scala's ``math.round`` (half up), not Python's banker's rounding."""
    return int(x + 0.5)


def min_offsets(a: Offsets, b: Offsets) -> Offsets:
    """Per partition, the smaller of two offset dicts (partitions only in ``a`` are kept)."""
    return {t: {p: min(o, b.get(t, {}).get(p, o)) for p, o in ps.items()} for t, ps in a.items()}


def arrow_timestamp_type(kafka_type: int) -> int:
    """librdkafka's TIMESTAMP_CREATE_TIME (1) / LOG_APPEND_TIME (2) as Spark's 0 / 1."""
    return 1 if kafka_type == 2 else 0


#: Spark's advice to a query that failed on deleted records (its ``INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE``).
FAIL_ON_DATA_LOSS_ADVICE = ("Some data may have been lost because it is no longer available in Kafka: it was aged "
                            "out, or the topic was deleted before all its data was processed. If you don't want "
                            "your query to fail in such cases, set the source option 'failOnDataLoss' to 'false'.")


def read_range(conf: Mapping[str, Any], rng: OffsetRange, include_headers: bool, timeout_s: float,
               batch_rows: int = ARROW_BATCH_ROWS, group_id: str | None = None,
               fail_on_data_loss: bool = True) -> Iterator[Any]:
    """Yield pyarrow RecordBatches holding exactly the deliverable records of ``rng``.

    Raises TimeoutError if the consumer's position stops moving below ``rng.end`` for ``timeout_s``
    (it stalls only if the broker lost data or an open transaction moved the LSO below a planned
    end, which a correct broker never does); a long range that keeps moving never times out.

    Records of ``rng`` deleted after it was planned (retention or DeleteRecords racing a query
    that lags) fail the read with Spark's advice (:class:`~oncelog.spark.ranges.RecordsLost`),
    or, with ``fail_on_data_loss`` off (``failOnDataLoss=false``), are skipped with a warning, as
    Spark's Kafka source does.

    The consumer comes from this process's pool (:data:`CONSUMERS`) and goes back to it only when
    the range was read to its end; ``assign()`` of the next range resets its position, and records
    outside ``[start, end)`` are dropped, so what a previous range prefetched never leaks.
    """
    import pyarrow as pa

    settle_worker()
    group = group_id or f"oncelog-spark-source-{uuid.uuid4()}-executor"
    cfg = {**conf, "group.id": group, "enable.auto.commit": False, "enable.partition.eof": True,
           "auto.offset.reset": "error"}
    for k, v in SOURCE_CONSUMER_DEFAULTS.items():
        cfg.setdefault(k, v)
    current = [CONSUMERS.take(cfg)]
    schema = pa.schema(_arrow_fields(pa, include_headers))
    pending: list[Any] = []
    done = False

    def renew(spent: Any) -> Any:
        CONSUMERS.discard(spent)
        current[0] = CONSUMERS.make(cfg)
        return current[0]

    try:
        for msgs in consume_range(current[0], rng.topic, rng.partition, rng.start, rng.end, timeout_s, batch_rows,
                                  what=str(rng), skip_lost=not fail_on_data_loss,
                                  lost_advice=FAIL_ON_DATA_LOSS_ADVICE, renew=renew):
            pending.extend(msgs)
            if len(pending) >= batch_rows:
                yield _arrow_batch(pa, schema, rng, pending, include_headers)
                pending = []
        if pending:
            yield _arrow_batch(pa, schema, rng, pending, include_headers)
        done = True
    finally:
        if done:
            CONSUMERS.give(cfg, current[0])
        else:
            CONSUMERS.discard(current[0])


def _arrow_batch(pa: Any, schema: Any, rng: OffsetRange, msgs: list[Any], include_headers: bool) -> Any:
    """One RecordBatch from librdkafka messages: a list per column (no per-row dict or tuple), the
    topic and partition as repeated scalars."""
    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    arrays = [pa.array([m.key() for m in msgs], pa.binary()),
              pa.array([m.value() for m in msgs], pa.binary()),
              pa.repeat(pa.scalar(rng.topic, pa.string()), n),
              pa.repeat(pa.scalar(rng.partition, pa.int32()), n),
              pa.array([m.offset() for m in msgs], pa.int64()),
              pa.array([ts * 1000 if ts >= 0 else None for _t, ts in stamps], pa.timestamp("us", tz="UTC")),
              pa.array([1 if t == 2 else 0 for t, _ts in stamps], pa.int32())]
    if include_headers:
        arrays.append(pa.array([[{"key": h[0], "value": h[1]} for h in (m.headers() or ())] for m in msgs],
                               schema.field("headers").type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _arrow_fields(pa: Any, include_headers: bool) -> list[Any]:
    fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary()), pa.field("topic", pa.string()),
              pa.field("partition", pa.int32()), pa.field("offset", pa.int64()),
              pa.field("timestamp", pa.timestamp("us", tz="UTC")), pa.field("timestampType", pa.int32())]
    if include_headers:
        fields.append(pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))))
    return fields


@dataclass(frozen=True)
class OffsetSpec:
    """Where a read starts or ends: ``earliest``, ``latest``, per-partition ``offsets`` (-2/-1 for
    earliest/latest), one ``timestamp`` for every partition, or per-partition ``timestamps``."""

    kind: str
    option: str
    offsets: dict[str, dict[int, int]] | None = None
    timestamp: int | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str], side: str, default: str) -> OffsetSpec:
        """Spark's precedence: ``{side}Timestamp`` > ``{side}OffsetsByTimestamp`` > ``{side}Offsets``."""
        ts_name, by_ts_name, off_name = f"{side}Timestamp", f"{side}OffsetsByTimestamp", f"{side}Offsets"
        if has_option(options, ts_name):
            ts = get_int(options, ts_name, None, minimum=0)
            return cls("timestamp", ts_name, timestamp=ts)
        if has_option(options, by_ts_name):
            per = parse_partition_json(get_option(options, by_ts_name) or "", by_ts_name, "timestamp")
            if any(v < 0 for ps in per.values() for v in ps.values()):
                raise ValueError(f"option {by_ts_name!r}: timestamps must be >= 0 (milliseconds since the epoch)")
            return cls("timestamps", by_ts_name, offsets=per)
        spec = parse_offsets_spec(get_option(options, off_name, default) or default, off_name)
        if isinstance(spec, str):
            return cls(spec, off_name)
        return cls("offsets", off_name, offsets=spec)


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
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ValueError(f"option 'subscribePattern': not a regular expression: {exc}") from None
        self.timeout_s = (get_int(options, "kafkaConsumer.pollTimeoutMs", 120_000, minimum=1) or 120_000) / 1000
        self.connect_timeout_s = (get_int(options, "connectTimeoutMs", DEFAULT_CONNECT_TIMEOUT_MS, minimum=1)
                                  or DEFAULT_CONNECT_TIMEOUT_MS) / 1000
        self.retries = get_int(options, "fetchOffset.numRetries", 3, minimum=0) or 0
        self.retry_interval_s = (get_int(options, "fetchOffset.retryIntervalMs", 1000, minimum=0) or 0) / 1000
        self.fixed_group = self.conf.pop("group.id", None)
        prefix = get_option(options, "groupIdPrefix", "oncelog-spark-source") or "oncelog-spark-source"
        self.group_base = f"{prefix}-{uuid.uuid4()}"
        self._consumer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_consumer"] = None
        return state

    @property
    def driver_group(self) -> str:
        return self.fixed_group or f"{self.group_base}-driver-0"

    @property
    def executor_group(self) -> str:
        return self.fixed_group or f"{self.group_base}-executor"

    @property
    def bootstrap(self) -> str:
        return str(self.conf.get("bootstrap.servers"))

    def consumer(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer({**self.conf, "group.id": self.driver_group, "enable.auto.commit": False})
        return self._consumer

    def check(self) -> None:
        """At query start: librdkafka accepts the ``kafka.*`` options, and the cluster answers within
        ``connectTimeoutMs`` (ConnectionError naming the address otherwise)."""
        from confluent_kafka import KafkaException

        check_client_config({**self.conf, "group.id": self.driver_group}, producer=False)
        try:
            self.consumer().list_topics(timeout=self.connect_timeout_s)
        except KafkaException as exc:
            self.close()
            raise ConnectionError(f"cannot reach the Kafka cluster at {self.bootstrap} within "
                                  f"{self.connect_timeout_s:g}s (option connectTimeoutMs): {exc}") from None

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    def _retrying(self, what: str, fn: Any) -> Any:
        from confluent_kafka import KafkaException

        for attempt in range(self.retries + 1):
            try:
                return fn()
            except KafkaException as exc:
                if attempt >= self.retries:
                    raise RuntimeError(f"{what} from {self.bootstrap} failed after {attempt + 1} attempt(s) "
                                       f"(fetchOffset.numRetries={self.retries}): {exc}") from None
                time.sleep(self.retry_interval_s)
        raise AssertionError("unreachable")

    def partitions(self) -> dict[str, list[int]]:
        if self.assign is not None:
            return {t: list(ps) for t, ps in self.assign.items()}
        md = self._retrying("listing topics", lambda: self.consumer().list_topics(timeout=self.timeout_s))
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

    def vanished(self, parts: Mapping[str, Sequence[int]]) -> list[tuple[str, int]]:
        """The partitions of ``parts`` the cluster says no longer exist: their topic deleted, or made
        again with fewer partitions. A topic that is there but not ready (no leader yet) is not
        vanished: its watermarks are asked for, and retried, as before."""
        from confluent_kafka import KafkaError

        if not parts:
            return []
        only = next(iter(parts)) if len(parts) == 1 else None  # one topic's metadata, not the cluster's
        md = self._retrying("listing topics", lambda: self.consumer().list_topics(only, timeout=self.timeout_s))
        out = []
        for t, ps in sorted(parts.items()):
            tm = md.topics.get(t)
            for p in sorted(ps):
                if tm is None or (tm.error is not None and tm.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART) or \
                        (tm.error is None and p not in tm.partitions):
                    out.append((t, p))
        return out

    def watermarks(self, parts: Mapping[str, Sequence[int]]) -> dict[str, dict[str, tuple[int, int]]]:
        """(log start, end) per partition; the end is the LSO when reading read_committed."""
        from confluent_kafka import TopicPartition

        c = self.consumer()
        out: dict[str, dict[str, tuple[int, int]]] = {}
        for t, ps in parts.items():
            for p in ps:
                low, high = self._retrying(f"offsets of {t}-{p}", lambda t=t, p=p: c.get_watermark_offsets(
                    TopicPartition(t, p), timeout=self.timeout_s, cached=False))
                out.setdefault(t, {})[str(p)] = (int(low), int(high))
        return out

    def offsets_for_times(self, wanted: dict[str, dict[int, int]]) -> dict[str, dict[int, int]]:
        """The first offset at or after each timestamp (-1: none yet), below the LSO when read_committed."""
        from confluent_kafka import TopicPartition

        tps = [TopicPartition(t, p, ts) for t, ps in wanted.items() for p, ts in ps.items()]
        if not tps:
            return {}
        found = self._retrying("offsets by timestamp", lambda: self.consumer().offsets_for_times(
            tps, timeout=self.timeout_s))
        out: dict[str, dict[int, int]] = {}
        for tp in found:
            if tp.error is not None:
                raise RuntimeError(f"offset for timestamp in {tp.topic}-{tp.partition}: {tp.error}")
            out.setdefault(tp.topic, {})[tp.partition] = int(tp.offset)
        return out

    def resolve(self, spec: OffsetSpec | str | dict[str, dict[int, int]], default_new: str = "earliest",
                strategy: str = "error", ending: bool = False, fail_on_data_loss: bool = True) -> Offsets:
        """Concrete offsets for every current partition.

        Per-partition specs (offsets or timestamps) must name every partition, as in Spark. A
        timestamp with no record at or after it resolves to the latest offset for an ending spec
        or with ``startingOffsetsByTimestampStrategy=latest``, and is an error otherwise. Explicit
        ending offsets past a partition's end are a data loss (``_check_ending``).
        """
        if not isinstance(spec, OffsetSpec):  # the older call form: earliest/latest/JSON offsets
            spec = OffsetSpec(spec, "startingOffsets") if isinstance(spec, str) else \
                OffsetSpec("offsets", "startingOffsets", offsets=spec)
        parts = self.partitions()
        marks = self.watermarks(parts)
        if spec.offsets is not None:
            want = {(t, p) for t, ps in parts.items() for p in ps}
            given = {(t, p) for t, ps in spec.offsets.items() for p in ps}
            if want != given:
                missing = sorted(want - given)
                extra = sorted(given - want)
                raise ValueError(f"option {spec.option!r} must name every partition of the subscription, as in "
                                 f"Spark: missing {[f'{t}-{p}' for t, p in missing]}, "
                                 f"not subscribed {[f'{t}-{p}' for t, p in extra]}")
        by_time: dict[str, dict[int, int]] = {}
        if spec.kind == "timestamp":
            by_time = self.offsets_for_times({t: {p: cast(int, spec.timestamp) for p in ps}
                                              for t, ps in parts.items()})
        elif spec.kind == "timestamps":
            by_time = self.offsets_for_times(cast(dict, spec.offsets))
        resolved: Offsets = {}
        for t, ps in marks.items():
            for p, (low, high) in ps.items():
                if spec.kind in ("earliest", "latest"):
                    off = low if spec.kind == "earliest" else high
                elif spec.kind == "offsets":
                    want_off = cast(dict, spec.offsets)[t][int(p)]
                    off = low if want_off == EARLIEST else high if want_off == LATEST else want_off
                else:
                    found = by_time.get(t, {}).get(int(p), -1)
                    if found < 0:
                        if not ending and strategy != "latest":
                            ts = spec.timestamp if spec.timestamp is not None else cast(dict, spec.offsets)[t][int(p)]
                            raise ValueError(
                                f"option {spec.option!r}: no offset in {t}-{p} for timestamp {ts} (no committed "
                                "record at or after it); set startingOffsetsByTimestampStrategy=latest to start "
                                "such partitions at the latest offset")
                        found = high
                    off = found
                resolved.setdefault(t, {})[p] = off
        if ending and spec.kind == "offsets":
            resolved = _check_ending(resolved, marks, fail_on_data_loss)
        return resolved


def _check_data_loss(start: Offsets, marks: dict[str, dict[str, tuple[int, int]]], fail: bool,
                     quiet: bool = False) -> Offsets:
    """``start`` moved into each partition's ``[log start, end]`` (``marks``): a next offset outside
    it is a data loss (records deleted before they were read, or a log that lost its tail or was
    made again), an error, or under failOnDataLoss=false a warning naming the offsets skipped, as
    Spark's "Partition X's offset was changed from A to B". ``quiet`` keeps the warnings for the
    planning of the batch itself (``partitions``), which checks the same start again."""
    fixed: Offsets = {t: dict(ps) for t, ps in start.items()}
    for t, ps in marks.items():
        for p, (low, high) in ps.items():
            cur = fixed.get(t, {}).get(p)
            if cur is None:
                # A partition that appeared after the query started is read from its beginning; one
                # whose beginning is gone already is a data loss (Spark's "Added partition ...").
                fixed.setdefault(t, {})[p] = low
                if low > 0 and (fail or not quiet):
                    _data_loss(f"added partition {t}-{p} starts from {low} instead of 0", fail)
            elif cur < low or cur > high:
                new = low if cur < low else high
                if fail or not quiet:
                    _data_loss(f"data loss on {t}-{p}: next offset {cur} is outside [{low}, {high}]", fail,
                               f"the offset was changed from {cur} to {new}: records [{cur}, {low}) are skipped"
                               if cur < low else f"the offset was changed from {cur} to {new}: the log now ends "
                               f"there (the topic made again, or its tail lost), and records [{new}, {cur}) are "
                               "read again as they come")
                fixed[t][p] = new
    return fixed


def _check_planned_ends(start: Offsets, end: Offsets, marks: dict[str, dict[str, tuple[int, int]]],
                        fail: bool) -> None:
    """A planned (or replayed) batch whose range runs past its partition's end (``marks``; the LSO
    under read_committed, which never falls below a planned end unless records were lost): the log
    lost its tail, or the topic was made again, after the batch was planned. A data loss: an error,
    or under failOnDataLoss=false a warning, the reader skipping what is not there. A start already
    past the end is ``_check_data_loss``'s to report."""
    for t, ps in sorted(marks.items()):
        for p, (_low, high) in sorted(ps.items()):
            want, begin = end.get(t, {}).get(p), start.get(t, {}).get(p, high)
            if want is not None and want > high and want > begin and begin <= high:
                _data_loss(f"the batch reads {t}-{p} up to {want}, past its end {high} (records deleted, or the "
                           "topic made again, after the batch was planned)", fail,
                           f"records [{high}, {want}) are skipped unless they are there when read")


def _check_ending(end: Offsets, marks: dict[str, dict[str, tuple[int, int]]], fail: bool) -> Offsets:
    """A batch read's explicit endingOffsets past a partition's end (its high watermark, or LSO
    under read_committed): the records it names are not there. As in Spark (whose read meets an
    out-of-range offset), a data loss: an error, or under failOnDataLoss=false the range ends at
    the partition's end with a warning. Before, the read waited for the missing offsets for
    kafkaConsumer.pollTimeoutMs (120 s) and failed as "stuck", whatever failOnDataLoss said."""
    fixed: Offsets = {t: dict(ps) for t, ps in end.items()}
    for t, ps in marks.items():
        for p, (_low, high) in ps.items():
            want = fixed.get(t, {}).get(p)
            if want is not None and want > high:
                _data_loss(f"endingOffsets asks for {t}-{p} up to {want}, past its end {high}", fail,
                           f"read up to {high}")
                fixed[t][p] = high
    return fixed


def _report_gone(start: Offsets, end: Offsets, fail: bool) -> None:
    """Partitions the batch starts from but no longer has an end for: their topic was deleted, with
    records the query may not have read. As Spark's Kafka source
    (``getOffsetRangesFromResolvedOffsets``): a data loss, so an error unless ``failOnDataLoss`` is
    off, when a warning says it."""
    gone = sorted(f"{t}-{p}" for t, ps in start.items() for p in ps if p not in end.get(t, {}))
    if not gone:
        return
    _data_loss(f"partitions {', '.join(gone)} are gone (topic deleted?)", fail)


def _data_loss(message: str, fail: bool, outcome: str = "some data may have been missed") -> None:
    """A data loss the query meets: an error naming the failOnDataLoss option, or, with that option
    off, a warning saying what the query does instead (``outcome``)."""
    if fail:
        raise RuntimeError(f"{message}. {FAIL_ON_DATA_LOSS_ADVICE}")
    log.warning("%s: %s (failOnDataLoss=false)", message, outcome)


try:  # pragma: no cover - exercised only with pyspark installed
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        ReadMinRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover
    DataSourceReader = DataSourceStreamReader = InputPartition = object  # type: ignore[assignment,misc]
    ReadAllAvailable = ReadLimit = ReadMaxRows = ReadMinRows = SupportsTriggerAvailableNow = object  # type: ignore[assignment,misc]


class RangePartition(InputPartition):
    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.rng = rng


def _source_options(options: Mapping[str, str], streaming: bool) -> None:
    if streaming:
        for name in BATCH_ONLY_OPTIONS:
            if has_option(options, name):
                raise ValueError(f"option {name!r} is not supported in streaming queries (as in Spark's Kafka "
                                 "source): a stream has no end; use it in a batch read (spark.read)")
    check_known(options, SOURCE_OPTIONS, "source")
    strategy = (get_option(options, "startingOffsetsByTimestampStrategy", "error") or "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise ValueError(f"option 'startingOffsetsByTimestampStrategy' must be error or latest, not {strategy!r}")
    get_int(options, "maxOffsetsPerTrigger", None, minimum=1)
    get_int(options, "minOffsetsPerTrigger", None, minimum=1)
    get_int(options, "minPartitions", None, minimum=1)
    get_int(options, "maxRecordsPerPartition", None, minimum=1)
    get_duration_ms(options, "maxTriggerDelay", 15 * 60_000)
    get_bool(options, "includeHeaders", False)
    get_bool(options, "failOnDataLoss", True)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader. Runs its planning methods on the driver, ``read`` on executors."""

    def __init__(self, options: Mapping[str, str]) -> None:
        _source_options(options, streaming=True)
        self.meta = KafkaMetadata(options)
        self.include_headers = get_bool(options, "includeHeaders", False)
        self.fail_on_data_loss = get_bool(options, "failOnDataLoss", True)
        self.starting = OffsetSpec.parse(options, "starting", "latest")
        self.strategy = (get_option(options, "startingOffsetsByTimestampStrategy", "error") or "error").lower()
        self.max_rows = get_int(options, "maxOffsetsPerTrigger", None, minimum=1)
        self.min_rows = get_int(options, "minOffsetsPerTrigger", None, minimum=1)
        self.max_trigger_delay_ms = get_duration_ms(options, "maxTriggerDelay", 15 * 60_000)
        self.min_partitions = get_int(options, "minPartitions", None, minimum=1)
        self.max_records = get_int(options, "maxRecordsPerPartition", None, minimum=1)
        self.mirror_group = get_option(options, "commitOffsetsToGroup") or None
        self._available_now: Offsets | None = None
        self._last_trigger_ms = 0.0  # as Spark's lastTriggerMillis: the first batch is never delayed
        self.meta.check()

    def initialOffset(self) -> dict:
        return self.meta.resolve(self.starting, strategy=self.strategy)

    def getDefaultReadLimit(self) -> Any:
        if self.max_rows:
            return ReadMaxRows(self.max_rows)
        if self.min_rows:
            return ReadMinRows(self.min_rows)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        marks = self.meta.watermarks(self.meta.partitions())
        self._available_now = {t: {p: hi for p, (_lo, hi) in ps.items()} for t, ps in marks.items()}

    def latestOffset(self, start: dict, limit: Any) -> dict:
        marks = self.meta.watermarks(self.meta.partitions())
        start = _check_data_loss(start, marks, self.fail_on_data_loss, quiet=True)
        latest: Offsets = {t: {p: hi for p, (_lo, hi) in ps.items()} for t, ps in marks.items()}
        if self._available_now is not None:
            latest = min_offsets(latest, self._available_now)
        # Never move a partition backwards (an LSO query can race a truncation we chose to skip).
        latest = {t: {p: max(o, start.get(t, {}).get(p, o)) for p, o in ps.items()} for t, ps in latest.items()}
        if isinstance(limit, ReadAllAvailable):  # Trigger.Once asks for everything, as in Spark
            return latest
        if self.min_rows and self._available_now is None and self._delay(start, latest):
            return start
        if self.max_rows:
            latest = apply_max_rows(start, latest, self.max_rows)
        return latest

    def _delay(self, start: Offsets, latest: Offsets) -> bool:
        """Spark's ``delayBatch``: wait for minOffsetsPerTrigger new offsets, at most maxTriggerDelay."""
        now = time.time() * 1000
        if now - self._last_trigger_ms >= self.max_trigger_delay_ms:
            self._last_trigger_ms = now
            return False
        available = sum(o - start.get(t, {}).get(p, o) for t, ps in latest.items() for p, o in ps.items())
        if available < (self.min_rows or 0):
            return True
        self._last_trigger_ms = now
        return False

    def reportLatestOffset(self) -> dict | None:
        marks = self.meta.watermarks(self.meta.partitions())
        return {t: {p: hi for p, (_lo, hi) in ps.items()} for t, ps in marks.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[Any]:
        """The batch's ranges, for a new batch and for one Spark replays from its offset log alike.
        Data losses met since ``end`` was planned (partitions gone, records deleted, ends past the
        log) fail here under failOnDataLoss=true, at once and naming the partition; under false they
        are warned of, the ranges of vanished partitions are dropped and the reader skips the rest."""
        fail = self.fail_on_data_loss
        _report_gone(start, end, fail)
        vanished = self.meta.vanished({t: [int(p) for p in ps] for t, ps in end.items()})
        if vanished:
            names = ", ".join(f"{t}-{p}" for t, p in vanished)
            _data_loss(f"partitions {names} of the batch no longer exist (topic deleted, or made again with fewer "
                       "partitions)", fail, "their records are skipped")
            gone = {(t, str(p)) for t, p in vanished}
            end = {t: {p: o for p, o in ps.items() if (t, p) not in gone} for t, ps in end.items()}
        marks = self.meta.watermarks({t: [int(p) for p in ps] for t, ps in end.items()})
        checked = _check_data_loss(start, marks, fail)
        _check_planned_ends(start, end, marks, fail)
        return [RangePartition(r) for r in split_ranges(plan_ranges(checked, end), self.min_partitions,
                                                        self.max_records)]

    def read(self, partition: Any) -> Iterator[Any]:
        return read_range(self.meta.conf, partition.rng, self.include_headers, self.meta.timeout_s,
                          group_id=self.meta.executor_group, fail_on_data_loss=self.fail_on_data_loss)

    def commit(self, end: dict) -> None:
        if self.mirror_group:
            commit_to_group(self.meta, self.mirror_group, end)

    def stop(self) -> None:
        self.meta.close()


def commit_to_group(meta: KafkaMetadata, group: str, end: Offsets) -> None:
    """Mirror ``end`` (offsets Spark has committed) into consumer group ``group`` for lag tools.

    Best effort and one way: the query never reads these back (it resumes from its checkpoint),
    and a failure (no group ACL, an active member in that group) is logged, not raised.
    """
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    offsets = [TopicPartition(t, int(p), int(o)) for t, ps in end.items() for p, o in ps.items()]
    if not offsets:
        return
    c = Consumer({**meta.conf, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=offsets, asynchronous=False)
    except KafkaException as exc:
        log.warning("could not mirror offsets into consumer group %s: %s", group, exc)
    finally:
        c.close()


class KafkaBatchReader(DataSourceReader):
    """Batch read of ``[startingOffsets, endingOffsets)`` (defaults: earliest, latest); the
    timestamp forms and ``minPartitions`` as in Spark."""

    def __init__(self, options: Mapping[str, str]) -> None:
        _source_options(options, streaming=False)
        self.meta = KafkaMetadata(options)
        self.include_headers = get_bool(options, "includeHeaders", False)
        self.starting = OffsetSpec.parse(options, "starting", "earliest")
        self.ending = OffsetSpec.parse(options, "ending", "latest")
        self.fail_on_data_loss = get_bool(options, "failOnDataLoss", True)
        self.strategy = (get_option(options, "startingOffsetsByTimestampStrategy", "error") or "error").lower()
        self.min_partitions = get_int(options, "minPartitions", None, minimum=1)
        self.max_records = get_int(options, "maxRecordsPerPartition", None, minimum=1)
        if self.starting.kind == "latest" or self.ending.kind == "earliest":
            raise ValueError("batch reads need startingOffsets != latest and endingOffsets != earliest")
        if self.starting.kind == "offsets" and any(o == LATEST for ps in (self.starting.offsets or {}).values()
                                                   for o in ps.values()):
            raise ValueError("option 'startingOffsets': -1 (latest) is not allowed in a batch read")
        if self.ending.kind == "offsets" and any(o == EARLIEST for ps in (self.ending.offsets or {}).values()
                                                 for o in ps.values()):
            raise ValueError("option 'endingOffsets': -2 (earliest) is not allowed in a batch read")
        self.meta.check()

    def partitions(self) -> Sequence[Any]:
        try:
            start = self.meta.resolve(self.starting, strategy=self.strategy)
            end = self.meta.resolve(self.ending, ending=True, fail_on_data_loss=self.fail_on_data_loss)
        finally:
            self.meta.close()
        return [RangePartition(r) for r in split_ranges(plan_ranges(start, end), self.min_partitions, self.max_records)]

    def read(self, partition: Any) -> Iterator[Any]:
        return read_range(self.meta.conf, partition.rng, self.include_headers, self.meta.timeout_s,
                          group_id=self.meta.executor_group, fail_on_data_loss=self.fail_on_data_loss)

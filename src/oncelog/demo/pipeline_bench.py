"""End-to-end pipeline throughput and latency per guarantee, side by side with a plain copier.

``python -m oncelog.demo.pipeline_bench [--bootstrap H:P] [--records N] [--max-offsets B] [--rounds R]
[--master M] [--latency-rate N --latency-seconds S]`` prints one JSON line (the last line of stdout)::

    {"exactly_once": {"records": N, "seconds": s, "records_per_s": r, ...},
     "at_least_once": {...}, "at_most_once": {...},
     "copier": {...},                      # the anchor, see below
     "ratio_eo_vs_alo": x, "ratio_eo_vs_copier": y, "ratio_amo_vs_alo": z,
     "rounds": [{...per round...}], "latency": {g: {"p50_ms", "p99_ms", ...}}, "spark_ms": {...},
     "cpu_s": {...}, "conditions": {...}}

Per guarantee the top-level figure is the median over ``--rounds`` rounds; each round runs the
copier and every guarantee one after the other (same broker, same input topic, same machine), so
ratios are taken within a round and their median reported. Round ``r`` starts at the ``r``-th
guarantee (the order rotates): whichever query runs first after the warm-up still pays some of the
JVM's compilation (see below), and rotating spreads that over the guarantees.

**The anchor** is a single-process confluent-kafka transactional copier (:func:`copy_transactional`):
consume a batch (read_committed), produce it, ``send_offsets_to_transaction``, commit; one
transaction per ``consume`` call of up to ``--max-offsets`` records (100,000 with ``--max-offsets 0``), the
same unit as the pipeline's micro-batch. It runs in its own process, while the Spark session sits idle.

**Latency** (``--latency-seconds`` > 0): a producer writes ``--latency-rate`` records/s, each value
stamped with its send time and its sequence number, into a fresh topic while the query (or the
copier) runs continuously (default trigger); a read_committed consumer on the output records, per
distinct record (a duplicate is not a second sample), the time from the send to seeing it, waiting
until it has seen every record sent (or ``LATENCY_WAIT_S``). The first two seconds are a warm-up and
not counted. Records never seen are counted (``unseen``) and enter the percentiles as the worst case.

**The output is checked.** Every input record carries its index in its value's first 8 bytes
(:func:`fill`); when a query's (or the copier's) clock has stopped, a read_committed consumer reads
the output to its end and counts the distinct records there (:func:`check_output`): each figure has
``visible``, ``missing`` and ``duplicates``, and a figure with records missing (not visible when the
clock stopped) or duplicated is one the report marks.

Without ``--bootstrap`` the bench starts our broker in a temporary directory (its CPU is reported
per phase in ``cpu_s``, beside the Spark side's: who limits is in the figures). Each guarantee reads
the same input topic (oncelog source) and writes its own output topic (oncelog sink) with
``trigger(availableNow=True)``; the clock runs from ``start()`` to termination, after the session,
the Python workers and the JVM's compiled code are warm: a warm-up query per guarantee first moves
``min(records, WARM_UP_RECORDS)`` records in micro-batches of the measured size. (With one warm-up
query of 1,000 records, whichever guarantee ran first paid about 6-10 CPU-seconds more in the JVM
than the same guarantee run second, which moved exactly_once / at_least_once by 0.2.) Nothing here
asserts a time.

Python API (``oncelog bench`` imports it): :func:`fill`, :func:`run_one`, :func:`measure` (keyword
arguments after ``guarantees`` are optional), :func:`copy_transactional`, :func:`measure_latency`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import struct
import sys
import tempfile
import threading
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

from oncelog.charts import percentile
from oncelog.spark import OncelogDataSource
from oncelog.spark.sink import KafkaStreamWriter
from oncelog.testing.broker_process import create_topic, oncelog_broker

GUARANTEES = ("at_least_once", "exactly_once", "at_most_once")
#: Spark's per-batch phase timings summed over a query (``StreamingQueryProgress.durationMs``).
SPARK_PHASES = ("triggerExecution", "latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch",
                "commitOffsets")
WARM_UP_S = 2.0
#: Records of the throughput run's warm-up query (fewer when the run itself has fewer).
WARM_UP_RECORDS = 400_000
#: The copier's largest transaction (one consume call) when the pipeline runs one batch (--max-offsets 0);
#: otherwise each transaction is as large as a micro-batch, up to what one consume call returns.
COPIER_MAX_BATCH = 100_000
#: confluent-kafka's ``Consumer.consume`` refuses ``num_messages`` above this.
CONSUME_MAX_MESSAGES = 1_000_000


def copier_batch(max_offsets: int, records: int) -> int:
    """The copier's transaction size for micro-batches of ``max_offsets`` (0: one batch of ``records``)."""
    return min(max_offsets or min(records, COPIER_MAX_BATCH), CONSUME_MAX_MESSAGES)


RECORD_INDEX = struct.Struct(">q")  # the first 8 bytes of every value fill() writes: the record's index


def fill(bootstrap: str, topic: str, records: int, size: int) -> None:
    """``records`` records of ``size`` bytes (at least 8), record ``i`` with key ``i mod 1000`` and
    ``i`` in its value's first 8 bytes (``RECORD_INDEX``), so that an output can be checked record by
    record (:func:`check_output`)."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    value = bytearray(b"x" * max(size, RECORD_INDEX.size))
    for i in range(records):
        RECORD_INDEX.pack_into(value, 0, i)
        while True:
            try:
                p.produce(topic, key=b"%d" % (i % 1000), value=bytes(value))
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def _spark_timings(q: Any) -> dict[str, int]:
    out = dict.fromkeys(SPARK_PHASES, 0)
    out["batches"] = 0
    for p in q.recentProgress:
        d = p.durationMs or {}
        if not p.numInputRows:
            continue
        out["batches"] += 1
        for k in SPARK_PHASES:
            out[k] += int(d.get(k, 0))
    return out


class _PhaseRecordingWriter(KafkaStreamWriter):
    """The sink's writer, appending each task's phase timings (its commit message) to a JSON-lines
    file named by the ``bench.phasesFile`` option, on the driver."""

    def __init__(self, options: Any) -> None:
        self.phases_file = {k.lower(): v for k, v in options.items()}.get("bench.phasesfile")
        super().__init__({k: v for k, v in options.items() if k.lower() != "bench.phasesfile"})

    def commit(self, messages: list[Any], batchId: int) -> None:
        super().commit(messages, batchId)
        if self.phases_file:
            with open(self.phases_file, "a") as f:
                for m in messages:
                    if m is not None:
                        # getattr: the same bench runs against sinks without phase timings (before/after)
                        f.write(json.dumps({"batch": batchId, "partition": m.partition_id, "rows": m.rows,
                                            "reused": getattr(m, "reused_producer", False),
                                            **getattr(m, "phases", {})}) + "\n")


class BenchDataSource(OncelogDataSource):
    """``format("oncelog-bench")``: the oncelog source and sink, with per-task timings recorded."""

    @classmethod
    def name(cls) -> str:
        return "oncelog-bench"

    def _stream_writer(self) -> Any:
        return _PhaseRecordingWriter(self.options)


def _phase_summary(path: Path) -> dict[str, Any]:
    """Per-task seconds summed over a query's tasks, by phase, with the share of reused producers."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    out: dict[str, Any] = {"tasks": len(rows), "reused_producer": sum(1 for r in rows if r.get("reused"))}
    for r in rows:
        for k, v in r.items():
            if k not in ("batch", "partition", "rows", "reused"):
                out[k] = round(out.get(k, 0.0) + v, 2)
    return out


#: Extra sink options for every query of this process (``--sink-option``), e.g. reuseTransactionalProducers.
SINK_OPTIONS: dict[str, str] = {}


def _query(spark: Any, bootstrap: str, source: str, out: str, guarantee: str, checkpoint: Path,
           max_offsets: int, available_now: bool) -> Any:
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", source).option("startingOffsets", "earliest"))
    if max_offsets:
        src = src.option("maxOffsetsPerTrigger", str(max_offsets))
    w = (src.load().selectExpr("key", "value").writeStream.format("oncelog-bench")
         .option("bench.phasesFile", str(checkpoint) + ".phases.jsonl")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", out)
         .option("processing.guarantee", guarantee).option("progress.topic", f"{out}-progress")
         .option("checkpointLocation", str(checkpoint)))
    for k, v in SINK_OPTIONS.items():
        w = w.option(k, v)
    if available_now:
        w = w.trigger(availableNow=True)
    return w.start()


def run_one(spark: Any, bootstrap: str, source: str, guarantee: str, work: Path, max_offsets: int,
            out: str | None = None, timings: dict[str, Any] | None = None) -> float:
    """Seconds for one availableNow query copying ``source`` into ``out`` (default
    ``{source}-out-{guarantee}``, created here with 2 partitions); Spark's phase timings go into
    ``timings`` when given."""
    out = out or f"{source}-out-{guarantee}"
    create_topic(bootstrap, out, 2)
    start = time.perf_counter()
    q = _query(spark, bootstrap, source, out, guarantee, work / f"ck-{out}", max_offsets, True)
    q.awaitTermination()
    took = time.perf_counter() - start
    if q.exception() is not None:
        raise RuntimeError(f"{guarantee}: {q.exception()}")
    if timings is not None:
        timings.update(_spark_timings(q))
        timings["tasks_s"] = _phase_summary(work / f"ck-{out}.phases.jsonl")
    return took


def tally(values: Any, records: int) -> dict[str, int]:
    """Of the values read from an output: ``visible`` distinct input records (by the index
    :func:`fill` wrote), ``missing`` (records - visible), ``duplicates`` (reads of a record already
    counted) and ``foreign`` (values without an index below ``records``)."""
    seen = bytearray(records)
    total = foreign = 0
    for v in values:
        total += 1
        i = RECORD_INDEX.unpack_from(v)[0] if v is not None and len(v) >= RECORD_INDEX.size else -1
        if 0 <= i < records:
            seen[i] = 1
        else:
            foreign += 1
    visible = records - seen.count(0)
    return {"visible": visible, "missing": records - visible, "duplicates": total - foreign - visible,
            "foreign": foreign}


def check_output(bootstrap: str, topic: str, records: int, timeout_s: float = 300.0) -> dict[str, int]:
    """:func:`tally` of what a read_committed consumer reads in ``topic`` from its start to its end,
    now; ``unread_partitions`` when some partition's end was not reached within ``timeout_s``."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-check-{time.time_ns()}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "isolation.level": "read_committed",
                  "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760, "log_level": 3})
    eof: set[int] = set()

    def values() -> Any:
        deadline = time.monotonic() + timeout_s
        while len(eof) < len(parts) and time.monotonic() < deadline:
            for m in c.consume(10_000, 0.2):
                err = m.error()
                if err is None:
                    yield m.value()
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(int(m.partition() or 0))

    try:
        parts = sorted(c.list_topics(topic, timeout=30).topics[topic].partitions)
        c.assign([TopicPartition(topic, q, OFFSET_BEGINNING) for q in parts])
        out = tally(values(), records)
    finally:
        c.close()
    if len(eof) < len(parts):
        out["unread_partitions"] = len(parts) - len(eof)
    return out


def copy_transactional(bootstrap: str, source: str, out: str, records: int, batch: int,
                       poll_timeout_s: float = 1.0, tag: str = "", stop: threading.Event | None = None,
                       ) -> dict[str, Any]:
    """The anchor: one process, one read_committed consumer and one transactional producer; per
    ``consume`` call of up to ``batch`` records: begin, produce each, send the consumer's
    positions to the transaction, commit. Stops after ``records`` records, or (between two
    transactions) once ``stop`` is set."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    tag = tag or f"{os.getpid()}-{time.time_ns()}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-copier-{tag}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"bench-copier-{tag}",
                  "enable.idempotence": True, "acks": "all"})
    parts = sorted(c.list_topics(source, timeout=10).topics[source].partitions)
    c.assign([TopicPartition(source, q, 0) for q in parts])
    p.init_transactions(30)
    copied = transactions = 0
    start = time.perf_counter()
    try:
        while copied < records and not (stop is not None and stop.is_set()):
            msgs = c.consume(num_messages=batch, timeout=poll_timeout_s)
            msgs = [m for m in msgs if m.error() is None]
            if not msgs:
                continue
            p.begin_transaction()
            for m in msgs:
                while True:
                    try:
                        p.produce(out, value=m.value(), key=m.key(), partition=int(m.partition() or 0))
                        break
                    except BufferError:
                        p.poll(0.01)
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), 30)
            p.commit_transaction(60)
            copied += len(msgs)
            transactions += 1
        took = time.perf_counter() - start
    finally:
        c.close()
    return {"records": copied, "seconds": round(took, 3), "records_per_s": round(copied / took),
            "transactions": transactions}


def _copier_process(conn: Any, *args: Any) -> None:
    try:
        conn.send(copy_transactional(*args))
    except BaseException as exc:  # reported to the parent, which raises
        conn.send({"error": repr(exc)})


def run_copier(bootstrap: str, source: str, out: str, records: int, batch: int,
               poll_timeout_s: float = 1.0) -> dict[str, Any]:
    """:func:`copy_transactional` in its own (spawned) process; the output topic is created here."""
    import multiprocessing

    create_topic(bootstrap, out, 2)
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_copier_process, args=(child, bootstrap, source, out, records, batch, poll_timeout_s))
    proc.start()
    try:
        result: dict[str, Any] = parent.recv()
    finally:
        proc.join(60)
    if "error" in result:
        raise RuntimeError(f"copier: {result['error']}")
    return result


LATENCY_STAMP = struct.Struct(">qq")  # a latency record's value: wall-clock send time (ns), sequence number
#: How long a latency run waits, after its producer has finished, for the records not seen yet.
LATENCY_WAIT_S = 120.0


def _stamped_producer(bootstrap: str, topic: str, rate: int, seconds: float, size: int, stop: threading.Event,
                      sent: list[int]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "enable.idempotence": True})
    pad = b"x" * max(0, size - LATENCY_STAMP.size)
    start = time.monotonic()
    n = 0
    while not stop.is_set():
        elapsed = time.monotonic() - start
        if elapsed >= seconds:
            break
        due = int(elapsed * rate)
        while n < due:
            try:
                p.produce(topic, key=b"%d" % (n % 1000), value=LATENCY_STAMP.pack(time.time_ns(), n) + pad)
                n += 1
            except BufferError:
                p.poll(0.01)
        p.poll(0.002)
    p.flush(60)
    sent.append(n)


def _latency_consumer(bootstrap: str, topic: str, since_ns: int, stop: threading.Event,
                      got: list[float], seen: list[int]) -> None:
    """Until ``stop``: ``seen[0]`` distinct records read (by sequence number), ``seen[1]`` reads of a
    record already seen; ``got`` one latency (ms) per distinct record sent from ``since_ns`` on."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-latency-{time.time_ns()}",
                  "enable.auto.commit": False, "isolation.level": "read_committed", "fetch.wait.max.ms": 5})
    parts = sorted(c.list_topics(topic, timeout=10).topics[topic].partitions)
    c.assign([TopicPartition(topic, q, 0) for q in parts])
    ids: set[int] = set()
    try:
        while not stop.is_set():
            for m in c.consume(num_messages=10000, timeout=0.05):
                if m.error() is not None:
                    continue
                now = time.time_ns()
                v = m.value() or b""
                if len(v) < LATENCY_STAMP.size:
                    continue
                sent_ns, n = LATENCY_STAMP.unpack_from(v)
                if n in ids:
                    seen[1] += 1
                    continue
                ids.add(n)
                seen[0] += 1
                if sent_ns >= since_ns:
                    got.append((now - sent_ns) / 1e6)
    finally:
        c.close()


def _percentile(xs: list[float], q: float) -> float:
    """The ``q``-quantile (0-1) of ``xs``, nearest rank (``charts.nearest_rank``; nan when empty)."""
    return percentile(sorted(xs), Fraction(repr(q)) * 100)


def measure_latency(spark: Any, bootstrap: str, who: str, work: Path, rate: int, seconds: float, size: int,
                    max_offsets: int) -> dict[str, Any]:
    """p50/p99 (ms) from a record's send to a read_committed consumer seeing it in the output, at a
    fixed ``rate``; ``who`` is a guarantee (a continuous Spark query) or ``copier``. One sample per
    distinct record; ``seen`` of ``sent`` distinct records were seen, ``duplicates`` reads were of a
    record already seen, and the ``unseen`` (after ``LATENCY_WAIT_S``) enter the percentiles as the
    worst case (``unseen_ms``: the slowest latency seen or the wait since the producer finished,
    whichever is larger)."""
    tag = f"lat-{who}-{time.time_ns() % 10**9}"
    src, out = f"{tag}-in", f"{tag}-out"
    create_topic(bootstrap, src, 2)
    create_topic(bootstrap, out, 2)
    stop, done = threading.Event(), threading.Event()
    got: list[float] = []
    seen: list[int] = [0, 0]
    sent: list[int] = []
    since = time.time_ns() + int(WARM_UP_S * 1e9)
    reader = threading.Thread(target=_latency_consumer, args=(bootstrap, out, since, stop, got, seen), daemon=True)
    reader.start()
    q: Any = None
    copier: Any = None
    if who == "copier":
        # the producer sends at most n (fewer when its last pass comes early): the copier runs until
        # stopped, with the reader, once every record sent was seen (or the wait ran out)
        n = int(rate * seconds)
        copier = threading.Thread(target=lambda: copy_transactional(
            bootstrap, src, out, n, copier_batch(max_offsets, n), 0.05, stop=stop), daemon=True)
    else:
        q = _query(spark, bootstrap, src, out, who, work / f"ck-{tag}", max_offsets, False)
    writer = threading.Thread(target=_stamped_producer, args=(bootstrap, src, rate, seconds, size, done, sent),
                              daemon=True)
    writer.start()
    if copier is not None:
        copier.start()
    writer.join()
    finished = time.monotonic()
    deadline = finished + LATENCY_WAIT_S
    while seen[0] < sent[0] and time.monotonic() < deadline:
        if q is not None and q.exception() is not None:
            break
        time.sleep(0.05)
    stop.set()
    reader.join(10)
    waited_ms = (time.monotonic() - finished) * 1000
    if q is not None:
        exc = q.exception()
        q.stop()
        if exc is not None:
            raise RuntimeError(f"{who}: {exc}")
    if copier is not None:
        copier.join(30)
        if copier.is_alive():
            raise RuntimeError("copier: still copying 30 s after the latency run was stopped")
    return latency_figures(rate, seconds, sent[0], seen[0], seen[1], got, waited_ms)


def latency_figures(rate: int, seconds: float, sent: int, seen: int, duplicates: int, got: list[float],
                    waited_ms: float) -> dict[str, Any]:
    """A latency run's figures: the records never seen count as the worst case."""
    unseen = max(sent - seen, 0)
    samples = list(got)
    out: dict[str, Any] = {"rate": rate, "seconds": seconds, "sent": sent, "seen": seen, "duplicates": duplicates,
                           "unseen": unseen, "samples": len(got)}
    if unseen:
        worst = max(max(got, default=0.0), waited_ms)
        samples += [worst] * unseen
        out["unseen_ms"] = round(worst, 1)
    return {**out, "p50_ms": round(_percentile(samples, 0.50), 1), "p99_ms": round(_percentile(samples, 0.99), 1),
            "max_ms": round(max(samples), 1) if samples else None}


def _tree_cpu_s(root: int) -> dict[str, float]:
    """CPU seconds of ``root`` and its live descendants: ``total`` (user + system, with reaped
    children), and ``jvm`` (Spark's JVMs, their own threads only) and ``python`` (every other
    process of the tree: the driver, Spark's Python workers and the children they reaped). A Python
    process the JVM started and reaped (a per-batch runner) counts in ``total`` only."""
    tick = os.sysconf("SC_CLK_TCK")
    children: dict[int, list[int]] = {}
    stats: dict[int, tuple[float, float, bool]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        pid = int(d)
        children.setdefault(int(fields[1]), []).append(pid)
        own = sum(int(x) for x in fields[11:13]) / tick
        stats[pid] = (own, own + sum(int(x) for x in fields[13:15]) / tick, head.endswith("(java"))
    out = {"total": 0.0, "jvm": 0.0, "python": 0.0}
    todo = [root]
    while todo:
        pid = todo.pop()
        own, with_children, java = stats.get(pid, (0.0, 0.0, False))
        out["total"] += with_children
        out["jvm" if java else "python"] += own if java else with_children
        todo.extend(children.get(pid, []))
    return out


class _Cpu:
    """CPU seconds of this process tree (driver, JVM, Python workers) and of the broker, per phase."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker_pid = broker_pid
        self.phases: dict[str, dict[str, float]] = {}

    def _now(self) -> tuple[dict[str, float], float, float]:
        broker = _tree_cpu_s(self.broker_pid)["total"] if self.broker_pid else 0.0
        return _tree_cpu_s(os.getpid()), broker, time.perf_counter()

    def measure(self, name: str, fn: Any) -> Any:
        before = self._now()
        result = fn()
        after = self._now()
        self.phases[name] = {"wall_s": round(after[2] - before[2], 2),
                             "clients_cpu_s": round(after[0]["total"] - before[0]["total"], 2),
                             "jvm_cpu_s": round(after[0]["jvm"] - before[0]["jvm"], 2),
                             "python_cpu_s": round(after[0]["python"] - before[0]["python"], 2),
                             "broker_cpu_s": round(after[1] - before[1], 2)}
        return result


def measure(bootstrap: str, records: int, size: int, max_offsets: int, guarantees: list[str],
            master: str | None = None, rounds: int = 1, copier: bool = True, latency_rate: int = 10_000,
            latency_seconds: float = 0.0, broker_pid: int | None = None,
            spark_conf: dict[str, str] | None = None, keep: bool = False) -> dict[str, Any]:
    """Measure on the broker at ``bootstrap``. The queries' checkpoints and task phases go into a
    temporary directory, removed at the end unless ``keep`` (then its path is printed to stderr)."""
    work = Path(tempfile.mkdtemp(prefix="oncelog-pipeline-bench-"))
    try:
        return _measure(bootstrap, records, size, max_offsets, guarantees, work, master, rounds, copier,
                        latency_rate, latency_seconds, broker_pid, spark_conf)
    finally:
        _remove_unless(keep, work, "the queries' checkpoints and task phases")


def _remove_unless(keep: bool, path: Path, what: str) -> None:
    """Remove the temporary directory ``path``, or with ``keep`` say on stderr where ``what`` stays."""
    if keep:
        print(f"kept {what} in {path}", file=sys.stderr, flush=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def _measure(bootstrap: str, records: int, size: int, max_offsets: int, guarantees: list[str], work: Path,
             master: str | None, rounds: int, copier: bool, latency_rate: int, latency_seconds: float,
             broker_pid: int | None, spark_conf: dict[str, str] | None) -> dict[str, Any]:
    from oncelog.spark import local_session

    create_topic(bootstrap, "bench-in", 2)
    create_topic(bootstrap, "bench-warm", 2)
    fill(bootstrap, "bench-in", records, size)
    warm_records = min(records, WARM_UP_RECORDS)
    fill(bootstrap, "bench-warm", warm_records, size)
    spark = local_session("oncelog-pipeline-bench", master=master, extra=spark_conf)
    spark.dataSource.register(BenchDataSource)
    cpu = _Cpu(broker_pid)
    per_round: list[dict[str, Any]] = []
    timings: dict[str, Any] = {}
    latency: dict[str, Any] = {}
    batch = copier_batch(max_offsets, records)
    try:
        for g in guarantees:  # each guarantee's own path (JVM and Python) warmed before any is timed
            run_one(spark, bootstrap, "bench-warm", g, work / "warm", min(max_offsets or warm_records, warm_records))
        for r in range(rounds):
            order = round_order(guarantees, r)
            row: dict[str, Any] = {}
            if copier:
                row["copier"] = cpu.measure(f"copier-{r}", lambda r=r: run_copier(
                    bootstrap, "bench-in", f"bench-copy-{r}", records, batch))
                row["copier"].update(check_output(bootstrap, f"bench-copy-{r}", records))
            for g in order:
                t: dict[str, Any] = {}
                s = cpu.measure(f"{g}-{r}", lambda g=g, r=r, t=t: run_one(
                    spark, bootstrap, "bench-in", g, work, max_offsets, f"bench-out-{g}-{r}", t))
                # outside the clock: what the clock's figure claims is in the output, read_committed
                row[g] = {"records": records, "seconds": round(s, 3), "records_per_s": round(records / s),
                          **check_output(bootstrap, f"bench-out-{g}-{r}", records)}
                timings.setdefault(g, []).append(t)
            row.update(_ratios(row))
            per_round.append(row)
        if latency_seconds > 0:
            for who in (["copier"] if copier else []) + list(guarantees):
                latency[who] = cpu.measure(f"latency-{who}", lambda who=who: measure_latency(
                    spark, bootstrap, who, work, latency_rate, latency_seconds, size, max_offsets))
    finally:
        spark.stop()
    result: dict[str, Any] = {}
    for who in (["copier"] if copier else []) + list(guarantees):
        figures = sorted((row[who] for row in per_round), key=lambda f: f["records_per_s"])
        result[who] = figures[len(figures) // 2]
    for name in ("ratio_eo_vs_alo", "ratio_eo_vs_copier", "ratio_amo_vs_alo"):
        values = [row[name] for row in per_round if name in row]
        if values:
            result[name] = round(statistics.median(values), 3)
    result["rounds"] = per_round
    result["latency"] = latency
    result["spark_ms"] = timings
    result["cpu_s"] = cpu.phases
    load = os.getloadavg()
    result["conditions"] = {"master": master or "local[2]", "records": records, "size": size,
                            "max_offsets_per_trigger": max_offsets, "rounds": rounds, "cpus": os.cpu_count(),
                            "load_average_1_5_15": [round(x, 2) for x in load]}
    return result


def round_order(guarantees: list[str], r: int) -> list[str]:
    """The guarantees in round ``r``'s order: rotated by ``r``, so over ``len(guarantees)`` rounds
    each runs first (right after the warm-up, the slot that pays for the JVM's compilation) once."""
    k = r % len(guarantees) if guarantees else 0  # none: the copier alone
    return guarantees[k:] + guarantees[:k]


def _ratios(row: dict[str, Any]) -> dict[str, float]:
    out = {}
    rate = {k: v["records_per_s"] for k, v in row.items() if isinstance(v, dict)}
    if "exactly_once" in rate and "at_least_once" in rate:
        out["ratio_eo_vs_alo"] = round(rate["exactly_once"] / rate["at_least_once"], 3)
    if "exactly_once" in rate and "copier" in rate:
        out["ratio_eo_vs_copier"] = round(rate["exactly_once"] / rate["copier"], 3)
    if "at_most_once" in rate and "at_least_once" in rate:
        out["ratio_amo_vs_alo"] = round(rate["at_most_once"] / rate["at_least_once"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--max-offsets", type=int, default=50_000, help="maxOffsetsPerTrigger (0: one batch)")
    p.add_argument("--guarantees", default=",".join(GUARANTEES))
    p.add_argument("--master", default="", help="Spark master (default local[2]), e.g. local-cluster[2,1,1024]")
    p.add_argument("--rounds", type=int, default=1, help="repeat copier + every guarantee this many times")
    p.add_argument("--no-copier", action="store_true", help="skip the transactional copier anchor")
    p.add_argument("--latency-rate", type=int, default=10_000, help="records/s for the latency phase")
    p.add_argument("--latency-seconds", type=float, default=15.0, help="latency phase per guarantee (0: none)")
    p.add_argument("--sink-option", action="append", default=[], metavar="K=V", help="extra sink option")
    p.add_argument("--spark-conf", action="append", default=[], metavar="K=V", help="extra Spark setting")
    p.add_argument("--keep", action="store_true",
                   help="keep the broker's data and the queries' checkpoints and task phases (removed by default)")
    args = p.parse_args(argv)
    SINK_OPTIONS.update(kv.split("=", 1) for kv in args.sink_option)
    guarantees = [g for g in args.guarantees.split(",") if g]
    kw = {"master": args.master or None, "rounds": max(1, args.rounds), "copier": not args.no_copier,
          "latency_rate": args.latency_rate, "latency_seconds": args.latency_seconds,
          "spark_conf": dict(kv.split("=", 1) for kv in args.spark_conf), "keep": args.keep}
    if args.bootstrap:
        print(json.dumps(measure(args.bootstrap, args.records, args.size, args.max_offsets, guarantees, **kw)))
        return 0
    d = Path(tempfile.mkdtemp(prefix="oncelog-pipeline-bench-broker-"))
    broker = oncelog_broker(d / "data", log_path=d / "broker.log").start()
    try:
        pid = broker.proc.pid if broker.proc is not None else None
        print(f"broker pid {pid}", file=sys.stderr, flush=True)
        print(json.dumps(measure(broker.bootstrap, args.records, args.size, args.max_offsets, guarantees,
                                 broker_pid=pid, **kw)))
    finally:
        broker.kill()
        _remove_unless(args.keep, d, "the broker's data")  # gigabytes of records per run
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What `oncelog bench` measures, and in which order: both brokers run side by side for the whole
bench, every figure of one broker is measured in the same run as the other's, and the fixed rates of
the latency runs are the same for both (a fraction of the lower of the two peaks, so that both can
sustain it).

Per workload row: throughput (producers in several processes send as fast as they can for
``duration_s``), then acknowledgement latency (or produce-to-consume latency for the consume rows)
at fixed fractions of the peak. Curves: throughput and p99 latency against partitions, producers and
record size; the Spark pipeline's records/s against its micro-batch size (measured by
``oncelog.demo.pipeline_bench``). Nothing here asserts a time.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from oncelog.bench.clients import BenchError, ClientPool, Job, RunResult
from oncelog.bench.cpu import CpuSample, CpuUse, cpu_count, machine_cpus
from oncelog.charts import quantile_table
from oncelog.testing.broker_process import BrokerProcess

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RowSpec:
    name: str
    label: str
    kind: str  # "produce" | "consume"
    mode: str = "plain"
    source: str = ""  # consume rows: the produce row whose topic they read
    isolation: str = "read_uncommitted"
    topic_config: tuple[tuple[str, str], ...] = ()  # the row's topics are created with these configs


#: Our broker fsyncs every append of such a topic before acknowledging it (a group commit, off
#: the event loop): ``flush.messages=1`` is what ``--flush-every-append`` sets for every topic.
FSYNC_PER_APPEND = (("flush.messages", "1"),)


ROWS = {r.name: r for r in (
    RowSpec("produce", "produce acks=all", "produce", "plain"),
    RowSpec("produce_fsync", "produce acks=all, fsync per append", "produce", "plain",
            topic_config=FSYNC_PER_APPEND),
    RowSpec("produce_idempotent", "produce idempotent", "produce", "idempotent"),
    RowSpec("produce_transactional", "produce transactional", "produce", "transactional"),
    RowSpec("consume", "consume", "consume", source="produce"),
    RowSpec("consume_read_committed", "consume read_committed", "consume", "transactional",
            source="produce_transactional", isolation="read_committed"),
)}


@dataclass
class Plan:
    """The bench's settings; ``quick()`` and ``full()`` are the two presets."""

    quick: bool
    duration_s: float  # each throughput run
    latency_s: float  # each fixed-rate run
    warmup_s: float  # dropped from the start of each fixed-rate run
    size: int = 1024
    partitions: int = 3
    processes: int = 2  # producer (and consumer) processes of the workload rows
    producers_per_process: int = 1
    fractions: tuple[float, ...] = (0.05, 0.5)
    latency_repeats: int = 3  # fixed-rate runs per broker and rate of the workload rows (median p99 kept)
    curve_fraction: float = 0.5  # p99 on the curves: at this fraction of each point's peak
    rows: tuple[str, ...] = tuple(ROWS)
    partition_points: tuple[int, ...] = (1, 10, 100, 1000)
    producer_points: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (4, 4), (4, 25))  # processes x per process
    size_points: tuple[int, ...] = (100, 1024, 10_240, 102_400)
    scale_target: bool = True  # 1000 partitions x 100 producers against 3 partitions x 1 producer
    pipeline_records: int = 100_000
    pipeline_batches: tuple[int, ...] = (5_000, 20_000, 100_000)
    pipeline_master: str = ""  # Spark master of the pipeline runs; "" is local[2]
    # rounds per micro-batch size, the guarantees' order rotated (each runs first once in 3): the
    # first query after the warm-up pays some JVM compilation, so one fixed order biases the ratios
    pipeline_rounds: int = 3
    pipeline_latency_s: float = 10.0  # fixed-rate end-to-end latency run per guarantee and the copier
    curves: bool = True
    recovery_bytes: int = 1 << 30  # log written unflushed, then SIGKILL and restart; 0 skips it
    recovery_batch_sizes: tuple[int, ...] = (16_384, 1 << 20)  # producer batch.size of each recovery run
    # CPU priority of the fixed-rate runs' clients (clients.lower_priority): "idle" yields to the
    # broker it measures, as clients on machines of their own would; "normal" competes with it for
    # the cores. Throughput runs always use normal priority (an idle load generator cannot saturate).
    client_priority: str = "idle"

    @classmethod
    def full(cls) -> Plan:
        return cls(quick=False, duration_s=3.0, latency_s=4.0, warmup_s=1.0)

    @classmethod
    def quick_plan(cls) -> Plan:
        return cls(quick=True, duration_s=0.4, latency_s=0.5, warmup_s=0.1, partition_points=(1, 10),
                   producer_points=((1, 1), (2, 2)), size_points=(100, 10_240), scale_target=False,
                   pipeline_records=0, recovery_bytes=16 << 20, client_priority="normal", latency_repeats=1)

    @property
    def pool_size(self) -> int:
        needed = [self.processes * 2]  # producers and consumers of a produce-to-consume latency run
        if self.curves:
            needed += [p for p, _ in self.producer_points]
        return max(needed)


@dataclass
class Broker:
    """A broker under test. ``cores`` is how many cores it can use for its work: ours runs every
    request on one asyncio thread, Tansu on a thread pool."""

    name: str
    process: BrokerProcess
    cores: int
    topics: int = 0

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    @property
    def bootstrap(self) -> str:
        return self.process.bootstrap

    def topic(self, what: str, partitions: int, config: tuple[tuple[str, str], ...] = ()) -> str:
        from confluent_kafka.admin import AdminClient, NewTopic

        self.topics += 1
        name = f"bench-{self.topics}-{what}"
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})  # must outlive the future
        try:
            admin.create_topics([NewTopic(name, partitions, 1, config=dict(config))])[name].result(timeout=60)
        except Exception as exc:
            raise BenchError(f"cannot create topic {name} ({partitions} partitions): {exc}") from exc
        return name

    def delete(self, topic: str) -> None:
        """Best effort: frees the disk (ours) or memory (Tansu keeps everything in memory)."""
        try:
            from confluent_kafka.admin import AdminClient

            admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 3})
            admin.delete_topics([topic])[topic].result(timeout=15)
        except Exception:
            pass


# The scale target (issue 14) measured twice, as the two ways producers spread records over partitions:
# - record by record round robin, each record to the next partition: what keyed records with many distinct
#   keys look like. librdkafka puts one partition in each Produce request (its issue #1700), so at 1,000
#   partitions each request carries one or two records and a broker's cost is per request, not per byte;
# - keyless records through the client's own partitioner (librdkafka's sticky partitioner: one partition
#   until the batch is sent), which is how Kafka's kafka-producer-perf-test measures.
# (curve name, Job.partitioner, topic-name tag)
SCALE_TARGETS = (("scale target", "round_robin", ""), ("scale target, keyless", "client", "-keyless"))


def limited_by(cpu: CpuUse, broker_cores: int) -> str:
    """Who limits a throughput run, from where the CPU went (a heuristic; performance.md explains it)."""
    if cpu.broker_pct >= 85 * broker_cores:
        return "broker"
    if cpu.client_max_pct >= 85:
        return "client"
    if cpu.machine_pct >= 90:
        return "machine"
    return "waiting"


def _summary(run: RunResult, before: CpuSample, after: CpuSample, broker: Broker) -> dict[str, Any]:
    records = sum(r.records for r in run.results)
    nbytes = sum(r.bytes for r in run.results)
    cpu = CpuUse.between(before, after, [r.cpu_s for r in run.results])
    out: dict[str, Any] = {
        "records": records, "bytes": nbytes, "seconds": round(run.seconds, 4),
        "mb_per_s": round(nbytes / run.seconds / 1e6, 3), "records_per_s": round(records / run.seconds, 1),
        "cpu": asdict(cpu), "limited_by": limited_by(cpu, broker.cores), "processes": len(run.results),
        "timed_out": sum(r.timed_out for r in run.results)}
    batches = sum(r.batches for r in run.results)
    if batches:
        out["batch_records_avg"] = round(sum(r.batch_records for r in run.results) / batches, 1)
        out["batch_bytes_avg"] = round(sum(r.batch_bytes for r in run.results) / batches)
    return out


def median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Of repeated fixed-rate runs, the one with the median p99 (the lower middle one of an even
    count), with every run's p99 beside it (``p99_runs``, in run order); a failed run makes the
    figure a failure."""
    failed = [r for r in results if "error" in r]
    if failed or not results:
        return failed[0] if failed else {"error": "no run"}
    ranked = sorted(results, key=lambda r: (r.get("p99") is None, r.get("p99") or 0.0))
    return {**ranked[(len(ranked) - 1) // 2], "p99_runs": [r.get("p99") for r in results]}


def _quantiles(samples: list[float]) -> dict[str, Any]:
    """n, p50, p90, p99, p99.9, p99.99 (when there are enough samples), max, and the whole table."""
    table = [(q, round(v, 3)) for q, v in quantile_table(samples)]
    named = {("max" if q == 100.0 else f"p{q:g}"): v for q, v in table if q > 0}
    return {"n": len(samples), **named, "table": table}


def send_lag(lags_ms: list[float]) -> dict[str, float]:
    """p50, p99 and max of how late the records went out against their schedule (empty: nothing sent)."""
    named = {k: v for k, v in _quantiles(lags_ms).items() if k in ("p50", "p99", "max")}
    return {k: round(max(v, 0.0), 3) for k, v in named.items()}


class Bench:
    """Throughput runs load the brokers from ``pool`` (normal CPU priority: a load generator that
    yields cannot saturate a broker on the cores it shares with it); fixed-rate runs, which measure
    how fast a broker answers rather than how much it can take, from ``latency_pool`` (by default
    the same pool; ``oncelog bench`` gives it ``plan.client_priority``)."""

    def __init__(self, plan: Plan, brokers: list[Broker], pool: ClientPool, progress: Progress,
                 latency_pool: ClientPool | None = None) -> None:
        self.plan, self.brokers, self.pool, self.progress = plan, brokers, pool, progress
        self.latency_pool = latency_pool or pool
        self.tag = str(os.getpid())
        self.runs = 0

    # --- one run ------------------------------------------------------------------------------------

    def _run(self, broker: Broker, jobs: list[Job], pool: ClientPool | None = None,
             ) -> tuple[RunResult, CpuSample, CpuSample]:
        self.runs += 1
        for i, j in enumerate(jobs):  # transactional ids and group ids unique per run and process
            j.tag = f"{self.tag}-{self.runs}-{i}"
        box: dict[str, CpuSample] = {}
        run = (pool or self.pool).run(jobs, on_start=lambda: box.update(a=CpuSample.take(broker.pid)))
        after = CpuSample.take(broker.pid)
        return run, box["a"], after

    def _producers(self, broker: Broker, topic: str, partitions: int, *, mode: str = "plain",
                   processes: int, per_process: int, size: int, rate: float = 0.0,
                   stats: bool = False, partitioner: str = "round_robin") -> list[Job]:
        plan = self.plan
        return [Job("produce", broker.bootstrap, topic, list(range(partitions)), mode=mode, producers=per_process,
                    size=size, duration_s=plan.latency_s if rate else plan.duration_s,
                    rate=rate / processes if rate else 0.0, linger_ms=0 if rate else 5,
                    warmup_s=plan.warmup_s if rate else 0.0, stats=stats, partitioner=partitioner)
                for _ in range(processes)]

    def throughput(self, broker: Broker, topic: str, partitions: int, *, mode: str = "plain", processes: int,
                   per_process: int, size: int, stats: bool = False,
                   partitioner: str = "round_robin") -> dict[str, Any]:
        jobs = self._producers(broker, topic, partitions, mode=mode, processes=processes, per_process=per_process,
                               size=size, stats=stats, partitioner=partitioner)
        run, a, b = self._run(broker, jobs)
        return _summary(run, a, b, broker)

    def consume_throughput(self, broker: Broker, topic: str, partitions: int, isolation: str) -> dict[str, Any]:
        n = min(self.plan.processes, partitions)
        jobs = [Job("consume", broker.bootstrap, topic, [p for p in range(partitions) if p % n == i],
                    isolation=isolation) for i in range(n)]
        run, a, b = self._run(broker, jobs)
        return _summary(run, a, b, broker)

    def latency(self, broker: Broker, topic: str, partitions: int, rate: float, *, mode: str = "plain",
                processes: int, per_process: int, size: int, consume: str = "",
                partitioner: str = "round_robin") -> dict[str, Any]:
        """Records at a fixed total ``rate``; acknowledgement latency, or produce-to-consume latency
        when ``consume`` names an isolation level (consumers in their own processes).

        Latency runs from each record's scheduled send time (``clients``: coordinated omission),
        and ``send_lag_ms`` says how late the producers' ``produce()`` calls ran against that
        schedule (p50, p99, max): a large lag is a client that could not keep to the rate.

        Every record acknowledged past the warm-up is a sample: ``expected`` of them, ``seen`` with a
        latency. A produce-to-consume run's consumers listen until they have seen each one (or
        ``clients.LATE_S`` after the producers answered); the ``unseen`` ones enter the percentiles
        as the worst case (``unseen_ms``: the slowest latency seen, or the time from the end of the
        schedule to the consumers' giving up, whichever is larger), so that a stall cannot lower
        the p99 by keeping its records out of the samples.

        A run that yields no sample at all is run once more; ``runs`` says how many it took."""
        jobs = self._producers(broker, topic, partitions, mode=mode, processes=processes, per_process=per_process,
                               size=size, rate=rate, partitioner=partitioner)
        consumers = min(self.plan.processes, partitions) if consume else 0
        jobs += [Job("consume", broker.bootstrap, topic, [p for p in range(partitions) if p % consumers == i],
                     isolation=consume, latency=True, duration_s=self.plan.latency_s, warmup_s=self.plan.warmup_s)
                 for i in range(consumers)]
        runs = 0
        while True:
            runs += 1
            run, a, b = self._run(broker, jobs, self.latency_pool)
            producers, readers = run.results[:processes], run.results[processes:]
            samples = [x for r in (readers if consume else producers) for x in r.latencies_ms]
            if samples or runs == 2:
                break
        cpu = CpuUse.between(a, b, [r.cpu_s for r in run.results])
        acked = sum(r.records for r in producers)
        expected = sum(n for r in producers for n in r.acked_after_warmup.values())
        seen = len(samples)
        unseen = max(expected - seen, 0)
        worst: dict[str, Any] = {}
        if unseen:
            gave_up_after = max((r.end - run.start - self.plan.latency_s for r in readers), default=0.0)
            worst_ms = max(max(samples, default=0.0), gave_up_after * 1000.0)
            samples += [worst_ms] * unseen
            worst["unseen_ms"] = round(worst_ms, 3)
        return {"rate": round(rate, 1), "offered_per_s": round(sum(r.sent_per_s for r in producers), 1),
                "acked_per_s": round(acked / self.plan.latency_s, 1), "kind": "produce-to-consume" if consume
                else "acknowledgement", "expected": expected, "seen": seen, "unseen": unseen, **worst,
                "send_lag_ms": send_lag([x for r in producers for x in r.send_lag_ms]),
                **_quantiles(samples), "cpu": asdict(cpu), "runs": runs}

    # --- the workload rows --------------------------------------------------------------------------

    def rows(self) -> dict[str, Any]:
        plan = self.plan
        out: dict[str, Any] = {}
        topics: dict[tuple[str, str], str] = {}
        for name in plan.rows:
            spec = ROWS[name]
            row: dict[str, Any] = {"label": spec.label, "kind": spec.kind, "brokers": {}}
            if spec.kind == "produce":
                row["config"] = {"acks": "all", "linger.ms": 5, "batch.size": 1_048_576,
                                 "max.in.flight.requests.per.connection": 5, "mode": spec.mode,
                                 **({"commit every ms": 100} if spec.mode == "transactional" else {}),
                                 **({"topic": dict(spec.topic_config)} if spec.topic_config else {})}
            else:
                row["config"] = {"isolation.level": spec.isolation, "reads the topic of": spec.source}
            out[name] = row
            for broker in self.brokers:
                self.progress(f"{spec.label} on {broker.name}: throughput")
                try:
                    if spec.kind == "produce":
                        topic = broker.topic(name, plan.partitions, spec.topic_config)
                        topics[(broker.name, name)] = topic
                        r = self.throughput(broker, topic, plan.partitions, mode=spec.mode, processes=plan.processes,
                                            per_process=plan.producers_per_process, size=plan.size, stats=True)
                    else:
                        source = topics.get((broker.name, spec.source))
                        if source is None:
                            raise BenchError(f"needs the {spec.source} row")
                        r = self.consume_throughput(broker, source, plan.partitions, spec.isolation)
                    row["brokers"][broker.name] = {"throughput": r, "latency": {}}
                except BenchError as exc:
                    row["brokers"][broker.name] = {"error": str(exc), "latency": {}}
        for (broker_name, _row), topic in topics.items():
            next(b for b in self.brokers if b.name == broker_name).delete(topic)
        for name in plan.rows:
            self._row_latency(out, name)
        return out

    @staticmethod
    def _peak(row: dict[str, Any]) -> float | None:
        """The lower of the brokers' peaks (records/s): a rate every broker can sustain."""
        peaks = [b["throughput"]["records_per_s"] for b in row["brokers"].values() if "throughput" in b]
        return min(peaks) if peaks else None

    def _row_latency(self, rows: dict[str, Any], name: str) -> None:
        plan, spec, row = self.plan, ROWS[name], rows[name]
        peak = self._peak(row)
        if spec.kind == "consume" and peak and spec.source in rows:
            # records reach the consumers no faster than their producers send them
            peak = min(peak, self._peak(rows[spec.source]) or peak)
        if not peak:
            return
        row["peak_records_per_s"] = peak
        topics: dict[str, str] = {}
        for broker in self.brokers:
            entry = row["brokers"].setdefault(broker.name, {"latency": {}})
            try:
                topics[broker.name] = broker.topic(f"{name}-lat", plan.partitions, spec.topic_config)
            except BenchError as exc:
                entry["latency"] = {f"{f * 100:g}%": {"error": str(exc)} for f in plan.fractions}
        for fraction in plan.fractions:
            label = f"{fraction * 100:g}%"
            runs: dict[str, list[dict[str, Any]]] = {b: [] for b in topics}
            # The brokers take turns, run after run, so that a slow moment of the machine falls on
            # both; each broker's figure is its run with the median p99.
            for i in range(plan.latency_repeats):
                for broker in self.brokers:
                    if broker.name not in topics:
                        continue
                    self.progress(f"{spec.label} on {broker.name}: latency at {label} of the peak "
                                  f"({i + 1}/{plan.latency_repeats})")
                    try:
                        runs[broker.name].append(self.latency(
                            broker, topics[broker.name], plan.partitions, peak * fraction, mode=spec.mode,
                            processes=plan.processes, per_process=plan.producers_per_process, size=plan.size,
                            consume=spec.isolation if spec.kind == "consume" else ""))
                    except BenchError as exc:
                        runs[broker.name].append({"error": str(exc)})
            for broker_name, results in runs.items():
                row["brokers"][broker_name]["latency"][label] = median_run(results)
        for broker in self.brokers:
            if broker.name in topics:
                broker.delete(topics[broker.name])

    # --- curves -------------------------------------------------------------------------------------

    def _point(self, what: str, *, partitions: int, processes: int, per_process: int,
               size: int, partitioner: str = "round_robin") -> dict[str, Any]:
        """Throughput of every broker at one point, then p99 at a fraction of the lower peak."""
        point: dict[str, Any] = {"partitions": partitions, "producers": processes * per_process,
                                 "processes": processes, "per_process": per_process, "size": size,
                                 "partitioner": partitioner, "brokers": {}}
        topics = {}
        for broker in self.brokers:
            self.progress(f"{what} on {broker.name}: throughput")
            try:
                topics[broker.name] = broker.topic(what.replace(" ", "-").replace("=", ""), partitions)
                point["brokers"][broker.name] = {"throughput": self.throughput(
                    broker, topics[broker.name], partitions, processes=processes, per_process=per_process,
                    size=size, partitioner=partitioner)}
            except BenchError as exc:
                point["brokers"][broker.name] = {"error": str(exc)}
        peaks = [b["throughput"]["records_per_s"] for b in point["brokers"].values() if "throughput" in b]
        for broker in self.brokers:
            if not peaks or broker.name not in topics:
                continue
            rate = min(peaks) * self.plan.curve_fraction
            self.progress(f"{what} on {broker.name}: latency at {self.plan.curve_fraction * 100:g}% of the peak")
            try:
                point["brokers"][broker.name]["latency"] = self.latency(
                    broker, topics[broker.name], partitions, rate, processes=processes, per_process=per_process,
                    size=size, partitioner=partitioner)
            except BenchError as exc:
                point["brokers"][broker.name]["latency"] = {"error": str(exc)}
            broker.delete(topics[broker.name])
        return point

    def curves(self) -> dict[str, Any]:
        plan = self.plan
        base: dict[str, Any] = {"partitions": plan.partitions, "processes": plan.processes, "per_process": 1,
                                "size": plan.size}
        curves: dict[str, Any] = {}
        curves["partitions"] = {"x": list(plan.partition_points), "xlabel": "partitions", "points": [
            self._point(f"partitions={n}", **{**base, "partitions": n}) for n in plan.partition_points]}
        curves["producers"] = {"x": [p * q for p, q in plan.producer_points],
                               "xlabel": "producers (processes x producers per process)", "points": [
            self._point(f"producers={p}x{q}", **{**base, "processes": p, "per_process": q})
            for p, q in plan.producer_points]}
        curves["record size"] = {"x": list(plan.size_points), "xlabel": "record size (bytes)", "points": [
            self._point(f"size={s}", **{**base, "size": s}) for s in plan.size_points]}
        if plan.scale_target:
            p, q = plan.producer_points[-1]
            for name, partitioner, tag in SCALE_TARGETS:
                curves[name] = {
                    "x": [1, p * q], "xlabel": "3 partitions x 1 producer, then 1,000 partitions x 100 producers",
                    "partitioner": partitioner, "points": [
                        self._point(f"target{tag}=3p-1x1", partitions=3, processes=1, per_process=1, size=plan.size,
                                    partitioner=partitioner),
                        self._point(f"target{tag}=1000p-{p}x{q}", partitions=1000, processes=p, per_process=q,
                                    size=plan.size, partitioner=partitioner)]}
        return curves


def pipeline(records: int, batches: tuple[int, ...], progress: Progress, master: str = "",
             latency_s: float = 10.0, rounds: int = 3) -> dict[str, Any]:
    """records/s of the Spark pipeline per guarantee and micro-batch size (maxOffsetsPerTrigger),
    beside the single-process transactional copier (the anchor), with end-to-end latency p50/p99;
    each size measured by ``python -m oncelog.demo.pipeline_bench`` (its own broker and Spark session)."""
    points: list[dict[str, Any]] = []
    for batch in batches:
        progress(f"Spark pipeline, {records:,} records, micro-batches of {batch:,} (a few minutes)")
        cmd = [sys.executable, "-m", "oncelog.demo.pipeline_bench", "--records", str(records),
               "--max-offsets", str(batch), "--latency-seconds", f"{latency_s:g}", "--rounds", str(rounds)]
        if master:
            cmd += ["--master", master]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if out.returncode != 0:
            tail = (out.stderr.strip().splitlines() or [f"exit {out.returncode}"])[-1]
            points.append({"max_offsets": batch, "error": tail[:300]})
            continue
        points.append({"max_offsets": batch, **json.loads(out.stdout.strip().splitlines()[-1])})
    return {"records": records, "size": 100, "master": master or "local[2]", "rounds": rounds, "points": points}


def recovery(total_bytes: int, batch_sizes: tuple[int, ...], data_dir: Path, progress: Progress) -> dict[str, Any]:
    """Restart time of our broker after SIGKILL with ``total_bytes`` of log none of which was flushed
    (``--flush-interval-ms`` of an hour), so the restart re-reads and CRC-checks all of it and
    replays its producer state: the worst case a flush interval bounds in practice. For each
    producer ``batch.size``: 1 KiB records from an idempotent producer to 4 partitions, then
    SIGKILL; seconds until the restarted broker listens and until it answers ListOffsets with the
    end offsets it had acknowledged (a different answer is an error), beside the same broker's start
    on an empty directory. Ours only: the Tansu broker keeps its data in memory."""
    import signal

    from confluent_kafka import Consumer, Producer, TopicPartition

    from oncelog.testing.broker_process import create_topic, oncelog_broker

    def timed_start(b: BrokerProcess) -> float:
        t0 = time.monotonic()
        b.start(timeout_s=600)
        return time.monotonic() - t0

    def end_offsets(bootstrap: str) -> list[int]:
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "oncelog-bench-recovery",
                      "isolation.level": "read_uncommitted"})
        try:
            return [c.get_watermark_offsets(TopicPartition("recovery", p), timeout=60)[1] for p in range(4)]
        finally:
            c.close()

    def fill(bootstrap: str, batch_size: int) -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "batch.size": batch_size, "queue.buffering.max.kbytes": 1 << 20})
        value = os.urandom(1024)
        for i in range(total_bytes // 1100):
            while True:
                try:
                    p.produce("recovery", value, key=b"%d" % (i % 1000))
                    break
                except BufferError:
                    p.poll(0.01)
        if p.flush(300) != 0:
            raise BenchError("records not acknowledged before the kill")

    points: list[dict[str, Any]] = []
    for batch_size in batch_sizes:
        progress(f"recovery after SIGKILL: {total_bytes / 2**20:,.0f} MiB unflushed in batches of up to "
                 f"{batch_size:,} B")
        b = oncelog_broker(data_dir / f"recovery-{batch_size}", "--flush-interval-ms", "3600000")
        try:
            empty_s = timed_start(b)
            create_topic(b.bootstrap, "recovery", 4)
            fill(b.bootstrap, batch_size)  # the producer is gone before the kill: no reconnect noise
            before = end_offsets(b.bootstrap)
            assert b.data_dir is not None
            on_disk = sum(f.stat().st_size for f in b.data_dir.rglob("*.log"))
            b.kill(signal.SIGKILL)
            t0 = time.monotonic()
            listen_s = timed_start(b)
            after = end_offsets(b.bootstrap)
            answer_s = time.monotonic() - t0
            point: dict[str, Any] = {"batch_size": batch_size, "log_bytes": on_disk, "empty_start_s": round(empty_s, 3),
                                     "listening_s": round(listen_s, 3), "answering_s": round(answer_s, 3),
                                     "s_per_gib": round(answer_s / (on_disk / 2**30), 3),
                                     "beyond_empty_start_s_per_gib": round((answer_s - empty_s) / (on_disk / 2**30), 3)}
            if after != before:
                point["error"] = f"end offsets {after} after the restart, {before} acknowledged before"
            points.append(point)
        except (BenchError, RuntimeError, TimeoutError, OSError) as exc:
            points.append({"batch_size": batch_size, "error": str(exc)[:300]})
        finally:
            b.kill(signal.SIGKILL)
    return {"bytes": total_bytes, "record_size": 1024, "points": points}


def conditions(plan: Plan, brokers: list[Broker]) -> dict[str, Any]:
    import confluent_kafka

    load = os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "mode": "quick" if plan.quick else "full",
        "cpus": cpu_count(), "machine_cpus": machine_cpus(), "load_average_1_5_15": [round(x, 2) for x in load],
        "machine": platform.machine(), "python": platform.python_version(),
        "librdkafka": confluent_kafka.libversion()[0], "confluent_kafka": confluent_kafka.version()[0],
        "plan": {k: v for k, v in asdict(plan).items() if k != "rows"},
        "brokers": {b.name: {"command": " ".join(b.process.args), "cores_for_requests": b.cores} for b in brokers},
    }


def ensure_writable(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    probe = out / ".oncelog-bench-probe"
    probe.write_text("")
    probe.unlink()


def as_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=1, default=lambda o: asdict(o) if hasattr(o, "__dataclass_fields__") else str(o))

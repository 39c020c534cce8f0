"""The bench's load generator: a pool of client processes (multiprocessing, spawn), each running
librdkafka producers (one thread each) or one consumer, so that the clients are never one Python
interpreter that limits the broker it measures.

A run is two steps so that every process starts loading at the same instant: ``prepare`` (create
the clients, connect, fetch metadata, initialise transactions) and ``go`` (at a time on the
machine's monotonic clock, which all processes share). Each process reports its own CPU time
(user + sys of the whole process, librdkafka's threads included) over the measured window, so the
report can put the clients' CPU beside the broker's.

Throughput jobs send as fast as the client can for ``duration_s``, then flush: the figure counts
only acknowledged records, over the time until the last acknowledgement. Latency jobs send at a fixed
rate (``rate``, paced in 1 ms steps) with ``linger.ms=0``. Record ``i`` of a producer is due at
``start + i / rate``, and its latency is measured **from that scheduled time**, not from the moment
``produce()`` was called: when the sending loop is held up (a ``commit_transaction`` every 100 ms, a
full queue, a descheduled client process), the records due meanwhile go out late in a burst, and
measuring from the late send would leave out exactly the wait a client at that rate would have seen
(coordinated omission; wrk2 and HdrHistogram's correction measure from the schedule too). The
scheduled time (monotonic ns) is stamped in each value's first 8 bytes: the delivery report reads it
for the acknowledgement latency, a consumer for produce-to-consume latency. How late ``produce()``
actually ran against the schedule is the send lag (``Result.send_lag_ms``). Samples of records due
in the first ``warmup_s`` seconds are dropped.

A produce-to-consume run has no sample it cannot account for: every value also carries the record's
id (its producer and sequence number), each producer counts per partition the records acknowledged
after the warm-up (``Result.acked_after_warmup``), and once every producer process has answered, the
pool tells each consumer how many of those it must see (an ``("expect", n)`` message). A consumer
listens until it has seen that many distinct records or for ``LATE_S`` more seconds; the records it
did not see are reported (``Result.seen`` against the expectation) instead of silently missing from
the percentiles, where they would have been the slowest ones.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import struct
import threading
import time
import traceback
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: At the start of every value: the record's send time in monotonic ns (fixed-rate runs: the time it was
#: scheduled for, start + i / rate), and its id (``record_id``).
STAMP = struct.Struct(">qQ")
#: A produce-to-consume run's consumers wait this long, after the producers have all answered, for
#: the acknowledged records they have not seen yet.
LATE_S = 30.0
#: Longest a produce-to-consume consumer listens when no expectation ever arrives (its pool died).
NO_EXPECTATION_S = 300.0
_TIMED_OUT = -192  # librdkafka's _MSG_TIMED_OUT


class BenchError(Exception):
    """A client process failed or did not answer; the row is reported as failed."""


@dataclass
class Job:
    """What one client process does in one run."""

    kind: str  # "produce" | "consume"
    bootstrap: str
    topic: str
    partitions: list[int]  # written round robin (produce) or read (consume)
    partitioner: str = "round_robin"  # produce: "round_robin" over ``partitions`` | "client" (keyless)
    mode: str = "plain"  # producer: "plain" (acks=all) | "idempotent" | "transactional"
    producers: int = 1  # producers in this process, one thread each
    size: int = 1024
    duration_s: float = 3.0  # produce: how long to send; consume with latency: how long to listen
    rate: float = 0.0  # records/s for the whole process; 0: as fast as possible (throughput)
    linger_ms: int = 5
    batch_bytes: int = 1_048_576
    in_flight: int = 5
    warmup_s: float = 0.0
    txn_every_ms: int = 100
    isolation: str = "read_uncommitted"
    latency: bool = False  # consume: measure produce-to-consume latency from the live end of the log
    stats: bool = False  # producer: collect librdkafka's statistics (batch sizes)
    tag: str = ""  # makes transactional ids unique per run
    client: int = 0  # this process's place in its run (ClientPool.run sets it): part of the records' ids

    def producer_conf(self, index: int) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap, "acks": "all", "linger.ms": self.linger_ms,
            "batch.size": self.batch_bytes, "max.in.flight.requests.per.connection": self.in_flight,
            # the producers of one process share 64 MiB of queue (100 producers must not hold 6 GiB)
            "queue.buffering.max.messages": max(10_000, 200_000 // self.producers),
            "queue.buffering.max.kbytes": max(4_096, 65_536 // self.producers),
            "message.max.bytes": max(1_048_576, self.size * 2 + 1024), "enable.idempotence": False,
            "log_level": 3, "message.timeout.ms": 60_000}
        if self.partitioner == "client":
            # librdkafka sticks to a partition for 2 x linger.ms unless told: 10 ms in the throughput
            # runs, but 0 (a random partition per record) in the fixed-rate runs' linger.ms=0. Both
            # runs keep the throughput runs' 10 ms, so they measure the same spread of records.
            conf["sticky.partitioning.linger.ms"] = 10
        if self.mode in ("idempotent", "transactional"):
            conf["enable.idempotence"] = True
        if self.mode == "transactional":
            conf["transactional.id"] = f"bench-{self.tag}-{index}"
        if self.stats:
            conf["statistics.interval.ms"] = 200
        return conf


@dataclass
class Result:
    records: int = 0
    bytes: int = 0
    start: float = 0.0  # monotonic seconds
    end: float = 0.0
    cpu_s: float = 0.0
    errors: int = 0
    first_error: str = ""
    timed_out: int = 0  # throughput runs: records not acknowledged within message.timeout.ms (overload)
    latencies_ms: list[float] = field(default_factory=list)
    sent_per_s: float = 0.0  # latency jobs: the rate actually offered
    send_lag_ms: list[float] = field(default_factory=list)  # latency jobs: produce() time - scheduled time
    # fixed-rate producers: records acknowledged whose stamp is past the warm-up, per partition
    acked_after_warmup: dict[int, int] = field(default_factory=dict)
    seen: int = 0  # produce-to-consume consumers: distinct records past the warm-up seen
    expected: int = 0  # produce-to-consume consumers: acked_after_warmup of their partitions, summed
    batches: int = 0  # librdkafka statistics: produce batches and the records and bytes in them
    batch_records: int = 0
    batch_bytes: int = 0


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _value(size: int) -> bytes:
    return bytes(max(size, STAMP.size))


def record_id(client: int, producer: int, seq: int) -> int:
    """The id stamped into a fixed-rate record: unique within a run (client process, producer thread
    of that process, the producer's sequence number)."""
    return (client << 48) | (producer << 32) | seq


class _ProducerThread:
    """One producer: prepared (connected, transactions initialised) before the run starts."""

    def __init__(self, job: Job, index: int) -> None:
        from confluent_kafka import Producer

        self.job, self.index = job, index
        self.acked = 0
        self.timed_out = 0
        self.errors = 0
        self.first_error = ""
        self.samples = array("d")
        self.send_lag_ms = array("d")
        self.acked_after_warmup: dict[int, int] = {}
        self.sent = 0
        self.batches = self.batch_records = self.batch_bytes = 0
        conf = job.producer_conf(index)
        if job.stats:
            conf["stats_cb"] = self._on_stats
        self.producer = Producer(conf)
        self.producer.list_topics(job.topic, timeout=30)
        if job.mode == "transactional":
            self.producer.init_transactions(60)
        self.warm_ns = 0

    def _on_stats(self, text: str) -> None:
        t = json.loads(text).get("topics", {}).get(self.job.topic)
        if t:
            self.batches += int(t["batchcnt"].get("cnt", 0))
            self.batch_records += int(t["batchcnt"].get("sum", 0))
            self.batch_bytes += int(t["batchsize"].get("sum", 0))

    def _on_delivery(self, err: Any, msg: Any) -> None:
        if err is not None:
            if not self.job.rate and err.code() == _TIMED_OUT:
                self.timed_out += 1  # the broker fell behind the queue: a figure, not a failure
                return
            self.errors += 1
            if not self.first_error:
                self.first_error = str(err)
            return
        self.acked += 1
        if self.job.rate:
            # the same test as the consumers' (the stamp), so that their counts compare
            due_ns = STAMP.unpack_from(msg.value())[0]
            if due_ns < self.warm_ns:
                return
            part = int(msg.partition())
            self.acked_after_warmup[part] = self.acked_after_warmup.get(part, 0) + 1
            self.samples.append((time.monotonic_ns() - due_ns) / 1e6)  # from the scheduled time

    def run(self, start: float) -> None:
        try:
            self._run(start)
        except Exception as exc:  # a fenced or failed producer fails the run, it does not hang it
            self.errors += 1
            self.first_error = self.first_error or f"{type(exc).__name__}: {exc}"

    def _run(self, start: float) -> None:
        job, p = self.job, self.producer
        end = start + job.duration_s
        self.warm_ns = int((start + job.warmup_s) * 1e9)
        parts = job.partitions
        n = len(parts)
        value = bytearray(_value(job.size))
        txn = job.mode == "transactional"
        txn_every = job.txn_every_ms / 1000
        if txn:
            p.begin_transaction()
        last_commit = time.monotonic()
        rate = job.rate / job.producers if job.rate else 0.0
        i = 0
        produce, poll, now = p.produce, p.poll, time.monotonic
        cb = self._on_delivery
        spread = job.partitioner == "round_robin"
        first_id = record_id(job.client, self.index, 0)
        start_ns, ns_per_record = int(start * 1e9), 1e9 / rate if rate else 0.0
        lags, warm_ns, monotonic_ns = self.send_lag_ms, self.warm_ns, time.monotonic_ns
        while True:
            t = now()
            if t >= end:
                break
            if rate:
                due = min(int((t - start) * rate) + 1, int(job.duration_s * rate))
                if i >= due:  # librdkafka waits in whole milliseconds: pace in 1 ms steps
                    poll(min(max(i / rate - (t - start), 0.001), 0.05))
                    continue
                burst = due - i
            else:
                burst = 256
            for _ in range(burst):
                sent_ns = monotonic_ns()
                if rate:
                    due_ns = start_ns + int(i * ns_per_record)
                    STAMP.pack_into(value, 0, due_ns, first_id + i)
                else:
                    STAMP.pack_into(value, 0, sent_ns, first_id + i)
                try:
                    if spread:
                        produce(job.topic, bytes(value), partition=parts[i % n], on_delivery=cb)
                    else:
                        produce(job.topic, bytes(value), on_delivery=cb)
                except BufferError:
                    poll(0.001)
                    break
                if rate and due_ns >= warm_ns:
                    lags.append((sent_ns - due_ns) / 1e6)
                i += 1
            poll(0)
            if txn and t - last_commit >= txn_every:
                p.commit_transaction(60)
                p.begin_transaction()
                last_commit = now()
        if txn:
            p.commit_transaction(60)
        remaining = p.flush(90)
        self.sent = i
        if remaining:
            self.errors += remaining
            self.first_error = self.first_error or f"{remaining} records not acknowledged after 60 s"


class _ConsumerRun:
    def __init__(self, job: Job) -> None:
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.job = job
        self.consumer = Consumer({
            "bootstrap.servers": job.bootstrap, "group.id": f"bench-{job.tag}", "enable.auto.commit": False,
            "enable.partition.eof": True, "isolation.level": job.isolation, "fetch.max.bytes": 52_428_800,
            "max.partition.fetch.bytes": 10_485_760, "fetch.wait.max.ms": 100, "log_level": 3})
        self.consumer.list_topics(job.topic, timeout=30)
        if job.latency:  # listen from the live end (resolved now, before the producers start)
            self.assignment = [
                TopicPartition(job.topic, p, self.consumer.get_watermark_offsets(TopicPartition(job.topic, p),
                                                                                 timeout=30)[1])
                for p in job.partitions]
            self.consumer.assign(self.assignment)
        else:
            self.assignment = [TopicPartition(job.topic, p, OFFSET_BEGINNING) for p in job.partitions]

    def run(self, start: float, result: Result, expectation: Any = None) -> None:
        """Read until the end of the partitions (throughput), or (latency) until ``expectation`` (a
        connection, polled now and then) has said how many distinct records past the warm-up this
        consumer must see and it has seen them, or ``LATE_S`` after it said."""
        job, c = self.job, self.consumer
        if not job.latency:
            c.assign(self.assignment)
        eof: set[int] = set()
        samples = array("d")
        ids: set[int] = set()
        warm_ns = int((start + job.warmup_s) * 1e9)
        stop = start + (job.duration_s + NO_EXPECTATION_S if job.latency else 300.0)
        expected: int | None = None
        check_at = start + job.duration_s  # no expectation can come before the producers' window ends
        records = nbytes = 0
        while True:
            now = time.monotonic()
            if now >= stop or (expected is not None and len(ids) >= expected):
                break
            if job.latency and now >= check_at and expected is None:
                check_at = now + 0.05
                if expectation is not None and expectation.poll(0):
                    expected = int(expectation.recv()[1])
                    stop = min(stop, now + LATE_S)
            # consume(n, timeout) waits for n records or the timeout: a latency run takes each record
            # as soon as it is there
            for m in ([c.poll(0.05)] if job.latency else c.consume(10_000, 0.1)):
                if m is None:
                    continue
                err = m.error()
                if err is not None:
                    if err.code() == -191:  # _PARTITION_EOF
                        eof.add(int(m.partition() or 0))
                    continue
                value = m.value() or b""
                records += 1
                nbytes += len(value)
                if job.latency and len(value) >= STAMP.size:
                    sent_ns, rid = STAMP.unpack_from(value)
                    if sent_ns >= warm_ns and rid not in ids:  # a duplicate is not a second sample
                        ids.add(rid)
                        samples.append((time.monotonic_ns() - sent_ns) / 1e6)
            if not job.latency and len(eof) >= len(job.partitions):
                break
        result.end = time.monotonic()
        result.records, result.bytes = records, nbytes
        result.latencies_ms = samples.tolist()
        result.seen, result.expected = len(ids), expected or 0
        if not job.latency and len(eof) < len(job.partitions):
            result.errors = 1
            result.first_error = f"did not reach the end of {len(job.partitions) - len(eof)} partitions"
        c.close()


PRIORITIES = ("idle", "normal")


def check_priority(level: str) -> None:
    if level not in PRIORITIES:
        raise ValueError(f"unknown client priority {level!r}: one of {', '.join(PRIORITIES)}")


def lower_priority(level: str) -> None:
    """Make this client process, and every thread it starts afterwards, yield the CPU to the broker.

    ``"idle"``: a session of its own (so a scheduler autogroup of its own: the nice value of a
    process counts only inside its autogroup), that autogroup and the process at nice 19, and the
    SCHED_IDLE policy, which librdkafka's threads inherit when they are created. Lowering one's own
    priority needs no privilege. The new session comes first so that the user's terminal session is
    never the autogroup being lowered. ``"normal"``: unchanged.
    """
    check_priority(level)
    if level == "normal":
        return
    try:
        os.setsid()
    except OSError:  # already a session leader: leave the autogroup alone
        pass
    else:
        try:
            Path("/proc/self/autogroup").write_text("19")
        except OSError:  # a kernel without autogroup scheduling
            pass
    os.nice(19 - os.nice(0))
    if hasattr(os, "SCHED_IDLE"):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _worker(conn: Any, priority: str = "normal") -> None:
    """A client process: prepares and runs the jobs it is sent, one at a time, until told to quit."""
    lower_priority(priority)
    prepared: Any = None
    while True:
        msg = conn.recv()
        try:
            if msg[0] == "quit":
                return
            if msg[0] == "expect":  # for a consumer that had stopped listening already
                continue
            if msg[0] == "drop":
                prepared = None
                conn.send(("dropped", None))
                continue
            if msg[0] == "prepare":
                job: Job = msg[1]
                if job.kind == "produce":
                    prepared = [_ProducerThread(job, i) for i in range(job.producers)]
                else:
                    prepared = _ConsumerRun(job)
                conn.send(("ready", None))
            elif msg[0] == "go":
                start: float = msg[1]
                delay = start - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                cpu0 = _cpu()
                result = Result(start=start)
                if isinstance(prepared, _ConsumerRun):
                    prepared.run(start, result, conn)
                else:
                    threads = [threading.Thread(target=pt.run, args=(start,)) for pt in prepared]
                    for th in threads:
                        th.start()
                    for th in threads:
                        th.join()
                    result.end = time.monotonic()
                    for pt in prepared:
                        result.records += pt.acked
                        result.errors += pt.errors
                        result.timed_out += pt.timed_out
                        result.first_error = result.first_error or pt.first_error
                        result.latencies_ms.extend(pt.samples)
                        result.send_lag_ms.extend(pt.send_lag_ms)
                        for part, n in pt.acked_after_warmup.items():
                            result.acked_after_warmup[part] = result.acked_after_warmup.get(part, 0) + n
                        result.batches += pt.batches
                        result.batch_records += pt.batch_records
                        result.batch_bytes += pt.batch_bytes
                    result.bytes = result.records * max(prepared[0].job.size, STAMP.size)
                    sent = sum(pt.sent for pt in prepared)
                    result.sent_per_s = sent / max(prepared[0].job.duration_s, 1e-9)
                result.cpu_s = _cpu() - cpu0
                prepared = None
                conn.send(("done", result))
        except Exception as exc:  # reported to the parent, which fails the row
            prepared = None
            conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}"))


def expected_by(consumer: Job, jobs: list[Job], answers: dict[int, Result]) -> int:
    """Records past the warm-up that the producers of ``consumer``'s topic had acknowledged on its
    partitions: what a produce-to-consume consumer must see."""
    return sum(answers[i].acked_after_warmup.get(p, 0) for i, j in enumerate(jobs)
               if j.kind == "produce" and j.topic == consumer.topic and i in answers for p in consumer.partitions)


@dataclass
class RunResult:
    """One run of several client processes: their results and the measured window."""

    results: list[Result]
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return max(self.end - self.start, 1e-9)


class ClientPool:
    """``size`` client processes, started once (spawn) and reused by every run of the bench, at
    ``priority`` (``lower_priority``)."""

    def __init__(self, size: int, priority: str = "normal") -> None:
        check_priority(priority)  # here, not only in the child processes, which would die with it
        ctx = multiprocessing.get_context("spawn")
        self.conns: list[Any] = []
        self.procs: list[Any] = []
        for _ in range(size):
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(child, priority), daemon=True)
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)

    @property
    def size(self) -> int:
        return len(self.conns)

    def _answer(self, i: int, timeout_s: float) -> Any:
        conn = self.conns[i]
        if not conn.poll(timeout_s):
            raise BenchError(f"client process {i} did not answer within {timeout_s:.0f} s")
        kind, payload = conn.recv()
        if kind == "error":
            raise BenchError(f"client process {i}: {payload.strip().splitlines()[0]}")
        return payload

    def run(self, jobs: list[Job], on_start: Any = None) -> RunResult:
        """Prepare ``jobs`` (one per process), start them together, wait for all. ``on_start`` is
        called at the start (the caller samples the broker's CPU there), and the caller samples
        again when this returns, right after the last process finished."""
        if len(jobs) > self.size:
            raise BenchError(f"{len(jobs)} client processes needed, the pool has {self.size}")
        for i, job in enumerate(jobs):
            self.conns[i].send(("prepare", replace(job, client=i)))
        failure: BenchError | None = None
        for i in range(len(jobs)):
            try:
                self._answer(i, 120)
            except BenchError as exc:
                failure = failure or exc
        if failure is not None:
            for i in range(len(jobs)):  # drop what the others prepared
                self.conns[i].send(("drop",))
            for i in range(len(jobs)):
                try:
                    self._answer(i, 120)
                except BenchError:
                    pass
            raise failure
        start = time.monotonic() + 0.05
        for i in range(len(jobs)):
            self.conns[i].send(("go", start))
        if on_start is not None:
            time.sleep(max(start - time.monotonic(), 0))
            on_start()
        longest = max(j.duration_s for j in jobs)
        # the producers (and throughput consumers) first; then each produce-to-consume consumer is
        # told how many records past the warm-up were acknowledged on its partitions
        listeners = [i for i, j in enumerate(jobs) if j.kind == "consume" and j.latency]
        answers: dict[int, Result] = {}
        failure = None
        for i in range(len(jobs)):
            if i not in listeners:
                try:
                    answers[i] = self._answer(i, longest + 400)
                except BenchError as exc:  # the consumers must still be told to stop
                    failure = failure or exc
        for i in listeners:
            self.conns[i].send(("expect", 0 if failure else expected_by(jobs[i], jobs, answers)))
        for i in listeners:
            try:
                answers[i] = self._answer(i, LATE_S + 400)
            except BenchError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        results = [answers[i] for i in range(len(jobs))]
        bad = [r for r in results if r.errors]
        if bad:
            raise BenchError(f"{sum(r.errors for r in bad)} client errors, first: {bad[0].first_error}")
        return RunResult(results, start, max(r.end for r in results))

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("quit",))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)

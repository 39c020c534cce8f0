"""The fixed-rate (latency) runs' accounting, driven in process with crafted clients: every record
acknowledged past the warm-up is a sample or is reported unseen."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from oncelog.bench import clients
from oncelog.bench.clients import STAMP, ClientPool, Job, Result, RunResult, record_id
from oncelog.bench.cpu import CpuSample
from oncelog.bench.runner import Bench, Plan


@dataclass
class FakeMessage:
    payload: bytes
    part: int = 0

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self.payload

    def partition(self) -> int:
        return self.part


def stamped(sent_s: float, rid: int, size: int = 64) -> bytes:
    value = bytearray(size)
    STAMP.pack_into(value, 0, int(sent_s * 1e9), rid)
    return bytes(value)


class ScheduledConsumer:
    """A consumer whose records show up at given monotonic times."""

    def __init__(self, arrivals: list[tuple[float, bytes]]) -> None:
        self.arrivals = sorted(arrivals, key=lambda a: a[0])

    def poll(self, timeout: float) -> FakeMessage | None:
        now = time.monotonic()
        if self.arrivals and self.arrivals[0][0] <= now:
            return FakeMessage(self.arrivals.pop(0)[1])
        wait = min(timeout, self.arrivals[0][0] - now) if self.arrivals else timeout
        time.sleep(max(wait, 0.0))
        return None

    def close(self) -> None:
        pass


class Expectation:
    """The pool's side of the pipe: says ``n`` once ``at`` has passed."""

    def __init__(self, at: float, n: int) -> None:
        self.at, self.n, self.told = at, n, False

    def poll(self, _timeout: float) -> bool:
        return not self.told and time.monotonic() >= self.at

    def recv(self) -> tuple[str, int]:
        self.told = True
        return ("expect", self.n)


def consumer_run(job: Job, consumer: Any) -> clients._ConsumerRun:
    run = clients._ConsumerRun.__new__(clients._ConsumerRun)
    run.job, run.consumer, run.assignment = job, consumer, []
    return run


def test_a_consumer_listens_until_it_has_seen_every_acknowledged_record() -> None:
    """A record held up past the old listening window (start + latency_s + min(max(latency_s, .5), 2))
    is still a sample, the slowest; a duplicate is not a second one; the consumer stops as soon as
    it has seen what the producers had acknowledged, not LATE_S later."""
    start = time.monotonic() + 0.05
    job = Job("consume", "-", "t", [0], latency=True, duration_s=0.2, warmup_s=0.0)
    sent = start + 0.05
    arrivals = [(start + 0.06, stamped(sent, 1)), (start + 0.07, stamped(sent, 2)),
                (start + 0.08, stamped(sent, 2)),  # a duplicate (a plain producer's retry)
                (start + 1.0, stamped(sent, 3))]  # after the old window closed at start + 0.7
    result = Result(start=start)
    consumer_run(job, ScheduledConsumer(arrivals)).run(start, result, Expectation(start + 0.3, 3))
    assert (result.seen, result.expected, result.records) == (3, 3, 4)
    assert len(result.latencies_ms) == 3 and max(result.latencies_ms) >= 900
    assert result.end - start < 5  # stopped once all were seen, not LATE_S (30 s) later


def test_a_consumer_gives_up_late_s_after_the_expectation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "LATE_S", 0.3)
    start = time.monotonic()
    job = Job("consume", "-", "t", [0], latency=True, duration_s=0.1, warmup_s=0.0)
    result = Result(start=start)
    consumer_run(job, ScheduledConsumer([(start + 0.02, stamped(start, 1))])).run(
        start, result, Expectation(start + 0.1, 5))
    assert (result.seen, result.expected) == (1, 5)
    assert 0.35 <= result.end - start < 5


def fake_run(results: list[Result], end: float) -> Any:
    def run(broker: Any, jobs: Any, pool: Any = None) -> Any:
        sample = CpuSample.take(os.getpid())
        return RunResult(results, 0.0, end), sample, sample
    return run


def test_unseen_records_enter_the_percentiles_as_the_worst_case() -> None:
    """100 records acknowledged past the warm-up, 70 seen: the 30 others are the slowest 30, not absent."""
    plan = Plan.quick_plan()
    bench = Bench(plan, [], pool=None, progress=lambda _msg: None)  # type: ignore[arg-type]
    producer = Result(records=120, sent_per_s=240.0, acked_after_warmup={0: 60, 1: 40})
    consumer = Result(latencies_ms=[1.0] * 69 + [250.0], seen=70, expected=100, end=plan.latency_s + 31.0)
    bench._run = fake_run([producer, consumer], consumer.end)  # type: ignore[method-assign]
    broker = type("B", (), {"bootstrap": "127.0.0.1:1"})()
    lat = bench.latency(broker, "t", 2, 240.0, processes=1, per_process=1, size=100,  # type: ignore[arg-type]
                        consume="read_uncommitted")
    assert (lat["expected"], lat["seen"], lat["unseen"], lat["n"]) == (100, 70, 30, 100)
    assert lat["unseen_ms"] == pytest.approx(31_000.0)  # they were not there 31 s after the schedule's end
    assert lat["p50"] == 1.0 and lat["p99"] == lat["max"] == pytest.approx(31_000.0)

    producer = Result(records=120, sent_per_s=240.0, acked_after_warmup={0: 2})
    bench._run = fake_run([producer, Result(latencies_ms=[1.0, 2.0], seen=2)], 1.0)  # type: ignore[method-assign]
    lat = bench.latency(broker, "t", 2, 240.0, processes=1, per_process=1, size=100,  # type: ignore[arg-type]
                        consume="read_uncommitted")
    assert (lat["expected"], lat["seen"], lat["unseen"], lat["max"]) == (2, 2, 0, 2.0) and "unseen_ms" not in lat


# --- the pool's protocol, with client processes as threads ---------------------------------------------

@dataclass
class FakeProducer:
    job: Job
    index: int
    acked: int = 0
    errors: int = 0
    timed_out: int = 0
    first_error: str = ""
    sent: int = 0
    batches: int = 0
    batch_records: int = 0
    batch_bytes: int = 0
    samples: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    acked_after_warmup: dict[int, int] = field(default_factory=dict)

    def run(self, start: float) -> None:
        if self.job.tag == "fail":
            self.errors, self.first_error = 1, "fenced"
            return
        for p in self.job.partitions:  # partition p: 10 * (p + 1) per producer, client process 1 twice that
            self.acked_after_warmup[p] = 10 * (p + 1) * (1 + self.job.client)
        self.acked = sum(self.acked_after_warmup.values())


class FakeConsumerRun:
    def __init__(self, job: Job) -> None:
        self.job = job

    def run(self, start: float, result: Result, expectation: Any = None) -> None:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if expectation is not None and expectation.poll(0.01):
                result.expected = expectation.recv()[1]
                break
        result.end = time.monotonic()


def thread_pool(size: int, monkeypatch: pytest.MonkeyPatch) -> tuple[ClientPool, list[threading.Thread]]:
    monkeypatch.setattr(clients, "_ProducerThread", FakeProducer)
    monkeypatch.setattr(clients, "_ConsumerRun", FakeConsumerRun)
    pool = ClientPool.__new__(ClientPool)
    pool.conns, pool.procs = [], []
    threads = []
    for _ in range(size):
        parent, child = multiprocessing.Pipe()
        t = threading.Thread(target=clients._worker, args=(child,), daemon=True)
        t.start()
        pool.conns.append(parent)
        threads.append(t)
    return pool, threads


def test_the_pool_tells_each_consumer_the_records_acknowledged_on_its_partitions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    pool, threads = thread_pool(4, monkeypatch)
    try:
        jobs = [Job("produce", "-", "t", [0, 1, 2], rate=100.0, duration_s=0.05, producers=2) for _ in range(2)]
        jobs += [Job("consume", "-", "t", parts, latency=True, duration_s=0.05) for parts in ([0, 2], [1])]
        run = pool.run(jobs)
        # per partition p: 2 producers x 10 (p + 1), in client process 0 once and in process 1 twice
        assert [r.expected for r in run.results[2:]] == [3 * 2 * (10 + 30), 3 * 2 * 20]
        assert [sum(r.acked_after_warmup.values()) for r in run.results[:2]] == [120, 240]
        # a failed producer: the consumers are told to stop, and the run fails
        jobs[0].tag = "fail"
        with pytest.raises(clients.BenchError, match="fenced"):
            pool.run(jobs)
        assert [c.poll(0) for c in pool.conns] == [False] * 4  # nothing left unread for the next run
    finally:
        pool.close()
        for t in threads:
            t.join(5)


def test_record_ids_differ_across_processes_and_producers() -> None:
    ids = {record_id(c, p, s) for c in range(3) for p in range(100) for s in (0, 1, 2**32 - 1)}
    assert len(ids) == 3 * 100 * 3


# --- coordinated omission: latency from the scheduled send time ----------------------------------------

class FakeDelivery:
    def __init__(self, value: bytes, partition: int, latency: float) -> None:
        self._value, self._partition, self._latency = value, partition, latency

    def value(self) -> bytes:
        return self._value

    def partition(self) -> int:
        return self._partition

    def latency(self) -> float:  # what librdkafka measures: from produce() to the delivery report
        return self._latency


class StallingProducer:
    """Acknowledges every record at the next poll; its first commit_transaction takes ``stall_s``."""

    stall_s = 0.2

    def __init__(self, conf: dict[str, Any]) -> None:
        self.pending: list[tuple[bytes, int, Any, float]] = []
        self.commits = 0

    def list_topics(self, *_a: Any, **_k: Any) -> None:
        pass

    def init_transactions(self, *_a: Any) -> None:
        pass

    def begin_transaction(self) -> None:
        pass

    def commit_transaction(self, *_a: Any) -> None:
        self.commits += 1
        if self.commits == 1:
            time.sleep(self.stall_s)
        self.poll(0)

    def produce(self, topic: str, value: bytes, partition: int = 0, on_delivery: Any = None) -> None:
        self.pending.append((value, partition, on_delivery, time.monotonic()))

    def poll(self, timeout: float) -> int:
        if not self.pending and timeout:
            time.sleep(timeout)
        done, self.pending = self.pending, []
        for value, partition, cb, at in done:
            cb(None, FakeDelivery(value, partition, time.monotonic() - at))
        return len(done)

    def flush(self, *_a: Any) -> int:
        self.poll(0)
        return 0


def test_latency_counts_from_the_scheduled_send_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that holds the sending loop 200 ms: the records due meanwhile go out late, in a burst.
    Their latency counts the wait (librdkafka's Message.latency(), from the late produce(), does
    not), and the send lag says how late they went out."""
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Producer", StallingProducer)
    job = Job("produce", "-", "t", [0, 1, 2], mode="transactional", rate=1000.0, duration_s=0.6, linger_ms=0)
    thread = clients._ProducerThread(job, 0)
    stamps: list[int] = []
    deliver = thread._on_delivery

    def on_delivery(err: Any, msg: Any) -> None:
        stamps.append(STAMP.unpack_from(msg.value())[0])
        deliver(err, msg)

    thread._on_delivery = on_delivery  # type: ignore[method-assign]
    start = time.monotonic()
    thread.run(start)
    assert thread.errors == 0 and thread.acked == thread.sent == len(stamps) >= 400
    start_ns = int(start * 1e9)
    assert sorted(stamps) == [start_ns + i * 1_000_000 for i in range(len(stamps))]  # record i: start + i ms
    assert max(thread.samples) >= 150  # the records due during the stall waited for it
    assert max(thread.send_lag_ms) >= 150 and min(thread.send_lag_ms) >= 0
    assert len(thread.send_lag_ms) == len(thread.samples)


def test_the_send_lag_is_reported_beside_the_latency() -> None:
    plan = Plan.quick_plan()
    bench = Bench(plan, [], pool=None, progress=lambda _msg: None)  # type: ignore[arg-type]
    lags = [0.1] * 95 + [120.0] * 5
    producer = Result(records=100, sent_per_s=200.0, acked_after_warmup={0: 100}, latencies_ms=[1.0] * 100,
                      send_lag_ms=lags)
    bench._run = fake_run([producer], 1.0)  # type: ignore[method-assign]
    broker = type("B", (), {"bootstrap": "127.0.0.1:1"})()
    lat = bench.latency(broker, "t", 1, 200.0, processes=1, per_process=1, size=100)  # type: ignore[arg-type]
    assert lat["send_lag_ms"] == {"p50": 0.1, "p99": 120.0, "max": 120.0}

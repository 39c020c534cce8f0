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
    assert result.end - start < 1.5  # stopped once all were seen


def test_a_consumer_gives_up_late_s_after_the_expectation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "LATE_S", 0.3)
    start = time.monotonic()
    job = Job("consume", "-", "t", [0], latency=True, duration_s=0.1, warmup_s=0.0)
    result = Result(start=start)
    consumer_run(job, ScheduledConsumer([(start + 0.02, stamped(start, 1))])).run(
        start, result, Expectation(start + 0.1, 5))
    assert (result.seen, result.expected) == (1, 5)
    assert 0.35 <= result.end - start < 1.0


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

"""The group commit of ``flush_every_append`` (``Broker.durable``) under many concurrent producers.

Invariants: every caller returns once the log is synced below its offset; one fsync serves every
append planned before it; a caller that arrives while a finished fsync has not yet been recorded
neither spins (``await`` of a done future does not yield, so a loop on it starves the very task
that would record it: the broker then burns a core, answers nothing and ignores SIGTERM) nor
returns early; an fsync failure reaches every waiter.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from oncelog.server.broker import Broker
from oncelog.storage import fileio


class FakeLog:
    """The slice of PartitionLog that the group commit uses."""

    name = "t-0"
    topic, partition = "t", 0
    reads_wait_for_fsync = True  # flush_every_append

    def __init__(self, fail_after: int | None = None) -> None:
        self.log_end = 0
        self.synced_end = 0
        self.fsyncs = 0
        self.fail_after = fail_after

    def plan_sync(self) -> tuple[int, list[int]]:
        return self.log_end, []

    def mark_synced(self, end: int) -> None:
        assert end >= self.synced_end
        self.synced_end = end

    def sync_failed(self, error: OSError) -> None:
        raise fileio.StorageOfflineError(f"t-0 offline: {error}")


class GroupCommit:
    """Broker's group-commit methods on a stand-in (no sockets, no log dir)."""

    durable = Broker.durable
    synced_future = Broker.synced_future
    _want_sync = Broker._want_sync
    _schedule_fsyncs = Broker._schedule_fsyncs
    _start_fsyncs = Broker._start_fsyncs
    _job_synced = Broker._job_synced
    _ring_synced = Broker._ring_synced
    _synced = Broker._synced
    _sync_ring = None

    def __init__(self, rng: random.Random, log: FakeLog) -> None:
        self._syncing: dict[str, Any] = {}
        self._wanted: dict[str, Any] = {}
        self._fsyncs_scheduled = False
        self.rng = rng
        self.log = log
        self.failed: list[BaseException] = []
        self._sync_executor = ThreadPoolExecutor(1)

    def storage_failed(self, exc: BaseException) -> None:
        self.failed.append(exc)

    def notify_append(self, tp: tuple[str, int]) -> None:
        pass


def run_in_thread(coro_fn: Any, timeout_s: float) -> Any:
    """Run ``coro_fn()`` on a fresh event loop in a thread: a loop that spins cannot be
    interrupted from inside, so the test gives up on the thread instead."""
    out: dict[str, Any] = {}

    def target() -> None:
        try:
            out["value"] = asyncio.run(coro_fn())
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), f"the group commit did not finish within {timeout_s}s (spinning or stuck)"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize("seed", range(3))
def test_many_producers_all_return_synced_and_share_fsyncs(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    log = FakeLog()
    gc = GroupCommit(rng, log)

    def slow_fsync(fds: list[int]) -> None:  # what the sync thread does, with a jittered duration
        log.fsyncs += 1
        time.sleep(rng.random() * 0.002)

    monkeypatch.setattr("oncelog.server.broker._fsync_and_close", slow_fsync)
    acked: list[tuple[int, int]] = []

    async def producer(i: int) -> None:
        for _ in range(40):
            log.log_end += 1
            offset = log.log_end
            await gc.durable(log, offset)
            acked.append((offset, log.synced_end))
            if rng.random() < 0.5:
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(producer(i) for i in range(30)))

    run_in_thread(main, 30)
    assert len(acked) == 30 * 40
    assert all(synced >= offset for offset, synced in acked), "acknowledged before its fsync"
    assert log.fsyncs < len(acked) / 2, f"{log.fsyncs} fsyncs for {len(acked)} appends: not shared"


def test_a_caller_arriving_after_the_fsync_returned_but_before_it_was_recorded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The window of the spin: the sync thread has finished, its result not yet seen by the loop."""
    log = FakeLog()
    gc = GroupCommit(random.Random(0), log)
    go, finished = threading.Event(), threading.Event()

    def fsync(fds: list[int]) -> None:
        assert go.wait(5)
        log.fsyncs += 1
        finished.set()

    monkeypatch.setattr("oncelog.server.broker._fsync_and_close", fsync)

    async def main() -> None:
        log.log_end = 1
        first = asyncio.ensure_future(gc.durable(log, 1))
        for _ in range(5):
            await asyncio.sleep(0)  # the first caller plans and submits its fsync
        go.set()
        # Block the loop (no callbacks run) until the sync thread is done: its completion is then
        # queued, and the second caller's first step is queued behind it, before the first
        # caller's wake-up (which the completion schedules).
        assert finished.wait(5)
        time.sleep(0.05)
        second = asyncio.ensure_future(gc.durable(log, 1))
        await asyncio.gather(first, second)

    run_in_thread(main, 10)
    assert log.synced_end == 1


def test_an_fsync_failure_reaches_every_waiter(monkeypatch: pytest.MonkeyPatch) -> None:
    log = FakeLog()
    gc = GroupCommit(random.Random(0), log)

    def failing(fds: list[int]) -> None:
        time.sleep(0.01)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr("oncelog.server.broker._fsync_and_close", failing)

    async def main() -> list[Any]:
        log.log_end = 3
        return await asyncio.gather(*(gc.durable(log, i) for i in (1, 2, 3)), return_exceptions=True)

    results = run_in_thread(main, 10)
    assert all(isinstance(r, fileio.StorageOfflineError) for r in results), results
    assert len(gc.failed) == 1 and log.synced_end == 0


class RoundLog(FakeLog):
    """A log of its own name that asserts it is never planned again before its fsync is recorded."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name
        self.syncing = False
        self.planned_end = 0
        self.fsynced_end = 0  # what the (fake) disk holds: set by the fsync itself

    def plan_sync(self) -> tuple[int, list[Any]]:
        assert not self.syncing, f"{self.name} planned while its last fsync is not recorded"
        self.syncing = True
        self.planned_end = self.log_end
        return self.log_end, [self]

    def mark_synced(self, end: int) -> None:
        assert self.syncing
        self.syncing = False
        super().mark_synced(end)


@pytest.mark.parametrize("seed", range(3))
def test_each_log_has_one_fsync_at_a_time_and_different_logs_sync_side_by_side(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producers append to several logs at once (as a transaction step or a pipelining client does)
    and wait for each: every wait returns once the disk holds its records, a log is never planned
    again before its fsync is recorded, appends share fsyncs, and fsyncs of different logs overlap."""
    rng = random.Random(seed)
    logs = [RoundLog(f"t-{i}") for i in range(4)]
    gc = GroupCommit(rng, logs[0])
    gc._sync_executor = ThreadPoolExecutor(4)
    running: set[str] = set()
    overlap = [0]
    lock = threading.Lock()

    def fsync(fds: list[Any]) -> None:
        (log,) = fds
        with lock:
            running.add(log.name)
            overlap[0] = max(overlap[0], len(running))
        time.sleep(rng.random() * 0.001)
        log.fsyncs += 1
        log.fsynced_end = log.planned_end
        with lock:
            running.discard(log.name)

    monkeypatch.setattr("oncelog.server.broker._fsync_and_close", fsync)
    acked: list[tuple[str, int, int]] = []

    async def producer() -> None:
        for _ in range(30):
            chosen = rng.sample(logs, rng.randint(1, len(logs)))
            marks = []
            for log in chosen:
                log.log_end += 1
                marks.append((log, log.log_end))
            await asyncio.gather(*(gc.durable(log, offset) for log, offset in marks))
            acked.extend((log.name, offset, log.fsynced_end) for log, offset in marks)
            if rng.random() < 0.5:
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(producer() for _ in range(20)))

    run_in_thread(main, 30)
    assert all(fsynced >= offset for _, offset, fsynced in acked), "acknowledged before its fsync"
    assert not any(log.syncing for log in logs)
    fsyncs = sum(log.fsyncs for log in logs)
    assert fsyncs < len(acked) / 2, f"{fsyncs} fsyncs for {len(acked)} appends: not shared"
    assert overlap[0] > 1, "the fsyncs of different logs never ran side by side"


def test_a_failed_fsync_reaches_its_waiters_and_later_fsyncs_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """One log's fsync fails: the broker is told once, that log's waiters get the error (the
    directory is offline), the other log, fsynced, is answered, and nothing is left behind for
    later callers."""
    logs = [RoundLog("t-0"), RoundLog("t-1")]
    gc = GroupCommit(random.Random(0), logs[0])
    fail = {"t-1"}

    def fsync(fds: list[Any]) -> None:
        time.sleep(0.005)
        if fds[0].name in fail:
            raise OSError(5, "Input/output error")

    monkeypatch.setattr("oncelog.server.broker._fsync_and_close", fsync)

    async def main() -> tuple[list[Any], int]:
        for log in logs:
            log.log_end = 2
        results = await asyncio.gather(*(gc.durable(log, 2) for log in logs for _ in range(3)),
                                       return_exceptions=True)
        assert not gc._syncing and not gc._wanted
        fail.clear()
        logs[1].syncing = False  # a failed fsync records nothing; the broker would have stopped
        logs[0].log_end = 3
        await gc.durable(logs[0], 3)
        return results, logs[0].synced_end

    results, synced = run_in_thread(main, 10)
    assert results[:3] == [None] * 3, results
    assert all(isinstance(r, fileio.StorageOfflineError) for r in results[3:]), results
    assert len(gc.failed) == 1
    assert synced == 3

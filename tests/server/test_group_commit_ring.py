"""The group commit (``Broker.durable``) with its fsyncs on the io_uring (``storage/fsync_ring.py``).

Invariants, as on the sync threads (test_group_commit.py): every caller returns once its log is
synced below its offset; fsyncs are shared; a failure reaches every waiter of that log and takes it
offline, and other logs carry on; every descriptor a job was given (duplicates, directories) is
closed once it ends.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
from pathlib import Path
from typing import Any

import pytest

from oncelog.server.broker import Broker
from oncelog.storage import fileio
from oncelog.storage.fsync_ring import FsyncRing, open_ring
from tests.server.test_group_commit import GroupCommit

ring_or_skip = open_ring()
if ring_or_skip is not None:
    ring_or_skip.close()
pytestmark = pytest.mark.skipif(ring_or_skip is None, reason="this kernel or machine has no io_uring")



class RingLog:
    """The slice of PartitionLog the group commit uses, over a real file: ``plan_sync`` hands out a
    duplicate of its descriptor (and its directory now and then, as after a roll)."""

    reads_wait_for_fsync = False

    def __init__(self, directory: Path, name: str, rng: random.Random, fail: bool = False) -> None:
        self.name = name
        self.topic, self.partition = name, 0
        self.directory = directory
        self.fd = os.open(directory / name, os.O_RDWR | os.O_CREAT, 0o644)
        self.pipe = os.pipe() if fail else None
        self.rng = rng
        self.log_end = 0
        self.synced_end = 0
        self.planned: list[int] = []
        self.offline: OSError | None = None

    def append(self) -> int:
        os.write(self.fd, b"r" * 100)
        self.log_end += 1
        return self.log_end

    def plan_sync(self) -> tuple[int, list[int | Path]]:
        fds: list[int | Path] = [os.dup(self.pipe[0] if self.pipe else self.fd)]
        if self.rng.random() < 0.2:
            fds.append(self.directory)
        self.planned.append(self.log_end)
        return self.log_end, fds

    def mark_synced(self, end: int) -> None:
        assert end >= self.synced_end
        self.synced_end = end

    def sync_failed(self, error: OSError) -> None:
        self.offline = error
        raise fileio.StorageOfflineError(f"{self.name} offline: {error}")


class RingGroupCommit(GroupCommit):
    """test_group_commit's stand-in for the Broker, with the ring's methods, and no sync threads
    unless a test gives it some: the ring must take every job."""

    _open_sync_ring = Broker._open_sync_ring
    _ring_completed = Broker._ring_completed
    _watch_ring = Broker._watch_ring
    _ring_watched = Broker._ring_watched
    _close_sync_ring = Broker._close_sync_ring

    def __init__(self) -> None:
        self._syncing: dict[str, Any] = {}
        self._wanted: dict[str, Any] = {}
        self._fsyncs_scheduled = False
        self._sync_ring: FsyncRing | None = None  # type: ignore[assignment]
        self._ring_watch: asyncio.TimerHandle | None = None
        self._sync_executor = None  # type: ignore[assignment]
        self.failed: list[BaseException] = []


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("seed", range(3))
def test_many_producers_on_the_ring_return_synced_share_fsyncs_and_leak_no_descriptor(
        tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    logs = [RingLog(tmp_path, f"log{i}", rng) for i in range(3)]
    gc = RingGroupCommit()
    before = _open_fds()

    async def producer(k: int) -> None:
        for _ in range(20):
            plog = logs[rng.randrange(3)]
            offset = plog.append()
            await gc.durable(plog, offset)
            assert plog.synced_end >= offset
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    async def main() -> None:
        gc._open_sync_ring(asyncio.get_running_loop())
        assert gc._sync_ring is not None
        await asyncio.wait_for(asyncio.gather(*(producer(k) for k in range(30))), 30)
        gc._close_sync_ring()

    asyncio.run(main())
    planned = sum(len(plog.planned) for plog in logs)
    assert planned < 600  # 600 appends, fewer fsync jobs: they are shared
    assert all(plog.synced_end == plog.log_end for plog in logs)
    assert _open_fds() == before  # every dup and directory descriptor was closed
    assert gc.failed == []
    for plog in logs:
        os.close(plog.fd)


def test_a_failed_fsync_on_the_ring_reaches_every_waiter_and_takes_the_log_offline(tmp_path: Path) -> None:
    rng = random.Random(1)
    bad = RingLog(tmp_path, "bad", rng, fail=True)
    good = RingLog(tmp_path, "good", rng)
    gc = RingGroupCommit()

    async def main() -> list[Any]:
        gc._open_sync_ring(asyncio.get_running_loop())

        async def wait(plog: RingLog) -> Any:
            offset = plog.append()
            try:
                await gc.durable(plog, offset)
                return None
            except BaseException as exc:
                return exc

        results = await asyncio.wait_for(asyncio.gather(*(wait(p) for p in [bad] * 5 + [good] * 5)), 30)
        gc._close_sync_ring()
        return results

    results = asyncio.run(main())
    assert all(isinstance(r, fileio.StorageOfflineError) for r in results[:5])
    assert results[5:] == [None] * 5
    assert isinstance(bad.offline, OSError) and bad.offline.errno == errno.EINVAL
    assert bad.synced_end == 0 and good.synced_end == good.log_end
    assert len(gc.failed) >= 1
    for plog in (bad, good):
        os.close(plog.fd)
    assert bad.pipe is not None
    os.close(bad.pipe[0])
    os.close(bad.pipe[1])


def test_a_job_larger_than_the_ring_goes_to_the_threads(tmp_path: Path) -> None:
    """A log with more segments to fsync than the ring holds (tiny segment.bytes, many appends since
    its last fsync): its job runs on the sync threads. Handed to the ring it was refused, and the
    log's waiters waited for good."""
    from concurrent.futures import ThreadPoolExecutor

    class ManySegments(RingLog):
        def plan_sync(self) -> tuple[int, list[int | Path]]:
            self.planned.append(self.log_end)
            return self.log_end, [os.dup(self.fd) for _ in range(300)]

    plog = ManySegments(tmp_path, "many", random.Random(0))
    gc = RingGroupCommit()
    gc._sync_executor = ThreadPoolExecutor(2)  # type: ignore[assignment]
    before = _open_fds()

    async def main() -> None:
        gc._open_sync_ring(asyncio.get_running_loop())
        assert gc._sync_ring is not None and gc._sync_ring.capacity < 300
        await asyncio.wait_for(gc.durable(plog, plog.append()), 10)
        gc._close_sync_ring()

    asyncio.run(main())
    gc._sync_executor.shutdown()
    assert plog.synced_end == plog.log_end and gc.failed == []
    assert _open_fds() == before
    os.close(plog.fd)


def test_a_transaction_over_hundreds_of_segments_commits(broker: Any) -> None:
    """The same through a broker process and librdkafka: 400 batches of one transaction, each in a
    segment of its own (segment.bytes=100), leave 400 segments to fsync before the PrepareCommit.
    With that job handed to the ring, the commit timed out."""
    from confluent_kafka import Producer

    from oncelog.demo.faults import read_topic
    from oncelog.testing.broker_process import create_topic

    create_topic(broker.bootstrap, "tiny", 1, {"segment.bytes": "100"})
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "tiny-segments", "linger.ms": 0})
    p.init_transactions(10)
    p.begin_transaction()
    for i in range(400):
        p.produce("tiny", b"v%d" % i, partition=0)
        assert p.flush(10) == 0  # one batch each
    p.commit_transaction(30)
    assert len(list((broker.data_dir / "tiny-0").glob("*.log"))) > 300
    assert [v for _k, v in read_topic(broker.bootstrap, "tiny")] == [b"v%d" % i for i in range(400)]


def test_jobs_end_even_when_the_rings_eventfd_stays_quiet(tmp_path: Path) -> None:
    """A kernel may hold finished fsyncs in this thread's task work until it enters the ring, and
    signal the eventfd only then (seen on Linux 6.18 under load: 6 entries done, none posted for
    60 s; every answer waiting for them waited). The broker looks at the ring every RING_WATCH_S
    while it has jobs, and ``completed`` enters the ring first. Here the eventfd is not watched at
    all: every waiter must still return."""
    rng = random.Random(3)
    logs = [RingLog(tmp_path, f"quiet{i}", rng) for i in range(3)]
    gc = RingGroupCommit()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        gc._open_sync_ring(loop)
        assert gc._sync_ring is not None
        loop.remove_reader(gc._sync_ring.fileno)

        async def producer() -> None:
            for _ in range(10):
                plog = logs[rng.randrange(3)]
                await gc.durable(plog, plog.append())

        await asyncio.wait_for(asyncio.gather(*(producer() for _ in range(5))), 20)
        assert gc._ring_watch is None or gc._sync_ring.in_flight == 0
        gc._close_sync_ring()

    asyncio.run(main())
    assert all(plog.synced_end == plog.log_end for plog in logs) and gc.failed == []
    for plog in logs:
        os.close(plog.fd)


def test_completed_asks_the_kernel_to_post_finished_entries_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``completed`` with entries in flight enters the ring with GETEVENTS (no wait) before reading
    the completion queue: what makes a kernel post completions it held in task work."""
    from oncelog.storage import fsync_ring

    ring = FsyncRing(entries=8)
    (fd,) = [os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)]
    entered: list[tuple[object, ...]] = []
    real = fsync_ring._syscall

    def recording(*args: object) -> int:
        entered.append(args)
        return real(*args)

    try:
        done: list[OSError | None] = []
        ring.fsync([fd], done.append)
        ring.submit()
        monkeypatch.setattr(fsync_ring, "_syscall", recording)
        while not done:
            ring.completed()
        getevents = [a for a in entered if a[0] == fsync_ring.SYS_IO_URING_ENTER
                     and a[4] == fsync_ring.IORING_ENTER_GETEVENTS and a[3] == 0]
        assert getevents, entered
        assert done == [None]
        entered.clear()
        ring.completed()  # nothing in flight: no system call
        assert entered == []
    finally:
        ring.close()
        os.close(fd)

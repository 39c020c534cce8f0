"""The io_uring that fsyncs for the group commit (``storage/fsync_ring.py``), and the group commit on it.

Invariants: every job is called back exactly once, never from inside ``fsync``; None only when each
of its fsyncs returned 0, else the first failure (a later entry of the job is cancelled, never
reported); jobs that do not fit wait and run in order; ``close`` ends every job first; a file system
that intercepts fsync gets no ring (it must see each fsync).
"""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path

import pytest

from oncelog.storage import fileio
from oncelog.storage.fsync_ring import FsyncRing, open_ring

ring_or_skip = open_ring()
if ring_or_skip is not None:
    ring_or_skip.close()
pytestmark = pytest.mark.skipif(ring_or_skip is None, reason="this kernel or machine has no io_uring")


def _drain(ring: FsyncRing, limit_s: float = 10.0) -> None:
    """Wait on the eventfd, as the event loop does (epoll: poll here, which takes any descriptor
    number, where select() refuses those past 1023), until no job is left."""
    import select
    import time

    poller = select.poll()
    poller.register(ring.fileno, select.POLLIN)
    deadline = time.monotonic() + limit_s
    while ring.in_flight:
        assert time.monotonic() < deadline, "fsync jobs never completed"
        poller.poll(500)
        ring.completed()


def _files(tmp_path: Path, n: int) -> list[int]:
    return [os.open(tmp_path / f"f{i}", os.O_RDWR | os.O_CREAT, 0o644) for i in range(n)]


def test_every_job_is_called_back_once_with_none_and_jobs_beyond_the_capacity_wait(tmp_path: Path) -> None:
    ring = FsyncRing(entries=8)
    fds = _files(tmp_path, 5)
    rng = random.Random(7)
    calls: list[tuple[int, OSError | None]] = []
    try:
        for job in range(200):
            chosen = rng.sample(fds, rng.randint(1, 4))
            for fd in chosen:
                os.write(fd, b"x" * rng.randint(1, 5000))
            ring.fsync(chosen, lambda error, job=job: calls.append((job, error)))
            assert len(calls) == 0 or calls[-1][0] != job  # never from inside fsync
            if rng.random() < 0.3:
                ring.submit()
                if rng.random() < 0.5:
                    ring.completed()
        ring.submit()
        _drain(ring)
        assert sorted(job for job, _ in calls) == list(range(200))
        assert all(error is None for _, error in calls)
    finally:
        ring.close()
        for fd in fds:
            os.close(fd)


def test_the_first_failure_is_reported_once_its_whole_job_is_back(tmp_path: Path) -> None:
    """A pipe cannot be fsynced (EINVAL): its job reports that failure once every entry of the job
    is back. A closed descriptor reports EBADF, first in its job or last. Other jobs are unaffected."""
    ring = FsyncRing(entries=16)
    (f,) = _files(tmp_path, 1)
    r, w = os.pipe()
    closed = os.dup(f)
    os.close(closed)
    got: dict[str, OSError | None] = {}
    try:
        ring.fsync([r, f], lambda e: got.__setitem__("pipe", e))
        ring.fsync([f, closed], lambda e: got.__setitem__("closed", e))
        ring.fsync([closed, f], lambda e: got.__setitem__("closed first", e))
        ring.fsync([f], lambda e: got.__setitem__("good", e))
        ring.submit()
        _drain(ring)
        assert isinstance(got["pipe"], OSError) and got["pipe"].errno == errno.EINVAL
        for job in ("closed", "closed first"):
            assert isinstance(got[job], OSError) and got[job].errno == errno.EBADF, got
        assert got["good"] is None
        assert ring.in_flight == 0 and not ring._jobs  # every entry's completion was read
    finally:
        ring.close()
        for fd in (f, r, w):
            os.close(fd)


def test_an_empty_job_is_called_back_by_the_eventfd_and_a_raising_callback_spares_the_others(
        tmp_path: Path) -> None:
    ring = FsyncRing(entries=8)
    (f,) = _files(tmp_path, 1)
    calls: list[str] = []

    def boom(_error: OSError | None) -> None:
        calls.append("boom")
        raise RuntimeError("a callback failed")

    try:
        ring.fsync([], lambda e: calls.append("empty"))
        assert calls == []
        ring.fsync([f], boom)
        ring.fsync([f], lambda e: calls.append("after"))
        ring.submit()
        import select

        poller = select.poll()
        poller.register(ring.fileno, select.POLLIN)
        assert poller.poll(5000)  # the empty job alone wakes the reader
        with pytest.raises(RuntimeError, match="a callback failed"):
            while ring.in_flight:
                poller.poll(500)
                ring.completed()
        _drain(ring)
        assert sorted(calls) == ["after", "boom", "empty"]
    finally:
        ring.close()
        os.close(f)


def test_close_waits_for_every_job_and_a_closed_ring_takes_none(tmp_path: Path) -> None:
    ring = FsyncRing(entries=4)
    fds = _files(tmp_path, 3)
    calls: list[OSError | None] = []
    for i in range(10):  # more than fit: some wait unsubmitted at close
        os.write(fds[i % 3], b"y" * 100)
        ring.fsync(fds, calls.append)
    ring.submit()
    ring.close()
    assert calls == [None] * 10
    with pytest.raises(RuntimeError):
        ring.fsync(fds, calls.append)
    ring.close()  # idempotent
    for fd in fds:
        os.close(fd)


def test_a_job_larger_than_the_ring_is_refused(tmp_path: Path) -> None:
    ring = FsyncRing(entries=4)
    fds = _files(tmp_path, 5)
    try:
        with pytest.raises(ValueError):
            ring.fsync(fds, lambda e: None)
    finally:
        ring.close()
        for fd in fds:
            os.close(fd)


def test_a_file_system_that_intercepts_fsync_gets_no_ring() -> None:
    class Recording(fileio.FileSystem):
        def fsync(self, fd: int) -> None:
            super().fsync(fd)

    assert Recording().fsync_ring(2) is None
    real = fileio.FileSystem().fsync_ring(2)
    assert real is not None
    real.close()


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.ENOSYS, errno.EMFILE, errno.ENOMEM])
def test_a_kernel_that_refuses_a_ring_gets_none_not_an_error(monkeypatch: pytest.MonkeyPatch, refusal: int) -> None:
    """A container's seccomp filter (EPERM), a kernel without io_uring (ENOSYS), no descriptor or
    memory left: the broker then uses its threads; it must not fail to start."""
    from oncelog.storage import fsync_ring

    def refuse(*_args: object) -> int:
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(fsync_ring, "_syscall", refuse)
    assert open_ring() is None
    assert fileio.FileSystem().fsync_ring(2) is None

"""fsync without a thread hand-off: a Linux io_uring that takes fsyncs and reports them on an eventfd.

Why: under ``flush_every_append`` every answer waits for a group-commit fsync. On sync threads each
one is a submit, a thread wake, the fsync, and a ``call_soon_threadsafe`` back, each side taking the
GIL from a busy event loop; measured, such a job cost about 320 µs of CPU where the bare fsync costs
70 (docs/design/performance.md). Here the event loop's thread writes a submission entry into memory
it shares with the kernel and makes one ``io_uring_enter`` call; the kernel runs the fsync on a
worker of its own, which holds no GIL, and posts a completion; the eventfd wakes the loop, which
reads the completions from shared memory.

What a caller may rely on:
- :meth:`FsyncRing.fsync` of a list of descriptors runs their fsyncs **in that order**, each after
  the one before returned (linked entries). The callback gets None once every one returned 0, else
  the first failure as an ``OSError``. A failed fsync does not stop the ones after it (the kernel
  cancels a chain after a failed read or write, not after a failed fsync; an entry it refuses at
  submission, a bad descriptor, cancels the rest): either way the job has failed, and the log
  directory goes offline.
  Callbacks run only inside :meth:`FsyncRing.completed` (the event loop's reader of :attr:`fileno`)
  or :meth:`FsyncRing.close`, never inside :meth:`fsync`, and each exactly once.
- A job whose entries do not fit (the submission queue, or the completions the ring can hold
  without overflow) waits in a queue of its own and is submitted when completions make room, in the
  order jobs came.
- The descriptors stay the caller's: the ring neither closes nor duplicates them, so they must stay
  open until the callback ran.
- One thread uses a ring (the event loop's): nothing here takes a lock.

The ring's memory is read and written with plain loads and stores. The kernel's side pairs them
with acquire/release barriers; on x86-64 (total store order) a plain store after the entry's stores
publishes it, and that is the only machine this module turns itself on for (:func:`open_ring`):
elsewhere the broker keeps its sync threads.

No library: the one Python binding on PyPI (``liburing``) died with an illegal instruction on this
machine's CPU and marks its fsync as untested. What is used of io_uring is small: setup, three
mmaps, ``IORING_OP_FSYNC``, ``IORING_REGISTER_EVENTFD`` and ``IORING_REGISTER_IOWQ_MAX_WORKERS``.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import mmap
import os
import platform
import struct
import sys
from collections.abc import Callable, Sequence

log = logging.getLogger("oncelog.storage")

SYS_IO_URING_SETUP, SYS_IO_URING_ENTER, SYS_IO_URING_REGISTER = 425, 426, 427  # the same on every arch
IORING_OFF_SQ_RING, IORING_OFF_CQ_RING, IORING_OFF_SQES = 0, 0x8000000, 0x10000000
IORING_OP_FSYNC = 3
IOSQE_IO_LINK = 1 << 2
IORING_ENTER_GETEVENTS = 1
IORING_REGISTER_EVENTFD = 4
IORING_REGISTER_IOWQ_MAX_WORKERS = 19
MAP_POPULATE = 0x8000

SQE = struct.Struct("<BBHiQQIIQ24x")  # opcode, flags, ioprio, fd, off, addr, len, fsync_flags, user_data
CQE = struct.Struct("<QiI")  # user_data, res, flags
U32 = struct.Struct("<I")

Callback = Callable[[OSError | None], None]


class _SqOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array", "resv1")] + [
        ("user_addr", ctypes.c_uint64)]


class _CqOffsets(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags", "resv1")] + [
        ("user_addr", ctypes.c_uint64)]


class _Params(ctypes.Structure):
    _fields_ = [("sq_entries", ctypes.c_uint32), ("cq_entries", ctypes.c_uint32), ("flags", ctypes.c_uint32),
                ("sq_thread_cpu", ctypes.c_uint32), ("sq_thread_idle", ctypes.c_uint32),
                ("features", ctypes.c_uint32), ("wq_fd", ctypes.c_uint32), ("resv", ctypes.c_uint32 * 3),
                ("sq_off", _SqOffsets), ("cq_off", _CqOffsets)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall(*args: object) -> int:
    r = int(_libc.syscall(*args))
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r


class _Job:
    __slots__ = ("callback", "error", "fds", "left")

    def __init__(self, fds: list[int], callback: Callback) -> None:
        self.fds = fds
        self.callback = callback
        self.left = len(fds)  # completions still to come
        self.error: OSError | None = None


class FsyncRing:
    """An io_uring used for fsyncs only. See the module's docstring for what it guarantees."""

    def __init__(self, entries: int = 256, max_workers: int = 4) -> None:
        params = _Params()
        self._fd = _syscall(SYS_IO_URING_SETUP, entries, ctypes.byref(params))
        self._maps: list[mmap.mmap] = []
        self._eventfd = -1
        try:
            self._sq = self._map(params.sq_off.array + params.sq_entries * 4, IORING_OFF_SQ_RING)
            self._cq = self._map(params.cq_off.cqes + params.cq_entries * CQE.size, IORING_OFF_CQ_RING)
            self._sqes = self._map(params.sq_entries * SQE.size, IORING_OFF_SQES)
            self._sq_entries = params.sq_entries
            self._sq_tail_at = params.sq_off.tail
            self._cq_head_at, self._cq_tail_at = params.cq_off.head, params.cq_off.tail
            self._cqes_at = params.cq_off.cqes
            self._cq_mask = params.cq_entries - 1
            # At most this many entries are in flight, so the completion queue never overflows.
            self._capacity = min(params.sq_entries, params.cq_entries)
            for i in range(params.sq_entries):  # the submission array maps slot i to entry i, once for all
                U32.pack_into(self._sq, params.sq_off.array + 4 * i, i)
            self._tail = U32.unpack_from(self._sq, self._sq_tail_at)[0]
            self._eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            efd = ctypes.c_int32(self._eventfd)
            _syscall(SYS_IO_URING_REGISTER, self._fd, IORING_REGISTER_EVENTFD, ctypes.byref(efd), 1)
            # The kernel's workers that run the fsyncs: as many as the sync threads they replace.
            # (Best effort: a kernel before 5.15 has no such limit, and its default is bounded too.)
            workers = (ctypes.c_uint32 * 2)(max_workers, max_workers)
            try:
                _syscall(SYS_IO_URING_REGISTER, self._fd, IORING_REGISTER_IOWQ_MAX_WORKERS, workers, 2)
            except OSError:
                pass
        except BaseException:
            self._release()
            raise
        self._jobs: dict[int, _Job] = {}
        self._next_id = 1
        self._in_flight = 0  # entries submitted whose completion has not been read
        self._unsubmitted = 0  # entries written since the last io_uring_enter
        self._waiting: collections.deque[_Job] = collections.deque()
        self._empty: list[_Job] = []  # jobs of no descriptor: done at the next ``completed``
        self._closed = False

    def _map(self, size: int, offset: int) -> mmap.mmap:
        m = mmap.mmap(self._fd, size, mmap.MAP_SHARED | MAP_POPULATE, mmap.PROT_READ | mmap.PROT_WRITE,
                      offset=offset)
        self._maps.append(m)
        return m

    @property
    def fileno(self) -> int:
        """The eventfd to watch for readability; then call :meth:`completed`."""
        return self._eventfd

    @property
    def capacity(self) -> int:
        """The most descriptors one job may have."""
        return self._capacity

    @property
    def in_flight(self) -> int:
        """Jobs not yet called back (submitted or waiting for room)."""
        return len(self._jobs) + len(self._waiting)

    def fsync(self, fds: Sequence[int], callback: Callback) -> None:
        """fsync ``fds`` in order, then ``callback(error)``: later, from :meth:`completed` (an
        empty list too: the ring then signals its own eventfd). The entries reach the kernel at
        the next :meth:`submit`."""
        if self._closed:
            raise RuntimeError("the fsync ring is closed")
        job = _Job(list(fds), callback)
        if len(job.fds) > self._capacity:
            raise ValueError(f"{len(job.fds)} descriptors in one job; the ring holds {self._capacity}")
        if self._waiting or not self._place(job):
            self._waiting.append(job)

    def _place(self, job: _Job) -> bool:
        """Write ``job``'s entries if they fit (True); the caller submits them."""
        n = len(job.fds)
        if self._in_flight + self._unsubmitted + n > self._capacity:
            return False
        if n == 0:
            self._empty.append(job)
            os.eventfd_write(self._eventfd, 1)
            return True
        job_id = self._next_id
        self._next_id += 1
        self._jobs[job_id] = job
        tail = self._tail
        for i, fd in enumerate(job.fds):
            flags = IOSQE_IO_LINK if i < n - 1 else 0
            SQE.pack_into(self._sqes, (tail % self._sq_entries) * SQE.size,
                          IORING_OP_FSYNC, flags, 0, fd, 0, 0, 0, 0, job_id)
            tail = (tail + 1) & 0xFFFFFFFF
        self._tail = tail
        U32.pack_into(self._sq, self._sq_tail_at, tail)  # after the entries: x86-64 keeps the order
        self._unsubmitted += n
        return True

    def submit(self) -> None:
        """Hand every entry written since the last call to the kernel (one system call, as a rule).
        The kernel takes entries in order; what it did not take yet is offered again. Raises
        OSError only for what retrying cannot mend (a bug: the ring is then unusable)."""
        while self._unsubmitted:
            try:
                taken = _syscall(SYS_IO_URING_ENTER, self._fd, self._unsubmitted, 0, 0, None, 0)
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno in (errno.EAGAIN, errno.EBUSY) and self._in_flight:
                    self._wait_for_one()  # the kernel is short of room until a completion is read
                    continue
                raise
            if taken <= 0:
                raise OSError(errno.EIO, "io_uring_enter took no entry")
            self._unsubmitted -= taken
            self._in_flight += taken

    def _wait_for_one(self) -> None:
        try:
            _syscall(SYS_IO_URING_ENTER, self._fd, 0, 1, IORING_ENTER_GETEVENTS, None, 0)
        except InterruptedError:
            pass

    def completed(self) -> int:
        """Read the eventfd and every completion; run the callbacks of the jobs that ended; submit
        jobs that waited for room. Returns how many jobs ended.

        With entries in flight, the kernel is first asked to post what it has finished
        (``io_uring_enter`` with GETEVENTS and no wait): a kernel may hold an fsync's completion
        in the task work of this thread and post it (and signal the eventfd) only when the thread
        enters the ring. Seen here (Linux 6.18, under load): 6 entries done, none posted for 60 s,
        all posted at once by that call. So the caller also calls this now and then while
        :attr:`in_flight` (the broker's watchdog), not only when the eventfd is readable."""
        try:
            os.eventfd_read(self._eventfd)
        except BlockingIOError:
            pass
        if self._in_flight:
            self._post_finished()
        return self._reap()

    def _post_finished(self) -> None:
        try:
            _syscall(SYS_IO_URING_ENTER, self._fd, 0, 0, IORING_ENTER_GETEVENTS, None, 0)
        except (InterruptedError, BlockingIOError):
            pass  # EINTR, EAGAIN: the next call tries again
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                raise

    def _reap(self) -> int:
        ended: list[_Job] = self._empty
        self._empty = []
        cq = self._cq
        head = U32.unpack_from(cq, self._cq_head_at)[0]
        tail = U32.unpack_from(cq, self._cq_tail_at)[0]
        while head != tail:
            job_id, res, _flags = CQE.unpack_from(cq, self._cqes_at + (head & self._cq_mask) * CQE.size)
            head = (head + 1) & 0xFFFFFFFF
            self._in_flight -= 1
            job = self._jobs[job_id]
            job.left -= 1
            # The entry that failed, not a cancellation it caused in the rest of its chain.
            if res < 0 and (job.error is None or job.error.errno == errno.ECANCELED):
                job.error = OSError(-res, os.strerror(-res))
            if job.left == 0:
                del self._jobs[job_id]
                ended.append(job)
        U32.pack_into(cq, self._cq_head_at, head)
        while self._waiting and self._place(self._waiting[0]):
            self._waiting.popleft()
        self.submit()
        failure: BaseException | None = None
        for job in ended:  # every one, even if one raises
            try:
                job.callback(job.error)
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
        return len(ended)

    def close(self) -> None:
        """Wait for every job (running their callbacks), then release the ring. Idempotent."""
        if self._closed:
            return
        try:
            while self._jobs or self._waiting or self._empty:
                self.submit()
                if self._in_flight:
                    self._wait_for_one()
                self._reap()
        finally:
            self._closed = True
            self._release()

    def _release(self) -> None:
        for m in self._maps:
            m.close()
        self._maps = []
        if self._eventfd >= 0:
            os.close(self._eventfd)
            self._eventfd = -1
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1



def open_ring(entries: int = 256, max_workers: int = 4) -> FsyncRing | None:
    """A ring, or None where this module does not run: not Linux, not x86-64 (see the module), or the
    kernel refuses a ring (too old, ``kernel.io_uring_disabled``, a seccomp filter such as a
    container's default: ENOSYS or EPERM; or no memory or descriptor for one). The ring is only a
    faster way to the same fsyncs, so no refusal is an error: the caller uses its threads."""
    if sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        return FsyncRing(entries, max_workers)
    except OSError as exc:
        log.info("no io_uring: %s", exc)
        return None

"""The broker process: owns storage and coordinators, runs the listener and the background timers.

Threading model: everything runs on one asyncio event loop thread. Storage and coordinators are
synchronous and are only ever called from that thread, so a handler that calls
``append -> replay`` without awaiting in between is atomic with respect to every other request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import functools
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from oncelog.clock import Clock, SystemClock
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import EncodedResponse
from oncelog.protocol.versions import SUPPORTED_VERSIONS
from oncelog.security.acl import Authorizer
from oncelog.security.listener import ListenerSecurity
from oncelog.server.config import BrokerConfig
from oncelog.server.quotas import QuotaManager
from oncelog.storage import descriptors, fileio
from oncelog.storage.config import LogConfig
from oncelog.storage.fsync_ring import FsyncRing
from oncelog.storage.log_cleaner import CleanerConfig, clean
from oncelog.storage.log_manager import LogManager
from oncelog.storage.producer_state import ProducerStateBound

log = logging.getLogger("oncelog.server")

TopicPartition = tuple[str, int]


def _ignore_result(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()  # retrieved: the failure was recorded by ``_synced``


def _call_back_on(loop: asyncio.AbstractEventLoop, callback: Callable[..., None], *args: Any) -> None:
    """From a worker thread: run ``callback(*args)`` on ``loop`` (nothing if the loop is closed)."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(callback, *args)


def _close_all(fds: list[int | Path]) -> None:
    for fd in fds:
        if not isinstance(fd, Path):
            with contextlib.suppress(OSError):
                fileio.fs.close(fd)


def _open_dirs(fds: list[int | Path]) -> list[int]:
    """``fds`` with each directory (``PartitionLog.plan_sync``) replaced by a descriptor opened on it.
    On failure the directories opened so far are closed again; ``fds`` stay the caller's."""
    out: list[int] = []
    opened: list[int | Path] = []
    try:
        for fd in fds:
            if isinstance(fd, Path):
                fd = fileio.fs.open_dir(fd)
                opened.append(fd)
            out.append(fd)
    except OSError:
        _close_all(opened)
        raise
    return out


def _fsync_and_close(fds: list[int | Path]) -> None:
    """fsync each descriptor (then close it) or directory (``PartitionLog.plan_sync``), in order."""
    try:
        for fd in fds:
            if isinstance(fd, Path):
                fileio.fs.fsync_dir(fd)
            else:
                fileio.fs.fsync(fd)
    finally:
        for fd in fds:
            if not isinstance(fd, Path):
                with contextlib.suppress(OSError):
                    fileio.fs.close(fd)


LOCK_FILE = ".lock"
CLEAN_SHUTDOWN_FILE = ".clean-shutdown"
SYNC_THREADS = 4  # fsyncs of different logs at once: a transaction step waits for the slowest, not the sum
RING_WATCH_S = 0.05  # how often the io_uring is looked at while it has jobs (``Broker._watch_ring``)
SYNC_BEHIND_BYTES = 256 << 10  # sync_behind: a transactional partition fsynced every this many bytes


class DataDirInUseError(OSError):
    pass


def lock_data_dir(data_dir: Path) -> int:
    """Take an exclusive lock on ``data_dir`` (as Kafka's ``.lock``); raise if another broker holds it.

    The lock is an flock on ``<data_dir>/.lock``: the kernel drops it when the process dies, so a
    kill -9 never leaves a stale lock. Two brokers writing one directory would corrupt it silently.
    """
    path = data_dir / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        finally:
            os.close(fd)
        raise DataDirInUseError(f"data directory {data_dir} is in use by another broker (pid {holder}); "
                                "stop it or choose another --data-dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, str(os.getpid()).encode(), 0)
    return fd


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class Broker:
    def __init__(self, config: BrokerConfig, clock: Clock | None = None) -> None:
        from oncelog.server.handlers import HANDLERS

        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.handlers = HANDLERS
        self.supported_versions = {k: v for k, v in SUPPORTED_VERSIONS.items() if k in HANDLERS}
        self.api_versions_answers: dict[int, EncodedResponse] = {}  # version -> frame (handle_api_versions)
        self.connections: set[Any] = set()
        self.queued_request_bytes = 0  # request bytes read and not yet handled, all connections
        # Connections whose send buffer passed its high mark: their client is not reading (see
        # response_room); KafkaConnection's pause_writing and resume_writing keep it.
        self.unread_writers: set[Any] = set()
        # One thread for the log directory's background flushes: fsync off the event loop.
        self._flush_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="oncelog-flush")
        # And a few for the fsyncs an answer waits for (flush_every_append, a transaction's steps):
        # group commit per log, and the logs of one transaction step fsynced side by side.
        self._sync_executor = concurrent.futures.ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="oncelog-sync")
        # Or, once started where the kernel allows it, an io_uring in their place (``start``).
        self._sync_ring: FsyncRing | None = None
        self._ring_watch: asyncio.TimerHandle | None = None  # ``_watch_ring``'s timer, while jobs are in flight
        # And one that reads log pages a fetch needs into the page cache (``read_into_cache``).
        self._read_executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="oncelog-read")
        # Group commit (``durable``): the logs whose fsync runs now (each with its planned end and the
        # future its waiters wait on), and the logs wanted for their next one (each with its future).
        self._syncing: dict[str, tuple[int, asyncio.Future[None]]] = {}
        self._wanted: dict[str, tuple[Any, asyncio.Future[None]]] = {}
        self._fsyncs_scheduled = False
        self._unsynced_bytes: dict[str, int] = {}  # per log: transactional bytes since sync_behind last started one
        self.produce_quota = QuotaManager(config.quota_producer_default)
        self.fetch_quota = QuotaManager(config.quota_consumer_default)
        self._waiters: dict[TopicPartition, set[asyncio.Future[None]]] = {}
        self._server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        config.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fd = lock_data_dir(config.data_dir)
        self.on_storage_failure: Callable[[], None] | None = None  # set by the CLI: stop the process
        self.storage_failure: str | None = None
        self.log_defaults = LogConfig(
            segment_bytes=config.log_segment_bytes,
            segment_ms=config.log_roll_ms,
            retention_ms=config.log_retention_ms,
            retention_bytes=config.log_retention_bytes,
            flush_interval_ms=config.flush_interval_ms,
            flush_every_append=config.flush_every_append,
            max_message_bytes=config.message_max_bytes,
            delete_retention_ms=config.log_cleaner_delete_retention_ms,
            min_cleanable_dirty_ratio=config.log_cleaner_min_cleanable_ratio,
            min_compaction_lag_ms=config.log_cleaner_min_compaction_lag_ms,
            max_compaction_lag_ms=config.log_cleaner_max_compaction_lag_ms,
        )
        self.cleaner_config = CleanerConfig(
            enable=config.log_cleaner_enable, threads=max(config.log_cleaner_threads, 1),
            backoff_ms=config.log_cleaner_backoff_ms, dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
            io_buffer_load_factor=config.log_cleaner_io_buffer_load_factor,
            io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second)
        self._cleaner_pool: concurrent.futures.ThreadPoolExecutor | None = None
        try:
            self.security = ListenerSecurity(  # credentials, TLS, SASL (oncelog.security)
                config.data_dir, sasl_mechanisms=config.sasl_enabled_mechanisms if config.sasl_enabled else None,
                tls_cert=Path(config.tls_cert) if config.tls_cert else None,
                tls_key=Path(config.tls_key) if config.tls_key else None)
            self.logs = LogManager(config.data_dir, self.log_defaults, self.clock, self.cleaner_config,
                                   producer_bound=ProducerStateBound(config.producer_state_max_entries))
            self.logs.dir_state.min_free_bytes = config.log_dir_min_free_bytes
            from oncelog.server.coordination import Coordination

            self.authorizer = Authorizer(
                config.data_dir / "__meta" / "acls.json", config.super_user_set,
                config.allow_everyone_if_no_acl_found) if config.authorizer_enabled else None
            from oncelog.server.handlers.metadata import MetadataCache

            self.metadata_cache = MetadataCache()
            clean = self._take_clean_shutdown_marker()
            self.coordination = Coordination(self)
            self.coordination.load(clean_shutdown=clean)
        except BaseException:
            self.release_data_dir()
            raise

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        from oncelog.server.connection import KafkaConnection

        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: KafkaConnection(self), self.config.listen_host, self.config.listen_port,
            reuse_address=True, backlog=512, ssl=self.security.ssl_context,
        )
        if self.config.fsync_io_uring:
            self._open_sync_ring(loop)
        else:
            log.info("fsyncs an answer waits for run on %d threads (fsync_io_uring off)", SYNC_THREADS)
        self._tasks.append(loop.create_task(self._every(self._flush_tick_ms, self._flush)))
        self._tasks.append(loop.create_task(
            self._every(self.config.log_retention_check_interval_ms, self._retention)))
        self._tasks.append(loop.create_task(self._every(
            self.config.transaction_abort_timed_out_transaction_cleanup_interval_ms,
            self.coordination.expire_transactions)))
        self._tasks.append(loop.create_task(self._every(60_000, self._expire_producers)))
        self._tasks.append(loop.create_task(self._group_timer()))
        self._tasks.append(loop.create_task(self._every(
            min(max(self.config.connections_max_idle_ms // 4, 100), 30_000), self._close_idle_connections)))
        self._tasks.append(loop.create_task(self._every(600_000, self.coordination.expire_offsets)))
        self._tasks.append(loop.create_task(self._every(
            self.config.internal_log_checkpoint_interval_ms, self._checkpoint_internal_logs)))
        if self.cleaner_config.enable:
            self._cleaner_pool = concurrent.futures.ThreadPoolExecutor(
                self.cleaner_config.threads, thread_name_prefix="oncelog-log-cleaner")
            for _ in range(self.cleaner_config.threads):
                self._tasks.append(loop.create_task(self._run_log_cleaner()))
        host, port = self.config.advertised
        log.info("oncelog broker %d listening on %s:%d (%s, advertised %s:%d), data in %s",
                 self.config.node_id, self.config.listen_host, self.config.listen_port, self.security.protocol,
                 host, port, self.config.data_dir)

    def _open_sync_ring(self, loop: asyncio.AbstractEventLoop) -> None:
        """Take the group commit's fsyncs to an io_uring (``storage/fsync_ring.py``), unless the
        kernel or the machine has none, or ``fileio.fs`` intercepts fsyncs (a test's recording file
        system, which must see each one)."""
        ring = fileio.fs.fsync_ring(SYNC_THREADS)
        if ring is None:
            log.info("fsyncs an answer waits for run on %d threads (no io_uring here)", SYNC_THREADS)
            return
        loop.add_reader(ring.fileno, self._ring_completed, ring)
        self._sync_ring = ring
        log.info("fsyncs an answer waits for run on an io_uring")

    def _ring_completed(self, ring: FsyncRing) -> None:
        try:
            ring.completed()
        except Exception:  # a callback's failure must not stop the reader: every other job still ends
            log.exception("an fsync completion failed")

    def _watch_ring(self, ring: FsyncRing) -> None:
        """While the ring has jobs, look at it every RING_WATCH_S even if its eventfd stays quiet: a
        kernel may hold finished fsyncs until the thread enters the ring (``FsyncRing.completed``),
        and every answer waiting for them would wait for ever (seen: 60 s, under load)."""
        if self._ring_watch is None and ring.in_flight:
            self._ring_watch = asyncio.get_running_loop().call_later(RING_WATCH_S, self._ring_watched, ring)

    def _ring_watched(self, ring: FsyncRing) -> None:
        self._ring_watch = None
        if ring is not self._sync_ring:
            return  # closed since
        if ring.in_flight:
            self._ring_completed(ring)
        self._watch_ring(ring)

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        # Every connection's handling ends before the logs close (a fetch waiting for appends would
        # otherwise read closed segments).
        handling = [conn.task for conn in self.connections if conn.task is not None and not conn.task.done()]
        for conn in list(self.connections):
            conn.close()
        for t in [*self._tasks, *handling]:
            t.cancel()
        for t in [*self._tasks, *handling]:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._tasks.clear()
        self.logs.cleaner.abort_all()
        if self._cleaner_pool is not None:
            self._cleaner_pool.shutdown(wait=True, cancel_futures=True)  # an aborted job stops at its next check
            self._cleaner_pool = None
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self.close()
        log.info("oncelog broker stopped cleanly")

    def close(self) -> None:
        """Flush and close every log, mark the stop clean, then release the data directory."""
        self._read_executor.shutdown(wait=True)
        self.logs.close()  # waits for flushes in flight
        self._flush_executor.shutdown(wait=True)
        self.logs.checkpoint_at_stop()
        self._sync_executor.shutdown(wait=True)
        self._close_sync_ring()
        if self.logs.dir_state.offline_reason is None:
            fileio.fs.write_atomic(self.config.data_dir / CLEAN_SHUTDOWN_FILE, b"")
        self.release_data_dir()

    def _close_sync_ring(self) -> None:
        """Wait for the ring's fsyncs in flight (their waiters are resolved if the loop still runs),
        then release it."""
        ring, self._sync_ring = self._sync_ring, None
        if ring is None:
            return
        if self._ring_watch is not None:
            self._ring_watch.cancel()
            self._ring_watch = None
        try:
            asyncio.get_running_loop().remove_reader(ring.fileno)
        except RuntimeError:
            pass
        try:
            ring.close()
        except Exception:
            log.exception("closing the fsync ring failed")

    def _take_clean_shutdown_marker(self) -> bool:
        """True if the previous run stopped cleanly; the marker is removed (durably) before anything
        is written, so a crash of this run is seen as unclean by the next."""
        marker = self.config.data_dir / CLEAN_SHUTDOWN_FILE
        if not marker.exists():
            return False
        fileio.fs.unlink(marker)
        fileio.fs.fsync_dir(self.config.data_dir)
        return True

    def storage_failed(self, exc: BaseException) -> None:
        """A write or fsync failed: the data directory is offline. With one log directory the broker
        stops (Kafka halts when every log dir is offline); recovery on restart reads what is on disk."""
        if self.storage_failure is None:
            self.storage_failure = str(exc)
            log.critical("stopping the broker: the data directory failed: %s", exc)
            if self.on_storage_failure is not None:
                self.on_storage_failure()

    def release_data_dir(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor drops the flock
            self._lock_fd = -1

    async def _every(self, interval_ms: int | Callable[[], int], fn: Any) -> None:
        while True:
            ms = interval_ms() if callable(interval_ms) else interval_ms
            await asyncio.sleep(max(ms, 10) / 1000)
            try:
                fn()
            except fileio.StorageOfflineError as exc:
                self.storage_failed(exc)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__name__", fn))

    async def _group_timer(self) -> None:
        """Group timers at most 100 ms apart, and at each deadline the last tick saw coming (a
        session expires at its deadline, not up to a tick later). A deadline made after a tick is
        at least the minimum session timeout away, so the next tick sees it in time."""
        next_ms: int | None = None
        while True:
            wait_ms = 100 if next_ms is None else min(100, max(1, next_ms - self.clock.now_ms()))
            await asyncio.sleep(wait_ms / 1000)
            try:
                next_ms = self.coordination.tick_groups()
            except fileio.StorageOfflineError as exc:
                self.storage_failed(exc)
            except Exception:
                log.exception("the group timer failed")

    async def read_into_cache(self, fd: int, position: int, length: int) -> None:
        """Read ``length`` bytes at ``position`` of ``fd`` on the read thread and drop them: the
        pages are then in the page cache, where the event loop's next read finds them without
        waiting for the disk. Safe against a segment closed meanwhile: the bytes are never used, so
        a closed descriptor (EBADF) or one reused by another file costs a wasted read, nothing else;
        reused by a socket or a pipe, ``pread`` fails with ESPIPE and consumes nothing."""
        await asyncio.get_running_loop().run_in_executor(self._read_executor, _read_and_drop, fd, position, length)

    def _flush_tick_ms(self) -> int:
        """The background flush looks as often as the shortest flush.ms of any topic (topic
        configs can lower it live), and at least every flush_interval_ms."""
        return min(self.config.flush_interval_ms, self.logs.min_flush_interval_ms())

    def _flush(self) -> None:
        """Start the background flush of every partition that is due, as one pass on the flush
        thread (``fsync`` never runs on the event loop for it): each partition's data, then the
        log directory's recovery-point checkpoint once; the pass finishes back on the loop."""
        flush_pass = self.logs.begin_flush_pass(self.clock.monotonic_ms())  # flush.ms: time passed, not the wall clock
        if flush_pass is None:
            return
        fut = asyncio.get_running_loop().run_in_executor(self._flush_executor, flush_pass.run)
        fut.add_done_callback(functools.partial(self._flush_finished, flush_pass))

    async def durable(self, plog: Any, offset: int) -> None:
        """Return once ``plog`` is fsynced below ``offset`` (flush_every_append acknowledgements).

        Group commit: a log wanted (here, or earlier by ``sync_soon`` when the records were appended)
        has its fsync started one pass of the event loop later (``_start_fsyncs``), on the io_uring
        or a sync thread, never on the event loop; it plans the log's end then, so it covers every
        append made before, of every producer. When it returns, the log's synced end is recorded, and only then are its
        waiters resumed. A log has at most one fsync running: one wanted meanwhile starts right after
        it. Different logs' fsyncs run side by side, so a slow one never holds another. Raises
        StorageOfflineError if the disk refuses (the log directory goes offline, the broker stops).
        """
        while (fut := self.synced_future(plog, offset)) is not None:
            # Every waiter resumes only once the fsync's return is recorded (the synced end): awaiting a
            # bare executor future here let a waiter spin on a done future (``await`` of a done
            # future does not yield) before the task that started it could record the result.
            await asyncio.shield(fut)

    def sync_behind(self, plog: Any, nbytes: int) -> None:
        """After ``nbytes`` of transactional data were appended to ``plog``: once at least
        SYNC_BEHIND_BYTES are unsynced there, ask for its next group-commit fsync unless one is
        running. So a transaction's data is mostly durable before its commit, whose PrepareCommit
        must wait for all of it, and the fsyncs stay few and large (one per append would slow the
        appends themselves). Never waits; a failure takes the log directory offline as in
        :meth:`durable`. Outside an event loop (a handler called directly) it does nothing: it only
        moves work earlier."""
        unsynced = self._unsynced_bytes.get(plog.name, 0) + nbytes
        if unsynced < SYNC_BEHIND_BYTES or plog.name in self._syncing:
            self._unsynced_bytes[plog.name] = unsynced
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._unsynced_bytes.pop(plog.name, None)
        if plog.synced_end < plog.log_end_offset:
            self._want_sync(plog)

    def synced_future(self, plog: Any, offset: int) -> asyncio.Future[None] | None:
        """None if ``plog`` is fsynced below ``offset`` already; else the future of the fsync that
        the wait is on now (it may end before ``offset`` is covered: ask again then). For a caller
        that waits beside something else (a connection listening for new requests)."""
        if plog.synced_end >= offset:
            return None
        in_flight = self._syncing.get(plog.name)
        return in_flight[1] if in_flight is not None and in_flight[0] >= offset else self._want_sync(plog)

    def sync_soon(self, plog: Any) -> None:
        """Ask for the next group-commit fsync of ``plog`` now, before anyone awaits :meth:`durable`
        for it: a connection awaits its answers in request order, so without this a pipelining
        client's later partitions would each start an fsync only when their turn came. Never waits;
        outside an event loop it does nothing."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        self._want_sync(plog)

    def _want_sync(self, plog: Any) -> asyncio.Future[None]:
        """The future of the next fsync of ``plog`` (which a later pass of the event loop starts)."""
        wanted = self._wanted.get(plog.name)
        if wanted is not None:
            return wanted[1]
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        fut.add_done_callback(_ignore_result)  # sync_behind's and sync_soon's fsyncs may have no waiter
        self._wanted[plog.name] = (plog, fut)
        if plog.name not in self._syncing:
            self._schedule_fsyncs(loop)
        return fut

    def _schedule_fsyncs(self, loop: asyncio.AbstractEventLoop) -> None:
        if not self._fsyncs_scheduled:
            self._fsyncs_scheduled = True
            loop.call_soon(self._start_fsyncs)

    def _start_fsyncs(self) -> None:
        """Start the fsync of every wanted log that has none running: each log's own job, planned
        here, so it covers every append made before this pass (fsyncs of different logs run side by
        side); ``_synced`` records it back on the loop. The jobs go to the io_uring when the broker
        has one (one system call for all of them), else to the sync threads."""
        self._fsyncs_scheduled = False
        loop = asyncio.get_running_loop()
        ring = self._sync_ring
        for name, (plog, fut) in list(self._wanted.items()):
            if name in self._syncing:
                continue
            del self._wanted[name]
            try:
                end, fds = plog.plan_sync()
            except Exception as exc:  # offline already (StorageOfflineError), or EMFILE: no duplicate left open
                fut.set_exception(exc)
                continue
            self._syncing[name] = (end, fut)
            # A job larger than the ring (a log with hundreds of segments written since its last
            # fsync: tiny segment.bytes) goes to the threads.
            if ring is not None and len(fds) <= ring.capacity:
                try:
                    ring_fds = _open_dirs(fds)
                except OSError as exc:  # a directory that cannot be opened cannot be fsynced either
                    _close_all(fds)
                    loop.call_soon(self._synced, plog, end, fut, exc)
                    continue
                ring.fsync(ring_fds, functools.partial(self._ring_synced, plog, end, fut, ring_fds))
                continue
            try:
                job = self._sync_executor.submit(_fsync_and_close, fds)
            except RuntimeError as exc:  # the broker is closing: its sync threads are gone
                _close_all(fds)
                self._syncing.pop(name, None)
                fut.set_exception(exc)
                continue
            job.add_done_callback(functools.partial(_call_back_on, loop, self._job_synced, plog, end, fut))
        if ring is not None:
            try:
                ring.submit()
            except OSError as exc:  # not a disk's answer: the ring itself is broken
                log.exception("io_uring submission failed")
                self.storage_failed(fileio.StorageOfflineError(f"fsync submission failed: {exc}"))
            self._watch_ring(ring)

    def _ring_synced(self, plog: Any, end: int, fut: asyncio.Future[None], fds: list[int],
                     error: OSError | None) -> None:
        _close_all(list(fds))
        self._synced(plog, end, fut, error)

    def _job_synced(self, plog: Any, end: int, fut: asyncio.Future[None], job: concurrent.futures.Future[None]) -> None:
        self._synced(plog, end, fut, job.exception())

    def _synced(self, plog: Any, end: int, fut: asyncio.Future[None], error: BaseException | None) -> None:
        """A log's fsync returned (on the loop again): record its synced end, then resolve its waiters."""
        self._syncing.pop(plog.name, None)
        if error is None:
            plog.mark_synced(end)
            fut.set_result(None)
            if plog.reads_wait_for_fsync:  # more is readable now (``PartitionLog.readable_end``)
                self.notify_append((plog.topic, plog.partition))
        else:
            if isinstance(error, OSError):
                try:
                    plog.sync_failed(error)  # takes the log directory offline
                except fileio.StorageOfflineError as offline:
                    self.storage_failed(offline)
                    error = offline
            fut.set_exception(error)
        if plog.name in self._wanted:
            self._schedule_fsyncs(asyncio.get_running_loop())

    def _flush_finished(self, flush_pass: Any, _future: Any = None) -> None:
        try:
            self.logs.finish_flush_pass(flush_pass)
        except fileio.StorageOfflineError as exc:
            self.storage_failed(exc)

    def _expire_producers(self) -> None:
        self.logs.remove_expired_producers(self.clock.now_ms(), self.config.producer_id_expiration_ms)

    def _checkpoint_internal_logs(self) -> None:
        self.coordination.checkpoint_internal_logs(self.config.internal_log_checkpoint_bytes)

    async def _run_log_cleaner(self) -> None:
        """One cleaner: pick the dirtiest compacted log, clean it on a cleaner thread, swap the result
        in here on the loop thread (``LogCleanerManager.complete`` does not await). Sleeps
        ``log.cleaner.backoff.ms`` when no log is due."""
        loop = asyncio.get_running_loop()
        backoff = max(self.cleaner_config.backoff_ms, 10) / 1000
        while True:
            job = None
            try:
                job = self.logs.grab_cleanable(self.clock.now_ms())
            except fileio.StorageOfflineError as exc:
                self.storage_failed(exc)
            except Exception:
                log.exception("choosing a log to clean failed")
            if job is None:
                await asyncio.sleep(backoff)
                continue
            assert self._cleaner_pool is not None
            try:
                result = await loop.run_in_executor(self._cleaner_pool, clean, job)
            except asyncio.CancelledError:
                self.logs.cleaner.abort(job.plog)
                raise
            except Exception as exc:
                self.logs.cleaner.failed(job, exc)
                continue
            try:
                self.logs.cleaner.complete(job, result)
            except fileio.StorageOfflineError as exc:
                self.storage_failed(exc)
            except Exception as exc:
                self.logs.cleaner.failed(job, exc)

    def _retention(self) -> None:
        self.logs.apply_retention_all(self.clock.now_ms())

    # --- connections ------------------------------------------------------------------------------
    def response_room(self) -> int:
        """How many bytes a Fetch response may carry under ``queued_max_response_bytes``: what is
        left once the responses held for clients that are not reading (``unread_writers``, each
        past ``socket_send_buffer_high_bytes``) are counted. Kafka sends records from the file
        (zero-copy), so a stalled client costs it no heap; here every response is in memory, and
        without this bound each stalled consumer held one ``fetch_max_bytes`` response."""
        held = sum(c.transport.get_write_buffer_size() for c in self.unread_writers if c.transport is not None)
        return max(self.config.queued_max_response_bytes - held, 0)

    def admit(self, conn: Any) -> str | None:
        """Register a new connection, or say why it is refused (max.connections[.per.ip], or the
        open files limit: ``storage.descriptors.connection_refused``)."""
        cfg = self.config
        n = len(self.connections)
        if n >= cfg.max_connections:
            return f"max.connections ({cfg.max_connections}) reached"
        if cfg.max_connections_per_ip <= n and \
                sum(1 for c in self.connections if c.host == conn.host) >= cfg.max_connections_per_ip:
            return f"max.connections.per.ip ({cfg.max_connections_per_ip}) reached for {conn.host}"
        if (refused := descriptors.connection_refused(n)) is not None:
            return refused
        self.connections.add(conn)
        return None

    def _close_idle_connections(self) -> None:
        import time

        limit = self.config.connections_max_idle_ms / 1000
        now = time.monotonic()
        for conn in list(self.connections):
            if now - conn.last_active > limit and not conn.frames:
                log.info("closing connection from %s: idle for more than %d ms", conn.peer,
                         self.config.connections_max_idle_ms)
                conn.close()

    def throttle(self, request: Any, quota: QuotaManager, nbytes: int) -> int:
        """Account ``nbytes`` to the request's principal; the throttle time to answer with (and to
        mute its connection for)."""
        session = request.session
        if session is None or not quota.enabled:
            return 0
        principal = session.principal if session.principal != "User:ANONYMOUS" else \
            f"client-id:{request.client_id or ''}"
        ms = quota.record(principal, nbytes, self.clock.now_ms())
        if ms > 0:
            session.throttle_ms = max(session.throttle_ms, ms)
        return ms

    # --- delayed fetch support ------------------------------------------------------------------
    def notify_append(self, tp: TopicPartition) -> None:
        waiters = self._waiters.pop(tp, None)
        if waiters:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)

    async def wait_for_append(self, partitions: Iterable[TopicPartition], timeout_s: float) -> None:
        """Return when any of ``partitions`` gets an append, or after ``timeout_s``; raise
        CancelledError if the waiting task is cancelled, even when an append comes in the same turn
        of the loop. (``asyncio.wait_for`` of Python 3.11 returned then instead: the fetch of a
        connection gone at a broker's stop went on to read logs already closed, EBADF.)"""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        tps = list(partitions)
        for tp in tps:
            self._waiters.setdefault(tp, set()).add(fut)
        timer = loop.call_later(max(timeout_s, 0), _resolve, fut)
        try:
            await fut
        finally:
            timer.cancel()
            for tp in tps:
                s = self._waiters.get(tp)
                if s is not None:
                    s.discard(fut)
                    if not s:
                        del self._waiters[tp]

    # --- helpers for handlers -------------------------------------------------------------------
    def check_produce(self, producer_id: int, producer_epoch: int, transactional_id: str | None,
                      transactional: bool, topic: str, partition: int) -> ErrorCode:
        """KIP-890 and producer id ownership: see ``TransactionCoordinator.check_produce``."""
        return self.coordination.txn.check_produce(producer_id, producer_epoch, transactional_id, transactional,
                                                   topic, partition)

    def api_version_entries(self) -> list[dict[str, int]]:
        return [{"api_key": k, "min_version": lo, "max_version": hi}
                for k, (lo, hi) in sorted(self.supported_versions.items())]


def _read_and_drop(fd: int, position: int, length: int) -> None:
    with contextlib.suppress(OSError):
        os.pread(fd, length, position)

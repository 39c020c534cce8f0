"""A partition's log: an ordered list of segments, producer state, and the offsets clients see.

Directory ``<data_dir>/<topic>-<partition>/`` holds the segments (``<base>.log/.index/.timeindex/
.txnindex``) and ``producer-state.snapshot`` (producer state at an offset below which every byte
was fsynced: a recovery point). The log directory's ``recovery-point-offset-checkpoint``
(``recovery_checkpoint``) holds the later recovery points that periodic flushes reached without a
snapshot; ``recovery-point`` (older versions) is still read.

Offsets: ``log_start_offset`` <= ``last_stable_offset`` <= ``high_watermark`` == ``log_end_offset``;
clients see ``readable_stable_offset`` <= ``readable_end`` <= ``high_watermark`` (bounded by what is
fsynced where every append must be durable first)
(a single node: everything written is "replicated"). The LSO is the first offset of the earliest
open transaction, or the high watermark when none is open.

Recovery (on open): data below the recovery point is trusted and is not validated (its indexes are
loaded, or rebuilt from batch headers if missing); producer state is loaded from the snapshot and
replayed from the batch headers between its offset and the recovery point (bounded by
``_snapshot_due``); then only the unflushed tail is scanned, CRC-checked, truncated at the first
torn or corrupt batch (with a WARNING), and replayed into the producer state. Recovery time is thus
bounded by the flush interval and the snapshot interval, not by the size of the log. The log end
always comes from the data: a segment whose data does not reach the recovery point at a batch
boundary is validated from its start instead, and the recovery point clamped to the log end; a
corrupt aborted-transaction index is rebuilt from the data (``_recover_from_start``,
``_damaged_aborted_indexes``; docs/design/storage.md, "Damage below the recovery point").

Only the broker's event loop thread calls a partition log; no locking.
"""

from __future__ import annotations

import bisect
import logging
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from oncelog.clock import Clock
from oncelog.protocol import compression
from oncelog.protocol import records as rb
from oncelog.storage import descriptors, fileio, segment_swap
from oncelog.storage.config import INT64_MAX, LogConfig
from oncelog.storage.errors import (
    DiskFullError,
    InvalidTimestampError,
    KeylessRecordError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    SegmentRollRefusedError,
)
from oncelog.storage.flush_job import FlushJob
from oncelog.storage.leader_epoch_cache import LeaderEpochCache
from oncelog.storage.log_segment import LogSegment, dup_descriptors
from oncelog.storage.producer_state import (
    AppendOrigin,
    ProducerStateBound,
    ProducerStateEntry,
    ProducerStateManager,
)
from oncelog.storage.transaction_index import AbortedTxn

__all__ = ["AppendOrigin", "AppendResult", "FetchData", "LogDirState", "PartitionLog"]

log = logging.getLogger("oncelog.storage")

RECOVERY_POINT_FILE = "recovery-point"
SNAPSHOT_FILE = "producer-state.snapshot"
# A periodic flush writes a producer-state snapshot at least this often (``_snapshot_due``).
SNAPSHOT_INTERVAL_BYTES = 16 << 20
SNAPSHOT_INTERVAL_OFFSETS = 100_000
SNAPSHOT_INTERVAL_MS = 30_000
LOG_START_FILE = "log-start-offset"


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FetchData:
    records: bytes
    first_offset: int


def _write_int_file(path: Path, value: int) -> None:
    fileio.fs.write_atomic(path, str(value).encode())


def _raise(error: BaseException) -> None:
    raise error


def _read_int_file(path: Path) -> int | None:
    raw = fileio.read_file(path)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


@dataclass
class LogDirState:
    """Shared by every partition of one log directory: once a write or fsync failed, the directory
    takes no more writes (Kafka marks the log dir offline) and the broker must stop.

    It also keeps ``min_free_bytes`` free for what the broker itself must write (markers,
    transaction records, indexes, snapshots): a client's append, or a record a client's request
    adds (an offset commit: ``PartitionLog.append``'s ``bounded``), that would leave less is refused
    (DiskFullError, :meth:`client_write_refused`), so that a client filling the disk is answered
    with an error instead of stopping the broker. 0 turns the check off."""

    offline_reason: str | None = None
    min_free_bytes: int = 0
    # Counts every partition's producer-state entries against the broker's bound (None: unbounded).
    producer_bound: ProducerStateBound | None = None
    _free: int | None = None  # at the last statvfs
    _since: int = 0  # bytes appended since
    _unknown: bool = False  # the file system reports no size: the bound cannot be applied
    #: Free space is asked of the file system again after this many bytes were appended, and on
    #: every append once the estimate comes within this of ``min_free_bytes``.
    RECHECK_BYTES: ClassVar[int] = 1 << 20

    def client_write_refused(self, directory: Path, incoming: int) -> str | None:
        """Why a client's append of ``incoming`` bytes may not be written now (None: it may)."""
        if self.min_free_bytes <= 0 or self._unknown:
            return None
        if self._free is None or self._since >= self.RECHECK_BYTES or \
                self._free - self._since - incoming < self.min_free_bytes + self.RECHECK_BYTES:
            st = os.statvfs(directory)
            if st.f_blocks == 0:  # the file system tells nothing of its size (LazyFS, some FUSE ones)
                self._unknown = True
                log.warning("the file system of %s reports no size: log_dir_min_free_bytes is not applied",
                            directory.parent)
                return None
            self._free, self._since = st.f_bavail * st.f_frsize, 0
        if self._free - self._since - incoming >= self.min_free_bytes:
            self._since += incoming
            return None
        return (f"not enough free space in {directory.parent}: {self._free - self._since} bytes free, "
                f"{self.min_free_bytes} kept for the broker's own records (log_dir_min_free_bytes)")

    def fail(self, what: str, error: BaseException) -> fileio.StorageOfflineError:
        """``what`` failed with ``error``: the directory goes offline (the first failure's reason
        is kept and logged, never retried); returns the error for the caller to raise."""
        if self.offline_reason is None:
            self.offline_reason = f"{what}: {error}"
            log.critical("%s: a write to disk failed (%s); the log directory takes no more writes", what, error)
        return fileio.StorageOfflineError(str(error))


class PartitionLog:
    def __init__(self, directory: Path, topic: str, partition: int, config: LogConfig, clock: Clock,
                 dir_state: LogDirState | None = None, *, checkpointed_recovery_point: int | None = None) -> None:
        """``checkpointed_recovery_point``: this partition's value in the log directory's
        recovery-point checkpoint (``recovery_checkpoint``), when its topic id matched."""
        self.directory = directory
        self.topic = topic
        self.partition = partition
        self.name = f"{topic}-{partition}"
        self.config = config
        self.clock = clock
        self.dir_state = dir_state or LogDirState()
        # Set once the log is closed or deleted (its files closed): nothing of it is fsynced any more.
        self.removed = False
        self._flush_job: FlushJob | None = None
        self._synced_end = 0  # log end offset at the last sync()
        # Segment files created by a roll, and how many of those names are known durable (a
        # directory fsync made after them returned): see ``roll``.
        self._rolls = 0
        self._rolls_named = 0
        self._sync_names: int | None = None  # rolls an fsync planned by ``plan_sync`` covers
        self._snapshot_name_durable = True
        # The last producer-state snapshot written (None: none on disk yet), and where the log was
        # then -- (active segment's base, its size, log end, time) -- for ``_snapshot_due``.
        self.snapshot_offset: int | None = None
        self._snapshot_mark: tuple[int, int, int, int] | None = None  # the time: monotonic
        self._checkpointed_recovery_point = checkpointed_recovery_point
        fileio.fs.mkdir(directory)
        self.segments: list[LogSegment] = []
        # Base offsets of ``segments`` for lookups, rebuilt only when the list changed (every
        # in-place replacement bumps ``_segments_replaced``; appends and pops change its ends).
        self._segments_replaced = 0
        self._bases_key: tuple[int, int, int, int] | None = None
        self._bases: list[int] = []
        self.producer_state = ProducerStateManager()
        self.log_start_offset = 0
        self.recovery_point = 0
        # When the last flush was planned, on the monotonic clock (``Clock.monotonic_ms``): flush.ms
        # and the snapshot interval measure time passed, which a wall-clock step must not stop.
        self.last_flush_monotonic_ms = clock.monotonic_ms()
        self._lso_cache: int | None = None
        # Leader epochs (KIP-101/320): this broker's epoch, stamped on every appended batch, and the
        # epoch -> start offset history (see leader_epoch_cache; become_leader sets the epoch).
        self.leader_epoch = 0
        self.epochs = LeaderEpochCache(directory)
        self._epoch_unwritten = False
        try:
            self._load()
        except BaseException:
            for seg in self.segments:  # a load that failed (no descriptor left) keeps no file open
                seg.abandon()
            raise
        if self.dir_state.producer_bound is not None:
            self.dir_state.producer_bound.attach(self.producer_state)
        # What the log held when it was loaded is readable at once, fsynced or not: it survived the
        # restart, and Kafka's high watermark after recovery is the log end too (``readable_end``).
        self._loaded_end = self.log_end_offset
        self.epochs.truncate_from_end(self.log_end_offset)
        self.epochs.truncate_from_start(self.log_start_offset)
        self._roll_jitter_ms = self._jitter_for(self.active.base_offset)

    # --- offsets ---------------------------------------------------------------------------------
    @property
    def active(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.active.next_offset

    @property
    def high_watermark(self) -> int:
        return self.active.next_offset

    @property
    def readable_end(self) -> int:
        """The high watermark clients see (Fetch, ListOffsets, DeleteRecords): the log end, except
        where every append must be durable before it is acknowledged (``flush_every_append``,
        ``flush.messages=1``): there only what is fsynced (``synced_end``). Kafka flushes inside the
        append there, before the high watermark moves, so no consumer reads a record a power cut can
        still take back; our appends are fsynced after, by the group commit, so reads stop at what it
        has made durable (and what the log held when it was loaded: it survived the restart). The
        internal offsets (``high_watermark``, ``last_stable_offset``) stay what the log holds: replay
        computes them the same way whatever was fsynced."""
        end = self.active.next_offset
        if self.reads_wait_for_fsync:
            return min(end, max(self.synced_end, self._loaded_end))
        return end

    @property
    def reads_wait_for_fsync(self) -> bool:
        """Every append must be durable before it is acknowledged (``flush_every_append``,
        ``flush.messages=1``), so clients read only what is fsynced (:attr:`readable_end`), and an
        fsync recorded can make more readable; otherwise reads never wait for an fsync."""
        cfg = self.config
        return cfg.flush_every_append or cfg.flush_messages <= 1

    @property
    def readable_stable_offset(self) -> int:
        """The last stable offset clients see: never above :attr:`readable_end`."""
        return min(self.last_stable_offset, self.readable_end)

    def visible_end(self, read_committed: bool) -> int:
        """Where a client's read stops: :attr:`readable_stable_offset` under read_committed, else
        :attr:`readable_end` (Fetch, ListOffsets' latest offset, and the bound on its timestamp
        lookups)."""
        return self.readable_stable_offset if read_committed else self.readable_end

    @property
    def last_stable_offset(self) -> int:
        """Never below the log start: DeleteRecords may pass an open transaction's first offset
        (Kafka bounds it by the high watermark only), and the transaction stays open."""
        first = self.producer_state.first_unstable_offset()
        return self.active.next_offset if first is None else max(first, self.log_start_offset)

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    # --- loading and recovery --------------------------------------------------------------------
    def _load(self) -> None:
        segment_swap.recover(self.directory, self.name)
        bases = sorted(int(p.stem) for p in self.directory.glob("*.log") if p.stem.isdigit())
        now = self.clock.now_ms()
        # Candidates for the recovery point on disk: the directory's checkpoint, the snapshot's
        # offset, and ``recovery-point`` (written by older versions); each is valid on its own.
        recovery_point = max(_read_int_file(self.directory / RECOVERY_POINT_FILE) or 0,
                             self._checkpointed_recovery_point or 0)
        if not bases:
            self._begin_empty(_read_int_file(self.directory / LOG_START_FILE) or 0, now)
            return
        self.segments = []
        for b in bases:  # one at a time: if one cannot be opened, those opened are closed (``__init__``)
            self.segments.append(LogSegment(self.directory, b, now, self.config.index_interval_bytes))
        self._segments_replaced += 1
        # Segments wholly below the recovery point: trusted; next_offset is the next segment's base.
        for seg, nxt in zip(self.segments, self.segments[1:], strict=False):
            seg.next_offset = nxt.base_offset
        snapshot = None
        try:
            snapshot = ProducerStateManager.from_snapshot((self.directory / SNAPSHOT_FILE).read_bytes())
        except FileNotFoundError:
            pass
        expected_aborted: dict[int, int] = {}
        # Producer state below the recovery point is replayed from the snapshot's offset on, from
        # data that is not validated again (it was fsynced before the recovery point moved).
        replay_from: int | None = None
        if snapshot is not None and snapshot[1] >= bases[0]:
            # The snapshot is written after the data it describes was fsynced, so its offset is a
            # valid recovery point even if the broker died before updating the checkpoint file.
            self.producer_state, snapshot_offset, expected_aborted = snapshot
            self.snapshot_offset = snapshot_offset
            if snapshot_offset < recovery_point:
                replay_from = snapshot_offset
            recovery_point = max(recovery_point, snapshot_offset)
        else:
            # No snapshot: the producer state at the first segment's base is empty, since a
            # snapshot is written (durably) before any segment is deleted, and a new log's first
            # snapshot waits for the interval. Data below the recovery point is replayed without
            # validation; everything is validated when there is no recovery point either.
            if snapshot is not None:
                log.warning("%s: the producer state snapshot at %d is below the log start %d; rebuilding from the log",
                            self.name, snapshot[1], bases[0])
            if recovery_point > bases[0]:
                replay_from = bases[0]
            recovery_point = max(recovery_point, bases[0])
        damaged = self._damaged_aborted_indexes()
        short = [seg.path.name for seg in self.segments
                 if self._flushed_aborted_txns(seg, recovery_point) < expected_aborted.get(seg.base_offset, 0)]
        if recovery_point > bases[0] and (short or damaged):
            if short:
                log.warning("%s: the aborted-transaction index of %s misses entries below the recovery point %d",
                            self.name, ", ".join(short), recovery_point)
            log.warning("%s: rebuilding the log's indexes and producer state from its start", self.name)
            self.producer_state = ProducerStateManager()
            recovery_point = bases[0]
            replay_from = self.snapshot_offset = None
            damaged = self.segments
        for seg in damaged:  # rebuilt from the data by the replay below
            seg.txn_index.load(2**62)
            seg.txn_index.truncate_to_offset(seg.base_offset)
        first_unflushed = 0
        for i in range(len(self.segments)):
            if i + 1 < len(self.segments) and self.segments[i + 1].base_offset <= recovery_point:
                first_unflushed = i + 1
        scanned_batches = replayed_batches = 0
        for i, seg in enumerate(self.segments):
            had_index = seg.load_indexes()
            if i == first_unflushed - 1 and had_index:
                # Rolled just before the recovery point's segment began: the flush that made its
                # time index durable may not have run (``LogSegment.plan_flush``).
                seg.restore_time_index(seg.size)
            if i < first_unflushed and not had_index and seg.size:
                log.info("%s: rebuilding the indexes of %s", self.name, seg.path.name)
                seg.next_offset = seg.base_offset
                seg.recover(0, validate=False, partition=self.name)
                seg.next_offset = self.segments[i + 1].base_offset
            # Trusted prefix of the segment holding the recovery point: scanning starts at the
            # recovery point's position, if the data reaches it (else see _recover_from_start).
            start_pos: int | None = 0
            if i == first_unflushed and seg.base_offset < recovery_point:
                start_pos = seg.boundary_position(recovery_point)
                if start_pos is not None:
                    seg.restore_time_index(start_pos)
            if start_pos is None:
                found_batches, replayed = self._recover_from_start(i, recovery_point)
                replayed_batches += replayed
            else:
                if replay_from is not None:  # this segment's part below the recovery point, if any
                    replayed_batches += self._replay_trusted(seg, replay_from, recovery_point)
                if i < first_unflushed:
                    continue
                seg.next_offset = max(seg.base_offset, recovery_point)
                found_batches = seg.recover(start_pos, validate=True, partition=self.name)
            scanned_batches += len(found_batches)
            self._replay(seg, found_batches)
            for _pos, header in found_batches:  # the unflushed tail's epochs, from the batches
                self.epochs.assign(header.partition_leader_epoch, header.base_offset)
            if i + 1 < len(self.segments) and seg.next_offset < self.segments[i + 1].base_offset \
                    and not seg.truncated:
                # The log cleaner removed the segment's last batches: offsets up to the next segment
                # are a gap, as anywhere in a compacted log (a torn segment is truncated instead).
                seg.next_offset = self.segments[i + 1].base_offset
            if i + 1 < len(self.segments) and seg.next_offset != self.segments[i + 1].base_offset:
                # A gap after a truncated segment: everything after it is unreachable and unflushed.
                for later in self.segments[i + 1 :]:
                    log.warning("recovery of %s: deleting segment %s after a truncated one", self.name,
                                later.path.name)
                    later.delete()
                del self.segments[i + 1 :]
                self._segments_replaced += 1
                break
        for seg in self.segments:
            seg.txn_index.truncate_to_offset(seg.next_offset)
        saved_start = _read_int_file(self.directory / LOG_START_FILE)
        self.log_start_offset = max(self.segments[0].base_offset, saved_start or 0)
        if self.log_start_offset > self.log_end_offset:
            self._start_empty_at(self.log_start_offset, now)
            return
        self.recovery_point = min(max(recovery_point, self.segments[0].base_offset), self.log_end_offset)
        self._unsynced_after_load()
        for seg in self.segments[:-1]:  # the active one's time index is fsynced when it rolls (``roll``)
            if seg.time_index.unwritten:
                # Entries recovery added (``recover``, ``restore_time_index``) exist in memory only:
                # the flush that next moves the recovery point writes and fsyncs them, light or not
                # (``LogSegment.plan_flush``). Left to no flush until 2026-11-28: the recovery point
                # passed the segment, and the next unclean start trusted its short index on disk
                # (probe s37, ``s3b_timeindex_retention.py``: a max timestamp 40 min old, its young
                # records deleted by a 30 min retention and skipped by ListOffsets).
                seg.time_index_durable_due = True
        if self.snapshot_offset is not None and self.snapshot_offset == self.log_end_offset:
            self._snapshot_mark = (self.active.base_offset, self.active.size, self.log_end_offset,
                                   self.clock.monotonic_ms())
        if scanned_batches or replayed_batches:
            log.info("%s: recovered %d unflushed batch(es) above the recovery point %d, replayed the producer "
                     "state of %d below it; log end offset %d", self.name, scanned_batches, self.recovery_point,
                     replayed_batches, self.log_end_offset)

    def _unsynced_after_load(self) -> None:
        """What the load read above the recovery point on disk is not known durable: after a kill -9
        (not a power cut) the page cache still held the writes the broker never fsynced, so recovery
        read them back, and a power cut can still take them. Each segment holding any of it is
        marked dirty, and the directory's names not durable (a roll's new file may be among them),
        so that whatever next moves the recovery point past it (a flush, light or full, ``close``)
        or counts it synced (``sync``, ``plan_sync``: the acknowledgements that wait for
        ``synced_end``) fsyncs it first, as Kafka's ``LocalLog.flush`` fsyncs every segment from the
        recovery point up before the recovery point moves. Until 2026-11-28 recovered segments were
        left clean: the first flush fsynced only the active segment, moved the recovery point to the
        log end, and a power cut then took everything recovered (probe s37, LazyFS,
        ``s4_kill_then_cut.py``: 60 of 60 acknowledged records lost; a duplicate answered as written
        and a committed transaction torn the same way). A producer-state snapshot read back may be a
        light flush's, its name not yet durable: it is made durable before segments below it go
        (``_recovery_point_durable``)."""
        unsynced = [seg for seg in self.segments if seg.next_offset > self.recovery_point]
        for seg in unsynced:
            seg.dirty = True
        if unsynced:
            self._rolls += 1
        if self.snapshot_offset is not None:
            self._snapshot_name_durable = False

    def _start_empty_at(self, start: int, now: int) -> None:
        """The log start lies past the recovered log end: DeleteRecords (or retention) made its new
        start durable, then the power went before the records below it were fsynced, so the data
        ends below its start. Appends would get offsets below the log start, which no fetch can
        reach. As Kafka's ``deleteSegmentsIfLogStartGreaterThanLogEnd``: every segment goes (all of
        it lies below the start), the log starts again empty at its start, and the producer state
        starts empty there (``truncateFullyAndStartAt``)."""
        log.warning("%s: the log start offset %d lies past the recovered log end %d (the records below it "
                    "were not fsynced before the broker stopped): the log starts again, empty, at %d",
                    self.name, start, self.log_end_offset, start)
        for seg in self.segments:
            seg.delete()
        fileio.fs.unlink(self.directory / SNAPSHOT_FILE)
        self.producer_state = ProducerStateManager()
        self.snapshot_offset = None
        self.epochs.truncate_from_start(start)
        self._begin_empty(start, now)

    def _begin_empty(self, start: int, now: int) -> None:
        """The log is one empty segment at ``start`` (its name durable), which is its start and its
        recovery point. No snapshot is due until the interval (none on disk means empty producer
        state at the first segment's base, see ``_load``)."""
        self.segments = [LogSegment(self.directory, start, now, self.config.index_interval_bytes)]
        self._segments_replaced += 1
        fileio.fs.fsync_dir(self.directory)
        self.log_start_offset = self.recovery_point = start
        self._snapshot_mark = (start, 0, start, self.clock.monotonic_ms())

    def _recover_from_start(self, i: int, recovery_point: int) -> tuple[list[tuple[int, rb.BatchHeader]], int]:
        """Recover ``segments[i]``, the segment holding ``recovery_point``, whose data does not reach
        it at a batch boundary (its file was cut, or a batch below it is torn or damaged): validate
        it from byte 0 and truncate it at the first invalid or incomplete batch (``recover``), so its
        end comes from its data, as Kafka's log end does, and never lies past it. The recovery point
        is then clamped to that end (``_load``'s last steps).

        The producer state is the snapshot's (or empty at the log start) plus the batches the earlier
        segments replayed, i.e. the state at the snapshot's offset or at this segment's base,
        whichever is later. If that offset lies past the data left, the snapshot describes batches
        that are gone: the state is rebuilt from the log start. Returns the batches to replay (those
        at or after that offset) and how many the rebuild replayed."""
        seg, first = self.segments[i], self.segments[0].base_offset
        seg.next_offset = seg.base_offset
        found = seg.recover(0, validate=True, partition=self.name)
        log.warning("recovery of %s: the data of segment %s does not reach the recovery point %d at a batch "
                    "boundary (its file was cut or damaged): validated from its start, it ends at offset %d",
                    self.name, seg.path.name, recovery_point, seg.next_offset)
        state_at = first if self.snapshot_offset is None else self.snapshot_offset
        replayed = 0
        if state_at > seg.next_offset:
            log.warning("recovery of %s: the producer state snapshot at %d lies past the data; rebuilding the "
                        "producer state from the log start %d", self.name, state_at, first)
            self.producer_state = ProducerStateManager()
            self.snapshot_offset = None
            state_at = first
            for earlier in self.segments[:i]:
                replayed += self._replay_trusted(earlier, first, seg.base_offset)
        seg.txn_index.truncate_to_offset(max(state_at, seg.base_offset))
        return [(pos, header) for pos, header in found if header.base_offset >= state_at], replayed

    def _damaged_aborted_indexes(self) -> list[LogSegment]:
        """Segments whose aborted-transaction index fails its sanity check (Kafka's
        ``CorruptIndexException``): each is logged; the caller rebuilds them from the data."""
        damaged = []
        ends = [seg.base_offset for seg in self.segments[1:]] + [INT64_MAX]
        for seg, end in zip(self.segments, ends, strict=True):
            reason = seg.txn_index.sanity_check(end)
            if reason is not None:
                log.warning("%s: the aborted-transaction index %s is corrupt (%s)", self.name,
                            seg.txn_index.path.name, reason)
                damaged.append(seg)
        return damaged

    @staticmethod
    def _flushed_aborted_txns(seg: LogSegment, recovery_point: int) -> int:
        """How many of ``seg``'s aborted-transaction entries on disk describe markers below ``recovery_point``."""
        seg.txn_index.load(recovery_point)
        return len(seg.txn_index.entries)

    def _replay_trusted(self, seg: LogSegment, start: int, end: int) -> int:
        """Replay into the producer state the batches of ``seg`` in [``start``, ``end``): data below
        the recovery point, fsynced, so read without validation (as Kafka rebuilds producer state
        from its last snapshot). ``start`` (a snapshot's offset) is a batch boundary. Returns how
        many batches it read."""
        if seg.base_offset >= end or (seg.next_offset > seg.base_offset and seg.next_offset <= start):
            return 0
        batches = []
        from_pos = seg.boundary_position(start) if seg.base_offset < start else 0
        for pos, header, _data in seg.iter_batches(from_pos or 0):
            if header.base_offset >= end:
                break
            if header.base_offset >= start:
                batches.append((pos, header))
        self._replay(seg, batches)
        return len(batches)

    def _replay(self, seg: LogSegment, batches: list[tuple[int, rb.BatchHeader]]) -> None:
        for pos, header in batches:
            if header.producer_id < 0:
                continue
            control = None
            if header.is_control and header.records_count > 0:
                # A control batch the cleaner emptied (its transaction is gone from the log) only
                # keeps the producer's epoch, as in Kafka: it ends no transaction.
                control = rb.read_control_marker(seg.pread(pos, header.size), 0, header)
            plan = self.producer_state.prepare([header], AppendOrigin.REPLAY, [control])
            lso_before = self.last_stable_offset if control is not None else -1  # only a marker completes one
            for done in self.producer_state.complete(plan, [header.base_offset]):
                if done.is_aborted:
                    seg.txn_index.append(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                                    lso_before))

    # --- leader epochs ---------------------------------------------------------------------------
    def become_leader(self, epoch: int) -> None:
        """Lead this partition in ``epoch`` from the log end offset on (Kafka's makeLeader assigns
        the epoch's start offset at once, so OffsetForLeaderEpoch is right before any append)."""
        self.leader_epoch = epoch
        dirty = self.epochs.dirty
        self.epochs.assign(epoch, self.log_end_offset)
        self.epochs.dirty = dirty  # an epoch with no record yet need not be durable...
        self._epoch_unwritten = True  # ...until its first append

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) as OffsetForLeaderEpoch answers; (-1, -1) when unknown."""
        return self.epochs.end_offset_for(epoch, self.log_end_offset)

    # --- appends ---------------------------------------------------------------------------------
    def append(self, records: bytes | bytearray, *, origin: AppendOrigin = AppendOrigin.CLIENT,
               defer_sync: bool = False, bounded: bool = False) -> AppendResult:
        """Validate and append whole batches; offsets are assigned here. See the module docstring.

        A client's append (``origin`` CLIENT), and a coordinator's that is ``bounded`` (records a
        client's request adds, such as an offset commit, as opposed to those that complete what is
        already written, such as markers), is refused with DiskFullError when it would leave less
        than ``log_dir_min_free_bytes`` free, or when the disk cuts its write short; nothing of it
        stays. Any other append the disk cuts short takes the log directory offline.

        With ``flush_every_append`` (or ``flush.messages`` reached) the data is fsynced before this
        returns, unless ``defer_sync``: then the caller must not acknowledge before
        :attr:`synced_end` passes the result's last offset (the server's group commit does that)."""
        self._check_online()
        # A compacted topic refuses a client's records without a key (Kafka's LogValidator): the
        # validating walk reports them, so no record is decoded for it.
        null_keys: list[list[int]] | None = [] if origin is AppendOrigin.CLIENT and self.config.compact else None
        batches = rb.split_batches(records, from_client=origin is AppendOrigin.CLIENT, null_keys=null_keys)
        max_bytes = self.config.max_message_bytes
        controls: list[rb.ControlMarker | None] = []
        needs_producer_state = False
        for pos, header in batches:
            if header.size > max_bytes and origin is AppendOrigin.CLIENT:
                raise RecordTooLargeError(f"batch of {header.size} bytes exceeds max.message.bytes {max_bytes}")
            if header.is_control:
                if origin is AppendOrigin.CLIENT:
                    raise rb.InvalidRecordError("clients may not write control batches")
                controls.append(rb.read_control_marker(records, pos, header))
            else:
                controls.append(None)
            if header.producer_id >= 0:
                needs_producer_state = True
        now = self.clock.now_ms()
        if origin is AppendOrigin.CLIENT:
            records, batches = self._validate_client_batches(records, batches, now)
            for keyless in null_keys or ():
                if keyless:  # the first batch with any (Kafka's processRecordErrors, batch by batch)
                    raise KeylessRecordError.of(f"{self.topic}-{self.partition}", keyless)
        headers = [h for _, h in batches]
        plan = None
        if needs_producer_state:
            plan = self.producer_state.prepare(headers, origin, controls)
            if plan.duplicate is not None:
                # Kafka answers a duplicate with the original batch's offsets and its timestamp as
                # the log append time.
                dup = plan.duplicate
                return AppendResult(dup.first_offset, dup.last_offset, dup.timestamp, self.log_start_offset,
                                    duplicate=True)
        refusable = origin is AppendOrigin.CLIENT or bounded  # refused for want of room, never fatal
        if refusable and (refused := self.dir_state.client_write_refused(self.directory, len(records))) is not None:
            raise DiskFullError(f"{self.name}: {refused}")
        self._maybe_roll(now, len(records), origin,
                         now if self.config.log_append_time else max(h.max_timestamp for _, h in batches))
        buf = bytearray(records)
        offset = self.log_end_offset
        placed: list[tuple[int, rb.BatchHeader]] = []
        base_offsets: list[int] = []
        log_append_time = self.config.log_append_time
        if self.epochs.latest_epoch != self.leader_epoch:
            self.epochs.assign(self.leader_epoch, offset)
        elif self._epoch_unwritten:
            self.epochs.dirty = True
        self._epoch_unwritten = False
        for pos, header in batches:
            rb.set_base_offset(buf, pos, offset)
            rb.set_partition_leader_epoch(buf, pos, self.leader_epoch)
            if log_append_time:
                rb.set_log_append_time(buf, pos, now)
            placed.append((pos, rb.read_header(buf, pos)))
            base_offsets.append(offset)
            offset += header.last_offset_delta + 1
        seg = self.active
        lso_before = self.last_stable_offset
        try:
            seg.append(buf, placed)
        except DiskFullError as exc:
            if not refusable:  # the broker's own records must be written
                raise self.dir_state.fail(self.name, exc) from exc
            raise
        if plan is not None:
            written = [h for _, h in placed] if log_append_time else None
            for done in self.producer_state.complete(plan, base_offsets, written):
                if done.is_aborted:
                    seg.txn_index.append(AbortedTxn(done.producer_id, done.first_offset, done.last_offset,
                                                    lso_before))
        if not defer_sync and self.must_sync:
            self.sync()  # durable before the acknowledgement; the recovery point follows in the background
        return AppendResult(base_offsets[0], offset - 1, now if log_append_time else -1, self.log_start_offset)

    def _validate_client_batches(self, records: bytes | bytearray, batches: list[tuple[int, rb.BatchHeader]],
                                 now: int) -> tuple[bytes | bytearray, list[tuple[int, rb.BatchHeader]]]:
        """What Kafka's LogValidator does with the topic's config: CreateTime records outside
        message.timestamp.before/after.max.ms are refused, and batches are recompressed to
        compression.type unless it is ``producer`` or already theirs (then the bytes stay as sent).

        On a CreateTime topic a batch's max timestamp must be its records' (``_create_time_headers``)."""
        cfg = self.config
        before, after = cfg.timestamp_before_max_ms, cfg.timestamp_after_max_ms
        if not cfg.log_append_time and (before < INT64_MAX or after < INT64_MAX):
            for pos, header in batches:
                view = memoryview(records)[pos : pos + header.size]
                for offset, ts in compression.record_timestamps(view, header):
                    if ts == rb.NO_TIMESTAMP:
                        continue  # Kafka's validateTimestamp checks only records that have one
                    if now - ts > before or ts - now > after:
                        raise InvalidTimestampError(
                            f"Timestamp {ts} of record {offset - header.base_offset} of the batch is out of range. "
                            f"The timestamp should be within [{now - before}, {now + after}]")
        if not cfg.log_append_time:
            records, batches = self._create_time_headers(records, batches)
        target = compression.BY_NAME.get(cfg.compression_type)
        if target is None or all(compression.codec_of(h) == target for _, h in batches):
            return records, batches
        level = {compression.GZIP: cfg.compression_gzip_level, compression.LZ4: cfg.compression_lz4_level,
                 compression.ZSTD: cfg.compression_zstd_level}.get(target)
        out = bytearray()
        placed: list[tuple[int, rb.BatchHeader]] = []
        for pos, header in batches:
            view = memoryview(records)[pos : pos + header.size]
            new = bytes(view) if compression.codec_of(header) == target else \
                compression.recompress_batch(view, header, target, None if level == -1 else level)
            if len(new) > cfg.max_message_bytes:
                raise RecordTooLargeError(f"batch of {len(new)} bytes after recompression to {cfg.compression_type} "
                                          f"exceeds max.message.bytes {cfg.max_message_bytes}")
            placed.append((len(out), rb.read_header(new)))
            out += new
        return out, placed

    @staticmethod
    def _create_time_headers(records: bytes | bytearray, batches: list[tuple[int, rb.BatchHeader]]
                             ) -> tuple[bytes | bytearray, list[tuple[int, rb.BatchHeader]]]:
        """A CreateTime topic keeps batches whose header is plausible as sent (the broker does not
        read their records). One whose max timestamp lies below its first record's, or that claims
        LogAppendTime, is set right from its records, as Kafka's LogValidator sets every batch's
        (``setMaxTimestamp(CREATE_TIME, max)``): segments, the time index, retention and lookups by
        time take the header's max. Seen: a client (Sarama before 1.45) sent -1 there, so retention
        never deleted its records and ListOffsets by time skipped them; a LogAppendTime bit made
        consumers see a max timestamp a client chose, past message.timestamp.after.max.ms.
        A max above the records' own is not caught (that would mean reading every batch's records)."""
        bad = [i for i, (_pos, h) in enumerate(batches)
               if h.attributes & rb.ATTR_TIMESTAMP_TYPE or h.max_timestamp < h.base_timestamp]
        if not bad:
            return records, batches
        buf = bytearray(records)
        fixed = list(batches)
        for i in bad:
            pos, header = batches[i]
            view = memoryview(buf)[pos : pos + header.size]
            stamps = [ts for _off, ts in compression.record_timestamps(view, header)]
            del view
            rb.set_create_time(buf, pos, max(stamps, default=rb.NO_TIMESTAMP))
            fixed[i] = (pos, rb.read_header(buf, pos))
        return buf, fixed

    def _maybe_roll(self, now_ms: int, incoming: int, origin: AppendOrigin, max_timestamp: int) -> None:
        """Roll before an append that the active segment should not take. A client's append that
        would roll while too few file descriptors are left is refused instead
        (SegmentRollRefusedError, ``storage.descriptors``); the coordinators' appends always roll.

        segment.ms is Kafka's ``timeWaitedForRoll``: from the segment's first batch's timestamp to
        the incoming batches' (``max_timestamp``) when the first has one, else from the segment's
        creation by the clock. (Counting from its creation alone, a segment never rolled on a
        broker restarted more often than segment.ms: each start made it anew.)"""
        seg = self.active
        if seg.size == 0:
            return
        cfg = self.config
        first = seg.first_batch_timestamp()
        waited = max_timestamp - first if first >= 0 else now_ms - seg.created_ms
        if seg.size + incoming > cfg.segment_bytes or \
                waited >= cfg.max_segment_ms - self._roll_jitter_ms or \
                len(seg.offset_index.positions) >= cfg.segment_index_bytes // 8 or \
                len(seg.time_index.timestamps) >= cfg.segment_index_bytes // 12:
            client = origin is AppendOrigin.CLIENT
            if client and (refused := descriptors.roll_refused()) is not None:
                raise SegmentRollRefusedError(f"{self.name}: {refused}")
            self.roll(now_ms, refusable=client)

    def _jitter_for(self, base_offset: int) -> int:
        """segment.jitter.ms: a per-segment random part taken off segment.ms (Kafka's
        randomSegmentJitter), seeded by the segment so it is the same after a restart."""
        cfg = self.config
        if cfg.segment_jitter_ms <= 0:
            return 0
        return random.Random(f"{self.name}:{base_offset}").randrange(min(cfg.segment_jitter_ms, cfg.segment_ms))

    # --- live configuration ----------------------------------------------------------------------
    def set_config(self, config: LogConfig) -> None:
        """Run with ``config`` from now on (AlterConfigs, a dynamic broker config): the next
        append, roll, retention pass and flush read it. Segments keep their files as they are."""
        self.config = config
        self.active.index_interval_bytes = config.index_interval_bytes
        self._roll_jitter_ms = self._jitter_for(self.active.base_offset)

    def roll(self, now_ms: int | None = None, *, refusable: bool = False) -> None:
        """Start a new active segment at the log end offset, without touching the disk beyond
        creating its file: no fsync on the event loop (Kafka's roll schedules the old segment's
        flush too). The old segment stays dirty, so the next flush (background, ``sync``,
        ``plan_sync``) fsyncs its data and writes its index entries; and the new file's name is
        made durable (a directory fsync) by whichever of them comes first, before it counts any
        data in the new segment as durable: the recovery point never passes a segment whose name
        a power cut could take back, and an acknowledgement that waits for ``synced_end`` never
        covers one either.

        A new file that cannot be opened takes the log directory offline, except, when ``refusable``
        (a client's append), for want of a descriptor (EMFILE, ENFILE): that roll is refused
        (SegmentRollRefusedError) and nothing changed, since the ``open`` made no file. The budget
        (``descriptors.roll_refused``) refuses before that; this covers what it cannot see coming."""
        now = self.clock.now_ms() if now_ms is None else now_ms
        try:
            seg = LogSegment(self.directory, self.log_end_offset, now, self.config.index_interval_bytes)
        except OSError as exc:
            if refusable and exc.errno in descriptors.EXHAUSTED_ERRNOS:
                raise SegmentRollRefusedError(f"{self.name}: segment roll refused: {exc} (ulimit -n); raise the "
                                              "limit, close idle connections, or let retention remove segments") \
                    from exc
            raise self.dir_state.fail(self.name, exc) from exc
        self.segments.append(seg)
        self.segments[-2].time_index_durable_due = True
        self._rolls += 1
        self._roll_jitter_ms = self._jitter_for(self.log_end_offset)

    @property
    def names_durable(self) -> bool:
        """Every segment file a roll created has a durable name."""
        return self._rolls_named >= self._rolls

    # --- reads -----------------------------------------------------------------------------------
    def _segment_for(self, offset: int) -> int:
        """Index of the segment holding ``offset`` (the first one below the log start): a
        binary search over base offsets cached between changes of the segment list, not a list
        rebuilt on every read (O(log segments) per lookup)."""
        segs = self.segments
        key = (self._segments_replaced, len(segs), id(segs[0]) if segs else 0, id(segs[-1]) if segs else 0)
        if key != self._bases_key:
            self._bases = [seg.base_offset for seg in segs]
            self._bases_key = key
        i = bisect.bisect_right(self._bases, offset) - 1
        return max(i, 0)

    def position_of(self, offset: int, nowait: bool = False) -> tuple[int, int] | None:
        """(base offset of a segment, byte position in it) where a read from ``offset`` starts:
        the batch holding ``offset`` (or the first after it), or where the next append goes when
        none does (Kafka's ``LogOffsetMetadata``). Two such positions in one segment tell how many
        bytes lie between two offsets without reading them (Kafka's ``positionDiff``; a waiting
        fetch counts so); in two segments they cannot. None outside [log start, log end]. Costs
        the segment lookup, an index lookup and at most an index interval of batch headers (none
        at the log end); ``nowait`` as :meth:`read_view`."""
        if offset < self.log_start_offset or offset > self.log_end_offset:
            return None
        segs = self.segments
        if offset < self.log_end_offset:
            for i in range(self._segment_for(offset), len(segs)):
                found = segs[i].find_position(offset, nowait)
                if found is not None:
                    return segs[i].base_offset, found[0]
        active = segs[-1]
        return active.base_offset, active.size

    def read(self, fetch_offset: int, max_bytes: int, *, max_offset: int | None = None,
             min_one_message: bool = True) -> FetchData:
        """Whole batches from the one containing ``fetch_offset``; see the module docstring."""
        records, first, _next = self.read_view(fetch_offset, max_bytes, max_offset=max_offset,
                                               min_one_message=min_one_message)
        return FetchData(records if isinstance(records, bytes) else bytes(records), first)

    def read_view(self, fetch_offset: int, max_bytes: int, *, max_offset: int | None = None,
                  min_one_message: bool = True, nowait: bool = False,
                  ) -> tuple[bytes | bytearray | memoryview, int, int]:
        """As :meth:`read`, but the records may be a memoryview of the one buffer read from the
        segment (no copy when the read is trimmed to whole batches): the fetch path sends it as is.
        Returns (records, base offset of the first batch, offset after the last batch returned:
        ``fetch_offset`` when none is); the last is where a read_committed fetch's list of aborted
        transactions ends (Kafka's ``fetchUpperBoundOffset``). ``nowait``: raise ``ReadWouldBlock``
        instead of reading pages that are not in memory (the fetch path reads them off the event
        loop, then asks again); nothing is changed either way."""
        if fetch_offset < self.log_start_offset or fetch_offset > self.log_end_offset:
            raise OffsetOutOfRangeError(
                f"offset {fetch_offset} outside [{self.log_start_offset}, {self.log_end_offset}] of {self.name}")
        limit = self.log_end_offset if max_offset is None else min(max_offset, self.log_end_offset)
        if fetch_offset >= limit:
            return b"", fetch_offset, fetch_offset
        i = self._segment_for(fetch_offset)
        while i < len(self.segments):
            seg = self.segments[i]
            found = seg.find_position(fetch_offset, nowait)
            if found is None:
                i += 1
                continue
            start, first = found
            if first.base_offset >= limit:
                return b"", fetch_offset, fetch_offset
            if first.size > max_bytes:
                if not min_one_message:
                    return b"", fetch_offset, fetch_offset
                return seg.pread(start, first.size, nowait), first.base_offset, first.last_offset + 1
            data = seg.pread(start, min(max_bytes, seg.size - start), nowait)
            end = 0
            next_offset = fetch_offset
            for pos, header in rb.iter_headers(data):
                if header.base_offset >= limit:
                    break
                end = pos + header.size
                next_offset = header.last_offset + 1
            return (memoryview(data)[:end] if end != len(data) else data), first.base_offset, next_offset
        return b"", fetch_offset, fetch_offset

    def aborted_transactions(self, fetch_offset: int, upper_bound_offset: int) -> list[tuple[int, int]]:
        """(producer_id, first_offset) of aborted transactions overlapping [fetch_offset, upper_bound).

        Walks the segments from the one holding ``fetch_offset`` and stops at the first whose index
        shows that no later marker can abort a transaction begun below ``upper_bound_offset``
        (:meth:`TransactionIndex.covers`, Kafka's ``TxnIndexSearchResult.isComplete``): a fetch
        near the start of a long log visits the segments its range reaches, not all of them."""
        out: list[tuple[int, int]] = []
        for seg in self.segments[self._segment_for(fetch_offset):]:
            index = seg.txn_index
            for e in index.overlapping(fetch_offset, upper_bound_offset):
                out.append((e.producer_id, e.first_offset))
            if index.covers(upper_bound_offset):
                break
        return out

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp_ms`` at or after the
        log start offset, or None (Kafka's ``FileRecords.searchForTimestamp``).

        The time index narrows the search to a batch; from there each candidate batch is searched
        record by record, compressed ones too (their records carry their own CreateTime, so the
        batch's base offset would send a consumer back to records older than it asked for).
        """
        for seg in self.segments:
            if seg.max_timestamp < timestamp_ms or seg.size == 0:
                continue
            start_offset = max(seg.time_index.lookup(timestamp_ms), self.log_start_offset)
            found = seg.find_position(start_offset)
            if found is None:
                continue
            for _pos, header, view in seg.iter_batches(found[0]):
                if header.max_timestamp < timestamp_ms or header.is_control:
                    continue
                for offset, ts in self._record_timestamps(view, header):
                    if ts >= timestamp_ms and offset >= self.log_start_offset:
                        return offset, ts
        return None

    def offset_for_max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the first data record with the largest timestamp (ListOffsets -3).

        Segments are visited in descending order of their max timestamp and the scan stops once no
        remaining segment can hold a larger one. Control batches (markers) are skipped: a client
        asking for the newest record wants data, not the coordinator's timestamp. The offset is the
        record's own, inside a compressed batch too (Kafka's ``RecordBatch.offsetOfMaxTimestamp``).
        """
        best: tuple[int, int] | None = None  # (timestamp, position-ordered key) of the best batch
        best_batch: tuple[LogSegment, int, rb.BatchHeader] | None = None
        for seg in sorted((s for s in self.segments if s.size), key=lambda s: -s.max_timestamp):
            if best is not None and seg.max_timestamp < best[0]:
                break
            for pos, header, _view in seg.iter_batches(0):
                if header.is_control or header.last_offset < self.log_start_offset:
                    continue
                if best is None or header.max_timestamp > best[0] or \
                        (header.max_timestamp == best[0] and header.base_offset < best[1]):
                    best = (header.max_timestamp, header.base_offset)
                    best_batch = (seg, pos, header)
        if best_batch is None:
            return None
        seg, pos, header = best_batch
        ts = header.max_timestamp
        for offset, record_ts in self._record_timestamps(seg.pread(pos, header.size), header):
            if record_ts == ts and offset >= self.log_start_offset:
                return offset, ts
        return max(header.base_offset, self.log_start_offset), ts

    @staticmethod
    def _record_timestamps(view: bytes | memoryview, header: rb.BatchHeader) -> Iterator[tuple[int, int]]:
        """(offset, timestamp) of each record of a stored batch, decompressed if need be. Under
        LogAppendTime every record has the batch's max timestamp (the broker stamped it), so the
        records need not be read."""
        if header.attributes & rb.ATTR_TIMESTAMP_TYPE:
            return iter((header.base_offset + i, header.max_timestamp) for i in range(header.last_offset_delta + 1))
        return compression.record_timestamps(view, header)

    # --- producers (DescribeProducers, find-hanging) ---------------------------------------------
    def producers(self) -> list[ProducerStateEntry]:
        return list(self.producer_state.producers.values())

    def ongoing_transactions(self) -> list[tuple[int, int, int, int]]:
        return [(pid, e.producer_epoch, first, e.last_timestamp)
                for pid, first in self.producer_state.ongoing.items()
                for e in [self.producer_state.producers[pid]]]

    def remove_expired_producers(self, now_ms: int, producer_id_expiration_ms: int) -> int:
        return self.producer_state.remove_expired_producers(now_ms, producer_id_expiration_ms)

    # --- durability ------------------------------------------------------------------------------
    def needs_flush(self, monotonic_ms: int) -> bool:
        """Whether the background flush is due: flush.ms passed since the last one was planned, by
        the monotonic clock (``monotonic_ms``: ``Clock.monotonic_ms``), none in flight, and something
        to flush. (Measured on the wall clock until 2026-11-28, a step back of an hour stopped every
        periodic flush, snapshot and checkpoint for that hour: probe s37, ``clock_flush.py``.)"""
        due = monotonic_ms - self.last_flush_monotonic_ms >= self.config.flush_interval_ms
        return due and self._flush_job is None and (self.recovery_point < self.log_end_offset or self.epochs.dirty)

    def sync(self) -> None:
        """fsync the data of every segment written since the last flush, without moving the
        recovery point (the indexes above it are rebuilt by recovery, so they need no fsync here).

        Acknowledging an append with ``flush_every_append`` and each step of the transaction
        protocol call this; the recovery point and producer state snapshot follow at the next
        background flush, and recovery rescans from the old one. Safe while a flush job runs: it
        only fsyncs (another descriptor of) the same files.
        """
        self._check_online()
        for seg in self._unsynced_segments():
            self._guarded(seg.sync_data)
        if not self.names_durable:
            rolls = self._rolls
            self._guarded(lambda: fileio.fs.fsync_dir(self.directory))
            self._rolls_named = max(self._rolls_named, rolls)
        self._synced_end = self.log_end_offset

    @property
    def must_sync(self) -> bool:
        """Appends must be fsynced before they are acknowledged (flush_every_append, flush.messages)."""
        return self.config.flush_every_append or \
            self.log_end_offset - max(self.recovery_point, self._synced_end) >= self.config.flush_messages

    @property
    def synced_end(self) -> int:
        """Every offset below this is on disk (fsynced)."""
        return max(self.recovery_point, self._synced_end)

    def plan_sync(self) -> tuple[int, list[int | Path]]:
        """For an fsync off the loop thread: (the log end now, descriptors to fsync, which the
        caller closes, and this log's directory, to fsync last, when a roll created a name not yet
        durable); then :meth:`mark_synced` with that end once the fsyncs returned. A duplicate that
        cannot be made (EMFILE) raises that OSError, with none of them left open."""
        self._check_online()
        self._sync_names = None
        if self.removed:  # deleted (or closed) after the append a waiter waits for: nothing to make durable
            return self.log_end_offset, []
        fds: list[int | Path] = list(dup_descriptors(self._unsynced_segments()))  # none leaks if one fails
        if not self.names_durable:  # the directory too: a name a roll created (see ``roll``)
            self._sync_names = self._rolls
            fds.append(self.directory)
        return self.log_end_offset, fds

    def _unsynced_segments(self) -> list[LogSegment]:
        """Segments that may hold bytes not known durable: the active one, any written since the
        last flush was planned, and any with data above ``synced_end`` -- a rolled segment whose
        fsync a flush job in flight has planned (its ``dirty`` already cleared) but not yet made."""
        synced = self.synced_end
        return [seg for seg in self.segments if seg is self.active or seg.dirty or seg.next_offset > synced]

    def mark_synced(self, end: int) -> None:
        if self._sync_names is not None:
            self._rolls_named = max(self._rolls_named, self._sync_names)
            self._sync_names = None
        self._synced_end = max(self._synced_end, end)

    def sync_failed(self, error: OSError) -> None:
        """An fsync planned by :meth:`plan_sync` failed: the log directory goes offline (raises)."""
        self._guarded(lambda: _raise(error))

    def begin_flush(self, *, force: bool = False, aborted_counts: dict[int, int] | None = None,
                    light: bool = True, snapshot_deferred: bool = False) -> FlushJob | None:
        """Plan the background flush (see ``flush_job``); None if nothing is to flush or one is
        already in flight. The caller runs ``job.run()`` (off the loop) then :meth:`finish_flush`.
        ``force`` writes the snapshot even if nothing was appended; ``aborted_counts`` replaces the
        per-segment aborted-index counts (the cleaner's swap passes ones valid before and after it);
        ``light`` (the periodic background flush) fsyncs only what recovery needs (``flush_job``)
        and writes the producer-state snapshot only when :meth:`_snapshot_due` and not
        ``snapshot_deferred`` (the pass's snapshots are large enough already): its recovery
        point then reaches the disk through the directory's checkpoint (``recovery_checkpoint``),
        which the caller writes after ``job.run()`` when ``job.snapshot`` is None.

        All or nothing: a duplicate descriptor that cannot be made (EMFILE) raises that OSError with
        nothing planned (no job in flight, every segment as dirty as before, no duplicate open), so
        the next flush plans it all again."""
        self._check_online()
        end = self.log_end_offset
        now = self.last_flush_monotonic_ms = self.clock.monotonic_ms()
        if self._flush_job is not None or (end == self.recovery_point and not self.epochs.dirty and not force
                                           and self.names_durable):
            return None
        # All or nothing: the duplicates first (EMFILE raises here, before anything is marked
        # flushed or any index entry taken); what follows cannot fail.
        planned = [seg for seg in self.segments if seg.needs_flush or seg is self.active]
        dups = iter(dup_descriptors([seg for seg in planned if seg.dirty]))
        job = FlushJob(self.directory, end, light=light)
        for seg in planned:
            seg.plan_flush(job, next(dups) if seg.dirty else None)
        if not self.names_durable:  # a roll's new file: its name before the snapshot (see ``roll``)
            job.new_names = True
            job.rolls = self._rolls
        if self.epochs.dirty:
            job.epochs = self.epochs.take_file()
        if force or (end != self.recovery_point and
                     (not light or (not snapshot_deferred and self._snapshot_due(end, now)))):
            aborted = aborted_counts if aborted_counts is not None else \
                {seg.base_offset: len(seg.txn_index.entries) for seg in self.segments if seg.txn_index.entries}
            job.snapshot = (self.directory / SNAPSHOT_FILE, self.producer_state.snapshot_bytes(end, aborted))
            job.snapshot_mark = (self.active.base_offset, self.active.size, end, now)
        self._flush_job = job
        return job

    def finish_flush(self, job: FlushJob) -> None:
        """On the loop thread, after ``job.run()`` returned or raised (``job.error``): the recovery
        point moves to the job's end only now. A second call for the same job does nothing."""
        if job is not self._flush_job:
            return
        self._flush_job = None
        if job.error is not None:
            error = job.error
            self._guarded(lambda: _raise(error))
        if job.rolls is not None:
            self._rolls_named = max(self._rolls_named, job.rolls)
        if self.recovery_point < job.end <= self.log_end_offset:
            self.recovery_point = job.end
        if job.snapshot is not None:
            self._snapshot_name_durable = not job.light
            self.snapshot_offset = job.end
            self._snapshot_mark = job.snapshot_mark

    def _snapshot_due(self, end: int, monotonic_ms: int) -> bool:
        """Whether a periodic flush to ``end`` writes a producer-state snapshot (else only the
        directory's checkpoint records its recovery point). Recovery replays producer state from the
        last snapshot up to the recovery point, so this bounds that replay: a snapshot after every
        roll (as Kafka takes one), and at least every SNAPSHOT_INTERVAL_BYTES of the active segment,
        SNAPSHOT_INTERVAL_OFFSETS offsets or SNAPSHOT_INTERVAL_MS (of monotonic time)."""
        mark = self._snapshot_mark
        if mark is None:
            return True
        base, size, offset, ms = mark
        active = self.active
        return active.base_offset != base or active.size - size >= SNAPSHOT_INTERVAL_BYTES or \
            end - offset >= SNAPSHOT_INTERVAL_OFFSETS or monotonic_ms - ms >= SNAPSHOT_INTERVAL_MS

    def _snapshot_covers(self, offset: int) -> None:
        """Make sure the producer-state snapshot on disk is at ``offset`` or above (a full flush
        writes one if not) and its name durable, before the segments below ``offset`` are deleted:
        recovery replays producer state from the snapshot, so it must never need a deleted segment."""
        if self.snapshot_offset is None or self.snapshot_offset < offset:
            self.flush(force=True)
        self._recovery_point_durable()

    def _recovery_point_durable(self) -> None:
        """Make the last snapshot's name durable (a light flush leaves it to writeback) before the
        data it makes unnecessary to rescan is deleted (retention, DeleteRecords)."""
        if not self._snapshot_name_durable:
            self._guarded(lambda: fileio.fs.fsync_dir(self.directory))
            self._snapshot_name_durable = True

    def wait_for_flush(self, timeout_s: float = 60.0) -> None:
        """Block until the flush job in flight (if any) has run, and finish it: before files it may
        touch change (segments deleted, the partition deleted or closed)."""
        job = self._flush_job
        if job is None:
            return
        try:
            job.run()  # if the flush thread has not started it yet, do it here rather than wait
        except OSError:
            pass  # recorded in job.error; finish_flush raises it
        if not job.done.wait(timeout_s):
            raise fileio.StorageOfflineError(f"{self.name}: a background flush did not finish in {timeout_s} s")
        self.finish_flush(job)

    def flush(self, *, force: bool = False, aborted_counts: dict[int, int] | None = None) -> None:
        """Flush now, on the calling thread (close, retention, the cleaner's swap, tests): the
        background flush's job, run inline; see :meth:`begin_flush` for the arguments."""
        self.wait_for_flush()
        job = self.begin_flush(force=force, aborted_counts=aborted_counts, light=False)
        if job is None:
            return
        try:
            job.run()
        finally:
            self.finish_flush(job)

    def _check_online(self) -> None:
        if self.dir_state.offline_reason is not None:
            raise fileio.StorageOfflineError(f"log directory offline: {self.dir_state.offline_reason}")

    def _guarded(self, step: Callable[[], None]) -> None:
        """Run a disk write step; on failure take the whole log directory offline (never retried)."""
        try:
            step()
        except OSError as exc:
            raise self.dir_state.fail(self.name, exc) from exc

    # --- retention -------------------------------------------------------------------------------
    def apply_retention(self, now_ms: int) -> int:
        """Delete whole old segments by time and size; returns how many.

        Only with ``cleanup.policy`` delete (or compact,delete), as Kafka: a compacted-only log keeps
        its segments and only the cleaner shrinks them. The active segment goes too once it is due
        and wholly readable (Kafka's deletableSegments, with the high watermark at the log end): the
        log rolls first, so a quiet topic does not keep its last records past retention for ever."""
        deleted = 0
        cfg = self.config
        if not cfg.delete:
            return 0
        while self.segments:
            oldest = self.segments[0]
            if oldest is self.active and (oldest.size == 0 or self.readable_end < self.log_end_offset):
                break
            largest = oldest.max_timestamp
            if largest < 0:
                # No record of it has a timestamp (emptied by the cleaner, records sent with -1, a
                # time index lost to a power cut): Kafka's largestTimestamp falls back to the mtime.
                # Waiting for a timestamp instead held back retention of the whole partition for good.
                largest = oldest.last_modified_ms()
            too_old = cfg.retention_ms >= 0 and largest >= 0 and now_ms - largest > cfg.retention_ms
            too_big = cfg.retention_bytes >= 0 and self.size_in_bytes - oldest.size >= cfg.retention_bytes
            if not (too_old or too_big):
                break
            if oldest is self.active:
                self.roll(now_ms)
            self.wait_for_flush()  # a flush in flight may still write the oldest segment's indexes
            self._snapshot_covers(oldest.next_offset)
            self.segments.pop(0)
            oldest.delete()
            deleted += 1
        if deleted:
            self._after_delete()
            self._set_log_start(self.segments[0].base_offset)
            log.info("%s: retention deleted %d segment(s); log start offset now %d", self.name, deleted,
                     self.log_start_offset)
        return deleted

    def delete_records(self, before_offset: int) -> int:
        """DeleteRecords (Kafka's maybeIncrementLogStartOffset): move the log start to
        ``before_offset`` (durably), delete the segments wholly below it; returns the log start.

        Bounded by the high watermark only: the log start may pass an open transaction's first
        offset; the transaction stays open (the LSO is never below the log start) and the producer
        state is kept, as in Kafka since KIP-360. A snapshot is written first if the last one is below
        a segment to delete, as retention does, so recovery never needs a deleted segment."""
        if before_offset > self.high_watermark or before_offset < 0:
            raise OffsetOutOfRangeError(f"Cannot increment the log start offset to {before_offset} of partition "
                                        f"{self.name} since it is larger than the high watermark "
                                        f"{self.high_watermark}" if before_offset >= 0 else
                                        f"The offset {before_offset} for partition {self.name} is not valid")
        if before_offset > self.log_start_offset:
            self._set_log_start(before_offset)
            doomed = 0
            while doomed + 1 < len(self.segments) and self.segments[doomed + 1].base_offset <= before_offset:
                doomed += 1
            if doomed:
                self.wait_for_flush()
                self._snapshot_covers(self.segments[doomed - 1].next_offset)
            for _ in range(doomed):
                self.segments.pop(0).delete()
            if doomed:
                self._after_delete()
        return self.log_start_offset

    def _after_delete(self) -> None:
        """Segments were deleted: make that durable."""
        self._guarded(lambda: fileio.fs.fsync_dir(self.directory))

    def _set_log_start(self, offset: int) -> None:
        self.log_start_offset = max(self.log_start_offset, offset)
        self.epochs.truncate_from_start(self.log_start_offset)
        self._guarded(lambda: _write_int_file(self.directory / LOG_START_FILE, self.log_start_offset))

    # --- log compaction: the swap (the cleaner itself runs off the loop, see log_cleaner) ---------
    def replace_segments(self, old: list[LogSegment], new: list[tuple[int, int, int]],
                         groups: list[segment_swap.SwapGroup]) -> bool:
        """Swap cleaned segments in place of ``old`` (the first ``len(old)`` segments, unchanged since
        the cleaning started); ``new`` lists (base, next offset, aborted-index entries) of the cleaned
        segments, whose ``.cleaned`` files are written and fsynced. False (nothing done) if ``old``
        is not the log's prefix any more (retention or DeleteRecords deleted some meanwhile).

        Runs on the event loop thread without awaiting, so no read sees a mix. Crash safety is
        ``segment_swap``'s; before its commit point the producer-state snapshot is rewritten with
        aborted-index counts no larger than either layout holds (the check on load stays valid
        whichever survives a crash).
        """
        self._check_online()
        n = len(old)
        if n == 0 or n >= len(self.segments) or any(a is not b for a, b in zip(self.segments, old, strict=False)):
            return False
        counts = {seg.base_offset: len(seg.txn_index.entries) for seg in self.segments[n:] if seg.txn_index.entries}
        before = {seg.base_offset: len(seg.txn_index.entries) for seg in old}
        for base, _next, entries in new:
            if min(before.get(base, 0), entries):
                counts[base] = min(before.get(base, 0), entries)
        self.flush(force=True, aborted_counts=counts)
        self._guarded(lambda: segment_swap.commit(self.directory, groups))
        self._guarded(lambda: segment_swap.apply(self.directory, groups))
        now = self.clock.now_ms()
        fresh: list[LogSegment] = []
        for seg in old:
            seg.abandon()  # clean and flushed; its files are gone or replaced
        for base, next_offset, _entries in new:
            seg = LogSegment(self.directory, base, now, self.config.index_interval_bytes)
            seg.load_indexes()
            seg.next_offset = next_offset
            fresh.append(seg)
        self.segments[:n] = fresh
        self._segments_replaced += 1
        return True

    # --- lifecycle -------------------------------------------------------------------------------
    def close(self) -> None:
        """Flush and close. A clean stop leaves a snapshot at the log end (as Kafka writes one at
        shutdown), so the next start replays nothing."""
        if self.dir_state.offline_reason is None:
            self.flush(force=self.snapshot_offset != self.log_end_offset)
        self.removed = True
        self._detach_producers()
        for seg in self.segments:
            if self.dir_state.offline_reason is None:
                seg.close()
            else:
                seg.abandon()  # nothing more may be written to a failed directory

    def _detach_producers(self) -> None:
        if self.producer_state.bound is not None:
            self.producer_state.bound.detach(self.producer_state)

    def delete(self) -> None:
        running = self.close_for_deletion()
        if running is not None:
            running.done.wait(60)
        fileio.fs.rmtree(self.directory)
        fileio.fs.fsync_dir(self.directory.parent)

    def close_for_deletion(self) -> FlushJob | None:
        """Close the log for good, its files left to remove (``delete``, or ``LogManager`` off the
        event loop). A flush not started never runs (``FlushJob.cancel``): nothing is fsynced for a
        log about to go. Returns the flush job still running on the flush thread, if any: the files
        may be removed only once it is done. (Waiting here, partition after partition, chased the
        flush thread through a pass: 1.9 s of a 1,000-partition deletion on the event loop.)"""
        job, self._flush_job = self._flush_job, None
        running = job if job is not None and not job.cancel() else None
        self.removed = True
        self._detach_producers()
        for seg in self.segments:
            seg.abandon()  # a running flush fsyncs descriptors of its own (``begin_flush`` dups them)
        return running

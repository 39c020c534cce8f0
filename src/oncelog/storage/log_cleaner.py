"""Log compaction (``cleanup.policy=compact``), as Kafka's log cleaner does it.

Who runs what:
- :class:`LogCleanerManager` runs on the broker's event loop thread (like everything that touches a
  partition log): it picks the filthiest compacted log, snapshots what the cleaning needs into an
  immutable :class:`CleanJob`, and later swaps the result in (``PartitionLog.replace_segments``,
  no await in between, so no request sees half a swap) and records the cleaner checkpoint.
- :func:`clean` runs one step of a cleaning on a cleaner thread (``server.broker`` owns the pool;
  the next step is the next job :meth:`LogCleanerManager.grab_filthiest` hands out). It reads only
  segments that are immutable and already flushed (below the recovery point, not the active one)
  through its own file descriptors, and writes only new ``<base>.*.cleaned`` files (each fsynced)
  through ``fileio.fs``. It never touches a ``PartitionLog``.
- Aborting (topic deleted, broker stopping) takes the job's lock and marks it cancelled: the thread
  creates files only while holding that lock after checking the flag, so after an abort it creates
  none (it stops at its next check; writes to already-open files land in unlinked inodes).

A cleaning (Kafka's ``Cleaner.doClean``):
1. *Dirty range*: from the cleaner checkpoint (or the log start) to the first uncleanable offset:
   the smallest of the last stable offset (records of open transactions are never cleaned), the
   active segment's base, the recovery point, and the first dirty segment holding a record newer
   than ``min.compaction.lag.ms``; rounded down to a segment boundary.
2. *Offset map*: key -> offset of its newest record in the dirty range, skipping control batches and
   batches of aborted transactions (known from the aborted-transaction indexes). Bounded by
   ``log.cleaner.dedupe.buffer.size`` (24 bytes a key, as Kafka counts); when full, the map ends at
   the last whole batch and the rest waits for the next cleaning.
3. *Rewrite* every segment from the log's first up to the end of the map, in groups whose total
   size fits ``segment.bytes`` (Kafka's ``groupSegmentsBySize``). A record survives if it lies past
   the map, or is the newest for its key and is not an expired tombstone. Batches keep their base
   offset and ``last_offset_delta`` (so offsets never change and gaps appear). The rewrite goes in
   *steps*: one writes the groups whose copies fit the free space above ``log_dir_min_free_bytes``
   (at least one), they are swapped in, and the next step goes on with the same offset map and
   transaction state (:class:`CleaningProgress`), so a cleaning needs room for about one group, as
   Kafka's, which replaces each group's segments as it goes.
4. *Transactions* (Kafka's ``CleanedTransactionMetadata``): every record of an aborted transaction
   is removed; a COMMIT/ABORT marker is kept while any batch of its transaction is kept, then gets a
   delete horizon and is removed once that passed; an ABORT marker that is kept keeps its entry in
   the aborted-transaction index. The *last batch of each live producer* is kept, emptied if none
   of its records survive (its sequence range and epoch rebuild the producer state: idempotence and
   fencing hold after recovery from the log), and so is a producer's last marker when the producer
   has no data batch at its epoch.
5. *Tombstones* (records with a null value) and markers of vanished transactions get a delete
   horizon (``now + delete.retention.ms``, stored in the batch as KIP-534 does) the first time a
   cleaning keeps them, and are removed by the first cleaning after it.
"""

from __future__ import annotations

import bisect
import logging
import os
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from oncelog.protocol import records as rb
from oncelog.storage import fileio, record_codec, segment_swap
from oncelog.storage.errors import DiskFullError
from oncelog.storage.refusals import storage_refused
from oncelog.storage.transaction_index import AbortedTxn

if TYPE_CHECKING:
    from oncelog.storage.log_segment import LogSegment
    from oncelog.storage.partition_log import PartitionLog

log = logging.getLogger("oncelog.storage.cleaner")

CHECKPOINT_FILE = "cleaner-offset-checkpoint"
BYTES_PER_MAP_ENTRY = 24  # Kafka's OffsetMap: a 16-byte MD5 of the key and an 8-byte offset
_LONG_MAX = 2**63 - 1
_INT32_MAX = 2**31 - 1
_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_TXN_ENTRY = struct.Struct(">qqqq")


@dataclass(frozen=True)
class CleanerConfig:
    """The broker's ``log.cleaner.*`` configs."""

    enable: bool = True
    threads: int = 1
    backoff_ms: int = 15_000
    dedupe_buffer_size: int = 128 * 1024 * 1024
    io_buffer_load_factor: float = 0.9
    io_max_bytes_per_second: float = float("inf")

    @property
    def max_map_entries(self) -> int:
        per_thread = self.dedupe_buffer_size // max(self.threads, 1)
        return max(int(per_thread // BYTES_PER_MAP_ENTRY * self.io_buffer_load_factor), 1)


class CleaningAbortedError(Exception):
    """The job was cancelled (its topic was deleted, or the broker is stopping)."""


@dataclass(frozen=True, slots=True)
class SourceSegment:
    base_offset: int
    path: Path
    size: int
    next_offset: int
    index_bytes: int
    time_index_bytes: int
    txn_index_bytes: int = 0

    @property
    def copy_bytes(self) -> int:
        """The most a cleaned copy of this segment takes on disk (data and the three indexes)."""
        return self.size + self.index_bytes + self.time_index_bytes + self.txn_index_bytes


@dataclass(frozen=True, slots=True)
class LastRecord:
    """Kafka's LastRecord: the producer's last data offset (None if it has no data batch at its
    epoch) and its epoch."""

    last_data_offset: int | None
    producer_epoch: int


@dataclass
class CleanJob:
    """Everything a cleaning reads, captured on the loop thread; the thread sees only plain data.

    ``plog``, ``old_segments`` and ``swapped_before`` are for the loop thread (the swap); the
    thread must not use them. ``old_segments[i]`` is the segment ``segments[i]`` describes.

    A cleaning may take several *steps* (jobs), each swapping in the groups it rewrote before the
    next one starts, so that it needs free space for about one group, not for a copy of the whole
    log (Kafka's ``Cleaner.doClean`` replaces each group's segments as it goes). A step writes at
    most ``max_write_bytes`` (the free space above ``log_dir_min_free_bytes`` when it was handed
    out) and at least one group. The next step's job carries ``progress`` (the offset map, the
    groups left, the transaction state of the filter), the segments left, and ``swapped_before``:
    the segments the earlier steps swapped in, the log's prefix up to this step's segments.
    """

    plog: PartitionLog
    old_segments: list[LogSegment]
    directory: Path
    name: str
    segments: tuple[SourceSegment, ...]
    first_dirty_offset: int
    aborted: tuple[AbortedTxn, ...]
    last_records: dict[int, LastRecord]
    now_ms: int
    delete_retention_ms: int
    segment_bytes: int
    segment_index_bytes: int
    index_interval_bytes: int
    max_map_entries: int
    max_bytes_per_second: float = float("inf")
    max_write_bytes: float = float("inf")
    swapped_before: list[LogSegment] = field(default_factory=list)
    progress: CleaningProgress | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    cancelled: bool = False
    created: list[Path] = field(default_factory=list)

    @property
    def first_uncleanable_offset(self) -> int:
        return self.segments[-1].next_offset

    def check(self) -> None:
        if self.cancelled:
            raise CleaningAbortedError(self.name)

    def cancel(self) -> None:
        """Loop thread: stop the job; its thread creates no file after this returns."""
        with self.lock:
            self.cancelled = True
            for p in self.created:
                fileio.fs.unlink(p)


@dataclass
class CleanedSegment:
    base_offset: int
    next_offset: int
    old_bases: list[int]
    size: int = 0
    aborted_entries: int = 0


@dataclass
class CleanResult:
    segments: list[CleanedSegment]
    replaced: int  # how many of the job's segments the cleaned ones replace (a prefix)
    end_offset: int  # the end of what this step rewrote (the whole cleaning's: the new checkpoint)
    bytes_read: int = 0
    bytes_written: int = 0
    records_removed: int = 0
    elapsed_s: float = 0.0
    remaining: CleaningProgress | None = None  # the cleaning's next step (None: this was its last)

    @property
    def groups(self) -> list[segment_swap.SwapGroup]:
        return [segment_swap.SwapGroup(s.base_offset, tuple(s.old_bases)) for s in self.segments]


# --- the cleaning (a cleaner thread) ------------------------------------------------------------------
class _Throttler:
    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()
        self.bytes = 0

    def account(self, n: int) -> None:
        if self.rate == float("inf") or self.rate <= 0:
            return
        self.bytes += n
        ahead = self.bytes / self.rate - (time.monotonic() - self.start)
        if ahead > 0.01:
            time.sleep(ahead)


def _read_batches(job: CleanJob, seg: SourceSegment, throttle: _Throttler,
                  chunk: int = 1 << 20) -> Iterator[tuple[rb.BatchHeader, memoryview]]:
    fd = os.open(seg.path, os.O_RDONLY)
    try:
        position = 0
        while position < seg.size:
            job.check()
            data = os.pread(fd, min(chunk, seg.size - position), position)
            throttle.account(len(data))
            consumed = 0
            view = memoryview(data)
            for pos, header in rb.iter_headers(data):
                yield header, view[pos:pos + header.size]
                consumed = pos + header.size
            if consumed == 0:
                header = rb.read_header(data)
                if header.batch_length < rb.HEADER_SIZE - rb.LOG_OVERHEAD or position + header.size > seg.size:
                    raise rb.InvalidRecordError(f"{seg.path.name}: unreadable batch at byte {position}")
                big = os.pread(fd, header.size, position)
                throttle.account(len(big))
                yield header, memoryview(big)
                consumed = header.size
            position += consumed
    finally:
        os.close(fd)


class _AbortedIndex:
    """Which transactional batches belong to aborted transactions: (first offset, marker offset)
    intervals per producer, from the aborted-transaction indexes."""

    def __init__(self, aborted: Iterable[AbortedTxn]) -> None:
        by_pid: dict[int, list[tuple[int, int]]] = {}
        for a in aborted:
            by_pid.setdefault(a.producer_id, []).append((a.first_offset, a.last_offset))
        self._firsts = {pid: [f for f, _ in sorted(v)] for pid, v in by_pid.items()}
        self._lasts = {pid: [last for _, last in sorted(v)] for pid, v in by_pid.items()}

    def is_aborted(self, header: rb.BatchHeader) -> bool:
        if not header.is_transactional or header.is_control:
            return False
        firsts = self._firsts.get(header.producer_id)
        if not firsts:
            return False
        i = bisect.bisect_right(firsts, header.base_offset) - 1
        return i >= 0 and header.base_offset <= self._lasts[header.producer_id][i]


def _build_offset_map(job: CleanJob, aborted: _AbortedIndex, throttle: _Throttler) -> tuple[dict[bytes, int], int]:
    """(key -> newest offset, end of the mapped range) over the dirty range of ``job``."""
    first_dirty = job.first_dirty_offset
    offsets: dict[bytes, int] = {}
    end = first_dirty
    for seg in job.segments:
        if seg.next_offset <= first_dirty:
            continue
        for header, view in _read_batches(job, seg, throttle):
            if header.last_offset < first_dirty:
                continue
            if not header.is_control and not aborted.is_aborted(header):
                if offsets and len(offsets) + header.records_count > job.max_map_entries:
                    return offsets, end  # full: clean up to here, the rest next time
                for r in record_codec.decode_records(view, header):
                    if r.key is not None and r.offset >= first_dirty:
                        offsets[r.key] = r.offset
            end = header.last_offset + 1
        end = seg.next_offset
    return offsets, end


def _group_segments(segments: list[SourceSegment] | tuple[SourceSegment, ...], segment_bytes: int,
                    segment_index_bytes: int) -> list[list[SourceSegment]]:
    """Kafka's groupSegmentsBySize: consecutive segments whose data and indexes fit one segment,
    and whose offsets stay within an int32 of the group's base (index entries are relative)."""
    groups: list[list[SourceSegment]] = []
    i = 0
    while i < len(segments):
        group = [segments[i]]
        size, index, tindex = segments[i].size, segments[i].index_bytes, segments[i].time_index_bytes
        i += 1
        while i < len(segments) and size + segments[i].size <= segment_bytes and \
                index + segments[i].index_bytes <= segment_index_bytes and \
                tindex + segments[i].time_index_bytes <= segment_index_bytes and \
                segments[i].next_offset - 1 - group[0].base_offset <= _INT32_MAX:
            group.append(segments[i])
            size += segments[i].size
            index += segments[i].index_bytes
            tindex += segments[i].time_index_bytes
            i += 1
        groups.append(group)
    return groups


class _Output:
    """One cleaned segment being written: the log streams to its ``.log.cleaned`` file through a
    small buffer (memory stays bounded whatever ``segment.bytes`` is); the indexes, a few entries,
    are written when the segment is finished."""

    FLUSH_BYTES = 1 << 20

    def __init__(self, job: CleanJob, base_offset: int, next_offset: int, old_bases: list[int]) -> None:
        self.job = job
        self.base_offset = base_offset
        self.next_offset = next_offset
        self.old_bases = old_bases
        self.size = 0
        self.offset_entries: list[tuple[int, int]] = []
        self.time_entries: list[tuple[int, int]] = []
        self.aborted: list[AbortedTxn] = []
        self._since_index = 0
        self._pending = bytearray()
        self._fd = _create(job, segment_swap.cleaned_path(job.directory, base_offset, ".log"))

    def add(self, batch: bytes | memoryview, base_offset: int, max_timestamp: int) -> None:
        if self.size == 0 or self._since_index >= self.job.index_interval_bytes:
            self.offset_entries.append((base_offset - self.base_offset, self.size))
            self._since_index = 0
        self._since_index += len(batch)
        if max_timestamp > (self.time_entries[-1][0] if self.time_entries else -1):
            self.time_entries.append((max_timestamp, base_offset - self.base_offset))
        self._pending += batch
        self.size += len(batch)
        if len(self._pending) >= self.FLUSH_BYTES:
            self._write_pending()

    def _write_pending(self) -> None:
        view = memoryview(self._pending)
        pos = self.size - len(view)
        while view:
            n = fileio.fs.pwrite(self._fd, view, pos)
            view, pos = view[n:], pos + n
        self._pending = bytearray()

    def finish(self) -> None:
        """fsync the log, write and fsync the three indexes (loop thread swaps them in later)."""
        try:
            self._write_pending()
            fileio.fs.fsync(self._fd)
        finally:
            self.close()
        d, base = self.job.directory, self.base_offset
        _write_file(self.job, segment_swap.cleaned_path(d, base, ".index"),
                    b"".join(_OFFSET_ENTRY.pack(r, p) for r, p in self.offset_entries))
        _write_file(self.job, segment_swap.cleaned_path(d, base, ".timeindex"),
                    b"".join(_TIME_ENTRY.pack(t, r) for t, r in self.time_entries))
        _write_file(self.job, segment_swap.cleaned_path(d, base, ".txnindex"),
                    b"".join(_TXN_ENTRY.pack(a.producer_id, a.first_offset, a.last_offset, a.last_stable_offset)
                             for a in self.aborted))

    @property
    def bytes_on_disk(self) -> int:
        return self.size + _OFFSET_ENTRY.size * len(self.offset_entries) + \
            _TIME_ENTRY.size * len(self.time_entries) + _TXN_ENTRY.size * len(self.aborted)

    def close(self) -> None:
        if self._fd >= 0:
            fileio.fs.close(self._fd)
            self._fd = -1

    def discard(self) -> None:
        self.close()
        fileio.fs.unlink(segment_swap.cleaned_path(self.job.directory, self.base_offset, ".log"))


class _Filter:
    """Decides, batch by batch in offset order, what of the rewritten range survives."""

    def __init__(self, job: CleanJob, offsets: dict[bytes, int], map_end: int, aborted: _AbortedIndex) -> None:
        self.last_records = job.last_records
        self.offsets = offsets
        self.map_end = map_end
        self.aborted = aborted
        self.now = job.now_ms
        self.new_horizon = min(job.now_ms + job.delete_retention_ms, _LONG_MAX)
        self.txn_kept: dict[int, bool] = {}  # producer -> a batch of its current transaction was kept
        self.kept_abort_markers: set[tuple[int, int]] = set()
        self.records_removed = 0

    def _is_last_of_producer(self, header: rb.BatchHeader) -> bool:
        last = self.last_records.get(header.producer_id)
        if last is None:
            return False
        if last.last_data_offset is not None:
            return header.last_offset == last.last_data_offset
        return header.is_control and header.producer_epoch == last.producer_epoch

    def _keep_record(self, header: rb.BatchHeader, r: record_codec.Record) -> bool:
        if r.offset >= self.map_end:
            return True
        if r.key is None:
            return False  # a compacted topic refuses these; one from before the policy changed goes
        if r.offset < self.offsets.get(r.key, -1):
            return False
        if r.value is None:
            horizon = record_codec.delete_horizon_ms(header)
            return horizon is None or self.now < horizon
        return True

    def batch(self, header: rb.BatchHeader, view: memoryview) -> bytes | memoryview | None:
        """The batch to write in place of this one, or None to drop it."""
        pid = header.producer_id
        last_of_producer = pid >= 0 and self._is_last_of_producer(header)
        horizon = record_codec.delete_horizon_ms(header)
        if header.is_control:
            kept_txn = self.txn_kept.pop(pid, False)
            # An emptied marker (records_count 0) was emptied because its transaction was gone.
            can_discard = header.records_count == 0 or not kept_txn
            discard_records = can_discard and horizon is not None and horizon <= self.now
            if discard_records or header.records_count == 0:
                self.records_removed += header.records_count
                return (view if header.records_count == 0 else record_codec.empty_batch(header)) \
                    if last_of_producer else None
            if rb.control_type_of(view, 0, header) == rb.CONTROL_ABORT:
                self.kept_abort_markers.add((pid, header.base_offset))
            if can_discard and horizon is None:
                return record_codec.rebuild_batch(header, record_codec.decode_records(view, header),
                                                  delete_horizon=self.new_horizon)
            return view
        aborted = self.aborted.is_aborted(header)
        if aborted:
            kept: list[record_codec.Record] = []
            total = header.records_count
        else:
            records = record_codec.decode_records(view, header)
            kept = [r for r in records if self._keep_record(header, r)]
            total = len(records)
        self.records_removed += total - len(kept)
        out: bytes | memoryview | None
        if kept:
            set_horizon = horizon is None and any(r.value is None for r in kept)
            if len(kept) == total and not set_horizon:
                out = view
            else:
                out = record_codec.rebuild_batch(header, kept,
                                                 delete_horizon=self.new_horizon if set_horizon else horizon)
        elif last_of_producer:
            out = view if header.records_count == 0 else record_codec.empty_batch(header)
        else:
            out = None
        if header.is_transactional and pid >= 0:
            self.txn_kept[pid] = self.txn_kept.get(pid, False) or out is not None
        return out


def _create(job: CleanJob, path: Path) -> int:
    """Create (or empty) a ``.cleaned`` file; refused once the job is cancelled (see CleanJob)."""
    with job.lock:
        job.check()
        fd = fileio.fs.open_rw(path)
        job.created.append(path)
    if os.fstat(fd).st_size:
        fileio.fs.ftruncate(fd, 0)
    return fd


def _write_file(job: CleanJob, path: Path, data: bytes) -> None:
    fd = _create(job, path)
    try:
        view = memoryview(data)
        written = 0
        while written < len(view):
            written += fileio.fs.pwrite(fd, view[written:], written)
        fileio.fs.fsync(fd)
    finally:
        fileio.fs.close(fd)


@dataclass
class CleaningProgress:
    """What a cleaning in several steps carries from one step to the next (thread side): the
    offset map and where it ends, the groups still to rewrite, and the filter with its transaction
    state (Kafka's ``CleanedTransactionMetadata`` lives across the groups of one cleaning). Only
    the thread running a step changes it; the loop thread reads ``groups`` between steps."""

    filt: _Filter
    map_end: int
    groups: list[list[SourceSegment]]
    aborted_by_marker: dict[tuple[int, int], AbortedTxn]

    @property
    def next_group_bytes(self) -> int:
        return sum(s.copy_bytes for s in self.groups[0]) if self.groups else 0


def clean(job: CleanJob) -> CleanResult:
    """Run one step of a cleaning (a cleaner thread): write the ``.cleaned`` files of the groups
    that fit ``job.max_write_bytes`` (at least one), return what to swap in and what is left."""
    started = time.monotonic()
    throttle = _Throttler(job.max_bytes_per_second)
    progress = job.progress
    if progress is None:
        aborted = _AbortedIndex(job.aborted)
        offsets, map_end = _build_offset_map(job, aborted, throttle)
        rewrite = [s for s in job.segments if s.base_offset < map_end]
        progress = CleaningProgress(_Filter(job, offsets, map_end, aborted), map_end,
                                    _group_segments(rewrite, job.segment_bytes, job.segment_index_bytes),
                                    {(a.producer_id, a.last_offset): a for a in job.aborted})
    filt = progress.filt
    removed_before = filt.records_removed
    outputs: list[_Output] = []
    result = CleanResult([], 0, progress.map_end)
    written = 0
    out: _Output | None = None
    try:
        while progress.groups:
            group = progress.groups[0]
            # A step ends before a group whose worst case would not fit (what is done is swapped in
            # first), never between two segments with the same base: a roll of an empty active
            # segment leaves two, one file, and the swap would unlink the file of the one left.
            if result.replaced and written + sum(s.copy_bytes for s in group) > job.max_write_bytes and \
                    group[0].base_offset != job.segments[result.replaced - 1].base_offset:
                break
            out = _Output(job, group[0].base_offset, group[-1].next_offset, [s.base_offset for s in group])
            for seg in group:
                result.bytes_read += seg.size
                for header, view in _read_batches(job, seg, throttle):
                    kept = filt.batch(header, view)
                    if kept is not None:
                        kept_header = rb.read_header(kept)
                        out.add(kept, kept_header.base_offset, kept_header.max_timestamp)
            out.aborted = [progress.aborted_by_marker[k]
                           for k in sorted(filt.kept_abort_markers, key=lambda k: k[1])
                           if out.base_offset <= k[1] < out.next_offset and k in progress.aborted_by_marker]
            if out.size == 0 and outputs:
                out.discard()  # an emptied group joins the segment before it
                outputs[-1].next_offset = out.next_offset
                outputs[-1].old_bases += out.old_bases
            else:
                out.finish()
                written += out.bytes_on_disk
                outputs.append(out)
            out = None
            progress.groups.pop(0)
            result.replaced += len(group)
            result.end_offset = min(group[-1].next_offset, progress.map_end)
    finally:
        if out is not None:
            out.close()
    if progress.groups:
        result.remaining = progress
    else:
        result.end_offset = progress.map_end
    for o in outputs:
        result.segments.append(CleanedSegment(o.base_offset, o.next_offset, o.old_bases, o.size, len(o.aborted)))
        result.bytes_written += o.size
    result.records_removed = filt.records_removed - removed_before
    result.elapsed_s = time.monotonic() - started
    return result


# --- choosing logs and swapping results in (the event loop thread) -------------------------------------
@dataclass(frozen=True, slots=True)
class LogToClean:
    """Kafka's LogToClean: the cleanable part of one log and how dirty it is."""

    plog: PartitionLog
    segments: list[LogSegment]  # the cleanable segments, from the log's first
    first_dirty_offset: int
    clean_bytes: int
    dirty_bytes: int
    forced: bool  # max.compaction.lag.ms passed for the earliest first batch of a dirty segment

    @property
    def cleanable_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


def _first_batch_timestamp(seg: LogSegment) -> int:
    head = seg.pread(0, rb.HEADER_SIZE)
    return rb.read_header(head).max_timestamp if len(head) == rb.HEADER_SIZE else -1


def _sources(segments: Iterable[LogSegment]) -> tuple[SourceSegment, ...]:
    return tuple(SourceSegment(s.base_offset, s.path, s.size, s.next_offset,
                               _OFFSET_ENTRY.size * len(s.offset_index.positions),
                               _TIME_ENTRY.size * len(s.time_index.timestamps),
                               _TXN_ENTRY.size * len(s.txn_index.entries))
                 for s in segments)


def _free_bytes(directory: Path) -> int | None:
    """Free bytes of the file system holding ``directory`` (None: it reports no size)."""
    st = os.statvfs(directory)
    return None if st.f_blocks == 0 else st.f_bavail * st.f_frsize


class LogCleanerManager:
    """Which logs to clean, the jobs in flight, the cleaner checkpoints (Kafka's LogCleanerManager).

    Loop thread only. A log is cleaned by at most one job at a time; a log whose cleaning failed
    for a reason other than an abort or a full disk is left alone until the broker restarts (Kafka
    marks it uncleanable), with the reason logged.

    A cleaning writes a copy of what it cleans, as large as its input at worst, so it keeps
    ``log_dir_min_free_bytes`` as a client's append does. It goes in steps (see :class:`CleanJob`):
    each writes what fits in the free space above that bound (at least one group of segments,
    ``segment.bytes``), is swapped in, and frees the old segments before the next step starts;
    the next step of a log's cleaning goes before any other cleaning. A step whose first group
    would eat into the bound is put off (not chosen, tried again at the next pass), and a step the
    disk refuses anyway (ENOSPC, EDQUOT) drops the cleaning (what earlier steps swapped in stays)
    and it is tried again later, not marked uncleanable. Before, a client filling a compacted topic
    of unique keys to the bound made the cleaner take the rest of the disk, then left the log
    uncleanable until a restart; any broker write at that moment (the recovery-point checkpoint, a
    marker) would have stopped the broker. And until 2026-11-28 a cleaning copied the whole
    cleanable log before swapping anything in and was put off unless all of it fit: a log whose
    dirty part outgrew the free space (an open transaction held the LSO meanwhile) was never
    cleaned again, and the disk filled.
    """

    def __init__(self, config: CleanerConfig) -> None:
        self.config = config
        self.in_progress: dict[PartitionLog, CleanJob] = {}
        self.uncleanable: dict[str, str] = {}
        self._checkpoints: dict[PartitionLog, int] = {}
        # The next step of each cleaning that has more to do (swapped in up to its ``swapped_before``).
        self._next_steps: dict[PartitionLog, CleanJob] = {}
        self.cleanings = 0

    @staticmethod
    def _put_off(name: str, why: str) -> None:
        storage_refused(DiskFullError(f"{name}: cleaning put off: {why}"))

    @staticmethod
    def _write_budget(plog: PartitionLog) -> float:
        """How much a step may write now: the free space above ``log_dir_min_free_bytes``."""
        free = _free_bytes(plog.directory)
        return float("inf") if free is None else free - max(plog.dir_state.min_free_bytes, 0)

    def _room_refused(self, plog: PartitionLog, group_bytes: int) -> str | None:
        """Why a step whose first group copies to ``group_bytes`` at most may not start now."""
        if (refused := plog.dir_state.client_write_refused(plog.directory, group_bytes)) is not None:
            return refused
        budget = self._write_budget(plog)
        if group_bytes > budget:
            return (f"not enough free space in {plog.directory.parent} for a group of {group_bytes} bytes: "
                    f"{budget + max(plog.dir_state.min_free_bytes, 0):.0f} bytes free, "
                    f"{plog.dir_state.min_free_bytes} kept for the broker's own records (log_dir_min_free_bytes)")
        return None

    # --- checkpoints ---------------------------------------------------------------------------
    def checkpoint(self, plog: PartitionLog) -> int | None:
        if plog not in self._checkpoints:
            raw = fileio.read_file(plog.directory / CHECKPOINT_FILE)
            try:
                self._checkpoints[plog] = int(raw) if raw is not None else -1
            except ValueError:
                self._checkpoints[plog] = -1
        value = self._checkpoints[plog]
        return value if value >= 0 else None

    def _set_checkpoint(self, plog: PartitionLog, offset: int) -> None:
        self._checkpoints[plog] = offset
        plog._guarded(lambda: fileio.fs.write_atomic(plog.directory / CHECKPOINT_FILE, str(offset).encode()))

    # --- choosing --------------------------------------------------------------------------------
    def log_to_clean(self, plog: PartitionLog, now_ms: int) -> LogToClean:
        cfg = plog.config
        segs = plog.segments
        active = segs[-1]
        checkpoint = self.checkpoint(plog)
        first_dirty = plog.log_start_offset
        if checkpoint is not None and plog.log_start_offset <= checkpoint <= active.base_offset:
            first_dirty = checkpoint
        uncleanable = min(plog.last_stable_offset, active.base_offset, plog.recovery_point)
        if cfg.min_compaction_lag_ms > 0:
            for seg in segs[:-1]:
                if seg.next_offset > first_dirty and seg.max_timestamp > now_ms - cfg.min_compaction_lag_ms:
                    uncleanable = min(uncleanable, seg.base_offset)
                    break
        cleanable: list[LogSegment] = []
        for seg in segs[:-1]:
            if seg.next_offset > uncleanable or seg.needs_flush:
                break
            cleanable.append(seg)
        clean_bytes = sum(s.size for s in cleanable if s.next_offset <= first_dirty)
        dirty = [s for s in cleanable if s.next_offset > first_dirty]
        dirty_bytes = sum(s.size for s in dirty)
        forced = False
        if dirty and cfg.max_compaction_lag_ms < _LONG_MAX:
            # Kafka's maxCompactionDelay: the earliest first-batch timestamp of all dirty non-active
            # segments (timestamps are not monotonic), counting only real ones (> 0).
            stamps = [t for s in segs[:-1] if s.next_offset > first_dirty and s.size
                      and (t := _first_batch_timestamp(s)) > 0]
            forced = bool(stamps) and min(stamps) < now_ms - max(cfg.max_compaction_lag_ms, 0)
        return LogToClean(plog, cleanable, first_dirty, clean_bytes, dirty_bytes, forced)

    def grab_filthiest(self, logs: Iterable[PartitionLog], now_ms: int) -> CleanJob | None:
        """The job for the dirtiest eligible compacted log, marked in progress; None if none is due.
        The next step of a cleaning already under way goes first."""
        logs = list(logs)
        for plog in logs:
            if plog in self._next_steps and (job := self._next_step(plog, check_room=True)) is not None:
                return job
        best: LogToClean | None = None
        for plog in logs:
            if not plog.config.compact or plog in self.in_progress or plog in self._next_steps or \
                    plog.name in self.uncleanable or plog.dir_state.offline_reason is not None:
                continue
            ltc = self.log_to_clean(plog, now_ms)
            if ltc.dirty_bytes <= 0 or not (ltc.forced or ltc.cleanable_ratio > plog.config.min_cleanable_dirty_ratio):
                continue
            if best is not None and ltc.cleanable_ratio <= best.cleanable_ratio:
                continue
            groups = _group_segments(_sources(ltc.segments), plog.config.segment_bytes, plog.config.segment_index_bytes)
            first_group = sum(s.copy_bytes for s in groups[0]) if groups else 0  # the least a step writes
            if (refused := self._room_refused(plog, first_group)) is not None:
                self._put_off(plog.name, refused)
                continue
            best = ltc
        if best is None:
            return None
        return self._job(best, now_ms)

    def job_for(self, plog: PartitionLog, now_ms: int) -> CleanJob | None:
        """A job cleaning ``plog`` now whatever its dirty ratio (tests, and an operator's request):
        the next step of its cleaning if one is under way."""
        if plog in self.in_progress:
            return None
        if plog in self._next_steps:
            return self._next_step(plog, check_room=False)
        ltc = self.log_to_clean(plog, now_ms)
        return self._job(ltc, now_ms) if ltc.segments and ltc.dirty_bytes > 0 else None

    def _job(self, ltc: LogToClean, now_ms: int) -> CleanJob:
        plog = ltc.plog
        cfg = plog.config
        last_records = {pid: LastRecord(e.batches[-1].last_offset if e.batches else None, e.producer_epoch)
                        for pid, e in plog.producer_state.producers.items()}
        job = CleanJob(
            plog=plog, old_segments=list(ltc.segments), directory=plog.directory, name=plog.name,
            segments=_sources(ltc.segments), first_dirty_offset=ltc.first_dirty_offset,
            aborted=tuple(e for s in plog.segments for e in s.txn_index.entries),
            last_records=last_records, now_ms=now_ms, delete_retention_ms=cfg.delete_retention_ms,
            segment_bytes=cfg.segment_bytes, segment_index_bytes=cfg.segment_index_bytes,
            index_interval_bytes=cfg.index_interval_bytes, max_map_entries=self.config.max_map_entries,
            max_bytes_per_second=self.config.io_max_bytes_per_second / max(self.config.threads, 1),
            max_write_bytes=self._write_budget(plog))
        self.in_progress[plog] = job
        log.debug("%s: cleaning [%d, %d), dirty ratio %.2f%s", plog.name, ltc.first_dirty_offset,
                  job.first_uncleanable_offset, ltc.cleanable_ratio, " (max.compaction.lag.ms)" if ltc.forced else "")
        return job

    def _next_step(self, plog: PartitionLog, *, check_room: bool) -> CleanJob | None:
        """The next step of ``plog``'s cleaning, marked in progress; None if there is no room for
        its first group now (put off) or the log went away or stopped compacting (the cleaning is
        dropped; what earlier steps swapped in stays)."""
        job = self._next_steps[plog]
        if plog.removed or plog.dir_state.offline_reason is not None or not plog.config.compact:
            del self._next_steps[plog]
            return None
        assert job.progress is not None
        if check_room and (refused := self._room_refused(plog, job.progress.next_group_bytes)) is not None:
            self._put_off(plog.name, refused)
            return None
        del self._next_steps[plog]
        job.max_write_bytes = self._write_budget(plog)
        self.in_progress[plog] = job
        return job

    # --- results ---------------------------------------------------------------------------------
    def complete(self, job: CleanJob, result: CleanResult) -> bool:
        """Swap a finished step in (loop thread); False if it became stale and the cleaning was
        dropped. A step with more to do leaves the cleaning's next step to :meth:`grab_filthiest`."""
        if self.in_progress.get(job.plog) is job:
            del self.in_progress[job.plog]
        plog = job.plog
        if job.cancelled:
            return False
        old = job.old_segments[:result.replaced]
        # The earlier steps' segments stay as they are; they go through the swap (which replaces a
        # prefix of the log) unchanged, none of their files touched.
        kept = [(s.base_offset, s.next_offset, len(s.txn_index.entries)) for s in job.swapped_before]
        cleaned = [(s.base_offset, s.next_offset, s.aborted_entries) for s in result.segments]
        swapped = plog.replace_segments(job.swapped_before + old, kept + cleaned, result.groups)
        if not swapped:
            segment_swap.discard(job.directory, [s.base_offset for s in result.segments])
            log.info("%s: dropped a cleaning: segments were deleted while it ran", plog.name)
            return False
        # Everything below the end of a step is clean (deduplicated against a map that covers it), so
        # the checkpoint may move as soon as a step reaches into the dirty range.
        if result.remaining is None or result.end_offset > max(job.first_dirty_offset, self.checkpoint(plog) or 0):
            self._set_checkpoint(plog, result.end_offset)
        done = len(job.swapped_before) + len(result.segments)
        if result.remaining is not None:
            self._next_steps[plog] = CleanJob(
                plog=plog, old_segments=job.old_segments[result.replaced:], directory=job.directory, name=job.name,
                segments=job.segments[result.replaced:], first_dirty_offset=job.first_dirty_offset,
                aborted=job.aborted, last_records=job.last_records, now_ms=job.now_ms,
                delete_retention_ms=job.delete_retention_ms, segment_bytes=job.segment_bytes,
                segment_index_bytes=job.segment_index_bytes, index_interval_bytes=job.index_interval_bytes,
                max_map_entries=job.max_map_entries, max_bytes_per_second=job.max_bytes_per_second,
                swapped_before=plog.segments[:done], progress=result.remaining)
        else:
            self.cleanings += 1
        log.info("%s: cleaned [%d, %d) into %d segment(s): %d -> %d bytes, %d record(s) removed, %.2f s%s",
                 plog.name, old[0].base_offset, result.end_offset, len(result.segments), result.bytes_read,
                 result.bytes_written, result.records_removed, result.elapsed_s,
                 "" if result.remaining is None else " (one step: the rest follows once it is swapped in)")
        return True

    def failed(self, job: CleanJob, exc: BaseException) -> None:
        """The cleaning raised (loop thread): drop its files (what earlier steps swapped in stays);
        unless it was aborted, leave the log alone until a restart (Kafka's uncleanable partitions)."""
        if self.in_progress.get(job.plog) is job:
            del self.in_progress[job.plog]
        if job.cancelled:
            return  # ``cancel`` removed its files; the directory may belong to a re-created topic now
        for p in job.created:
            fileio.fs.unlink(p)
        if isinstance(exc, CleaningAbortedError | FileNotFoundError):
            return
        if isinstance(exc, OSError) and exc.errno in fileio.DISK_FULL_ERRNOS:
            self._put_off(job.name, f"the disk is full ({exc})")
            return
        self.uncleanable[job.name] = f"{type(exc).__name__}: {exc}"
        log.error("%s: cleaning failed; the log is not cleaned again until the broker restarts: %s",
                  job.name, self.uncleanable[job.name], exc_info=exc)

    def abort(self, plog: PartitionLog) -> None:
        job = self.in_progress.pop(plog, None)
        if job is not None:
            job.cancel()
        self._next_steps.pop(plog, None)
        self._checkpoints.pop(plog, None)

    def abort_all(self) -> None:
        for plog in list(self.in_progress) + list(self._next_steps):
            self.abort(plog)

    def clean_now(self, logs: Iterable[PartitionLog], now_ms: int, *, force: bool = False) -> int:
        """Clean on the calling thread until no log is due (``force``: each log once, whatever its
        ratio, every step of it); returns how many steps were swapped in (one per cleaning unless
        the free space split it). For tests and tools: the broker runs :func:`clean` on its
        cleaner threads instead."""
        done = 0
        pending = list(logs)
        while True:
            if force:
                job = None
                while pending and job is None:
                    job = self.job_for(pending.pop(0), now_ms)
            else:
                job = self.grab_filthiest(pending, now_ms)
            if job is None:
                return done
            try:
                result = clean(job)
            except Exception as exc:
                self.failed(job, exc)
                raise
            done += self.complete(job, result)
            if force and job.plog in self._next_steps:
                pending.insert(0, job.plog)  # its next step, before the next log

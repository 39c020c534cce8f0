"""One segment of a partition log: ``<base_offset:020d>.log`` plus its indexes.

Layout: the ``.log`` file is a sequence of complete RecordBatch v2 batches, exactly as producers sent
them but with ``base_offset`` rewritten; nothing else. Invariants: ``size`` is the byte length of the
valid data (the file is never longer after ``recover``); ``next_offset`` is one past the last offset
of the last batch; index entries point only at batch starts inside ``size``.

Only the partition log's owner thread (the broker's event loop) calls a segment.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, overload

from oncelog.protocol import records as rb
from oncelog.storage import descriptors, fileio
from oncelog.storage.errors import DiskFullError, ReadWouldBlock
from oncelog.storage.offset_index import OffsetIndex, TimeIndex
from oncelog.storage.transaction_index import TransactionIndex

if TYPE_CHECKING:
    from oncelog.storage.flush_job import FlushJob

log = logging.getLogger("oncelog.storage")

#: Whether reads may be asked not to wait for the disk (``preadv2`` with RWF_NOWAIT, Linux 4.14+).
#: Turned off for good the first time the file system refuses the flag or cannot honour it.
nowait_reads = hasattr(os, "preadv") and hasattr(os, "RWF_NOWAIT")


def pread_nowait(fd: int, length: int, position: int) -> bytes | bytearray:
    """``length`` bytes at ``position`` if they are all in the page cache, else ``ReadWouldBlock``.
    The callers read inside the file, so a short read means pages that are not in memory."""
    global nowait_reads
    if not nowait_reads:
        return os.pread(fd, length, position)
    buf = bytearray(length)
    try:
        n = os.preadv(fd, [buf], position, os.RWF_NOWAIT)
    except BlockingIOError:
        n = -1
    except OSError as exc:  # EOPNOTSUPP / EINVAL: this file system does not take the flag
        log.info("reads that do not wait for the disk are not supported here (%s): reads stay blocking", exc)
        nowait_reads = False
        return os.pread(fd, length, position)
    if n < length:
        raise ReadWouldBlock(fd, position, length)
    return buf


def disable_nowait_reads(reason: str) -> None:
    """Reads block from now on (a file system that answers every nowait read with EAGAIN)."""
    global nowait_reads
    if nowait_reads:
        log.info("reads that do not wait for the disk turned off: %s", reason)
        nowait_reads = False


#: Bytes recovery reads at a time when it scans an unflushed tail.
_RECOVERY_CHUNK = 4 << 20
#: The largest offset relative to a segment's base its offset index can hold (int32).
_MAX_RELATIVE = (1 << 31) - 1


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}"


def dup_descriptors(segments: list[LogSegment]) -> list[int]:
    """A duplicate of each segment's descriptor (``fileio.fs.dup``), for a flush or an fsync off the
    loop; all or none: if one fails (EMFILE), those made are closed and the error raised, and
    nothing else has changed. (A flush pass that met EMFILE half way through a partition used to
    leak the duplicates made, and left segments marked clean whose fsync never ran.)"""
    fds: list[int] = []
    try:
        for seg in segments:
            fds.append(fileio.fs.dup(seg.fd))
    except BaseException:
        for fd in fds:
            try:
                fileio.fs.close(fd)
            except OSError:
                pass
        raise
    return fds


class LogSegment:
    def __init__(self, directory: Path, base_offset: int, created_ms: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        stem = segment_name(base_offset)
        self.path = directory / f"{stem}.log"
        self.offset_index = OffsetIndex(directory / f"{stem}.index", base_offset)
        self.time_index = TimeIndex(directory / f"{stem}.timeindex", base_offset)
        self.txn_index = TransactionIndex(directory / f"{stem}.txnindex", base_offset)
        self.index_interval_bytes = index_interval_bytes
        self.created_ms = created_ms
        self.fd = fileio.fs.open_rw(self.path)
        descriptors.segment_opened()
        self.size = os.fstat(self.fd).st_size
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._bytes_since_index = 0
        self.dirty = False
        self.truncated = False  # recovery cut torn or corrupt bytes off this segment
        # Rolled since its last flush: that flush fsyncs its time index (``plan_flush``).
        self.time_index_durable_due = False
        self._first_batch_timestamp: int | None = None  # read from the file when first asked

    # --- writes -----------------------------------------------------------------------------------
    def append(self, data: bytes | bytearray, batches: list[tuple[int, rb.BatchHeader]]) -> None:
        """Append whole batches whose headers (with final offsets) are ``batches`` (pos in ``data``)."""
        start = self.size
        try:
            written = fileio.fs.pwrite(self.fd, data, start)
        except OSError as exc:
            if exc.errno != errno.ENOSPC:
                raise fileio.StorageOfflineError(f"write to {self.path} failed: {exc}") from exc
            written, full = -1, f"write to {self.path}: {exc}"
        else:  # a short write on a regular file means the disk is full
            full = f"short write to {self.path}: {written} of {len(data)} bytes (the disk is full)"
        if written != len(data):
            try:  # nothing of it stays (ENOSPC writes nothing; the truncation is cheap insurance)
                fileio.fs.ftruncate(self.fd, start)
            except OSError as exc:
                raise fileio.StorageOfflineError(f"truncating a short write to {self.path} failed: {exc}") from exc
            raise DiskFullError(full)
        # The indexes only once the bytes are there: a refused write leaves no entry behind.
        for pos, header in batches:
            if self._bytes_since_index >= self.index_interval_bytes or start + pos == 0:
                self.offset_index.append(header.base_offset, start + pos)
                self._bytes_since_index = 0
            self._bytes_since_index += header.size
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.time_index.maybe_append(header.max_timestamp, header.base_offset)
        self.size = start + len(data)
        self.next_offset = batches[-1][1].last_offset + 1
        self.dirty = True

    @property
    def needs_flush(self) -> bool:
        return self.dirty or self.txn_index.dirty or self.time_index_durable_due

    def sync_data(self) -> None:
        """fsync the data only (the indexes are rebuilt above the recovery point on recovery)."""
        try:
            fileio.fs.fsync(self.fd)
        except OSError as exc:
            raise fileio.StorageOfflineError(f"fsync of {self.path} failed: {exc}") from exc

    def plan_flush(self, job: FlushJob, fd: int | None) -> None:
        """Add this segment's part of a flush to ``job`` (on the loop thread): ``fd``, a duplicate of
        the data file's descriptor to fsync when the segment is dirty (None when not), and the index
        entries not yet written; the job runs them elsewhere. Nothing here can fail: the caller made
        every duplicate of its plan first (:func:`dup_descriptors`), since a plan abandoned half way
        would leave segments marked clean and index entries taken whose flush never runs."""
        index_files = (self.offset_index.path, self.time_index.path, self.txn_index.path)
        if self.dirty:
            assert fd is not None, "a dirty segment's flush needs a duplicate of its descriptor"
            job.fds.append(fd)
            self.dirty = False
        pendings = (self.offset_index.take_pending(), self.time_index.take_pending(), self.txn_index.take_pending())
        # A light flush leaves index entries to the kernel's writeback, but the segment's max
        # timestamp is read back from its time index (retention, lookups by time): once the segment
        # is rolled, the flush that carries the recovery point past it fsyncs that index too (one
        # fsync a roll). Only the segment holding the recovery point may then lack entries after a
        # power cut, and its load walks its trusted part for them (``restore_time_index``).
        sealed = self.time_index_durable_due
        self.time_index_durable_due = False
        for path, pending, hint in zip(index_files, pendings, (True, True, False), strict=True):
            durable_now = sealed and path == self.time_index.path
            if pending or durable_now:
                job.index_appends.append((path, pending, durable_now or not (hint and job.light)))
                if not path.exists():
                    job.new_names = True

    def flush(self) -> None:
        """fsync the data, then the indexes (the txn index included) that describe it.

        Raises StorageOfflineError if the disk refuses: the caller must not move the recovery
        point, and must not retry (see ``fileio``). A new index file's name is made durable too.
        """
        index_files = (self.offset_index.path, self.time_index.path, self.txn_index.path)
        existed = [p.exists() for p in index_files]
        try:
            if self.dirty:
                fileio.fs.fsync(self.fd)
                self.dirty = False
            self.offset_index.flush()
            self.time_index.flush()
            self.txn_index.flush()
            if existed != [p.exists() for p in index_files]:
                fileio.fs.fsync_dir(self.directory)
        except fileio.StorageOfflineError:
            raise
        except OSError as exc:
            raise fileio.StorageOfflineError(f"fsync of {self.path} failed: {exc}") from exc

    # --- reads ------------------------------------------------------------------------------------
    @overload
    def pread(self, position: int, length: int) -> bytes: ...

    @overload
    def pread(self, position: int, length: int, nowait: bool) -> bytes | bytearray: ...

    def pread(self, position: int, length: int, nowait: bool = False) -> bytes | bytearray:
        """``nowait``: raise ``ReadWouldBlock`` rather than wait for the disk (see ``pread_nowait``)."""
        if nowait:
            return pread_nowait(self.fd, length, position)
        return os.pread(self.fd, length, position)

    def find_position(self, offset: int, nowait: bool = False) -> tuple[int, rb.BatchHeader] | None:
        """Position and header of the batch containing ``offset`` (or the first after it), a batch
        wholly inside ``size``; None when the segment has none: its data ends first, or a batch on
        the way is implausible or runs past ``size`` (a damaged length field, a file cut below the
        recovery point). As Kafka's ``FileLogInputStream.nextBatch`` returns null for a batch past
        the end of the file, that is the segment's end, and a read goes on with the next segment.
        ``size`` only ever covers whole appended batches (it moves after the write), so this never
        cuts short a write in progress on the active segment."""
        pos = self.offset_index.lookup(offset)
        while pos < self.size:
            head = self.pread(pos, rb.HEADER_SIZE, nowait)
            if len(head) < rb.HEADER_SIZE:
                return None
            header = rb.read_header(head)
            if header.batch_length < rb.HEADER_SIZE - rb.LOG_OVERHEAD or pos + header.size > self.size:
                return None
            if header.last_offset >= offset:
                return pos, header
            pos += header.size
        return None

    def boundary_position(self, offset: int) -> int | None:
        """Byte position of the batch boundary at ``offset``: where the first batch at or after
        ``offset`` begins, or the end of the data when its last batch ends just before ``offset``.

        ``offset`` is a recovery point or a snapshot's offset: a log end once, so a boundary of
        intact data. None when the data does not reach it that way: the file ends before it (cut
        between batches or inside one), a batch straddles it, or a header on the way is implausible
        or runs past the end of the file. The segment was then damaged below ``offset``, and only
        its data can tell where the log ends (Kafka never takes a log end from a recovery point).
        """
        pos = self.offset_index.lookup(offset)
        end = self.base_offset  # one past the last offset of the batches walked (none yet: the base)
        while pos < self.size:
            head = self.pread(pos, rb.HEADER_SIZE)
            if len(head) < rb.HEADER_SIZE:
                return None
            header = rb.read_header(head)
            if header.batch_length < rb.HEADER_SIZE - rb.LOG_OVERHEAD or pos + header.size > self.size:
                return None
            if header.base_offset >= offset:
                return pos
            if header.last_offset >= offset:
                return None
            end = header.last_offset + 1
            pos += header.size
        return pos if end == offset else None

    def iter_batches(self, position: int = 0, chunk: int = 1 << 20):
        """Yield (position, header, bytes) for complete batches from ``position``; headers only
        are decoded. Stops at the first incomplete or implausible header."""
        while position < self.size:
            data = self.pread(position, min(chunk, self.size - position))
            consumed = 0
            for pos, header in rb.iter_headers(data):
                yield position + pos, header, memoryview(data)[pos : pos + header.size]
                consumed = pos + header.size
            if consumed == 0:
                if len(data) >= rb.HEADER_SIZE:
                    header = rb.read_header(data)
                    if header.batch_length >= rb.HEADER_SIZE - rb.LOG_OVERHEAD and \
                            position + header.size <= self.size:
                        big = self.pread(position, header.size)
                        yield position, header, memoryview(big)
                        position += header.size
                        continue
                return
            position += consumed

    # --- recovery ---------------------------------------------------------------------------------
    def first_batch_timestamp(self) -> int:
        """The max timestamp of the segment's first batch, -1 when it has none or the segment is
        empty (Kafka's rollingBasedTimestamp, loaded lazily too)."""
        if self._first_batch_timestamp is None:
            if self.size < rb.HEADER_SIZE:
                return -1
            self._first_batch_timestamp = rb.read_header(self.pread(0, rb.HEADER_SIZE)).max_timestamp
        return self._first_batch_timestamp

    def restore_time_index(self, upto: int) -> None:
        """Time-index entries (and the max timestamp) of the batches below byte ``upto`` that the
        index does not hold: those a power cut took from its tail (a light flush does not fsync
        it). Walks from the batch of the index's last entry, so an intact index costs a few batches."""
        start = 0
        if self.time_index.timestamps:
            start = self.offset_index.lookup(self.base_offset + int(self.time_index.relative_offsets[-1]))
        for pos, header, _data in self.iter_batches(min(start, upto)):
            if pos + header.size > upto:
                break
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.time_index.maybe_append(header.max_timestamp, header.base_offset)

    def load_indexes(self) -> bool:
        """Load both indexes; False if the offset index file was missing (it must be rebuilt)."""
        existed = self.offset_index.path.exists() and self.time_index.path.exists()
        self.offset_index.load(self.size)
        self.time_index.load(2**62)
        self.txn_index.load(2**62)
        if self.time_index.timestamps:
            self.max_timestamp = int(self.time_index.timestamps[-1])
        return existed

    def recover(self, from_position: int, validate: bool, partition: str) -> list[tuple[int, rb.BatchHeader]]:
        """Scan batches from ``from_position``; truncate the file at the first torn or corrupt batch.

        Rebuilds index entries for the scanned range and returns the scanned (position, header)
        pairs, so producer state can replay them. With ``validate`` the CRC of every batch is checked.
        """
        self.offset_index.truncate_to_position(from_position)
        found: list[tuple[int, rb.BatchHeader]] = []
        pos = from_position
        reason = None
        self._bytes_since_index = self.index_interval_bytes
        # The file is read in chunks of _RECOVERY_CHUNK (a batch larger than that alone), not twice
        # per batch: ``buf`` holds the file's bytes from ``buf_pos``.
        buf, buf_pos = b"", pos
        while pos < self.size:
            off = pos - buf_pos
            if off + rb.HEADER_SIZE > len(buf):
                buf, buf_pos, off = self.pread(pos, min(_RECOVERY_CHUNK, self.size - pos)), pos, 0
            if len(buf) - off < rb.HEADER_SIZE:
                reason = "torn batch header"
                break
            header = rb.read_header(buf, off)
            if header.magic != rb.MAGIC_V2 or header.batch_length < rb.HEADER_SIZE - rb.LOG_OVERHEAD:
                reason = f"invalid batch header (magic {header.magic}, length {header.batch_length})"
                break
            if pos + header.size > self.size:
                reason = "torn batch (length past end of file)"
                break
            if header.base_offset < self.next_offset and found:
                reason = f"offset {header.base_offset} goes backwards"
                break
            if not 0 <= header.base_offset - self.base_offset <= header.last_offset - self.base_offset <= _MAX_RELATIVE:
                # Kafka's ensureOffsetInRange: the base offset is not covered by the CRC, and an
                # offset this segment's index cannot hold would fail every later flush.
                reason = f"offsets {header.base_offset}-{header.last_offset} outside the segment's range"
                break
            if validate:
                if off + header.size > len(buf):
                    buf, buf_pos, off = self.pread(pos, min(max(_RECOVERY_CHUNK, header.size), self.size - pos)), pos, 0
                try:
                    rb.validate_batch(buf, off, header)
                except rb.InvalidRecordError as exc:
                    reason = str(exc)
                    break
            if self._bytes_since_index >= self.index_interval_bytes:
                self.offset_index.append(header.base_offset, pos)
                self._bytes_since_index = 0
            self._bytes_since_index += header.size
            if header.max_timestamp > self.max_timestamp:
                self.max_timestamp = header.max_timestamp
                self.time_index.maybe_append(header.max_timestamp, header.base_offset)
            found.append((pos, header))
            self.next_offset = header.last_offset + 1
            pos += header.size
        if pos < self.size:
            log.warning("recovery of %s: truncating segment %s at byte %d (offset %d): %s; %d byte(s) dropped",
                        partition, self.path.name, pos, self.next_offset, reason, self.size - pos)
            fileio.fs.ftruncate(self.fd, pos)
            fileio.fs.fsync(self.fd)
            self.size = pos
            self.truncated = True
            self._first_batch_timestamp = None
        self.time_index.truncate_to_offset(self.next_offset)
        self.offset_index.truncate_to_position(self.size)
        return found

    def last_modified_ms(self) -> int:
        try:
            return int(os.stat(self.path).st_mtime * 1000)
        except FileNotFoundError:
            return -1

    def truncate_all(self) -> None:
        fileio.fs.ftruncate(self.fd, 0)
        self.size = 0
        self._first_batch_timestamp = None
        self.next_offset = self.base_offset
        self.offset_index.truncate_to_position(0)
        self.time_index.truncate_to_offset(self.base_offset)

    def close(self) -> None:
        if self.fd >= 0:
            self.flush()
            self._close_fd()

    def abandon(self) -> None:
        """Close the file without flushing anything (tests: what a killed process leaves behind)."""
        if self.fd >= 0:
            self._close_fd()

    def delete(self) -> None:
        """Remove the segment's files (the caller fsyncs the directory once for all it deleted)."""
        if self.fd >= 0:
            self._close_fd()
        for p in (self.path, self.offset_index.path, self.time_index.path, self.txn_index.path):
            fileio.fs.unlink(p)

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        descriptors.segment_closed()
        fileio.fs.close(fd)

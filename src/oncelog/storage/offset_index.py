"""Sparse indexes of a segment: offset -> file position, and timestamp -> offset.

On disk, ``.index`` holds 8-byte entries (relative offset i32, position i32) and ``.timeindex``
12-byte entries (timestamp i64, relative offset i32), big endian, appended in order. Entries are kept
in memory too (arrays) and appended to the files when the segment is flushed, so an entry is on disk
only if the data it points to was flushed with it. Loading drops any entry that points past the end
of the data or breaks monotonicity: an index is a hint, never a source of truth.
"""

from __future__ import annotations

import bisect
import struct
from array import array
from pathlib import Path

from oncelog.storage import fileio

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class OffsetIndex:
    """Invariant: ``relative_offsets`` and ``positions`` are strictly increasing and equal in length."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.relative_offsets = array("q")
        self.positions = array("q")
        self._persisted = 0

    def load(self, data_size: int) -> None:
        self.relative_offsets = array("q")
        self.positions = array("q")
        raw = fileio.read_file(self.path) or b""
        last_rel, last_pos = -1, -1
        for i in range(len(raw) // _OFFSET_ENTRY.size):
            rel, pos = _OFFSET_ENTRY.unpack_from(raw, i * _OFFSET_ENTRY.size)
            if rel <= last_rel or pos <= last_pos or pos >= data_size:
                break
            self.relative_offsets.append(rel)
            self.positions.append(pos)
            last_rel, last_pos = rel, pos
        self._persisted = len(self.positions)
        if self._persisted * _OFFSET_ENTRY.size != len(raw):
            self._rewrite()

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if self.positions and (rel <= self.relative_offsets[-1] or position <= self.positions[-1]):
            return
        self.relative_offsets.append(rel)
        self.positions.append(position)

    def lookup(self, offset: int) -> int:
        """File position of the last indexed batch whose base offset is <= ``offset`` (0 if none)."""
        i = bisect.bisect_right(self.relative_offsets, offset - self.base_offset) - 1
        return int(self.positions[i]) if i >= 0 else 0

    def truncate_to_position(self, position: int) -> None:
        """Drop entries pointing at or past ``position``."""
        i = bisect.bisect_left(self.positions, position)
        del self.relative_offsets[i:]
        del self.positions[i:]
        if i < self._persisted:
            self._persisted = i
            self._rewrite()

    def flush(self) -> None:
        pending = self.take_pending()
        if pending:
            fileio.fs.append_durable(self.path, pending)

    def take_pending(self) -> bytes:
        """The entries not yet in the file, encoded; from now on they count as written (the caller
        appends them, or the log directory goes offline)."""
        data = b"".join(_OFFSET_ENTRY.pack(self.relative_offsets[i], self.positions[i])
                        for i in range(self._persisted, len(self.positions)))
        self._persisted = len(self.positions)
        return data

    def _rewrite(self) -> None:
        data = b"".join(_OFFSET_ENTRY.pack(r, p) for r, p in zip(self.relative_offsets[: self._persisted],
                                                                  self.positions[: self._persisted],
                                                                  strict=True))
        fileio.fs.write_atomic(self.path, data)


class TimeIndex:
    """Invariant: ``timestamps`` strictly increasing; each maps to the first batch reaching it."""

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.relative_offsets = array("q")
        self._persisted = 0

    def load(self, last_offset: int) -> None:
        self.timestamps = array("q")
        self.relative_offsets = array("q")
        raw = fileio.read_file(self.path) or b""
        for i in range(len(raw) // _TIME_ENTRY.size):
            ts, rel = _TIME_ENTRY.unpack_from(raw, i * _TIME_ENTRY.size)
            if (self.timestamps and ts <= self.timestamps[-1]) or rel + self.base_offset > last_offset:
                break
            self.timestamps.append(ts)
            self.relative_offsets.append(rel)
        self._persisted = len(self.timestamps)
        if self._persisted * _TIME_ENTRY.size != len(raw):
            self._rewrite()

    def maybe_append(self, max_timestamp: int, offset: int) -> None:
        if not self.timestamps or max_timestamp > self.timestamps[-1]:
            self.timestamps.append(max_timestamp)
            self.relative_offsets.append(offset - self.base_offset)

    @property
    def unwritten(self) -> bool:
        """Some entries are in memory only, not yet appended to the file (``take_pending``)."""
        return self._persisted < len(self.timestamps)

    def lookup(self, timestamp: int) -> int:
        """Base offset of a batch at or before the first one whose max timestamp is >= ``timestamp``."""
        i = bisect.bisect_left(self.timestamps, timestamp) - 1
        return self.base_offset + int(self.relative_offsets[i]) if i >= 0 else self.base_offset

    def truncate_to_offset(self, offset: int) -> None:
        i = bisect.bisect_left(self.relative_offsets, offset - self.base_offset)
        del self.timestamps[i:]
        del self.relative_offsets[i:]
        if i < self._persisted:
            self._persisted = i
            self._rewrite()

    def flush(self) -> None:
        pending = self.take_pending()
        if pending:
            fileio.fs.append_durable(self.path, pending)

    def take_pending(self) -> bytes:
        """As :meth:`OffsetIndex.take_pending`."""
        data = b"".join(_TIME_ENTRY.pack(self.timestamps[i], self.relative_offsets[i])
                        for i in range(self._persisted, len(self.timestamps)))
        self._persisted = len(self.timestamps)
        return data

    def _rewrite(self) -> None:
        data = b"".join(_TIME_ENTRY.pack(t, r) for t, r in zip(self.timestamps[: self._persisted],
                                                               self.relative_offsets[: self._persisted],
                                                               strict=True))
        fileio.fs.write_atomic(self.path, data)

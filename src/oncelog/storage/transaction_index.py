"""The aborted-transaction index of a segment (``.txnindex``).

One 32-byte entry per aborted transaction whose ABORT marker is in this segment: producer_id i64,
first_offset i64, last_offset i64 (the marker's offset), last_stable_offset i64 at completion.
read_committed fetches use it to tell clients which producers' data to drop in the range they got.

Durability: entries are kept in memory and appended to the file when the segment is flushed, with
the segment's data, before the recovery point moves past their markers (so an entry is on disk
whenever the marker it describes is below the recovery point). Entries of markers above the
recovery point are rebuilt by replaying the unflushed tail; a missing or short file below it is
detected by the partition log (it records how many entries the flushed prefix holds) and rebuilt
by replaying the log. Loading drops entries whose marker is past the end of the recovered log.

A damaged file below the recovery point (zeroed, overwritten) can hold as many entries as the
snapshot expects: :meth:`TransactionIndex.sanity_check` (Kafka's ``TransactionIndex.sanityCheck``,
stricter) finds entries that cannot describe a marker of this segment, and the partition log then
rebuilds the index from the data; :meth:`TransactionIndex.load` never keeps such an entry.
"""

from __future__ import annotations

import bisect
import struct
from dataclasses import dataclass
from pathlib import Path

from oncelog.storage import fileio

_ENTRY = struct.Struct(">qqqq")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    """Invariant: ``entries`` are in marker (last_offset) order, unique by (producer_id, last_offset),
    each sane for a segment starting at ``base_offset`` (:func:`_insane`); the first ``_persisted`` of
    them are in the file. For :meth:`overlapping` without a scan of every entry:
    ``_suffix_min_first[i]`` is the smallest first_offset of ``entries[i:]``."""

    def __init__(self, path: Path, base_offset: int = 0) -> None:
        self.path = path
        self.base_offset = base_offset
        self.entries: list[AbortedTxn] = []
        self._keys: set[tuple[int, int]] = set()
        self._persisted = 0
        self._suffix_min_first: list[int] = []

    def load(self, log_end_offset: int) -> None:
        """The file's entries whose marker lies below ``log_end_offset``, in order; an entry that is
        insane, out of order or a duplicate is dropped (and the file rewritten without it)."""
        raw = fileio.read_file(self.path) or b""
        self.entries = []
        self._keys = set()
        for i in range(len(raw) // _ENTRY.size):
            e = AbortedTxn(*_ENTRY.unpack_from(raw, i * _ENTRY.size))
            if e.last_offset < log_end_offset and (e.producer_id, e.last_offset) not in self._keys and \
                    (not self.entries or e.last_offset > self.entries[-1].last_offset) and \
                    _insane(e, self.base_offset, log_end_offset) is None:
                self.entries.append(e)
                self._keys.add((e.producer_id, e.last_offset))
        self._persisted = len(self.entries)
        self._reindex()
        if len(self.entries) * _ENTRY.size != len(raw):
            self._rewrite()

    def sanity_check(self, next_offset: int) -> str | None:
        """Why the file cannot be this segment's index of aborted transactions whose markers lie in
        [``base_offset``, ``next_offset``), or None: Kafka's ``sanityCheck`` refuses an entry whose
        last offset is below the segment's base; here every field of every whole entry is checked
        (:func:`_insane`), the markers must be in order, and a transaction's data must precede its
        marker (an entry of zeros, sane for a segment at offset 0, has first offset = marker). A
        torn last entry is not damage (an append a crash cut short): :meth:`load` drops it."""
        raw = fileio.read_file(self.path) or b""
        last = -1
        for i in range(len(raw) // _ENTRY.size):
            e = AbortedTxn(*_ENTRY.unpack_from(raw, i * _ENTRY.size))
            if (reason := _insane(e, self.base_offset, next_offset)) is not None:
                return f"entry {i} {e}: {reason}"
            if e.first_offset == e.last_offset:
                return f"entry {i} {e}: no data before its marker"
            if e.last_offset <= last:
                return f"entry {i} {e}: its marker is not after the previous entry's ({last})"
            last = e.last_offset
        return None

    def append(self, entry: AbortedTxn) -> None:
        """Index an aborted transaction (in memory until :meth:`flush`); a replayed one is ignored."""
        key = (entry.producer_id, entry.last_offset)
        if key in self._keys:
            return
        if self.entries and entry.last_offset < self.entries[-1].last_offset:
            return  # older than what is indexed: replay of a marker already covered
        self.entries.append(entry)
        self._keys.add(key)
        mins = self._suffix_min_first
        mins.append(entry.first_offset)
        i = len(mins) - 2
        while i >= 0 and mins[i] > entry.first_offset:  # a contiguous tail: the suffix minima grow with i
            mins[i] = entry.first_offset
            i -= 1

    @property
    def dirty(self) -> bool:
        return self._persisted != len(self.entries)

    def flush(self) -> None:
        """Append the entries not yet on disk and fsync the file."""
        pending = self.take_pending()
        if pending:
            fileio.fs.append_durable(self.path, pending)

    def take_pending(self) -> bytes:
        """The entries not yet in the file, encoded; from now on they count as written (the caller
        appends them, or the log directory goes offline)."""
        data = b"".join(_pack(e) for e in self.entries[self._persisted:])
        self._persisted = len(self.entries)
        return data

    def truncate_to_offset(self, offset: int) -> None:
        i = bisect.bisect_left(self.entries, offset, key=_last_offset)
        if i == len(self.entries):
            return
        for e in self.entries[i:]:
            self._keys.discard((e.producer_id, e.last_offset))
        del self.entries[i:]
        self._reindex()
        if i < self._persisted:
            self._persisted = i
            self._rewrite()

    def overlapping(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """Entries with ``last_offset >= fetch_offset`` and ``first_offset < upper_bound``: a binary
        search to the first marker at or past ``fetch_offset``, then forward only while some entry
        left can start below ``upper_bound`` (what is visited past that is what is returned, plus
        entries interleaved with them)."""
        out = []
        mins, entries = self._suffix_min_first, self.entries
        for i in range(bisect.bisect_left(entries, fetch_offset, key=_last_offset), len(entries)):
            if mins[i] >= upper_bound:
                break
            if entries[i].first_offset < upper_bound:
                out.append(entries[i])
        return out

    def covers(self, upper_bound: int) -> bool:
        """Whether no marker after this index's last can abort a transaction that began below
        ``upper_bound`` (a fetch's lookup may stop here; Kafka's ``collectAbortedTxns``
        ``isComplete``). An entry's ``last_stable_offset`` is the LSO just before its marker: when it
        is at least ``upper_bound``, every transaction begun below that had ended before the marker
        (the log start then was below ``upper_bound``: it was at most the fetch offset, which is).
        The LSO never moves back, so the last entry has the largest."""
        return bool(self.entries) and self.entries[-1].last_stable_offset >= upper_bound

    def _reindex(self) -> None:
        mins = [e.first_offset for e in self.entries]
        for i in range(len(mins) - 2, -1, -1):
            mins[i] = min(mins[i], mins[i + 1])
        self._suffix_min_first = mins

    def _rewrite(self) -> None:
        if not self.entries and fileio.read_file(self.path) is None:
            return
        fileio.fs.write_atomic(self.path, b"".join(_pack(e) for e in self.entries[:self._persisted]))


def _insane(e: AbortedTxn, base_offset: int, next_offset: int) -> str | None:
    """Why ``e`` cannot describe a transaction aborted by a marker of the segment [``base_offset``,
    ``next_offset``), or None. A transaction's first offset is at most its marker's (it may lie in an
    earlier segment); the last stable offset before the marker was at most the marker's
    offset (it may pass the first offset only where DeleteRecords moved the log start)."""
    if e.producer_id < 0:
        return "negative producer id"
    if not base_offset <= e.last_offset < next_offset:
        return f"marker outside the segment's offsets [{base_offset}, {next_offset})"
    if not 0 <= e.first_offset <= e.last_offset:
        return "first offset not in [0, marker]"
    if not 0 <= e.last_stable_offset <= e.last_offset:
        return "last stable offset not in [0, marker]"
    return None


def _pack(e: AbortedTxn) -> bytes:
    return _ENTRY.pack(e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)


def _last_offset(e: AbortedTxn) -> int:
    return e.last_offset

"""The aborted-transaction index of a segment (``.txnindex``).

One 32-byte entry per aborted transaction whose ABORT marker is in this segment: producer_id i64,
first_offset i64, last_offset i64 (the marker's offset), last_stable_offset i64 at completion.
read_committed fetches use it to tell clients which producers' data to drop in the range they got.
Entries are written when the marker is appended (rare, small); loading drops entries whose marker
is past the end of the recovered log.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

_ENTRY = struct.Struct(">qqqq")


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class TransactionIndex:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[AbortedTxn] = []

    def load(self, log_end_offset: int) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            raw = b""
        self.entries = []
        for i in range(len(raw) // _ENTRY.size):
            e = AbortedTxn(*_ENTRY.unpack_from(raw, i * _ENTRY.size))
            if e.last_offset < log_end_offset:
                self.entries.append(e)
        if len(self.entries) * _ENTRY.size != len(raw):
            self._rewrite()

    def append(self, entry: AbortedTxn, *, sync: bool = False) -> None:
        if any(e.producer_id == entry.producer_id and e.last_offset == entry.last_offset for e in self.entries):
            return  # replayed during recovery: already indexed
        self.entries.append(entry)
        with open(self.path, "ab") as f:
            f.write(_ENTRY.pack(entry.producer_id, entry.first_offset, entry.last_offset,
                                entry.last_stable_offset))
            if sync:
                f.flush()
                os.fsync(f.fileno())

    def truncate_to_offset(self, offset: int) -> None:
        kept = [e for e in self.entries if e.last_offset < offset]
        if len(kept) != len(self.entries):
            self.entries = kept
            self._rewrite()

    def overlapping(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        return [e for e in self.entries if e.last_offset >= fetch_offset and e.first_offset < upper_bound]

    def _rewrite(self) -> None:
        tmp = self.path.with_suffix(".txnindex.tmp")
        tmp.write_bytes(b"".join(_ENTRY.pack(e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
                                 for e in self.entries))
        os.replace(tmp, self.path)

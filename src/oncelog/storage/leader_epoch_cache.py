"""A partition's leader epochs: epoch -> the first offset written in it (Kafka's LeaderEpochFileCache
and its ``leader-epoch-checkpoint``), what OffsetForLeaderEpoch answers from (KIP-101, KIP-320).

On disk, ``<partition dir>/leader-epoch-checkpoint`` is Kafka's text format: a version line (0), the
number of entries, then one "epoch start_offset" line per entry, replaced whole by ``write_atomic``.

Invariants: entries are strictly increasing in both epoch and start offset; an entry describes data
only up to the log end offset (``truncate_from_end``) and from the log start (``truncate_from_start``).
The file is written by the partition's flush after the data it describes is fsynced, so a
checkpoint entry always points at durable data; an entry of the unflushed tail is lost in a crash
and rebuilt from the batch headers that recovery scans (each batch carries its leader epoch).

Only the owning partition log (the broker's event loop) calls it.
"""

from __future__ import annotations

import bisect
import logging
from pathlib import Path

from oncelog.storage import fileio

log = logging.getLogger("oncelog.storage")

CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    def __init__(self, directory: Path) -> None:
        self.path = directory / CHECKPOINT_FILE
        self.epochs: list[int] = []
        self.starts: list[int] = []
        self.dirty = False
        self._read()

    def _read(self) -> None:
        raw = fileio.read_file(self.path)
        if raw is None:
            return
        try:
            lines = raw.decode().split("\n")
            if int(lines[0]) != 0:
                raise ValueError(f"unknown version {lines[0]}")
            for line in lines[2 : 2 + int(lines[1])]:
                epoch, start = (int(x) for x in line.split())
                self.assign(epoch, start)
        except (ValueError, IndexError, UnicodeDecodeError) as exc:
            log.warning("%s is unreadable (%s); leader epochs restart from the log's tail", self.path, exc)
            self.epochs, self.starts = [], []
        self.dirty = False

    def write(self) -> None:
        fileio.fs.write_atomic(*self.take_file())

    def take_file(self) -> tuple[Path, bytes]:
        """(path, content) of the checkpoint file now; it counts as written from now on."""
        body = "\n".join(f"{e} {s}" for e, s in zip(self.epochs, self.starts, strict=True))
        self.dirty = False
        return self.path, f"0\n{len(self.epochs)}\n{body}\n".encode()

    # --- changes -----------------------------------------------------------------------------------
    def assign(self, epoch: int, start_offset: int) -> None:
        """Record that ``epoch`` starts at ``start_offset``; entries that contradict it (a higher or
        equal epoch, or a start at or after it) are dropped, as Kafka does."""
        if epoch < 0 or start_offset < 0:
            return
        if self.epochs and self.epochs[-1] == epoch and self.starts[-1] <= start_offset:
            return
        while self.epochs and (self.epochs[-1] >= epoch or self.starts[-1] >= start_offset):
            self.epochs.pop()
            self.starts.pop()
        self.epochs.append(epoch)
        self.starts.append(start_offset)
        self.dirty = True

    def truncate_from_end(self, end_offset: int) -> None:
        """Drop entries that start at or after ``end_offset`` (the log was truncated there)."""
        while self.starts and self.starts[-1] >= end_offset:
            self.epochs.pop()
            self.starts.pop()
            self.dirty = True

    def truncate_from_start(self, start_offset: int) -> None:
        """The log now starts at ``start_offset``: drop the entries wholly before it and move the
        start of the one that covers it."""
        i = bisect.bisect_right(self.starts, start_offset) - 1
        if i < 0:
            return
        if i > 0 or self.starts[0] != start_offset:
            del self.epochs[:i]
            del self.starts[:i]
            self.starts[0] = start_offset
            self.dirty = True

    # --- queries -----------------------------------------------------------------------------------
    @property
    def latest_epoch(self) -> int:
        return self.epochs[-1] if self.epochs else UNDEFINED_EPOCH

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch the record at ``offset`` was written in (-1 if unknown)."""
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.epochs[i] if i >= 0 else UNDEFINED_EPOCH

    def end_offset_for(self, requested: int, log_end_offset: int) -> tuple[int, int]:
        """(epoch, end offset) for OffsetForLeaderEpoch, as Kafka's ``endOffsetFor``: the largest
        epoch <= ``requested`` and the start of the next epoch (the log end offset if it is the
        latest); (requested, first start) if it is older than every entry; (-1, -1) if unknown."""
        if requested == UNDEFINED_EPOCH or not self.epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested == self.epochs[-1]:
            return requested, log_end_offset
        higher = bisect.bisect_right(self.epochs, requested)
        if higher >= len(self.epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return requested, self.starts[0]
        return self.epochs[higher - 1], self.starts[higher]

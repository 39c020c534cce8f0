"""Producer id allocation that never hands out an id twice, across restarts and kill -9.

Ids are reserved in blocks: before the first id of a block is returned, the end of the block is
written durably (temp file, fsync, rename, fsync dir) to ``path``. After a crash the next block starts
at the recorded end, so at most one block of ids is skipped and none is reused.
"""

from __future__ import annotations

from pathlib import Path

from oncelog.storage import fileio

BLOCK_SIZE = 1000


class ProducerIdManager:
    def __init__(self, path: Path, block_size: int = BLOCK_SIZE) -> None:
        self.path = path
        self.block_size = block_size
        fileio.fs.mkdir(path.parent)
        try:
            text = path.read_text().strip()
        except FileNotFoundError:
            text = "0"
        try:
            self._block_end = int(text)
        except ValueError:
            # Starting from 0 would hand out ids again; refuse to start rather than break fencing.
            raise ValueError(f"producer id block file {path} is corrupt ({text[:40]!r}); "
                             "restore it or set it above every producer id ever issued") from None
        self._next = self._block_end

    def next_producer_id(self) -> int:
        if self._next >= self._block_end:
            new_end = self._next + self.block_size
            self._persist(new_end)
            self._block_end = new_end
        pid = self._next
        self._next += 1
        return pid

    def is_allocated(self, producer_id: int) -> bool:
        """True if ``producer_id`` may have been handed out (by this or an earlier run)."""
        return 0 <= producer_id < self._next

    def ensure_above(self, producer_id: int) -> bool:
        """Never hand out ``producer_id`` or any id below it: one the logs hold (a producer's batches,
        a transactional id's state). A block file lost or restored from an older copy would
        otherwise hand out ids again, and a new producer's first batches would be taken for an old
        one's duplicates. The new start is durable before this returns. True if it moved."""
        if producer_id < self._next:
            return False
        self._next = self._block_end = producer_id + 1
        self._persist(self._block_end)
        return True

    def _persist(self, value: int) -> None:
        fileio.fs.write_atomic(self.path, str(value).encode())


class InMemoryProducerIdManager:
    """Same interface, no persistence (tests)."""

    def __init__(self, start: int = 0) -> None:
        self._next = start

    def next_producer_id(self) -> int:
        pid = self._next
        self._next += 1
        return pid

    def is_allocated(self, producer_id: int) -> bool:
        return 0 <= producer_id < self._next

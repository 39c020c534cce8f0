"""``PartitionLog.aborted_transactions`` walks the segments from the fetch offset's only as far as a
transaction begun below the upper bound can have its marker (Kafka's collectAbortedTransactions
stops when a segment's search is complete), and still finds every overlapping one: a transaction
open across many segments is found at its marker however far that is."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.storage.config import LogConfig
from oncelog.storage.partition_log import AppendOrigin, PartitionLog
from oncelog.storage.transaction_index import TransactionIndex
from tests.storage.helpers import batch, marker

COORD = AppendOrigin.COORDINATOR


def _log(path: Path, *, spanning: bool, seed: int = 0) -> tuple[PartitionLog, list[tuple[int, int, int]]]:
    """Short aborted transactions of two producers, one record each, over many small segments;
    with ``spanning``, a third producer's transaction open from offset 0 until the end."""
    plog = PartitionLog(path, "t", 0, LogConfig(segment_bytes=1500), ManualClock())
    rng = random.Random(seed)
    aborted = []
    seq = {1: 0, 2: 0}
    if spanning:
        plog.append(batch(1, pid=9, epoch=0, seq=0, txn=True))
    for _ in range(300):
        pid = rng.choice((1, 2))
        first = plog.log_end_offset
        plog.append(batch(1, pid=pid, epoch=0, seq=seq[pid], txn=True))
        seq[pid] += 1
        aborted.append((pid, first, plog.log_end_offset))
        plog.append(marker(False, pid, 0), origin=COORD)
    if spanning:
        aborted.append((9, 0, plog.log_end_offset))
        plog.append(marker(False, 9, 0), origin=COORD)
    assert len(plog.segments) > 20
    return plog, aborted


@pytest.mark.parametrize("spanning", [False, True])
def test_every_overlapping_aborted_transaction_is_found(tmp_path: Path, spanning: bool) -> None:
    plog, aborted = _log(tmp_path, spanning=spanning)
    try:
        rng = random.Random(1)
        end = plog.log_end_offset
        for _ in range(500):
            start = rng.randrange(end)
            upper = rng.randrange(start + 1, min(end, start + 50) + 1)
            expected = sorted((pid, first) for pid, first, mark in aborted if mark >= start and first < upper)
            assert sorted(plog.aborted_transactions(start, upper)) == expected, (start, upper)
    finally:
        plog.close()


def test_the_walk_stops_where_the_range_is_complete(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plog, _aborted = _log(tmp_path, spanning=False)
    try:
        visited: list[TransactionIndex] = []
        real = TransactionIndex.overlapping

        def counting(self: TransactionIndex, fetch_offset: int, upper_bound: int) -> list:  # type: ignore[type-arg]
            visited.append(self)
            return real(self, fetch_offset, upper_bound)

        monkeypatch.setattr(TransactionIndex, "overlapping", counting)
        for start in (0, plog.log_end_offset // 2):
            visited.clear()
            assert plog.aborted_transactions(start, start + 4)
            assert len(visited) <= 2, (start, len(visited), len(plog.segments))
    finally:
        plog.close()

"""Segments damaged below the recovery point (a file cut short, a length field overwritten, a zeroed
``.txnindex``), each between a close and a reopen of a ``PartitionLog``. As in Kafka: the log end
comes from the data, never from the recovery point (``LogLoader``), a corrupt aborted-transaction
index is rebuilt from the data (``TransactionIndex.sanityCheck``), and a batch running past the
end of a segment ends that segment for reads (``FileLogInputStream.nextBatch``)."""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.protocol import records as rb
from oncelog.storage.config import LogConfig
from oncelog.storage.partition_log import SNAPSHOT_FILE, AppendOrigin, PartitionLog
from oncelog.storage.transaction_index import AbortedTxn, TransactionIndex
from tests.storage.helpers import batch, marker, offsets_in

PID = 4000
PID2 = 4001


def open_log(path: Path, checkpointed_recovery_point: int | None = None, **cfg: int) -> PartitionLog:
    return PartitionLog(path, "t", 0, LogConfig(**cfg), ManualClock(),  # type: ignore[arg-type]
                        checkpointed_recovery_point=checkpointed_recovery_point)


def batches_of(path: Path) -> list[tuple[int, rb.BatchHeader]]:
    return list(rb.iter_headers(path.read_bytes()))


def read_all(plog: PartitionLog) -> list[int]:
    """Base offsets of every batch a consumer reading from the log start gets, fetch after fetch."""
    got: list[int] = []
    offset = plog.log_start_offset
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).records
        if not data:
            break
        got += offsets_in(data)
        offset = [h.last_offset for _, h in rb.iter_headers(data)][-1] + 1
    return got


def _cut_active(tmp_path: Path, *, inside_batch: bool) -> tuple[Path, int]:
    """Close a log of ten 2-record batches in several segments (a snapshot at the log end: recovery point
    20), then cut its active segment inside (or just before) its second batch. Returns the segment
    and the offset the data now ends at."""
    plog = open_log(tmp_path, segment_bytes=700)
    for _ in range(10):
        plog.append(batch(2, size=100))
    assert len(plog.segments) >= 3 and len(batches_of(plog.active.path)) >= 2
    plog.close()
    active = sorted(tmp_path.glob("*.log"))[-1]
    pos, header = batches_of(active)[1]
    os.truncate(active, pos + (header.size // 2 if inside_batch else 0))
    return active, header.base_offset


@pytest.mark.parametrize("inside_batch", [True, False])
def test_an_active_segment_cut_below_the_recovery_point_ends_where_its_data_ends(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, inside_batch: bool) -> None:
    """A clean stop leaves the recovery point at the log end; the active segment's file then loses
    its tail (torn inside a batch, or cut between two). The log end used to stay at the recovery
    point: phantom offsets, and the next append went after the torn bytes, unreadable."""
    active, end = _cut_active(tmp_path, inside_batch=inside_batch)
    caplog.set_level(logging.WARNING, "oncelog.storage")
    plog = open_log(tmp_path, segment_bytes=700)
    assert plog.log_end_offset == end and plog.recovery_point <= end
    assert "t-0" in caplog.text and active.name in caplog.text
    assert plog.append(batch(1)).base_offset == end
    assert read_all(plog) == [*range(0, end, 2), end]
    plog.close()
    again = open_log(tmp_path, segment_bytes=700)
    assert again.log_end_offset == end + 1 and read_all(again) == [*range(0, end, 2), end]
    again.close()


def test_an_active_segment_cut_after_a_kill_is_validated_from_its_start(tmp_path: Path) -> None:
    """The same cut after a kill: the snapshot is at the recovery point, batches above it were
    never flushed; the end comes from the data, the producer state from the batches left."""
    plog = open_log(tmp_path, segment_bytes=1000)
    for seq in range(0, 16, 2):
        plog.append(batch(2, size=100, pid=PID, epoch=0, seq=seq))
    plog.flush()
    plog.append(batch(2, size=100, pid=PID, epoch=0, seq=16))
    assert plog.recovery_point == 16 and len(batches_of(plog.active.path)) == 3
    for seg in plog.segments:
        seg.abandon()
    active = sorted(tmp_path.glob("*.log"))[-1]
    pos, header = batches_of(active)[1]
    os.truncate(active, pos + 10)
    again = open_log(tmp_path, segment_bytes=1000)
    end = header.base_offset
    assert again.log_end_offset == end
    # The producer's next sequence is the one after the last batch left, not a duplicate of a lost one.
    result = again.append(batch(2, size=100, pid=PID, epoch=0, seq=end))
    assert not result.duplicate and result.base_offset == end
    assert read_all(again)[-1] == end


def test_a_snapshot_past_the_data_is_not_trusted(tmp_path: Path) -> None:
    """The snapshot written at the clean stop covers batches the cut removed: an idempotent
    producer's retry of a lost batch must be written again, not answered as a duplicate at
    offsets that no longer exist."""
    plog = open_log(tmp_path, segment_bytes=700)
    for seq in range(0, 20, 2):
        plog.append(batch(2, size=100, pid=PID, epoch=0, seq=seq))
    plog.close()
    assert (tmp_path / SNAPSHOT_FILE).exists()
    active = sorted(tmp_path.glob("*.log"))[-1]
    pos, header = batches_of(active)[1]
    os.truncate(active, pos + header.size // 2)
    again = open_log(tmp_path, segment_bytes=700)
    lost = header.base_offset
    retry = again.append(batch(2, size=100, pid=PID, epoch=0, seq=lost))
    assert not retry.duplicate and retry.base_offset == lost
    assert again.append(batch(2, size=100, pid=PID, epoch=0, seq=lost - 2)).duplicate


def test_a_checkpointed_recovery_point_past_the_data_is_clamped_to_the_log_end(tmp_path: Path) -> None:
    """A well-formed checkpoint value above the log end (1150 for a log of 20): no phantom offsets."""
    plog = open_log(tmp_path, segment_bytes=700)
    for _ in range(10):
        plog.append(batch(2, size=100))
    plog.close()
    again = open_log(tmp_path, checkpointed_recovery_point=1150, segment_bytes=700)
    assert again.log_end_offset == 20 and again.recovery_point == 20
    assert again.append(batch(1)).base_offset == 20
    assert read_all(again) == [*range(0, 20, 2), 20]


def _aborted_log(tmp_path: Path) -> PartitionLog:
    """Two segments, each with one aborted transaction (so each ``.txnindex`` holds one entry):
    PID2's at offsets 0-2 (marker 3) in the first, PID's at 8-10 (marker 11) in the second (base 6)."""
    plog = open_log(tmp_path)
    plog.append(batch(3, pid=PID2, epoch=0, seq=0, txn=True, value=b"ABORTED"))
    plog.append(marker(False, PID2, 0), origin=AppendOrigin.COORDINATOR)
    plog.append(batch(2))
    plog.roll()
    plog.append(batch(2))
    plog.append(batch(3, pid=PID, epoch=0, seq=0, txn=True, value=b"ABORTED"))
    plog.append(marker(False, PID, 0), origin=AppendOrigin.COORDINATOR)
    plog.append(batch(1))
    assert plog.aborted_transactions(0, plog.log_end_offset) == [(PID2, 0), (PID, 8)]
    return plog


@pytest.mark.parametrize("damage", ["zero", "negative", "zero-no-snapshot", "zero-first-segment"])
def test_a_damaged_aborted_index_below_the_recovery_point_is_rebuilt(tmp_path: Path, damage: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A zeroed (or overwritten) ``.txnindex`` keeps its entry count, so the snapshot's count
    check passed and read_committed consumers saw the aborted records."""
    _aborted_log(tmp_path).close()
    base, entry = (0, (PID2, 0, 3, 0)) if damage.endswith("first-segment") else (6, (PID, 8, 11, 8))
    index = tmp_path / f"{base:020d}.txnindex"
    assert index.read_bytes() == struct.pack(">qqqq", *entry)
    index.write_bytes(b"\0" * 32 if damage.startswith("zero") else struct.pack(">qqqq", 7, -100, -1, 0))
    if damage.endswith("no-snapshot"):
        (tmp_path / SNAPSHOT_FILE).unlink()
    caplog.set_level(logging.WARNING, "oncelog.storage")
    again = open_log(tmp_path)
    assert again.aborted_transactions(0, again.log_end_offset) == [(PID2, 0), (PID, 8)]
    assert "corrupt" in caplog.text and index.name in caplog.text
    again.close()
    assert index.read_bytes() == struct.pack(">qqqq", *entry)


def test_the_sanity_check_refuses_entries_outside_the_segment(tmp_path: Path) -> None:
    path = tmp_path / "x.txnindex"
    index = TransactionIndex(path, base_offset=100)
    good = AbortedTxn(PID, 90, 105, 90)  # begun in an earlier segment, aborted in this one
    for entries, ok in [([good], True), ([], True),
                        ([AbortedTxn(0, 0, 0, 0)], False),  # zeroed: marker below the base
                        ([good, AbortedTxn(PID, 107, 107, 106)], False),  # no data before the marker
                        ([AbortedTxn(PID, 101, 200, 101)], False),  # marker in the next segment
                        ([AbortedTxn(PID, 106, 105, 90)], False),
                        ([AbortedTxn(-1, 90, 105, 90)], False),
                        ([AbortedTxn(PID, 90, 105, 106)], False),
                        ([good, AbortedTxn(PID, 101, 104, 101)], False)]:  # markers out of order
        path.write_bytes(b"".join(struct.pack(">qqqq", e.producer_id, e.first_offset, e.last_offset,
                                              e.last_stable_offset) for e in entries))
        assert (index.sanity_check(200) is None) == ok, entries
        index.load(200)
        assert index.entries == (entries if ok else [e for e in entries if e == good or e.first_offset == 107])
    path.write_bytes(bytes(32))
    assert TransactionIndex(path, base_offset=0).sanity_check(200) is not None  # zeros, at offset 0 too


@pytest.mark.parametrize("damage", ["length", "truncate"])
def test_a_batch_running_past_its_segment_ends_that_segment_for_reads(tmp_path: Path, damage: str) -> None:
    """A batch of a non-active segment below the recovery point whose length field was damaged, or
    which a cut left incomplete: a fetch at its offset answered no records, for ever. Now the read
    goes on with the next segment, as Kafka's does; batches before the damage are still read."""
    plog = open_log(tmp_path, segment_bytes=700)
    for _ in range(10):
        plog.append(batch(2, size=100))
    plog.close()
    first = sorted(tmp_path.glob("*.log"))[0]
    pos, header = batches_of(first)[1]
    if damage == "length":
        data = bytearray(first.read_bytes())
        data[pos + 8] ^= 0x01  # the batch length's high byte: 16 MiB more
        first.write_bytes(data)
    else:
        os.truncate(first, pos + header.size // 2)
    again = open_log(tmp_path, segment_bytes=700)
    next_base = again.segments[1].base_offset
    assert offsets_in(again.read(0, 1 << 20).records) == [0]
    read = again.read(header.base_offset, 1 << 20)
    assert read.first_offset == next_base and offsets_in(read.records)[0] == next_base
    assert read_all(again) == [0, *range(next_base, 20, 2)]


def test_a_log_start_past_the_recovered_data_starts_the_log_again_there(tmp_path: Path) -> None:
    """DeleteRecords makes the new log start durable at once; the records below it are fsynced
    later. A power cut in between (a probe, through the crash file system) left the log start at
    10 and the log end at 0: appends got offsets 0.. below the start, and no fetch could reach
    them. As Kafka's deleteSegmentsIfLogStartGreaterThanLogEnd, the log starts again, empty, at its
    start; the producer state starts empty there too."""
    plog = open_log(tmp_path)
    for seq in range(0, 10, 2):
        plog.append(batch(2, pid=PID, epoch=0, seq=seq))
    assert plog.delete_records(10) == 10
    segment = plog.segments[0].path
    for seg in plog.segments:
        seg.abandon()
    os.truncate(segment, 0)  # what the power cut left of the unfsynced records
    again = open_log(tmp_path)
    assert (again.log_start_offset, again.log_end_offset, again.recovery_point) == (10, 10, 10)
    assert not again.producer_state.producers
    assert again.append(batch(1)).base_offset == 10
    assert read_all(again) == [10]
    again.close()
    third = open_log(tmp_path)  # and it stays so
    assert (third.log_start_offset, third.log_end_offset) == (10, 11) and read_all(third) == [10]

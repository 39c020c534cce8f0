from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.storage.config import LogConfig
from oncelog.storage.errors import ProducerStateError
from oncelog.storage.partition_log import AppendOrigin, PartitionLog
from tests.storage.helpers import batch, marker

COORD = AppendOrigin.COORDINATOR


def open_log(path: Path) -> PartitionLog:
    return PartitionLog(path, "t", 0, LogConfig(), ManualClock())


def _error(plog: PartitionLog, data: bytes) -> int:
    with pytest.raises(ProducerStateError) as e:
        plog.append(data)
    return e.value.error_code


def test_retry_of_any_of_last_five_batches_is_a_duplicate_with_original_offsets(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    firsts = []
    for i in range(6):
        firsts.append(plog.append(batch(2, pid=7, epoch=0, seq=2 * i)).base_offset)
    for i in range(1, 6):
        r = plog.append(batch(2, pid=7, epoch=0, seq=2 * i))
        assert r.duplicate and r.base_offset == firsts[i]
    assert plog.log_end_offset == 12
    # the 6th-oldest batch fell out of the window: no longer recognised, and out of order
    assert _error(plog, batch(2, pid=7, epoch=0, seq=0)) == ErrorCode.out_of_order_sequence_number


def test_gap_in_sequence_is_out_of_order(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1, pid=1, epoch=0, seq=0))
    assert _error(plog, batch(1, pid=1, epoch=0, seq=2)) == ErrorCode.out_of_order_sequence_number
    assert plog.log_end_offset == 1


def test_unknown_producer_may_start_anywhere_and_sequence_wraps(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(2, pid=3, epoch=0, seq=2**31 - 2))
    plog.append(batch(1, pid=3, epoch=0, seq=0))
    assert plog.log_end_offset == 3


def test_epochs_fence_and_new_epoch_starts_at_zero(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1, pid=5, epoch=1, seq=0))
    assert _error(plog, batch(1, pid=5, epoch=0, seq=1)) == ErrorCode.invalid_producer_epoch
    assert _error(plog, batch(1, pid=5, epoch=2, seq=3)) == ErrorCode.out_of_order_sequence_number
    plog.append(batch(1, pid=5, epoch=2, seq=0))
    assert plog.log_end_offset == 2


def test_transaction_holds_lso_until_its_marker(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1))
    plog.append(batch(2, pid=9, epoch=0, seq=0, txn=True))  # offsets 1-2
    plog.append(batch(1))  # 3, non-transactional from someone else
    assert plog.last_stable_offset == 1 and plog.high_watermark == 4
    plog.append(batch(1, pid=9, epoch=0, seq=2, txn=True))
    assert plog.last_stable_offset == 1
    plog.append(marker(True, 9, 0), origin=COORD)  # offset 5
    assert plog.last_stable_offset == plog.high_watermark == 6
    assert plog.aborted_transactions(0, 6) == []


def test_aborted_transactions_are_indexed_and_survive_reopen(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(2, pid=4, epoch=0, seq=0, txn=True))  # 0-1
    plog.append(batch(1, pid=6, epoch=0, seq=0, txn=True))  # 2
    plog.append(marker(False, 4, 0), origin=COORD)  # 3
    plog.append(marker(True, 6, 0), origin=COORD)  # 4
    plog.append(batch(1, pid=4, epoch=1, seq=0, txn=True))  # 5
    plog.append(marker(False, 4, 1), origin=COORD)  # 6
    assert plog.aborted_transactions(0, 7) == [(4, 0), (4, 5)]
    assert plog.aborted_transactions(4, 5) == []
    assert plog.aborted_transactions(5, 7) == [(4, 5)]
    plog.close()
    again = open_log(tmp_path)
    assert again.aborted_transactions(0, 7) == [(4, 0), (4, 5)]
    assert again.last_stable_offset == 7


def test_non_transactional_write_during_a_transaction_is_refused(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1, pid=2, epoch=0, seq=0, txn=True))
    assert _error(plog, batch(1, pid=2, epoch=0, seq=1)) == ErrorCode.invalid_txn_state


def test_stale_marker_and_client_control_batches_are_refused(tmp_path: Path) -> None:
    from oncelog.protocol.records import InvalidRecordError

    plog = open_log(tmp_path)
    plog.append(batch(1, pid=2, epoch=3, seq=0, txn=True))
    with pytest.raises(ProducerStateError):
        plog.append(marker(True, 2, 1), origin=COORD)
    with pytest.raises(InvalidRecordError):
        plog.append(marker(True, 2, 3))
    assert plog.last_stable_offset == 0


@pytest.mark.parametrize("flush_first", [True, False])
def test_producer_state_is_rebuilt_after_a_crash(tmp_path: Path, flush_first: bool) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1, pid=1, epoch=0, seq=0))
    plog.append(batch(1, pid=2, epoch=0, seq=0, txn=True))
    if flush_first:
        plog.flush()
    plog.append(batch(1, pid=1, epoch=0, seq=1))
    plog.append(batch(1, pid=3, epoch=0, seq=0, txn=True))
    plog.append(marker(False, 3, 0), origin=COORD)
    # crash: no close()
    again = open_log(tmp_path)
    assert again.log_end_offset == 5
    assert again.last_stable_offset == 1  # pid 2's transaction is still open
    assert again.append(batch(1, pid=1, epoch=0, seq=1)).duplicate
    assert _error(again, batch(1, pid=1, epoch=0, seq=5)) == ErrorCode.out_of_order_sequence_number
    assert again.aborted_transactions(0, 5) == [(3, 3)]


def test_torn_tail_truncation_rewinds_producer_state(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1, pid=1, epoch=0, seq=0))
    plog.flush()
    plog.append(batch(1, pid=1, epoch=0, seq=1))
    seg = tmp_path / "00000000000000000000.log"
    data = seg.read_bytes()
    seg.write_bytes(data[:-5])  # the second batch is torn
    again = open_log(tmp_path)
    assert again.log_end_offset == 1
    # seq 1 is not a duplicate any more: it was lost, so the retry is accepted as new
    r = again.append(batch(1, pid=1, epoch=0, seq=1))
    assert not r.duplicate and r.base_offset == 1


def test_expiration_keeps_producers_with_open_transactions(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1, pid=1, epoch=0, seq=0, ts=1000))
    plog.append(batch(1, pid=2, epoch=0, seq=0, ts=1000, txn=True))
    assert plog.remove_expired_producers(10_000, 5_000) == 1
    assert [p.producer_id for p in plog.producers()] == [2]

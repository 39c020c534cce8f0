from __future__ import annotations

from pathlib import Path

from oncelog.coordinator.producer_ids import InMemoryProducerIdManager, ProducerIdManager


def test_ids_never_reused_across_reopen(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    seen: set[int] = set()
    for _ in range(3):
        # Dropping the manager without any shutdown step stands in for kill -9.
        mgr = ProducerIdManager(path, block_size=10)
        for _ in range(7):
            pid = mgr.next_producer_id()
            assert pid not in seen
            seen.add(pid)
    assert len(seen) == 21


def test_block_end_persisted_before_first_id_of_block(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    mgr = ProducerIdManager(path, block_size=10)
    first = mgr.next_producer_id()
    assert int(path.read_text()) >= first + 1
    for _ in range(10):
        last = mgr.next_producer_id()
    assert int(path.read_text()) > last


def test_in_memory_variant_is_unique() -> None:
    mgr = InMemoryProducerIdManager()
    ids = [mgr.next_producer_id() for _ in range(100)]
    assert len(set(ids)) == 100


def test_a_corrupt_block_file_refuses_to_start_instead_of_reusing_ids(tmp_path: Path) -> None:
    import pytest

    path = tmp_path / "producer_ids"
    path.write_text("garbage")
    with pytest.raises(ValueError, match="corrupt"):
        ProducerIdManager(path)


def test_a_lost_block_file_does_not_hand_out_the_ids_the_logs_hold(tmp_path: Path) -> None:
    """A lost (or older) block file used to start ids from 0 again: a new idempotent producer got an
    old producer's id and epoch, and its first batch (sequence 0) was acknowledged as a duplicate of
    the old producer's and never written. Found by an adversarial probe that deleted the file."""
    from tests.inproc import InProcessBroker
    from tests.storage.helpers import batch

    b = InProcessBroker(tmp_path / "d")
    try:
        b.create_topic("t", 1)
        err, old_pid, _ = b.init_producer_id(None)
        assert err == 0 and b.produce("t", 0, batch(pid=old_pid, epoch=0, seq=0, value=b"old")) == 0
        err, txn_pid, _ = b.init_producer_id("tx")  # held only by the transaction log's state
        assert err == 0
        written = [b"old"]
        for restart_clean in (False, True):
            (tmp_path / "d" / "__meta" / "producer_ids").unlink()
            b.restart(clean=restart_clean)
            err, new_pid, epoch = b.init_producer_id(None)
            assert err == 0 and new_pid > max(old_pid, txn_pid), (new_pid, old_pid, txn_pid)
            written.append(b"new%d" % new_pid)
            assert b.produce("t", 0, batch(pid=new_pid, epoch=epoch, seq=0, value=written[-1])) == 0
            old_pid = new_pid
        assert b.visible_values("t", 0) == written
    finally:
        b.close()


def test_ensure_above_moves_the_next_id_durably(tmp_path: Path) -> None:
    path = tmp_path / "producer_ids"
    mgr = ProducerIdManager(path, block_size=10)
    assert mgr.next_producer_id() == 0
    assert not mgr.ensure_above(-1) and not mgr.ensure_above(0)
    assert mgr.ensure_above(41)
    assert mgr.is_allocated(41) and not mgr.is_allocated(42)
    assert int(path.read_text()) == 42
    assert ProducerIdManager(path, block_size=10).next_producer_id() == 42

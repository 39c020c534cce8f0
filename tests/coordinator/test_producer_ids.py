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

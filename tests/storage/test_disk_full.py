"""A client filling the disk is answered with an error; the broker keeps running (``LogDirState``).

Before: on a full file system a produce's short write raised a plain OSError out of the handler (the
connection was closed as for an internal error) after its index entries were already taken, and a
write that failed with ENOSPC took the log directory offline and stopped the broker. Checked by
hand on a 20 MiB tmpfs (a broker process filling it with 100 KB records): with
``log_dir_min_free_bytes`` the produces past it are refused with KAFKA_STORAGE_ERROR, and without it
the short write is refused the same way; the broker stops cleanly afterwards in both cases. Here the
file system is simulated (free space, short and failed writes), so that the tests run anywhere.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.storage import fileio
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

STORAGE_ERROR = 56
T = "t"


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic(T, 1)
    yield broker
    broker.close()


def _produce(b: InProcessBroker, value: bytes, **kw: Any) -> Any:
    r = b.call(0, 9, {"transactional_id": kw.get("tid"), "acks": -1, "timeout": 5000, "topic_data": [
        {"name": T, "partition_data": [{"index": 0, "records": batch(value=value, **kw.get("batch", {}))}]}]})
    return r.responses[0].partition_responses[0]


def test_produces_past_the_free_space_kept_are_refused_and_markers_still_land(b: InProcessBroker) -> None:
    err, pid, epoch = b.init_producer_id("tx")
    assert err == 0 and b.add_partitions("tx", pid, epoch, [(T, 0)]) == {(T, 0): 0}
    assert _produce(b, b"in-txn", tid="tx", batch={"pid": pid, "epoch": epoch, "seq": 0, "txn": True}).error_code == 0
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    end = plog.log_end_offset
    b.broker.logs.dir_state.min_free_bytes = 1 << 62  # the disk is "full" from here on
    refused = _produce(b, b"refused")
    assert refused.error_code == STORAGE_ERROR
    assert "not enough free space" in refused.error_message and "log_dir_min_free_bytes" in refused.error_message
    assert plog.log_end_offset == end
    assert b.end_txn("tx", pid, epoch, commit=True) == 0  # the marker is the broker's own record
    assert plog.log_end_offset == end + 1
    assert b.broker.storage_failure is None
    b.broker.logs.dir_state.min_free_bytes = 0
    assert _produce(b, b"after").error_code == 0
    assert b.visible_values(T, 0) == [b"in-txn", b"after"]


@pytest.mark.parametrize("how", ["short", "enospc"])
def test_a_write_the_disk_cuts_short_is_refused_and_leaves_nothing(b: InProcessBroker, how: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    b.broker.logs.dir_state.min_free_bytes = 0  # the check off: the disk itself says it is full
    assert _produce(b, b"first").error_code == 0
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    real_pwrite = fileio.fs.pwrite
    end, size, index_entries = plog.log_end_offset, plog.active.size, len(plog.active.offset_index.positions)

    def full(fd: int, data: Any, position: int) -> int:
        if how == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, bytes(data)[: len(data) // 2], position)

    monkeypatch.setattr(fileio.fs, "pwrite", full)
    refused = _produce(b, b"cut" * 1000)
    assert refused.error_code == STORAGE_ERROR
    assert "full" in refused.error_message or "No space" in refused.error_message
    assert (plog.log_end_offset, plog.active.size) == (end, size)
    assert len(plog.active.offset_index.positions) == index_entries
    assert plog.active.path.stat().st_size == size  # the short write was truncated away
    assert b.broker.storage_failure is None and b.broker.logs.dir_state.offline_reason is None
    monkeypatch.undo()
    assert _produce(b, b"second").error_code == 0
    assert b.visible_values(T, 0) == [b"first", b"second"]
    b.restart()
    assert b.visible_values(T, 0) == [b"first", b"second"]


def test_a_file_system_that_reports_no_size_is_not_taken_for_a_full_one(b: InProcessBroker,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """LazyFS (the power-cut tests' file system) answers statvfs with zeros: 0 bytes free. The bound
    is then not applied, instead of every produce being refused (found by the LazyFS power cuts)."""
    import os

    zeros = os.statvfs_result((0,) * 10)
    monkeypatch.setattr(os, "statvfs", lambda _path: zeros)
    b.broker.logs.dir_state.min_free_bytes = 1 << 20
    assert _produce(b, b"kept").error_code == 0
    assert b.visible_values(T, 0) == [b"kept"]

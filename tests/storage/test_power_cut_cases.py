"""The power-cut cases of the hardening review, each as found (background fsync, the default),
replayed deterministically on the recording file system (tests/storage/crashfs.py). The random
rounds in test_power_cut.py generalise them."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.storage import fileio
from tests.inproc import InProcessBroker
from tests.storage.crashfs import CrashFS, PowerCut
from tests.storage.helpers import batch


@pytest.fixture
def crashfs(tmp_path: Path) -> Iterator[CrashFS]:
    saved = fileio.fs
    fs = CrashFS(tmp_path / "before")
    fileio.fs = fs
    yield fs
    fileio.fs = saved


def _txn(b: InProcessBroker, tid: str, parts: list[tuple[str, int]], value: bytes, commit: bool) -> int:
    err, pid, epoch = b.init_producer_id(tid)
    assert err == 0
    assert not any(b.add_partitions(tid, pid, epoch, parts).values())
    for t, p in parts:
        assert b.produce(t, p, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=value), transactional_id=tid) == 0
    return b.end_txn(tid, pid, epoch, commit)


def _cut_and_restart(b: InProcessBroker, fs: CrashFS, tmp_path: Path) -> InProcessBroker:
    b.broker.release_data_dir()
    fs.materialize(tmp_path / "after", random.Random(0), writeback=0.0)
    fileio.fs = fileio.FileSystem()
    return InProcessBroker(tmp_path / "after", clock=b.clock)


def test_aborted_transaction_stays_invisible_after_a_power_cut(crashfs: CrashFS, tmp_path: Path) -> None:
    """Abort one transaction, commit another, let the background flush run, cut: the ABORT's index
    entry used to stay in the page cache while the recovery point moved past it."""
    b = InProcessBroker(crashfs.root)
    b.create_topic("t", 1)
    assert _txn(b, "a", [("t", 0)], b"ABORTED-1", commit=False) == 0
    assert _txn(b, "c", [("t", 0)], b"COMMITTED-1", commit=True) == 0
    b.clock.advance(2500)
    b.broker.logs.flush_all(b.clock.now_ms())
    b2 = _cut_and_restart(b, crashfs, tmp_path)
    assert b2.visible_values("t", 0) == [b"COMMITTED-1"]
    b2.close()


@pytest.mark.parametrize("cut_at", range(1, 30))
def test_a_commit_is_never_torn_by_a_cut_during_the_background_flush(crashfs: CrashFS, tmp_path: Path,
                                                                      cut_at: int) -> None:
    """flush_all fsyncs partition by partition (__transaction_state first): a cut in the middle used
    to leave CompleteCommit and one partition's marker durable and another's records lost."""
    b = InProcessBroker(crashfs.root)
    b.create_topic("t", 3)
    code = _txn(b, "x", [("t", 0), ("t", 1), ("t", 2)], b"X", commit=True)
    assert code == 0
    b.clock.advance(1000)
    crashfs.cut_after(cut_at)
    try:
        b.broker.logs.flush_all(b.clock.now_ms())
    except PowerCut:
        pass
    b2 = _cut_and_restart(b, crashfs, tmp_path)
    # the commit was acknowledged: it is whole in every partition, whatever the flush had done
    assert [b2.visible_values("t", p) for p in range(3)] == [[b"X"], [b"X"], [b"X"]]
    b2.close()


def test_a_retried_commit_after_a_power_cut_is_not_answered_ok_for_lost_data(crashfs: CrashFS,
                                                                             tmp_path: Path) -> None:
    """A transaction whose records were not yet flushed, then a cut, then the client's EndTxn(commit)
    after the restart: it used to find the previous CompleteCommit (same epoch) and answer OK."""
    b = InProcessBroker(crashfs.root)
    b.create_topic("t", 2)
    assert _txn(b, "tx", [("t", 0), ("t", 1)], b"first", commit=True) == 0
    err, pid, epoch = b.init_producer_id("tx", *_current(b, "tx"))
    assert err == 0
    b.add_partitions("tx", pid, epoch, [("t", 0), ("t", 1)])
    for p in (0, 1):
        assert b.produce("t", p, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"second"),
                         transactional_id="tx") == 0
    b2 = _cut_and_restart(b, crashfs, tmp_path)  # before the client's EndTxn
    code = b2.end_txn("tx", pid, epoch, True)
    shown = [b2.visible_values("t", p) for p in (0, 1)]
    if code == 0:
        assert shown == [[b"first", b"second"], [b"first", b"second"]]
    else:
        assert shown == [[b"first"], [b"first"]]
    b2.close()


def _current(b: InProcessBroker, tid: str) -> tuple[int, int]:
    meta = b.broker.coordination.txn.state_of(tid)
    assert meta is not None
    return meta.producer_id, meta.producer_epoch


@pytest.mark.parametrize("records", [12, 9], ids=["flushed-since-the-roll", "cut-right-after-a-roll"])
def test_segment_max_timestamps_survive_a_power_cut_after_light_flushes(
        crashfs: CrashFS, tmp_path: Path, records: int) -> None:
    """A light flush leaves time-index entries to writeback, but a segment's max timestamp was read
    back from its time index alone: after a cut the segments below the recovery point had none,
    so ListOffsets by time skipped their records (a probe: t0+1h answered 8, not 1) and time
    retention waited for them (or, with a front left, deleted early). A rolled segment's time index
    is now fsynced by the flush that passes it, and the load walks what may still lack entries
    (with 9 records the cut comes after the roll at offset 8, before any flush saw it: the segment
    before the recovery point's is then walked)."""
    hour = 3_600_000
    b = InProcessBroker(crashfs.root, log_segment_bytes=700)
    b.create_topic("t", 1)
    b.broker.logs.flush_all(b.clock.now_ms(), force=True)
    t0 = b.clock.now_ms()
    for i in range(records):  # one record an hour, four to a segment, a light flush before each
        b.clock.advance(1_000)
        flush_pass = b.broker.logs.begin_flush_pass(b.clock.now_ms())
        if flush_pass is not None:
            flush_pass.run()
            b.broker.logs.finish_flush_pass(flush_pass)
        assert b.produce("t", 0, batch(1, value=b"r%02d" % i, size=100, ts=t0 + i * hour)) == 0
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and [s.base_offset for s in plog.segments] == [0, 4, 8]
    plog.sync()  # as an acknowledgement under flush.messages=1 does: the data and the roll's name, no index
    assert plog.recovery_point == records - 1
    b2 = _cut_and_restart(b, crashfs, tmp_path)
    plog2 = b2.broker.logs.get_partition("t", 0)
    assert plog2 is not None
    assert [(s.base_offset, s.max_timestamp) for s in plog2.segments[:2]] == [(0, t0 + 3 * hour), (4, t0 + 7 * hour)]
    for i in (1, 5):
        found = plog2.offset_for_timestamp(t0 + i * hour)
        assert found is not None and found[0] == i
    b2.close()

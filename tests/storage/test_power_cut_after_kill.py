"""A kill -9, a restart, then a power cut: what recovery read back from the page cache after the kill
was never fsynced, so whatever moves a recovery point past it (a flush, a sync an acknowledgement
waits for, a clean stop) must fsync it first, data and indexes (probe s37, LazyFS: s4_kill_then_cut,
s4c_dup_ack, s8_torn_txn, s3b_timeindex_retention).

On the recording file system (tests/storage/crashfs.py) a kill is ``InProcessBroker.restart()``
with the same ``CrashFS`` left in place: the new broker reads the unsynced writes back (the page
cache survived), and they stay unsynced until something fsyncs them. A power cut is
``_power_cut``: only what was fsynced survives (writeback 0, LazyFS's clear-cache).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.storage import fileio
from tests.inproc import InProcessBroker
from tests.storage.crashfs import CrashFS
from tests.storage.helpers import batch

HOUR = 3_600_000


@pytest.fixture
def crashfs(tmp_path: Path) -> Iterator[CrashFS]:
    saved = fileio.fs
    fs = CrashFS(tmp_path / "disk0")
    fileio.fs = fs
    yield fs
    fileio.fs = saved


def _power_cut(b: InProcessBroker, fs: CrashFS, tmp_path: Path, **config: Any) -> tuple[InProcessBroker, CrashFS]:
    """Cut the power under ``b`` (what it did not fsync is gone) and start a broker on what is left,
    on a new recording file system, so that it can be cut again."""
    b.broker.release_data_dir()
    n = sum(1 for p in tmp_path.iterdir() if p.name.startswith("disk"))
    dest = tmp_path / f"disk{n}"
    fs.materialize(dest, random.Random(0), writeback=0.0)
    fs2 = CrashFS(dest)
    fileio.fs = fs2
    return InProcessBroker(dest, clock=b.clock, **{**b_config(b), **config}), fs2


def b_config(b: InProcessBroker) -> dict[str, Any]:
    return {"log_segment_bytes": b.config.log_segment_bytes, "flush_every_append": b.config.flush_every_append}


def _background_flush(b: InProcessBroker) -> None:
    """One periodic (light) flush pass, as the broker's flush thread runs it, once flush.ms passed."""
    b.clock.advance(b.config.flush_interval_ms)
    flush_pass = b.broker.logs.begin_flush_pass(b.clock.monotonic_ms())
    if flush_pass is not None:
        flush_pass.run()
        b.broker.logs.finish_flush_pass(flush_pass)


def _values(n: int, start: int = 0) -> list[bytes]:
    return [b"r%02d" % i for i in range(start, start + n)]


def _heads(b: InProcessBroker) -> list[bytes]:
    """The values read_committed reads from t-0, without their padding."""
    return [v.rstrip(b"x") for v in b.visible_values("t", 0)]


def _fill(b: InProcessBroker, values: list[bytes], **kw: Any) -> None:
    for v in values:
        assert b.produce("t", 0, batch(1, value=v, size=100, **kw)) == 0


@pytest.mark.parametrize("moved_by", ["background-flush", "full-flush", "clean-stop"])
def test_records_recovered_after_a_kill_are_fsynced_before_the_recovery_point_passes_them(
        crashfs: CrashFS, tmp_path: Path, moved_by: str) -> None:
    """Twelve records in three segments, none fsynced, then a kill: recovery reads them back from
    the page cache, but its segments were left clean, so the first flush fsynced only the active
    segment's data and moved the recovery point to the log end (a clean stop too): a power cut
    then took the first two segments, and the log ended at offset 0 (probe s4 A: 60 of 60
    acknowledged records lost 5.5 s after their acknowledgement)."""
    b = InProcessBroker(crashfs.root, log_segment_bytes=700)
    b.create_topic("t", 1)
    b.broker.logs.flush_all(b.clock.now_ms(), force=True)
    _fill(b, _values(12))
    b.restart()  # kill -9: the page cache keeps the records, nothing was fsynced
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and plog.log_end_offset == 12 and len(plog.segments) == 3
    if moved_by == "background-flush":
        _background_flush(b)
        assert plog.recovery_point == 12
    elif moved_by == "full-flush":
        plog.flush()
        assert plog.recovery_point == 12
    else:
        b.broker.close()
    b2, _ = _power_cut(b, crashfs, tmp_path)
    assert _heads(b2) == _values(12)
    b2.close()


@pytest.mark.parametrize("flushed", [True, False], ids=["after-a-flush", "before-any-flush"])
def test_an_append_acknowledged_after_a_kill_is_not_lost_with_the_records_recovered_before_it(
        crashfs: CrashFS, tmp_path: Path, flushed: bool) -> None:
    """flush_every_append: a kill, a restart, a background flush (the recovery point at the log end),
    then an append, acknowledged once fsynced: its sync fsynced only the segments above the
    recovery point, so a power cut took the recovered segments below it, the log was cut at the
    first gap, and the acknowledged record went with them (probe s4 B). Before any flush, the sync
    fsynced their data but not their names (files a roll made just before the kill)."""
    b = InProcessBroker(crashfs.root, log_segment_bytes=700, flush_every_append=True)
    b.create_topic("t", 1)
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    for v in _values(12):  # appended, never acknowledged: the kill comes before their fsync
        plog.append(batch(1, value=v, size=100), defer_sync=True)
    b.restart()
    if flushed:
        _background_flush(b)
    _fill(b, [b"acked"])
    b2, _ = _power_cut(b, crashfs, tmp_path)
    assert _heads(b2) == [*_values(12), b"acked"]
    b2.close()


@pytest.mark.parametrize("flushed", [True, False], ids=["after-a-flush", "before-any-flush"])
def test_a_duplicate_answered_after_a_kill_stays_after_a_power_cut(crashfs: CrashFS, tmp_path: Path,
                                                                   flushed: bool) -> None:
    """An idempotent batch appended but not fsynced at the kill is recovered; its retry after the
    restart is a duplicate, answered as written once the recovery point passed it, which no fsync
    had made true (its segment rolled, so the group commit's fsync of the active one missed it):
    the power cut took it (probe s4c, --segment-bytes=100). Before any flush, the group commit
    fsynced its data but not its segment's name, which the roll before the kill had made."""
    b = InProcessBroker(crashfs.root, log_segment_bytes=700, flush_every_append=True)
    b.create_topic("t", 1)
    err, pid, epoch = b.init_producer_id(None)
    assert err == 0
    for seq in range(4):
        assert b.produce("t", 0, batch(1, value=b"v%d" % seq, size=100, pid=pid, epoch=epoch, seq=seq)) == 0
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    sent = [batch(1, value=b"v%d" % seq, size=600, pid=pid, epoch=epoch, seq=seq) for seq in (4, 5)]
    for data in sent:  # sent, appended (a segment each), not yet fsynced nor answered
        plog.append(data, defer_sync=True)
    assert [s.base_offset for s in plog.segments] == [0, 4, 5]
    b.restart()
    if flushed:
        _background_flush(b)
    assert b.produce("t", 0, sent[0]) == 0  # the retry of seq 4: a duplicate, acknowledged
    b2, _ = _power_cut(b, crashfs, tmp_path)
    assert _heads(b2)[:5] == [b"v%d" % seq for seq in range(5)]
    b2.close()


def _keeps_young_records(b: InProcessBroker, stamps: dict[int, int]) -> None:
    """Every segment's max timestamp is its records' largest, a lookup by each record's timestamp
    finds it, and time retention of 30 min deletes none of the records younger than that (if any)."""
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    for seg in plog.segments:
        held = [ts for offset, ts in stamps.items() if seg.base_offset <= offset < seg.next_offset]
        assert seg.max_timestamp == max(held), f"segment {seg.base_offset}"
    for ts in stamps.values():
        found = plog.offset_for_timestamp(ts)
        assert found is not None and found[0] == min(o for o, t in stamps.items() if t >= ts)
    now = b.clock.now_ms()
    young = [o for o, ts in stamps.items() if now - ts < 30 * 60_000]
    if young:
        b.broker.logs.alter_topic_configs("t", {"retention.ms": str(30 * 60_000)})
        plog.apply_retention(now)
        assert plog.log_start_offset <= min(young)


def test_a_time_index_recovery_extended_is_fsynced_before_the_recovery_point_passes_it(
        crashfs: CrashFS, tmp_path: Path) -> None:
    """Probe s3b: two records stamped 40 min ago and a clean stop, then (flush_every_append) six
    fresh ones, the first segment rolled, and a power cut before any background flush: the data
    was fsynced for each acknowledgement, its time-index entries were not. Recovery scanned the
    first segment from the recovery point and rebuilt its entries in memory only; the flushes
    then moved the recovery point past it without writing them, and after a second cut the
    segment was trusted with the index on disk: a max timestamp 40 min old, its fresh records
    skipped by ListOffsets and deleted by a 30 min retention."""
    b = InProcessBroker(crashfs.root, log_segment_bytes=700, flush_every_append=True)
    b.create_topic("t", 1)
    now = b.clock.now_ms()
    stamps: dict[int, int] = {}
    for i in range(2):
        stamps[i] = now - 40 * 60_000 + i
        _fill(b, [b"old%d" % i], ts=stamps[i])
    b.restart(clean=True)
    for i in range(2, 8):
        stamps[i] = b.clock.now_ms() + i
        _fill(b, [b"new%d" % i], ts=stamps[i])
    b2, fs2 = _power_cut(b, crashfs, tmp_path)
    plog = b2.broker.logs.get_partition("t", 0)
    assert plog is not None and plog.recovery_point == 2 and plog.log_end_offset == 8
    for i in range(8, 16):
        stamps[i] = b2.clock.now_ms() + i
        _fill(b2, [b"new%d" % i], ts=stamps[i])
        _background_flush(b2)
    assert plog.recovery_point == 16
    b3, _ = _power_cut(b2, fs2, tmp_path)
    _keeps_young_records(b3, stamps)
    b3.close()


def test_a_time_index_restored_below_the_recovery_point_is_written_before_it_moves_on(
        crashfs: CrashFS, tmp_path: Path) -> None:
    """A power cut right after a roll: the segment before the recovery point's lacks the entries of
    its last records (a light flush leaves them to writeback), and the load walks it for them
    (``restore_time_index``), in memory only. The recovery point then moved on two segments
    without writing them, so after a second cut the segment was trusted with its short index."""
    hour = 3_600_000
    b = InProcessBroker(crashfs.root, log_segment_bytes=700)
    b.create_topic("t", 1)
    b.broker.logs.flush_all(b.clock.now_ms(), force=True)
    t0 = b.clock.now_ms() - 24 * hour
    stamps: dict[int, int] = {}
    for i in range(9):  # one record an hour, four to a segment, a light flush before each
        _background_flush(b)
        stamps[i] = t0 + i * hour
        _fill(b, [b"r%02d" % i], ts=stamps[i])
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and [s.base_offset for s in plog.segments] == [0, 4, 8]
    plog.sync()
    b2, fs2 = _power_cut(b, crashfs, tmp_path)
    plog = b2.broker.logs.get_partition("t", 0)
    assert plog is not None and plog.segments[1].max_timestamp == stamps[7]
    for i in range(9, 17):
        _background_flush(b2)
        stamps[i] = t0 + i * hour
        _fill(b2, [b"r%02d" % i], ts=stamps[i])
    _background_flush(b2)
    assert plog.recovery_point == 17 and len(plog.segments) == 5
    b3, _ = _power_cut(b2, fs2, tmp_path)
    _keeps_young_records(b3, stamps)
    b3.close()

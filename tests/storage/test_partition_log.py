from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.clock import ManualClock
from oncelog.protocol import records as rb
from oncelog.storage.config import LogConfig
from oncelog.storage.errors import OffsetOutOfRangeError, RecordTooLargeError
from oncelog.storage.partition_log import PartitionLog
from tests.storage.helpers import batch, offsets_in


def open_log(path: Path, clock: ManualClock | None = None, **cfg: int) -> PartitionLog:
    return PartitionLog(path, "t", 0, LogConfig(**cfg), clock or ManualClock())  # type: ignore[arg-type]


def test_offsets_are_assigned_consecutively_and_read_back(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    r1 = plog.append(batch(3))
    r2 = plog.append(batch(2) + batch(1))
    assert (r1.base_offset, r1.last_offset) == (0, 2)
    assert (r2.base_offset, r2.last_offset) == (3, 5)
    assert plog.log_end_offset == plog.high_watermark == plog.last_stable_offset == 6
    assert offsets_in(plog.read(0, 1 << 20).records) == [0, 3, 5]
    # a fetch inside a batch starts at that batch
    assert offsets_in(plog.read(4, 1 << 20).records) == [3, 5]
    assert plog.read(6, 1 << 20).records == b""


def test_read_limits_max_bytes_max_offset_and_min_one_message(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    for _ in range(5):
        plog.append(batch(1, size=1000))
    one = len(plog.read(0, 1 << 20).records) // 5
    assert offsets_in(plog.read(0, one * 2 + 10).records) == [0, 1]
    assert offsets_in(plog.read(0, 1 << 20, max_offset=3).records) == [0, 1, 2]
    assert offsets_in(plog.read(0, 10).records) == [0]  # KIP-74: at least one whole batch
    assert plog.read(0, 10, min_one_message=False).records == b""
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(6, 100)


def test_segments_roll_by_size_and_time_and_reads_cross_them(tmp_path: Path) -> None:
    clock = ManualClock()
    plog = open_log(tmp_path, clock, segment_bytes=3000, segment_ms=60_000)
    for _ in range(6):
        plog.append(batch(1, size=1000, ts=clock.now_ms()))
    assert len(plog.segments) == 3
    clock.advance(61_000)
    plog.append(batch(1, ts=clock.now_ms()))  # segment.ms: from the first batch's time to this one's
    assert len(plog.segments) == 4
    assert sorted(p.name for p in tmp_path.glob("*.log"))[1] == f"{plog.segments[1].base_offset:020d}.log"
    got: list[int] = []
    offset = 0
    while offset < plog.log_end_offset:
        data = plog.read(offset, 1 << 20).records
        got += offsets_in(data)
        offset = got[-1] + 1
    assert got == list(range(7))


def test_retention_by_size_and_time_moves_log_start(tmp_path: Path) -> None:
    clock = ManualClock(now_ms=10_000_000)
    plog = open_log(tmp_path, clock, segment_bytes=2500, retention_bytes=5000)
    for i in range(8):
        plog.append(batch(1, size=1000, ts=10_000_000 + i))
    assert plog.apply_retention(clock.now_ms()) > 0
    assert plog.log_start_offset > 0 and plog.size_in_bytes <= 5000 + 2500
    with pytest.raises(OffsetOutOfRangeError):
        plog.read(0, 100)
    # time-based
    plog2 = open_log(tmp_path / "b", clock, segment_bytes=2500, retention_ms=1000)
    for _ in range(4):
        plog2.append(batch(1, size=1000, ts=clock.now_ms()))
    clock.advance(5000)
    plog2.append(batch(1, size=1000, ts=clock.now_ms()))
    plog2.apply_retention(clock.now_ms())
    assert plog2.log_start_offset == plog2.segments[0].base_offset > 0
    reopened = open_log(tmp_path / "b", clock, segment_bytes=2500, retention_ms=1000)
    assert reopened.log_start_offset == plog2.log_start_offset


def test_time_retention_of_records_without_a_timestamp_falls_back_to_the_file_time(tmp_path: Path) -> None:
    """Records sent with no timestamp (-1, which Kafka and oncelog accept) left their segment without
    one, and time retention waited for it for ever, holding back every later segment too (a probe:
    nothing deleted ten days past a 7-day retention). Kafka's largestTimestamp falls back to the
    segment file's mtime."""
    import os

    clock = ManualClock(now_ms=10_000_000_000)
    plog = open_log(tmp_path, clock, segment_bytes=300, retention_ms=7 * 86_400_000)
    for _ in range(3):
        plog.append(batch(1, size=100, ts=-1))
    for _ in range(3):
        plog.append(batch(1, size=100, ts=clock.now_ms()))
    assert plog.segments[0].max_timestamp == -1 and len(plog.segments) >= 4
    clock.advance(10 * 86_400_000)
    assert plog.apply_retention(clock.now_ms()) == 0, "the files are new: nothing is old enough"
    for seg in plog.segments:
        os.utime(seg.path, (0, 0))  # untouched for ages
    before = len(plog.segments)
    assert plog.apply_retention(clock.now_ms()) == before  # the active one too: its records are 10 days old
    assert plog.log_start_offset == plog.log_end_offset == 6


def test_log_append_time_is_what_producer_expiry_and_a_duplicate_answer_see(tmp_path: Path) -> None:
    """On a LogAppendTime topic the producer state kept the client's CreateTime: an idempotent
    producer replaying records made two days ago was expired at the next tick, and the retry of its
    acknowledged batch was written twice (a probe). Kafka analyses the batches as stamped. A
    duplicate is answered with the original batch's timestamp as its log append time, as Kafka's."""
    clock = ManualClock(now_ms=10_000_000_000)
    plog = PartitionLog(tmp_path, "t", 0, LogConfig(message_timestamp_type="LogAppendTime"), clock)
    old = clock.now_ms() - 2 * 86_400_000
    for seq in range(3):
        plog.append(batch(1, pid=7, epoch=0, seq=seq, ts=old))
    stamped = clock.now_ms()
    clock.advance(61_000)
    assert plog.remove_expired_producers(clock.now_ms(), 86_400_000) == 0
    retry = plog.append(batch(1, pid=7, epoch=0, seq=2, ts=old))
    assert retry.duplicate and (retry.base_offset, retry.log_append_time_ms) == (2, stamped)
    assert plog.log_end_offset == 3


def test_retention_takes_a_quiet_topics_last_segment_too(tmp_path: Path) -> None:
    """A topic no one writes to any more kept its active segment past retention for ever (a probe:
    retention.ms=2000, the records still there 6 s later; retention.bytes=0 too). Kafka's
    deletableSegments takes the active segment once it is due and wholly readable, rolling first."""
    clock = ManualClock(now_ms=10_000_000)
    plog = open_log(tmp_path, clock, retention_ms=2000)
    for _ in range(3):
        plog.append(batch(1, ts=clock.now_ms()))
    assert plog.apply_retention(clock.now_ms()) == 0  # not due yet
    clock.advance(6000)
    assert plog.apply_retention(clock.now_ms()) == 1
    assert (plog.log_start_offset, plog.log_end_offset) == (3, 3) and plog.active.size == 0
    assert plog.apply_retention(clock.now_ms()) == 0  # an empty active segment stays
    assert plog.append(batch(1, ts=clock.now_ms())).base_offset == 3
    plog.close()
    again = open_log(tmp_path, clock, retention_ms=2000)
    assert (again.log_start_offset, again.log_end_offset) == (3, 4)
    again.close()
    sized = open_log(tmp_path / "b", clock, retention_bytes=0)
    sized.append(batch(2))
    assert sized.apply_retention(clock.now_ms()) == 1 and sized.log_start_offset == 2
    sized.close()


def test_segment_ms_counts_from_the_first_batch_not_from_the_start(tmp_path: Path) -> None:
    """segment.ms counted from when the segment was loaded: on a broker restarted more often than
    segment.ms the active segment never rolled (nor went to retention with it). Kafka counts from
    the segment's first batch's timestamp to the incoming one's (rollingBasedTimestamp)."""
    clock = ManualClock(now_ms=10_000_000)
    plog = open_log(tmp_path, clock, segment_ms=4000)
    plog.append(batch(1, ts=clock.now_ms()))
    for _ in range(3):  # a restart every 3 s, an append after each
        plog.close()
        clock.advance(3000)
        plog = open_log(tmp_path, clock, segment_ms=4000)
        plog.append(batch(1, ts=clock.now_ms()))
    assert [s.base_offset for s in plog.segments] == [0, 2]  # rolled at the append 6 s after the first
    plog.close()
    old = open_log(tmp_path / "old", clock, segment_ms=4000)  # records of long ago, written now
    for i in range(3):
        old.append(batch(1, ts=1_000 + i))
        clock.advance(3000)
    assert len(old.segments) == 1, "event time decides, as in Kafka: 2 ms apart"
    old.close()


def test_oversized_batch_is_refused_without_writing(tmp_path: Path) -> None:
    plog = open_log(tmp_path, max_message_bytes=500)
    with pytest.raises(RecordTooLargeError):
        plog.append(batch(1, size=1000))
    with pytest.raises(rb.InvalidRecordError):
        plog.append(batch(1)[:-3])
    assert plog.log_end_offset == 0


def test_offset_for_timestamp(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(3, ts=100))  # records at 100, 101, 102
    plog.append(batch(2, ts=200))
    assert plog.offset_for_timestamp(101) == (1, 101)
    assert plog.offset_for_timestamp(150) == (3, 200)
    assert plog.offset_for_timestamp(999) is None


def test_clean_reopen_scans_nothing_and_keeps_offsets(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plog = open_log(tmp_path, index_interval_bytes=100)
    for _ in range(20):
        plog.append(batch(2, size=200))
    before = plog.read(0, 1 << 20).records
    plog.close()
    caplog.set_level(logging.INFO, "oncelog.storage")
    again = open_log(tmp_path, index_interval_bytes=100)
    assert again.log_end_offset == 40
    assert again.read(0, 1 << 20).records == before
    assert offsets_in(again.read(17, 1 << 20).records)[0] == 16
    assert "recovered" not in caplog.text


def test_crash_recovery_truncates_a_torn_tail_and_keeps_everything_before(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plog = open_log(tmp_path)
    for _ in range(5):
        plog.append(batch(2))
    plog.flush()
    for _ in range(3):
        plog.append(batch(2))  # unflushed, but written: survives a process crash
    seg = tmp_path / "00000000000000000000.log"
    good = seg.read_bytes()
    with open(seg, "ab") as f:
        f.write(batch(2)[:40])  # a torn write
    caplog.set_level(logging.INFO, "oncelog.storage")
    again = open_log(tmp_path)  # no close(): a crash
    assert again.log_end_offset == 16
    assert seg.read_bytes() == good
    assert "truncating" in caplog.text and "torn" in caplog.text
    again.append(batch(1))
    assert offsets_in(again.read(14, 1 << 20).records) == [14, 16]


def test_corrupt_batch_in_unflushed_tail_is_truncated(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1))
    plog.flush()
    plog.append(batch(1, value=b"second"))
    plog.append(batch(1, value=b"third"))
    seg = tmp_path / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    second_pos = len(batch(1))
    data[second_pos + 70] ^= 0xFF  # inside the second batch, covered by its CRC
    seg.write_bytes(bytes(data))
    again = open_log(tmp_path)
    assert again.log_end_offset == 1
    assert "CRC" in caplog.text


def test_flushed_data_is_not_rescanned(tmp_path: Path) -> None:
    plog = open_log(tmp_path)
    plog.append(batch(1))
    plog.append(batch(1))
    plog.flush()
    seg = tmp_path / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[70] ^= 0xFF  # corrupt the FIRST, flushed batch: recovery must not look at it
    seg.write_bytes(bytes(data))
    again = open_log(tmp_path)
    assert again.log_end_offset == 2


def test_missing_indexes_are_rebuilt(tmp_path: Path) -> None:
    plog = open_log(tmp_path, segment_bytes=2000, index_interval_bytes=100)
    for _ in range(10):
        plog.append(batch(1, size=500))
    plog.close()
    for p in tmp_path.glob("*.index"):
        p.unlink()
    again = open_log(tmp_path, segment_bytes=2000, index_interval_bytes=100)
    assert again.log_end_offset == 10
    assert offsets_in(again.read(7, 1 << 20).records)[0] == 7


def test_segment_lookup_stays_right_as_segments_roll_and_go(tmp_path: Path) -> None:
    """The base offsets behind ``_segment_for`` are cached between changes of the segment list;
    after every roll and every deletion from the front the lookup must equal a fresh search, and
    reads from every offset start at the right batch."""
    import bisect
    import random

    rng = random.Random(5)
    plog = open_log(tmp_path, segment_bytes=2048)

    def check() -> None:
        bases = [s.base_offset for s in plog.segments]
        for o in [plog.log_start_offset, plog.log_end_offset - 1,
                  *(rng.randrange(plog.log_start_offset, plog.log_end_offset) for _ in range(20))]:
            assert plog._segment_for(o) == max(bisect.bisect_right(bases, o) - 1, 0), (o, bases)
            first = offsets_in(plog.read(o, 1 << 20).records)[0]
            assert first <= o

    for step in range(60):
        plog.append(batch(rng.randint(1, 4), size=rng.randint(50, 600)))
        if step % 7 == 6:
            plog.delete_records(rng.randrange(plog.log_start_offset, plog.log_end_offset + 1))
        check()
    assert len(plog.segments) > 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=25), flushed=st.integers(0, 25),
       damage=st.sampled_from(["none", "torn", "flip", "garbage"]), where=st.integers(0, 10**6),
       chunk=st.sampled_from([61, 200, 1500, 4096]))
def test_recovery_reads_in_chunks_as_it_would_read_batch_by_batch(
        tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, sizes: list[int], flushed: int,
        damage: str, where: int, chunk: int) -> None:
    """Recovery scans the unflushed tail in chunks (``_RECOVERY_CHUNK``); batches straddling a chunk,
    larger than one, or torn or corrupted anywhere must give the same log as one big read: same end
    offset, same bytes kept, same records readable."""
    from oncelog.storage import log_segment

    base = tmp_path_factory.mktemp("rec")
    plog = open_log(base / "src")
    for i, size in enumerate(sizes):
        plog.append(batch(1 + size % 3, size=size))
        if i + 1 == flushed:
            plog.flush()
    seg_name = "00000000000000000000.log"
    data = bytearray((base / "src" / seg_name).read_bytes())
    pos = where % len(data)
    if damage == "torn":
        del data[pos:]
    elif damage == "flip":
        data[pos] ^= 0x5A
    elif damage == "garbage":
        data += bytes(range(7, 7 + where % 90))
    results = []
    for chunk_size in (chunk, 4 << 20):
        monkeypatch.setattr(log_segment, "_RECOVERY_CHUNK", chunk_size)
        d = base / f"c{chunk_size}"
        shutil.copytree(base / "src", d)
        (d / seg_name).write_bytes(bytes(data))
        again = open_log(d)
        results.append((again.log_end_offset, (d / seg_name).read_bytes(),
                        bytes(again.read(0, 1 << 30).records) if again.log_end_offset else b""))
        again.close()
    assert results[0] == results[1]


def test_a_corrupt_base_offset_in_the_unflushed_tail_is_truncated(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """The base offset is outside the batch CRC: a flipped high byte made recovery accept an offset
    the segment's index cannot hold, and the next flush (every close, every restart) raised."""
    plog = open_log(tmp_path)
    plog.append(batch(1))
    plog.flush()
    plog.append(batch(1, value=b"second"))
    seg = tmp_path / "00000000000000000000.log"
    data = bytearray(seg.read_bytes())
    data[len(batch(1))] ^= 0x40  # the second batch's base offset, high byte
    seg.write_bytes(bytes(data))
    caplog.set_level(logging.INFO, "oncelog.storage")
    again = open_log(tmp_path)
    assert again.log_end_offset == 1
    assert "outside the segment's range" in caplog.text
    again.append(batch(1))
    again.close()
    assert open_log(tmp_path).log_end_offset == 2


def test_a_roll_fsyncs_nothing_and_the_next_sync_covers_the_old_segment_and_the_new_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A roll happens inside an append, on the event loop: it must not fsync (Kafka's roll leaves
    the old segment's flush to a scheduled job). The old segment stays dirty until a flush or a
    sync, and a sync that follows the roll fsyncs both data files and then the directory (the new
    file's name), also when a background flush planned the old segment's fsync first."""
    from oncelog.storage import fileio

    log = open_log(tmp_path / "p", segment_bytes=300)
    log.append(batch(1, value=b"x" * 60))
    log.flush()
    calls: list[str] = []
    monkeypatch.setattr(fileio.fs, "fsync", lambda fd: calls.append(f"fsync {fd}"))
    monkeypatch.setattr(fileio.fs, "fsync_dir", lambda path: calls.append(f"dir {Path(path).name}"))
    log.append(batch(1, value=b"y" * 60))  # unflushed, in the first segment
    assert len(log.segments) == 1
    log.append(batch(1, value=b"z" * 60))  # rolls
    assert len(log.segments) == 2 and calls == []
    assert not log.names_durable
    old, new = log.segments
    job = log.begin_flush()  # planned (the old segment's dirty flag cleared), not yet run
    assert job is not None and job.new_names
    end, fds = log.plan_sync()
    assert len([fd for fd in fds if not isinstance(fd, Path)]) == 2, "the old segment's fsync is still to come"
    assert fds[-1] == log.directory  # the new name, after the data
    for fd in fds:
        if not isinstance(fd, Path):
            fileio.fs.close(fd)
    log.mark_synced(end)
    assert log.names_durable and log.synced_end == log.log_end_offset
    calls.clear()
    job.run()
    log.finish_flush(job)
    assert len([c for c in calls if c.startswith("fsync")]) >= 2 and "dir p" in calls  # data, then the name
    assert log.recovery_point == log.log_end_offset and not old.dirty and new is log.active

"""The log cleaner on partition logs: what survives, offsets, tombstones, configs, races, recovery."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.protocol import compression
from oncelog.protocol import records as rb
from oncelog.storage import fileio, record_codec
from oncelog.storage.config import (
    BrokerLayers,
    LogConfig,
    check_combination,
    describe_topic_configs,
    parse_topic_configs,
)
from oncelog.storage.errors import InvalidConfigError, KeylessRecordError
from oncelog.storage.log_cleaner import CleanerConfig, LogCleanerManager, clean
from oncelog.storage.partition_log import PartitionLog
from tests.storage.cleaner_helpers import assert_compacted, batches, compact_log, kv, view

DAY = 86_400_000


def fill(plog: PartitionLog, rounds: int, keys: int = 5, *, roll_every: int = 4) -> None:
    for i in range(rounds):
        plog.append(kv([(b"k%d" % ((i * 3 + j) % keys), b"v%d-%d" % (i, j)) for j in range(3)]))
        if i % roll_every == roll_every - 1:
            plog.roll()
    plog.roll()
    plog.flush()


def cleaner(**cfg: object) -> LogCleanerManager:
    return LogCleanerManager(CleanerConfig(**cfg))  # type: ignore[arg-type]


def test_the_newest_record_per_key_survives_at_its_offset(tmp_path: Path) -> None:
    plog = compact_log(tmp_path)
    fill(plog, 20)
    before = view(plog)
    end = plog.log_end_offset
    assert cleaner().clean_now([plog], 0) == 1
    after = view(plog)
    assert_compacted(before, after)
    assert len(after) == 5
    assert plog.log_end_offset == end and plog.log_start_offset == 0
    # offsets keep their gaps; every batch keeps base offset and last offset delta
    for h in batches(plog):
        assert h.last_offset_delta == 2 and h.base_offset % 3 == 0
    # a consumer at an offset inside a removed range continues from the next present one
    gap = next(o for o in range(end) if o not in {r[0] for r in after})
    assert view(plog, start=gap)[0][0] == min(r[0] for r in after if r[0] > gap)
    # nothing left to do: the log is clean
    assert cleaner().clean_now([plog], 0) == 0


def test_the_active_segment_and_unflushed_segments_are_never_cleaned(tmp_path: Path) -> None:
    plog = compact_log(tmp_path)
    fill(plog, 8)
    for i in range(6):
        plog.append(kv([(b"k0", b"active-%d" % i)]))
    active_before = plog.active.size
    plog.roll()  # rolled (and fsynced by roll) but the recovery point is not past it yet
    for i in range(3):
        plog.append(kv([(b"k0", b"newest-%d" % i)]))
    cleaner().clean_now([plog], 0, force=True)
    recs = view(plog, read_committed=False)
    # the six values of the unflushed segment and the active one's are all still there
    assert sum(1 for r in recs if r[2] and r[2].startswith(b"active")) == 6
    assert sum(1 for r in recs if r[2] and r[2].startswith(b"newest")) == 3
    assert plog.segments[-2].size == active_before


def test_tombstones_stay_for_delete_retention_ms_then_go(tmp_path: Path) -> None:
    clock = ManualClock()
    plog = compact_log(tmp_path, clock, delete_retention_ms=DAY)
    plog.append(kv([(b"a", b"1"), (b"b", b"1")]))
    plog.append(kv([(b"a", None)]))  # a's newest record is a tombstone
    plog.roll()
    plog.flush()
    c = cleaner()
    assert c.clean_now([plog], clock.now_ms()) == 1
    after = view(plog)
    assert (2, b"a", None) in after and (0, b"a", b"1") not in after
    tomb = batches(plog)[-1]
    assert tomb.attributes & record_codec.ATTR_DELETE_HORIZON
    assert record_codec.delete_horizon_ms(tomb) == clock.now_ms() + DAY
    # a later cleaning before the horizon keeps it
    clock.advance(DAY - 1)
    plog.append(kv([(b"c", b"1")], ts=5_000))
    plog.roll()
    plog.flush()
    assert c.clean_now([plog], clock.now_ms(), force=True) == 1
    assert (2, b"a", None) in view(plog)
    # the first cleaning after it removes it (and the record timestamps stayed right meanwhile)
    clock.advance(2)
    plog.append(kv([(b"d", b"1")]))
    plog.roll()
    plog.flush()
    assert c.clean_now([plog], clock.now_ms(), force=True) == 1
    final = view(plog)
    assert [r[1] for r in final] == [b"b", b"c", b"d"]
    assert plog.offset_for_timestamp(5_000) == (3, 5_000)


def test_dirty_ratio_min_and_max_compaction_lag_decide_what_is_cleaned(tmp_path: Path) -> None:
    clock = ManualClock(10_000_000)
    plog = compact_log(tmp_path / "a", clock, min_cleanable_dirty_ratio=0.5)
    fill(plog, 8)
    c = cleaner()
    assert c.clean_now([plog], clock.now_ms()) == 1  # everything dirty: ratio 1
    # a little new dirty data against a big clean part: under the ratio, nothing happens
    plog.config = LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.99)
    plog.append(kv([(b"k1", b"x")]))
    plog.roll()
    plog.flush()
    assert c.clean_now([plog], clock.now_ms()) == 0
    # the config is read live: lower the ratio and it is cleaned
    plog.config = LogConfig(cleanup_policy="compact", min_cleanable_dirty_ratio=0.01)
    assert c.clean_now([plog], clock.now_ms()) == 1

    # min.compaction.lag.ms: segments with records newer than the lag wait
    lagged = compact_log(tmp_path / "b", clock, min_compaction_lag_ms=60_000)
    for i in range(4):
        lagged.append(kv([(b"k", b"%d" % i)], ts=clock.now_ms()))
        lagged.roll()
    lagged.flush()
    assert c.clean_now([lagged], clock.now_ms()) == 0
    clock.advance(60_001)
    assert c.clean_now([lagged], clock.now_ms()) == 1
    assert [r[2] for r in view(lagged)] == [b"3"]

    # max.compaction.lag.ms forces a cleaning under the ratio, and rolls the active segment
    forced = compact_log(tmp_path / "c", clock, min_cleanable_dirty_ratio=1.0, max_compaction_lag_ms=1_000)
    assert forced.config.max_segment_ms == 1_000
    forced.append(kv([(b"k", b"1")], ts=clock.now_ms()))
    clock.advance(1_001)
    forced.append(kv([(b"k", b"2")], ts=clock.now_ms()))  # rolls: the first segment is older than the lag
    assert len(forced.segments) == 2
    forced.flush()
    assert c.clean_now([forced], clock.now_ms()) == 1


def test_max_compaction_lag_counts_the_earliest_first_batch_of_any_dirty_segment(tmp_path: Path) -> None:
    """Kafka's maxCompactionDelay: the minimum first-batch timestamp over every dirty non-active
    segment, counting only timestamps > 0. Before, only the first dirty segment with a timestamp
    >= 0 counted: records stamped in the past behind fresh ones (mirrored data) waited for the
    ratio, and a batch stamped 0 forced a cleaning at every pass."""
    hour = 3_600_000
    clock = ManualClock(10_000_000_000)
    now = clock.now_ms()
    plog = compact_log(tmp_path / "a", clock, min_cleanable_dirty_ratio=0.99, max_compaction_lag_ms=hour)
    for i in range(100):  # a big clean part keeps the dirty ratio low
        plog.append(kv([(b"u%d" % i, b"x" * 100)], ts=now))
    plog.roll()
    plog.flush()
    c = cleaner()
    assert c.clean_now([plog], now, force=True) == 1
    plog.append(kv([(b"k", b"zero")], ts=0))
    plog.roll()
    plog.append(kv([(b"k", b"fresh")], ts=now))
    plog.roll()
    plog.append(kv([(b"x", b"active")], ts=now))
    plog.flush()
    ltc = c.log_to_clean(plog, now)
    assert ltc.cleanable_ratio < 0.99 and not ltc.forced  # stamped 0: no timestamp, as Kafka counts
    assert c.clean_now([plog], now) == 0
    plog.roll()
    plog.append(kv([(b"k", b"old")], ts=now - 2 * hour))
    plog.roll()
    plog.append(kv([(b"x", b"active")], ts=now))
    plog.flush()
    assert c.log_to_clean(plog, now).forced  # the fourth dirty segment's first batch is two hours old
    assert c.clean_now([plog], now) == 1
    assert [r[2] for r in view(plog) if r[1] == b"k"] == [b"old"]


def test_only_delete_policy_logs_lose_segments_to_retention(tmp_path: Path) -> None:
    clock = ManualClock(10 * DAY)
    for policy, expect_deleted in (("compact", 0), ("compact,delete", 2), ("delete", 2)):
        plog = PartitionLog(tmp_path / policy, "t", 0,
                            LogConfig(cleanup_policy=policy, retention_ms=1000), clock)
        for i in range(2):
            plog.append(kv([(b"k", b"%d" % i)], ts=1_000))
            plog.roll()
        assert plog.apply_retention(clock.now_ms()) == expect_deleted


def test_a_compacted_topic_refuses_records_without_a_key(tmp_path: Path) -> None:
    plog = compact_log(tmp_path)
    with pytest.raises(KeylessRecordError) as info:
        plog.append(kv([(b"k", b"1"), (None, b"2")]))
    assert info.value.error_code == 87  # INVALID_RECORD, as Kafka answers
    assert plog.log_end_offset == 0
    plog.append(kv([(b"k", None)]))  # a tombstone has a key: fine


def test_cleanup_policy_and_cleaner_configs_parse_as_kafka_does() -> None:
    base = LogConfig()
    for raw, compact, delete in (("delete", False, True), ("compact", True, False),
                                 ("compact,delete", True, True), ("delete, compact", True, True),
                                 ("", False, False), ("compact,compact", True, False)):  # ValidList: each element
        cfg = base.with_topic_configs({"cleanup.policy": raw})
        assert (cfg.compact, cfg.delete) == (compact, delete)
    for bad in ("remove", "compact;delete"):
        with pytest.raises(InvalidConfigError):
            base.with_topic_configs({"cleanup.policy": bad})
    cfg = base.with_topic_configs({"min.cleanable.dirty.ratio": "0.25", "delete.retention.ms": "5",
                                   "min.compaction.lag.ms": "7", "max.compaction.lag.ms": "9"})
    assert (cfg.min_cleanable_dirty_ratio, cfg.delete_retention_ms, cfg.min_compaction_lag_ms,
            cfg.max_compaction_lag_ms) == (0.25, 5, 7, 9)
    layers = BrokerLayers({}, {"log.cleaner.delete.retention.ms": "5"}, LogConfig())
    described = {d.name: d for d in describe_topic_configs({"min.cleanable.dirty.ratio": "0.25"}, layers)}
    assert (described["min.cleanable.dirty.ratio"].value, described["cleanup.policy"].value) == ("0.25", "delete")
    assert described["delete.retention.ms"].value == "5"  # the broker's log.cleaner.delete.retention.ms
    assert layers.effective_defaults().delete_retention_ms == 5
    for name, bad in (("min.cleanable.dirty.ratio", "1.5"), ("min.cleanable.dirty.ratio", "x"),
                      ("delete.retention.ms", "-1"), ("max.compaction.lag.ms", "0")):
        with pytest.raises(InvalidConfigError):
            base.with_topic_configs({name: bad})
    with pytest.raises(InvalidConfigError, match=r"min\.compaction\.lag\.ms"):
        check_combination(base, parse_topic_configs({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"}))


@pytest.mark.parametrize("codec", [compression.GZIP, compression.SNAPPY, compression.LZ4,
                                   compression.ZSTD])
def test_compressed_batches_are_cleaned_and_stay_compressed(tmp_path: Path, codec: int) -> None:
    plog = compact_log(tmp_path)
    for i in range(6):
        plog.append(kv([(b"k%d" % j, b"value-%d-%d" % (i, j) * 20) for j in range(4)], codec=codec))
        if i % 2:
            plog.roll()
    plog.append(kv([(b"k1", None), (b"k2", b"last")], codec=codec))
    plog.roll()
    plog.flush()
    before = view(plog)
    assert cleaner().clean_now([plog], 0) == 1
    assert_compacted(before, view(plog))
    for h in batches(plog):
        assert h.attributes & rb.ATTR_COMPRESSION_MASK == codec
        rb.validate_batch(plog.read(h.base_offset, 1 << 20).records)  # CRC right


def test_the_offset_map_limit_cleans_in_several_rounds(tmp_path: Path) -> None:
    plog = compact_log(tmp_path, min_cleanable_dirty_ratio=0.0)  # clean until nothing is dirty
    for i in range(30):
        plog.append(kv([(b"k%d" % (i % 10), b"%d" % i)]))
        if i % 5 == 4:
            plog.roll()
    plog.roll()
    plog.flush()
    before = view(plog)
    c = cleaner(dedupe_buffer_size=24 * 4, io_buffer_load_factor=1.0)  # room for 4 keys
    assert c.config.max_map_entries == 4
    rounds = c.clean_now([plog], 0)  # cleans until nothing is due
    assert rounds > 2
    assert_compacted(before, view(plog))


def test_segments_are_grouped_by_size_and_bases_stay_valid(tmp_path: Path) -> None:
    plog = compact_log(tmp_path, segment_bytes=4096)
    for i in range(40):
        plog.append(kv([(b"k%d" % (i % 4), b"v" * 50)]))
        plog.roll()
    plog.flush()
    n_before = len(plog.segments)
    before = view(plog)
    assert cleaner().clean_now([plog], 0) == 1
    assert len(plog.segments) < n_before // 4
    bases = [s.base_offset for s in plog.segments]
    assert bases == sorted(bases) and bases[0] == 0
    for seg, nxt in zip(plog.segments, plog.segments[1:], strict=False):
        assert seg.next_offset == nxt.base_offset
        assert sum(1 for _ in seg.iter_batches(0)) == 0 or next(seg.iter_batches(0))[1].base_offset >= seg.base_offset
    assert_compacted(before, view(plog))
    # the files on disk are exactly the segments
    assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == bases
    assert not list(tmp_path.glob("*.cleaned")) and not (tmp_path / "cleaner-swap").exists()


def test_recovery_from_the_cleaned_log_alone_rebuilds_the_same_state(tmp_path: Path) -> None:
    """Without a producer-state snapshot the log is replayed from its first segment: the cleaned
    log (gaps, emptied batches, a segment ending before the next one's base) must give the same
    offsets, records and producer state."""
    plog = compact_log(tmp_path)
    for i in range(12):
        plog.append(kv([(b"k%d" % (i % 3), b"%d" % i)], pid=7, epoch=0, seq=i))
        if i % 4 == 3:
            plog.roll()
    plog.append(kv([(b"z", b"z")], pid=8, epoch=0, seq=0))
    plog.roll()
    plog.append(kv([(b"k0", b"after")]))
    plog.flush()
    assert cleaner().clean_now([plog], 0, force=True) == 1
    before = view(plog)
    end = plog.log_end_offset
    producer = plog.producer_state.producers[7]
    plog.close()
    (tmp_path / "producer-state.snapshot").unlink()
    (tmp_path / "recovery-point").unlink(missing_ok=True)  # only data dirs written before 0.2 have one
    again = compact_log(tmp_path)
    assert again.log_end_offset == end
    assert view(again) == before
    assert again.producer_state.producers[7].last_seq == producer.last_seq == 11
    assert again.producer_state.producers[7].batches[-1].last_offset == producer.batches[-1].last_offset


def test_cleaning_races_appends_retention_delete_records_and_topic_deletion(tmp_path: Path) -> None:
    clock = ManualClock(10 * DAY)
    plog = PartitionLog(tmp_path / "a", "t", 0, LogConfig(cleanup_policy="compact,delete", retention_ms=DAY),
                        clock)
    for i in range(16):
        plog.append(kv([(b"k%d" % (i % 4), b"%d" % i)], ts=clock.now_ms()))
        if i % 4 == 3:
            plog.roll()
    plog.flush()
    c = cleaner()
    # appends while the cleaner thread runs: the swap still applies
    job = c.job_for(plog, clock.now_ms())
    assert job is not None
    results = []
    worker = threading.Thread(target=lambda: results.append(clean(job)))
    worker.start()
    for i in range(200):
        plog.append(kv([(b"k%d" % (i % 7), b"new-%d" % i)], ts=clock.now_ms()))
        if i % 50 == 49:
            plog.roll()
            plog.flush()
    worker.join()
    before = view(plog)
    assert c.complete(job, results[0])
    after = view(plog)
    assert set(after) <= set(before)
    for key, rec in {r[1]: r for r in before}.items():
        assert rec in after, key
    # retention deletes a segment while a cleaning runs: the result is dropped, nothing lost
    plog.flush()
    job = c.job_for(plog, clock.now_ms())
    assert job is not None
    result = clean(job)
    old = plog.segments[0].max_timestamp
    clock.set(old + 2 * DAY)
    assert plog.apply_retention(clock.now_ms()) > 0
    kept = view(plog)
    assert not c.complete(job, result)
    assert view(plog) == kept
    assert not list((tmp_path / "a").glob("*.cleaned"))
    # DeleteRecords that only moves the log start keeps the cleaning valid
    plog.append(kv([(b"k1", b"x"), (b"k2", b"x"), (b"k1", b"y")], ts=clock.now_ms()))
    plog.roll()
    plog.flush()
    job = c.job_for(plog, clock.now_ms())
    assert job is not None
    result = clean(job)
    plog.delete_records(plog.log_start_offset + 1)
    assert plog.segments[0] is job.old_segments[0]
    assert c.complete(job, result)
    # a topic deleted mid-cleaning: the job stops and leaves no file behind
    plog.append(kv([(b"k2", b"y")], ts=clock.now_ms()))
    plog.roll()
    plog.flush()
    job = c.job_for(plog, clock.now_ms())
    assert job is not None
    c.abort(plog)
    with pytest.raises(Exception) as info:
        clean(job)
    assert type(info.value).__name__ == "CleaningAbortedError"
    assert not list((tmp_path / "a").glob("*.cleaned"))


def test_an_aborted_job_never_touches_files_of_a_later_cleaning_in_the_same_directory(tmp_path: Path) -> None:
    """A topic deleted mid-cleaning and created again under the same name: the old job's failure,
    handled after a new job wrote its .cleaned files (same bases), must not remove them."""
    plog = compact_log(tmp_path)
    fill(plog, 8)
    c = cleaner()
    job = c.job_for(plog, 0)
    assert job is not None
    first = clean(job)  # the old job wrote its files...
    c.abort(plog)  # ...then the topic was deleted: cancel removes them
    assert not list(tmp_path.glob("*.cleaned"))
    later = c.job_for(plog, 0)  # the same directory's next cleaning writes the same names
    assert later is not None
    before = view(plog)
    later_result = clean(later)
    written = sorted(tmp_path.glob("*.cleaned"))
    assert written
    c.failed(job, RuntimeError("the old thread's late failure"))
    assert sorted(tmp_path.glob("*.cleaned")) == written
    assert plog.name not in c.uncleanable  # an aborted job does not make the log uncleanable
    assert first.segments and c.complete(later, later_result)  # and the later cleaning swaps in whole
    assert_compacted(before, view(plog))


def test_a_cleaning_that_would_eat_into_the_free_space_kept_is_put_off_not_given_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cleaning writes a copy as large as its input at worst. Before, on a compacted topic of
    unique keys filled to ``log_dir_min_free_bytes`` (by hand: 20 MiB tmpfs, 4 MiB bound), the
    cleaner took the rest of the disk, failed with ENOSPC, and the log stayed uncleanable until a
    restart. Now it is not chosen while its copy would not fit, a cleaning the disk refuses anyway
    is dropped without marking the log, and it is cleaned once there is room."""
    plog = compact_log(tmp_path)
    fill(plog, 20)
    before = view(plog)
    c = cleaner()
    plog.dir_state.min_free_bytes = 1 << 62
    assert c.clean_now([plog], plog.clock.now_ms()) == 0
    assert not c.in_progress and plog.name not in c.uncleanable

    plog.dir_state.min_free_bytes = 0

    def full(fd: int, data: object, position: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fileio.fs, "pwrite", full)
    with pytest.raises(OSError):
        c.clean_now([plog], plog.clock.now_ms())
    monkeypatch.undo()
    assert plog.name not in c.uncleanable and not c.in_progress
    assert not [p for p in tmp_path.rglob("*") if "cleaned" in p.name]
    assert view(plog) == before

    assert c.clean_now([plog], plog.clock.now_ms()) == 1
    after = view(plog)
    assert {r[1]: r for r in after} == {r[1]: r for r in before}  # the newest record per key, at its offset
    assert len(after) < len(before)

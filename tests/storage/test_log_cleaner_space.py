"""The log cleaner on a disk with little free space: a cleaning goes in steps of what fits, each
swapped in before the next, so it needs room for one group of segments, not for the whole log."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.clock import ManualClock
from oncelog.storage import fileio
from oncelog.storage.log_cleaner import CleanerConfig, LogCleanerManager, clean
from oncelog.storage.partition_log import PartitionLog
from tests.storage.cleaner_helpers import assert_compacted, batches, compact_log, kv, newest_per_key, view

SEGMENT_BYTES = 2048
RESERVE = 4096  # log_dir_min_free_bytes


def du(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


def workload(plog: PartitionLog) -> None:
    """A log mostly live (unique keys, so its cleaned copy is nearly as big as it is) with updates
    and tombstones after, from an idempotent producer (its last batch must stay)."""
    seq = 0
    for i in range(150):
        plog.append(kv([(b"u%03d" % i, b"x" * 120)], pid=7, epoch=0, seq=seq))
        seq += 1
    for i in range(120):
        plog.append(kv([(b"k%d" % (i % 6), None if i % 17 == 0 else b"y%d" % i)], pid=7, epoch=0, seq=seq))
        plog.append(kv([(b"u%03d" % (i % 40), b"z%d" % i)], pid=7, epoch=0, seq=seq + 1))
        seq += 2
    plog.roll()
    plog.flush()


class SmallDisk:
    """``directory`` on a file system of ``capacity`` bytes (what ``os.statvfs`` reports), where a
    write to a ``.cleaned`` file that would leave less than ``RESERVE`` free fails with ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, directory: Path, capacity: int) -> None:
        self.directory = directory
        self.capacity = capacity
        self.peak = 0
        real_statvfs, real_pwrite = os.statvfs, fileio.fs.pwrite

        def statvfs(path: Any) -> Any:
            if Path(path) != directory:
                return real_statvfs(path)
            return SimpleNamespace(f_blocks=capacity, f_frsize=1, f_bavail=max(capacity - du(directory), 0))

        def pwrite(fd: int, data: Any, position: int) -> int:
            target = Path(os.readlink(f"/proc/self/fd/{fd}"))
            if target.parent == directory and target.name.endswith(".cleaned"):
                grows = max(position + len(data) - os.fstat(fd).st_size, 0)
                if du(directory) + grows > capacity - RESERVE:
                    raise OSError(errno.ENOSPC, "No space left on device (a cleaned copy ate into the reserve)")
                self.peak = max(self.peak, du(directory) + grows)
            return real_pwrite(fd, data, position)

        monkeypatch.setattr(os, "statvfs", statvfs)
        monkeypatch.setattr(fileio.fs, "pwrite", pwrite)


def test_a_log_larger_than_the_free_space_is_cleaned_in_steps_to_its_live_size(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a cleaning copied every group of the cleanable log before swapping any in, and was
    put off unless all of the copy fit above log_dir_min_free_bytes: on a 40 MiB tmpfs a log whose
    dirty part grew while an open transaction held the LSO was never cleaned again and filled the
    disk. Kafka swaps each group in as it goes. Here the free space holds a copy of one group and a
    half, the log ten times that: the log is cleaned over several steps to exactly what a cleaning
    with room to spare gives, and no cleaned copy ever eats into the reserve."""
    clock = ManualClock(1_000_000)
    small = compact_log(tmp_path / "small", clock, segment_bytes=SEGMENT_BYTES)
    roomy = compact_log(tmp_path / "roomy", clock, segment_bytes=SEGMENT_BYTES)
    for plog in (small, roomy):
        workload(plog)
    before = view(small)
    # a group is one segment here (two do not fit segment.bytes): its copy, indexes included, fits
    assert all(SEGMENT_BYTES // 2 < s.size <= SEGMENT_BYTES for s in small.segments[:-2])
    room = 3 * SEGMENT_BYTES // 2
    assert sum(s.size for s in small.segments) > 10 * room
    disk = SmallDisk(monkeypatch, small.directory, du(small.directory) + RESERVE + room)
    small.dir_state.min_free_bytes = RESERVE

    assert LogCleanerManager(CleanerConfig()).clean_now([roomy], clock.now_ms()) == 1
    c = LogCleanerManager(CleanerConfig())
    steps = c.clean_now([small], clock.now_ms())
    assert steps > 3 and c.cleanings == 1
    assert not c.in_progress and not c._next_steps and small.name not in c.uncleanable
    assert 0 < disk.peak <= disk.capacity - RESERVE

    after = view(small)
    assert_compacted(before, after)
    assert after == view(roomy) and len(after) == 156
    assert [(h.base_offset, h.last_offset, h.size, h.crc) for h in batches(small)] == \
        [(h.base_offset, h.last_offset, h.size, h.crc) for h in batches(roomy)]
    assert sum(s.size for s in small.segments) == sum(s.size for s in roomy.segments)
    assert not list(small.directory.glob("*.cleaned")) and not (small.directory / "cleaner-swap").exists()
    assert sorted(int(p.stem) for p in small.directory.glob("*.log")) == [s.base_offset for s in small.segments]
    # the producer's last batch survived (emptied or not): its next sequence is accepted after a replay
    end = small.log_end_offset
    small.close()
    (small.directory / "producer-state.snapshot").unlink()
    again = compact_log(small.directory, clock, segment_bytes=SEGMENT_BYTES)
    assert again.log_end_offset == end and view(again) == after
    assert again.producer_state.producers[7].last_seq == 150 + 2 * 120 - 1


def test_a_step_waits_for_room_and_the_log_changing_between_steps_drops_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next step of a cleaning is put off while its first group does not fit (and nothing else
    of that log starts meanwhile); retention or DeleteRecords deleting the segments between steps
    drops the rest of the cleaning, keeping what earlier steps swapped in; an abort drops it too."""
    clock = ManualClock(1_000_000)
    plog = compact_log(tmp_path / "a", clock, segment_bytes=SEGMENT_BYTES)
    workload(plog)
    before = view(plog)
    room = [1 << 40]

    real_statvfs = os.statvfs

    def statvfs(path: Any) -> Any:
        if Path(path) != plog.directory:
            return real_statvfs(path)
        return SimpleNamespace(f_blocks=1 << 41, f_frsize=1, f_bavail=room[0])

    monkeypatch.setattr(os, "statvfs", statvfs)
    c = LogCleanerManager(CleanerConfig())
    job = c.grab_filthiest([plog], clock.now_ms())
    assert job is not None
    job.max_write_bytes = 1  # this step: one group
    assert c.complete(job, clean(job))
    assert plog in c._next_steps and not c.in_progress
    room[0] = 10  # no room for the next group: put off, and no new cleaning of the log either
    assert c.grab_filthiest([plog], clock.now_ms()) is None and plog in c._next_steps
    room[0] = 1 << 40
    step = c.grab_filthiest([plog], clock.now_ms())
    assert step is not None and step.progress is not None and step.swapped_before
    result = clean(step)
    assert result.remaining is None  # room for everything left
    assert c.complete(step, result)
    assert_compacted(before, view(plog))
    assert not c._next_steps and c.cleanings == 1

    # the log changes between steps: the rest is dropped, what was swapped in stays
    plog.append(kv([(b"k1", b"again"), (b"u001", b"again")]))
    plog.roll()
    plog.flush()
    plog.config = plog.config.__class__(cleanup_policy="compact", segment_bytes=SEGMENT_BYTES,
                                        min_cleanable_dirty_ratio=0.0)
    c._set_checkpoint(plog, 0)  # clean everything again
    mid = view(plog)
    job = c.grab_filthiest([plog], clock.now_ms())
    assert job is not None
    job.max_write_bytes = 1
    assert c.complete(job, clean(job)) and plog in c._next_steps
    step = c.job_for(plog, clock.now_ms())
    assert step is not None
    result = clean(step)
    first = plog.segments[0]
    plog.delete_records(plog.segments[1].base_offset)  # the first segment goes
    assert plog.segments[0] is not first
    assert not c.complete(step, result)
    assert plog not in c._next_steps and not list(plog.directory.glob("*.cleaned"))
    after = view(plog)
    assert set(after) <= set(mid)
    assert all(r in after for r in newest_per_key(mid).values() if r[0] >= plog.log_start_offset)
    # an abort between steps drops the rest
    c._set_checkpoint(plog, plog.log_start_offset)
    job = c.job_for(plog, clock.now_ms())
    assert job is not None
    job.max_write_bytes = 1
    assert c.complete(job, clean(job)) and plog in c._next_steps
    c.abort(plog)
    assert plog not in c._next_steps and c.job_for(plog, clock.now_ms()) is not None


def test_a_step_never_ends_between_two_segments_with_the_same_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A roll of an empty active segment leaves two segments with one base (one file). A step that
    ended between them made its swap unlink that file, the second segment's records with it (found
    by the random workload, seed 104)."""
    plog = compact_log(tmp_path, segment_bytes=300)  # groups: [0, 4 (empty)], [4], the active 6
    for i in range(4):
        plog.append(kv([(b"k", b"%d" % i)]))
    plog.roll()
    plog.roll()  # nothing appended since the last roll: a second segment with base 4
    plog.append(kv([(b"live", b"1"), (b"k", b"4")]))
    plog.roll()
    plog.append(kv([(b"x", b"active")]))
    plog.flush()
    assert [s.base_offset for s in plog.segments] == [0, 4, 4, 6]
    monkeypatch.setattr(LogCleanerManager, "_write_budget", staticmethod(lambda plog: 1))  # a group a step
    c = LogCleanerManager(CleanerConfig())
    assert c.clean_now([plog], 0, force=True) >= 1
    before = view(plog, read_committed=False)
    assert [r[2] for r in before] == [b"1", b"4", b"active"]
    assert sorted(int(p.stem) for p in tmp_path.glob("*.log")) == sorted({s.base_offset for s in plog.segments})
    plog.close()
    assert view(compact_log(tmp_path, segment_bytes=300), read_committed=False) == before

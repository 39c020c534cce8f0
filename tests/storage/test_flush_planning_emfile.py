"""A flush whose planning meets EMFILE plans all or nothing (``PartitionLog.begin_flush``,
``LogManager.begin_flush_pass``, ``PartitionLog.plan_sync``).

Probe s37 (``fd_flush.py``, a broker near its descriptor limit, 30 partitions written): a pass's
``dup`` of a segment's descriptor failed with EMFILE half way; the partitions planned before kept a
flush job no pass would run (their recovery points never moved again, their duplicates stayed
open), and the failing partition's earlier segments were already marked clean, so a later flush
could carry its recovery point past data never fsynced. Here ``fileio.fs.dup`` fails on cue.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.storage import fileio
from oncelog.storage.config import LogConfig
from oncelog.storage.log_manager import LogManager
from tests.storage.helpers import batch

PARTITIONS = 30
FAILING = 10  # the partition whose plan meets EMFILE, at its second segment


class _Descriptors:
    """Wraps ``fileio.fs``: which duplicates are open, which files were fsynced (by inode), and a
    ``dup`` that fails with EMFILE when ``fail_at`` says so."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open: set[int] = set()
        self.fsynced: set[int] = set()
        self.dups = 0
        self.fail_at: int | None = None
        real_dup, real_close, real_fsync = fileio.fs.dup, fileio.fs.close, fileio.fs.fsync

        def dup(fd: int) -> int:
            self.dups += 1
            if self.dups == self.fail_at:
                raise OSError(errno.EMFILE, "Too many open files")
            new = real_dup(fd)
            self.open.add(new)
            return new

        def close(fd: int) -> None:
            self.open.discard(fd)
            real_close(fd)

        def fsync(fd: int) -> None:
            self.fsynced.add(os.fstat(fd).st_ino)
            real_fsync(fd)

        monkeypatch.setattr(fileio.fs, "dup", dup)
        monkeypatch.setattr(fileio.fs, "close", close)
        monkeypatch.setattr(fileio.fs, "fsync", fsync)


@pytest.fixture
def logs(tmp_path: Path) -> Iterator[LogManager]:
    lm = LogManager(tmp_path / "d", LogConfig(), ManualClock())
    lm.create_topic("many", PARTITIONS, {})
    try:
        yield lm
    finally:
        lm.close()


def test_a_pass_that_meets_emfile_flushes_the_others_and_the_failing_partition_next_time(
        logs: LogManager, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = logs.clock
    assert isinstance(clock, ManualClock)
    parts = [logs.get_partition("many", p) for p in range(PARTITIONS)]
    for p, plog in enumerate(parts):
        assert plog is not None
        plog.append(batch(value=b"a%d" % p))
        if p == FAILING:  # three dirty segments: the plan fails after its first duplicate
            for i in range(2):
                plog.roll()
                plog.append(batch(value=b"b%d" % i))
    failing = parts[FAILING]
    assert failing is not None and len(failing.segments) == 3
    fds = _Descriptors(monkeypatch)
    fds.fail_at = FAILING + 2  # one duplicate each before it, then its second one
    clock.advance(LogConfig().flush_interval_ms)

    flush_pass = logs.begin_flush_pass(clock.monotonic_ms())  # raised OSError before: the pass was lost

    assert flush_pass is not None
    planned = {plog.partition for plog, _job in flush_pass.jobs}
    assert planned == set(range(PARTITIONS)) - {FAILING}
    assert fds.open == {fd for _plog, job in flush_pass.jobs for fd in job.fds}, "a duplicate leaked"
    assert failing._flush_job is None
    assert all(seg.dirty for seg in failing.segments), "a segment was marked clean, its fsync never planned"
    flush_pass.run()
    logs.finish_flush_pass(flush_pass)
    assert fds.open == set()
    for plog in parts:
        assert plog is not None
        assert plog.recovery_point == (0 if plog is failing else plog.log_end_offset)

    clock.advance(LogConfig().flush_interval_ms)
    fds.fsynced.clear()
    retry = logs.begin_flush_pass(clock.monotonic_ms())  # the next pass takes it again
    assert retry is not None and [plog for plog, _job in retry.jobs] == [failing]
    retry.run()
    logs.finish_flush_pass(retry)
    assert failing.recovery_point == failing.log_end_offset == 3
    assert {os.fstat(seg.fd).st_ino for seg in failing.segments} <= fds.fsynced, \
        "the recovery point passed data never fsynced"
    assert fds.open == set()
    assert logs.dir_state.offline_reason is None


def test_plan_sync_that_meets_emfile_leaves_no_duplicate_open(logs: LogManager,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The group commit's plan (``Broker._start_fsyncs``): EMFILE at the second duplicate raises,
    with the first one closed; the next plan covers everything."""
    plog = logs.get_partition("many", 0)
    assert plog is not None
    plog.append(batch(value=b"a"))
    plog.roll()
    plog.append(batch(value=b"b"))
    fds = _Descriptors(monkeypatch)
    fds.fail_at = 2
    with pytest.raises(OSError) as raised:
        plog.plan_sync()
    assert raised.value.errno == errno.EMFILE
    assert fds.open == set()
    end, planned = plog.plan_sync()
    assert end == 2 and len([fd for fd in planned if isinstance(fd, int)]) == 2
    for fd in planned:
        if isinstance(fd, int):
            fileio.fs.close(fd)

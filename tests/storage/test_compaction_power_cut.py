"""A power cut at every write, fsync and rename of a cleaning and its swap, on the recording file
system (tests/storage/crashfs.py): after the restart the partition holds either the log as it was
before the cleaning or as it is after it (never both copies of an offset range, never a mix, never
a lost record), the broker starts, a new cleaning works and transactions still commit.

Each cut is materialized three ways: only what was fsynced survives (LazyFS's clear-cache), every
unsynced page and name change survives at random, and everything survives (kill -9 of the process).
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.storage import fileio
from tests.inproc import InProcessBroker
from tests.storage.cleaner_helpers import kv, view
from tests.storage.crashfs import CrashFS, PowerCut

START_MS = 1_700_000_000_000


def _txn(b: InProcessBroker, tid: str, values: list[tuple[bytes, bytes | None]], commit: bool) -> None:
    err, pid, epoch = b.init_producer_id(tid)
    assert err == 0
    assert not any(b.add_partitions(tid, pid, epoch, [("c", 0)]).values())
    assert b.produce("c", 0, kv(values, pid=pid, epoch=epoch, seq=0, txn=True), transactional_id=tid) == 0
    assert b.end_txn(tid, pid, epoch, commit) == 0


def _seal(b: InProcessBroker) -> None:
    plog = b.broker.logs.get_partition("c", 0)
    assert plog is not None
    plog.roll()
    plog.flush()


def build(path: Path) -> None:
    """A compacted partition with several segments, transactions (committed and aborted),
    idempotent batches and tombstones; stopped cleanly."""
    b = InProcessBroker(path, clock=ManualClock(START_MS))
    b.broker.logs.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": "2000"})
    _, pid, epoch = b.init_producer_id(None)
    seq = 0
    for i in range(6):
        _txn(b, f"t{i % 2}", [(b"k%d" % (i % 3), b"txn-%d" % i)], commit=i % 3 != 1)
        assert b.produce("c", 0, kv([(b"k%d" % (i % 4), b"idem-%d" % i), (b"j%d" % i, b"x")],
                                    pid=pid, epoch=epoch, seq=seq)) == 0
        seq += 2
        if i % 2:
            b.produce("c", 0, kv([(b"j%d" % (i - 1), None)]))
            _seal(b)
    _seal(b)
    b.close()


def open_broker(path: Path) -> InProcessBroker:
    return InProcessBroker(path, clock=ManualClock(START_MS + 1000))


def snapshot(b: InProcessBroker) -> tuple[list, list, int]:  # type: ignore[type-arg]
    plog = b.broker.logs.get_partition("c", 0)
    assert plog is not None
    return view(plog), view(plog, read_committed=False), plog.log_end_offset


def clean(b: InProcessBroker) -> int:
    return b.broker.logs.cleaner.clean_now(b.broker.logs.compacted_logs(), b.clock.now_ms(), force=True)


@pytest.fixture
def real_fs() -> Iterator[None]:
    saved = fileio.fs
    yield
    fileio.fs = saved


def test_a_power_cut_anywhere_in_a_cleaning_leaves_the_old_or_the_new_log(tmp_path: Path, real_fs: None) -> None:
    template = tmp_path / "template"
    build(template)
    # the two acceptable outcomes, and how many file-system operations a cleaning makes
    ref = tmp_path / "ref"
    shutil.copytree(template, ref)
    fs = CrashFS(ref)
    fileio.fs = fs
    b = open_broker(ref)
    old = snapshot(b)
    ops_before = fs.ops
    assert clean(b) == 1
    n_ops = fs.ops - ops_before
    new = snapshot(b)
    b.close()
    fileio.fs = fileio.FileSystem()
    assert new[0] != old[0] and len(new[0]) < len(old[0]) and new[2] == old[2]
    assert n_ops > 20
    outcomes = {"old": 0, "new": 0}
    rng = random.Random(7)
    for n in range(1, n_ops + 1):
        for writeback in (0.0, 0.5, 1.0):
            root = tmp_path / f"cut-{n}-{writeback}"
            shutil.copytree(template, root / "before")
            fs = CrashFS(root / "before")
            fileio.fs = fs
            b = open_broker(root / "before")
            fs.cut_after(n)
            with pytest.raises(PowerCut):
                clean(b)
            b.broker.release_data_dir()
            fs.materialize(root / "after", rng, writeback=writeback)
            fileio.fs = fileio.FileSystem()
            a = open_broker(root / "after")
            got = snapshot(a)
            assert got[2] == old[2], f"cut {n} (writeback {writeback}): log end offset changed"
            assert got in (old, new), f"cut {n} (writeback {writeback}): neither the old nor the cleaned log"
            outcomes["old" if got == old else "new"] += 1
            d = root / "after" / "c-0"
            assert not list(d.glob("*.cleaned")) and not (d / "cleaner-swap").exists()
            plog = a.broker.logs.get_partition("c", 0)
            assert plog is not None
            on_disk = sorted(int(p.stem) for p in d.glob("*.log"))
            assert on_disk == [s.base_offset for s in plog.segments]
            for seg, nxt in zip(plog.segments, plog.segments[1:], strict=False):
                assert seg.next_offset == nxt.base_offset
            # cleaning again gives the cleaned log; transactions still commit
            clean(a)
            assert snapshot(a)[:2] == new[:2]
            _txn(a, "after-cut", [(b"k0", b"final")], commit=True)
            assert view(plog)[-1][2] == b"final"
            a.close()
            shutil.rmtree(root)
    assert outcomes["old"] and outcomes["new"]

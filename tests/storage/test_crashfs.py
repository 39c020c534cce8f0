"""The recording file system itself: the power-cut tests are only as good as its model.

The broker calls it from several threads (the event loop, the flush thread, the sync threads), so
its bookkeeping must be one disk's history, and after a cut nothing may take effect anywhere.
Without a lock, ``test_power_cut`` failed now and then in CI with an acknowledged commit "lost"
(2 of 3 clean-clone runs on 2026-11-26): a descriptor number closed by one thread and handed to
another by the kernel lost its mapping, so an fsync the broker did make was not recorded (the
likeliest of the races below; all three fail here without the lock).
"""

from __future__ import annotations

import random
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.storage.crashfs import CrashFS, PowerCut


@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Threads switch every microsecond, so that unguarded bookkeeping interleaves."""
    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(saved)


def test_every_operation_after_the_cut_raises_in_every_thread(tmp_path: Path) -> None:
    fs = CrashFS(tmp_path / "disk")
    fd = fs.open_rw(tmp_path / "disk" / "a")
    fs.cut_after(2)
    fs.pwrite(fd, b"x", 0)
    with pytest.raises(PowerCut):
        fs.fsync(fd)
    ops = fs.ops
    raised: list[str] = []

    def later(name: str, op: object) -> None:
        try:
            op()  # type: ignore[operator]
        except PowerCut:
            raised.append(name)

    calls = {
        "pwrite": lambda: fs.pwrite(fd, b"y", 1),
        "fsync": lambda: fs.fsync(fd),
        "fsync_dir": lambda: fs.fsync_dir(tmp_path / "disk"),
        "append_durable": lambda: fs.append_durable(tmp_path / "disk" / "b", b"z"),
        "write_atomic": lambda: fs.write_atomic(tmp_path / "disk" / "c", b"z"),
        "mkdir": lambda: fs.mkdir(tmp_path / "disk" / "d"),
        "ftruncate": lambda: fs.ftruncate(fd, 0),
    }
    threads = [threading.Thread(target=later, args=(name, op)) for name, op in calls.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(raised) == sorted(calls)
    assert fs.ops == ops
    out = tmp_path / "after"
    fs.materialize(out, random.Random(1), writeback=1.0)
    # the write before the cut may have reached the disk; nothing after it did
    assert sorted(p.name for p in out.iterdir()) == ["a"]
    assert (out / "a").read_bytes() in (b"", b"x")


def test_threads_creating_and_syncing_names_at_once(tmp_path: Path, fast_switching: None) -> None:
    """Eight threads each create files in a directory of their own and fsync it, as the sync
    threads do for eight partitions: every name a thread made durable survives a cut with
    writeback 0, and no operation fails on the model's own tables."""
    root = tmp_path / "disk"
    fs = CrashFS(root)
    errors: list[BaseException] = []

    def partition(i: int) -> None:
        try:
            d = root / f"p-{i}"
            fs.mkdir(d)
            for n in range(60):
                fd = fs.open_rw(d / f"{n:05d}.log")
                fs.pwrite(fd, f"{i}/{n}".encode(), 0)
                fs.fsync(fd)
                fs.close(fd)
                fs.fsync_dir(d)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=partition, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    out = tmp_path / "after"
    fs.materialize(out, random.Random(1), writeback=0.0)
    for i in range(8):
        names = sorted(p.name for p in (out / f"p-{i}").iterdir())
        assert names == [f"{n:05d}.log" for n in range(60)]
        assert (out / f"p-{i}" / "00059.log").read_bytes() == f"{i}/59".encode()


def test_a_descriptor_number_reused_across_threads(tmp_path: Path, fast_switching: None) -> None:
    """One thread closes descriptors while another dups, writes and fsyncs: the kernel hands a
    closed number to the next dup at once, so the model must forget the old descriptor in the same
    step as the close. (When it did not, the other thread's fresh descriptor lost its mapping and
    its fsync was not recorded: data the broker had fsynced, and acknowledged, vanished at the cut.)"""
    root = tmp_path / "disk"
    fs = CrashFS(root)
    base_a, base_b = fs.open_rw(root / "a"), fs.open_rw(root / "b")
    fs.fsync_dir(root)
    stop = threading.Event()
    errors: list[BaseException] = []

    def closer() -> None:
        try:
            while not stop.is_set():
                fs.close(fs.dup(base_a))
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=closer)
    t.start()
    try:
        for i in range(3000):
            fd = fs.dup(base_b)
            fs.pwrite(fd, f"{i:08d}".encode(), 0)
            fs.fsync(fd)
            fs.close(fd)
            out = tmp_path / f"after-{i % 2}"
            if i % 500 == 499:
                fs.materialize(out, random.Random(i), writeback=0.0)
                assert (out / "b").read_bytes() == f"{i:08d}".encode(), f"the fsync of write {i} was not recorded"
    finally:
        stop.set()
        t.join()
    assert not errors, errors[:3]

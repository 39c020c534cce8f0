"""A recording file system for power-cut tests: the storage layer writes through it (it replaces
``oncelog.storage.fileio.fs``), every write also reaches the real files, and beside them it keeps
what a power cut at this instant would leave on disk.

Model (what POSIX promises, what LazyFS enforces, what ext4/xfs do in the worst case):
- a file's content is durable as of its last ``fsync``; bytes written since may or may not be
  on disk after a cut (each dirty 4 KiB page independently, with probability ``writeback``; with
  0 it is LazyFS's clear-cache: every unsynced write is lost);
- a name (create, rename, unlink, mkdir) is durable once its directory was fsynced; an unsynced
  name change survives a cut with probability ``writeback`` too. A rename is one change: its
  source disappears exactly when its target appears (journaling file systems commit a rename
  atomically; without that, a cut could leave the renamed inode with no name at all);
- ``cut_after(n)`` arms a cut: the n-th mutating operation from now raises ``PowerCut`` before it
  takes effect, anywhere in the broker (mid-flush, between two fsyncs of a commit, ...), and so
  does every mutating operation after it, in every thread: nothing happens after a power cut.

The broker calls it from several threads at once (the event loop, the flush thread, the sync
threads): every operation, the real system call and its bookkeeping, runs under one lock, so the
recording is the history of one disk, operation by operation, in the order they took effect.

``materialize(dest)`` writes the surviving state into ``dest``: a broker started there sees what
it would see after the machine came back.
"""

from __future__ import annotations

import os
import random
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from pathlib import Path
from typing import Any, TypeVar

from oncelog.storage import fileio

PAGE = 4096
F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    """Run ``method`` under the file system's lock: the system call and its bookkeeping are one
    step of the disk's history, never interleaved with another thread's."""
    @wraps(method)
    def run(self: CrashFS, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)
    return run  # type: ignore[return-value]


class PowerCut(BaseException):
    """Raised at the armed operation; BaseException so that no ``except Exception`` in the broker
    turns it into an error handled by the code under test."""


@dataclass
class Inode:
    content: bytearray = field(default_factory=bytearray)
    durable: bytes = b""
    dirty_pages: set[int] = field(default_factory=set)
    size_changed: bool = False

    def write(self, pos: int, data: bytes) -> None:
        end = pos + len(data)
        if end > len(self.content):
            self.content.extend(b"\0" * (end - len(self.content)))
            self.size_changed = True
        self.content[pos:end] = data
        self.dirty_pages.update(range(pos // PAGE, (end - 1) // PAGE + 1) if data else ())

    def truncate(self, size: int) -> None:
        if size < len(self.content):
            del self.content[size:]
        else:
            self.content.extend(b"\0" * (size - len(self.content)))
        self.size_changed = True

    def sync(self) -> None:
        self.durable = bytes(self.content)
        self.dirty_pages.clear()
        self.size_changed = False

    def after_cut(self, rng: random.Random, writeback: float) -> bytes:
        if writeback <= 0 or (not self.dirty_pages and not self.size_changed):
            return self.durable
        out = bytearray(self.durable)
        size = len(self.content) if rng.random() < writeback else len(self.durable)
        if len(out) < size:
            out.extend(b"\0" * (size - len(out)))
        del out[size:]
        for page in sorted(self.dirty_pages):
            if rng.random() < writeback:
                lo, hi = page * PAGE, min((page + 1) * PAGE, size, len(self.content))
                if lo < hi:
                    out[lo:hi] = self.content[lo:hi]
        return bytes(out)


class CrashFS(fileio.FileSystem):
    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self.inodes: dict[int, Inode] = {}
        self.names: dict[Path, int] = {}
        self.durable_names: dict[Path, int] = {}
        self.dirs: set[Path] = set()
        self.durable_dirs: set[Path] = set()
        self.fds: dict[int, int] = {}
        self.renames: dict[Path, tuple[Path, int]] = {}  # target -> (source, inode), not yet durable
        self._next_inode = 0
        self.countdown: int | None = None
        self.cut = False  # the power is out: every mutating operation raises PowerCut
        self.ops = 0
        self._lock = threading.RLock()  # one disk: operations take effect one at a time
        self._syncing_dir = False  # inside fsync_dir (under the lock): fsync of the directory's descriptor
        self.root.mkdir(parents=True, exist_ok=True)
        self.dirs.add(self.root)
        self.durable_dirs.add(self.root)
        for dirpath, dirnames, filenames in os.walk(self.root):
            d = Path(dirpath)
            for name in dirnames:
                self.dirs.add(d / name)
                self.durable_dirs.add(d / name)
            for name in filenames:
                data = (d / name).read_bytes()
                ino = self._new_inode(data)
                self.names[d / name] = self.durable_names[d / name] = ino

    # --- bookkeeping ---------------------------------------------------------------------------------
    def cut_after(self, n: int) -> None:
        self.countdown = n

    def _op(self) -> None:
        """Count a mutating operation (the caller holds the lock); raise if the power is, or now
        goes, out."""
        if self.cut:
            raise PowerCut("the power is out")
        self.ops += 1
        if self.countdown is not None:
            self.countdown -= 1
            if self.countdown <= 0:
                self.countdown = None
                self.cut = True
                raise PowerCut(f"power cut at operation {self.ops}")

    def _new_inode(self, data: bytes = b"") -> int:
        self._next_inode += 1
        self.inodes[self._next_inode] = Inode(bytearray(data), bytes(data))
        return self._next_inode

    def _key(self, path: Path | str) -> Path:
        p = Path(path)
        return p if p.is_absolute() else (Path.cwd() / p)

    def _inode_of(self, path: Path) -> Inode:
        key = self._key(path)
        ino = self.names.get(key)
        if ino is None:
            ino = self.names[key] = self._new_inode()
        return self.inodes[ino]

    # --- the FileSystem interface ----------------------------------------------------------------------
    @_locked
    def open_rw(self, path: Path) -> int:
        fd = super().open_rw(path)
        self._inode_of(path)
        self.fds[fd] = self.names[self._key(path)]
        return fd

    @_locked
    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> int:
        self._op()
        n = super().pwrite(fd, data, position)
        self.inodes[self.fds[fd]].write(position, bytes(data[:n]))
        return n

    @_locked
    def ftruncate(self, fd: int, size: int) -> None:
        self._op()
        super().ftruncate(fd, size)
        self.inodes[self.fds[fd]].truncate(size)

    @_locked
    def fsync(self, fd: int) -> None:
        self._op()
        super().fsync(fd)
        ino = self.fds.get(fd)
        if ino is not None:
            self.inodes[ino].sync()
        elif not self._syncing_dir:  # a descriptor the model lost track of: its fsync would go unrecorded
            raise AssertionError(f"CrashFS: fsync of descriptor {fd}, which it did not open")

    @_locked
    def close(self, fd: int) -> None:
        super().close(fd)
        self.fds.pop(fd, None)

    @_locked
    def dup(self, fd: int) -> int:
        new = super().dup(fd)
        self.fds[new] = self.fds[fd]
        return new

    @_locked
    def append_durable(self, path: Path, data: bytes, *, fsync: bool = True) -> None:
        self._op()
        super().append_durable(path, data, fsync=False)
        inode = self._inode_of(path)
        inode.write(len(inode.content), data)
        if fsync:
            inode.sync()

    @_locked
    def write_atomic(self, path: Path, data: bytes, *, durable_name: bool = True) -> None:
        self._op()
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        key = self._key(tmp)
        self.names[key] = self._new_inode(data)
        self.replace(tmp, path)
        if durable_name:
            self.fsync_dir(path.parent)

    @_locked
    def replace(self, src: Path, dst: Path) -> None:
        self._op()
        super().replace(src, dst)
        ino = self.names.pop(self._key(src))
        self.names[self._key(dst)] = ino
        self.renames.pop(self._key(src), None)
        self.renames[self._key(dst)] = (self._key(src), ino)

    @_locked
    def unlink(self, path: Path) -> None:
        self._op()
        super().unlink(path)
        self.names.pop(self._key(path), None)

    @_locked
    def mkdir(self, path: Path) -> None:
        key = self._key(path)
        if key in self.dirs and key.is_dir():
            return
        self._op()
        missing = [p for p in [key, *key.parents] if p not in self.dirs and self.root in p.parents]
        key.mkdir(parents=True, exist_ok=True)
        self.dirs.update(missing)
        self.fsync_dir(key.parent)

    @_locked
    def rmtree(self, path: Path) -> None:
        self._op()
        shutil.rmtree(path, ignore_errors=True)
        key = self._key(path)
        for name in [n for n in self.names if key in n.parents]:
            del self.names[name]
        self.dirs = {d for d in self.dirs if d != key and key not in d.parents}

    @_locked
    def fsync_dir(self, path: Path) -> None:
        self._op()
        self._syncing_dir = True  # the base class fsyncs the directory's descriptor through fsync()
        try:
            super().fsync_dir(path)
        finally:
            self._syncing_dir = False
        key = self._key(path)
        for name in [n for n in self.durable_names if n.parent == key and n not in self.names]:
            del self.durable_names[name]
        for name, ino in self.names.items():
            if name.parent == key:
                self.durable_names[name] = ino
        self.renames = {dst: (src, ino) for dst, (src, ino) in self.renames.items()
                        if dst.parent != key or src.parent != key}
        gone = {d for d in self.durable_dirs if d.parent == key and d not in self.dirs}
        self.durable_dirs -= {g for g in gone}
        self.durable_dirs -= {d for d in self.durable_dirs if any(g in d.parents for g in gone)}
        self.durable_dirs |= {d for d in self.dirs if d.parent == key}

    # --- after the cut -------------------------------------------------------------------------------
    @_locked
    def materialize(self, dest: Path, rng: random.Random, writeback: float = 0.0) -> dict[str, int]:
        """Write what survives a cut now into ``dest``; returns counts (for test diagnostics)."""
        dirs = set(self.durable_dirs)
        names = dict(self.durable_names)
        for d in self.dirs - self.durable_dirs:  # an unsynced mkdir the kernel happened to write back
            if rng.random() < writeback:
                dirs.add(d)
        paired: set[Path] = set()
        for dst, (src, ino) in self.renames.items():
            if self.names.get(dst) != ino or src in self.names:
                continue  # overwritten or recreated since: its parts are ordinary name changes
            paired |= {dst, src}
            if rng.random() < writeback:  # the rename reached the disk: both halves of it
                names[dst] = ino
                names.pop(src, None)
        for name, ino in self.names.items():
            if name not in paired and names.get(name) != ino and rng.random() < writeback:
                names[name] = ino
        for name in [n for n in names if n not in self.names and n not in paired]:
            if rng.random() < writeback:
                del names[name]  # an unsynced unlink or rename that reached the disk

        def reachable(p: Path) -> bool:
            return all(a in dirs for a in p.parents if self.root in a.parents or a == self.root)

        dest.mkdir(parents=True, exist_ok=True)
        stats = {"files": 0, "bytes": 0}
        for d in sorted(dirs):
            if self.root in d.parents and reachable(d):
                (dest / d.relative_to(self.root)).mkdir(parents=True, exist_ok=True)
        for name, ino in names.items():
            if self.root not in name.parents or not reachable(name):
                continue
            data = self.inodes[ino].after_cut(rng, writeback)
            target = dest / name.relative_to(self.root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            stats["files"] += 1
            stats["bytes"] += len(data)
        return stats

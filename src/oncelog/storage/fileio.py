"""Every write the storage layer makes to disk goes through ``fs``, one small interface.

Why one module: durability is a property of the *order* of writes, fsyncs and renames, and that
order is easiest to read, to change and to test when it is all in one place. Tests swap ``fs`` for a
recording file system that keeps, beside the real files, what would survive a power cut at any
instant (tests/storage/crashfs.py), the way LazyFS does from outside the process.

Rules the callers keep (each one is a durability invariant):
- ``write_atomic`` is the only way to replace a small metadata file: temp file, fsync, rename,
  fsync of the directory. After it returns the new content survives a power cut; before, the old.
- A new file (a segment, an index) is durable only after ``fsync_dir`` of its directory; a
  segment's creation is followed by one.
- ``fsync`` failing (EIO, ENOSPC on a thin volume) is not retried: the kernel may have dropped the
  dirty pages and cleared the error, so a retry would report success for data that is gone.
  Callers raise ``StorageOfflineError`` and stop writing (Kafka marks the log dir offline).

Reads use ordinary file APIs: they see what the process wrote (the page cache), as on any system.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oncelog.storage.fsync_ring import FsyncRing

#: errno values of a write refused because the file system (or the user's quota) is full.
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class StorageOfflineError(OSError):
    """A write or fsync failed: the log directory can no longer be trusted and takes no more writes."""


class FileSystem:
    """The real file system. Methods are the only write paths of the storage layer."""

    # --- file descriptors (segments) -------------------------------------------------------------
    def open_rw(self, path: Path) -> int:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def pwrite(self, fd: int, data: bytes | bytearray | memoryview, position: int) -> int:
        return os.pwrite(fd, data, position)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def fsync_ring(self, max_workers: int) -> FsyncRing | None:
        """An io_uring that fsyncs without a thread of ours (``fsync_ring.py``), or None where the
        kernel or the machine has none. Its fsyncs do not pass through :meth:`fsync`, so a file
        system that overrides :meth:`fsync` (a test's recording one) gets None: it sees every fsync."""
        if type(self).fsync is not FileSystem.fsync:
            return None
        from oncelog.storage.fsync_ring import open_ring

        return open_ring(max_workers=max_workers)

    def dup(self, fd: int) -> int:
        """A second descriptor of the same open file (a flush thread keeps the file open with it
        even if the loop closes its own, e.g. when retention deletes the segment meanwhile)."""
        return os.dup(fd)

    # --- whole files -------------------------------------------------------------------------------
    def append_durable(self, path: Path, data: bytes, *, fsync: bool = True) -> None:
        """Append ``data`` to ``path`` (created if missing) and fsync the file (unless ``fsync`` is
        False: then the bytes reach the disk when the kernel writes them back, or at a later fsync
        of the same file)."""
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self._write_all(fd, data)
            if fsync:
                self.fsync(fd)
        finally:
            os.close(fd)

    def write_atomic(self, path: Path, data: bytes, *, durable_name: bool = True) -> None:
        """Replace ``path`` with ``data``: the old or the new content survives a crash, never a mix.

        With ``durable_name`` the rename itself is made durable (fsync of the directory): after it
        returns, the new content survives. Without it, a crash may leave the old content; callers
        use that only where either version is valid (a newer checkpoint that may be lost). A
        failed write leaves the old content and removes the temporary file."""
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            self._write_all(fd, data)
            self.fsync(fd)
        except BaseException:
            # The old file stays; the part of the new one must not keep the room it took (a full
            # disk stays full otherwise, and the broker's next write of its own fails).
            os.close(fd)
            self.unlink(tmp)
            raise
        os.close(fd)
        self.replace(tmp, path)
        if durable_name:
            self.fsync_dir(path.parent)

    def _write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    # --- names -------------------------------------------------------------------------------------
    def replace(self, src: Path, dst: Path) -> None:
        os.replace(src, dst)

    def unlink(self, path: Path) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def mkdir(self, path: Path) -> None:
        """Create ``path`` (and parents) and make its entry durable in the parent directory."""
        if path.is_dir():
            return
        path.mkdir(parents=True, exist_ok=True)
        self.fsync_dir(path.parent)

    def rmtree(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def open_dir(self, path: Path) -> int:
        """A descriptor of the directory ``path``, to fsync (the caller closes it)."""
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    def fsync_dir(self, path: Path) -> None:
        fd = self.open_dir(path)
        try:
            self.fsync(fd)
        finally:
            os.close(fd)


fs: FileSystem = FileSystem()
"""The file system the storage layer writes through; tests replace it (never production code)."""


def read_file(path: Path) -> bytes | None:
    """The content of ``path``, or None if it does not exist."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None

"""Hold a broker's fsyncs of chosen files, and record its writes and fsyncs in order: for tests of
work the broker does off its event loop (tests/transactions).

``FsyncGate.hold(part)``: from then on an fsync, made off the main thread, of a file whose path
contains ``part`` waits until ``release()`` (``reached`` is set when one does). Fsyncs on the main
thread (the event loop in an in-process broker) are never held: a test would deadlock on them, and
they are what the held work must not do. With ``record``, ``events`` lists ("write" | "fsync",
path) in the order they happened (an fsync when it returned).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from oncelog.storage import fileio


def path_of(fd: int) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return f"fd {fd}"


class FsyncGate:
    def __init__(self, *, record: bool = False) -> None:
        self.events: list[tuple[str, str]] = []
        self.reached = threading.Event()
        self._go = threading.Event()
        self._holding: str | None = None
        self._lock = threading.Lock()
        self._record = record
        self._real_fsync, self._real_pwrite = fileio.fs.fsync, fileio.fs.pwrite
        fileio.fs.fsync = self._fsync  # type: ignore[method-assign]
        if record:
            fileio.fs.pwrite = self._pwrite  # type: ignore[method-assign]

    def _fsync(self, fd: int) -> None:
        path = path_of(fd) if self._holding or self._record else ""
        if self._holding and self._holding in path and threading.current_thread() is not threading.main_thread():
            self.reached.set()
            assert self._go.wait(30), "the held fsync was never released"
        self._real_fsync(fd)
        if self._record:
            with self._lock:
                self.events.append(("fsync", path))

    def _pwrite(self, fd: int, data: Any, offset: int) -> Any:
        with self._lock:
            self.events.append(("write", path_of(fd)))
        return self._real_pwrite(fd, data, offset)

    def hold(self, part: str) -> None:
        self.reached.clear()
        self._go.clear()
        self._holding = part

    def release(self) -> None:
        self._holding = None
        self._go.set()

    def close(self) -> None:
        """Release, and give the file system its own methods back."""
        self.release()
        fileio.fs.fsync = self._real_fsync  # type: ignore[method-assign]
        fileio.fs.pwrite = self._real_pwrite  # type: ignore[method-assign]

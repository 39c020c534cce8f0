"""A partition's background flush, planned on the loop thread and carried out on another.

``PartitionLog.begin_flush`` captures, without touching the disk: the log end offset ``end``, a
duplicate descriptor of every data file written since the last flush, the index entries not yet in
their files, the producer-state snapshot at ``end`` (whose offset is the recovery point on disk) and
the leader-epoch file. ``run`` then does the slow part anywhere (the broker's flush thread) in the
order the recovery relies on: data fsync, index appends, the directory when an index file was
created, the leader-epoch file, the snapshot. ``PartitionLog.finish_flush``, back on the loop thread,
moves the in-memory recovery point to ``end`` only after ``run`` returned.

Why this is safe while the loop keeps appending: a flush covers a prefix. The fsync of a data file
makes at least everything up to ``end`` durable (bytes appended meanwhile may be too, harmlessly);
index entries are immutable once written, and the ones captured all describe data below ``end``;
the snapshot is the state at ``end``, computed on the loop. Recovery trusts only what is below the
recovery point on disk and rescans the rest, so anything the loop wrote after the capture is
treated exactly as unflushed data always was.

Only ``fileio.fs`` is used, so the recording file system of the power-cut tests sees every step.
One job per partition is in flight at a time (``PartitionLog`` enforces it).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from oncelog.storage import fileio


@dataclass
class FlushJob:
    directory: Path
    end: int
    # light: a periodic background flush. Only what recovery relies on below the recovery point is
    # fsynced -- the data, the aborted-transaction index, the snapshot's content; the offset and time
    # index entries (hints, rebuilt or scanned past if short) and the snapshot's new name reach the
    # disk with the kernel's writeback or the next full flush (a crash then leaves the previous
    # snapshot: an older recovery point, valid, with a longer rescan). Not light: everything,
    # names included (before segments are deleted or swapped, and at close).
    light: bool = False
    fds: list[int] = field(default_factory=list)
    index_appends: list[tuple[Path, bytes, bool]] = field(default_factory=list)  # (path, bytes, fsync)
    new_names: bool = False  # fsync the directory (after the index appends, before the snapshot)
    rolls: int | None = None  # with new_names for a roll's segment: the rolls whose names it makes durable
    epochs: tuple[Path, bytes] | None = None
    snapshot: tuple[Path, bytes] | None = None
    snapshot_mark: tuple[int, int, int, int] | None = None  # see PartitionLog._snapshot_due
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    _claim: threading.Lock = field(default_factory=threading.Lock)
    _started: bool = False

    def run(self) -> None:
        """The disk work, in order, once: whoever calls first (the flush thread, or the loop thread
        that cannot wait any longer) does it; a later call returns at once. Raises OSError (the
        caller takes the log directory offline); ``done`` is set when it ends (``error`` says how)."""
        with self._claim:
            if self._started:
                return
            self._started = True
        try:
            for fd in self.fds:
                fileio.fs.fsync(fd)
            for path, data, fsync in self.index_appends:
                fileio.fs.append_durable(path, data, fsync=fsync)
            if self.new_names:
                fileio.fs.fsync_dir(self.directory)
            if self.epochs is not None:
                fileio.fs.write_atomic(*self.epochs)
            if self.snapshot is not None:
                fileio.fs.write_atomic(*self.snapshot, durable_name=not self.light)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            self.release()
            self.done.set()

    def cancel(self) -> bool:
        """Its log is being deleted, so its work is of no use: if nobody has started it, it never
        runs (a later ``run`` returns at once; ``done`` is set, ``error`` None) and this returns True.
        False if it is running or ran: then the log's files must not be removed before ``done``
        (a snapshot written late could land in a new topic's directory of the same name)."""
        with self._claim:
            started, self._started = self._started, True
        if started:
            return False
        self.release()
        self.done.set()
        return True

    def release(self) -> None:
        for fd in self.fds:
            try:
                fileio.fs.close(fd)
            except OSError:
                pass
        self.fds = []

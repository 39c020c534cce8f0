"""The log directory's recovery-point checkpoint, and the background flush pass that writes it.

``<data_dir>/recovery-point-offset-checkpoint`` (Kafka's file name) holds one line per partition:
``<topic> <partition> <recovery point> <topic id>`` after a version line and a count line. A
partition's recovery point on disk is the larger of this file's value and its producer-state
snapshot's offset (``PartitionLog._load``). The periodic flush used to write a snapshot for every
partition it flushed, an fsync each (two per partition per second with the data's); now a pass
fsyncs the data of every due partition, then writes this one file once, as Kafka's
``checkpointLogRecoveryOffsets`` does, and a partition writes its snapshot only now and then
(``PartitionLog._snapshot_due``). Recovery then replays producer state from the snapshot up to the
recovery point without validating the data there (it was fsynced), and validates only what is
above it, as before.

Invariants:

- a value in the file is never above what is durable: a pass writes it only after the fsyncs of
  every job it counts returned (a job another thread took over is awaited, and a failed one is
  not counted); the other partitions' values are their in-memory recovery points, which move
  only after such fsyncs;
- a value applies to one incarnation of a partition: the topic id must match the topic's in
  ``topics.json``, so a topic deleted and created again under its name (a crash before the next
  pass) does not inherit the old recovery point;
- the file is replaced atomically (temporary file, fsync, rename) and the rename is made durable
  (a directory fsync, one per pass): the previous file would be valid too, but then how far a
  recovery rescans would depend on the kernel's writeback, not on the last pass.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncelog.storage import fileio
from oncelog.storage.flush_job import FlushJob

log = logging.getLogger("oncelog.storage")

FILE_NAME = "recovery-point-offset-checkpoint"
VERSION = 1

Points = dict[tuple[str, int], tuple[int, uuid.UUID]]  # (topic, partition) -> (recovery point, topic id)


def encode(points: Points) -> bytes:
    lines = [str(VERSION), str(len(points))]
    lines += [f"{topic} {partition} {offset} {topic_id}" for (topic, partition), (offset, topic_id) in points.items()]
    return ("\n".join(lines) + "\n").encode()


def read(path: Path) -> Points:
    """The checkpoint's entries; empty (with a WARNING) if the file is missing or unreadable:
    every partition then recovers from its snapshot, which is always valid on its own."""
    raw = fileio.read_file(path)
    if raw is None:
        return {}
    try:
        lines = raw.decode().splitlines()
        if int(lines[0]) != VERSION or int(lines[1]) != len(lines) - 2:
            raise ValueError(f"version {lines[0]}, {lines[1]} entries for {len(lines) - 2} lines")
        points: Points = {}
        for line in lines[2:]:
            topic, partition, offset, topic_id = line.split(" ")
            if int(offset) < 0:
                raise ValueError(f"negative recovery point in {line!r}")
            points[(topic, int(partition))] = (int(offset), uuid.UUID(topic_id))
        return points
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        log.warning("ignoring %s (%s): every partition recovers from its producer-state snapshot", path, exc)
        return {}


@dataclass
class FlushPass:
    """One periodic flush of every due partition: planned on the loop thread
    (``LogManager.begin_flush_pass``), :meth:`run` anywhere (the broker's flush thread), finished
    on the loop thread (``LogManager.finish_flush_pass``), which moves the in-memory recovery points.

    ``points`` starts as every partition's in-memory recovery point at planning; :meth:`run`
    raises the ones whose job it saw succeed to the job's end before writing the file."""

    path: Path
    jobs: list[tuple[Any, FlushJob]]  # (PartitionLog, its job)
    points: Points
    error: BaseException | None = None
    wrote_checkpoint: bool = False

    def run(self) -> None:
        """Every job (each once, see ``FlushJob.run``), then the checkpoint, if a job moved a
        recovery point that no snapshot of its own records. Never raises: an error is kept in the
        job or in ``error``, and finishing the pass takes the directory offline."""
        try:
            need_checkpoint = False
            failed = False
            for plog, job in self.jobs:
                try:
                    job.run()
                except OSError:
                    pass  # kept in job.error
                job.done.wait()  # if the loop thread took the job over, until it finished there
                if job.error is not None:
                    failed = True
                    continue
                key = (plog.topic, plog.partition)
                current = self.points.get(key)
                if current is not None and job.end > current[0]:
                    self.points[key] = (job.end, current[1])
                    need_checkpoint = need_checkpoint or job.snapshot is None
            if need_checkpoint and not failed:
                fileio.fs.write_atomic(self.path, encode(self.points))
                self.wrote_checkpoint = True
        except OSError as exc:
            self.error = exc

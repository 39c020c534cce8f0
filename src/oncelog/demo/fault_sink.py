"""Fault injection for the Spark sink, for tests and the demo only: never part of the sink's options.

``format("oncelog-faults")`` is the ``oncelog`` data source with a writer that takes extra
``fault.*`` options, strips them, and passes the rest to the real sink. The faults:

- ``fault.delayBeforeCommitMs``: pause at the sink's most fragile moment (exactly_once: output
  flushed, transaction open; at_least_once: output acknowledged; at_most_once: batch marked, output
  not sent), so a driver kill lands there.
- ``fault.killDriverInCommit=B``: in the driver's ``commit`` of batch ``B`` — after every task of the
  batch committed, before Spark writes its commit log entry — SIGKILL the driver's process group
  ``fault.driverPgid`` (then this worker). On restart Spark replays batch ``B``.
- ``fault.killExecutorBeforeCommit=B:P`` / ``fault.killExecutorAfterCommit=B:P``: in the task writing
  partition ``P`` of batch ``B``, SIGKILL the executor JVM that runs it (local-cluster, standalone,
  YARN: a separate process) just before its transaction commits, or just after it committed and
  before Spark sees the result.
- ``fault.commitReport=PATH``: the driver appends one JSON line per committed batch (batch id, rows,
  partitions written and skipped) — how tests see what a replay skipped.
- ``fault.markerDir=DIR``: every kill happens once (an ``O_EXCL`` marker file per kill), so the
  replay after it runs clean.

:class:`FaultHooks` is the same thing for :func:`~oncelog.spark.foreach_batch.kafka_foreach_batch`
and direct :func:`~oncelog.spark.sink.write_partition` calls.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncelog.spark import OncelogDataSource
from oncelog.spark.guarantees import Guarantee
from oncelog.spark.sink import KafkaStreamWriter, SinkCommitMessage, SinkHooks, TaskIdentity

FAULT_PREFIX = "fault."


def _task(spec: str | None) -> tuple[int, int] | None:
    if not spec:
        return None
    batch, _, part = spec.partition(":")
    return int(batch), int(part or 0)


def once(marker_dir: str | None, name: str) -> bool:
    """True the first time ``name`` is claimed in ``marker_dir`` (any process); always True without a dir."""
    if not marker_dir:
        return True
    Path(marker_dir).mkdir(parents=True, exist_ok=True)
    try:
        os.close(os.open(os.path.join(marker_dir, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def executor_pid() -> int:
    """The executor JVM running this Python worker: the nearest ancestor that is an executor backend."""
    pid = os.getppid()
    while pid > 1:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        if b"ExecutorBackend" in cmdline:
            return pid
        stat = Path(f"/proc/{pid}/stat").read_text()
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    raise RuntimeError("no executor JVM above this Python worker (local mode runs tasks in the driver)")


def kill_executor() -> None:
    os.kill(executor_pid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)  # and this worker, so no result reaches Spark


@dataclass
class FaultHooks(SinkHooks):
    """Executor-side faults (see the module doc); picklable, shipped with the writer or the closure."""

    delay_before_commit_ms: int = 0
    kill_before_commit: tuple[int, int] | None = None
    kill_after_commit: tuple[int, int] | None = None
    marker_dir: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> FaultHooks:
        get = {k.lower(): v for k, v in options.items()}.get
        return cls(int(get("fault.delaybeforecommitms") or 0), _task(get("fault.killexecutorbeforecommit")),
                   _task(get("fault.killexecutoraftercommit")), get("fault.markerdir"))

    def before_commit(self, ident: TaskIdentity, guarantee: Guarantee) -> None:
        if self.delay_before_commit_ms:
            time.sleep(self.delay_before_commit_ms / 1000)
        if self.kill_before_commit == (ident.batch_id, ident.partition_id) and \
                once(self.marker_dir, f"executor-before-{ident.batch_id}-{ident.partition_id}"):
            kill_executor()

    def after_commit(self, ident: TaskIdentity, message: SinkCommitMessage) -> None:
        if self.kill_after_commit == (ident.batch_id, ident.partition_id) and not message.skipped and \
                once(self.marker_dir, f"executor-after-{ident.batch_id}-{ident.partition_id}"):
            kill_executor()


class FaultInjectingStreamWriter(KafkaStreamWriter):
    def __init__(self, options: Mapping[str, str]) -> None:
        faults = {k: v for k, v in options.items() if k.lower().startswith(FAULT_PREFIX)}
        super().__init__({k: v for k, v in options.items() if not k.lower().startswith(FAULT_PREFIX)})
        hooks = FaultHooks.from_options(faults)
        self.hooks = hooks
        self.marker_dir = hooks.marker_dir
        get = {k.lower(): v for k, v in faults.items()}.get
        self.kill_driver_batch = int(get("fault.killdriverincommit") or -1)
        self.driver_pgid = int(get("fault.driverpgid") or 0)
        self.commit_report = get("fault.commitreport")

    def commit(self, messages: list[Any], batchId: int) -> None:
        super().commit(messages, batchId)
        if self.commit_report and self.last_commit is not None:
            c = self.last_commit
            with open(self.commit_report, "a") as f:
                f.write(json.dumps({"batch": batchId, "rows": c.rows, "written": c.written,
                                    "skipped": c.skipped}) + "\n")
        if batchId == self.kill_driver_batch and once(self.marker_dir, f"driver-commit-{batchId}"):
            kill_driver(self.driver_pgid)


def kill_driver(pgid: int) -> None:
    """SIGKILL the driver's process group (Python driver and JVM), then this process."""
    if pgid <= 0:
        raise RuntimeError("fault.driverPgid is needed to kill the driver")
    os.killpg(pgid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class FaultInjectingDataSource(OncelogDataSource):
    """``format("oncelog-faults")``: the oncelog source and sink, with the sink's faults."""

    @classmethod
    def name(cls) -> str:
        return "oncelog-faults"

    def _stream_writer(self) -> Any:
        return FaultInjectingStreamWriter(self.options)


def register(spark: Any) -> None:
    spark.dataSource.register(FaultInjectingDataSource)

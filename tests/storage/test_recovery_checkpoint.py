"""The recovery-point checkpoint (``storage/recovery_checkpoint.py``): periodic flushes record a
partition's recovery point in one file per log directory and write producer-state snapshots only
now and then, so recovery replays producer state from an older snapshot up to the recovery point.

The model-based test drives a log manager with idempotent and transactional producers (duplicates
retried, transactions committed, aborted and left open), flush passes planned and run in any
order, full flushes, rolls, DeleteRecords and crashes (the process dies: everything written stays,
nothing is closed), with the snapshot interval drawn per run from "every flush" to "never". After
each restart the recovered partition must be the one that crashed: the same producers and sequence
windows, open transactions, LSO, aborted-transaction index, and a retry of any batch still in a
producer's window is found to be a duplicate. Power cuts of the same code run in
``test_power_cut.py``.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import tempfile
import threading
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from oncelog.clock import ManualClock
from oncelog.storage import fileio, partition_log, recovery_checkpoint
from oncelog.storage.config import LogConfig
from oncelog.storage.log_manager import LogManager
from oncelog.storage.producer_state import AppendOrigin
from tests.storage.crashfs import CrashFS, PowerCut
from tests.storage.helpers import batch, marker

TOPIC = "t"
PIDS = [1000, 1001, 1002]
STATS = {"restarts": 0, "replayed": 0}  # restarts, and those that replayed from an older snapshot


def _crash(logs: LogManager) -> None:
    """What a killed process leaves: every write made stays, no flush, no close; descriptors dropped."""
    for plog in logs.partitions().values():
        job = plog._flush_job
        if job is not None:
            job.release()
        for seg in plog.segments:
            seg.abandon()


def _state(logs: LogManager) -> dict:
    plog = logs.get_partition(TOPIC, 0)
    assert plog is not None
    producers = {pid: (e.producer_epoch, [(b.first_seq, b.last_seq, b.first_offset, b.last_offset)
                                           for b in e.batches], e.current_txn_first_offset)
                 for pid, e in plog.producer_state.producers.items()}
    return {"end": plog.log_end_offset, "lso": plog.last_stable_offset, "start": plog.log_start_offset,
            "producers": producers, "ongoing": dict(plog.producer_state.ongoing),
            "aborted": plog.aborted_transactions(plog.log_start_offset, plog.log_end_offset)}


def _open(directory: Path, clock: ManualClock, partitions: int = 1) -> tuple[LogManager, partition_log.PartitionLog]:
    """A log manager on ``directory`` (with topic TOPIC, created if new) and TOPIC's partition 0."""
    logs = LogManager(directory, LogConfig(), clock)
    if TOPIC not in logs.topics():
        logs.create_topic(TOPIC, partitions, {})
    plog = logs.get_partition(TOPIC, 0)
    assert plog is not None
    return logs, plog


def _plan_pass(logs: LogManager, clock: ManualClock) -> recovery_checkpoint.FlushPass:
    """The periodic flush 2 s later (every partition with new data is due)."""
    clock.advance(2_000)
    flush_pass = logs.begin_flush_pass(clock.now_ms())
    assert flush_pass is not None
    return flush_pass


def _flush_pass(logs: LogManager, clock: ManualClock) -> None:
    flush_pass = _plan_pass(logs, clock)
    flush_pass.run()
    logs.finish_flush_pass(flush_pass)


class CheckpointMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="oncelog-ckpt-"))
        self.clock = ManualClock(1_000_000)
        self.cfg = LogConfig(segment_bytes=4_096)
        self.logs = LogManager(self.dir, self.cfg, self.clock)
        self.logs.create_topic(TOPIC, 1, {})
        self.epoch = {pid: 0 for pid in PIDS}
        self.seq = {pid: 0 for pid in PIDS}
        self.in_txn: set[int] = set()
        self.sent: dict[int, list[tuple[bool, bytes]]] = {pid: [] for pid in PIDS}  # (transactional, batch)
        self.passes: list[recovery_checkpoint.FlushPass] = []

    @property
    def plog(self) -> partition_log.PartitionLog:
        plog = self.logs.get_partition(TOPIC, 0)
        assert plog is not None
        return plog

    @rule(pid=st.sampled_from(PIDS), n=st.integers(1, 3), txn=st.booleans())
    def produce(self, pid: int, n: int, txn: bool) -> None:
        if pid in self.in_txn:
            txn = True
        data = batch(n, pid=pid, epoch=self.epoch[pid], seq=self.seq[pid], txn=txn, ts=self.clock.now_ms(),
                     size=40)
        result = self.plog.append(data)
        assert not result.duplicate
        self.sent[pid].append((txn, data))
        self.seq[pid] += n
        if txn:
            self.in_txn.add(pid)

    @rule(pid=st.sampled_from(PIDS), back=st.integers(1, 5))
    def retry(self, pid: int, back: int) -> None:
        """A retry of one of the producer's last five batches (Kafka keeps five): a duplicate."""
        if len(self.sent[pid]) < back:
            return
        txn, data = self.sent[pid][-back]
        if txn or pid not in self.in_txn:  # else refused as a plain batch inside a transaction
            assert self.plog.append(data).duplicate

    @rule(pid=st.sampled_from(PIDS), commit=st.booleans())
    def end_txn(self, pid: int, commit: bool) -> None:
        if pid not in self.in_txn:
            return
        self.plog.append(marker(commit, pid, self.epoch[pid]), origin=AppendOrigin.COORDINATOR)
        self.in_txn.discard(pid)

    @rule(ms=st.integers(0, 40_000))
    def plan_pass(self, ms: int) -> None:
        self.clock.advance(ms)
        flush_pass = self.logs.begin_flush_pass(self.clock.now_ms())
        if flush_pass is not None:
            self.passes.append(flush_pass)

    @precondition(lambda self: bool(self.passes))
    @rule(i=st.integers(0, 10))
    def run_pass(self, i: int) -> None:
        flush_pass = self.passes.pop(i % len(self.passes))
        flush_pass.run()
        assert flush_pass.error is None
        self.logs.finish_flush_pass(flush_pass)

    @rule()
    def full_flush(self) -> None:
        self.plog.flush()

    @rule()
    def roll(self) -> None:
        if self.plog.active.size:
            self.plog.roll()

    @rule(fraction=st.floats(0, 1))
    def delete_records(self, fraction: float) -> None:
        plog = self.plog
        target = plog.log_start_offset + int((plog.high_watermark - plog.log_start_offset) * fraction)
        plog.delete_records(target)

    @rule(keep=st.integers(2_000, 30_000))
    def retention(self, keep: int) -> None:
        """retention.bytes deletes old segments: a snapshot must cover them first."""
        plog = self.plog
        plog.set_config(dataclasses.replace(self.cfg, retention_bytes=keep))
        plog.apply_retention(self.clock.now_ms())
        plog.set_config(self.cfg)

    @rule(run_first=st.booleans())
    def crash_and_restart(self, run_first: bool) -> None:
        if run_first:  # some planned passes reached the disk before the crash, the rest did not
            for flush_pass in self.passes[: len(self.passes) // 2]:
                flush_pass.run()
        before = _state(self.logs)
        snapshot_behind = self.plog.snapshot_offset is None or self.plog.snapshot_offset < self.plog.recovery_point
        _crash(self.logs)
        self.passes = []
        self.logs = LogManager(self.dir, self.cfg, self.clock)
        STATS["restarts"] += 1
        STATS["replayed"] += snapshot_behind
        after = _state(self.logs)
        assert after == before
        # Every batch still in a producer's window is a duplicate after the restart too.
        for pid in PIDS:
            for txn, data in self.sent[pid][-5:]:
                if txn or pid not in self.in_txn:
                    assert self.plog.append(data).duplicate

    @invariant()
    def recovery_point_bounds(self) -> None:
        plog = self.plog
        assert plog.recovery_point <= plog.log_end_offset
        assert plog.snapshot_offset is None or plog.snapshot_offset <= plog.recovery_point

    def teardown(self) -> None:
        _crash(self.logs)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.mark.parametrize("interval_ms", [0, 30_000, 10**12], ids=["every-flush", "30s", "never"])
def test_recovery_matches_the_crashed_log(interval_ms: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS", interval_ms)
    STATS.update(restarts=0, replayed=0)
    examples = int(os.environ.get("ONCELOG_CHECKPOINT_EXAMPLES", "60"))
    run_state_machine_as_test(CheckpointMachine, settings=settings(
        max_examples=examples, stateful_step_count=60, deadline=None, suppress_health_check=list(HealthCheck)))
    assert STATS["restarts"] > 20
    if interval_ms:
        assert STATS["replayed"] > 5, STATS  # the path under test was taken


def test_checkpoint_alone_moves_the_recovery_point_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With snapshots due only at a roll, a pass writes no snapshot: the checkpoint alone carries
    the new recovery point, and a restart scans only what is above it (replaying the rest)."""
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS", 10**12)
    clock = ManualClock(1_000_000)
    logs, plog = _open(tmp_path, clock, partitions=2)
    for seq in range(0, 30, 3):
        plog.append(batch(3, pid=7, epoch=0, seq=seq))
        _flush_pass(logs, clock)
    assert plog.snapshot_offset is None  # a new log: none was due
    assert plog.recovery_point == 30
    points = recovery_checkpoint.read(tmp_path / recovery_checkpoint.FILE_NAME)
    topic_id = logs.topics()[TOPIC].topic_id
    assert points == {(TOPIC, 0): (30, topic_id), (TOPIC, 1): (0, topic_id)}
    _crash(logs)
    logs, plog = _open(tmp_path, clock)
    assert plog.recovery_point == 30
    assert plog.producer_state.producers[7].last_seq == 29
    assert plog.append(batch(3, pid=7, epoch=0, seq=27)).duplicate


def test_a_recreated_topic_does_not_inherit_the_old_recovery_point(tmp_path: Path) -> None:
    """A topic deleted and created again under its name before the next pass: the checkpoint's
    value carries the old topic id and is ignored (else recovery would trust offsets never written)."""
    clock = ManualClock(1_000_000)
    path = tmp_path / recovery_checkpoint.FILE_NAME
    logs = LogManager(tmp_path, LogConfig(), clock)
    logs.create_topic(TOPIC, 1, {})
    old_id = logs.topics()[TOPIC].topic_id
    logs.delete_topic(TOPIC)
    logs.create_topic(TOPIC, 1, {})
    plog = logs.get_partition(TOPIC, 0)
    assert plog is not None
    plog.append(batch(2))
    # What a pass of the old incarnation left: recovery point 500 for the name.
    path.write_bytes(recovery_checkpoint.encode({(TOPIC, 0): (500, old_id)}))
    _crash(logs)
    logs, plog = _open(tmp_path, clock)
    assert plog.log_end_offset == 2 and plog.recovery_point <= 2


def test_an_unreadable_checkpoint_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / recovery_checkpoint.FILE_NAME
    for raw in (b"", b"1\n2\nt 0 5 " + str(uuid.uuid4()).encode() + b"\n", b"9\n0\n", b"1\n1\nt 0 -1 x\n", b"\xff"):
        path.write_bytes(raw)
        assert recovery_checkpoint.read(path) == {}
    assert "ignoring" in caplog.text
    assert recovery_checkpoint.read(tmp_path / "missing") == {}


def test_a_failed_checkpoint_takes_the_directory_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS", 10**12)
    clock = ManualClock(1_000_000)
    logs, plog = _open(tmp_path, clock)
    plog.append(batch(1))
    plog.flush()  # the snapshot: later passes are not due one
    plog.append(batch(1))
    flush_pass = _plan_pass(logs, clock)
    (tmp_path / (recovery_checkpoint.FILE_NAME + ".tmp")).mkdir()  # the temporary file cannot be made
    flush_pass.run()
    assert isinstance(flush_pass.error, OSError)
    with pytest.raises(OSError):
        logs.finish_flush_pass(flush_pass)
    assert logs.dir_state.offline_reason is not None


def test_a_power_cut_at_any_step_of_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass that writes no snapshot, cut at each of its disk operations in turn, the unsynced
    writes lost (LazyFS's clear-cache): the recovery point found on disk is never above the data,
    and the log end offset is where the surviving data ends."""
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS", 10**12)
    saved = fileio.fs
    try:
        step = 0
        while True:
            step += 1
            before, after = tmp_path / f"before-{step}", tmp_path / f"after-{step}"
            recording = CrashFS(before)
            fileio.fs = recording
            clock = ManualClock(1_000_000)
            logs, plog = _open(before, clock, partitions=2)
            plog.append(batch(3, pid=7, epoch=0, seq=0))
            for p in range(2):
                other = logs.get_partition(TOPIC, p)
                assert other is not None
                other.flush(force=True)  # durable: snapshots at 3 and 0
                other.append(batch(2, pid=8 + p, epoch=0, seq=0, size=5_000))
            flush_pass = _plan_pass(logs, clock)
            assert all(job.snapshot is None for _plog, job in flush_pass.jobs)
            recording.cut_after(step)
            try:
                flush_pass.run()
                cut = False
            except PowerCut:
                cut = True
            _crash(logs)
            recording.materialize(after, random.Random(step), 0.0)
            fileio.fs = saved
            logs = LogManager(after, LogConfig(), clock)
            for p in range(2):
                plog = logs.get_partition(TOPIC, p)
                assert plog is not None
                data_end = max((h.last_offset + 1 for seg in plog.segments for _pos, h, _d in seg.iter_batches()),
                               default=0)
                assert plog.log_end_offset == data_end, f"cut at step {step}: {TOPIC}-{p}"
                assert plog.recovery_point <= data_end
            _crash(logs)
            if not cut:
                assert logs.get_partition(TOPIC, 0).log_end_offset == 5  # the whole pass reached the disk
                break
    finally:
        fileio.fs = saved
    assert step > 4  # the pass's fsyncs and the checkpoint's steps were each cut


def test_a_pass_waits_for_a_job_the_loop_took_over(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The loop thread may run a planned job itself (``wait_for_flush`` before a deletion) while
    the pass is queued: the pass must not record that job's end in the checkpoint before the
    job's fsync returned on the other thread."""
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS", 10**12)
    clock = ManualClock(1_000_000)
    logs, plog = _open(tmp_path, clock)
    plog.flush(force=True)
    plog.append(batch(2))
    flush_pass = _plan_pass(logs, clock)
    in_fsync, release = threading.Event(), threading.Event()
    order: list[str] = []

    class SlowFS(fileio.FileSystem):
        def fsync(self, fd: int) -> None:
            if threading.current_thread().name == "loop" and not in_fsync.is_set():
                in_fsync.set()
                assert release.wait(10)
                order.append("data fsync returned")
            super().fsync(fd)

        def write_atomic(self, path: Path, data: bytes, *, durable_name: bool = True) -> None:
            if path.name == recovery_checkpoint.FILE_NAME:
                order.append("checkpoint")
            super().write_atomic(path, data, durable_name=durable_name)

    monkeypatch.setattr(fileio, "fs", SlowFS())
    loop = threading.Thread(target=plog.wait_for_flush, name="loop")
    loop.start()
    assert in_fsync.wait(10)
    runner = threading.Thread(target=flush_pass.run)
    runner.start()
    runner.join(0.3)  # the pass is waiting for the job, not writing the checkpoint
    release.set()
    loop.join(10)
    runner.join(10)
    assert order == ["data fsync returned", "checkpoint"]
    logs.finish_flush_pass(flush_pass)
    assert plog.recovery_point == 2


def test_a_clean_stop_leaves_nothing_to_replay(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots lag the recovery point by design; a clean close writes one at the log end."""
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS", 10**12)
    clock = ManualClock(1_000_000)
    logs, plog = _open(tmp_path, clock)
    plog.append(batch(3, pid=7, epoch=0, seq=0))
    _flush_pass(logs, clock)
    assert plog.recovery_point == 3 and plog.snapshot_offset is None
    logs.close()
    logs, plog = _open(tmp_path, clock)
    assert plog.snapshot_offset == plog.recovery_point == 3
    assert plog.producer_state.producers[7].last_seq == 2
    logs.close()


def test_a_pass_encodes_a_bounded_number_of_snapshot_entries_and_a_later_one_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots are encoded on the loop: a pass stops taking them past SNAPSHOT_PASS_ENTRIES (the
    partition that crosses it included), the others still flush and move their recovery point, and
    a crash then replays their producer state from the log."""
    from oncelog.storage import log_manager

    monkeypatch.setattr(log_manager, "SNAPSHOT_PASS_ENTRIES", 10)
    clock = ManualClock(1_000_000)
    logs, _ = _open(tmp_path / "d", clock, partitions=4)
    parts = [logs.get_partition(TOPIC, p) for p in range(4)]
    for p, plog in enumerate(parts):
        assert plog is not None
        for pid in range(6):
            plog.append(batch(pid=100 * p + pid, epoch=0, seq=0))
    clock.advance(partition_log.SNAPSHOT_INTERVAL_MS)  # every partition's snapshot is due
    first = _plan_pass(logs, clock)
    assert [(plog.partition, job.snapshot is not None) for plog, job in first.jobs] == \
        [(0, True), (1, True), (2, False), (3, False)]
    first.run()
    logs.finish_flush_pass(first)
    assert all(plog is not None and plog.recovery_point == 6 for plog in parts)

    def producers(manager: LogManager) -> list[dict]:
        return [{pid: (e.producer_epoch, e.last_seq) for pid, e in plog.producer_state.producers.items()}
                for p in range(4) if (plog := manager.get_partition(TOPIC, p)) is not None]

    again, _ = _open(tmp_path / "d", clock, partitions=4)  # a crash: the first manager is never closed
    assert producers(again) == producers(logs) and all(len(ps) == 6 for ps in producers(again))
    for plog in parts[2:]:
        assert plog is not None
        plog.append(batch(pid=100 * plog.partition, epoch=0, seq=1))
    second = _plan_pass(logs, clock)
    assert [(plog.partition, job.snapshot is not None) for plog, job in second.jobs] == [(2, True), (3, True)]


def test_a_clean_stop_rewrites_the_checkpoint_with_where_each_partition_stands(tmp_path: Path) -> None:
    """A stale checkpoint value (here one past the data, as a log cut below it leaves) was kept by a
    clean stop and met again at every start. A clean stop now writes every partition's recovery
    point, as Kafka's shutdown checkpoints its logs; a crash leaves the file as it was."""
    from tests.inproc import InProcessBroker

    b = InProcessBroker(tmp_path)
    try:
        b.create_topic(TOPIC, 2)
        assert b.produce(TOPIC, 0, batch(3)) == 0
        path = tmp_path / recovery_checkpoint.FILE_NAME
        topic_id = b.broker.logs.topics()[TOPIC].topic_id
        stale = {(TOPIC, 0): (1150, topic_id), (TOPIC, 1): (7, topic_id)}
        path.write_bytes(recovery_checkpoint.encode(stale))
        b.restart(clean=False)
        assert recovery_checkpoint.read(path) == stale
        b.restart(clean=True)
        points = recovery_checkpoint.read(path)
        assert points[(TOPIC, 0)] == (3, topic_id) and points[(TOPIC, 1)] == (0, topic_id)
    finally:
        b.close()

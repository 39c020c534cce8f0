"""Group records (OffsetCommit, TxnOffsetCommit, OffsetDelete, membership, offset expiry) never
fsync on the event loop (``Coordination.apply_group_records``).

Invariants, on an in-process broker whose fsyncs can be held:
- where appends must be durable before they are acknowledged (flush_every_append), the answer
  waits for the fsync of the group's ``__consumer_offsets`` partition, which runs off the loop;
  other clients are served meanwhile; with the background fsync the answer does not wait;
- records nobody answers after (the offset-expiry timer) are fsynced in the background;
- in neither case does the loop's own thread fsync an offsets partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.storage import fileio
from tests.fsync_gate import FsyncGate, path_of
from tests.inproc import API_TXN_OFFSET_COMMIT, InProcessBroker, Started
from tests.storage.helpers import batch

OFFSETS = "__consumer_offsets"
API_OFFSET_COMMIT, API_OFFSET_FETCH, API_ADD_OFFSETS_TO_TXN = 8, 9, 25


@pytest.fixture
def fs(monkeypatch: pytest.MonkeyPatch) -> Iterator[FsyncGate]:
    gate = FsyncGate()
    on_loop: list[str] = []
    held = fileio.fs.fsync

    def watched(fd: int) -> None:
        # the loop's thread while the loop runs (not start-up, close or restart, which own the thread)
        if asyncio._get_running_loop() is not None and OFFSETS in path_of(fd):
            on_loop.append(path_of(fd))
        held(fd)

    monkeypatch.setattr(fileio.fs, "fsync", watched)
    gate.on_loop = on_loop  # type: ignore[attr-defined]
    yield gate
    gate.release()
    monkeypatch.undo()
    gate.close()
    assert on_loop == [], "the event loop's thread fsynced an offsets partition"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Callable[[bool], InProcessBroker]]:
    """``broker(every_append)``: an in-process broker with topics "t" and "other", closed at the end."""
    opened: list[InProcessBroker] = []

    def make(every_append: bool) -> InProcessBroker:
        b = InProcessBroker(tmp_path / "data", flush_every_append=every_append, offsets_retention_minutes=60)
        b.create_topic("t", 1)
        b.create_topic("other", 1)
        opened.append(b)
        return b

    yield make
    for b in opened:
        b.close()


def _start_held(b: InProcessBroker, fs: FsyncGate, api_key: int, version: int, fields: dict[str, Any]) -> Started:
    """Start a request whose answer must wait for an offsets partition's fsync, held off the loop;
    check that it waits and that the loop serves another client meanwhile; then release the fsync."""
    fs.hold(OFFSETS)
    started = b.start(api_key, version, fields)
    b.run_until(fs.reached.is_set)
    assert not started.task.done()  # the answer waits for the fsync...
    assert b.produce("other", 0, batch(value=b"meanwhile")) == 0  # ...which leaves the loop serving
    fs.release()
    return started


def _commit_fields(group: str, offset: int) -> dict[str, Any]:
    return {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
            "retention_time_ms": -1, "topics": [{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                 "committed_metadata": None}]}]}


def _fetched(b: InProcessBroker, group: str) -> int:
    r = b.call(API_OFFSET_FETCH, 8, {"groups": [{"group_id": group, "topics": [
        {"name": "t", "partition_indexes": [0]}]}], "require_stable": True})
    return int(r.groups[0].topics[0].partitions[0].committed_offset)


def test_an_offset_commit_is_answered_once_durable_and_the_loop_serves_meanwhile(
        broker: Callable[[bool], InProcessBroker], fs: FsyncGate) -> None:
    b = broker(True)
    started = _start_held(b, fs, API_OFFSET_COMMIT, 8, _commit_fields("g", 5))
    assert b.visible_values("other", 0) == [b"meanwhile"]
    assert b.finish(started).topics[0].partitions[0].error_code == 0
    assert _fetched(b, "g") == 5
    b.restart()  # and it is on disk
    assert _fetched(b, "g") == 5


def test_with_the_background_fsync_an_offset_commit_answers_at_once(broker: Callable[[bool], InProcessBroker],
                                                                    fs: FsyncGate) -> None:
    b = broker(False)
    fs.hold(OFFSETS)
    started = b.start(API_OFFSET_COMMIT, 8, _commit_fields("g", 7))
    assert b.finish(started).topics[0].partitions[0].error_code == 0
    assert not fs.reached.is_set() and _fetched(b, "g") == 7


def test_a_transactional_offset_commit_is_answered_once_durable(broker: Callable[[bool], InProcessBroker],
                                                                fs: FsyncGate) -> None:
    b = broker(True)
    code, pid, epoch = b.init_producer_id("tx")
    assert code == 0
    r = b.call(API_ADD_OFFSETS_TO_TXN, 3, {"transactional_id": "tx", "producer_id": pid,
                                           "producer_epoch": epoch, "group_id": "g"})
    assert r.error_code == 0
    started = _start_held(b, fs, API_TXN_OFFSET_COMMIT, 3, {
        "transactional_id": "tx", "group_id": "g", "producer_id": pid, "producer_epoch": epoch,
        "generation_id": -1, "member_id": "", "group_instance_id": None, "topics": [
            {"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 9,
                                          "committed_leader_epoch": -1, "committed_metadata": None}]}]})
    assert b.finish(started).topics[0].partitions[0].error_code == 0
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    assert _fetched(b, "g") == 9


def test_the_offset_expiry_timer_fsyncs_its_tombstones_in_the_background(
        broker: Callable[[bool], InProcessBroker], fs: FsyncGate) -> None:
    b = broker(True)
    assert b.call(API_OFFSET_COMMIT, 8, _commit_fields("g", 3)).topics[0].partitions[0].error_code == 0
    plog = b.broker.logs.get_partition(*b.broker.coordination.offsets_partition_for("g"))
    assert plog is not None
    b.clock.advance(b.config.offsets_retention_minutes * 60_000 + 1)
    fs.hold(OFFSETS)

    async def timer() -> None:
        b.broker.coordination.expire_offsets()  # as the broker's timer calls it, on the loop
    b.loop.run_until_complete(timer())  # returns without waiting for the fsync
    b.run_until(fs.reached.is_set)
    assert _fetched(b, "g") == -1 and plog.synced_end < plog.log_end_offset
    fs.release()
    b.run_until(lambda: plog.synced_end == plog.log_end_offset)

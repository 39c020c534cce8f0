"""Real leader epochs (KIP-101/279/320) through the broker's request path (in process): an epoch per
broker start, stamped on every batch, reported by Metadata and ListOffsets, checked in Fetch and
ListOffsets, answered by OffsetForLeaderEpoch from a history that survives restarts, and a log that
lost its tail in a power cut is seen as truncated."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.protocol import records as rb
from oncelog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from oncelog.storage.leader_epoch_cache import LeaderEpochCache
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic("t")
    yield broker
    broker.close()


def fill(b: InProcessBroker, n: int) -> None:
    for _ in range(n):
        assert b.produce("t", 0, batch(1)) == 0


def metadata_epoch(b: InProcessBroker) -> int:
    r = b.call(3, 12, {"topics": [{"name": "t", "topic_id": None}], "allow_auto_topic_creation": False})
    return int(r.topics[0].partitions[0].leader_epoch)


def ofle(b: InProcessBroker, epoch: int, current: int = -1, topic: str = "t", version: int = 4,
         principal: str | None = None) -> tuple[ErrorCode, int, int]:
    fields: dict[str, Any] = {"replica_id": -2, "topics": [{"topic": topic, "partitions": [
        {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}]}]}
    r = b.call(23, version, fields, principal=principal)
    p = r.topics[0].partitions[0]
    return p.error_code, int(p.leader_epoch), int(p.end_offset)


def fetch(b: InProcessBroker, offset: int, current: int = -1, last_fetched: int = -1) -> Any:
    r = b.call(1, 12, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                       "session_id": 0, "session_epoch": -1, "topics": [{"topic": "t", "partitions": [{
                           "partition": 0, "current_leader_epoch": current, "fetch_offset": offset,
                           "last_fetched_epoch": last_fetched, "log_start_offset": -1,
                           "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [], "rack_id": ""})
    return r.responses[0].partitions[0]


def list_offset(b: InProcessBroker, timestamp: int, current: int = -1) -> Any:
    r = b.call(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [{"name": "t", "partitions": [
        {"partition_index": 0, "current_leader_epoch": current, "timestamp": timestamp}]}]})
    return r.topics[0].partitions[0]


def epochs_in_log(b: InProcessBroker) -> list[tuple[int, int]]:
    data = fetch(b, 0).records
    return [(h.base_offset, h.partition_leader_epoch) for _, h in rb.iter_headers(data)]


def test_each_start_is_a_new_epoch_stamped_on_batches(b: InProcessBroker) -> None:
    assert metadata_epoch(b) == 0
    fill(b, 2)
    b.restart(clean=False)
    assert metadata_epoch(b) == 1
    fill(b, 1)
    b.restart(clean=True)
    assert metadata_epoch(b) == 2
    b.restart(clean=False)  # a start without appends is an epoch too
    fill(b, 2)
    assert metadata_epoch(b) == 3
    assert epochs_in_log(b) == [(0, 0), (1, 0), (2, 1), (3, 3), (4, 3)]
    b.create_topic("later")  # a topic created now starts in the current epoch
    plog = b.broker.logs.get_partition("later", 0)
    assert plog is not None and plog.leader_epoch == 3


def test_offset_for_leader_epoch_answers_from_the_history(b: InProcessBroker) -> None:
    fill(b, 2)            # epoch 0: 0-1
    b.restart(clean=False)
    fill(b, 3)            # epoch 1: 2-4
    b.restart(clean=True)
    b.restart(clean=False)
    fill(b, 1)            # epoch 3: 5
    assert ofle(b, 0) == (0, 0, 2)
    assert ofle(b, 1) == (0, 1, 5)
    assert ofle(b, 2) == (0, 1, 5)   # no record in 2: the largest epoch below it and where it ended
    assert ofle(b, 3) == (0, 3, 6)   # the current epoch ends at the log end offset
    assert ofle(b, 4) == (0, -1, -1)  # a future epoch is unknown
    assert ofle(b, -1) == (0, -1, -1)
    assert ofle(b, 1, current=3) == (0, 1, 5)
    assert ofle(b, 1, current=2)[0] == ErrorCode.fenced_leader_epoch
    assert ofle(b, 1, current=9)[0] == ErrorCode.unknown_leader_epoch
    assert ofle(b, 1, topic="missing")[0] == ErrorCode.unknown_topic_or_partition
    for version in (2, 3):
        assert ofle(b, 0, version=version) == (0, 0, 2)


def test_history_survives_restarts_and_follows_the_log_start(b: InProcessBroker) -> None:
    fill(b, 3)
    b.restart(clean=True)
    fill(b, 3)
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    plog.flush()
    b.restart(clean=False)
    assert ofle(b, 0) == (0, 0, 3) and ofle(b, 1) == (0, 1, 6)
    r = b.call(21, 2, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": 4}]}],
                       "timeout": 1000})
    assert r.topics[0].partitions[0].error_code == 0
    assert ofle(b, 0) == (0, 0, 4)  # the epoch that covers the new log start starts there
    b.restart(clean=True)
    cache = LeaderEpochCache(b.data_dir / "t-0")  # written by the clean stop's flush
    assert list(zip(cache.epochs, cache.starts, strict=True)) == [(1, 4), (2, 6)]
    assert ofle(b, 0) == (0, 0, 4) and ofle(b, 1) == (0, 1, 6) and ofle(b, 3) == (0, 3, 6)


def test_unflushed_tail_epochs_come_back_from_the_batches(b: InProcessBroker) -> None:
    fill(b, 2)
    b.restart(clean=False)  # epoch 1
    fill(b, 2)              # never flushed: the checkpoint does not have epoch 1 yet
    assert not (b.data_dir / "t-0" / "leader-epoch-checkpoint").exists() or \
        "1 2" not in (b.data_dir / "t-0" / "leader-epoch-checkpoint").read_text()
    b.restart(clean=False)  # kill -9: the OS kept the bytes, recovery scans the tail
    assert ofle(b, 0) == (0, 0, 2) and ofle(b, 1) == (0, 1, 4)


def test_a_lost_tail_is_seen_as_truncation(b: InProcessBroker) -> None:
    fill(b, 5)
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    plog.flush()
    cut = plog.active.size
    fill(b, 5)              # offsets 5-9 in epoch 0, never fsynced
    b.crash()
    with open(b.data_dir / "t-0" / f"{0:020d}.log", "r+b") as f:
        os.ftruncate(f.fileno(), cut)  # a power cut loses them
    b.restart(clean=False)
    # a consumer that had read up to offset 10 in epoch 0 learns that epoch ended at 5
    assert ofle(b, 0) == (0, 0, 5)
    fill(b, 1)
    assert ofle(b, 1) == (0, 1, 6)
    part = fetch(b, 10, last_fetched=0)  # and a fetcher naming its last epoch gets a diverging epoch
    assert part.error_code == 0 and (part.diverging_epoch.epoch, part.diverging_epoch.end_offset) == (0, 5)
    assert not part.records


def test_fetch_and_list_offsets_check_the_current_epoch(b: InProcessBroker) -> None:
    fill(b, 2)
    b.restart(clean=False)
    fill(b, 1)
    assert fetch(b, 0, current=1).error_code == 0
    assert fetch(b, 0, current=-1).error_code == 0
    assert fetch(b, 0, current=0).error_code == ErrorCode.fenced_leader_epoch
    assert fetch(b, 0, current=2).error_code == ErrorCode.unknown_leader_epoch
    ok = fetch(b, 2, current=1, last_fetched=1)
    assert ok.error_code == 0 and ok.records and ok.diverging_epoch.epoch == -1
    assert fetch(b, 3, last_fetched=7).error_code == ErrorCode.offset_out_of_range
    latest = list_offset(b, -1, current=1)
    assert (latest.error_code, latest.offset, latest.leader_epoch) == (0, 3, 1)
    earliest = list_offset(b, -2)
    assert (earliest.offset, earliest.leader_epoch) == (0, 0)
    by_time = list_offset(b, 0)  # the first record at or after timestamp 0: offset 0, epoch 0
    assert (by_time.offset, by_time.leader_epoch) == (0, 0)
    assert list_offset(b, -1, current=0).error_code == ErrorCode.fenced_leader_epoch


def test_offset_for_leader_epoch_needs_describe(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin")
    try:
        b.create_topic("t")
        assert b.broker.authorizer is not None
        b.broker.authorizer.create([AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*",
                                               Operation.DESCRIBE, Permission.ALLOW)])
        assert ofle(b, 0, principal="User:alice") == (0, 0, 0)
        assert ofle(b, 0, principal="User:bob")[0] == ErrorCode.topic_authorization_failed
    finally:
        b.close()


def test_epoch_cache_rules(tmp_path: Path) -> None:
    c = LeaderEpochCache(tmp_path)
    c.assign(1, 0)
    c.assign(1, 5)   # same epoch, later offset: nothing changes
    c.assign(3, 10)
    c.assign(2, 7)   # contradicts (3, 10): the newer entry goes, as in Kafka
    assert list(zip(c.epochs, c.starts, strict=True)) == [(1, 0), (2, 7)]
    c.assign(4, 7)   # same start as (2, 7): replaces it
    assert list(zip(c.epochs, c.starts, strict=True)) == [(1, 0), (4, 7)]
    c.write()
    (tmp_path / "leader-epoch-checkpoint").write_text("garbage")
    assert LeaderEpochCache(tmp_path).epochs == []  # unreadable: empty, with a warning
    c.truncate_from_start(9)
    assert list(zip(c.epochs, c.starts, strict=True)) == [(4, 9)]
    c.truncate_from_end(9)
    assert c.epochs == [] and c.end_offset_for(4, 9) == (-1, -1)

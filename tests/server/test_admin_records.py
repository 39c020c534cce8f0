"""DeleteRecords and DescribeLogDirs through the broker's request path (in process): the low
watermark, Kafka's error codes, persistence across crashes, a log start that passes an open
transaction, producer state kept, and the log directory's sizes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d", log_segment_bytes=400)
    broker.create_topic("t", 2)
    yield broker
    broker.close()


def delete(b: InProcessBroker, topic: str, offsets: dict[int, int], version: int = 2,
           principal: str | None = None) -> dict[int, tuple[ErrorCode, int]]:
    r = b.call(21, version, {"topics": [{"name": topic, "partitions": [
        {"partition_index": p, "offset": o} for p, o in offsets.items()]}], "timeout": 5000}, principal=principal)
    return {p.partition_index: (p.error_code, p.low_watermark) for p in r.topics[0].partitions}


def earliest(b: InProcessBroker, topic: str, partition: int = 0) -> int:
    r = b.call(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -2}]}]})
    return int(r.topics[0].partitions[0].offset)


def fill(b: InProcessBroker, n: int, topic: str = "t", partition: int = 0) -> None:
    for i in range(n):
        assert b.produce(topic, partition, batch(1, value=b"%d" % i, size=100)) == 0


def test_delete_records_moves_the_log_start_and_deletes_whole_segments(b: InProcessBroker) -> None:
    fill(b, 30)
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and len(plog.segments) > 5
    assert delete(b, "t", {0: 15}) == {0: (ErrorCode.none, 15)}
    assert plog.log_start_offset == 15 and plog.segments[0].base_offset <= 15 < plog.segments[1].base_offset
    assert earliest(b, "t") == 15
    assert b.fetch("t", 0, 14, read_committed=False).error_code == ErrorCode.offset_out_of_range
    part = b.fetch("t", 0, 15, read_committed=False)
    assert part.error_code == 0 and part.log_start_offset == 15
    # below the current start: nothing changes, the answer is the low watermark
    assert delete(b, "t", {0: 3}) == {0: (ErrorCode.none, 15)}
    # -1 is the high watermark
    assert delete(b, "t", {0: -1}) == {0: (ErrorCode.none, 30)}
    assert plog.log_start_offset == 30 and b.fetch("t", 0, 30, read_committed=False).error_code == 0
    fill(b, 1)
    assert b.fetch("t", 0, 30, read_committed=False).records


def test_delete_records_errors(b: InProcessBroker) -> None:
    fill(b, 5)
    assert delete(b, "t", {0: 6}) == {0: (ErrorCode.offset_out_of_range, -1)}
    assert delete(b, "t", {0: -2}) == {0: (ErrorCode.offset_out_of_range, -1)}
    assert delete(b, "t", {0: 5, 1: 0, 7: 1}) == {0: (ErrorCode.none, 5), 1: (ErrorCode.none, 0),
                                                  7: (ErrorCode.unknown_topic_or_partition, -1)}
    assert delete(b, "nope", {0: 1}) == {0: (ErrorCode.unknown_topic_or_partition, -1)}
    assert delete(b, "__consumer_offsets", {0: 0}) == {0: (ErrorCode.invalid_topic_exception, -1)}
    for version in (0, 1):
        assert delete(b, "t", {1: 0}, version=version) == {1: (ErrorCode.none, 0)}


def test_delete_records_survives_crashes_and_clean_restarts(b: InProcessBroker) -> None:
    fill(b, 20)
    assert delete(b, "t", {0: 12}) == {0: (ErrorCode.none, 12)}
    for clean in (False, True, False):
        b.restart(clean=clean)
        assert earliest(b, "t") == 12
        assert b.fetch("t", 0, 11, read_committed=False).error_code == ErrorCode.offset_out_of_range
    fill(b, 1)
    assert b.broker.logs.get_partition("t", 0).log_end_offset == 21  # type: ignore[union-attr]


def test_delete_records_may_pass_an_open_transaction(b: InProcessBroker) -> None:
    fill(b, 3)
    err, pid, epoch = b.init_producer_id("tx")
    assert err == 0 and b.add_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): 0}
    for seq in range(4):  # offsets 3..6
        assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=seq, txn=True, value=b"txn%d" % seq),
                         transactional_id="tx") == 0
    fill(b, 2)  # 7, 8
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and plog.last_stable_offset == 3
    assert delete(b, "t", {0: 5}) == {0: (ErrorCode.none, 5)}
    assert plog.last_stable_offset == 5  # never below the log start; the transaction is still open
    part = b.fetch("t", 0, 5)
    assert part.error_code == 0 and part.last_stable_offset == 5 and not part.records
    assert b.end_txn("tx", pid, epoch, commit=False) == 0
    assert plog.last_stable_offset == plog.high_watermark == 10
    # the aborted records after the log start stay invisible to read_committed consumers
    assert b.visible_values("t", 0, offset=5) == [b"0" + b"x" * 99, b"1" + b"x" * 99]  # offsets 7, 8
    # the producer's state is kept: its next transaction continues the sequence
    assert b.add_partitions("tx", pid, epoch, [("t", 0)]) == {("t", 0): 0}
    assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=5, txn=True),
                     transactional_id="tx") == ErrorCode.out_of_order_sequence_number
    assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=4, txn=True), transactional_id="tx") == 0


def test_idempotent_producer_continues_after_everything_is_deleted(b: InProcessBroker) -> None:
    _, pid, epoch = b.init_producer_id(None)
    for seq in range(3):
        assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=seq)) == 0
    assert delete(b, "t", {0: -1}) == {0: (ErrorCode.none, 3)}
    assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=2)) == 0  # duplicate still recognised
    assert b.broker.logs.get_partition("t", 0).log_end_offset == 3  # type: ignore[union-attr]
    assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=4)) == ErrorCode.out_of_order_sequence_number
    assert b.produce("t", 0, batch(1, pid=pid, epoch=epoch, seq=3)) == 0


def test_delete_records_needs_delete_on_the_topic(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin")
    try:
        b.create_topic("t")
        assert b.broker.authorizer is not None
        b.broker.authorizer.create([AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*",
                                               Operation.DELETE, Permission.ALLOW)])
        assert delete(b, "t", {0: 0}, principal="User:bob") == {0: (ErrorCode.topic_authorization_failed, -1)}
        assert delete(b, "t", {0: 0}, principal="User:alice") == {0: (ErrorCode.none, 0)}
        r = describe_dirs(b, None, principal="User:alice")
        assert r.error_code == ErrorCode.cluster_authorization_failed and not r.results
        assert describe_dirs(b, None, principal="User:admin").error_code == 0
    finally:
        b.close()


def describe_dirs(b: InProcessBroker, topics: list[tuple[str, list[int]]] | None, version: int = 4,
                  principal: str | None = None) -> Any:
    return b.call(35, version, {"topics": None if topics is None else [
        {"topic": t, "partitions": ps} for t, ps in topics]}, principal=principal)


def test_describe_log_dirs_reports_sizes(b: InProcessBroker) -> None:
    fill(b, 10)
    fill(b, 2, partition=1)
    r = describe_dirs(b, None)
    assert r.error_code == 0 and len(r.results) == 1
    d = r.results[0]
    assert d.error_code == 0 and d.log_dir == str(b.data_dir.resolve())
    assert d.total_bytes > 0 and 0 < d.usable_bytes <= d.total_bytes
    sizes = {(t.name, p.partition_index): (p.partition_size, p.offset_lag, p.is_future_key)
             for t in d.topics for p in t.partitions}
    for (topic, partition), plog in b.broker.logs.partitions().items():
        assert sizes[(topic, partition)] == (plog.size_in_bytes, 0, False)
    assert sizes[("t", 0)][0] > sizes[("t", 1)][0] > 0
    only = describe_dirs(b, [("t", [1]), ("missing", [0])], version=1).results[0]
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in only.topics] == [("t", [1])]

"""Group requests answer as Kafka's KafkaApis and GroupCoordinatorService do where a probe with real
clients found they did not:

- the empty group id: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, TxnOffsetCommit and OffsetDelete
  answer INVALID_GROUP_ID (after the authorization checks); OffsetCommit, OffsetFetch,
  DescribeGroups and DeleteGroups take "" as any other group id (Kafka's backward compatibility);
- OffsetDelete answers UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist, and a
  group-level error alone, with no partitions.

Driven in process (tests/inproc.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from tests.inproc import API_TXN_OFFSET_COMMIT, InProcessBroker

E = ErrorCode
JOIN, SYNC, HEARTBEAT, LEAVE = 11, 14, 12, 13
OFFSET_COMMIT, OFFSET_FETCH, DESCRIBE_GROUPS, DELETE_GROUPS, OFFSET_DELETE = 8, 9, 15, 42, 47


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d", auto_create_topics_enable=False)
    broker.create_topic("t", 2)
    yield broker
    broker.close()


def _join(b: InProcessBroker, group: str, principal: str | None = None) -> Any:
    return b.call(JOIN, 5, {"group_id": group, "session_timeout": 10_000, "rebalance_timeout": 10_000,
                            "member_id": "m-1", "group_instance_id": None, "protocol_type": "consumer",
                            "protocols": [{"name": "range", "metadata": b""}]}, principal=principal)


def _heartbeat(b: InProcessBroker, group: str, principal: str | None = None) -> Any:
    return b.call(HEARTBEAT, 4, {"group_id": group, "generation_id": 1, "member_id": "m-1",
                                 "group_instance_id": None}, principal=principal)


def _commit(b: InProcessBroker, group: str, partitions: dict[str, list[int]], offset: int = 5,
            principal: str | None = None) -> dict[Any, int]:
    r = b.call(OFFSET_COMMIT, 8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                                  "group_instance_id": None, "topics": [
                                      {"name": t, "partitions": [{"partition_index": p, "committed_offset": offset,
                                                                  "committed_leader_epoch": -1,
                                                                  "committed_metadata": None} for p in ps]}
                                      for t, ps in partitions.items()]}, principal=principal)
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def _committed(b: InProcessBroker, group: str) -> dict[tuple[str, int], int]:
    r = b.call(OFFSET_FETCH, 8, {"groups": [{"group_id": group, "topics": None}], "require_stable": False})
    [g] = r.groups
    assert g.error_code == E.none
    return {(t.name, p.partition_index): p.committed_offset for t in g.topics for p in t.partitions}


def _offset_delete(b: InProcessBroker, group: str, partitions: dict[str, list[int]],
                   principal: str | None = None) -> tuple[int, dict[tuple[str, int], int]]:
    r = b.call(OFFSET_DELETE, 0, {"group_id": group, "topics": [
        {"name": t, "partitions": [{"partition_index": p} for p in ps]} for t, ps in partitions.items()]},
        principal=principal)
    return r.error_code, {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def test_membership_and_transactional_requests_refuse_the_empty_group_id(b: InProcessBroker) -> None:
    join = _join(b, "")
    assert (join.error_code, join.member_id) == (E.invalid_group_id, "m-1")
    sync = b.call(SYNC, 5, {"group_id": "", "generation_id": 1, "member_id": "m-1", "group_instance_id": None,
                            "protocol_type": None, "protocol_name": None, "assignments": []})
    assert sync.error_code == E.invalid_group_id
    assert _heartbeat(b, "").error_code == E.invalid_group_id
    leave = b.call(LEAVE, 4, {"group_id": "", "members": [{"member_id": "m-1", "group_instance_id": None}]})
    assert (leave.error_code, leave.members) == (E.invalid_group_id, ())
    assert b.call(LEAVE, 0, {"group_id": "", "member_id": "m-1"}).error_code == E.invalid_group_id
    assert _offset_delete(b, "", {"t": [0], "nope": [0]}) == (E.invalid_group_id, {})
    # TxnOffsetCommit: the partitions that exist get INVALID_GROUP_ID, before any transaction check
    r = b.call(API_TXN_OFFSET_COMMIT, 3, {"transactional_id": "tx", "group_id": "", "producer_id": 12345,
                                          "producer_epoch": 0, "topics": [
                                              {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                                          "committed_metadata": None}]}
                                              for t in ("t", "nope")]})
    assert {t.name: t.partitions[0].error_code for t in r.topics} == {
        "t": E.invalid_group_id, "nope": E.unknown_topic_or_partition}


def test_offset_requests_and_group_admin_take_the_empty_group_id_as_any_other(b: InProcessBroker) -> None:
    assert _commit(b, "", {"t": [0]}) == {("t", 0): E.none}
    assert _committed(b, "") == {("t", 0): 5}
    [g] = b.call(DESCRIBE_GROUPS, 5, {"groups": [""], "include_authorized_operations": False}).groups
    assert (g.error_code, g.group_id, g.group_state) == (E.none, "", "Empty")
    [d] = b.call(DELETE_GROUPS, 2, {"groups_names": [""]}).results
    assert (d.group_id, d.error_code) == ("", E.none)
    assert _committed(b, "") == {}
    [g] = b.call(DESCRIBE_GROUPS, 5, {"groups": [""], "include_authorized_operations": False}).groups
    assert (g.error_code, g.group_state) == (E.none, "Dead")


def test_authorization_is_checked_before_the_group_id(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin")
    try:
        assert _join(b, "", principal="User:bob").error_code == E.group_authorization_failed
        assert _heartbeat(b, "", principal="User:bob").error_code == E.group_authorization_failed
        assert _offset_delete(b, "", {"t": [0]}, principal="User:bob") == (E.group_authorization_failed, {})
        assert _heartbeat(b, "", principal="User:admin").error_code == E.invalid_group_id
    finally:
        b.close()


def test_offset_delete_answers_unknown_partitions_per_partition(b: InProcessBroker) -> None:
    assert _commit(b, "g", {"t": [0, 1]}) == {("t", 0): E.none, ("t", 1): E.none}
    assert _offset_delete(b, "g", {"t": [0, 9], "nope": [0, 1]}) == (E.none, {
        ("t", 0): E.none, ("t", 9): E.unknown_topic_or_partition,
        ("nope", 0): E.unknown_topic_or_partition, ("nope", 1): E.unknown_topic_or_partition})
    assert _committed(b, "g") == {("t", 1): 5}
    # only unknown partitions: the group is still checked, and its error is the whole answer
    assert _offset_delete(b, "g", {"nope": [0]}) == (E.none, {("nope", 0): E.unknown_topic_or_partition})
    assert _offset_delete(b, "ghost", {"t": [0], "nope": [0]}) == (E.group_id_not_found, {})


def test_offset_delete_refuses_a_topic_it_may_not_read_before_looking_it_up(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin",
                        auto_create_topics_enable=False)
    try:
        b.create_topic("t", 1)
        assert b.broker.authorizer is not None
        b.broker.authorizer.create([
            AclBinding(ResourceType.GROUP, "g", PatternType.LITERAL, "User:bob", "*", op, Permission.ALLOW)
            for op in (Operation.READ, Operation.DELETE)] + [
            AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:bob", "*", Operation.READ,
                       Permission.ALLOW)])
        assert _commit(b, "g", {"t": [0]}, principal="User:bob") == {("t", 0): E.none}
        assert _offset_delete(b, "g", {"t": [0, 3], "nope": [0]}, principal="User:bob") == (E.none, {
            ("t", 0): E.none, ("t", 3): E.unknown_topic_or_partition, ("nope", 0): E.topic_authorization_failed})
    finally:
        b.close()

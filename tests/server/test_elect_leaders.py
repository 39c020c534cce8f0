"""ElectLeaders (API 43) is served as a one-broker Kafka cluster serves it (ControllerApis and
ReplicationControlManager.electLeaders): ELECTION_NOT_NEEDED for every partition that exists,
UNKNOWN_TOPIC_OR_PARTITION for the others, CLUSTER_AUTHORIZATION_FAILED without ALTER on the cluster,
INVALID_REQUEST for an unknown election type. In process, and through librdkafka's AdminClient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ElectionType, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from kio.schema.errors import ErrorCode

from oncelog.protocol.versions import API_ELECT_LEADERS
from oncelog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from oncelog.testing.broker_process import create_topic, oncelog_broker
from tests.inproc import InProcessBroker

E = ErrorCode


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d", auto_create_topics_enable=False)
    broker.create_topic("t", 2)
    yield broker
    broker.close()


def _elect(b: InProcessBroker, version: int, topics: dict[str, list[int]] | None, election_type: int = 0,
           principal: str | None = None) -> Any:
    fields: dict[str, Any] = {"topic_partitions": None if topics is None else [
        {"topic": t, "partitions": ps} for t, ps in topics.items()], "timeout": 60_000}
    if version >= 1:
        fields["election_type"] = election_type
    return b.call(API_ELECT_LEADERS, version, fields, principal=principal)


def _codes(r: Any) -> dict[tuple[str, int], int]:
    return {(t.topic, p.partition_id): p.error_code for t in r.replica_election_results for p in t.partition_result}


@pytest.mark.parametrize("version", [0, 1, 2])
def test_no_election_is_ever_needed_on_one_broker(b: InProcessBroker, version: int) -> None:
    for election_type in (0, 1):
        r = _elect(b, version, {"t": [0, 1, 2], "nope": [0]}, election_type)
        assert getattr(r, "error_code", E.none) == E.none
        assert _codes(r) == {("t", 0): E.election_not_needed, ("t", 1): E.election_not_needed,
                             ("t", 2): E.unknown_topic_or_partition, ("nope", 0): E.unknown_topic_or_partition}
        messages = {(t.topic, p.partition_id): p.error_message
                    for t in r.replica_election_results for p in t.partition_result}
        assert messages[("t", 2)] == "No such partition as t-2" and messages[("nope", 0)] == "No such topic as nope"
    # every partition: each topic, none of its partitions (their election was not needed)
    r = _elect(b, version, None)
    assert sorted((t.topic, t.partition_result) for t in r.replica_election_results) == [
        ("__consumer_offsets", ()), ("__transaction_state", ()), ("t", ())]


def test_an_unknown_election_type_is_an_invalid_request(b: InProcessBroker) -> None:
    r = _elect(b, 2, {"t": [0]}, election_type=2)
    assert (r.error_code, _codes(r)) == (E.invalid_request, {("t", 0): E.invalid_request})


def test_alter_on_the_cluster_is_needed(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin")
    try:
        b.create_topic("t", 1)
        r = _elect(b, 2, {"t": [0], "nope": [1]}, principal="User:bob")
        assert (r.error_code, _codes(r)) == (E.cluster_authorization_failed, {
            ("t", 0): E.cluster_authorization_failed, ("nope", 1): E.cluster_authorization_failed})
        r = _elect(b, 2, None, principal="User:bob")
        assert (r.error_code, r.replica_election_results) == (E.cluster_authorization_failed, ())
        assert b.broker.authorizer is not None
        b.broker.authorizer.create([AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL,
                                               "User:bob", "*", Operation.ALTER, Permission.ALLOW)])
        r = _elect(b, 2, {"t": [0]}, principal="User:bob")
        assert (r.error_code, _codes(r)) == (E.none, {("t", 0): E.election_not_needed})
    finally:
        b.close()


def test_librdkafka_admin_client_elect_leaders(tmp_path: Path) -> None:
    with oncelog_broker(tmp_path / "d", log_path=tmp_path / "broker.log").start() as broker:
        create_topic(broker.bootstrap, "t", 2)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition("t", 0), TopicPartition("t", 5)]
                                     ).result(timeout=15)
        codes = {(tp.topic, tp.partition): err.code() if err is not None else None for tp, err in result.items()}
        assert codes == {("t", 0): KafkaError.ELECTION_NOT_NEEDED, ("t", 5): KafkaError.UNKNOWN_TOPIC_OR_PART}

"""Offsets for partitions that do not exist are refused, per partition, with UNKNOWN_TOPIC_OR_PARTITION
(Kafka's KafkaApis checks every partition against its metadata before the coordinator sees the
request; librdkafka's tests 0030 and 0081 expect it). The rest of the request is committed. A
transactional commit never records an offset for a partition that does not exist, not even after its
COMMIT marker, nor after a restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker

UNKNOWN = 3  # UNKNOWN_TOPIC_OR_PARTITION


def _codes(resp: Any) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): int(p.error_code) for t in resp.topics for p in t.partitions}


def _committed(client: RawClient, group: str) -> dict[tuple[str, int], int]:
    resp = client.request(9, (8, 8), {"groups": [{"group_id": group, "topics": None}], "require_stable": False})
    return {(t.name, p.partition_index): int(p.committed_offset)
            for t in resp.groups[0].topics for p in t.partitions if p.committed_offset >= 0}


def _partitions(topics: dict[str, list[int]], offset: int) -> list[dict[str, Any]]:
    return [{"name": t, "partitions": [{"partition_index": p, "committed_offset": offset} for p in ps]}
            for t, ps in topics.items()]


def _broker(tmp_path: Path) -> BrokerProcess:
    # no topic auto-creation: "nope" must stay unknown whatever the client asks
    b = oncelog_broker(tmp_path / "d", log_path=tmp_path / "broker.log").start()
    create_topic(b.bootstrap, "exists", 2)
    return b


def test_offset_commit_refuses_unknown_topics_and_partitions(tmp_path: Path) -> None:
    b = _broker(tmp_path)
    try:
        with RawClient(b.bootstrap) as client:
            resp = client.request(8, (2, 8), {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                                              "topics": _partitions({"exists": [0, 7], "nope": [0]}, 5)})
            assert _codes(resp) == {("exists", 0): 0, ("exists", 7): UNKNOWN, ("nope", 0): UNKNOWN}
            assert _committed(client, "g") == {("exists", 0): 5}
            # nothing valid at all: no group is created
            resp = client.request(8, (2, 8), {"group_id": "ghost", "generation_id_or_member_epoch": -1,
                                              "member_id": "", "topics": _partitions({"nope": [0, 1]}, 5)})
            assert set(_codes(resp).values()) == {UNKNOWN}
            listed = client.request(16, (0, 4), {"states_filter": []})
            assert "ghost" not in [g.group_id for g in listed.groups]
        # librdkafka's consumer commit reports the partitions it could not commit
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "g2", "enable.auto.commit": False,
                      "log_level": 0})
        try:
            try:
                result = c.commit(offsets=[TopicPartition("exists", 1, 4), TopicPartition("exists", 9, 4)],
                                  asynchronous=False)
                errors = {(tp.topic, tp.partition): tp.error for tp in result or []}
                assert errors[("exists", 9)] is not None
                assert errors[("exists", 9)].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                assert errors[("exists", 1)] is None
            except KafkaException as exc:
                assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
        finally:
            c.close()
        with RawClient(b.bootstrap) as client:
            assert _committed(client, "g2") == {("exists", 1): 4}
    finally:
        b.kill()


def test_alter_consumer_group_offsets_refuses_unknown_partitions(tmp_path: Path) -> None:
    b = _broker(tmp_path)
    try:
        admin = AdminClient({"bootstrap.servers": b.bootstrap, "log_level": 0})
        request = ConsumerGroupTopicPartitions("admin-g", [TopicPartition("nope", 0, 5), TopicPartition("exists", 0, 3),
                                                           TopicPartition("exists", 5, 3)])
        future = admin.alter_consumer_group_offsets([request], request_timeout=10)["admin-g"]
        try:
            res = future.result(15)
            errors = {(tp.topic, tp.partition): tp.error for tp in res.topic_partitions}
            assert errors[("nope", 0)] is not None and errors[("nope", 0)].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
            assert errors[("exists", 5)] is not None
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART, exc
        with RawClient(b.bootstrap) as client:
            assert _committed(client, "admin-g") == {("exists", 0): 3}
    finally:
        b.kill()


def test_txn_offset_commit_never_records_offsets_of_unknown_partitions(tmp_path: Path) -> None:
    b = _broker(tmp_path)
    try:
        with RawClient(b.bootstrap) as client:
            ip = client.request(22, (0, 4), {"transactional_id": "tx", "transaction_timeout": 60000,
                                             "producer_id": -1, "producer_epoch": -1})
            pid, epoch = ip.producer_id, ip.producer_epoch
            assert int(client.request(25, (0, 3), {"transactional_id": "tx", "producer_id": pid,
                                                   "producer_epoch": epoch, "group_id": "tg"}).error_code) == 0
            resp = client.request(28, (0, 3), {
                "transactional_id": "tx", "group_id": "tg", "producer_id": pid, "producer_epoch": epoch,
                "generation_id": -1, "member_id": "", "topics": _partitions({"exists": [1, 9], "nope": [0]}, 3)})
            assert _codes(resp) == {("exists", 1): 0, ("exists", 9): UNKNOWN, ("nope", 0): UNKNOWN}
            assert int(client.request(26, (0, 3), {"transactional_id": "tx", "producer_id": pid,
                                                   "producer_epoch": epoch, "committed": True}).error_code) == 0
            assert _committed(client, "tg") == {("exists", 1): 3}
        b.restart()
        with RawClient(b.bootstrap) as client:
            assert _committed(client, "tg") == {("exists", 1): 3}
    finally:
        b.kill()

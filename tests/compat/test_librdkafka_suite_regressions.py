"""Broker behaviours that librdkafka's own integration suite (v2.12.1, run against our broker by hand:
docs/design/compatibility.md) found wrong, reproduced here because that suite needs a network to
build and cannot run in CI. Each test names the librdkafka test it stands for and checks what
Apache Kafka does, through our request path (in process) and, where the client's reaction is the
point, through librdkafka itself (confluent-kafka).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from kio.schema.errors import ErrorCode

from oncelog.testing.broker_process import create_topic, oncelog_broker
from tests.inproc import API_PRODUCE, InProcessBroker
from tests.protocol.test_record_validation import batch_of, body, records_of

# --- 0011_produce_batch: every keyless record of a batch for a compacted topic is reported -----------


@pytest.fixture
def compacted(tmp_path: Path):  # type: ignore[no-untyped-def]
    broker = InProcessBroker(tmp_path / "d")
    broker.broker.logs.create_topic("table", 1, {"cleanup.policy": "compact"})
    yield broker
    broker.close()


def produce(b: InProcessBroker, topic: str, records: bytes, version: int = 9) -> Any:
    resp = b.call(API_PRODUCE, version, {
        "transactional_id": None, "acks": -1, "timeout": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": records}]}]})
    return resp.responses[0].partition_responses[0]


def test_keyless_records_in_a_compacted_topic_are_each_named_in_record_errors(compacted: InProcessBroker) -> None:
    # Kafka's LogValidator checks every record of the batch and answers INVALID_RECORD with one
    # RecordError (batch index, message) per keyless record; librdkafka fails exactly those
    # messages with INVALID_RECORD and the others of the batch with _INVALID_DIFFERENT_RECORD.
    keys = [b"k0", None, b"k2", None, b"k4"]
    part = produce(compacted, "table", batch_of(records_of([body(i, key=k) for i, k in enumerate(keys)]), 5))
    assert part.error_code == ErrorCode.invalid_record
    assert part.base_offset == -1
    assert [e.batch_index for e in part.record_errors] == [1, 3]
    for e in part.record_errors:
        assert "Compacted topic cannot accept message without key in topic partition table-0" in \
            (e.batch_index_error_message or "")
    assert "2 record errors" in (part.error_message or "")
    plog = compacted.broker.logs.get_partition("table", 0)
    assert plog is not None and plog.log_end_offset == 0
    # a batch of keyed records (a tombstone included) still goes in
    assert produce(compacted, "table", batch_of(records_of([body(0, key=b"k"), body(1, key=b"k", value=None)]),
                                                2)).error_code == 0


def test_librdkafka_fails_only_the_keyless_messages_of_a_batch(tmp_path: Path) -> None:
    # 0011_produce_batch's test_message_single_partition_record_fail(0): 100 messages in one
    # batch, every tenth without a key: 10 INVALID_RECORD and 90 _INVALID_DIFFERENT_RECORD.
    with oncelog_broker(tmp_path / "d").start() as broker:
        create_topic(broker.bootstrap, "table", 1, {"cleanup.policy": "compact"})
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 1000, "enable.idempotence": False})
        results: list[int] = []
        for i in range(100):
            p.produce("table", b"value %d" % i, key=None if i % 10 == 0 else b"key %d" % i, partition=0,
                      on_delivery=lambda err, msg: results.append(err.code() if err else 0))
        assert p.flush(30) == 0
        assert results.count(KafkaError.INVALID_RECORD) == 10
        assert results.count(KafkaError._INVALID_DIFFERENT_RECORD) == 90

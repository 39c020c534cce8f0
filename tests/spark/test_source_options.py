"""The Spark Kafka connector's options against a real broker, planning called directly (no Spark):
timestamps, every-partition JSON, min/max offsets per trigger, group ids, the consumer-group mirror,
and an unreachable broker failing fast with its address."""

from __future__ import annotations

import time
import uuid

import pytest

pytest.importorskip("pyspark")

from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

from oncelog.spark.source import KafkaBatchReader, KafkaStreamReader
from oncelog.testing.broker_process import BrokerProcess, create_topic, free_port

T0 = 1_700_000_000_000


def _fill(bs: str, topic: str, n: int, partitions: int = 2) -> None:
    """``n`` records per partition; record ``i`` has timestamp T0 + 1000 * i."""
    create_topic(bs, topic, partitions)
    p = Producer({"bootstrap.servers": bs})
    for i in range(n):
        for part in range(partitions):
            p.produce(topic, value=b"%d-%d" % (part, i), partition=part, timestamp=T0 + 1000 * i)
    p.flush(15)


def _values(reader: KafkaStreamReader | KafkaBatchReader, start: dict | None = None,
            end: dict | None = None) -> list[bytes]:
    parts = reader.partitions(start, end) if isinstance(reader, KafkaStreamReader) else reader.partitions()
    return sorted(v for part in parts for batch in reader.read(part) for v in batch.column("value").to_pylist())


def test_starting_and_ending_timestamps(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    _fill(bs, "ts", 10)
    opts = {"kafka.bootstrap.servers": bs, "subscribe": "ts"}
    assert KafkaStreamReader({**opts, "startingTimestamp": str(T0 + 3500)}).initialOffset() == \
        {"ts": {"0": 4, "1": 4}}
    by_part = KafkaStreamReader({**opts, "startingOffsetsByTimestamp": f'{{"ts": {{"0": {T0}, "1": {T0 + 9000}}}}}'})
    assert by_part.initialOffset() == {"ts": {"0": 0, "1": 9}}
    with pytest.raises(ValueError, match=r"must name every partition.*missing \['ts-1'\]"):
        KafkaStreamReader({**opts, "startingOffsetsByTimestamp": f'{{"ts": {{"0": {T0}}}}}'}).initialOffset()
    future = {**opts, "startingTimestamp": str(T0 + 60_000)}
    with pytest.raises(ValueError, match=r"no offset in ts-0 for timestamp .*startingOffsetsByTimestampStrategy"):
        KafkaStreamReader(future).initialOffset()
    assert KafkaStreamReader({**future, "startingOffsetsByTimestampStrategy": "latest"}).initialOffset() == \
        {"ts": {"0": 10, "1": 10}}

    batch = KafkaBatchReader({**opts, "startingTimestamp": str(T0 + 2000), "endingTimestamp": str(T0 + 4000)})
    assert _values(batch) == [b"0-2", b"0-3", b"1-2", b"1-3"]
    open_end = KafkaBatchReader({**opts, "startingTimestamp": str(T0 + 8000), "endingTimestamp": str(T0 + 99_000)})
    assert _values(open_end) == [b"0-8", b"0-9", b"1-8", b"1-9"], "no record at the end timestamp: latest"


def test_json_offsets_must_name_every_partition_and_batch_forbids_latest_start(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    _fill(bs, "js", 3)
    opts = {"kafka.bootstrap.servers": bs, "subscribe": "js"}
    with pytest.raises(ValueError, match="must name every partition"):
        KafkaStreamReader({**opts, "startingOffsets": '{"js": {"0": 1}}'}).initialOffset()
    with pytest.raises(ValueError, match=r"-1 \(latest\) is not allowed in a batch read"):
        KafkaBatchReader({**opts, "startingOffsets": '{"js": {"0": -1, "1": 0}}'})


def test_min_offsets_per_trigger_waits_at_most_max_trigger_delay(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    _fill(bs, "mn", 3)
    r = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "mn", "startingOffsets": "earliest",
                           "minOffsetsPerTrigger": "10", "maxTriggerDelay": "1s", "maxOffsetsPerTrigger": "100"})
    assert r.getDefaultReadLimit() == ReadMaxRows(100)
    start = r.initialOffset()
    assert r.latestOffset(start, ReadMaxRows(100)) == {"mn": {"0": 3, "1": 3}}, "the first batch is never delayed"
    p = Producer({"bootstrap.servers": bs})
    for i in range(4):
        p.produce("mn", value=b"x%d" % i, partition=0)
    p.flush(10)
    after_first = {"mn": {"0": 3, "1": 3}}
    assert r.latestOffset(after_first, ReadMaxRows(100)) == after_first, "4 < minOffsetsPerTrigger: wait"
    time.sleep(1.1)
    assert r.latestOffset(after_first, ReadMaxRows(100)) == {"mn": {"0": 7, "1": 3}}, "maxTriggerDelay passed"
    assert r.latestOffset(after_first, ReadAllAvailable()) == {"mn": {"0": 7, "1": 3}}, "Trigger.Once: all"
    only_min = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "mn", "minOffsetsPerTrigger": "5"})
    assert only_min.getDefaultReadLimit() == ReadMinRows(5)


def test_group_ids_and_the_consumer_group_mirror(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    _fill(bs, "grp", 4)
    fixed = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "grp", "kafka.group.id": "acl-group"})
    assert fixed.meta.driver_group == fixed.meta.executor_group == "acl-group"
    prefixed = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "grp", "groupIdPrefix": "team-a"})
    assert prefixed.meta.driver_group.startswith("team-a-") and prefixed.meta.executor_group.endswith("-executor")

    mirror = f"lag-{uuid.uuid4()}"
    r = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "grp", "startingOffsets": "earliest",
                           "commitOffsetsToGroup": mirror})
    start = r.initialOffset()
    end = r.latestOffset(start, ReadAllAvailable())
    assert len(_values(r, start, end)) == 8
    r.commit(end)
    c = Consumer({"bootstrap.servers": bs, "group.id": mirror})
    try:
        committed = c.committed([TopicPartition("grp", 0), TopicPartition("grp", 1)], timeout=10)
    finally:
        c.close()
    assert [tp.offset for tp in committed] == [4, 4]


def test_an_unreachable_broker_fails_fast_naming_its_address() -> None:
    from oncelog.spark.sink import SinkSettings

    address = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"cannot reach the Kafka cluster at {address} within 2s"):
        KafkaStreamReader({"kafka.bootstrap.servers": address, "subscribe": "t", "connectTimeoutMs": "2000"})
    with pytest.raises(ConnectionError, match=f"cannot reach the Kafka cluster at {address} within 2s"):
        SinkSettings.from_options({"kafka.bootstrap.servers": address, "topic": "t",
                                   "connectTimeoutMs": "2000"}).prepare()
    with pytest.raises(ConnectionError, match=address):
        SinkSettings.from_options({"kafka.bootstrap.servers": address, "topic": "t", "connectTimeoutMs": "2000",
                                   "processing.guarantee": "at_least_once"}).prepare()
    assert time.monotonic() - t0 < 15

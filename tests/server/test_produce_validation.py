"""Record validation seen from clients: the partition error and message a bad batch gets through the
broker's own request path, the stored data untouched; and real clients' compressed batches (every
codec librdkafka, kafka-python and aiokafka write) accepted and read back."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer
from kio.schema.errors import ErrorCode

from oncelog.testing.broker_process import BrokerProcess, create_topic
from tests.compat.test_clients import consume_all
from tests.inproc import API_PRODUCE, InProcessBroker
from tests.protocol.test_record_validation import batch_of, body, compress, records_of

T = "t"


@pytest.fixture
def b(tmp_path: Path):  # type: ignore[no-untyped-def]
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic(T, 1)
    yield broker
    broker.close()


def produce(b: InProcessBroker, records: bytes, version: int = 9) -> Any:
    resp = b.call(API_PRODUCE, version, {
        "transactional_id": None, "acks": -1, "timeout": 30_000,
        "topic_data": [{"name": T, "partition_data": [{"index": 0, "records": records}]}]})
    return resp.responses[0].partition_responses[0]


@pytest.mark.parametrize(("records", "code", "message"), [
    (batch_of(records_of([body(1), body(0)]), 2), ErrorCode.invalid_record, "invalid offset delta"),
    (batch_of(records_of([body(0), body(1)]), 1), ErrorCode.invalid_record, "remain after 1 records"),
    (batch_of(b"\x28\xb5\x2f\xfd" + b"\x00" * 20, 1, attributes=4), ErrorCode.invalid_record, "zstd records"),
    (batch_of(gzip.compress(b"\x07garbage"), 1, attributes=1), ErrorCode.invalid_record, "record 0"),
    (batch_of(records_of([body(0)]), 1, attributes=6), ErrorCode.invalid_record, "unknown compression type 6"),
], ids=["offset-delta", "count", "zstd-garbage", "gzip-garbage-records", "codec-6"])
def test_a_bad_batch_gets_kafkas_error_and_leaves_the_log_alone(b: InProcessBroker, records: bytes, code: int,
                                                                message: str) -> None:
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    assert produce(b, batch_of(records_of([body(0)]), 1)).error_code == 0
    size_before = plog.active.size
    part = produce(b, records)
    assert part.error_code == code
    assert message in (part.error_message or "")
    assert part.base_offset == -1
    assert plog.log_end_offset == 1 and plog.active.size == size_before
    ok = produce(b, batch_of(records_of([body(0, value=b"after")]), 1))
    assert ok.error_code == 0 and ok.base_offset == 1
    b.restart()
    assert b.visible_values(T, 0) == [b"v", b"after"]


def test_an_idempotent_batch_without_a_sequence_is_invalid_record(b: InProcessBroker) -> None:
    err, pid, epoch = b.init_producer_id(None)
    assert err == 0 and epoch == 0
    part = produce(b, batch_of(records_of([body(0)]), 1, producer_id=pid, base_sequence=-1))
    assert part.error_code == ErrorCode.invalid_record
    assert "invalid sequence number -1" in (part.error_message or "")
    assert produce(b, batch_of(records_of([body(0)]), 1, producer_id=pid, base_sequence=0)).error_code == 0


def test_zstd_needs_produce_v7(b: InProcessBroker) -> None:
    zstd_batch = batch_of(compress(4, records_of([body(0)])), 1, attributes=4)
    part = produce(b, zstd_batch, version=6)
    assert part.error_code == ErrorCode.unsupported_compression_type
    assert produce(b, zstd_batch, version=7).error_code == 0


def test_a_bomb_is_refused_at_its_first_bad_record_or_at_the_bound(b: InProcessBroker) -> None:
    zeros = b"\x00" * (200 << 20)
    bomb = compress(4, zeros)  # 200 MiB of zeros in a few KiB: record 0 has length 0 (Kafka: INVALID_RECORD)
    assert len(bomb) < 64 << 10
    part = produce(b, batch_of(bomb, 1, attributes=4))
    assert part.error_code == ErrorCode.invalid_record
    assert "record 0: invalid record length 0" in (part.error_message or "")
    one_huge_record = compress(4, records_of([body(0, value=zeros)]))  # valid, but past the 128 MiB bound
    part = produce(b, batch_of(one_huge_record, 1, attributes=4))
    assert part.error_code == ErrorCode.message_too_large
    assert "inflate past" in (part.error_message or "")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_librdkafka_compressed_batches_pass_and_read_back(broker: BrokerProcess, codec: str) -> None:
    create_topic(broker.bootstrap, "c", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": codec, "linger.ms": 20,
                  "enable.idempotence": True})
    errors: list[Any] = []
    for i in range(2000):
        p.produce("c", value=b"value-%d-" % i + b"x" * (i % 300), key=None if i % 3 else b"k%d" % i,
                  headers=[("h", b"%d" % i)] if i % 5 == 0 else None,
                  on_delivery=lambda err, _m: err and errors.append(err))
    assert p.flush(30) == 0
    assert errors == []
    msgs = consume_all(broker.bootstrap, "c", 2, 2000)
    assert sorted(m.value() for m in msgs) == sorted(b"value-%d-" % i + b"x" * (i % 300) for i in range(2000))
    log = (broker.log_path.read_text() if broker.log_path else "")
    assert "rejecting" not in log


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_aiokafka_compressed_batches_pass(broker: BrokerProcess, codec: str) -> None:
    from aiokafka import AIOKafkaProducer

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=20)
        await p.start()
        try:
            futs = [await p.send("a", b"aio-%d" % i + b"y" * (i % 200)) for i in range(500)]
            await asyncio.gather(*futs)
        finally:
            await p.stop()

    asyncio.run(run())
    assert len(consume_all(broker.bootstrap, "a", 1, 500)) == 500


@pytest.mark.parametrize("codec", ["gzip", "lz4"])
def test_kafka_python_compressed_batches_pass(broker: BrokerProcess, codec: str) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=20)
    futs = [p.send("kp", b"kp-%d" % i + b"z" * (i % 100)) for i in range(500)]
    p.flush(30)
    for f in futs:
        f.get(timeout=10)
    p.close()
    assert len(consume_all(broker.bootstrap, "kp", 1, 500)) == 500


def _first_header(b: InProcessBroker) -> Any:
    from oncelog.protocol import records as rb

    part = b.fetch(T, 0, 0, read_committed=False)
    data = bytes(part.records or b"")
    header = rb.read_header(data, 0)
    rb.split_batches(data, from_client=True)  # the CRC still holds
    return header


@pytest.mark.parametrize("claimed", [-1, 1], ids=["sarama-minus-one", "epoch-start"])
def test_a_create_time_batch_whose_max_timestamp_lies_below_its_records_is_set_right(
        b: InProcessBroker, claimed: int) -> None:
    """Sarama before 1.45 sent max_timestamp -1: segments and the time index took the header's
    value, so retention never deleted such records and ListOffsets by time skipped them (a probe).
    Kafka's LogValidator sets every batch's max from its records; so do we, where it is below the
    first record's."""
    from oncelog.protocol import records as rb

    now = b.clock.now_ms()
    recs = [rb.encode_record(i, i, b"k", b"v%d" % i) for i in range(3)]
    assert produce(b, rb.build_batch(recs, base_timestamp=now, max_timestamp=claimed)).error_code == 0
    header = _first_header(b)
    assert header.max_timestamp == now + 2 and not header.attributes & rb.ATTR_TIMESTAMP_TYPE
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None and plog.active.max_timestamp == now + 2
    assert plog.offset_for_timestamp(now - 1000) is not None


def test_a_log_append_time_claim_on_a_create_time_topic_is_cleared(b: InProcessBroker) -> None:
    """A client batch with the LogAppendTime bit on a CreateTime topic showed consumers a max
    timestamp the client chose (past message.timestamp.after.max.ms). Kafka sets CreateTime and the
    records' max."""
    from oncelog.protocol import records as rb

    now = b.clock.now_ms()
    recs = [rb.encode_record(0, 0, b"k", b"v")]
    lying = rb.build_batch(recs, base_timestamp=now, max_timestamp=now + 10**9, attributes=rb.ATTR_TIMESTAMP_TYPE)
    assert produce(b, lying).error_code == 0
    header = _first_header(b)
    assert header.max_timestamp == now and not header.attributes & rb.ATTR_TIMESTAMP_TYPE


def test_records_without_a_timestamp_pass_the_timestamp_bounds(tmp_path: Path) -> None:
    """message.timestamp.before/after.max.ms check records that have a timestamp: -1 passes, as in
    Kafka's validateTimestamp (it was INVALID_TIMESTAMP)."""
    from oncelog.protocol import records as rb

    broker = InProcessBroker(tmp_path / "d")
    try:
        broker.broker.logs.create_topic(T, 1, {"message.timestamp.before.max.ms": "1000"})
        recs = [rb.encode_record(0, 0, b"k", b"v")]
        assert produce(broker, rb.build_batch(recs, base_timestamp=-1, max_timestamp=-1)).error_code == 0
        old = broker.clock.now_ms() - 5000
        assert produce(broker, rb.build_batch(recs, base_timestamp=old, max_timestamp=old)).error_code == \
            ErrorCode.invalid_timestamp
    finally:
        broker.close()

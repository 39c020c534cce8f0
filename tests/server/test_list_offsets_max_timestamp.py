"""ListOffsets v7's max-timestamp spec (-3): the first record with the largest timestamp, bounded by
the high watermark (or the LSO for read_committed), through librdkafka's AdminClient and in process;
and lookups by timestamp inside compressed batches, whose records keep their own timestamps."""

from __future__ import annotations

from pathlib import Path

import crc32c
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from oncelog.protocol import compression
from oncelog.protocol import records as rb
from oncelog.testing.broker_process import BrokerProcess, create_topic
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch


def _list(b: InProcessBroker, version: int, ts: int, isolation: int = 0) -> tuple[int, int, int]:
    r = b.call(2, version, {"replica_id": -1, "isolation_level": isolation, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": ts}]}]})
    p = r.topics[0].partitions[0]
    return int(p.error_code), int(p.offset), int(p.timestamp)


def test_max_timestamp_in_process(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d")
    b.create_topic("t", 1)
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    assert _list(b, 7, -3) == (0, -1, -1)  # empty log
    assert b.produce("t", 0, batch(3, ts=1_000)) == 0  # offsets 0..2, timestamps 1000..1002
    assert b.produce("t", 0, batch(2, ts=5_000)) == 0  # offsets 3..4, 5000..5001
    plog.roll()
    assert b.produce("t", 0, batch(2, ts=2_000)) == 0  # offsets 5..6: an older timestamp in a newer segment
    assert _list(b, 7, -3) == (0, 4, 5001)
    assert b.produce("t", 0, batch(1, ts=5_001)) == 0  # a tie: the first one wins
    assert _list(b, 7, -3) == (0, 4, 5001)
    assert _list(b, 6, -3)[0] != 0  # only v7 knows -3
    # read_committed: a max-timestamp record above the LSO is not answered
    _err, pid, epoch = b.init_producer_id("tx")
    b.add_partitions("tx", pid, epoch, [("t", 0)])
    assert b.produce("t", 0, batch(1, ts=9_000, pid=pid, epoch=epoch, seq=0, txn=True), transactional_id="tx") == 0
    assert _list(b, 7, -3, isolation=0) == (0, 8, 9000)
    assert _list(b, 7, -3, isolation=1) == (0, -1, -1)
    b.close()


def test_max_timestamp_with_librdkafka_admin(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "mt")
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for ts in (1_000, 7_000, 3_000):
        p.produce("mt", b"v%d" % ts, timestamp=ts)
    p.flush(10)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.list_offsets({TopicPartition("mt", 0): OffsetSpec.max_timestamp()}, request_timeout=10)
    info = futures[TopicPartition("mt", 0)].result(10)
    assert (info.offset, info.timestamp) == (1, 7_000)


def _batch_at(timestamps: list[int], codec: int) -> bytes:
    """One batch whose records carry ``timestamps`` (CreateTime), compressed with ``codec``."""
    base = min(timestamps)
    records = b"".join(rb.encode_record(i, ts - base, b"k%d" % i, b"v%d" % i) for i, ts in enumerate(timestamps))
    payload = compression.compress(codec, records) if codec else records
    plain = rb.build_batch([payload], base_timestamp=base, max_timestamp=max(timestamps), attributes=codec)
    # build_batch counted one record (the payload); the batch holds len(timestamps)
    fixed = bytearray(plain)
    fixed[rb.HEADER_SIZE - 4:rb.HEADER_SIZE] = len(timestamps).to_bytes(4, "big")
    fixed[23:27] = (len(timestamps) - 1).to_bytes(4, "big")
    fixed[17:21] = crc32c.crc32c(bytes(fixed[21:])).to_bytes(4, "big")
    return bytes(fixed)


@pytest.mark.parametrize("codec", [compression.NONE, compression.GZIP, compression.LZ4, compression.ZSTD])
def test_timestamp_lookups_find_the_record_inside_a_compressed_batch(tmp_path: Path, codec: int) -> None:
    """Kafka's FileRecords.searchForTimestamp reads the records of compressed batches too. Answering
    with the batch's base offset (as oncelog did) sent a consumer seeking by time back to records
    older than it asked for, and paired the offset with another record's timestamp."""
    b = InProcessBroker(tmp_path / "d")
    b.create_topic("t", 1)
    assert b.produce("t", 0, _batch_at([1_000, 2_000, 3_000, 5_000, 4_000], codec)) == 0  # offsets 0..4
    assert b.produce("t", 0, _batch_at([6_000, 9_000, 7_000], codec)) == 0  # offsets 5..7
    assert _list(b, 7, 1_000) == (0, 0, 1_000)
    assert _list(b, 7, 2_500) == (0, 2, 3_000)
    assert _list(b, 7, 4_500) == (0, 3, 5_000)  # the first record at or after, in offset order
    assert _list(b, 7, 5_001) == (0, 5, 6_000)
    assert _list(b, 7, 8_000) == (0, 6, 9_000)
    assert _list(b, 7, 9_001) == (0, -1, -1)
    assert _list(b, 7, -3) == (0, 6, 9_000)
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    plog.delete_records(4)  # the log now starts inside the first batch
    assert _list(b, 7, 1_000) == (0, 4, 4_000)
    assert _list(b, 7, -3) == (0, 6, 9_000)
    b.close()


def test_log_append_time_batches_answer_their_first_record(tmp_path: Path) -> None:
    """On a LogAppendTime topic every record of a batch has the batch's time: a lookup answers the
    batch's first record with it. (A client's LogAppendTime bit on a CreateTime topic is cleared,
    as Kafka's LogValidator does: test_produce_validation.py.)"""
    b = InProcessBroker(tmp_path / "d")
    b.broker.logs.create_topic("t", 1, {"message.timestamp.type": "LogAppendTime"})
    assert b.produce("t", 0, _batch_at([1_000, 2_000, 3_000], compression.GZIP)) == 0
    err, offset, ts = _list(b, 7, 0)
    assert (err, offset, ts) == (0, 0, b.clock.now_ms())
    b.close()


def test_offsets_for_times_inside_compressed_batches_with_librdkafka(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "ct")
    p = Producer({"bootstrap.servers": broker.bootstrap, "compression.type": "gzip", "linger.ms": 200})
    base = 1_700_000_000_000
    for i in range(5):
        p.produce("ct", b"v%d" % i + b"a" * 500, timestamp=base + 1_000 * i)  # compressible: gzip is kept
    p.flush(10)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ct-g", "enable.auto.commit": False})
    try:
        [found] = c.offsets_for_times([TopicPartition("ct", 0, base + 2_500)], timeout=10)
        assert found.offset == 3
    finally:
        c.close()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.list_offsets({TopicPartition("ct", 0): OffsetSpec.max_timestamp()}, request_timeout=10)
    info = futures[TopicPartition("ct", 0)].result(10)
    assert (info.offset, info.timestamp) == (4, base + 4_000)

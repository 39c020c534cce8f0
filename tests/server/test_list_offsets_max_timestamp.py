"""ListOffsets v7's max-timestamp spec (-3): the first record with the largest timestamp, bounded by
the high watermark (or the LSO for read_committed), through librdkafka's AdminClient and in process."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

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

"""The stream reader's planning and reading, called directly (no Spark): LSO bound, offset gaps,
subscribe / subscribePattern / assign, maxOffsetsPerTrigger, failOnDataLoss-free defaults."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from oncelog.spark.source import KafkaMetadata, KafkaStreamReader
from oncelog.testing.broker_process import BrokerProcess, create_topic


def _numbered(bs: str, topic: str, n: int) -> None:
    """A topic of one partition holding values v0 .. v(n-1) at offsets 0 .. n-1."""
    create_topic(bs, topic, 1)
    p = Producer({"bootstrap.servers": bs})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(15) == 0


def _values(reader: KafkaStreamReader, start: dict, end: dict) -> list[bytes]:
    out: list[bytes] = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            out.extend(batch.column("value").to_pylist())
    return out


def test_plans_only_below_the_lso_and_reads_across_markers(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "src", 1)
    txn = Producer({"bootstrap.servers": bs, "transactional.id": "src-writer"})
    txn.init_transactions(15)
    txn.begin_transaction()
    txn.produce("src", value=b"a1")
    txn.commit_transaction(15)
    txn.begin_transaction()
    txn.produce("src", value=b"dropped")
    txn.flush(15)  # in the log before the abort (librdkafka would otherwise purge it unsent)
    txn.abort_transaction(15)
    txn.begin_transaction()
    txn.produce("src", value=b"open")
    txn.flush(15)

    reader = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "src", "startingOffsets": "earliest"})
    start = reader.initialOffset()
    assert start == {"src": {"0": 0}}
    end = reader.latestOffset(start, ReadAllAvailable())
    # a1 (0), its marker (1), dropped (2), abort marker (3); "open" at 4 is undecided: LSO = 4.
    assert end == {"src": {"0": 4}}
    assert _values(reader, start, end) == [b"a1"]

    txn.commit_transaction(15)
    end2 = reader.latestOffset(end, ReadAllAvailable())
    assert end2 == {"src": {"0": 6}}
    assert _values(reader, end, end2) == [b"open"]
    assert reader.latestOffset(end2, ReadAllAvailable()) == end2
    reader.stop()


def test_max_rows_limit_and_subscription_forms(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "m-a", 2)
    create_topic(bs, "m-b", 1)
    p = Producer({"bootstrap.servers": bs})
    for i in range(30):
        p.produce("m-a", value=b"a%d" % i, partition=i % 2)
        p.produce("m-b", value=b"b%d" % i)
    p.flush(10)

    reader = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribePattern": "m-.*",
                                "startingOffsets": "earliest", "maxOffsetsPerTrigger": "20"})
    assert isinstance(reader.getDefaultReadLimit(), ReadMaxRows)
    start = reader.initialOffset()
    assert start == {"m-a": {"0": 0, "1": 0}, "m-b": {"0": 0}}
    seen: list[bytes] = []
    batches = 0
    while True:
        end = reader.latestOffset(start, reader.getDefaultReadLimit())
        if end == start:
            break
        got = _values(reader, start, end)
        assert 0 < len(got) <= 20
        seen.extend(got)
        start = end
        batches += 1
    assert sorted(seen) == sorted([b"a%d" % i for i in range(30)] + [b"b%d" % i for i in range(30)])
    assert batches >= 3
    reader.stop()

    assigned = KafkaMetadata({"kafka.bootstrap.servers": bs, "assign": '{"m-a": [1]}'})
    assert assigned.partitions() == {"m-a": [1]}
    with pytest.raises(ValueError):
        KafkaMetadata({"kafka.bootstrap.servers": bs, "subscribe": "x", "assign": '{"x": [0]}'})


def test_starting_offsets_latest_and_json(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "so", 2)
    p = Producer({"bootstrap.servers": bs})
    for i in range(10):
        p.produce("so", value=b"%d" % i, partition=i % 2)
    p.flush(10)
    latest = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "so"})
    assert latest.initialOffset() == {"so": {"0": 5, "1": 5}}
    js = KafkaStreamReader({"kafka.bootstrap.servers": bs, "subscribe": "so",
                            "startingOffsets": '{"so": {"0": 3, "1": -2}}'})
    assert js.initialOffset() == {"so": {"0": 3, "1": 0}}
    latest.stop()
    js.stop()


def test_a_pooled_consumer_reads_each_range_exactly(broker: BrokerProcess) -> None:
    """One consumer serves every range of this process (CONSUMERS): what it prefetched past one range
    (or from another partition) never shows up in the next, backwards or forwards."""
    from oncelog.spark.clients import CONSUMERS
    from oncelog.spark.source import OffsetRange, read_range

    bs = broker.bootstrap
    create_topic(bs, "pooled", 2)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 5})
    for i in range(3000):
        p.produce("pooled", value=b"%d" % i, partition=i % 2)
    p.flush(15)
    conf = {"bootstrap.servers": bs}
    created = CONSUMERS.created
    for part, start, end in [(0, 0, 100), (0, 700, 900), (1, 50, 60), (0, 100, 700), (0, 1400, 1500)]:
        got = [o for b in read_range(conf, OffsetRange("pooled", part, start, end), False, 15, batch_rows=64,
                                     group_id="g-pooled")
               for o in b.column("offset").to_pylist()]
        assert got == list(range(start, end)), (part, start, end)
    assert CONSUMERS.created == created + 1, "one consumer, lent to every range"


def test_records_deleted_between_planning_and_reading(broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    """A lagging query plans a range; retention (here DeleteRecords) removes its first records before
    an executor reads it. Under failOnDataLoss=true (the default) the read fails and says what to
    do; under false it skips what is gone with a warning and reads the rest, as Spark's Kafka source
    does. (The reader used to fail either way with librdkafka's bare _AUTO_OFFSET_RESET, so a query
    that asked to skip lost data failed anyway.) The batch reader takes the option too."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient

    from oncelog.spark.ranges import RecordsLost
    from oncelog.spark.source import KafkaBatchReader

    bs = broker.bootstrap
    _numbered(bs, "aged", 100)
    opts = {"kafka.bootstrap.servers": bs, "subscribe": "aged", "startingOffsets": "earliest"}
    strict, lenient = KafkaStreamReader(opts), KafkaStreamReader({**opts, "failOnDataLoss": "false"})
    batch = KafkaBatchReader({**opts, "failOnDataLoss": "false"})
    start = {"aged": {"0": 0}}
    end = strict.latestOffset(start, ReadAllAvailable())
    assert end == {"aged": {"0": 100}}
    planned = {name: r.partitions(start, end) for name, r in (("strict", strict), ("lenient", lenient))}
    planned["batch"] = batch.partitions()
    planned["gone"] = lenient.partitions({"aged": {"0": 10}}, {"aged": {"0": 40}})
    admin = AdminClient({"bootstrap.servers": bs})  # kept: its futures end with it
    for f in admin.delete_records([TopicPartition("aged", 0, 50)]).values():
        f.result(15)

    def offsets(reader: object, parts: list) -> list[int]:
        return [o for part in parts for b in reader.read(part) for o in b.column("offset").to_pylist()]  # type: ignore[attr-defined]

    with pytest.raises(RecordsLost, match=r"offset 0 is out of range \(the log now holds \[50, 100\)\).*"
                                          r"set the source option 'failOnDataLoss' to 'false'"):
        offsets(strict, planned["strict"])
    caplog.set_level("WARNING", logger="oncelog.spark")
    assert offsets(lenient, planned["lenient"]) == list(range(50, 100))
    assert "records [0, 50) are skipped (failOnDataLoss=false)" in caplog.text
    assert offsets(batch, planned["batch"]) == list(range(50, 100))
    assert offsets(lenient, planned["gone"]) == [], "nothing of [10, 40) is left"
    assert "records [10, 40) are skipped" in caplog.text
    # Planned after the deletion, the strict reader fails at planning with the same advice.
    with pytest.raises(RuntimeError, match="data loss on aged-0: next offset 0 is outside"):
        strict.partitions(start, end)
    for r in (strict, lenient):
        r.stop()


def test_a_deleted_input_topic_is_a_data_loss(broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    """A topic the query reads (here through a pattern) is deleted with records it has not read: as
    in Spark, the next batch's planning fails saying which partitions are gone, or, under
    failOnDataLoss=false, warns and goes on with the rest. (Planning used to drop them silently.)"""
    from confluent_kafka.admin import AdminClient

    bs = broker.bootstrap
    for t in ("gone-a", "gone-b"):
        create_topic(bs, t, 2)
    p = Producer({"bootstrap.servers": bs})
    for i in range(20):
        p.produce(("gone-a", "gone-b")[i % 2], value=b"v%d" % i, partition=i % 4 // 2)
    assert p.flush(15) == 0
    opts = {"kafka.bootstrap.servers": bs, "subscribePattern": "gone-.*", "startingOffsets": "earliest"}
    strict, lenient = KafkaStreamReader(opts), KafkaStreamReader({**opts, "failOnDataLoss": "false"})
    start = strict.initialOffset()
    assert sorted(start) == ["gone-a", "gone-b"]
    admin = AdminClient({"bootstrap.servers": bs})  # kept: its futures end with it
    for f in admin.delete_topics(["gone-a"]).values():
        f.result(15)
    end = strict.latestOffset(start, ReadAllAvailable())
    assert sorted(end) == ["gone-b"]
    with pytest.raises(RuntimeError, match=r"partitions gone-a-0, gone-a-1 are gone .*'failOnDataLoss' to 'false'"):
        strict.partitions(start, end)
    caplog.set_level("WARNING", logger="oncelog.spark")
    assert sorted(_values(lenient, start, end)) == sorted(b"v%d" % i for i in range(1, 20, 2))
    assert "partitions gone-a-0, gone-a-1 are gone" in caplog.text
    for r in (strict, lenient):
        r.stop()


def test_an_added_partition_whose_first_records_are_gone_is_a_data_loss(broker: BrokerProcess,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """A partition added while the query ran is read from offset 0; if its first records were deleted
    before the query saw it, Spark reports a data loss ("Added partition ... starts from ... instead
    of 0"). It was read from its log start without a word, even under failOnDataLoss=true."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, NewPartitions

    bs = broker.bootstrap
    create_topic(bs, "grow", 1)
    opts = {"kafka.bootstrap.servers": bs, "subscribe": "grow", "startingOffsets": "earliest"}
    strict, lenient = KafkaStreamReader(opts), KafkaStreamReader({**opts, "failOnDataLoss": "false"})
    start = strict.initialOffset()
    admin = AdminClient({"bootstrap.servers": bs})  # kept: its futures end with it
    for f in admin.create_partitions([NewPartitions("grow", 2)]).values():
        f.result(15)
    p = Producer({"bootstrap.servers": bs})
    for i in range(6):
        p.produce("grow", value=b"n%d" % i, partition=1)
    assert p.flush(15) == 0
    for f in admin.delete_records([TopicPartition("grow", 1, 4)]).values():
        f.result(15)
    with pytest.raises(RuntimeError, match=r"added partition grow-1 starts from 4 instead of 0.*'failOnDataLoss'"):
        strict.partitions(start, strict.latestOffset(start, ReadAllAvailable()))
    caplog.set_level("WARNING", logger="oncelog.spark")
    end = lenient.latestOffset(start, ReadAllAvailable())
    assert sorted(_values(lenient, start, end)) == [b"n4", b"n5"]
    assert "added partition grow-1 starts from 4 instead of 0" in caplog.text
    for r in (strict, lenient):
        r.stop()


def test_max_records_per_partition_splits_a_partition_into_tasks(broker: BrokerProcess) -> None:
    """Spark 4's maxRecordsPerPartition, on a stream and a batch read: 100 records of one partition
    become 4 tasks of at most 30 offsets, which together read every record once."""
    from oncelog.spark.source import KafkaBatchReader

    bs = broker.bootstrap
    _numbered(bs, "split", 100)
    opts = {"kafka.bootstrap.servers": bs, "subscribe": "split", "startingOffsets": "earliest",
            "maxRecordsPerPartition": "30"}
    stream, batch = KafkaStreamReader(opts), KafkaBatchReader(opts)
    start = stream.initialOffset()
    end = stream.latestOffset(start, ReadAllAvailable())
    for reader, parts in ((stream, stream.partitions(start, end)), (batch, batch.partitions())):
        assert [(q.rng.start, q.rng.end) for q in parts] == [(0, 25), (25, 50), (50, 75), (75, 100)]
        got = [v for q in parts for b in reader.read(q) for v in b.column("value").to_pylist()]
        assert got == [b"v%d" % i for i in range(100)]
    with pytest.raises(ValueError, match="maxRecordsPerPartition"):
        KafkaStreamReader({**opts, "maxRecordsPerPartition": "0"})
    stream.stop()


def test_a_batch_read_ending_past_a_partitions_end_is_a_data_loss(broker: BrokerProcess,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """endingOffsets naming offsets a partition does not have: as in Spark, a data loss, or under
    failOnDataLoss=false the partition's records up to its end and a warning. The read used to wait
    for them for kafkaConsumer.pollTimeoutMs (120 s by default) and fail as "stuck" either way."""
    from oncelog.spark.source import KafkaBatchReader

    bs = broker.bootstrap
    _numbered(bs, "short", 5)
    opts = {"kafka.bootstrap.servers": bs, "subscribe": "short", "startingOffsets": "earliest",
            "endingOffsets": '{"short": {"0": 50}}', "kafkaConsumer.pollTimeoutMs": "3000"}
    with pytest.raises(RuntimeError, match=r"short-0 up to 50, past its end 5.*'failOnDataLoss'"):
        KafkaBatchReader(opts).partitions()
    caplog.set_level("WARNING", logger="oncelog.spark")
    lenient = KafkaBatchReader({**opts, "failOnDataLoss": "false"})
    parts = lenient.partitions()
    assert [v for q in parts for b in lenient.read(q) for v in b.column("value").to_pylist()] == \
        [b"v%d" % i for i in range(5)]
    assert "short-0 up to 50, past its end 5" in caplog.text

"""The stream reader after its input lost records below a planned or replayed batch (no Spark): a
topic made again with fewer records or fewer partitions, and a checkpoint outside the log. As in
Spark's Kafka source: an error at once under failOnDataLoss=true, a warning naming what is skipped
under false, and never a stall."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pyspark.sql.streaming.datasource import ReadAllAvailable

from oncelog.spark.ranges import RecordsLost
from oncelog.spark.source import KafkaStreamReader
from oncelog.testing.broker_process import BrokerProcess, create_topic

#: Long enough that a read waiting for missing records would be seen to stall.
POLL_TIMEOUT_MS = "20000"


def _fill(bs: str, topic: str, n: int, tag: bytes, partitions: int = 1) -> None:
    p = Producer({"bootstrap.servers": bs})
    for i in range(n):
        p.produce(topic, value=b"%s-%d" % (tag, i), partition=i % partitions)
    assert p.flush(15) == 0


def _made_again(bs: str, topic: str, partitions: int) -> None:
    """Delete ``topic`` and create it again, empty, with ``partitions`` partitions."""
    admin = AdminClient({"bootstrap.servers": bs})  # kept: its futures end with it
    for f in admin.delete_topics([topic]).values():
        f.result(15)
    deadline = time.monotonic() + 15
    while True:
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
            return
        except KafkaException:  # the deletion is not finished yet
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _readers(bs: str, topic: str) -> tuple[KafkaStreamReader, KafkaStreamReader]:
    opts = {"kafka.bootstrap.servers": bs, "subscribe": topic, "startingOffsets": "earliest",
            "kafkaConsumer.pollTimeoutMs": POLL_TIMEOUT_MS}
    return KafkaStreamReader(opts), KafkaStreamReader({**opts, "failOnDataLoss": "false"})


def _values(reader: KafkaStreamReader, parts: list) -> list[bytes]:
    return [v for part in parts for b in reader.read(part) for v in b.column("value").to_pylist()]


def test_a_planned_range_past_the_recreated_log_end_is_a_data_loss(broker: BrokerProcess,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A batch [0, 100) is planned; the topic is deleted and made again with 40 records before an
    executor reads it. The read used to stop at 40 and wait for the rest for
    kafkaConsumer.pollTimeoutMs (120 s by default), then fail as "stuck at offset 40 below 100"
    whatever failOnDataLoss said. Now: RecordsLost at once, or the 40 records and a warning."""
    bs = broker.bootstrap
    create_topic(bs, "recr", 1)
    _fill(bs, "recr", 100, b"old")
    strict, lenient = _readers(bs, "recr")
    start = strict.initialOffset()
    end = strict.latestOffset(start, ReadAllAvailable())
    assert end == {"recr": {"0": 100}}
    planned = {r: r.partitions(start, end) for r in (strict, lenient)}
    _made_again(bs, "recr", 1)
    _fill(bs, "recr", 40, b"new")
    t0 = time.monotonic()
    with pytest.raises(RecordsLost, match=r"offset 40 is out of range \(the log now holds \[0, 40\)\).*"
                                          r"'failOnDataLoss' to 'false'"):
        _values(strict, planned[strict])
    caplog.set_level("WARNING", logger="oncelog.spark")
    assert _values(lenient, planned[lenient]) == [b"new-%d" % i for i in range(40)]
    assert time.monotonic() - t0 < 10, "no stall"
    assert "records [40, 100) are skipped (failOnDataLoss=false)" in caplog.text
    for r in (strict, lenient):
        r.stop()


def test_a_replayed_batch_past_the_log_end_is_a_data_loss(broker: BrokerProcess,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Spark replays a batch [50, 100) from its offset log after the log lost its tail (here: made
    again with 60 records). Planning it fails under failOnDataLoss=true, naming the partition and
    the missing end; under false it warns, and the read returns what is there and ends."""
    bs = broker.bootstrap
    create_topic(bs, "replay", 1)
    _fill(bs, "replay", 100, b"old")
    _made_again(bs, "replay", 1)
    _fill(bs, "replay", 60, b"new")
    strict, lenient = _readers(bs, "replay")
    start, end = {"replay": {"0": 50}}, {"replay": {"0": 100}}
    with pytest.raises(RuntimeError, match=r"the batch reads replay-0 up to 100, past its end 60.*'failOnDataLoss'"):
        strict.partitions(start, end)
    caplog.set_level("WARNING", logger="oncelog.spark")
    t0 = time.monotonic()
    assert _values(lenient, list(lenient.partitions(start, end))) == [b"new-%d" % i for i in range(50, 60)]
    assert time.monotonic() - t0 < 10, "no stall"
    assert "the batch reads replay-0 up to 100, past its end 60" in caplog.text
    assert "records [60, 100) are skipped (failOnDataLoss=false)" in caplog.text
    for r in (strict, lenient):
        r.stop()


def test_a_batch_naming_a_partition_that_no_longer_exists(broker: BrokerProcess,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A topic of 3 partitions is made again with 1. Replaying a batch that names all three used to
    fail in planning after fetchOffset.numRetries attempts ("Unknown partition"), whatever
    failOnDataLoss said; a batch planned before the change, read after it, stalled on the vanished
    partitions. Now planning fails naming them, or warns and plans the partition that is left; and
    a read of a vanished partition is a data loss within a couple of seconds, or skipped."""
    bs = broker.bootstrap
    create_topic(bs, "shrink", 3)
    _fill(bs, "shrink", 300, b"old", partitions=3)
    strict, lenient = _readers(bs, "shrink")
    start = {"shrink": {"0": 50, "1": 50, "2": 50}}
    end = {"shrink": {"0": 100, "1": 100, "2": 100}}
    before = {r: {q.rng.partition: q for q in r.partitions(start, end)} for r in (strict, lenient)}
    _made_again(bs, "shrink", 1)
    _fill(bs, "shrink", 200, b"new")
    with pytest.raises(RuntimeError, match=r"partitions shrink-1, shrink-2 of the batch no longer exist.*"
                                           r"'failOnDataLoss'"):
        strict.partitions(start, end)
    caplog.set_level("WARNING", logger="oncelog.spark")
    t0 = time.monotonic()
    parts = lenient.partitions(start, end)
    assert [(q.rng.partition, q.rng.start, q.rng.end) for q in parts] == [(0, 50, 100)]
    assert "partitions shrink-1, shrink-2 of the batch no longer exist" in caplog.text
    assert _values(lenient, list(parts)) == [b"new-%d" % i for i in range(50, 100)]
    with pytest.raises(RecordsLost, match=r"offset 50 is out of range \(its partition no longer exists\)"):
        _values(strict, [before[strict][2]])
    assert _values(lenient, [before[lenient][2]]) == []
    assert "the partition no longer exists" in caplog.text
    assert time.monotonic() - t0 < 10, "no stall"
    for r in (strict, lenient):
        r.stop()


def test_a_checkpoint_outside_the_log_is_moved_with_a_warning(broker: BrokerProcess,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The next offset of a partition lies below its log's start (retention) or past its end (the
    topic made again): under failOnDataLoss=false the batch starts inside the log, as before, but
    it now says so, naming the offsets, as Spark's "Partition X's offset was changed from A to B"
    (they were skipped without a word). Said once: by the batch's planning, not by latestOffset
    too."""
    bs = broker.bootstrap
    create_topic(bs, "aged", 1)
    _fill(bs, "aged", 100, b"v")
    admin = AdminClient({"bootstrap.servers": bs})  # kept: its futures end with it
    for f in admin.delete_records([TopicPartition("aged", 0, 50)]).values():
        f.result(15)
    create_topic(bs, "back", 1)
    _fill(bs, "back", 30, b"v")
    caplog.set_level("WARNING", logger="oncelog.spark")
    for topic, cur, said, values in (("aged", 10, "changed from 10 to 50: records [10, 50) are skipped", 50),
                                     ("back", 100, "changed from 100 to 30: the log now ends there", 0)):
        strict, lenient = _readers(bs, topic)
        start = {topic: {"0": cur}}
        with pytest.raises(RuntimeError, match=rf"data loss on {topic}-0: next offset {cur} is outside"):
            strict.latestOffset(start, ReadAllAvailable())
        caplog.clear()
        end = lenient.latestOffset(start, ReadAllAvailable())
        assert caplog.text == ""
        assert len(_values(lenient, list(lenient.partitions(start, end)))) == values
        assert caplog.text.count(said) == 1, caplog.text
        for r in (strict, lenient):
            r.stop()

"""consume_range: a range ends on the consumer's position (markers and aborted records occupy offsets
but are never delivered), and an open transaction below the planned end is a TimeoutError, not a hang."""

from __future__ import annotations

import time
import types
import uuid

import pytest

from oncelog.spark.ranges import consume_range
from oncelog.testing.broker_process import BrokerProcess, create_topic


def _reader(bs: str) -> object:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": bs, "group.id": f"g-{uuid.uuid4()}", "enable.auto.commit": False,
                     "isolation.level": "read_committed", "enable.partition.eof": True})


def _hw(bs: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bs, "group.id": f"g-{uuid.uuid4()}", "isolation.level": "read_uncommitted"})
    try:
        return int(c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1])
    finally:
        c.close()


def test_range_with_markers_and_aborted_records_ends(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    bs = broker.bootstrap
    create_topic(bs, "r", 1)
    p = Producer({"bootstrap.servers": bs, "transactional.id": "ranges-1"})
    p.init_transactions(30)
    for n, abort in enumerate([False, True, False]):
        p.begin_transaction()
        for i in range(3):
            p.produce("r", value=b"%d-%d" % (n, i), partition=0)
        p.flush(10)  # on the log before the abort (librdkafka purges unsent records on abort)
        (p.abort_transaction if abort else p.commit_transaction)(30)
    end = _hw(bs, "r")
    assert end == 12, "3 transactions of 3 records, each with a marker"
    c = _reader(bs)
    try:
        got = [m.value() for msgs in consume_range(c, "r", 0, 0, end, timeout_s=20, max_messages=2) for m in msgs]
        assert got == [b"0-0", b"0-1", b"0-2", b"2-0", b"2-1", b"2-2"]
        tail = [m.value() for msgs in consume_range(c, "r", 0, 4, 8, timeout_s=20, max_messages=10) for m in msgs]
        assert tail == [], "offsets 4..7: aborted records and the abort marker, none delivered"
    finally:
        c.close()  # type: ignore[attr-defined]


def test_open_transaction_below_the_end_times_out(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    bs = broker.bootstrap
    create_topic(bs, "open", 1)
    p = Producer({"bootstrap.servers": bs, "transactional.id": "ranges-2"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("open", value=b"undecided", partition=0)
    p.flush(10)
    end = _hw(bs, "open")
    assert end == 1
    c = _reader(bs)
    t0 = time.monotonic()
    try:
        with pytest.raises(TimeoutError, match="stuck at offset 0 below 1"):
            for _ in consume_range(c, "open", 0, 0, end, timeout_s=2, max_messages=10):
                pass
    finally:
        c.close()  # type: ignore[attr-defined]
        p.abort_transaction(30)
    assert time.monotonic() - t0 < 15


#: What the stand-ins' ``list_topics`` answers: topic ``t`` with its partition 0.
_METADATA = types.SimpleNamespace(topics={"t": types.SimpleNamespace(error=None, partitions={0: None})})


class _SlowConsumer:
    """A consumer stand-in delivering one record per poll on a manual clock that advances 0.4 s a poll."""

    def __init__(self, clock: list[float], stall_at: int | None = None) -> None:
        self.clock = clock
        self.next = 0
        self.stall_at = stall_at

    def assign(self, parts: object) -> None:
        pass

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        return _METADATA

    def get_watermark_offsets(self, tp: object, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return 0, 20

    def consume(self, num_messages: int, timeout: float) -> list[object]:
        self.clock[0] += 0.4
        if self.stall_at is not None and self.next >= self.stall_at:
            return []
        m = _msg(self.next)
        self.next += 1
        return [m]

    def position(self, parts: list[object]) -> list[object]:
        return [types.SimpleNamespace(offset=self.next)]


def _msg(offset: int) -> object:
    from confluent_kafka import Message

    return Message(topic="t", partition=0, offset=offset, value=b"x")


def test_a_long_range_that_keeps_moving_does_not_time_out() -> None:
    """The deadline is a stall timeout: 20 records at 0.4 s each take 8 s against a 1 s timeout."""
    clock = [0.0]
    got = [m.offset() for msgs in consume_range(_SlowConsumer(clock), "t", 0, 0, 20, timeout_s=1.0, max_messages=5,
                                                clock=lambda: clock[0]) for m in msgs]
    assert got == list(range(20)) and clock[0] >= 8


def test_a_range_that_stops_moving_times_out() -> None:
    clock = [0.0]
    with pytest.raises(TimeoutError, match="stuck at offset 5 below 20"):
        for _ in consume_range(_SlowConsumer(clock, stall_at=5), "t", 0, 0, 20, timeout_s=1.0, max_messages=5,
                               clock=lambda: clock[0]):
            pass
    assert clock[0] < 5


class _ScriptedConsumer:
    """Hands out prepared ``consume`` answers in order (real confluent-kafka Message objects)."""

    def __init__(self, answers: list[list[object]]) -> None:
        self.answers = answers

    def assign(self, parts: object) -> None:
        pass

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        return _METADATA

    def get_watermark_offsets(self, tp: object, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return 0, 1000

    def consume(self, num_messages: int, timeout: float) -> list[object]:
        return self.answers.pop(0) if self.answers else []

    def position(self, parts: list[object]) -> list[object]:
        return [types.SimpleNamespace(offset=-1001)]


def _msgs(*offsets: int) -> list[object]:
    return [_msg(o) for o in offsets]


def _eof(offset: int) -> object:
    from confluent_kafka import KafkaError, Message

    return Message(topic="t", partition=0, offset=offset, error=KafkaError(KafkaError._PARTITION_EOF))


def test_records_outside_the_range_are_dropped_and_the_position_follows_the_highest() -> None:
    """Whole answers inside the range are kept as they are; an answer reaching below ``start`` or to
    ``end`` and beyond keeps only the range's records, on both the records-only and the EOF paths."""
    answers = [_msgs(3, 4, 5, 6), _msgs(7), _msgs(8, 9, 10, 11), [_eof(12)]]
    got = [[m.offset() for m in msgs] for msgs in consume_range(_ScriptedConsumer(answers), "t", 0, 5, 10,
                                                                timeout_s=5, max_messages=100)]
    assert got == [[5, 6], [7], [8, 9]]
    answers = [[*_msgs(3, 4), _eof(5)], [*_msgs(5, 6), _eof(7)]]
    got = [[m.offset() for m in msgs] for msgs in consume_range(_ScriptedConsumer(answers), "t", 0, 4, 7,
                                                                timeout_s=5, max_messages=100)]
    assert got == [[4], [5, 6]]


def test_an_error_beside_records_is_raised() -> None:
    from confluent_kafka import KafkaError, Message

    bad = Message(topic="t", partition=0, offset=2, error=KafkaError(KafkaError._MSG_TIMED_OUT))
    with pytest.raises(RuntimeError, match="reading t-0"):
        for _ in consume_range(_ScriptedConsumer([[*_msgs(0, 1), bad]]), "t", 0, 0, 5, timeout_s=5,
                               max_messages=100):
            pass


def test_a_pooled_consumer_fetches_a_new_topics_metadata_before_assigning_it(
        broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled consumer that read one topic, then a topic it has not seen: librdkafka asks for no
    metadata on ``assign()`` and waited for its once-a-second scan (999 ms a read: the progress
    reads and source ranges of a worker's first batches of a new query stalled so). The read asks
    for the new topic's metadata first, once per consumer and topic, and reads both ranges whole."""
    from confluent_kafka import Producer

    from oncelog.spark import clients

    bs = broker.bootstrap
    for topic in ("first", "second"):
        create_topic(bs, topic, 1)
        p = Producer({"bootstrap.servers": bs})
        for i in range(3):
            p.produce(topic, b"%s-%d" % (topic.encode(), i), partition=0)
        p.flush(10)
    asked: list[str | None] = []
    pooled = clients._consumer_class()
    real = pooled.list_topics

    def counting(self: object, topic: str | None = None, *args: object, **kwargs: object) -> object:
        asked.append(topic)
        return real(self, topic, *args, **kwargs)

    monkeypatch.setattr(pooled, "list_topics", counting)
    pool = clients.ConsumerPool(lambda c: c.close())
    config = {"bootstrap.servers": bs, "group.id": f"g-{uuid.uuid4()}", "enable.auto.commit": False,
              "enable.partition.eof": True, "fetch.wait.max.ms": 5}
    try:
        for topic in ("first", "second", "second", "first"):
            c = pool.take(config)
            got = [m.value() for msgs in consume_range(c, topic, 0, 0, 3, timeout_s=20, max_messages=10)
                   for m in msgs]
            assert got == [b"%s-%d" % (topic.encode(), i) for i in range(3)]
            pool.give(config, c)
        assert len(pool.idle()) == 1, "one consumer served every read"
        assert asked == ["first", "second"], "each topic's metadata asked for once, before its first assign"
    finally:
        pool.clear()


def _too_large(offset: int) -> object:
    from confluent_kafka import KafkaError, Message

    return Message(topic="t", partition=0, offset=offset, error=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))


def test_a_consumer_whose_fetch_size_ran_out_is_renewed_where_the_read_stands() -> None:
    """librdkafka doubles a partition's fetch size for each fetch that yields no record (a compacted
    log's emptied batch ends) and fails with MSG_SIZE_TOO_LARGE at 1 GiB: a pooled consumer that
    read many ranges of a compacted topic failed the query (an adversarial probe: 24 of 119 rows,
    then the error). The read goes on with a new consumer from where it stands, once per position."""
    spent = _ScriptedConsumer([_msgs(0, 1), [_too_large(2)]])
    fresh = _ScriptedConsumer([_msgs(2, 3), [*_msgs(4), _eof(5)]])
    renewed: list[object] = []

    def renew(old: object) -> object:
        renewed.append(old)
        return fresh

    got = [m.offset() for msgs in consume_range(spent, "t", 0, 0, 5, timeout_s=5, max_messages=100, renew=renew)
           for m in msgs]
    assert got == [0, 1, 2, 3, 4] and renewed == [spent]
    again = _ScriptedConsumer([[_too_large(0)]])
    with pytest.raises(RuntimeError, match="MSG_SIZE_TOO_LARGE"):  # renewed, and no further: a real failure
        for _ in consume_range(_ScriptedConsumer([[_too_large(0)]]), "t", 0, 0, 5, timeout_s=5, max_messages=100,
                               renew=lambda old: again):
            pass


class _EndingConsumer(_ScriptedConsumer):
    """A scripted consumer whose partition ``t``-0 has the watermarks ``marks`` (cached and asked
    for alike, or ``cached`` for the ones the last fetch left), or no longer exists (``gone``)."""

    def __init__(self, answers: list[list[object]], marks: tuple[int, int], cached: tuple[int, int] | None = None,
                 gone: bool = False) -> None:
        super().__init__(answers)
        self.marks, self.cached, self.gone = marks, cached or marks, gone
        self.assigned: list[int] = []

    def assign(self, parts: list[object]) -> None:
        self.assigned.append(parts[0].offset)  # type: ignore[attr-defined]

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> object:
        return types.SimpleNamespace(topics={}) if self.gone else _METADATA

    def get_watermark_offsets(self, tp: object, timeout: float = -1, cached: bool = False) -> tuple[int, int]:
        return self.cached if cached else self.marks


def test_a_range_past_the_log_end_is_a_data_loss_not_a_stall(caplog: pytest.LogCaptureFixture) -> None:
    """A planned range [0, 10) meets the end of the partition at 4, and the log ends there (its tail
    lost, or the topic made again with fewer records): a data loss at once, never a wait for records
    that are not there (the read used to stall for the whole timeout, 120 s in the source, and fail
    as "stuck" whatever failOnDataLoss said). Skipping, it yields what there is and ends."""
    from oncelog.spark.ranges import RecordsLost

    clock = [0.0]

    def tick() -> float:
        clock[0] += 0.1
        return clock[0]

    answers = [[*_msgs(0, 1, 2, 3), _eof(4)]]
    with pytest.raises(RecordsLost, match=r"offset 4 is out of range \(the log now holds \[0, 4\)\).*advice"):
        for _ in consume_range(_EndingConsumer(list(answers), (0, 4)), "t", 0, 0, 10, timeout_s=60,
                               max_messages=100, clock=tick, lost_advice="advice"):
            pass
    caplog.set_level("WARNING", logger="oncelog.spark")
    got = [m.offset() for msgs in consume_range(_EndingConsumer(list(answers), (0, 4)), "t", 0, 0, 10, timeout_s=60,
                                                max_messages=100, clock=tick, skip_lost=True)
           for m in msgs]
    assert got == [0, 1, 2, 3]
    assert "records [4, 10) are skipped (failOnDataLoss=false)" in caplog.text
    assert clock[0] < 1, "at once"


def test_an_end_of_partition_below_a_range_the_log_holds_is_waited_for() -> None:
    """Under read_committed the end of partition is the LSO: an open transaction holds it below the
    range's end while the high watermark (what the fetch left in the cache) reaches it. That is no
    loss: the read waits, and times out only after the stall timeout. Nor is a cached high watermark
    below the end that the broker, asked again, no longer confirms."""
    for consumer in (_EndingConsumer([[*_msgs(0, 1), _eof(2)]], marks=(0, 2), cached=(0, 10)),
                     _EndingConsumer([[*_msgs(0, 1), _eof(2)]], marks=(0, 10), cached=(0, 2))):
        clock = [0.0]

        def tick(clock: list[float] = clock) -> float:
            clock[0] += 0.5
            return clock[0]

        with pytest.raises(TimeoutError, match="stuck at offset 2 below 10"):
            for _ in consume_range(consumer, "t", 0, 0, 10, timeout_s=5, max_messages=100, clock=tick):
                pass


def test_a_partition_that_no_longer_exists_is_a_data_loss(caplog: pytest.LogCaptureFixture) -> None:
    """A deleted partition (its topic deleted, or made again with fewer partitions) reports nothing:
    librdkafka just waits. After a second without moving, the read asks the cluster, which says the
    partition is gone: a data loss, or under skip_lost a warning and the end of the read."""
    from oncelog.spark.ranges import RecordsLost

    def tick(clock: list[float]) -> float:
        clock[0] += 0.25
        return clock[0]

    clock = [0.0]
    with pytest.raises(RecordsLost, match="offset 5 is out of range \\(its partition no longer exists\\)"):
        for _ in consume_range(_EndingConsumer([], (-1, -1), gone=True), "t", 0, 5, 10, timeout_s=60,
                               max_messages=100, clock=lambda: tick(clock)):
            pass
    assert clock[0] < 3
    caplog.set_level("WARNING", logger="oncelog.spark")
    assert list(consume_range(_EndingConsumer([], (-1, -1), gone=True), "t", 0, 5, 10, timeout_s=60,
                              max_messages=100, clock=lambda: tick(clock), skip_lost=True)) == []
    assert "the partition no longer exists" in caplog.text and "records [5, 10) are skipped" in caplog.text

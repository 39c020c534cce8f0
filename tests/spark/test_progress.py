"""The progress topic: created compacted (or kept forever where compaction is refused), with the
cluster's default replication factor, read from a snapshot instead of offset 0 by a fresh worker,
and guarded against a changed partition count."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from oncelog.spark.guarantees import Guarantee
from oncelog.spark.progress import (
    SNAPSHOT_EVERY,
    SNAPSHOT_KEY,
    Committed,
    ProgressLayoutError,
    ProgressLog,
    clear_cache,
    progress_key,
    progress_value,
)
from oncelog.spark.sink import SinkSettings, Spool, TaskIdentity, write_partition
from oncelog.testing.broker_process import BrokerProcess, create_topic


def _digest(values: list[bytes]) -> int:
    spool = Spool()
    spool.extend([(None, v, None, None, None) for v in values])
    return spool.digest


class _Future:
    def __init__(self, error: KafkaError | None) -> None:
        self.error = error

    def result(self, timeout: float) -> None:
        if self.error is not None:
            raise KafkaException(self.error)


class _Metadata:
    def __init__(self, topics: dict[str, Any]) -> None:
        self.topics = topics


class _FakeAdmin:
    """Answers CreateTopics like a broker that refuses the configs in ``refuse`` (INVALID_CONFIG)."""

    def __init__(self, refuse: tuple[str, ...] = ()) -> None:
        self.refuse = refuse
        self.created: list[Any] = []

    def list_topics(self, timeout: float, topic: str | None = None) -> _Metadata:
        return _Metadata({})

    def create_topics(self, topics: list[Any]) -> dict[str, _Future]:
        (t,) = topics
        self.created.append(t)
        bad = any(t.config.get(k) == v for k, v in (c.split("=") for c in self.refuse))
        return {t.topic: _Future(KafkaError(KafkaError.INVALID_CONFIG) if bad else None)}


def test_created_compacted_with_the_clusters_default_replication_factor() -> None:
    admin = _FakeAdmin()
    assert ProgressLog({"bootstrap.servers": "x:1"}, "p", 3).ensure_topic(admin) == 3
    (t,) = admin.created
    assert t.config == {"cleanup.policy": "compact"}
    assert t.replication_factor == -1 and t.num_partitions == 3


def test_refused_compaction_falls_back_to_retention_off_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    admin = _FakeAdmin(refuse=("cleanup.policy=compact",))
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        ProgressLog({"bootstrap.servers": "x:1"}, "p", 2, replication_factor=3).ensure_topic(admin)
    assert [t.config.get("cleanup.policy") for t in admin.created] == ["compact", "delete"]
    assert admin.created[1].config["retention.ms"] == "-1" and admin.created[1].replication_factor == 3
    assert "refused cleanup.policy=compact" in caplog.text


def test_our_broker_creates_the_progress_topic_compacted(broker: BrokerProcess,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    bs = broker.bootstrap
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        assert ProgressLog({"bootstrap.servers": bs}, "progress-kept", 2).ensure_topic() == 2
    assert "refused cleanup.policy=compact" not in caplog.text  # the broker compacts (log cleaner)
    res = ConfigResource(ConfigResource.Type.TOPIC, "progress-kept")
    admin = AdminClient({"bootstrap.servers": bs})  # must outlive its future
    configs = admin.describe_configs([res])[res].result(timeout=15)
    assert configs["cleanup.policy"].value == "compact"
    # An existing topic is adopted with its partition count, whatever progress.partitions says.
    assert ProgressLog({"bootstrap.servers": bs}, "progress-kept", 16).ensure_topic() == 2


def test_a_replication_factor_the_cluster_refuses_is_named(broker: BrokerProcess) -> None:
    with pytest.raises(ValueError, match=r"replication factor 3 .*progress.replicationFactor"):
        ProgressLog({"bootstrap.servers": broker.bootstrap}, "progress-rf", 2, replication_factor=3).ensure_topic()


def test_a_fresh_worker_reads_from_a_snapshot_not_from_offset_zero(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    settings = SinkSettings(client={"bootstrap.servers": bs}, guarantee=Guarantee.exactly_once, topic="out",
                            progress_topic="progress-snap", progress_partitions=1, timeout_s=30)
    settings.progress().ensure_topic()
    sink = settings.sink_id("q")
    early, busy = progress_key("q-early/out", 0), progress_key(sink, 0)
    history = 3 * SNAPSHOT_EVERY
    p = Producer({"bootstrap.servers": bs})
    p.produce("progress-snap", key=early.encode(), value=progress_value(7, 3, 1), partition=0)
    for b in range(history):
        p.produce("progress-snap", key=busy.encode(), value=progress_value(b, 1, 1), partition=0)
    p.flush(15)

    clear_cache()
    # The next task reads the whole history once and leaves a snapshot in its transaction.
    assert not write_partition([(None, b"x", None, None, None)], TaskIdentity("q", history, 0), settings).skipped
    clear_cache()  # a fresh Python worker
    log = ProgressLog({"bootstrap.servers": bs}, "progress-snap", 1)
    state = log.read(0)
    assert state.latest[busy] == Committed(history, 1, _digest([b"x"])) and state.latest[early] == Committed(7, 3)
    assert log.last_read_records <= 2 * SNAPSHOT_EVERY + 5 < history, log.last_read_records
    again = log.read(0)  # the same worker: from its cached position
    assert log.last_read_records == 0 and again.latest == state.latest


def test_a_changed_partition_count_is_refused(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = SinkSettings(client={"bootstrap.servers": bs}, guarantee=Guarantee.exactly_once, topic="out",
                     progress_topic="progress-layout", progress_partitions=2, timeout_s=30)
    s.progress().ensure_topic()
    write_partition([(None, b"x", None, None, None)], TaskIdentity("q", 0, 0), s)
    clear_cache()
    with pytest.raises(ProgressLayoutError, match=r"has 4 partitions but .* written with 2"):
        ProgressLog({"bootstrap.servers": bs}, "progress-layout", 4).read(0)


def test_records_no_sink_wrote_are_skipped_with_a_warning_and_the_sink_carries_on(
        broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    """Anyone allowed to write to the progress topic (no ACLs: anyone) can put a record there that
    is not a progress record: kcat aimed at the wrong topic, a stranger. Each such record is skipped
    with a warning. Before, the reader's JSON error failed every task of every query sharing that
    partition, for good. (A record shaped like a sink's is trusted: the topic is a trust boundary,
    which ACLs guard.)"""
    from confluent_kafka import Producer

    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = SinkSettings(client={"bootstrap.servers": bs}, guarantee=Guarantee.exactly_once, topic="out",
                     progress_topic="progress-junk", progress_partitions=1, timeout_s=30)
    s.progress().ensure_topic()
    assert not write_partition([(None, b"b0", None, None, None)], TaskIdentity("q", 0, 0), s).skipped
    key = progress_key(s.sink_id("q"), 0).encode()
    junk = [(key, b"\xff\xfe not json"), (key, b"[1, 2]"), (key, b'{"batch_id": "9", "rows": 1}'),
            (key, b'{"batch_id": 9, "rows": 1, "parts": "one"}'), (b"\xff\xfe", b"{}"), (key, b"null"),
            (SNAPSHOT_KEY.encode(), b'{"upto": 5, "state": {"x": [1]}}'),
            (SNAPSHOT_KEY.encode(), b'{"upto": "5", "state": {}}'), (SNAPSHOT_KEY.encode(), b"[]")]
    p = Producer({"bootstrap.servers": bs})
    for k, v in junk:
        p.produce("progress-junk", key=k, value=v, partition=0)
    assert p.flush(10) == 0
    clear_cache()
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        log = ProgressLog({"bootstrap.servers": bs}, "progress-junk", 1)
        state = log.read(0)
    assert log.foreign_records == len(junk)
    assert state.latest[progress_key(s.sink_id("q"), 0)] == Committed(0, 1, _digest([b"b0"]))  # the sink's own
    assert caplog.text.count("is not a progress record") == 1  # once a read, not once a record
    clear_cache()
    replay = write_partition([(None, b"b0", None, None, None)], TaskIdentity("q", 0, 0), s)
    assert replay.skipped and replay.reason == "replay"
    assert not write_partition([(None, b"b1", None, None, None)], TaskIdentity("q", 1, 0), s).skipped
    from oncelog.demo.faults import read_topic

    assert sorted(v for _k, v in read_topic(bs, "out")) == [b"b0", b"b1"]


def test_progress_values_are_json_with_the_partition_count() -> None:
    assert json.loads(progress_value(3, 10, 16)) == {"batch_id": 3, "rows": 10, "parts": 16}
    assert json.loads(progress_value(3, 10, 16, 2**64 - 1)) == {"batch_id": 3, "rows": 10, "parts": 16,
                                                                "digest": 2**64 - 1}


def test_records_and_snapshots_with_and_without_a_digest_are_read(broker: BrokerProcess) -> None:
    """Progress records and snapshot entries carry the batch's digest; those written before digests
    existed (no ``digest`` field, two-element snapshot entries) still read, with digest None (the
    sink then compares row counts only). A digest that is not an integer is not a sink's record."""
    from confluent_kafka import Producer

    bs = broker.bootstrap
    create_topic(bs, "progress-digest", 1)
    old, new, snap_old, snap_new = (progress_key(f"q-{n}/out", 0) for n in ("old", "new", "snap-old", "snap-new"))
    p = Producer({"bootstrap.servers": bs})
    p.produce("progress-digest", key=SNAPSHOT_KEY.encode(), partition=0,
              value=json.dumps({"upto": 0, "state": {snap_old: [4, 7], snap_new: [5, 8, 12345]}}).encode())
    p.produce("progress-digest", key=old.encode(), value=b'{"batch_id":2,"rows":3,"parts":1}', partition=0)
    p.produce("progress-digest", key=new.encode(), value=progress_value(3, 4, 1, 2**64 - 2), partition=0)
    p.produce("progress-digest", key=new.encode(), value=b'{"batch_id":9,"rows":4,"parts":1,"digest":"x"}',
              partition=0)
    assert p.flush(10) == 0
    clear_cache()
    log = ProgressLog({"bootstrap.servers": bs}, "progress-digest", 1)
    state = log.read(0)
    assert state.latest == {old: Committed(2, 3), new: Committed(3, 4, 2**64 - 2), snap_old: Committed(4, 7),
                            snap_new: Committed(5, 8, 12345)}
    assert log.foreign_records == 1


class _SpentReader:
    """A pooled consumer whose fetch size librdkafka has doubled to its limit (a compacted progress
    topic's emptied batches): every consume answers MSG_SIZE_TOO_LARGE where it stands."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.closed = False

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        from confluent_kafka import Message, TopicPartition

        (tp,) = self.real.assignment()
        pos = self.real.position([TopicPartition(tp.topic, tp.partition)])[0].offset
        return [Message(topic=tp.topic, partition=tp.partition, offset=max(pos, 0),
                        error=KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))]

    def close(self) -> None:
        self.closed = True
        self.real.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)


def test_a_progress_reader_whose_fetch_size_ran_out_is_renewed(broker: BrokerProcess) -> None:
    """The progress log's pooled reader meets what the source's executor reads meet on a compacted
    topic (librdkafka's fetch size doubled to 1 GiB): it is discarded and the read goes on with a new
    consumer, as in ``ranges.consume_range``'s ``renew``. Before, the sink's task failed."""
    from confluent_kafka import Consumer, Producer

    from oncelog.spark.clients import CONSUMERS

    bs = broker.bootstrap
    create_topic(bs, "progress-spent", 1)
    key = progress_key("q-spent/out", 0)
    p = Producer({"bootstrap.servers": bs})
    for b in range(5):
        p.produce("progress-spent", key=key.encode(), value=progress_value(b, 2, 1), partition=0)
    p.flush(15)
    clear_cache()
    log = ProgressLog({"bootstrap.servers": bs}, "progress-spent", 1)
    config = log._consumer_config("read_committed")
    spent = _SpentReader(Consumer(config))
    CONSUMERS.give(config, spent)
    assert log.read(0).latest[key] == Committed(4, 2)
    assert spent.closed, "the spent consumer is discarded, never pooled again"

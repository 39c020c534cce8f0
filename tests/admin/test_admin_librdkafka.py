"""The admin APIs through librdkafka's AdminClient (confluent_kafka.admin) and our CLI against a
broker process: configs created, altered, described and applied live (retention deleting segments
of a running topic, max.message.bytes refusing a producer's message), DeleteRecords with a consumer
that moves on, recompressed batches that a real consumer reads, and leader epochs that carry a
consumer across kill -9 of the broker."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewTopic,
)

from oncelog.testing.broker_process import BrokerProcess, oncelog_broker

TOPIC = ConfigResource.Type.TOPIC
BROKER = ConfigResource.Type.BROKER


@pytest.fixture
def fast(tmp_path: Path) -> Iterator[BrokerProcess]:
    """A broker whose retention pass runs every 200 ms."""
    cfg = tmp_path / "broker.toml"
    cfg.write_text("log_retention_check_interval_ms = 200\n")
    b = oncelog_broker(tmp_path / "data", "--config", str(cfg), log_path=tmp_path / "broker.log").start()
    try:
        yield b
    finally:
        b.kill()


def admin(b: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": b.bootstrap})


def create(a: AdminClient, name: str, configs: dict[str, str] | None = None, partitions: int = 1) -> None:
    a.create_topics([NewTopic(name, partitions, 1, config=configs or {})])[name].result(timeout=15)


def describe(a: AdminClient, rtype: ConfigResource.Type, name: str) -> dict[str, ConfigEntry]:
    return next(iter(a.describe_configs([ConfigResource(rtype, name)]).values())).result(timeout=15)


def alter(a: AdminClient, rtype: ConfigResource.Type, name: str,
          ops: list[tuple[str, str | None, AlterConfigOpType]]) -> None:
    res = ConfigResource(rtype, name, incremental_configs=[ConfigEntry(k, v, incremental_operation=op)
                                                           for k, v, op in ops])
    next(iter(a.incremental_alter_configs([res]).values())).result(timeout=15)


def error_of(fn: object) -> KafkaError:
    with pytest.raises(KafkaException) as info:
        fn()  # type: ignore[operator]
    return info.value.args[0]


def oncelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.filterwarnings("ignore:alter_configs has been deprecated")  # the legacy API, on purpose
def test_configs_created_altered_and_described(fast: BrokerProcess) -> None:
    a = admin(fast)
    create(a, "cfg", {"compression.type": "lz4", "retention.ms": "3600000", "message.timestamp.type": "LogAppendTime",
                      "message.downconversion.enable": "false"})
    got = describe(a, TOPIC, "cfg")
    assert got["compression.type"].value == "lz4"
    assert got["compression.type"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert got["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    err = error_of(lambda: create(a, "bad", {"dummy.doesntexist": "x"}))
    assert err.code() == KafkaError.INVALID_CONFIG and "Unknown topic config name" in err.str()
    err = error_of(lambda: create(a, "bad", {"segment.bytes": "-5"}))
    assert err.code() == KafkaError.INVALID_CONFIG and "at least 14" in err.str()

    alter(a, TOPIC, "cfg", [("retention.ms", "1000", AlterConfigOpType.SET),
                            ("compression.type", None, AlterConfigOpType.DELETE),
                            ("leader.replication.throttled.replicas", "0:1", AlterConfigOpType.APPEND)])
    got = describe(a, TOPIC, "cfg")
    assert got["retention.ms"].value == "1000"
    assert got["compression.type"].value == "producer"
    assert got["compression.type"].source == ConfigSource.DEFAULT_CONFIG.value
    assert got["leader.replication.throttled.replicas"].value == "0:1"
    err = error_of(lambda: alter(a, TOPIC, "cfg", [("retention.ms", "5", AlterConfigOpType.APPEND)]))
    assert err.code() == KafkaError.INVALID_CONFIG
    err = error_of(lambda: alter(a, TOPIC, "nope", [("retention.ms", "5", AlterConfigOpType.SET)]))
    assert err.code() == KafkaError.UNKNOWN_TOPIC_OR_PART

    # legacy AlterConfigs replaces the whole set (librdkafka's own 0081 does these two)
    legacy = ConfigResource(TOPIC, "cfg", set_config={"compression.type": "gzip", "flush.ms": "12345678"})
    next(iter(a.alter_configs([legacy]).values())).result(timeout=15)
    got = describe(a, TOPIC, "cfg")
    assert got["compression.type"].value == "gzip" and got["flush.ms"].value == "12345678"
    assert got["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    kerberos = ConfigResource(BROKER, "1", set_config={"sasl.kerberos.min.time.before.relogin": "58000"})
    next(iter(a.alter_configs([kerberos]).values())).result(timeout=15)

    # a dynamic broker config defaults every topic without an override
    alter(a, BROKER, "1", [("log.retention.bytes", "123456789", AlterConfigOpType.SET)])
    got = describe(a, TOPIC, "cfg")
    assert got["retention.bytes"].value == "123456789"
    assert got["retention.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    assert describe(a, BROKER, "1")["log.retention.bytes"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value


def _watermarks(bootstrap: str, topic: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "wm"})
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        return int(lo), int(hi)
    finally:
        c.close()


def test_retention_lowered_live_deletes_segments(fast: BrokerProcess, tmp_path: Path) -> None:
    a = admin(fast)
    create(a, "ret", {"segment.bytes": "2000"})
    p = Producer({"bootstrap.servers": fast.bootstrap, "linger.ms": 0})
    for i in range(30):
        p.produce("ret", b"%04d" % i + b"x" * 500)
        p.flush(10)
    segments = list((tmp_path / "data" / "ret-0").glob("*.log"))
    assert len(segments) >= 8
    time.sleep(0.5)
    assert _watermarks(fast.bootstrap, "ret") == (0, 30)  # 7 days: nothing goes
    alter(a, TOPIC, "ret", [("retention.ms", "100", AlterConfigOpType.SET)])
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _watermarks(fast.bootstrap, "ret")[0] == 0:
        time.sleep(0.2)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _watermarks(fast.bootstrap, "ret")[0] < 30:
        time.sleep(0.2)
    lo, hi = _watermarks(fast.bootstrap, "ret")
    assert lo == hi == 30  # every segment went, the active one too (rolled first), as in Kafka
    assert len(list((tmp_path / "data" / "ret-0").glob("*.log"))) == 1  # the empty one the roll made
    assert "retention deleted" in (tmp_path / "broker.log").read_text()


def test_max_message_bytes_lowered_live(fast: BrokerProcess) -> None:
    a = admin(fast)
    create(a, "big")
    p = Producer({"bootstrap.servers": fast.bootstrap, "linger.ms": 0, "message.max.bytes": 100000})
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    p.produce("big", b"x" * 5000, on_delivery=on_delivery)
    p.flush(10)
    assert errors == []
    alter(a, TOPIC, "big", [("max.message.bytes", "1000", AlterConfigOpType.SET)])
    p.produce("big", b"x" * 5000, on_delivery=on_delivery)
    p.flush(10)
    assert [e.code() for e in errors] == [KafkaError.MSG_SIZE_TOO_LARGE]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_recompressed_batches_are_read_by_a_real_consumer(fast: BrokerProcess, codec: str) -> None:
    a = admin(fast)
    create(a, "z", {"compression.type": codec})
    p = Producer({"bootstrap.servers": fast.bootstrap, "linger.ms": 5, "enable.idempotence": True})
    values = [b"%05d-" % i + b"y" * (i % 300) for i in range(500)]
    for v in values:
        p.produce("z", v)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": fast.bootstrap, "group.id": "z", "enable.auto.commit": False})
    c.assign([TopicPartition("z", 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(got) < len(values) and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None:
            assert m.error() is None, m.error()
            got.append(m.value())
    c.close()
    assert got == values


def test_delete_records_and_a_consumer_that_moves_on(fast: BrokerProcess) -> None:
    a = admin(fast)
    create(a, "del")
    p = Producer({"bootstrap.servers": fast.bootstrap, "linger.ms": 0})
    for i in range(20):
        p.produce("del", b"%d" % i)
    assert p.flush(10) == 0
    res = a.delete_records([TopicPartition("del", 0, 12)])
    assert next(iter(res.values())).result(timeout=15).low_watermark == 12
    err = error_of(lambda: next(iter(a.delete_records([TopicPartition("del", 0, 99)]).values())).result(timeout=15))
    assert err.code() == KafkaError.OFFSET_OUT_OF_RANGE
    c = Consumer({"bootstrap.servers": fast.bootstrap, "group.id": "del", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.assign([TopicPartition("del", 0, 3)])  # below the new log start: reset to the earliest
    got = []
    deadline = time.monotonic() + 15
    while len(got) < 8 and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.value()))
    c.close()
    assert got == [(i, b"%d" % i) for i in range(12, 20)]
    # the CLI: another cut, then its errors
    r = oncelog("records", "delete", "--topic", "del", "--partition", "0", "--before", "15", "--bootstrap",
                fast.bootstrap)
    assert r.returncode == 0 and "low watermark now 15" in r.stdout, r.stderr
    r = oncelog("records", "delete", "--topic", "del", "--partition", "0", "--before", "100", "--bootstrap",
                fast.bootstrap)
    assert r.returncode == 1 and "out of range" in r.stderr.lower()
    r = oncelog("records", "delete", "--topic", "nope", "--partition", "0", "--before", "1", "--bootstrap",
                fast.bootstrap)
    assert r.returncode == 1 and "cannot delete records of nope-0" in r.stderr
    r = oncelog("records", "delete", "--topic", "del", "--partition", "0", "--before", "-5")
    assert r.returncode == 2
    r = oncelog("records", "delete", "--topic", "del", "--partition", "0", "--before", "-1", "--bootstrap",
                fast.bootstrap)
    assert r.returncode == 0 and "low watermark now 20" in r.stdout
    assert _watermarks(fast.bootstrap, "del") == (20, 20)


def test_topics_alter_cli(fast: BrokerProcess) -> None:
    bs = ["--bootstrap", fast.bootstrap]
    assert oncelog("topics", "create", "cli", *bs).returncode == 0
    r = oncelog("topics", "alter", "cli", "--config", "retention.ms=1000", "--config", "segment.ms=60000", *bs)
    assert r.returncode == 0 and "set retention.ms=1000" in r.stdout, r.stderr
    got = describe(admin(fast), TOPIC, "cli")
    assert (got["retention.ms"].value, got["segment.ms"].value) == ("1000", "60000")
    r = oncelog("topics", "alter", "cli", "--delete-config", "retention.ms", *bs)
    assert r.returncode == 0 and "deleted retention.ms" in r.stdout, r.stderr
    assert describe(admin(fast), TOPIC, "cli")["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    r = oncelog("topics", "alter", "cli", "--delete-config", "retention.ms", *bs)
    assert r.returncode == 1 and "not set on topic" in r.stderr
    r = oncelog("topics", "alter", "cli", "--config", "retention.ms=soon", *bs)
    assert r.returncode == 1 and "Not a number of type LONG" in r.stderr
    r = oncelog("topics", "alter", "cli", "--config", "bogus.config=1", *bs)
    assert r.returncode == 1 and "Unknown topic config name" in r.stderr
    r = oncelog("topics", "alter", "missing", "--config", "retention.ms=1", *bs)
    assert r.returncode == 1 and "missing" in r.stderr
    assert oncelog("topics", "alter", "cli", *bs).returncode == 2
    assert oncelog("topics", "alter", "cli", "--config", "novalue", *bs).returncode == 2
    r = oncelog("topics", "describe", "cli", *bs)
    assert "segment.ms=60000" in r.stdout


def test_a_consumer_keeps_going_across_a_broker_kill_with_leader_epochs(tmp_path: Path) -> None:
    """librdkafka validates its position with OffsetForLeaderEpoch once the broker's epoch moves
    (kill -9, restart: a new epoch): no error, no duplicate, no loss."""
    broker = oncelog_broker(tmp_path / "data", log_path=tmp_path / "broker.log").start()
    log_lines: list[str] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            log_lines.append(record.getMessage())

    logger = logging.getLogger("test-epochs")
    logger.addHandler(Capture())
    logger.setLevel(logging.DEBUG)
    try:
        create(admin(broker), "ep", partitions=2)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "enable.idempotence": True})
        sent = []

        def produce(n: int) -> None:
            for _ in range(n):
                v = b"v%d" % len(sent)
                sent.append(v)
                p.produce("ep", v, partition=len(sent) % 2)
            assert p.flush(20) == 0

        produce(200)
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "ep", "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "debug": "fetch,topic", "logger": logger,
                      "topic.metadata.refresh.interval.ms": 1000})
        c.subscribe(["ep"])
        got: list[tuple[int, int, bytes, int]] = []
        errors: list[KafkaError] = []

        def consume_until(n: int) -> None:
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error() is not None:
                    errors.append(m.error())
                    continue
                got.append((m.partition(), m.offset(), m.value(), m.leader_epoch() or 0))

        consume_until(200)
        assert {e for *_, e in got} == {0}
        broker.restart()  # kill -9, then start on the same data dir: leader epoch 1
        produce(200)
        consume_until(400)
        c.close()
        assert errors == []
        values = [v for _, _, v, _ in got]
        assert sorted(values) == sorted(sent) and len(set(values)) == len(values) == 400  # no loss, no duplicate
        for part in (0, 1):
            offsets = [o for p_, o, _, _ in got if p_ == part]
            assert offsets == list(range(len(offsets)))  # in order, no gap
        assert {e for *_, e in got[200:]} == {1}  # the new records carry the new epoch
        validated = [line for line in log_lines if "validation succeeded" in line]
        assert validated, "librdkafka never validated its position with OffsetForLeaderEpoch"
    finally:
        broker.kill()

"""Real clients nobody here wrote, against a broker each test starts itself."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.testing.broker_process import BrokerProcess, create_topic


def consume_all(bootstrap: str, topic: str, partitions: int, expected: int, **conf: object) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", **conf})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + 20
    while len(got) < expected and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got.append(m)
    c.close()
    return got


@pytest.mark.parametrize("acks", ["all", "1", "0"])
def test_librdkafka_produce_and_consume_keys_headers_timestamps(broker: BrokerProcess, acks: str) -> None:
    create_topic(broker.bootstrap, "lib", 3)
    p = Producer({"bootstrap.servers": broker.bootstrap, "acks": acks, "enable.idempotence": False,
                  "linger.ms": 2})
    delivered = []
    for i in range(300):
        p.produce("lib", value=b"value-%d" % i, key=b"key-%d" % (i % 17), headers=[("n", str(i).encode())],
                  timestamp=1_700_000_000_000 + i,
                  on_delivery=lambda err, msg: delivered.append((err, msg.partition(), msg.offset())))
    assert p.flush(20) == 0
    assert all(err is None for err, _, _ in delivered) and len(delivered) == 300
    if acks != "0":
        per_partition: dict[int, list[int]] = {}
        for _, part, off in delivered:
            per_partition.setdefault(part, []).append(off)
        for offs in per_partition.values():
            assert sorted(offs) == list(range(len(offs)))
    msgs = consume_all(broker.bootstrap, "lib", 3, 300)
    assert len(msgs) == 300
    by_value = {m.value(): m for m in msgs}
    m = by_value[b"value-42"]
    assert m.key() == b"key-8" and m.headers() == [("n", b"42")] and m.timestamp()[1] == 1_700_000_000_042
    # same key -> same partition, in order
    for key in (b"key-1", b"key-2"):
        parts = {x.partition() for x in msgs if x.key() == key}
        assert len(parts) == 1


def test_librdkafka_list_offsets_and_offsets_for_times(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "ts")
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    for i in range(10):
        p.produce("ts", b"x", timestamp=1_000_000 + i * 1000)
    p.flush(10)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "x", "enable.auto.commit": False})
    assert c.get_watermark_offsets(TopicPartition("ts", 0), timeout=10) == (0, 10)
    found = c.offsets_for_times([TopicPartition("ts", 0, 1_004_500)], timeout=10)
    assert found[0].offset == 5
    found = c.offsets_for_times([TopicPartition("ts", 0, 9_999_999)], timeout=10)
    assert found[0].offset in (-1, 10)  # no such timestamp: end of log
    c.close()


def test_kafka_python_produce_and_consume(broker: BrokerProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTP

    create_topic(broker.bootstrap, "kp")
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=False)
    metas = [p.send("kp", key=b"k", value=b"kp-%d" % i, headers=[("h", b"v")]) for i in range(50)]
    p.flush()
    assert [m.get(timeout=10).offset for m in metas] == list(range(50))
    p.close()
    c = KafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    c.assign([KTP("kp", 0)])
    c.seek_to_beginning()
    got = [(m.offset, m.value, m.headers) for m in c]
    c.close()
    assert [g[0] for g in got] == list(range(50))
    assert got[3][1] == b"kp-3" and got[3][2] == [("h", b"v")]


def test_aiokafka_produce_and_consume(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as ATP

    create_topic(broker.bootstrap, "ak", 2)

    async def main() -> list:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, acks="all")
        await p.start()
        try:
            for i in range(40):
                await p.send_and_wait("ak", b"ak-%d" % i, partition=i % 2)
        finally:
            await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest")
        await c.start()
        try:
            c.assign([ATP("ak", 0), ATP("ak", 1)])
            out = []
            deadline = time.monotonic() + 15
            while len(out) < 40 and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=500)
                for msgs in batch.values():
                    out.extend(msgs)
            return out
        finally:
            await c.stop()

    got = asyncio.run(main())
    assert sorted(m.value for m in got) == sorted(b"ak-%d" % i for i in range(40))
    assert sorted(m.offset for m in got if m.partition == 0) == list(range(20))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian package) is not installed")
def test_kcat_lists_metadata_and_consumes(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "kc", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
    for i in range(6):
        p.produce("kc", b"kc-%d" % i, partition=i % 2)
    p.flush(10)
    md = json.loads(subprocess.run(["kcat", "-b", broker.bootstrap, "-L", "-J"], capture_output=True,
                                   text=True, timeout=30, check=True).stdout)
    topics = {t["topic"]: t for t in md["topics"]}
    assert len(topics["kc"]["partitions"]) == 2
    assert md["brokers"][0]["name"] == broker.bootstrap
    out = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", "kc", "-o", "beginning", "-e", "-J"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    msgs = [json.loads(line) for line in out.splitlines() if line.strip()]
    assert sorted(m["payload"] for m in msgs) == [f"kc-{i}" for i in range(6)]

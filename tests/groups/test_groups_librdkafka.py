"""Consumer groups against the broker, with librdkafka, kafka-python and aiokafka."""

from __future__ import annotations

import asyncio
import collections
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker
from tests.transactions.test_transactions_librdkafka import read_all

FAST = ["--auto-create-topics", "--group-initial-rebalance-delay-ms", "0"]


def consumer(bootstrap: str, group: str, name: str, **extra: object) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                     "auto.offset.reset": "earliest", "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                     "log_level": 3, **extra})


def poll_until(consumers: list[Consumer], done, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        if done():
            return
    raise AssertionError("condition not reached in time")


def parts(c: Consumer) -> list[int]:
    return sorted(tp.partition for tp in c.assignment())


def leave_and_close(consumers: list[Consumer], timeout_s: float = 60) -> None:
    """Leave the group, then close: every member unsubscribes and is polled until none holds a
    partition, so that ``close()`` has no rebalance left to serve. Closing members in turn while
    the group rebalanced once hung CI: librdkafka 2.16, serving a revoke from inside
    ``consumer_close``, blocked for good in ``rd_kafka_assign`` (its stack: rd_kafka_op_req under
    Consumer_rebalance_cb under rd_kafka_consumer_close; the broker had the group empty). A close
    that still does not return fails the test instead of hanging the suite."""
    import threading

    for c in consumers:
        c.unsubscribe()
    poll_until(consumers, lambda: not any(c.assignment() for c in consumers))
    for c in consumers:
        closer = threading.Thread(target=c.close, daemon=True)
        closer.start()
        closer.join(timeout_s)
        assert not closer.is_alive(), f"librdkafka's close() did not return within {timeout_s:g} s"


def test_members_split_partitions_rebalance_and_expire(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", *FAST, log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "g4", 4)
        c1, c2 = consumer(b.bootstrap, "grp", "c1"), consumer(b.bootstrap, "grp", "c2")
        c1.subscribe(["g4"])
        c2.subscribe(["g4"])
        poll_until([c1, c2], lambda: len(parts(c1)) == 2 and len(parts(c2)) == 2)
        assert sorted(parts(c1) + parts(c2)) == [0, 1, 2, 3]
        c3 = consumer(b.bootstrap, "grp", "c3")
        c3.subscribe(["g4"])
        poll_until([c1, c2, c3], lambda: all(parts(c) for c in (c1, c2, c3)) and
                   sorted(parts(c1) + parts(c2) + parts(c3)) == [0, 1, 2, 3])
        # a member that dies without leaving is expired after its session timeout
        killed = subprocess.Popen([sys.executable, "-c", f"""
import time
from confluent_kafka import Consumer
c = Consumer({{"bootstrap.servers": "{b.bootstrap}", "group.id": "grp", "session.timeout.ms": 6000,
              "heartbeat.interval.ms": 300, "log_level": 3}})
c.subscribe(["g4"])
while True:
    c.poll(0.1)
    if c.assignment():
        print("assigned", flush=True)
"""], stdout=subprocess.PIPE, text=True)
        assert killed.stdout is not None
        import threading

        ready = threading.Event()
        threading.Thread(target=lambda: (killed.stdout.readline(), ready.set()), daemon=True).start()  # type: ignore[union-attr]
        # keep the others polling: librdkafka serves rebalances from poll()
        poll_until([c1, c2, c3], lambda: ready.is_set() and len(parts(c1) + parts(c2) + parts(c3)) < 4)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        start = time.monotonic()
        poll_until([c1, c2, c3], lambda: sorted(parts(c1) + parts(c2) + parts(c3)) == [0, 1, 2, 3], 30)
        assert time.monotonic() - start > 3  # it took the session timeout, not a clean leave
        leave_and_close([c1, c2, c3])
    finally:
        b.kill()


def test_committed_offsets_are_resumed_by_a_new_member(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "resume", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(40):
        p.produce("resume", b"r-%d" % i, partition=i % 2)
    p.flush(10)
    c = consumer(broker.bootstrap, "res", "first", **{"enable.auto.commit": False})
    c.subscribe(["resume"])
    seen = []
    deadline = time.monotonic() + 20
    while len(seen) < 20 and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error():
            seen.append(m)
    c.commit(asynchronous=False)
    committed = {tp.partition: tp.offset for tp in c.committed([TopicPartition("resume", 0),
                                                                 TopicPartition("resume", 1)], 10)}
    c.close()
    c2 = consumer(broker.bootstrap, "res", "second")
    c2.subscribe(["resume"])
    rest = []
    deadline = time.monotonic() + 20
    while len(rest) < 40 - sum(committed.values()) and time.monotonic() < deadline:
        m = c2.poll(0.1)
        if m is not None and not m.error():
            rest.append(m)
    c2.close()
    for partition in (0, 1):
        offsets = [m.offset() for m in rest if m.partition() == partition]
        start = max(committed[partition], 0)
        assert offsets == list(range(start, 20)), (partition, committed)
    assert {m.value() for m in seen} | {m.value() for m in rest} == {b"r-%d" % i for i in range(40)}


def test_kafka_python_and_aiokafka_groups(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaConsumer
    from kafka import KafkaConsumer

    create_topic(broker.bootstrap, "py", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(20):
        p.produce("py", b"p-%d" % i, partition=i % 2)
    p.flush(10)
    kc = KafkaConsumer("py", bootstrap_servers=broker.bootstrap, group_id="kpg", auto_offset_reset="earliest",
                       consumer_timeout_ms=8000, enable_auto_commit=False)
    values = set()
    for m in kc:
        values.add(m.value)
        if len(values) == 20:
            break
    kc.commit()
    kc.close()
    assert len(values) == 20

    async def aio() -> int:
        c = AIOKafkaConsumer("py", bootstrap_servers=broker.bootstrap, group_id="aiog",
                             auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            got = 0
            deadline = time.monotonic() + 20
            while got < 20 and time.monotonic() < deadline:
                batch = await c.getmany(timeout_ms=500)
                got += sum(len(v) for v in batch.values())
            await c.commit()
            committed = await c.committed(__import__("aiokafka").TopicPartition("py", 0))
            assert committed == 10
            return got
        finally:
            await c.stop()

    assert asyncio.run(aio()) == 20


def _output_size(bootstrap: str, topic: str) -> int:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "size", "log_level": 3})
    try:
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in (0, 1))
    finally:
        c.close()


def _run_copier(mode: str, b: BrokerProcess, group: str, kills: int, seed: int) -> None:
    """Run the copier, SIGKILLing it ``kills`` times, each time only after it made progress in this life
    (a kill while the group still waits for the previous, dead member would test nothing)."""
    rng = random.Random(seed)
    out = f"cout-{mode}"
    for i in range(kills + 1):
        before = _output_size(b.bootstrap, out)
        proc = subprocess.Popen([sys.executable, "-m", "tests.groups.copier", mode, b.bootstrap, "cin", out,
                                 group, str(seed + i)], stderr=subprocess.DEVNULL)
        if i < kills:
            deadline = time.monotonic() + 60
            while _output_size(b.bootstrap, out) < before + 100 and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(rng.uniform(0.05, 0.6))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        else:
            proc.wait(120)


def test_transactional_copier_is_exactly_once_and_autocommit_is_not(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", *FAST, log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "cin", 2)
        create_topic(b.bootstrap, "cout-transactional", 2)
        create_topic(b.bootstrap, "cout-autocommit", 2)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        n = 3000
        for i in range(n):
            p.produce("cin", b"m-%05d" % i, partition=i % 2)
            if i % 100 == 0:
                p.poll(0)
        p.flush(20)
        expected = {b"M-%05d" % i for i in range(n)}
        # throttle the input so the kills land mid-stream: the copier runs ~3-6 s per life
        _run_copier("transactional", b, "copy-tx", kills=3, seed=7)
        out = collections.Counter(v for _, _, v in read_all(b.bootstrap, "cout-transactional", 2, "read_committed"))
        assert set(out) == expected, f"missing {len(expected - set(out))}"
        assert max(out.values()) == 1, f"{sum(c - 1 for c in out.values())} duplicates"
        _run_copier("autocommit", b, "copy-auto", kills=3, seed=7)
        auto = collections.Counter(v for _, _, v in read_all(b.bootstrap, "cout-autocommit", 2, "read_uncommitted"))
        anomalies = len(expected - set(auto)) + sum(c - 1 for c in auto.values())
        assert anomalies > 0, "auto-commit under SIGKILL should lose or duplicate records"
    finally:
        b.kill()


def test_roundrobin_and_cooperative_sticky_assignors(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", *FAST, log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "assign", 4)
        for strategy in ("roundrobin", "cooperative-sticky"):
            group = f"g-{strategy}"
            c1 = consumer(b.bootstrap, group, "a", **{"partition.assignment.strategy": strategy})
            c2 = consumer(b.bootstrap, group, "b", **{"partition.assignment.strategy": strategy})
            c1.subscribe(["assign"])
            poll_until([c1], lambda c1=c1: parts(c1) == [0, 1, 2, 3])
            c2.subscribe(["assign"])
            # cooperative: c1 revokes only what moves, then both converge on two partitions each
            poll_until([c1, c2], lambda c1=c1, c2=c2: len(parts(c1)) == 2 and len(parts(c2)) == 2)
            assert sorted(parts(c1) + parts(c2)) == [0, 1, 2, 3]
            with RawClient(b.bootstrap) as client:
                desc = client.request(15, (0, 5), {"groups": [group], "include_authorized_operations": False})
            assert desc.groups[0].protocol_data == strategy
            leave_and_close([c1, c2])
    finally:
        b.kill()

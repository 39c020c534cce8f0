"""The producer-to-broker RPC fails after the broker appended: the producer retries. With idempotence
the broker recognises the retry (zero duplicates); without it, the duplicates appear."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.testing.broker_process import create_topic, free_port, oncelog_broker
from oncelog.verify.proxy import API_PRODUCE, FaultProxy


def _values(bootstrap: str, topic: str, expected_at_least: int) -> list[bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "x", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list[bytes] = []
    deadline = time.monotonic() + 20
    eof = False
    while time.monotonic() < deadline and not (eof and len(out) >= expected_at_least):
        m = c.poll(0.2)
        if m is None:
            continue
        if m.error():
            eof = m.error().code() == -191
            continue
        eof = False
        out.append(m.value())
    c.close()
    return out


@pytest.mark.parametrize("idempotence", [True, False], ids=["idempotent", "plain"])
def test_retries_after_lost_produce_responses(tmp_path: Path, idempotence: bool) -> None:
    proxy = FaultProxy("127.0.0.1", 1)  # bind first: the broker advertises the proxy's address
    broker_port = free_port()
    proxy.target = ("127.0.0.1", broker_port)
    b = oncelog_broker(tmp_path / "d", "--advertised-listener", proxy.address, port=broker_port,
                       log_path=tmp_path / "broker.log").start()
    proxy.start()
    try:
        create_topic(b.bootstrap, "acks")
        p = Producer({"bootstrap.servers": proxy.address, "enable.idempotence": idempotence, "acks": "all",
                      "retries": 100, "retry.backoff.ms": 20, "linger.ms": 5,
                      "max.in.flight.requests.per.connection": 5, "message.timeout.ms": 60000})
        # every one of the first 6 Produce responses is lost (with linger, 300 records may fit in a
        # handful of requests: a coin flip per response could drop none)
        proxy.drop_responses(API_PRODUCE, 6, probability=1.0)
        n = 300
        delivered = []
        for i in range(n):
            p.produce("acks", b"v-%d" % i, on_delivery=lambda err, m: delivered.append(err))
            if i % 10 == 0:
                p.poll(0.02)
        assert p.flush(60) == 0
        assert all(err is None for err in delivered) and len(delivered) == n
        assert proxy.stats.dropped_responses > 0
        values = _values(b.bootstrap, "acks", n)
        counts = collections.Counter(values)
        assert set(counts) == {b"v-%d" % i for i in range(n)}  # nothing lost
        duplicates = sum(c - 1 for c in counts.values())
        if idempotence:
            assert duplicates == 0
        else:
            assert duplicates > 0, "without idempotence, retried batches must show up twice"
    finally:
        proxy.stop()
        b.kill()

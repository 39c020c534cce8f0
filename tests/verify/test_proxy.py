"""Through the fault proxy, dropped Produce acknowledgements make a retrying producer without
idempotence write duplicates, and an idempotent producer must not."""

from __future__ import annotations

from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.testing.broker_process import BrokerProcess
from oncelog.verify.proxy import FaultProxy

PRODUCE = 0


def produce_through_dropping_proxy(bootstrap: str, topic: str, idempotent: bool) -> list[str]:
    with FaultProxy(bootstrap.split(":")[0], int(bootstrap.split(":")[1]), seed=7) as proxy:
        p = Producer({"bootstrap.servers": proxy.address, "enable.idempotence": idempotent,
                      "acks": "all", "retries": 10, "retry.backoff.ms": 50, "linger.ms": 0,
                      "max.in.flight.requests.per.connection": 1, "request.timeout.ms": 2000,
                      "message.timeout.ms": 20000, "socket.timeout.ms": 2000})
        p.produce(topic, b"warm-up", partition=0)
        assert p.flush(15) == 0
        errors: list[object] = []
        proxy.drop_responses(PRODUCE, 2)  # the broker appends, the client never hears of it and retries
        for i in range(5):
            p.produce(topic, f"v{i}".encode(), partition=0, on_delivery=lambda e, m: e and errors.append(e))
            p.flush(15)
        assert p.flush(15) == 0 and not errors, errors
        assert proxy.stats.dropped_responses >= 1
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted"})
    c.assign([TopicPartition(topic, 0, 0)])
    values: list[str] = []
    for _ in range(50):
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            values.append((m.value() or b"").decode())
        if values.count("v4") >= 1 and m is None:
            break
    c.close()
    return values


def test_dropped_acks_duplicate_without_idempotence_and_not_with_it(broker: BrokerProcess) -> None:
    plain = produce_through_dropping_proxy(broker.bootstrap, "dup-plain", idempotent=False)
    assert [v for v in plain if v != "warm-up"] != [f"v{i}" for i in range(5)]
    assert len(plain) > len(set(plain)), plain
    idem = produce_through_dropping_proxy(broker.bootstrap, "dup-idem", idempotent=True)
    assert [v for v in idem if v != "warm-up"] == [f"v{i}" for i in range(5)], idem

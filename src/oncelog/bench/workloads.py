"""Client workloads for the benchmark; each runs in its own process (``python -m
oncelog.bench.workloads NAME BOOTSTRAP TOPIC RECORDS SIZE``) and prints one JSON line with
``records``, ``bytes`` and ``seconds``, so the broker under test never shares a CPU-bound
interpreter with the client that loads it."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition


def _producer(bootstrap: str, **extra: Any) -> Producer:
    conf = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": False, "linger.ms": 5,
            "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576, "log_level": 3}
    conf.update(extra)
    return Producer(conf)


def _produce(p: Producer, topic: str, records: int, size: int, *, txn_every_ms: int = 0) -> dict[str, float]:
    value = b"x" * size
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    if txn_every_ms:
        p.init_transactions(30)
        p.begin_transaction()
    start = time.perf_counter()
    last_commit = start
    for i in range(records):
        while True:
            try:
                p.produce(topic, value, partition=0, on_delivery=on_delivery)
                break
            except BufferError:
                p.poll(0.005)
        if txn_every_ms and (i & 255) == 0 and (time.perf_counter() - last_commit) * 1000 >= txn_every_ms:
            p.commit_transaction(30)
            p.begin_transaction()
            last_commit = time.perf_counter()
    if txn_every_ms:
        p.commit_transaction(30)
    remaining = p.flush(120)
    seconds = time.perf_counter() - start
    if remaining or errors:
        raise SystemExit(f"produce failed: {remaining} undelivered, errors {errors[:3]}")
    return {"records": records, "bytes": records * size, "seconds": seconds}


def produce(bootstrap: str, topic: str, records: int, size: int) -> dict[str, float]:
    return _produce(_producer(bootstrap), topic, records, size)


def produce_idempotent(bootstrap: str, topic: str, records: int, size: int) -> dict[str, float]:
    return _produce(_producer(bootstrap, **{"enable.idempotence": True}), topic, records, size)


def produce_transactional(bootstrap: str, topic: str, records: int, size: int) -> dict[str, float]:
    p = _producer(bootstrap, **{"transactional.id": f"bench-{time.time_ns()}", "enable.idempotence": True})
    return _produce(p, topic, records, size, txn_every_ms=100)


def consume(bootstrap: str, topic: str, records: int, size: int) -> dict[str, float]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                  "fetch.max.bytes": 52_428_800, "max.partition.fetch.bytes": 10_485_760,
                  "isolation.level": "read_uncommitted", "log_level": 3})
    c.assign([TopicPartition(topic, 0, 0)])
    got = 0
    nbytes = 0
    start = time.perf_counter()
    deadline = start + 120
    while got < records and time.perf_counter() < deadline:
        for m in c.consume(10_000, 0.5):
            if m.error() is None:
                got += 1
                nbytes += len(m.value() or b"")
    seconds = time.perf_counter() - start
    c.close()
    if got < records:
        raise SystemExit(f"consumed only {got} of {records} records")
    return {"records": got, "bytes": nbytes, "seconds": seconds}


WORKLOADS = {f.__name__: f for f in (produce, produce_idempotent, produce_transactional, consume)}

if __name__ == "__main__":
    name, bootstrap, topic, records, size = sys.argv[1:6]
    print(json.dumps(WORKLOADS[name](bootstrap, topic, int(records), int(size))))

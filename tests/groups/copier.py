"""A consume-transform-produce copier (the seed's read-process-write loop), run as a process that tests
kill with SIGKILL. ``transactional``: offsets are committed inside the producer's transaction
(send_offsets_to_transaction), with random aborts; ``autocommit``: a plain producer and the
consumer's auto-commit, the at-least/at-most-once pattern.

Usage: python -m tests.groups.copier MODE BOOTSTRAP INPUT OUTPUT GROUP SEED
"""

from __future__ import annotations

import random
import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition


def main() -> None:
    mode, bootstrap, src, dst, group, seed = sys.argv[1:7]
    rng = random.Random(int(seed))
    transactional = mode == "transactional"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": not transactional, "auto.commit.interval.ms": 50,
                         "isolation.level": "read_committed", "session.timeout.ms": 6000,
                         "heartbeat.interval.ms": 500, "log_level": 3})
    pconf = {"bootstrap.servers": bootstrap, "linger.ms": 5, "log_level": 3}
    if transactional:
        pconf["transactional.id"] = f"copier-{group}"
    producer = Producer(pconf)
    if transactional:
        producer.init_transactions(30)
    consumer.subscribe([src])
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 8:
        msgs = [m for m in consumer.consume(50, 0.3) if m.error() is None]
        if not msgs:
            continue
        idle_since = time.monotonic()
        time.sleep(0.1)  # "processing": keeps the run long enough for the kills to land mid-stream
        if not transactional:
            for m in msgs:
                producer.produce(dst, m.value().upper(), key=m.key())
            producer.flush(10)
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(dst, m.value().upper(), key=m.key())
        positions = {}
        for m in msgs:
            positions[(m.topic(), m.partition())] = m.offset() + 1
        offsets = [TopicPartition(t, p, o) for (t, p), o in positions.items()]
        try:
            producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
            if rng.random() < 0.2:
                producer.abort_transaction(30)
                # rewind to what is committed, as an aborted batch must be processed again
                committed = consumer.committed([TopicPartition(t, p) for t, p in positions], 10)
                for tp in committed:
                    consumer.seek(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else 0))
                continue
            producer.commit_transaction(30)
        except KafkaException as exc:
            err = exc.args[0]
            if err.txn_requires_abort():
                producer.abort_transaction(30)
                sys.exit(3)
            raise
    consumer.close()


if __name__ == "__main__":
    main()

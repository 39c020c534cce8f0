"""How long other clients wait while a large topic is created: a producer sends 1 KiB records at
2,000/s (linger.ms=0) to a one-partition topic while CreateTopics makes a topic of N partitions;
prints the creation time and the producer's acknowledgement latency during it.

Usage: .venv/bin/python scripts/bench/create_stall.py PARTITIONS REPEATS NAME=SRC [NAME=SRC ...]

Each repeat runs every tree once, in turn (a broker started from that tree via ``PYTHONPATH``).
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.testing.broker_process import create_topic, oncelog_broker


def run(src: str, partitions: int) -> str:
    os.environ["PYTHONPATH"] = src
    broker = oncelog_broker(Path(tempfile.mkdtemp()) / "data").start()
    try:
        create_topic(broker.bootstrap, "other", 1)
        latencies: list[float] = []
        window: list[float] = []
        stop = threading.Event()

        def produce() -> None:
            p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "log_level": 3})
            sent: dict[int, float] = {}

            def done(err: object, msg: object, i: int) -> None:
                if err is None:
                    latencies.append((time.monotonic(), (time.monotonic() - sent.pop(i)) * 1000))

            i = 0
            while not stop.is_set():
                sent[i] = time.monotonic()
                p.produce("other", b"x" * 1024, on_delivery=lambda e, m, i=i: done(e, m, i))
                p.poll(0.0005)
                time.sleep(0.0005)
                i += 1
            p.flush(30)

        t = threading.Thread(target=produce)
        t.start()
        time.sleep(2)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log_level": 3})
        window.append(time.monotonic())
        admin.create_topics([NewTopic("big", partitions, 1)], operation_timeout=60)["big"].result(timeout=120)
        window.append(time.monotonic())
        time.sleep(1)
        stop.set()
        t.join()
        during = [lat for at, lat in latencies if window[0] <= at <= window[1] + 0.5]
        before = [lat for at, lat in latencies if at < window[0]]
        return (f"creation {window[1] - window[0]:.2f} s; acknowledgement latency max {max(during, default=0):.1f} ms "
                f"during it ({len(during)} records), {max(before, default=0):.1f} ms before it")
    finally:
        broker.stop()


def main() -> None:
    partitions, repeats = int(sys.argv[1]), int(sys.argv[2])
    trees = dict(arg.split("=", 1) for arg in sys.argv[3:])
    for _ in range(repeats):
        for name, src in trees.items():
            print(f"{name}: {run(src, partitions)}", flush=True)


if __name__ == "__main__":
    main()

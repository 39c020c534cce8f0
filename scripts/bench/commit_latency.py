"""One transactional librdkafka producer at a fixed rate against our broker and/or Tansu: how long
its commits take, and its records' acknowledgement latency.

Usage: .venv/bin/python scripts/bench/commit_latency.py RATE [ours,tansu]

1 KiB records round robin over 3 partitions, linger.ms=0, for 5 s; every 100 ms the producer
flushes (timed) and commits (``commit_transaction``, timed: EndTxn and what the broker does before
answering it), as the bench's transactional row does. Prints p50/p99 acknowledgement latency, flush
p50/max and commit p50/p90/max in ms.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from oncelog.testing.broker_process import create_topic, oncelog_broker, tansu_broker

SECONDS = 5
COMMIT_EVERY_S = 0.1


def _q(xs: list[float], f: float) -> float:
    return xs[min(len(xs) - 1, int(len(xs) * f))] if xs else float("nan")


def run(which: str, rate: int) -> None:
    broker = oncelog_broker(Path(tempfile.mkdtemp(prefix="oncelog-commits-")) / "data") if which == "ours" \
        else tansu_broker()
    broker.start()
    try:
        create_topic(broker.bootstrap, "t", 3)
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all",
                      "transactional.id": f"commit-latency-{os.getpid()}", "max.in.flight.requests.per.connection": 5,
                      "batch.size": 1 << 20, "log_level": 3})
        p.list_topics("t", timeout=10)
        p.init_transactions(30)
        p.begin_transaction()
        latencies: list[float] = []

        def delivered(err: Any, m: Any) -> None:
            if err is None:
                latencies.append(m.latency() * 1000)

        value = bytes(1024)
        commits: list[float] = []
        flushes: list[float] = []
        start = last = time.monotonic()
        i = 0
        while time.monotonic() - start < SECONDS:
            due = int((time.monotonic() - start) * rate)
            while i < due:
                p.produce("t", value, partition=i % 3, on_delivery=delivered)
                i += 1
            p.poll(0)
            if time.monotonic() - last >= COMMIT_EVERY_S:
                t0 = time.monotonic()
                p.flush(30)
                t1 = time.monotonic()
                p.commit_transaction(30)
                t2 = time.monotonic()
                p.begin_transaction()
                last = time.monotonic()
                flushes.append((t1 - t0) * 1000)
                commits.append((t2 - t1) * 1000)
            time.sleep(0.001)
        p.commit_transaction(30)
    finally:
        broker.kill(signal.SIGKILL)
    for xs in (latencies, commits, flushes):
        xs.sort()
    print(f"{which:6} {rate:,}/s  ack p50 {_q(latencies, .5):.2f} p99 {_q(latencies, .99):.2f} | flush p50 "
          f"{_q(flushes, .5):.2f} max {flushes[-1]:.2f} | commit p50 {_q(commits, .5):.2f} p90 {_q(commits, .9):.2f} "
          f"max {commits[-1]:.2f} (n={len(commits)})", flush=True)


def main() -> None:
    rate = int(sys.argv[1])
    for which in (sys.argv[2] if len(sys.argv) > 2 else "ours,tansu").split(","):
        run(which, rate)


if __name__ == "__main__":
    main()

"""One librdkafka producer at a fixed rate against our broker or Tansu: its CPU, requests, batches,
round trips and the broker thread's ``wakeups`` from librdkafka's statistics.

Usage: .venv/bin/python scripts/bench/idempotent_wakeups.py ours|tansu plain|idem RATE
(5 s at RATE records/s of 1 KiB, linger.ms=0, acks=all, 5 requests in flight, 3 partitions).
"""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from oncelog.testing.broker_process import create_topic, oncelog_broker, tansu_broker

SECONDS = 5


def main() -> None:
    which, mode, rate = sys.argv[1], sys.argv[2], int(sys.argv[3])
    broker = oncelog_broker(Path(tempfile.mkdtemp(prefix="oncelog-wakeups-")) / "data") if which == "ours" \
        else tansu_broker()
    broker.start()
    try:
        create_topic(broker.bootstrap, "t", 3)
        stats: list[dict[str, Any]] = []
        latencies: list[float] = []
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "acks": "all",
                      "enable.idempotence": mode == "idem", "max.in.flight.requests.per.connection": 5,
                      "batch.size": 1 << 20, "statistics.interval.ms": 1000,
                      "stats_cb": lambda s: stats.append(json.loads(s))})
        value = os.urandom(1024)

        def delivered(err: Any, m: Any) -> None:
            if err is None:
                latencies.append(m.latency())

        started = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_SELF)
        sent = 0
        while time.monotonic() - started < SECONDS:
            due = int((time.monotonic() - started) * rate)
            while sent < due:
                p.produce("t", value, on_delivery=delivered)
                sent += 1
            p.poll(0)
            time.sleep(0.001)
        p.flush(30)
        after = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        broker.kill(signal.SIGKILL)
    cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) / SECONDS
    last = stats[-1]
    thread = next(v for v in last["brokers"].values() if v["nodeid"] >= 0)
    topic = last["topics"]["t"]
    latencies.sort()
    print(f"{which} {mode}: client CPU {cpu * 100:.0f}% of a core; wakeups {thread['wakeups']:,}; "
          f"requests { {k: v for k, v in thread['req'].items() if v} }; retries {thread['txretries']}; "
          f"records per batch {topic['batchcnt']['avg']}; "
          f"RTT p50/p99 {thread['rtt']['p50']}/{thread['rtt']['p99']} us; "
          f"delivery p50/p99 {latencies[len(latencies) // 2] * 1000:.1f}/"
          f"{latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms")


if __name__ == "__main__":
    main()

"""Fixed-rate produce latency of our broker and Tansu side by side, with the client processes at a
given CPU priority: the measurement behind ``oncelog bench --client-priority``.

Usage: .venv/bin/python scripts/bench/latency_priority.py idle|normal RATE[,RATE...] MODE[,MODE...] [REPEATS]

MODE is plain, idempotent or transactional; the bench's own client pool and ``Bench.latency`` (2
client processes, 1 KiB records, 3 partitions, linger.ms=0, 4 s with the first second dropped).
Prints p50 / p99 / p99.9 in ms and the CPU of the broker and the clients, one line per run.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from oncelog.bench.clients import ClientPool
from oncelog.bench.cpu import cpu_count
from oncelog.bench.runner import Bench, Broker, Plan
from oncelog.testing.broker_process import oncelog_broker, tansu_broker


def main() -> None:
    priority, rates, modes = sys.argv[1], [float(x) for x in sys.argv[2].split(",")], sys.argv[3].split(",")
    repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 1
    pool = ClientPool(2, priority)
    brokers = [Broker("oncelog", oncelog_broker(Path(tempfile.mkdtemp()) / "data").start(), cores=1),
               Broker("tansu", tansu_broker().start(), cores=cpu_count())]
    bench = Bench(Plan.full(), brokers, pool, lambda _s: None)
    try:
        for mode in modes:
            for rate in rates:
                for _ in range(repeats):
                    for b in brokers:
                        topic = b.topic(f"lat-{mode}", 3)
                        r = bench.latency(b, topic, 3, rate, mode=mode, processes=2, per_process=1, size=1024)
                        b.delete(topic)
                        print(f"{priority:6} {mode:13} {rate:8.0f} {b.name:8} p50 {r['p50']:8.2f} p99 {r['p99']:8.2f} "
                              f"p99.9 {r['p99.9']:8.2f} acked/s {r['acked_per_s']:8.0f} cpu {json.dumps(r['cpu'])}",
                              flush=True)
    finally:
        pool.close()
        for b in brokers:
            b.process.kill()


if __name__ == "__main__":
    main()

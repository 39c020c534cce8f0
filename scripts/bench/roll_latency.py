"""Acknowledgement latency at a fixed rate with small segments (a roll every second or so), for
two source trees side by side: how long the event loop stalls when a segment rolls.

Usage: .venv/bin/python scripts/bench/roll_latency.py RATE SEGMENT_BYTES REPEATS NAME=SRC [NAME=SRC ...]

e.g. ``... roll_latency.py 40000 16777216 2 before=/tmp/before/src after=$PWD/src`` (a worktree of
the older commit for "before"). Each repeat runs every tree once, in turn: a broker started from
that tree (``PYTHONPATH``) with ``--segment-bytes``, then the bench's fixed-rate job
(``Bench.latency``: 1 KiB records over 3 partitions, 2 client processes at idle CPU priority,
``linger.ms=0``, 6 s with the first second dropped). Prints p50/p99/p99.9/max in ms per run.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from oncelog.bench.clients import ClientPool
from oncelog.bench.runner import Bench, Broker, Plan
from oncelog.testing.broker_process import oncelog_broker


def main() -> None:
    rate, segment_bytes, repeats = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    trees = dict(arg.split("=", 1) for arg in sys.argv[4:])
    plan = Plan.full()
    plan.latency_s = 6.0
    pool = ClientPool(2, "idle")
    try:
        for _ in range(repeats):
            for name, src in trees.items():
                os.environ["PYTHONPATH"] = src
                data = Path(tempfile.mkdtemp()) / "data"
                broker = Broker("oncelog", oncelog_broker(data, "--segment-bytes", segment_bytes).start(), cores=1)
                try:
                    bench = Bench(plan, [broker], pool, lambda _s: None)
                    r = bench.latency(broker, broker.topic("lat", 3), 3, rate, processes=2, per_process=1, size=1024)
                    print(f"{name}: p50 {r['p50']} p99 {r['p99']} p99.9 {r.get('p99.9')} max {r['max']} ms, "
                          f"acknowledged {r['acked_per_s']}/s, broker CPU {r['cpu']['broker_pct']}%", flush=True)
                finally:
                    broker.process.stop()
    finally:
        pool.close()


if __name__ == "__main__":
    main()

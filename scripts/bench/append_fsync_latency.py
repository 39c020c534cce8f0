"""Acknowledgement latency under fsync per append (``flush.messages=1``) at a fixed rate, for
several source trees side by side: how long a produce waits for the group commit.

Usage: .venv/bin/python scripts/bench/append_fsync_latency.py RATE REPEATS NAME=SRC [NAME=SRC ...]

e.g. ``... append_fsync_latency.py 5000 3 before=/tmp/before/src after=$PWD/src`` (a worktree of
the older commit for "before"). Each repeat runs every tree once, in turn: a broker started from
that tree (``PYTHONPATH``), a topic of 3 partitions with ``flush.messages=1``, then the bench's
fixed-rate job (``Bench.latency``: 1 KiB records, 2 client processes at idle CPU priority with one
producer each, ``linger.ms=0``, so each producer pipelines small requests on one connection; 6 s
with the first second dropped). Prints p50/p99/p99.9/max in ms per run and the broker's CPU.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from oncelog.bench.clients import ClientPool
from oncelog.bench.runner import FSYNC_PER_APPEND, Bench, Broker, Plan
from oncelog.testing.broker_process import oncelog_broker


def main() -> None:
    rate, repeats = float(sys.argv[1]), int(sys.argv[2])
    trees = dict(arg.split("=", 1) for arg in sys.argv[3:])
    plan = Plan.full()
    plan.latency_s = 6.0
    pool = ClientPool(2, "idle")
    try:
        for _ in range(repeats):
            for name, src in trees.items():
                os.environ["PYTHONPATH"] = src
                data = Path(tempfile.mkdtemp()) / "data"
                broker = Broker("oncelog", oncelog_broker(data).start(), cores=1)
                try:
                    bench = Bench(plan, [broker], pool, lambda _s: None)
                    topic = broker.topic("lat", 3, FSYNC_PER_APPEND)
                    r = bench.latency(broker, topic, 3, rate, processes=2, per_process=1, size=1024)
                    print(f"{name}: p50 {r['p50']} p99 {r['p99']} p99.9 {r.get('p99.9')} max {r['max']} ms, "
                          f"acknowledged {r['acked_per_s']}/s, broker CPU {r['cpu']['broker_pct']}%", flush=True)
                finally:
                    broker.process.stop()
    finally:
        pool.close()


if __name__ == "__main__":
    main()

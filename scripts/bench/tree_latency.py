"""The loop the fixed-rate latency scripts share (``roll_latency.py``, ``append_fsync_latency.py``):
for each repeat, each source tree in turn, a broker started from that tree (``PYTHONPATH``), a topic
of 3 partitions, then the bench's fixed-rate job (``Bench.latency``: 1 KiB records, 2 client
processes at idle CPU priority with one producer each, ``linger.ms=0``, 6 s with the first second
dropped); one line per run with p50/p99/p99.9/max in ms and the broker's CPU."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from oncelog.bench.clients import ClientPool
from oncelog.bench.runner import Bench, Broker, Plan
from oncelog.testing.broker_process import oncelog_broker


def run_trees(rate: float, repeats: int, trees: dict[str, str], broker_args: tuple[str, ...] = (),
              topic_config: tuple[tuple[str, str], ...] = ()) -> None:
    plan = Plan.full()
    plan.latency_s = 6.0
    pool = ClientPool(2, "idle")
    try:
        for _ in range(repeats):
            for name, src in trees.items():
                os.environ["PYTHONPATH"] = src
                data = Path(tempfile.mkdtemp()) / "data"
                broker = Broker("oncelog", oncelog_broker(data, *broker_args).start(), cores=1)
                try:
                    bench = Bench(plan, [broker], pool, lambda _s: None)
                    topic = broker.topic("lat", 3, topic_config)
                    r = bench.latency(broker, topic, 3, rate, processes=2, per_process=1, size=1024)
                    print(f"{name}: p50 {r['p50']} p99 {r['p99']} p99.9 {r.get('p99.9')} max {r['max']} ms, "
                          f"acknowledged {r['acked_per_s']}/s, broker CPU {r['cpu']['broker_pct']}%", flush=True)
                finally:
                    broker.process.stop()
    finally:
        pool.close()

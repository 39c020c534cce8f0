"""What one periodic flush of N partitions costs, each with one new idempotent batch: the event
loop's CPU (planning and finishing) and the flush thread's CPU and wall time (the disk work).

Runs against whichever tree is on PYTHONPATH, so two trees can be compared side by side:

    PYTHONPATH=/tmp/base/src:/tmp/base .venv/bin/python scripts/bench/flush_pass_cost.py 1000
    PYTHONPATH=src:. .venv/bin/python scripts/bench/flush_pass_cost.py 1000

A tree without ``LogManager.begin_flush_pass`` (before the recovery-point checkpoint) is driven
the way its broker drove it: one job per partition, each finished on its own.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

from oncelog.clock import ManualClock
from oncelog.storage.config import LogConfig
from oncelog.storage.log_manager import LogManager
from tests.storage.helpers import batch

ROUNDS = 15
WARMUP = 2


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    directory = Path(tempfile.mkdtemp(prefix="flush-pass-"))
    try:
        clock = ManualClock(1_000_000)
        logs = LogManager(directory, LogConfig(), clock)
        logs.create_topic("t", n, {})
        parts = [logs.get_partition("t", p) for p in range(n)]
        loop_s = thread_s = wall_s = 0.0
        for r in range(ROUNDS + WARMUP):
            for p, plog in enumerate(parts):
                assert plog is not None
                plog.append(batch(2, pid=100 + p, epoch=0, seq=2 * r, size=1000))
            clock.advance(1_500)
            c0 = time.thread_time()
            if hasattr(logs, "begin_flush_pass"):
                flush_pass = logs.begin_flush_pass(clock.now_ms())
                assert flush_pass is not None
                c1, w0 = time.thread_time(), time.perf_counter()
                flush_pass.run()
                c2, w1 = time.thread_time(), time.perf_counter()
                logs.finish_flush_pass(flush_pass)
            else:
                jobs = [(plog, plog.begin_flush()) for plog in logs.due_for_flush(clock.now_ms())]
                c1, w0 = time.thread_time(), time.perf_counter()
                for _plog, job in jobs:
                    job.run()
                c2, w1 = time.thread_time(), time.perf_counter()
                for plog, job in jobs:
                    plog.finish_flush(job)
            c3 = time.thread_time()
            if r >= WARMUP:
                loop_s += (c1 - c0) + (c3 - c2)
                thread_s += c2 - c1
                wall_s += w1 - w0
        print(f"per pass of {n} partitions: loop {loop_s / ROUNDS * 1000:.1f} ms CPU, flush thread "
              f"{thread_s / ROUNDS * 1000:.1f} ms CPU, {wall_s / ROUNDS * 1000:.1f} ms wall")
        logs.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()

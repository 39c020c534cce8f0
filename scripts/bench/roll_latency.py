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

import sys

from tree_latency import run_trees

if __name__ == "__main__":
    run_trees(float(sys.argv[1]), int(sys.argv[3]), dict(arg.split("=", 1) for arg in sys.argv[4:]),
              broker_args=("--segment-bytes", sys.argv[2]))

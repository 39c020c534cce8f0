"""Acknowledgement latency under fsync per append (``flush.messages=1``) at a fixed rate, for
several source trees side by side: how long a produce waits for the group commit.

Usage: .venv/bin/python scripts/bench/append_fsync_latency.py RATE REPEATS NAME=SRC [NAME=SRC ...]

e.g. ``... append_fsync_latency.py 5000 3 before=/tmp/before/src after=$PWD/src`` (a worktree of
the older commit for "before"). The runs are ``tree_latency.run_trees``'s, on a topic with
``flush.messages=1``: each of the 2 producers pipelines small requests on one connection.
"""

from __future__ import annotations

import sys

from tree_latency import run_trees

from oncelog.bench.runner import FSYNC_PER_APPEND

if __name__ == "__main__":
    run_trees(float(sys.argv[1]), int(sys.argv[2]), dict(arg.split("=", 1) for arg in sys.argv[3:]),
              topic_config=FSYNC_PER_APPEND)

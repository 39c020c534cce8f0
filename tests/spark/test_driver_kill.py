"""The Spark driver (its whole process group: Python, JVM, Python workers) is SIGKILLed and restarted
from its checkpoint, at the two moments that matter:

- mid-batch, while the tasks' transactions are open (a watcher kills it once output appears);
- in the commit window: after every task of batch 1 committed, before Spark's commit log entry (a
  fault point in the driver's ``commit``, ``oncelog.demo.fault_sink``). Spark then replays batch 1,
  and the sink must skip every partition of it — reported in the commit messages, which the test
  reads from the job's commit report.

exactly_once must end with every committed input record in the output exactly once and the replay
of batch 1 reported as skipped; at_least_once, under the same commit-window kill, writes the
replayed batch again. Needs broker transactions (ours, the ``broker`` fixture).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from oncelog.demo.faults import duplicates_and_losses, produce_transactions, read_topic, run_with_driver_kills
from oncelog.testing.broker_process import BrokerProcess, create_topic

pytest.importorskip("pyspark")
# Upper bounds for a loaded 2-core machine (several Spark starts each); a healthy run takes a fraction.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(480)]

KILLED_BATCH = 1


def _run(broker: BrokerProcess, tmp_path: Path, guarantee: str, kills: int) -> tuple[int, int, int, list[dict]]:
    bs = broker.bootstrap
    create_topic(bs, "in", 2)
    create_topic(bs, "out", 2)
    records = [(b"k%d" % (i % 7), b"r%d" % i) for i in range(120)]
    produce_transactions(bs, "in", records, per_txn=12, abort_every=3, partitions=2)
    report_path = tmp_path / "commits.jsonl"
    cmd = [sys.executable, "-m", "oncelog.demo.job", "--bootstrap", bs, "--input", "in", "--output", "out",
           "--checkpoint", str(tmp_path / "ckpt"), "--guarantee", guarantee, "--max-offsets", "40",
           "--delay-ms", "1000" if kills else "0", "--kill-driver-in-commit", str(KILLED_BATCH), "--marker-dir",
           str(tmp_path / "markers"), "--commit-report", str(report_path)]
    report = run_with_driver_kills(cmd, bs, "out", kills=kills, seed=5, log_path=tmp_path / "job.log",
                                   timeout_s=360)
    assert report.exit_code == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert (report.kills, report.self_kills) == (kills, 1)
    got = [v or b"" for _k, v in read_topic(bs, "out")]
    lost, dup, unexpected = duplicates_and_losses([v for _k, v in records], got)
    commits = [json.loads(line) for line in report_path.read_text().splitlines()]
    return lost, dup, unexpected, [c for c in commits if c["batch"] == KILLED_BATCH]


def test_exactly_once_survives_driver_kills_mid_batch_and_in_the_commit_window(broker: BrokerProcess,
                                                                              tmp_path: Path) -> None:
    lost, dup, unexpected, killed = _run(broker, tmp_path, "exactly_once", kills=1)
    assert (lost, dup, unexpected) == (0, 0, 0)
    first, replay = killed[0], killed[-1]
    assert len(killed) >= 2, "batch 1 was committed by the sink, the driver killed, and batch 1 replayed"
    partitions = sorted(first["written"] + first["skipped"])
    assert partitions and replay["skipped"] == partitions and replay["written"] == [], \
        f"the replay of batch {KILLED_BATCH} must skip every partition its first run committed: {killed}"

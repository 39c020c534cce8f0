"""The exactly-once pipeline on ``local-cluster[2,1,1024]`` (two executor JVMs, separate processes
from the driver, as on a real cluster) with executors SIGKILLed by fault points in the sink's tasks:

- batch 0, partition 0: the executor dies with the task's transaction open (output flushed, not
  committed). The retry on the other executor must abort it (fencing) and write the partition once.
- batch 1, partition 1: the executor dies right *after* the task committed, before Spark sees the
  result. The retry must find the progress record and skip the partition (the commit report shows it).

Needs broker transactions (ours).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.demo.faults import duplicates_and_losses, produce_transactions, read_topic
from oncelog.testing.broker_process import BrokerProcess, create_topic

pytest.importorskip("pyspark")
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(420)]


def test_executor_killed_mid_batch_and_after_its_commit_on_a_cluster(broker: BrokerProcess, tmp_path: Path) -> None:
    bs = broker.bootstrap
    create_topic(bs, "in", 2)
    create_topic(bs, "out", 2)
    records = [(b"k%d" % (i % 5), b"v%d" % i) for i in range(160)]
    produce_transactions(bs, "in", records, per_txn=16, abort_every=3, partitions=2)
    markers, report = tmp_path / "markers", tmp_path / "commits.jsonl"
    cmd = [sys.executable, "-m", "oncelog.demo.job", "--master", "local-cluster[2,1,1024]", "--bootstrap", bs,
           "--input", "in", "--output", "out", "--checkpoint", str(tmp_path / "ckpt"), "--max-offsets", "60",
           "--kill-executor-before-commit", "0:0", "--kill-executor-after-commit", "1:1",
           "--marker-dir", str(markers), "--commit-report", str(report)]
    with open(tmp_path / "job.log", "wb") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=360)
    assert proc.returncode == 0, (tmp_path / "job.log").read_text(errors="replace")[-4000:]
    assert sorted(p.name for p in markers.iterdir()) == ["executor-after-1-1", "executor-before-0-0"], \
        "both executor kills happened"

    got = [v or b"" for _k, v in read_topic(bs, "out")]
    assert duplicates_and_losses([v for _k, v in records], got) == (0, 0, 0)
    assert len(got) == len(records)
    commits = {c["batch"]: c for c in map(json.loads, report.read_text().splitlines())}
    assert commits[0]["written"] == [0, 1] and commits[0]["skipped"] == [], \
        "the attempt killed before its commit left nothing: the retry wrote partition 0"
    assert commits[1]["skipped"] == [1] and commits[1]["written"] == [0], \
        "the attempt killed after its commit had written partition 1: the retry skipped it"

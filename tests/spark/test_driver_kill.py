"""The Spark driver (its whole process group: Python, JVM, Python workers) is SIGKILLed mid-batch and
restarted from its checkpoint. exactly_once must end with every committed input record in the output
exactly once; at_least_once, under the same faults, shows duplicates (and loses nothing).

Needs broker transactions (ours, the ``broker`` fixture).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from oncelog.demo.faults import duplicates_and_losses, produce_transactions, read_topic, run_with_driver_kills
from oncelog.testing.broker_process import BrokerProcess, create_topic

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


def _run(broker: BrokerProcess, tmp_path: Path, guarantee: str, kills: int) -> tuple[int, int, int, int]:
    bs = broker.bootstrap
    create_topic(bs, "in", 2)
    create_topic(bs, "out", 2)
    records = [(b"k%d" % (i % 7), b"r%d" % i) for i in range(120)]
    produce_transactions(bs, "in", records, per_txn=12, abort_every=3, partitions=2)
    cmd = [sys.executable, "-m", "oncelog.demo.job", "--bootstrap", bs, "--input", "in", "--output", "out",
           "--checkpoint", str(tmp_path / "ckpt"), "--guarantee", guarantee, "--max-offsets", "40",
           "--delay-ms", "1000"]
    report = run_with_driver_kills(cmd, bs, "out", kills=kills, seed=5, log_path=tmp_path / "job.log",
                                   timeout_s=200)
    assert report.exit_code == 0, (tmp_path / "job.log").read_text()[-3000:]
    assert report.kills == kills
    got = [v or b"" for _k, v in read_topic(bs, "out")]
    lost, dup, unexpected = duplicates_and_losses([v for _k, v in records], got)
    return lost, dup, unexpected, len(got)


def test_exactly_once_survives_driver_sigkill_mid_batch(broker: BrokerProcess, tmp_path: Path) -> None:
    lost, dup, unexpected, n = _run(broker, tmp_path, "exactly_once", kills=2)
    assert (lost, dup, unexpected, n) == (0, 0, 0, 120)


def test_at_least_once_duplicates_under_the_same_faults(broker: BrokerProcess, tmp_path: Path) -> None:
    lost, dup, unexpected, _n = _run(broker, tmp_path, "at_least_once", kills=1)
    assert lost == 0 and unexpected == 0
    assert dup > 0, "a kill between the flush and Spark's commit must replay the batch"

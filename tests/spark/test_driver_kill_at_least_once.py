"""test_driver_kill's commit-window kill under at_least_once: the replayed batch is written again.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog.testing.broker_process import BrokerProcess
from tests.spark.test_driver_kill import _run

pytest.importorskip("pyspark")
# In a file of its own so that parallel test workers can run it beside its exactly_once sibling.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(480)]


def test_at_least_once_writes_the_replayed_batch_again(broker: BrokerProcess, tmp_path: Path) -> None:
    lost, dup, unexpected, killed = _run(broker, tmp_path, "at_least_once", kills=0)
    assert lost == 0 and unexpected == 0
    assert killed[-1]["skipped"] == [] and killed[-1]["written"], killed
    assert dup >= killed[-1]["rows"] > 0, "a kill after the tasks and before Spark's commit replays the batch"

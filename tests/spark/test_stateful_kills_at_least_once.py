"""The stateful aggregation of test_stateful_kills under at_least_once and the same commit-window
kill: the totals topic repeats the replayed batch's updates; the database sink stays exact.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog.demo.faults import latest_per_account, repeated_updates
from oncelog.testing.broker_process import BrokerProcess
from tests.spark.test_stateful_kills import _db_totals, _run

pytest.importorskip("pyspark")
# In a file of its own so that parallel test workers can run it beside its exactly_once sibling.
pytestmark = [pytest.mark.slow, pytest.mark.heavy, pytest.mark.timeout(480)]


def test_at_least_once_repeats_updates_under_the_same_faults(broker: BrokerProcess, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'totals.sqlite'}"
    updates, expected, batch1 = _run(broker, tmp_path, "at_least_once", kills=0, databases=[db])
    assert repeated_updates(updates) > 0, "a kill after the writes must replay the batch's updates"
    assert batch1[-1]["skipped"] == [], batch1
    assert latest_per_account(updates) == expected, "replays repeat updates but never change the final state"
    assert _db_totals(db) == expected, "the database sink records batch ids, so it stays exact"

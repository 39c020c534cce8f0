"""A group whose offsets all expired dies, and stays dead through a restart and a checkpoint.

In-process, with a manual clock (retention is minutes in the broker's config): the broker's own
``Coordination`` appends the records to ``__consumer_offsets`` and replays them, and a second
``Broker`` on the same data directory loads the log from disk, as a restarted process does.
"""

from __future__ import annotations

from pathlib import Path

from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.server.broker import Broker
from oncelog.server.config import BrokerConfig

RETENTION_MS = 60_000


def _broker(data: Path, clock: ManualClock) -> Broker:
    cfg = BrokerConfig(data_dir=data, offsets_retention_minutes=1, group_initial_rebalance_delay_ms=0,
                       offsets_topic_num_partitions=3)
    return Broker(cfg, clock)


def _commit(b: Broker, group: str, offset: int) -> None:
    c = b.coordination
    result = c.groups.offset_commit(group, -1, "", None, [("t", 0, offset, -1, None)])
    assert result.errors == {("t", 0): ErrorCode.none}
    c.apply_group_records(group, result.records)


def _listed(b: Broker) -> set[str]:
    return {g for g, _pt, _st in b.coordination.groups.list_groups()}


def test_expired_group_is_tombstoned_and_not_reloaded(tmp_path: Path) -> None:
    clock = ManualClock()
    b = _broker(tmp_path / "d", clock)
    try:
        b.logs.create_topic("t", 1, {})
        _commit(b, "old", 1)
        clock.advance(RETENTION_MS // 2)
        _commit(b, "young", 2)
        clock.advance(RETENTION_MS // 2 + 1)
        b.coordination.expire_offsets()
        assert _listed(b) == {"young"}
        # a checkpoint of every offsets partition keeps only the live group
        b.coordination.checkpoint_internal_logs(0)
        clock.advance(1)
    finally:
        b.close()
    b = _broker(tmp_path / "d", clock)
    try:
        assert _listed(b) == {"young"}
        assert b.coordination.groups.offset_fetch("old", [("t", 0)], False)[("t", 0)][0] is None
        clock.advance(RETENTION_MS)
        b.coordination.expire_offsets()
        assert _listed(b) == set()
    finally:
        b.close()
    b = _broker(tmp_path / "d", clock)
    try:
        assert _listed(b) == set()
    finally:
        b.close()

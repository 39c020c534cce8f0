"""Offset expiration and group death (Kafka's cleanupGroupMetadata).

Every retention check, for each group: tombstone the offsets that expired; if that leaves the group
with no offsets, no transaction holding offsets for it, and the group is Empty, write a group-metadata
tombstone. Replaying the tombstone moves the group to Dead and forgets it, so it leaves ListGroups,
DescribeGroups, OffsetFetch and every later checkpoint, and a restart (replaying the log) does not
bring it back. The clock an Empty consumer group's offsets expire by is the time it became Empty
(Kafka's currentStateTimestamp); a simple group's (no protocol type) is each offset's commit time.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.group_harness import GroupLog

RETENTION = 60_000


def _empty_consumer_group(h: GroupLog, group: str = "g") -> None:
    """A consumer group that commits offsets for t-0 and t-1, then its only member leaves."""
    a = h.join(group=group).value
    h.sync(a.member_id, 1, [(a.member_id, b"")], group=group)
    assert h.commit(a.member_id, 1, [("t", 0, 5), ("t", 1, 6)], group=group) == {
        ("t", 0): ErrorCode.none, ("t", 1): ErrorCode.none}
    h.leave([(a.member_id, None)], group=group)
    assert h.gc.groups[group].state is GroupState.EMPTY


def _listed(h: GroupLog) -> list[str]:
    return [g for g, _pt, _st in h.gc.list_groups()]


def test_empty_group_whose_offsets_all_expired_dies_and_stays_dead() -> None:
    h = GroupLog(retention_ms=RETENTION)
    _empty_consumer_group(h)
    h.clock.advance(RETENTION + 1)
    records = h.expire()
    assert set(records) == {(rec.offset_key("g", "t", 0), None), (rec.offset_key("g", "t", 1), None),
                            (rec.group_key("g"), None)}
    assert records[-1] == (rec.group_key("g"), None), "the group tombstone follows its offsets' tombstones"
    assert "g" not in _listed(h) and "g" not in h.gc.groups
    assert h.gc.describe_group("g")["group_state"] == "Dead"
    assert h.committed(("t", 0)) is None
    assert h.gc.snapshot_records(lambda gid: True) == []
    assert h.expire() == [], "a dead group is not tombstoned again"
    gc = h.restart()
    assert "g" not in gc.groups and gc.list_groups() == []
    assert gc.snapshot_records(lambda gid: True) == []


def test_simple_group_dies_when_its_offsets_expire() -> None:
    h = GroupLog(retention_ms=RETENTION)
    assert h.commit("", -1, [("t", 0, 1)], group="solo") == {("t", 0): ErrorCode.none}
    assert _listed(h) == ["solo"]
    h.clock.advance(RETENTION // 2)
    assert h.commit("", -1, [("t", 1, 2)], group="solo") == {("t", 1): ErrorCode.none}
    h.clock.advance(RETENTION // 2 + 1)
    # a simple group's offsets expire one by one, by their commit time
    assert h.expire() == [(rec.offset_key("solo", "t", 0), None)]
    assert _listed(h) == ["solo"] and h.committed(("t", 1), "solo") == 2
    h.clock.advance(RETENTION // 2)
    assert h.expire() == [(rec.offset_key("solo", "t", 1), None), (rec.group_key("solo"), None)]
    assert _listed(h) == []
    assert "solo" not in h.restart().groups


def test_empty_consumer_group_offsets_expire_by_the_time_it_became_empty() -> None:
    h = GroupLog(retention_ms=RETENTION)
    a = h.join().value
    h.sync(a.member_id, 1, [(a.member_id, b"")])
    h.commit(a.member_id, 1, [("t", 0, 5)])
    h.clock.advance(RETENTION)  # the member keeps heartbeating for a long time, then leaves
    assert h.heartbeat(a.member_id, 1) == ErrorCode.none
    h.leave([(a.member_id, None)])
    h.clock.advance(RETENTION - 1)
    assert h.expire() == [], "the offset is older than the retention, the group's emptiness is not"
    # the time it became Empty survives a restart (it is in the group-metadata record)
    h.restart()
    assert h.expire() == []
    h.clock.advance(2)
    assert (rec.group_key("g"), None) in h.expire()
    assert _listed(h) == []


def test_a_group_that_is_not_empty_keeps_its_offsets_and_lives() -> None:
    h = GroupLog(retention_ms=RETENTION)
    a = h.join().value
    h.sync(a.member_id, 1, [(a.member_id, b"")])
    h.commit(a.member_id, 1, [("t", 0, 5)])  # the member subscribes to "t" (see RANGE)
    h.clock.advance(RETENTION + 1)
    assert h.heartbeat(a.member_id, 1) == ErrorCode.none
    assert h.expire() == []
    assert _listed(h) == ["g"] and h.committed(("t", 0)) == 5


def test_stable_consumer_group_expires_offsets_of_topics_it_no_longer_subscribes_to() -> None:
    """KIP-496: a Stable consumer group's offsets of topics none of its members subscribes to expire
    by commit time; the group itself lives on."""
    h = GroupLog(retention_ms=RETENTION)
    a = h.join().value
    h.sync(a.member_id, 1, [(a.member_id, b"")])
    h.commit(a.member_id, 1, [("t", 0, 5), ("gone", 0, 7)])
    h.clock.advance(RETENTION + 1)
    assert h.heartbeat(a.member_id, 1) == ErrorCode.none
    assert h.expire() == [(rec.offset_key("g", "gone", 0), None)]
    assert _listed(h) == ["g"] and h.committed(("t", 0)) == 5


def test_empty_group_with_some_offsets_left_lives() -> None:
    h = GroupLog(retention_ms=RETENTION)
    assert h.commit("", -1, [("t", 0, 1)], group="solo") == {("t", 0): ErrorCode.none}
    h.clock.advance(RETENTION - 10)
    h.commit("", -1, [("t", 1, 1)], group="solo")
    h.clock.advance(11)
    assert h.expire() == [(rec.offset_key("solo", "t", 0), None)]
    assert _listed(h) == ["solo"]


def test_pending_transactional_offsets_keep_the_offset_and_the_group() -> None:
    """Kafka neither expires an offset with a pending transactional commit nor deletes a group that
    an open transaction holds offsets for: the marker would bring them back half-way."""
    h = GroupLog(retention_ms=RETENTION)
    assert h.commit("", -1, [("t", 0, 1)], group="solo") == {("t", 0): ErrorCode.none}
    assert h.txn_commit(7, "", -1, [("t", 0, 9)], group="solo") == {("t", 0): ErrorCode.none}
    h.clock.advance(RETENTION + 1)
    assert h.expire() == []
    assert _listed(h) == ["solo"]
    h.marker(7, commit=True)
    assert h.committed(("t", 0), "solo") == 9
    h.clock.advance(RETENTION + 1)
    assert (rec.group_key("solo"), None) in h.expire()
    assert _listed(h) == []


def test_a_group_only_pending_offsets_hold_is_not_deleted() -> None:
    h = GroupLog(retention_ms=RETENTION)
    _empty_consumer_group(h)
    h.txn_commit(8, "", -1, [("u", 0, 3)])
    h.clock.advance(RETENTION + 1)
    records = h.expire()
    assert (rec.group_key("g"), None) not in records and len(records) == 2
    assert _listed(h) == ["g"]
    h.marker(8, commit=False)
    assert h.expire() == [(rec.group_key("g"), None)]
    assert _listed(h) == []


def test_a_group_recreated_after_it_died_starts_over() -> None:
    h = GroupLog(retention_ms=RETENTION)
    _empty_consumer_group(h)
    h.clock.advance(RETENTION + 1)
    h.expire()
    a = h.join().value
    assert a.error == ErrorCode.none and a.generation_id == 1
    h.sync(a.member_id, 1, [(a.member_id, b"")])
    gc = h.restart()
    assert gc.groups["g"].generation_id == 1 and gc.offset_fetch("g", [("t", 0)], False)[("t", 0)][0] is None

"""KIP-345 static membership, as Apache Kafka's classic group coordinator does it.

A JoinGroup with an empty member id and a known ``group.instance.id`` replaces the instance's member
id; the replaced member id is fenced: every request it sends afterwards (JoinGroup, SyncGroup,
Heartbeat, OffsetCommit, TxnOffsetCommit, LeaveGroup) answers FENCED_INSTANCE_ID, and a JoinGroup or
SyncGroup it has parked is answered FENCED_INSTANCE_ID at once. In Stable, a replacement that leaves
the selected protocol unchanged keeps the generation and the assignment (no rebalance); otherwise,
and always in CompletingRebalance, it starts a rebalance.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.group_harness import RANGE_OTHER_META, ROUNDROBIN_FIRST, GroupLog

FENCED = ErrorCode.fenced_instance_id


def _stable_static(h: GroupLog, instance: str = "i-1", assignment: bytes = b"mine") -> str:
    a = h.join(instance=instance).value
    assert a.error == ErrorCode.none and a.generation_id == 1
    assert h.sync(a.member_id, 1, [(a.member_id, assignment)], instance=instance).value.error == ErrorCode.none
    return str(a.member_id)


def test_replaced_static_member_is_fenced_on_every_request() -> None:
    h = GroupLog()
    old = _stable_static(h)
    new = h.join(instance="i-1").value
    assert new.error == ErrorCode.none and new.member_id != old
    assert h.heartbeat(old, 1, "i-1") == FENCED
    assert h.sync(old, 1, instance="i-1").value.error == FENCED
    assert h.join(old, instance="i-1").value.error == FENCED
    assert h.commit(old, 1, [("t", 0, 5)], instance="i-1") == {("t", 0): FENCED}
    assert h.txn_commit(7, old, 1, [("t", 0, 5)], instance="i-1") == {("t", 0): FENCED}
    _top, results = h.leave([(old, "i-1")])
    assert results == [(old, "i-1", FENCED)]
    # none of that touched the replacement or the group
    g = h.gc.groups["g"]
    assert list(g.members) == [new.member_id] and g.state is GroupState.STABLE and g.generation_id == 1
    assert h.committed(("t", 0)) is None
    assert h.heartbeat(new.member_id, 1, "i-1") == ErrorCode.none
    assert h.commit(new.member_id, 1, [("t", 0, 9)], instance="i-1") == {("t", 0): ErrorCode.none}
    assert h.committed(("t", 0)) == 9


def test_unchanged_static_rejoin_in_stable_keeps_generation_assignment_and_leader_role() -> None:
    """Kafka answers the replacement with the current generation, no member list, and the leader as
    it was before the replacement, so the new instance acts as a follower and its SyncGroup returns
    the assignment the old instance had; the replacement becomes the leader for the next rebalance."""
    h = GroupLog()
    old = _stable_static(h, assignment=b"p0,p1")
    new = h.join(instance="i-1").value
    assert (new.error, new.generation_id, new.leader, new.members) == (ErrorCode.none, 1, old, [])
    assert h.gc.groups["g"].state is GroupState.STABLE
    assert h.sync(new.member_id, 1, instance="i-1").value.assignment == b"p0,p1"
    assert h.gc.groups["g"].leader_id == new.member_id
    # the replacement is persisted: a restart knows the new member id, and the old one stays fenced
    gc = h.restart()
    assert gc.heartbeat("g", 1, new.member_id, "i-1") == ErrorCode.none
    assert gc.heartbeat("g", 1, old, "i-1") == FENCED


def test_static_rejoin_with_new_metadata_but_same_selected_protocol_does_not_rebalance() -> None:
    h = GroupLog()
    _stable_static(h)
    new = h.join(instance="i-1", protocols=RANGE_OTHER_META).value
    assert new.error == ErrorCode.none and new.generation_id == 1
    assert h.gc.groups["g"].state is GroupState.STABLE


def test_static_rejoin_that_changes_the_selected_protocol_rebalances() -> None:
    h = GroupLog()
    old = _stable_static(h)
    new = h.join(instance="i-1", protocols=ROUNDROBIN_FIRST).value
    # alone in the group: the rebalance completes at once, with a new generation and protocol
    assert new.error == ErrorCode.none and new.generation_id == 2 and new.protocol_name == "roundrobin"
    assert h.heartbeat(old, 2, "i-1") == FENCED


def _leader_and_static_follower(h: GroupLog) -> tuple[str, str]:
    """A dynamic leader and a static follower (instance i-1), both having joined generation 2; the
    group is in CompletingRebalance and nobody has synced yet."""
    leader = h.join().value
    h.sync(leader.member_id, 1, [(leader.member_id, b"all")])
    s_box = h.join(instance="i-1")
    assert s_box.value is None  # parked until the leader rejoins
    assert h.join(leader.member_id).value.generation_id == 2
    assert s_box.value.generation_id == 2 and s_box.value.leader == leader.member_id
    assert h.gc.groups["g"].state is GroupState.COMPLETING_REBALANCE
    return str(leader.member_id), str(s_box.value.member_id)


def test_static_rejoin_fences_the_parked_join_of_the_old_member() -> None:
    h = GroupLog()
    leader, s = _leader_and_static_follower(h)
    h.sync(leader, 2, [(leader, b"p0"), (s, b"p1")])
    assert h.sync(s, 2, instance="i-1").value.assignment == b"p1"
    d = h.join()  # a third member: rebalance; s rejoins and parks (the leader has not rejoined)
    parked = h.join(s, instance="i-1")
    assert parked.value is None and d.value is None
    replacement = h.join(instance="i-1")
    assert parked.calls == 1 and parked.value.error == FENCED
    assert replacement.value is None  # parked too: the leader has not rejoined
    assert h.join(leader).value.generation_id == 3
    new_id = replacement.value.member_id
    assert replacement.value.generation_id == 3 and new_id != s
    assert set(h.gc.groups["g"].members) == {leader, new_id, d.value.member_id}
    assert h.heartbeat(s, 3, "i-1") == FENCED


def test_static_rejoin_during_completing_rebalance_fences_parked_sync_and_rebalances() -> None:
    """In CompletingRebalance the leader may already be computing an assignment naming the old member
    id, so Kafka always starts a new rebalance here."""
    h = GroupLog()
    leader, s = _leader_and_static_follower(h)
    parked = h.sync(s, 2, instance="i-1")
    assert parked.value is None  # waits for the leader's assignment
    replacement = h.join(instance="i-1")
    assert parked.calls == 1 and parked.value.error == FENCED
    g = h.gc.groups["g"]
    assert g.state is GroupState.PREPARING_REBALANCE and s not in g.members
    assert h.sync(leader, 2, [(leader, b"p0"), (s, b"p1")]).value.error == ErrorCode.rebalance_in_progress
    assert h.join(leader).value.generation_id == 3
    assert replacement.value is not None and replacement.value.generation_id == 3


def test_static_member_that_does_not_rejoin_stays_through_a_rebalance() -> None:
    """Kafka removes only dynamic members that missed the join phase; a static member keeps its
    place (and its metadata reaches the leader) until its session times out."""
    h = GroupLog()
    a = _stable_static(h)
    b_box = h.join(session=30_000)
    assert b_box.value is None
    for _ in range(3):  # a keeps its session (10 s) alive, but never rejoins
        h.clock.advance(5_000)
        assert h.heartbeat(a, 1, "i-1") == ErrorCode.rebalance_in_progress
        h.tick()
    assert b_box.value is None
    h.clock.advance(5_001)  # the rebalance timeout (20 s) passes
    h.tick()
    assert b_box.value is not None and b_box.value.error == ErrorCode.none and b_box.value.generation_id == 2
    assert a in h.gc.groups["g"].members and len(b_box.value.members) == 2
    # a comes back with its member id and is handed generation 2
    again = h.join(a, instance="i-1").value
    assert again.error == ErrorCode.none and again.generation_id == 2


def test_unknown_instance_id_is_an_unknown_member() -> None:
    h = GroupLog()
    a = _stable_static(h)
    assert h.heartbeat(a, 1, "i-other") == ErrorCode.unknown_member_id
    assert h.heartbeat("made-up", 1, "i-other") == ErrorCode.unknown_member_id
    assert h.heartbeat("made-up", 1, None) == ErrorCode.unknown_member_id


def test_leave_by_instance_id_alone_removes_the_static_member() -> None:
    h = GroupLog()
    _stable_static(h)
    new = h.join(instance="i-1").value
    _top, results = h.leave([("", "i-1")])
    assert results[0][2] == ErrorCode.none
    g = h.gc.groups["g"]
    assert g.state is GroupState.EMPTY and not g.members and not g.static_members
    assert h.heartbeat(new.member_id, 1, "i-1") == ErrorCode.unknown_member_id


def test_replacement_during_a_rebalance_survives_a_restart() -> None:
    """Found by the model test: mid-rebalance the log holds the last Stable generation, naming the old
    member id; a restart then brought the fenced id back. The replacement is logged at once."""
    h = GroupLog()
    leader, s = _leader_and_static_follower(h)
    h.sync(leader, 2, [(leader, b"p0"), (s, b"p1")])
    assert h.sync(s, 2, instance="i-1").value.assignment == b"p1"
    h.join()  # a third member: PreparingRebalance
    replacement = h.join(instance="i-1")
    assert replacement.value is None and h.gc.groups["g"].state is GroupState.PREPARING_REBALANCE
    new_id = h.gc.groups["g"].static_members["i-1"]
    gc = h.restart()
    assert gc.heartbeat("g", 2, s, "i-1") == FENCED
    assert gc.groups["g"].static_members["i-1"] == new_id
    assert gc.groups["g"].members[new_id].assignment == b"p1" and gc.groups["g"].generation_id == 2


def test_a_static_member_expires_at_its_session_deadline_and_the_group_can_be_deleted() -> None:
    """librdkafka's 0081_admin closes static consumers (no LeaveGroup), sleeps exactly the session
    timeout and deletes their groups: Kafka's DelayedHeartbeat expires a member at
    ``last heartbeat + session timeout``, so the group is Empty by then. The tick says when."""
    h = GroupLog()
    a = h.join(instance="i-1", session=6000).value
    h.sync(a.member_id, 1, [(a.member_id, b"p0")], instance="i-1")
    h.clock.advance(2000)
    assert h.heartbeat(a.member_id, 1, "i-1") == ErrorCode.none
    beat = h.clock.now_ms()
    h.tick()
    assert h.gc.next_timer_ms == beat + 6000  # the broker sleeps until then, not a fixed tick
    h.clock.set(beat + 5999)
    h.tick()
    assert list(h.gc.groups["g"].members) == [a.member_id]
    h.clock.set(beat + 6000)
    h.tick()
    g = h.gc.groups["g"]
    assert not g.members and g.state is GroupState.EMPTY
    errors, _records = h.gc.delete_groups(["g"])
    assert errors == {"g": ErrorCode.none}

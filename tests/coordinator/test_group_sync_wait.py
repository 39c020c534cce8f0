"""A member answered after waiting in SyncGroup has a full session from its answer.

A member parked in SyncGroup does not expire (it waits on the coordinator); Kafka's propagateAssignment
reschedules each answered member's heartbeat when it answers, with the assignment or with an error
(REBALANCE_IN_PROGRESS when a rebalance starts, a storage error). Before, the session still counted
from the member's SyncGroup, so a follower that waited for a slow leader longer than its session
timeout was removed by the next tick, its assignment just handed out, and the group rebalanced.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.group_harness import Box, GroupLog

SESSION = 10_000
REBALANCE = 60_000
E = ErrorCode
S = GroupState


def _waiting_follower() -> tuple[GroupLog, str, str, Box]:
    """``a`` leads generation 1, ``b`` has waited in SyncGroup for 15 s (longer than its session)
    while ``a`` heartbeats."""
    h = GroupLog(clock=ManualClock(1_700_000_000_000, monotonic_ms=5_000), delay_ms=3000)
    ja = h.join(session=SESSION, rebalance=REBALANCE)
    jb = h.join(session=SESSION, rebalance=REBALANCE)
    h.clock.advance(3000)
    h.tick()
    a, b = ja.value.member_id, jb.value.member_id
    parked = h.sync(b, 1)
    for _ in range(5):
        h.clock.advance(3000)
        assert h.heartbeat(a, 1) == E.none
        h.tick()
    assert parked.calls == 0 and set(h.gc.groups["g"].members) == {a, b}
    return h, a, b, parked


def test_a_follower_answered_its_assignment_keeps_its_session() -> None:
    h, a, b, parked = _waiting_follower()
    h.sync(a, 1, [(a, b"p0"), (b, b"p1")])
    assert parked.value.assignment == b"p1"
    h.tick()
    h.clock.advance(SESSION - 1)
    assert h.heartbeat(a, 1) == E.none
    h.tick()
    g = h.gc.groups["g"]
    assert set(g.members) == {a, b} and g.state is S.STABLE and g.generation_id == 1
    h.clock.advance(1)
    h.tick()
    assert set(g.members) == {a}, "a session after its answer, a silent follower goes"


def test_a_follower_sent_back_to_join_keeps_its_session() -> None:
    """A new member starts a rebalance: the waiting follower is answered REBALANCE_IN_PROGRESS and
    has a session timeout to rejoin, not none."""
    h, _a, b, parked = _waiting_follower()
    h.join(session=SESSION, rebalance=REBALANCE)
    assert parked.value.error == E.rebalance_in_progress
    h.tick()
    h.clock.advance(SESSION - 1)
    h.tick()
    g = h.gc.groups["g"]
    assert b in g.members and g.state is S.PREPARING_REBALANCE
    assert h.join(b, session=SESSION, rebalance=REBALANCE).calls == 0  # parked: waits for a to rejoin

"""Members that never send SyncGroup after a rebalance are removed after the rebalance timeout.

Kafka's GroupMetadataManager.schedulePendingSync: when a join phase completes, every member of the new
generation is pending sync (ClassicGroup.pendingSyncMembers) and a timer of the group's rebalance
timeout starts; a SyncGroup of the generation (CompletingRebalance or Stable) takes its sender off
the set. When the timer fires with the group still in that generation, CompletingRebalance or Stable,
expirePendingSync removes the members still pending, leader and followers alike, and rebalances.
Until then a pending-sync member's Heartbeat answers NONE (CompletingRebalance and Stable are normal
heartbeats in Kafka); afterwards a removed member gets UNKNOWN_MEMBER_ID, the others
REBALANCE_IN_PROGRESS (Heartbeat and parked SyncGroup alike), and rejoin. Before this, a leader that
heartbeated but never synced held its group in CompletingRebalance for good.

The timer runs on the monotonic clock: the clock has a monotonic origin far from the wall clock's, and
some tests step the wall clock on the way.
"""

from __future__ import annotations

import pytest
from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.group_harness import GroupLog

WALL = 1_700_000_000_000
MONO = 5_000
SESSION = 10_000
REBALANCE = 20_000
DELAY = 3000
HOUR = 3_600_000
DAY = 24 * HOUR
E = ErrorCode
S = GroupState


def _log() -> GroupLog:
    return GroupLog(clock=ManualClock(WALL, monotonic_ms=MONO), delay_ms=DELAY)


def _completed_pair(h: GroupLog, instances: tuple[str | None, str | None] = (None, None)) -> tuple[str, str, int]:
    """``a`` (leader) and ``b`` joined generation 1, now CompletingRebalance; returns the monotonic
    time the join phase completed."""
    ja = h.join(instance=instances[0], session=SESSION, rebalance=REBALANCE)
    jb = h.join(instance=instances[1], session=SESSION, rebalance=REBALANCE)
    h.clock.advance(DELAY)
    h.tick()
    assert ja.value.generation_id == jb.value.generation_id == 1
    assert ja.value.leader == ja.value.member_id
    assert h.gc.groups["g"].state is S.COMPLETING_REBALANCE
    return ja.value.member_id, jb.value.member_id, h.clock.monotonic_ms()


def _until(h: GroupLog, mono_ms: int, heartbeats: list[tuple[str, int, E]]) -> None:
    """Let time pass to ``mono_ms`` in steps of 3 s, each member of ``heartbeats`` heartbeating (and
    answered as given) at every step, a tick after each; the broker's timer would tick no later than
    ``next_timer_ms``, which must never lie past the next deadline."""
    while h.clock.monotonic_ms() < mono_ms:
        h.clock.advance(min(3000, mono_ms - h.clock.monotonic_ms()))
        for member, generation, expected in heartbeats:
            assert h.heartbeat(member, generation) == expected
        h.tick()


def _next_timer_mono(h: GroupLog) -> int:
    assert h.gc.next_timer_ms is not None
    return h.gc.next_timer_ms - h.clock.now_ms() + h.clock.monotonic_ms()


@pytest.mark.parametrize("step_ms", [0, -HOUR, DAY])
def test_a_leader_that_never_syncs_is_removed_and_the_follower_gets_its_assignment(step_ms: int) -> None:
    """The leader heartbeats every 3 s but never sends SyncGroup; the follower waits in SyncGroup.
    At the rebalance timeout (20 s after the join completed, whatever the wall clock does) the leader
    is removed, the follower's SyncGroup answers REBALANCE_IN_PROGRESS, and it rejoins, leads
    generation 2 alone and gets its assignment (before: CompletingRebalance for good)."""
    h = _log()
    a, b, completed = _completed_pair(h)
    parked = h.sync(b, 1)
    assert parked.calls == 0
    h.clock.step_wall(step_ms)
    _until(h, completed + REBALANCE - 1, [(a, 1, E.none)])
    g = h.gc.groups["g"]
    assert set(g.members) == {a, b} and g.state is S.COMPLETING_REBALANCE and parked.calls == 0
    assert _next_timer_mono(h) == completed + REBALANCE
    records = len(h.entries)
    h.clock.advance(1)
    h.tick()
    assert set(g.members) == {b} and g.leader_id == b and g.state is S.PREPARING_REBALANCE
    assert (parked.calls, parked.value.error) == (1, E.rebalance_in_progress)
    assert len(h.entries) == records, "a rebalance starting writes nothing"
    # what each party hears now
    assert h.heartbeat(a, 1) == E.unknown_member_id
    assert h.sync(a, 1, [(a, b"all")]).value.error == E.unknown_member_id
    assert h.heartbeat(b, 1) == E.rebalance_in_progress
    jb = h.join(b, session=SESSION, rebalance=REBALANCE).value
    assert (jb.error, jb.generation_id, jb.leader, [m for m, _i, _md in jb.members]) == (E.none, 2, b, [b])
    got = h.sync(b, 2, [(b, b"p0,p1")]).value
    assert (got.error, got.assignment) == (E.none, b"p0,p1")
    assert g.state is S.STABLE and g.generation_id == 2
    assert h.entries[-1][0] == rec.group_key("g")


@pytest.mark.parametrize("step_ms", [0, -HOUR, DAY])
def test_a_follower_that_never_syncs_is_removed_and_the_leader_rebalances(step_ms: int) -> None:
    """The leader syncs (the group is Stable), the follower heartbeats but never syncs: at the
    rebalance timeout the follower is removed and the group rebalances; the leader hears
    REBALANCE_IN_PROGRESS, rejoins and gets generation 2's assignment."""
    h = _log()
    a, b, completed = _completed_pair(h)
    h.clock.advance(1000)
    got = h.sync(a, 1, [(a, b"p0"), (b, b"p1")]).value
    assert (got.error, got.assignment) == (E.none, b"p0")
    g = h.gc.groups["g"]
    assert g.state is S.STABLE
    h.clock.step_wall(step_ms)
    _until(h, completed + REBALANCE - 1, [(a, 1, E.none), (b, 1, E.none)])
    assert set(g.members) == {a, b} and g.state is S.STABLE and g.generation_id == 1
    h.clock.advance(1)
    h.tick()
    assert set(g.members) == {a} and g.state is S.PREPARING_REBALANCE
    assert h.heartbeat(b, 1) == E.unknown_member_id
    assert h.heartbeat(a, 1) == E.rebalance_in_progress
    ja = h.join(a, session=SESSION, rebalance=REBALANCE).value
    assert (ja.error, ja.generation_id, ja.leader) == (E.none, 2, a)
    got = h.sync(a, 2, [(a, b"p0,p1")]).value
    assert (got.error, got.assignment) == (E.none, b"p0,p1") and g.state is S.STABLE
    # the removed follower joins again as a new member, as a client told UNKNOWN_MEMBER_ID does
    assert h.join(b, session=SESSION, rebalance=REBALANCE).value.error == E.unknown_member_id


def test_static_members_that_never_sync_are_removed_too() -> None:
    """Static members are no exception (Kafka's expirePendingSync removes every pending member): the
    instance id is freed, so the instance's next request is UNKNOWN_MEMBER_ID."""
    h = _log()
    a, b, completed = _completed_pair(h, ("i-a", "i-b"))
    h.sync(a, 1, [(a, b"p0"), (b, b"p1")], instance="i-a")
    _until(h, completed + REBALANCE - 1, [(a, 1, E.none), (b, 1, E.none)])
    _until(h, completed + REBALANCE, [])
    g = h.gc.groups["g"]
    assert set(g.members) == {a} and g.static_members == {"i-a": a} and g.state is S.PREPARING_REBALANCE
    assert h.gc.heartbeat("g", 1, b, "i-b") == E.unknown_member_id


def test_members_that_sync_in_time_are_unaffected() -> None:
    """Both sync before the rebalance timeout (the follower 1 ms before it, in Stable): nothing
    happens at the deadline or later, no rebalance and no record."""
    h = _log()
    a, b, completed = _completed_pair(h)
    h.clock.advance(5000)
    h.sync(a, 1, [(a, b"p0"), (b, b"p1")])
    _until(h, completed + REBALANCE - 1, [(a, 1, E.none), (b, 1, E.none)])
    got = h.sync(b, 1).value
    assert (got.error, got.assignment) == (E.none, b"p1")
    records = len(h.entries)
    _until(h, completed + 3 * REBALANCE, [(a, 1, E.none), (b, 1, E.none)])
    g = h.gc.groups["g"]
    assert set(g.members) == {a, b} and g.state is S.STABLE and g.generation_id == 1
    assert len(h.entries) == records


def test_the_timer_belongs_to_its_generation() -> None:
    """A new member starts a rebalance 5 s into generation 1's wait: generation 1's deadline is
    cancelled (Kafka's removeSyncExpiration) and generation 2 gets a full rebalance timeout from
    its own completion, so members that sync 18 s into generation 2 (past generation 1's deadline)
    stay, and one that still has not synced 20 s into it goes."""
    h = _log()
    a, b, completed = _completed_pair(h)
    h.clock.advance(5000)
    jc = h.join(session=SESSION, rebalance=REBALANCE)
    g = h.gc.groups["g"]
    assert g.state is S.PREPARING_REBALANCE
    ja = h.join(a, session=SESSION, rebalance=REBALANCE)
    jb = h.join(b, session=SESSION, rebalance=REBALANCE)
    assert ja.value.generation_id == jb.value.generation_id == jc.value.generation_id == 2
    second = h.clock.monotonic_ms()
    c = jc.value.member_id
    _until(h, completed + REBALANCE + 1000, [(a, 2, E.none), (b, 2, E.none), (c, 2, E.none)])
    assert set(g.members) == {a, b, c} and g.state is S.COMPLETING_REBALANCE
    _until(h, second + 18_000, [(a, 2, E.none), (b, 2, E.none), (c, 2, E.none)])
    h.sync(b, 2)
    h.sync(a, 2, [(a, b"p0"), (b, b"p1"), (c, b"p2")])
    assert g.state is S.STABLE
    _until(h, second + REBALANCE - 1, [(a, 2, E.none), (b, 2, E.none), (c, 2, E.none)])
    assert set(g.members) == {a, b, c}
    _until(h, second + REBALANCE, [])
    assert set(g.members) == {a, b} and g.state is S.PREPARING_REBALANCE


def test_a_lone_member_that_never_syncs_leaves_an_empty_group() -> None:
    """The only member never syncs: it is removed, the join phase completes with nobody, and the
    group is Empty in generation 2, logged as Kafka logs it."""
    h = _log()
    ja = h.join(session=SESSION, rebalance=REBALANCE)
    h.clock.advance(DELAY)
    h.tick()
    a, completed = ja.value.member_id, h.clock.monotonic_ms()
    _until(h, completed + REBALANCE, [(a, 1, E.none)])
    g = h.gc.groups["g"]
    assert not g.members and g.state is S.EMPTY and g.generation_id == 2
    assert h.entries[-1][0] == rec.group_key("g")
    restarted = h.restart().groups["g"]
    assert restarted.state is S.EMPTY and restarted.generation_id == 2


def test_a_replaced_static_member_counts_as_not_synced() -> None:
    """Kafka's replaceStaticMember leaves the old member id in the pending-sync set and a SyncGroup of
    the replacement does not take it off, so a static member replaced in Stable before it synced
    still makes the group rebalance at the deadline; nobody is removed (the old id is gone already)."""
    h = _log()
    a, b, completed = _completed_pair(h, (None, "i-b"))
    h.sync(a, 1, [(a, b"p0"), (b, b"p1")])
    b2 = h.join(instance="i-b", session=SESSION, rebalance=REBALANCE).value
    assert (b2.error, b2.generation_id) == (E.none, 1)
    got = h.gc.groups["g"]
    assert got.state is S.STABLE
    assert h.sync(b2.member_id, 1, instance="i-b").value.assignment == b"p1"
    _until(h, completed + REBALANCE - 1, [(a, 1, E.none), (b2.member_id, 1, E.none)])
    assert got.state is S.STABLE
    _until(h, completed + REBALANCE, [])
    assert set(got.members) == {a, b2.member_id} and got.state is S.PREPARING_REBALANCE


def test_a_restart_starts_no_pending_sync_timer() -> None:
    """The timer lives in memory, as Kafka's: a group loaded Stable has nobody pending sync, so a
    follower that never synced before the restart (and heartbeats after it) stays."""
    h = _log()
    a, b, completed = _completed_pair(h)
    h.sync(a, 1, [(a, b"p0"), (b, b"p1")])
    h.restart()
    _until(h, completed + 3 * REBALANCE, [(a, 1, E.none), (b, 1, E.none)])
    g = h.gc.groups["g"]
    assert set(g.members) == {a, b} and g.state is S.STABLE

"""The group coordinator's timers run on the monotonic clock; a wall-clock step moves none of them.

Kafka schedules a classic member's session (rescheduleClassicGroupMemberHeartbeat), a pending member
id, the initial rebalance delay and the join deadline on its timer wheel, which runs on
``Time.hiResClockMs`` (monotonic): NTP or an operator stepping the wall clock back does not keep a
dead consumer's partitions assigned, and stepping it forward does not expire every live member. What
Kafka records as wall-clock time stays wall-clock time here too: a group's state timestamp (logged;
offset retention of an Empty group counts from it) and commit timestamps, which expire against the
wall clock (Kafka's cleanupGroupMetadata uses ``time.milliseconds``).

Every test here gives the clock a monotonic origin far from the wall clock's, so a deadline computed
from one reading and compared with the other cannot pass by accident.
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
SESSION = 6000
HOUR = 3_600_000
DAY = 24 * HOUR
DELAY = 3000  # group.initial.rebalance.delay.ms


def _log() -> GroupLog:
    return GroupLog(clock=ManualClock(WALL, monotonic_ms=MONO), delay_ms=DELAY)


def _stable_pair(h: GroupLog, instances: tuple[str | None, str | None] = (None, None)) -> tuple[str, str]:
    """Two members, ``a`` the leader, Stable in generation 1."""
    ja = h.join(instance=instances[0], session=SESSION)
    jb = h.join(instance=instances[1], session=SESSION)
    h.clock.advance(DELAY)
    h.tick()
    a, b = ja.value.member_id, jb.value.member_id
    assert ja.value.generation_id == jb.value.generation_id == 1
    h.sync(b, 1, instance=instances[1])
    assert h.sync(a, 1, [(a, b"p0"), (b, b"p1")], instance=instances[0]).value.error == ErrorCode.none
    assert h.gc.groups["g"].state is GroupState.STABLE
    return a, b


def test_manual_clock_steps_the_wall_clock_alone() -> None:
    c = ManualClock(WALL, monotonic_ms=MONO)
    c.advance(10)
    assert (c.now_ms(), c.monotonic_ms()) == (WALL + 10, MONO + 10)
    c.step_wall(-HOUR)
    assert (c.now_ms(), c.monotonic_ms()) == (WALL + 10 - HOUR, MONO + 10)
    c.set(WALL + 110 - HOUR)
    assert (c.now_ms(), c.monotonic_ms()) == (WALL + 110 - HOUR, MONO + 110)
    c.set(WALL)  # forward by the hour: time passing
    assert (c.now_ms(), c.monotonic_ms()) == (WALL, MONO + HOUR)
    assert ManualClock(WALL).monotonic_ms() == WALL


@pytest.mark.parametrize("step_ms", [-90_000, -HOUR, DAY])
@pytest.mark.parametrize("static", [False, True])
def test_dead_member_expires_after_a_session_of_monotonic_time(step_ms: int, static: bool) -> None:
    """``a`` stops heartbeating, ``b`` goes on every 2 s; the wall clock is stepped by ``step_ms``
    1 s after ``a``'s last heartbeat. ``a`` leaves the group exactly a session timeout after that
    heartbeat, as without a step (before: 89 s late after a 90 s step back; at once after a day
    forward, together with ``b``)."""
    h = _log()
    a, b = _stable_pair(h, ("i-a", "i-b") if static else (None, None))
    inst_b = "i-b" if static else None
    last_a = h.clock.monotonic_ms()
    h.clock.advance(1000)
    h.clock.step_wall(step_ms)
    h.tick()
    for _ in range(2):
        h.clock.advance(2000)
        assert h.heartbeat(b, 1, inst_b) == ErrorCode.none
        h.tick()
    h.clock.advance(SESSION - 1 - (h.clock.monotonic_ms() - last_a))
    h.tick()
    g = h.gc.groups["g"]
    assert set(g.members) == {a, b} and g.state is GroupState.STABLE, "a is not dead a ms early"
    h.clock.advance(1)
    h.tick()
    assert set(g.members) == {b} and g.state is GroupState.PREPARING_REBALANCE
    if static:
        assert g.static_members == {"i-b": b}
    # b rejoins and the group is Stable without a
    jb = h.join(b, instance=inst_b, session=SESSION).value
    assert (jb.error, jb.generation_id, jb.leader) == (ErrorCode.none, 2, b)


@pytest.mark.parametrize("step_ms", [DAY, -DAY])
def test_live_members_survive_a_wall_clock_step(step_ms: int) -> None:
    """Heartbeating members stay, with no rebalance and no record, whichever way the wall clock
    jumps (before: a day forward expired every member and rebalanced the group)."""
    h = _log()
    a, b = _stable_pair(h)
    h.clock.advance(2000)
    h.heartbeat(a, 1)
    h.heartbeat(b, 1)
    h.clock.step_wall(step_ms)
    records_before = len(h.entries)
    for _ in range(10):
        h.tick()
        assert h.heartbeat(a, 1) == ErrorCode.none and h.heartbeat(b, 1) == ErrorCode.none
        h.clock.advance(SESSION - 1)
    g = h.gc.groups["g"]
    assert set(g.members) == {a, b} and g.state is GroupState.STABLE and g.generation_id == 1
    assert len(h.entries) == records_before


@pytest.mark.parametrize("step_ms", [-HOUR, DAY])
def test_rebalance_deadline_is_monotonic(step_ms: int) -> None:
    """A rebalance ends at its rebalance timeout of monotonic time: ``b`` never rejoins (but keeps
    its session alive), so the join completes without it then; not an hour late after a step back,
    and not at once after a step forward."""
    h = _log()
    a, b = _stable_pair(h)
    pending = h.join(a, session=SESSION, rebalance=20_000)  # the leader asks for a rebalance
    assert pending.calls == 0 and h.gc.groups["g"].state is GroupState.PREPARING_REBALANCE
    h.clock.step_wall(step_ms)
    h.tick()
    for _ in range(9):  # 18 s, heartbeating (REBALANCE_IN_PROGRESS) without rejoining
        h.clock.advance(2000)
        assert h.heartbeat(b, 1) == ErrorCode.rebalance_in_progress
        h.tick()
    h.clock.advance(1999)
    h.tick()
    assert pending.calls == 0 and set(h.gc.groups["g"].members) == {a, b}
    h.clock.advance(1)
    h.tick()
    assert pending.calls == 1 and pending.value.generation_id == 2 and pending.value.error == ErrorCode.none
    g = h.gc.groups["g"]
    assert set(g.members) == {a} and g.state is GroupState.COMPLETING_REBALANCE


@pytest.mark.parametrize("step_ms", [-HOUR, DAY])
def test_initial_rebalance_delay_and_pending_member_are_monotonic(step_ms: int) -> None:
    """A new group waits ``group.initial.rebalance.delay.ms`` of monotonic time for more members, and
    a member id handed out with MEMBER_ID_REQUIRED is kept a session timeout of monotonic time."""
    h = _log()
    first = h.join(session=SESSION)
    assert first.calls == 0
    required = h.join(session=SESSION, require_known=True).value
    assert required.error == ErrorCode.member_id_required
    h.clock.step_wall(step_ms)
    h.tick()
    h.clock.advance(2999)
    h.tick()
    g = h.gc.groups["g"]
    assert first.calls == 0 and g.state is GroupState.PREPARING_REBALANCE
    assert required.member_id in g.pending_members
    h.clock.advance(SESSION - 2999 - 1)
    h.tick()
    assert required.member_id in g.pending_members
    h.clock.advance(1)
    h.tick()
    assert required.member_id not in g.pending_members
    # with the pending member gone and the initial delay over, the join completes at this tick
    assert first.calls == 1 and first.value.generation_id == 1 and g.state is GroupState.COMPLETING_REBALANCE


def test_next_timer_is_in_wall_clock_terms_after_a_step() -> None:
    """The broker sleeps ``next_timer_ms - clock.now_ms()`` after a tick: that is the monotonic time
    to the next deadline, whatever the wall clock did."""
    h = _log()
    a, _b = _stable_pair(h)
    h.clock.step_wall(-HOUR)
    h.tick()
    assert h.gc.next_timer_ms is not None and h.gc.next_timer_ms - h.clock.now_ms() == SESSION
    h.clock.advance(1000)
    h.clock.step_wall(DAY)
    h.heartbeat(a, 1)
    h.tick()
    assert h.gc.next_timer_ms - h.clock.now_ms() == SESSION - 1000  # b's session, the nearer one


def test_state_timestamp_and_offset_retention_stay_on_the_wall_clock() -> None:
    """Kafka records a group's state timestamp and a commit's timestamp with the wall clock and
    expires offsets against it; so do we (no change from before)."""
    h = GroupLog(clock=ManualClock(WALL, monotonic_ms=MONO), retention_ms=DAY)
    a = h.join(session=SESSION).value  # no initial delay: answered at once
    h.sync(a.member_id, 1, [(a.member_id, b"")])
    assert h.commit(a.member_id, 1, [("t", 0, 5)]) == {("t", 0): ErrorCode.none}
    assert h.gc.offsets["g"][("t", 0)].commit_timestamp_ms == WALL
    h.clock.step_wall(-HOUR)
    h.leave([(a.member_id, None)])
    g = h.gc.groups["g"]
    assert g.state is GroupState.EMPTY and g.state_timestamp_ms == WALL - HOUR
    assert h.expire() == []
    h.clock.step_wall(DAY)  # the wall clock says the group has been Empty for a day: its offsets expire
    assert (rec.offset_key("g", "t", 0), None) in h.expire()

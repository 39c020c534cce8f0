"""The group timer visits only the groups that are due or changed (issue 14: it used to visit every
member of every group every 100 ms). Differential test: hypothesis drives two coordinators through
the same JoinGroup / SyncGroup / Heartbeat / OffsetCommit / LeaveGroup / clock / tick / restart
sequence over several groups; the reference has every group marked before each of its ticks (the
old full scan). After every step both must hold the same groups, members, deadlines, answers and
log, and the deadline a tick returns may be earlier than the full scan's (a heartbeat moved one
later without a visit) but never later, and never None while one is ahead.
"""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from oncelog.clock import ManualClock
from oncelog.coordinator.group.group_state import GroupMetadata
from tests.coordinator.group_harness import RANGE, RANGE_OTHER_META, Box, GroupLog

GROUPS = ["a", "b"]
INSTANCES = [None, None, "i-1", "i-2"]


def _counting_ids(log: GroupLog) -> None:
    """Member ids from a per-coordinator counter, so that both sides name members alike."""
    counter = itertools.count()
    def new_member_id(client_id: str, group_instance_id: str | None) -> str:
        return f"{group_instance_id or client_id}-{next(counter)}"

    log.gc.membership._new_member_id = new_member_id  # type: ignore[method-assign]


def _image(log: GroupLog) -> Any:
    out = {}
    for gid, g in sorted(log.gc.membership.groups.items()):
        out[gid] = (g.state, g.generation_id, g.leader_id, g.protocol_name, dict(g.pending_members),
                    g.initial_delay_until_ms if g.members else None, g.rebalance_deadline_ms,
                    sorted(g.pending_sync_members), g.pending_sync_deadline_ms if g.pending_sync_members else None,
                    {mid: (m.last_heartbeat_ms, m.session_timeout_ms, m.awaiting_join is None,
                           m.awaiting_sync is None, m.assignment) for mid, m in g.members.items()})
    return out


class TimerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.logs = (GroupLog(clock=self.clock, delay_ms=300), GroupLog(clock=self.clock, delay_ms=300))
        for log in self.logs:
            _counting_ids(log)
        self.boxes: tuple[list[Box], list[Box]] = ([], [])
        self.answers: tuple[list[Any], list[Any]] = ([], [])

    @property
    def fast(self) -> GroupLog:
        return self.logs[0]

    @property
    def ref(self) -> GroupLog:
        return self.logs[1]

    def _members(self) -> list[tuple[str, str, int]]:
        return [(gid, mid, g.generation_id) for gid, g in sorted(self.ref.gc.membership.groups.items())
                for mid in sorted(g.members) + sorted(g.pending_members)]

    def _both(self, call: Any) -> None:
        for i, log in enumerate(self.logs):
            box = Box()
            self.boxes[i].append(box)
            self.answers[i].append(call(log, box))

    @initialize(timeouts=st.lists(st.tuples(st.sampled_from([6_000, 10_000]), st.sampled_from([6_000, 30_000])),
                                  min_size=2 * len(GROUPS), max_size=2 * len(GROUPS)))
    def stable_groups(self, timeouts: list[tuple[int, int]]) -> None:
        """Every group starts Stable with two members (random session and rebalance timeouts), so
        that runs start where the rarer paths (a leave or an expiry out of Stable) begin."""
        for i, group in enumerate(GROUPS):
            for session, rebalance in timeouts[2 * i:2 * i + 2]:
                self.join_new(group, None, False, session, rebalance)
        self.clock.advance(300)
        for group in GROUPS:
            self.members_settle(group, True)
            self.members_settle(group, True)

    @rule(group=st.sampled_from(GROUPS), instance=st.sampled_from(INSTANCES), require_known=st.booleans(),
          session=st.sampled_from([6_000, 10_000]), rebalance=st.sampled_from([6_000, 30_000]))
    def join_new(self, group: str, instance: str | None, require_known: bool, session: int, rebalance: int) -> None:
        self._both(lambda log, box: log.gc.join_group(group, "", instance, "c", "/h", session, rebalance,
                                                      "consumer", RANGE, require_known, box))

    @rule(data=st.data(), changed=st.booleans())
    def rejoin(self, data: st.DataObject, changed: bool) -> None:
        members = self._members()
        if members:
            gid, mid, _gen = data.draw(st.sampled_from(members))
            instance = self.ref.gc.membership.groups[gid].members.get(mid)
            iid = instance.group_instance_id if instance is not None else None
            protocols = RANGE_OTHER_META if changed else RANGE
            self._both(lambda log, box: log.gc.join_group(gid, mid, iid, "c", "/h", 10_000, 30_000, "consumer",
                                                          protocols, False, box))

    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        members = self._members()
        if members:
            gid, mid, gen = data.draw(st.sampled_from(members))
            given = [(m, m.encode()) for m in sorted(self.ref.gc.membership.groups[gid].members)]
            self._both(lambda log, box: log.gc.sync_group(gid, gen, mid, None, given, box))

    @rule(group=st.sampled_from(GROUPS), sync=st.booleans())
    def members_settle(self, group: str, sync: bool) -> None:
        """What live clients do between polls: every member rejoins a rebalance under way, then (if
        ``sync``) every member of a completed join sends SyncGroup (the leader with an assignment),
        with ticks between. Gets groups to Stable often enough for the rarer paths (a leave or an
        expiry out of Stable); without ``sync``, to the pending-sync deadline."""
        g = self.ref.gc.membership.groups.get(group)
        if g is None:
            return
        for mid, m in sorted(g.members.items()):
            if m.awaiting_join is None and g.state.name == "PREPARING_REBALANCE":
                self._both(lambda log, box, mid=mid, m=m: log.gc.join_group(
                    group, mid, m.group_instance_id, "c", "/h", m.session_timeout_ms, m.rebalance_timeout_ms,
                    "consumer", RANGE, False, box))
        self.tick()
        if sync and g.state.name == "COMPLETING_REBALANCE":
            given = [(m, m.encode()) for m in sorted(g.members)]
            for mid in sorted(g.members, key=lambda mid: mid != g.leader_id):
                self._both(lambda log, box, mid=mid, gen=g.generation_id: log.gc.sync_group(
                    group, gen, mid, None, given, box))

    @rule(data=st.data(), commit=st.booleans())
    def heartbeat(self, data: st.DataObject, commit: bool) -> None:
        members = self._members()
        if members:
            gid, mid, gen = data.draw(st.sampled_from(members))
            if commit:
                self._both(lambda log, box: log.commit(mid, gen, [("t", 0, 1)], group=gid))
            else:
                self._both(lambda log, box: log.gc.heartbeat(gid, gen, mid, None))

    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        members = self._members()
        if members:
            gid, mid, _gen = data.draw(st.sampled_from(members))
            self._both(lambda log, box: log.gc.leave_group(gid, [(mid, None)]))

    @rule(ms=st.sampled_from([1, 99, 300, 2_000, 5_999, 6_000, 9_000, 31_000]))
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule(late=st.sampled_from([0, 1]))
    def to_the_next_deadline(self, late: int) -> None:
        """Jump to the earliest deadline any group holds (computed here from the reference's state,
        not asked of the code under test), or just past it, and tick there."""
        now = self.clock.now_ms()
        ahead: list[int] = []
        for g in self.ref.gc.membership.groups.values():
            ahead += g.pending_members.values()
            ahead += [m.last_heartbeat_ms + m.session_timeout_ms for m in g.members.values()
                      if m.awaiting_join is None and m.awaiting_sync is None]
            if g.state.name == "PREPARING_REBALANCE":
                ahead += [g.initial_delay_until_ms, g.rebalance_deadline_ms]
            if g.state.name in ("COMPLETING_REBALANCE", "STABLE") and g.pending_sync_members:
                ahead.append(g.pending_sync_deadline_ms)
        ahead = [t for t in ahead if t > now]
        if ahead:
            self.clock.set(min(ahead) + late)
            self.tick()

    @rule()
    def tick(self) -> None:
        fast = self.fast.gc.tick()
        self.ref.gc.membership._touched.update(self.ref.gc.membership.groups)
        ref = self.ref.gc.tick()
        self.fast.apply(fast)
        self.ref.apply(ref)
        f, r = self.fast.gc.next_timer_ms, self.ref.gc.next_timer_ms
        if r is not None:
            assert f is not None and f <= r, (f, r)

    @rule()
    def restart(self) -> None:
        for log in self.logs:
            log.restart()
            _counting_ids(log)

    @invariant()
    def same(self) -> None:
        for log in self.logs:
            log.flush()
        assert _image(self.fast) == _image(self.ref)
        assert [(b.calls, repr(b.value)) for b in self.boxes[0]] == [(b.calls, repr(b.value)) for b in self.boxes[1]]
        assert repr(self.answers[0]) == repr(self.answers[1])
        assert self.fast.entries == self.ref.entries


TestGroupTimers = TimerModel.TestCase
TestGroupTimers.settings = settings(max_examples=200, stateful_step_count=60, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


def test_a_tick_with_nothing_due_visits_no_group() -> None:
    """1,000 groups of a stable member each: after they are scheduled, a tick before any deadline
    visits none of them (the full scan visited all 1,000 every 100 ms)."""
    log = GroupLog(delay_ms=0)
    for i in range(1000):
        box = log.join(group=f"g{i}")
        log.sync(box.value.member_id, box.value.generation_id, group=f"g{i}")
    log.tick()
    visited: list[str] = []
    inner = log.gc.membership._tick_group

    def counting(g: GroupMetadata, now: int) -> int | None:
        visited.append(g.group_id)
        return inner(g, now)

    log.gc.membership._tick_group = counting  # type: ignore[method-assign]
    log.clock.advance(100)
    log.tick()
    assert visited == []
    log.clock.advance(10_000)  # every session deadline passes without a heartbeat
    log.tick()
    assert len(visited) == 1000
    assert all(not g.members for g in log.gc.membership.groups.values())


def test_a_leave_out_of_stable_brings_the_rebalance_deadline_nearer() -> None:
    """LeaveGroup starts a rebalance whose deadline (6 s) comes before the remaining member's
    session deadline (10 s): at the rebalance deadline the member that did not rejoin is removed,
    so the group must be visited then, not at the session deadline scheduled before the leave."""
    log = GroupLog(delay_ms=0)
    a = log.join(session=10_000, rebalance=6_000)
    b = log.join(session=10_000, rebalance=6_000)
    log.join(member=a.value.member_id, session=10_000, rebalance=6_000)
    log.tick()
    g = log.gc.membership.groups["g"]
    for box in (a, b):
        log.sync(box.value.member_id, g.generation_id)
    log.tick()
    assert g.state.name == "STABLE"
    log.leave([(b.value.member_id, None)])
    log.clock.advance(6_500)
    log.tick()
    assert g.state.name == "EMPTY" and not g.members

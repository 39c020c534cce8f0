"""A model-based test of classic-group membership: hypothesis drives random client processes
(dynamic and static, fresh starts and restarts of static instances, zombies that keep using a
replaced member id) through JoinGroup, SyncGroup, Heartbeat, OffsetCommit, TxnOffsetCommit,
LeaveGroup, the timers (a manual clock) and coordinator restarts (replay of the log), and checks
after every step:

- no two live processes own the same partition: a process owns what its last SyncGroup gave it, and
  is live while its member id belongs to the group at the generation that SyncGroup was for (it could
  commit offsets); the leader assigns round-robin over the members it was given;
- a replaced static member id is fenced: every request it sends fails, with FENCED_INSTANCE_ID while
  its instance id is in the group, and changes nothing (no membership change, no record);
- an OffsetCommit is accepted only from a member of the current generation, never from a zombie;
- pending sync (Kafka's expirePendingSync): once a generation's rebalance timeout has passed since its
  join phase completed, the group is no longer in that generation's CompletingRebalance or Stable
  unless every member the leader was given has sent SyncGroup of it (processes stuck between
  JoinGroup and SyncGroup while heartbeating are a rule of their own); a restart forgets the debt;
- the generation only grows while the coordinator runs, and the logged generation never goes back
  (a restart reloads the last logged one);
- the group's own invariants: the leader is a member, the static map points at members carrying that
  instance id, no member id is both a member and pending, every callback is answered at most once.

``ONCELOG_GROUP_MODEL_EXAMPLES`` raises the number of runs (e.g. 2000 for a long fuzz).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from kio.schema.errors import ErrorCode

from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_state import GroupState
from tests.coordinator.group_harness import RANGE, RANGE_OTHER_META, Box, GroupLog

PARTITIONS = 4
INSTANCES = ["i-1", "i-2"]
SESSION_MS = 10_000
REBALANCE_MS = 15_000
FENCED = ErrorCode.fenced_instance_id
E = ErrorCode


def _encode(parts: frozenset[int]) -> bytes:
    return json.dumps(sorted(parts)).encode()


def _decode(data: bytes) -> frozenset[int]:
    return frozenset(json.loads(data)) if data else frozenset()


@dataclass
class Process:
    """One client process (a consumer instance): what it believes about its membership."""

    name: str
    instance: str | None
    member_id: str = ""
    generation: int = -1
    leader_members: list[str] | None = None  # set when the last JoinGroup made it the leader
    join_box: Box | None = None
    sync_box: Box | None = None
    owned: tuple[int, frozenset[int]] | None = None  # (generation, partitions) from SyncGroup
    answered: list[Box] = field(default_factory=list)
    stopped: bool = False  # told FENCED_INSTANCE_ID: fatal for a real client


class MembershipModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = GroupLog(delay_ms=0)
        self.procs: list[Process] = []
        self.fenced: dict[str, str] = {}  # replaced member id -> its instance id
        self.max_generation = 0  # since the last restart
        self.max_logged_generation = 0
        self.scanned = 0  # log entries checked by generation_only_grows
        self.n = 0
        # generation -> (monotonic time its join phase completed, the members its leader was given),
        # from the leader's JoinGroup answer; and the (generation, member id) SyncGroups sent
        self.generations: dict[int, tuple[int, frozenset[str]]] = {}
        self.synced: set[tuple[int, str]] = set()

    # --- helpers ------------------------------------------------------------------------------------
    @property
    def group(self) -> Any:
        return self.h.gc.groups.get("g")

    def _snapshot(self) -> Any:
        g = self.group
        if g is None:
            return None
        return (g.state, g.generation_id, g.leader_id, dict(g.static_members), sorted(g.members),
                sorted(g.pending_members), {m: x.assignment for m, x in g.members.items()})

    def _settle(self) -> None:
        """Deliver answers of parked requests to their processes (as the network would)."""
        for p in self.procs:
            if p.join_box is not None and p.join_box.value is not None:
                box, p.join_box = p.join_box, None
                p.answered.append(box)
                r = box.value
                if r.error == E.none:
                    p.member_id, p.generation = r.member_id, r.generation_id
                    p.leader_members = [m for m, _i, _md in r.members] if r.leader == r.member_id else None
                    p.owned = None
                    if p.leader_members:
                        self.generations.setdefault(
                            r.generation_id, (self.h.clock.monotonic_ms(), frozenset(p.leader_members)))
                else:
                    self._on_error(p, r.error)
            if p.sync_box is not None and p.sync_box.value is not None:
                box, p.sync_box = p.sync_box, None
                p.answered.append(box)
                r = box.value
                if r.error == E.none:
                    p.owned = (p.generation, _decode(r.assignment))
                else:
                    self._on_error(p, r.error)

    def _on_error(self, p: Process, error: ErrorCode) -> None:
        p.owned = None  # every error revokes what the client owns
        if error == FENCED:
            p.stopped = True  # librdkafka raises a fatal error; the process keeps its id as a zombie
        elif error == E.unknown_member_id:
            p.member_id, p.generation, p.leader_members = "", -1, None

    def _live(self, p: Process) -> bool:
        g = self.group
        return (g is not None and p.owned is not None and p.member_id in g.members
                and p.owned[0] == g.generation_id)

    # --- rules: processes ---------------------------------------------------------------------------
    @initialize()
    def start_two(self) -> None:
        self.start_process(None, False)
        self.start_process("i-1", False)

    @rule(instance=st.sampled_from([None, *INSTANCES]), require_known=st.booleans())
    def start_process(self, instance: str | None, require_known: bool) -> None:
        """A new process joins with an empty member id; with a known instance id it replaces (fences)
        the instance's current member."""
        g = self.group
        replaced = g.static_members.get(instance) if g is not None and instance else None
        if replaced is not None:
            event(f"static replacement in {g.state.value}")
        self.n += 1
        p = Process(f"p{self.n}", instance)
        self.procs.append(p)
        p.join_box = self.h.join(instance=instance, require_known=require_known, session=SESSION_MS,
                                 rebalance=REBALANCE_MS)
        if replaced is not None:
            assert self.group.static_members.get(instance) != replaced
            self.fenced[replaced] = instance  # type: ignore[index]
        if p.join_box.value is not None and p.join_box.value.error == E.member_id_required:
            p.answered.append(p.join_box)
            p.member_id = p.join_box.value.member_id
            p.join_box = self.h.join(p.member_id, instance, session=SESSION_MS, rebalance=REBALANCE_MS)
        self._settle()

    def _idle_with_id(self) -> list[Process]:
        return [p for p in self.procs if p.member_id and p.join_box is None and p.sync_box is None
                and p.member_id not in self.fenced and not p.stopped]

    def _assignments(self, p: Process) -> list[tuple[str, bytes]]:
        if not p.leader_members:
            return []
        members = sorted(p.leader_members)
        parts: dict[str, set[int]] = {m: set() for m in members}
        for i in range(PARTITIONS):
            parts[members[i % len(members)]].add(i)
        return [(m, _encode(frozenset(ps))) for m, ps in parts.items()]

    @rule(rounds=st.integers(1, 3))
    def clients_poll(self, rounds: int) -> None:
        """Every well-behaved process does what librdkafka's poll loop would: heartbeat, rejoin when
        told to, sync after a join, join again after losing its member id."""
        for _ in range(rounds):
            for p in sorted(self.procs, key=lambda p: p.leader_members is None):  # leaders sync first
                if p.stopped or p.join_box is not None or p.sync_box is not None or p.member_id in self.fenced:
                    continue
                if not p.member_id:
                    p.join_box = self.h.join(instance=p.instance, session=SESSION_MS, rebalance=REBALANCE_MS)
                elif p.generation >= 0 and p.owned is None:
                    self.synced.add((p.generation, p.member_id))
                    p.sync_box = self.h.sync(p.member_id, p.generation, self._assignments(p), instance=p.instance)
                else:
                    code = self.h.heartbeat(p.member_id, p.generation, p.instance)
                    if code in (E.rebalance_in_progress, E.illegal_generation):
                        p.owned = None
                        p.join_box = self.h.join(p.member_id, p.instance, session=SESSION_MS,
                                                 rebalance=REBALANCE_MS)
                    elif code != E.none:
                        self._on_error(p, code)
                self._settle()

    @precondition(lambda self: self._idle_with_id())
    @rule(data=st.data(), change=st.booleans())
    def rejoin(self, data: st.DataObject, change: bool) -> None:
        p = data.draw(st.sampled_from(self._idle_with_id()))
        p.owned = None  # a client revokes before it rejoins (eager protocol)
        p.join_box = self.h.join(p.member_id, p.instance, protocols=RANGE_OTHER_META if change else RANGE,
                                 session=SESSION_MS, rebalance=REBALANCE_MS)
        self._settle()

    @precondition(lambda self: [p for p in self._idle_with_id() if p.generation >= 0])
    @rule(data=st.data())
    def sync(self, data: st.DataObject) -> None:
        p = data.draw(st.sampled_from([p for p in self._idle_with_id() if p.generation >= 0]))
        self.synced.add((p.generation, p.member_id))
        p.sync_box = self.h.sync(p.member_id, p.generation, self._assignments(p), instance=p.instance)
        self._settle()

    @precondition(lambda self: self._idle_with_id())
    @rule(data=st.data())
    def heartbeat(self, data: st.DataObject) -> None:
        p = data.draw(st.sampled_from(self._idle_with_id()))
        code = self.h.heartbeat(p.member_id, p.generation, p.instance)
        if code != E.none:
            self._on_error(p, code)

    @precondition(lambda self: self._idle_with_id())
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        p = data.draw(st.sampled_from(self._idle_with_id()))
        g = self.group
        current = g is not None and p.member_id in g.members and g.generation_id == p.generation \
            and g.state is not GroupState.COMPLETING_REBALANCE
        # generation -1 outside any live membership: Kafka's "simple" (admin) commit
        simple = p.generation < 0 and (g is None or g.state is GroupState.EMPTY)
        errors = self.h.commit(p.member_id, p.generation, [("t", 0, self.n)], instance=p.instance)
        if errors[("t", 0)] == E.none:
            assert current or simple, "commit from a non-member accepted"
        else:
            self._on_error(p, errors[("t", 0)])

    @precondition(lambda self: self._idle_with_id())
    @rule(data=st.data())
    def leave(self, data: st.DataObject) -> None:
        p = data.draw(st.sampled_from(self._idle_with_id()))
        self.h.leave([(p.member_id, p.instance)])
        self.procs.remove(p)
        self._settle()

    @precondition(lambda self: [p for p in self.procs if p.member_id in self.fenced])
    @rule(data=st.data(), kind=st.sampled_from(["join", "sync", "heartbeat", "commit", "txn", "leave"]))
    def zombie_request(self, data: st.DataObject, kind: str) -> None:
        """A process whose member id was replaced keeps talking: it must be refused and change nothing."""
        p = data.draw(st.sampled_from([p for p in self.procs if p.member_id in self.fenced]))
        instance = self.fenced[p.member_id]
        g = self.group
        expected = FENCED if g is not None and instance in g.static_members else E.unknown_member_id
        before, n_entries = self._snapshot(), len(self.h.entries)
        gen = max(p.generation, 0)
        if kind == "join":
            code = self.h.join(p.member_id, instance, session=SESSION_MS, rebalance=REBALANCE_MS).value.error
        elif kind == "sync":
            code = self.h.sync(p.member_id, gen, [(p.member_id, _encode(frozenset(range(PARTITIONS))))],
                               instance=instance).value.error
        elif kind == "heartbeat":
            code = self.h.heartbeat(p.member_id, gen, instance)
        elif kind == "commit":
            code = self.h.commit(p.member_id, gen, [("t", 0, 1)], instance=instance)[("t", 0)]
        elif kind == "txn":
            code = self.h.txn_commit(99, p.member_id, gen, [("t", 0, 1)], instance=instance)[("t", 0)]
        else:
            code = self.h.leave([(p.member_id, instance)])[1][0][2]
        event(f"zombie {kind}: {code.name}")
        if g is None:
            assert code != E.none
        else:
            assert code == expected, (kind, code, expected)
        assert self._snapshot() == before and len(self.h.entries) == n_entries, f"a fenced {kind} changed the group"

    # --- rules: time and the coordinator ------------------------------------------------------------
    @rule(ms=st.sampled_from([100, 3_000, 6_000, 11_000, 16_000]))
    def time_passes(self, ms: int) -> None:
        self.h.clock.advance(ms)
        self.h.tick()
        self._settle()

    @rule(rounds=st.integers(1, 4))
    def stuck_between_join_and_sync(self, rounds: int) -> None:
        """``rounds`` times, every process with a member id heartbeats and none syncs or rejoins (a
        client stuck in its assignor, say), then 5 s pass: 4 rounds outlast the rebalance timeout
        with no session expiring."""
        for _ in range(rounds):
            for p in self._idle_with_id():
                code = self.h.heartbeat(p.member_id, p.generation, p.instance)
                if code != E.none:
                    self._on_error(p, code)
            self.time_passes(5_000)

    @rule()
    def coordinator_restart(self) -> None:
        """kill -9 and reload from the log: parked requests are lost (their connections closed), and
        the loaded generation owes no SyncGroup."""
        self.generations.clear()
        for p in self.procs:
            p.join_box = p.sync_box = None
        self.h.restart()
        self.max_generation = self.group.generation_id if self.group is not None else 0

    # --- invariants ---------------------------------------------------------------------------------
    @invariant()
    def no_partition_has_two_live_owners(self) -> None:
        event(f"live owners: {sum(1 for p in self.procs if self._live(p))}")
        seen: dict[int, str] = {}
        for p in self.procs:
            if self._live(p):
                assert p.owned is not None
                for part in p.owned[1]:
                    assert part not in seen, f"partition {part} owned by {seen[part]} and {p.name}"
                    seen[part] = p.name

    @invariant()
    def generation_only_grows(self) -> None:
        g = self.group
        if g is None:
            return
        assert g.generation_id >= self.max_generation
        self.max_generation = g.generation_id
        new, self.scanned = self.h.entries[self.scanned:], len(self.h.entries)
        for key, value, *_ in [e for e in new if e[0] != "marker"]:
            if key == rec.group_key("g") and value is not None:
                generation = json.loads(value)["generation"]  # type: ignore[arg-type]
                assert generation >= self.max_logged_generation
                self.max_logged_generation = generation

    @invariant()
    def no_sync_owed_past_the_rebalance_timeout(self) -> None:
        g = self.group
        if g is None or g.state not in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE):
            return
        completed, members = self.generations.get(g.generation_id, (None, frozenset()))
        if completed is None or self.h.clock.monotonic_ms() < completed + REBALANCE_MS:
            return
        owing = {m for m in members if (g.generation_id, m) not in self.synced}
        assert not owing, f"generation {g.generation_id} still {g.state.value} with {owing} owing a SyncGroup"

    @invariant()
    def group_structure(self) -> None:
        g = self.group
        if g is None:
            return
        if g.members:
            assert g.leader_id in g.members
        else:
            assert g.state in (GroupState.EMPTY, GroupState.PREPARING_REBALANCE)
        for instance, mid in g.static_members.items():
            assert mid in g.members and g.members[mid].group_instance_id == instance
        assert not set(g.members) & set(g.pending_members)
        if g.pending_sync_members:  # owed only in CompletingRebalance and Stable, by the generation's members
            assert g.state in (GroupState.COMPLETING_REBALANCE, GroupState.STABLE)
            _completed, members = self.generations.get(g.generation_id, (0, g.pending_sync_members))
            assert g.pending_sync_members <= members
        assert not set(g.members) & set(self.fenced), "a fenced member id is back in the group"
        for p in self.procs:
            for box in p.answered + [b for b in (p.join_box, p.sync_box) if b is not None]:
                assert box.calls <= 1


MembershipModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("ONCELOG_GROUP_MODEL_EXAMPLES", "100")), stateful_step_count=40,
    deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestMembershipModel = MembershipModel.TestCase

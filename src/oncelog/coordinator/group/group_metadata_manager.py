"""Membership of classic groups (Kafka's GroupMetadataManager, classic part): JoinGroup, SyncGroup,
Heartbeat, LeaveGroup, the rebalance state machine and its timers.

Sans-IO: methods take plain values, time comes from the injected clock. JoinGroup and SyncGroup
answer when the rebalance gets there, so they take a ``respond`` callback (the server's resolves a
future); every callback is called at most once.

Two clocks, as in Kafka. Every timer (a member's session, ``last_heartbeat_ms + session_timeout_ms``;
a pending member id's expiry; a rebalance's initial delay and deadline; the pending-sync deadline)
runs on the monotonic clock, ``clock.monotonic_ms()``, as Kafka's run on its timer wheel
(``SystemTimer``, on ``hiResClockMs``): a wall-clock step (NTP, an operator, a VM resumed) neither
keeps a dead member in its group nor expires live ones. These readings live in memory only and are
compared only with each other; inside this module ``now`` is always one. A group's
``state_timestamp_ms`` is wall-clock time (``clock.now_ms()``, Kafka's ``currentStateTimestamp``
from ``time.milliseconds()``): it is logged with the group and offset retention counts from it,
against the wall clock, as Kafka's does.

Membership lives in memory, as in Kafka (whose classic-group records are appended without being
replayed at runtime): a rebalance is a conversation with parked requests and timers, not durable
state. Its durable image is the group-metadata record, written when a rebalance completes (Stable),
when the group becomes Empty and when a static member is replaced, and buffered for ``take_records``;
the log therefore always holds the last Stable (or Empty) generation, never one still rebalancing.
``replay_group`` keeps the newest logged value per group (``logged``, what a checkpoint must keep)
and, while loading, rebuilds the group from it; a group tombstone always removes the group (that is
how a group dies: DeleteGroups and offset expiration only return the tombstone, replaying it is the
change).

Pending sync (Kafka's ``schedulePendingSync`` / ``expirePendingSync``): when a join phase completes
with members, all of them owe a SyncGroup of the new generation (``pending_sync_members``), by the
group's rebalance timeout from then (``pending_sync_deadline_ms``). A SyncGroup of the generation in
CompletingRebalance or Stable pays the debt; a rebalance starting cancels it. At the deadline, still
in that generation and in CompletingRebalance or Stable, the members still owing are removed (leader
and followers, static or not) and the group rebalances: a client that joins and heartbeats but never
syncs cannot hold its group in CompletingRebalance, nor keep a share of the partitions unassigned in
Stable. Nothing of it is logged (Kafka's neither): a loaded group owes nothing.

Invariants (see also ``group_state``): ``generation_id`` only grows while a group lives; a member id
is in ``members`` or in ``pending_members``, never both; ``static_members`` maps each instance id to
exactly one member of ``members``; a group in CompletingRebalance or Stable with a member of the
generation's join phase that has not sent SyncGroup of it leaves that state at the generation's
pending-sync deadline.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.clock import Clock
from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_state import PENDING_SYNC_STATES, GroupMetadata, GroupState, MemberMetadata

G = GroupState
Record = tuple[bytes, bytes | None]


#: Characters of the client id (or group instance id) a generated member id starts with.
MEMBER_ID_PREFIX_MAX = 255


@dataclass
class JoinResult:
    error: ErrorCode
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    member_id: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)


@dataclass
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


#: Kafka's default ``message.max.bytes``, which bounds a group's record in ``__consumer_offsets``.
DEFAULT_GROUP_MAX_RECORD_BYTES = 1024 * 1024 + 12


def _inconsistent(requested: str | None, current: str | None) -> bool:
    """Kafka's isProtocolInconsistent: a protocol type or name the request gives and the group has
    (both non-null) must be equal."""
    return requested is not None and current is not None and requested != current


def stored_group_bytes(g: GroupMetadata, assignments: dict[str, bytes]) -> int:
    """The size of ``g``'s record with ``assignments``, as Kafka's GroupMetadata value (v3) counts it:
    per member its ids, client id and host, the chosen protocol's metadata and its assignment. Our
    own record (JSON, every protocol's metadata) may differ; the limit is Kafka's."""
    size = 64 + len(g.protocol_type or "") + len(g.protocol_name or "") + len(g.leader_id or "")
    for m in g.members.values():
        chosen = next((d for n, d in m.protocols if n == g.protocol_name), b"")
        size += (32 + len(m.member_id) + len(m.group_instance_id or "") + len(m.client_id) + len(m.client_host)
                 + len(chosen) + len(assignments.get(m.member_id, b"")))
    return size


class GroupMetadataManager:
    def __init__(self, clock: Clock, *, group_min_session_timeout_ms: int = 6000,
                 group_max_session_timeout_ms: int = 1_800_000,
                 group_initial_rebalance_delay_ms: int = 3000,
                 group_max_record_bytes: int = DEFAULT_GROUP_MAX_RECORD_BYTES,
                 store_refused: Callable[[str, int], bool] = lambda group_id, size: False,
                 group_max_count: int = 2**63 - 1) -> None:
        """``group_max_record_bytes``: the most a group's record may take with its assignment (the
        offsets topic's ``max.message.bytes`` in Kafka); a leader's SyncGroup past it is refused.

        ``group_max_count``: the most groups kept. A request that would make one more (a JoinGroup,
        or an offset commit, for a group not known) gets COORDINATOR_NOT_AVAILABLE, retriable,
        while the groups known are at it: a client committing to group after group cannot grow the
        coordinator for the week offsets are kept, and no known group's offsets are ever dropped
        for room (unlike producer state, a group's offsets are a consumer's position). Room comes
        back as groups are deleted or expire. Replay never refuses.

        ``store_refused(group_id, size)``: whether a record of ``size`` bytes for the group may not be
        stored now (the server's: it would eat into ``log_dir_min_free_bytes``); a leader's SyncGroup
        whose record it refuses is answered NOT_COORDINATOR, as Kafka answers a storage error."""
        self.clock = clock
        self.max_record_bytes = group_max_record_bytes
        self.max_groups = group_max_count
        self.groups_refused = 0  # requests refused for want of room for a new group, since start
        self.store_refused = store_refused
        self.min_session_ms = group_min_session_timeout_ms
        self.max_session_ms = group_max_session_timeout_ms
        self.initial_rebalance_delay_ms = group_initial_rebalance_delay_ms
        self.groups: dict[str, GroupMetadata] = {}
        # The newest group-metadata record value per group, as written to the log (membership in
        # memory may be mid-rebalance and is not what a restart would load).
        self.logged: dict[str, bytes] = {}
        self.loading = False
        self._records: list[Record] = []
        # Group timers (see ``tick``): a heap of (deadline, group id), where an entry counts only
        # while ``_scheduled`` holds the same deadline for that group, and the groups changed since
        # the last tick.
        self._timers: list[tuple[int, str]] = []
        self._scheduled: dict[str, int] = {}
        self._touched: set[str] = set()

    # --- records ------------------------------------------------------------------------------------
    def _emit_group(self, g: GroupMetadata) -> None:
        self._records.append((rec.group_key(g.group_id), rec.group_value(g)))

    def take_records(self) -> list[Record]:
        """Group-metadata records produced by membership changes since the last call."""
        out, self._records = self._records, []
        return out

    @staticmethod
    def tombstone(group_id: str) -> Record:
        return rec.group_key(group_id), None

    @staticmethod
    def _new_member_id(client_id: str, group_instance_id: str | None) -> str:
        # Kafka's clientId-UUID, with the prefix cut short: a client id or instance id may be 32,767
        # bytes, and a member id longer than that cannot be written in a legacy response string.
        return f"{(group_instance_id or client_id or 'member')[:MEMBER_ID_PREFIX_MAX]}-{uuid.uuid4()}"

    # --- JoinGroup ----------------------------------------------------------------------------------
    def join_group(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                   client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_member_id: bool,
                   respond: Callable[[JoinResult], None]) -> None:
        """Kafka's classic JoinGroup. An empty member id joins anew: a known ``group_instance_id``
        replaces (fences) the instance's current member, a dynamic member may first be told
        MEMBER_ID_REQUIRED. A member id must belong to the group (and to the instance id, if one is
        given: else FENCED_INSTANCE_ID). ``respond`` is called once, now or when the join phase ends."""
        now = self.clock.monotonic_ms()
        if not group_id:
            return respond(JoinResult(ErrorCode.invalid_group_id, member_id=member_id))
        self._touch(group_id)
        if not self.min_session_ms <= session_timeout_ms <= self.max_session_ms:
            return respond(JoinResult(ErrorCode.invalid_session_timeout, member_id=member_id))
        rebalance_timeout_ms = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms
        protocols = list(protocols)
        g = self.groups.get(group_id)
        if g is None:
            if member_id:
                return respond(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
            if self.no_room_for_a_group():
                return respond(JoinResult(ErrorCode.coordinator_not_available, member_id=member_id))
            g = GroupMetadata(group_id, state_timestamp_ms=self.clock.now_ms())
            if not g.supports_protocols(protocol_type, protocols):
                return respond(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id))
            self.groups[group_id] = g
        elif not g.supports_protocols(protocol_type, protocols):
            return respond(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id))
        new = MemberMetadata("", group_instance_id, client_id, client_host, session_timeout_ms,
                             rebalance_timeout_ms, protocol_type, protocols)

        if not member_id:
            new.member_id = self._new_member_id(client_id, group_instance_id)
            if group_instance_id and group_instance_id in g.static_members:
                return self._replace_static_member(g, new, respond, now)
            if require_known_member_id and not group_instance_id:
                g.pending_members[new.member_id] = now + session_timeout_ms
                return respond(JoinResult(ErrorCode.member_id_required, member_id=new.member_id))
            return self._add_member(g, new, respond, now)
        if member_id in g.pending_members:
            del g.pending_members[member_id]
            if group_instance_id and group_instance_id in g.static_members:
                return respond(JoinResult(ErrorCode.fenced_instance_id, member_id=member_id))
            new.member_id = member_id
            return self._add_member(g, new, respond, now)

        error = g.validate_member(member_id, group_instance_id)
        if error != ErrorCode.none:
            return respond(JoinResult(error, member_id=member_id))
        m = g.members[member_id]
        m.last_heartbeat_ms = now
        same = m.protocols == protocols
        if g.state is G.PREPARING_REBALANCE:
            self._update_member(m, new, respond)
            return self._maybe_complete_join(g, now)
        if same and (g.state is G.COMPLETING_REBALANCE or (g.state is G.STABLE and member_id != g.leader_id)):
            # It lost the response, or a follower rejoins unchanged: the current generation again.
            return respond(self._join_result(g, m))
        if g.state in (G.COMPLETING_REBALANCE, G.STABLE):
            # changed metadata, or the leader asks for a rebalance (e.g. its topics changed)
            self._update_member(m, new, respond)
            return self._rebalance(g, now)
        return respond(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))

    @staticmethod
    def _update_member(m: MemberMetadata, new: MemberMetadata, respond: Callable[[JoinResult], None]) -> None:
        m.protocols = new.protocols
        m.session_timeout_ms, m.rebalance_timeout_ms = new.session_timeout_ms, new.rebalance_timeout_ms
        m.awaiting_join = respond

    def _add_member(self, g: GroupMetadata, m: MemberMetadata, respond: Callable[[JoinResult], None],
                    now: int) -> None:
        if not g.members:
            g.protocol_type = m.protocol_type
        g.members[m.member_id] = m
        if m.group_instance_id:
            g.static_members[m.group_instance_id] = m.member_id
        if g.leader_id is None:
            g.leader_id = m.member_id
        m.last_heartbeat_ms = now
        m.awaiting_join = respond
        self._rebalance(g, now)

    def _replace_static_member(self, g: GroupMetadata, new: MemberMetadata,
                               respond: Callable[[JoinResult], None], now: int) -> None:
        """KIP-345: a JoinGroup with an empty member id and a known instance id takes over the
        instance. The old member id leaves the group at once (whatever it has parked is answered
        FENCED_INSTANCE_ID, and so is every later request it sends); the new member keeps the old
        one's assignment and, if it was the leader, the leadership.

        Kafka's rules for the generation: in Stable, if the group's selected protocol stays the same,
        no rebalance: the group-metadata record is rewritten with the new member id, and the new
        member gets the current generation, no member list, and the leader as it was (so a replaced
        leader comes back as a follower and its SyncGroup returns the kept assignment). If the
        selected protocol would change, or the group is in CompletingRebalance (the leader may be
        assigning to the old member id), a rebalance starts; in PreparingRebalance the new member
        joins the rebalance under way.
        """
        assert new.group_instance_id is not None
        old_id = g.static_members[new.group_instance_id]
        old = g.members.pop(old_id)
        if old.awaiting_join is not None:
            old.awaiting_join(JoinResult(ErrorCode.fenced_instance_id, member_id=old_id))
            old.awaiting_join = None
        if old.awaiting_sync is not None:
            old.awaiting_sync(SyncResult(ErrorCode.fenced_instance_id))
            old.awaiting_sync = None
        previous_leader = g.leader_id
        new.assignment = old.assignment
        new.last_heartbeat_ms = now
        g.members[new.member_id] = new
        g.static_members[new.group_instance_id] = new.member_id
        if g.leader_id == old_id:
            g.leader_id = new.member_id
        if g.state is G.STABLE and g.select_protocol() == g.protocol_name:
            self._emit_group(g)
            return respond(JoinResult(ErrorCode.none, g.generation_id, g.protocol_type, g.protocol_name,
                                      previous_leader or "", new.member_id, []))
        # Mid-rebalance the group's image in the log is the last Stable generation. If it names the
        # old member id, log it again with the new one (same generation and assignment): a
        # restart before this rebalance completes must not bring the fenced member id back.
        logged = self.logged.get(g.group_id)
        rewritten = rec.with_member_replaced(logged, old_id, new.member_id) if logged is not None else None
        if rewritten is not None:
            self._records.append((rec.group_key(g.group_id), rewritten))
        new.awaiting_join = respond
        self._rebalance(g, now)

    def _join_result(self, g: GroupMetadata, m: MemberMetadata) -> JoinResult:
        members = []
        if m.member_id == g.leader_id:
            members = [(x.member_id, x.group_instance_id, x.metadata_for(g.protocol_name or ""))
                       for x in g.members.values()]
        return JoinResult(ErrorCode.none, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id or "",
                          m.member_id, members)

    def _rebalance(self, g: GroupMetadata, now: int) -> None:
        """Start a rebalance unless one is under way, then complete the join phase if it can."""
        if g.state in (G.EMPTY, G.STABLE, G.COMPLETING_REBALANCE):
            self._prepare_rebalance(g, now)
        self._maybe_complete_join(g, now)

    def _prepare_rebalance(self, g: GroupMetadata, now: int,
                           sync_error: ErrorCode = ErrorCode.rebalance_in_progress) -> None:
        self._cancel_pending_sync(g)
        if g.state is G.COMPLETING_REBALANCE:
            # The leader's assignment for this generation will never be used: forget the old one
            # and send the members waiting in SyncGroup back to JoinGroup, with ``sync_error``,
            # each with a full session to do it (Kafka's propagateAssignment).
            for m in g.members.values():
                m.assignment = b""
                if m.awaiting_sync is not None:
                    callback, m.awaiting_sync = m.awaiting_sync, None
                    m.last_heartbeat_ms = now
                    callback(SyncResult(sync_error))
        if g.state is G.EMPTY:
            g.initial_delay_until_ms = now + self.initial_rebalance_delay_ms
        g.transition_to(G.PREPARING_REBALANCE, self.clock.now_ms())
        g.rebalance_deadline_ms = now + g.rebalance_timeout_ms()

    def _maybe_complete_join(self, g: GroupMetadata, now: int) -> None:
        """Kafka's completeClassicGroupJoin, once every member rejoined (after the initial delay for a
        new group) or at the rebalance deadline: dynamic members that did not rejoin are removed,
        static ones stay (their session timeout decides); with nobody rejoined the deadline moves on."""
        if g.state is not G.PREPARING_REBALANCE:
            return
        all_joined = all(m.awaiting_join is not None for m in g.members.values()) and not g.pending_members
        if all_joined and now < g.initial_delay_until_ms and now < g.rebalance_deadline_ms:
            return  # new group: wait a little for more members (group.initial.rebalance.delay.ms)
        if not all_joined and now < g.rebalance_deadline_ms:
            return
        for mid in [mid for mid, m in g.members.items() if m.awaiting_join is None and not m.group_instance_id]:
            self._remove_member(g, mid)
        g.pending_members.clear()
        joined = [m.member_id for m in g.members.values() if m.awaiting_join is not None]
        if g.members and not joined:
            g.rebalance_deadline_ms = now + g.rebalance_timeout_ms()
            return
        g.generation_id += 1
        self._cancel_pending_sync(g)
        if not g.members:
            g.protocol_name = None
            g.leader_id = None
            g.transition_to(G.EMPTY, self.clock.now_ms())
            self._emit_group(g)
            return
        if g.leader_id not in joined:
            g.leader_id = joined[0]
        g.protocol_name = g.select_protocol()
        g.transition_to(G.COMPLETING_REBALANCE, self.clock.now_ms())
        g.pending_sync_members = set(g.members)  # Kafka's addPendingSyncMember, then schedulePendingSync
        g.pending_sync_deadline_ms = now + g.rebalance_timeout_ms()
        for m in g.members.values():
            callback, m.awaiting_join = m.awaiting_join, None
            m.last_heartbeat_ms = now
            if callback is not None:
                callback(self._join_result(g, m))

    @staticmethod
    def _cancel_pending_sync(g: GroupMetadata) -> None:
        """Kafka's removeSyncExpiration (a rebalance starts) and initNextGeneration's clear."""
        g.pending_sync_members.clear()
        g.pending_sync_deadline_ms = 0

    @staticmethod
    def _synced(g: GroupMetadata, member_id: str) -> None:
        """Kafka's removePendingSyncMember: the member sent SyncGroup of the current generation; the
        deadline is cancelled once nobody owes one."""
        g.pending_sync_members.discard(member_id)
        if not g.pending_sync_members:
            g.pending_sync_deadline_ms = 0

    def _remove_member(self, g: GroupMetadata, member_id: str) -> None:
        g.pending_sync_members.discard(member_id)
        m = g.members.pop(member_id, None)
        if m is None:
            return
        if m.group_instance_id and g.static_members.get(m.group_instance_id) == member_id:
            del g.static_members[m.group_instance_id]
        if m.awaiting_join is not None:
            callback, m.awaiting_join = m.awaiting_join, None
            callback(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
        if m.awaiting_sync is not None:
            sync_callback, m.awaiting_sync = m.awaiting_sync, None
            sync_callback(SyncResult(ErrorCode.unknown_member_id))
        if g.leader_id == member_id:
            g.leader_id = next(iter(g.members), None)

    # --- SyncGroup ----------------------------------------------------------------------------------
    def sync_group(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   assignments: list[tuple[str, bytes]], respond: Callable[[SyncResult], None],
                   protocol_type: str | None = None, protocol_name: str | None = None) -> None:
        """Kafka's classic SyncGroup: member (and instance), then generation, then the protocol type
        and name (SyncGroup v5+; INCONSISTENT_GROUP_PROTOCOL when one is given, the group has one and
        they differ: Kafka's isProtocolInconsistent), then state. The leader's SyncGroup in
        CompletingRebalance sets every member's assignment and makes the group Stable."""
        now = self.clock.monotonic_ms()
        self._touch(group_id)
        g = self.groups.get(group_id)
        if g is None:
            return respond(SyncResult(ErrorCode.unknown_member_id))
        error = g.validate_member(member_id, group_instance_id)
        if error != ErrorCode.none:
            return respond(SyncResult(error))
        if generation_id != g.generation_id:
            return respond(SyncResult(ErrorCode.illegal_generation))
        if _inconsistent(protocol_type, g.protocol_type) or _inconsistent(protocol_name, g.protocol_name):
            return respond(SyncResult(ErrorCode.inconsistent_group_protocol))
        m = g.members[member_id]
        m.last_heartbeat_ms = now
        if g.state is G.PREPARING_REBALANCE:
            return respond(SyncResult(ErrorCode.rebalance_in_progress))
        self._synced(g, member_id)
        if g.state is G.STABLE:
            return respond(SyncResult(ErrorCode.none, g.protocol_type, g.protocol_name, m.assignment))
        m.awaiting_sync = respond
        if member_id == g.leader_id:
            given = dict(assignments)
            # Kafka's storeGroup fails: every member waiting in SyncGroup gets the error and the group
            # rebalances; nothing is stored. RECORD_LIST_TOO_LARGE gives UNKNOWN_SERVER_ERROR, a
            # storage error (here: the record would eat into the disk space kept) NOT_COORDINATOR.
            if stored_group_bytes(g, given) > self.max_record_bytes:
                return self._prepare_rebalance(g, now, sync_error=ErrorCode.unknown_server_error)
            size = len(rec.group_key(g.group_id)) + len(rec.group_value(g, given))
            if self.store_refused(g.group_id, size):
                return self._prepare_rebalance(g, now, sync_error=ErrorCode.not_coordinator)
            for x in g.members.values():
                x.assignment = given.get(x.member_id, b"")
            g.transition_to(G.STABLE, self.clock.now_ms())
            for x in g.members.values():
                callback, x.awaiting_sync = x.awaiting_sync, None
                if callback is not None:
                    # Its session counts from its answer (Kafka's propagateAssignment reschedules
                    # the heartbeat): waiting for the leader is not silence.
                    x.last_heartbeat_ms = now
                    callback(SyncResult(ErrorCode.none, g.protocol_type, g.protocol_name, x.assignment))
            self._emit_group(g)

    # --- Heartbeat / LeaveGroup ---------------------------------------------------------------------
    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        """Kafka's classic Heartbeat: member (and instance), then generation, then state. Only a
        heartbeat of the current generation counts as liveness, in PreparingRebalance too (where it
        answers REBALANCE_IN_PROGRESS): a stale one answers ILLEGAL_GENERATION and changes nothing. In
        CompletingRebalance and Stable it answers NONE, to a member that owes a SyncGroup too (Kafka's
        answer: the client learns of the debt only when the pending-sync deadline removes it, then
        UNKNOWN_MEMBER_ID, and the others REBALANCE_IN_PROGRESS)."""
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.unknown_member_id
        error = g.validate_member(member_id, group_instance_id)
        if error != ErrorCode.none:
            return error
        if generation_id != g.generation_id:
            return ErrorCode.illegal_generation
        g.members[member_id].last_heartbeat_ms = self.clock.monotonic_ms()
        if g.state is G.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        """Kafka's classic LeaveGroup. An empty member id with an instance id removes that static
        member (an admin's removal); otherwise the member must pass ``validate_member``. Results carry
        the member ids as the request gave them."""
        now = self.clock.monotonic_ms()
        self._touch(group_id)
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.unknown_member_id, [(mid, iid, ErrorCode.unknown_member_id) for mid, iid in members]
        results: list[tuple[str, str | None, ErrorCode]] = []
        removed = False
        for member_id, instance_id in members:
            if not member_id:
                current = g.static_members.get(instance_id) if instance_id else None
                if current is None:
                    results.append((member_id, instance_id, ErrorCode.unknown_member_id))
                    continue
                self._remove_member(g, current)
            elif member_id in g.pending_members:
                del g.pending_members[member_id]
            else:
                error = g.validate_member(member_id, instance_id)
                if error != ErrorCode.none:
                    results.append((member_id, instance_id, error))
                    continue
                self._remove_member(g, member_id)
            removed = True
            results.append((member_id, instance_id, ErrorCode.none))
        if removed:
            self._after_removal(g, now)
        top = results[0][2] if len(results) == 1 else ErrorCode.none
        return top, results

    def _after_removal(self, g: GroupMetadata, now: int) -> None:
        if g.state in (G.STABLE, G.COMPLETING_REBALANCE):
            self._prepare_rebalance(g, now)
            g.initial_delay_until_ms = 0
        self._maybe_complete_join(g, now)

    # --- timers -------------------------------------------------------------------------------------
    def tick(self) -> int | None:
        """Session expiry, join deadlines and pending member ids; records go to ``take_records``.

        A member expires at its deadline, ``last_heartbeat_ms + session_timeout_ms``, as Kafka's
        DelayedHeartbeat does (not a tick later: a client that waits exactly a session timeout
        and then deletes the group, as librdkafka's 0081 does, must find it empty). Returns the
        earliest deadline still ahead (a member's session, a pending member id, a rebalance's
        initial delay or deadline, the pending-sync deadline), or None, so that the caller runs the
        next tick on time.

        Deadlines and the returned one are monotonic-clock readings (``clock.monotonic_ms()``), never
        wall-clock ones: a wall-clock step moves no deadline, nearer or later.

        A tick visits only the groups that are due or were changed since the last tick, not every
        member of every group: each visited group is scheduled again at the earliest deadline it
        holds. That is sound because a deadline can only move later without a visit (and the clock
        it is read against only forward): a heartbeat (or a commit counting as one) moves its
        member's deadline later and is the one change that does not mark its group; what can bring
        a deadline nearer (JoinGroup: a new member, a rebalance and its deadlines, a pending member
        id, a completed join phase and its pending-sync deadline; LeaveGroup: a rebalance, a join
        phase completed; loading) goes through :meth:`_touch`, and so does SyncGroup, which only
        ends waits and cancels deadlines. A group scheduled too early is visited, finds nothing due
        and is scheduled again. ``tests/coordinator/test_group_timers.py`` checks all this against a full
        scan."""
        now = self.clock.monotonic_ms()
        visit, self._touched = self._touched, set()
        timers = self._timers
        while timers and timers[0][0] <= now:
            due, gid = heapq.heappop(timers)
            if self._scheduled.get(gid) == due:
                del self._scheduled[gid]
                visit.add(gid)
        for gid in sorted(visit):
            g = self.groups.get(gid)
            if g is None:
                self._scheduled.pop(gid, None)
                continue
            nxt = self._tick_group(g, now)
            if nxt is None:
                self._scheduled.pop(gid, None)
            elif self._scheduled.get(gid) != nxt:
                self._scheduled[gid] = nxt
                heapq.heappush(timers, (nxt, gid))
        if len(timers) > 2 * len(self._scheduled) + 64:  # drop superseded entries
            self._timers = timers = [(due, gid) for gid, due in self._scheduled.items()]
            heapq.heapify(timers)
        while timers and self._scheduled.get(timers[0][1]) != timers[0][0]:
            heapq.heappop(timers)
        return timers[0][0] if timers else None

    def _touch(self, group_id: str) -> None:
        """The group changed in a way that may bring one of its deadlines nearer: the next tick visits it."""
        self._touched.add(group_id)

    def _tick_group(self, g: GroupMetadata, now: int) -> int | None:
        """One group's timers at ``now``; returns its earliest deadline still ahead, or None."""
        upcoming: list[int] = []
        for pid, expiry in list(g.pending_members.items()):
            if now >= expiry:
                del g.pending_members[pid]
            else:
                upcoming.append(expiry)
        if g.state in PENDING_SYNC_STATES and g.pending_sync_members and now >= g.pending_sync_deadline_ms:
            # Kafka's expirePendingSync: the members that never synced go, the others rejoin. (A
            # replaced static member's old id is no member any more: removing it is a no-op.)
            for mid in sorted(g.pending_sync_members):
                self._remove_member(g, mid)
            g.pending_sync_members.clear()
            self._after_removal(g, now)
        # Session expiry applies in every state, rebalances included: a dead member must not hold
        # a rebalance until the (much longer) rebalance timeout.
        # Members parked in JoinGroup or SyncGroup are waiting on the coordinator, not dead.
        expired = [mid for mid, m in g.members.items()
                   if m.awaiting_join is None and m.awaiting_sync is None
                   and now >= m.last_heartbeat_ms + m.session_timeout_ms]
        for mid in expired:
            self._remove_member(g, mid)
        if expired:
            self._after_removal(g, now)
        self._maybe_complete_join(g, now)
        upcoming.extend(m.last_heartbeat_ms + m.session_timeout_ms for m in g.members.values()
                        if m.awaiting_join is None and m.awaiting_sync is None)
        if g.state is G.PREPARING_REBALANCE:
            upcoming.extend(t for t in (g.initial_delay_until_ms, g.rebalance_deadline_ms) if t > now)
        if g.state in PENDING_SYNC_STATES and g.pending_sync_members:
            upcoming.append(g.pending_sync_deadline_ms)
        return min(upcoming, default=None)

    # --- questions the offsets side asks ------------------------------------------------------------
    def no_room_for_a_group(self) -> bool:
        """True (and counted) if a request may not make a new group now: ``group_max_count`` known."""
        if len(self.groups) < self.max_groups:
            return False
        self.groups_refused += 1
        return True

    def validate_offset_commit(self, group_id: str, generation_id: int, member_id: str,
                               group_instance_id: str | None, transactional: bool) -> ErrorCode:
        """May this (Txn)OffsetCommit write offsets for the group? Kafka's validateOffsetCommit:

        - a missing group: generation < 0 commits as a "simple" group (the replay of the offsets
          creates it; COORDINATOR_NOT_AVAILABLE if ``group_max_count`` groups are known), a
          generation >= 0 is ILLEGAL_GENERATION (OffsetCommit < v9);
        - generation < 0 on an Empty group: accepted whatever the member id (admin tools, consumers
          outside group management, a transactional producer holding a departed consumer's metadata);
        - a generation >= 0, a member id or an instance id: ``validate_member``, then the generation;
        - neither (v0-style): refused with UNKNOWN_MEMBER_ID while the group has members, except
          for TxnOffsetCommit, whose older versions carry no member;
        - OffsetCommit in CompletingRebalance: REBALANCE_IN_PROGRESS (not for TxnOffsetCommit).
        """
        g = self.groups.get(group_id)
        if g is None:
            if generation_id >= 0:
                return ErrorCode.illegal_generation
            return ErrorCode.coordinator_not_available if self.no_room_for_a_group() else ErrorCode.none
        if generation_id < 0 and g.state is G.EMPTY:
            return ErrorCode.none
        if generation_id >= 0 or member_id or group_instance_id:
            error = g.validate_member(member_id, group_instance_id)
            if error != ErrorCode.none:
                return error
            if generation_id != g.generation_id:
                return ErrorCode.illegal_generation
        elif not transactional and g.state is not G.EMPTY:
            return ErrorCode.unknown_member_id
        if not transactional and g.state is G.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def keep_alive_on_commit(self, group_id: str, member_id: str) -> None:
        """An accepted OffsetCommit of a member counts as its heartbeat in Stable and
        PreparingRebalance (Kafka's rule for the classic protocol)."""
        g = self.groups.get(group_id)
        if g is not None and member_id in g.members and g.state in (G.STABLE, G.PREPARING_REBALANCE):
            g.members[member_id].last_heartbeat_ms = self.clock.monotonic_ms()

    def validate_delete(self, group_id: str) -> ErrorCode:
        """DeleteGroups: only an Empty group may be deleted (Kafka's validateDeleteGroup)."""
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.group_id_not_found
        if g.state is not G.EMPTY:
            return ErrorCode.non_empty_group
        return ErrorCode.none

    # --- replay -------------------------------------------------------------------------------------
    def ensure_group(self, group_id: str) -> None:
        """An offset for a group nobody joined was replayed: a "simple" group (Empty, no protocol)."""
        if group_id not in self.groups:
            self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=self.clock.now_ms())
            self._touch(group_id)

    def replay_group(self, group_id: str, value: bytes | None, payload: dict[str, Any] | None) -> None:
        """A group-metadata record reached the log. A value is remembered as the group's logged image
        (and rebuilds the group while loading); a tombstone moves the group to Dead and forgets it.
        Tombstones are only generated for Empty groups, and appended and replayed without awaiting,
        so at runtime the group is still Empty when its tombstone is replayed."""
        if value is None:
            self.logged.pop(group_id, None)
            g = self.groups.pop(group_id, None)
            if g is not None:
                for mid in list(g.members):
                    self._remove_member(g, mid)
                g.transition_to(G.DEAD, self.clock.now_ms())
            return
        self.logged[group_id] = value
        if self.loading and payload is not None:
            self.groups[group_id] = rec.group_from_value(group_id, payload)

    def loaded(self) -> None:
        """End of loading: restored members get a full session timeout to heartbeat again."""
        now = self.clock.monotonic_ms()
        self.loading = False
        for g in self.groups.values():
            self._touch(g.group_id)
            for m in g.members.values():
                m.last_heartbeat_ms = now

    # --- admin --------------------------------------------------------------------------------------
    def list_groups(self, states_filter: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        """ListGroups: the live groups, those in one of ``states_filter`` if it names any; states
        compare case-insensitively (Kafka 4 lowercases both sides)."""
        wanted = {state.lower() for state in states_filter}
        return [(g.group_id, g.protocol_type or "", g.state.value) for g in self.groups.values()
                if g.state is not G.DEAD and (not wanted or g.state.value.lower() in wanted)]

    def describe_group(self, group_id: str) -> dict[str, Any]:
        """Kafka's describeGroups: an unknown group is Dead; the protocol name and each member's
        metadata are given only while the group is Stable (elsewhere the protocol is not settled:
        Kafka's describeNoMetadata), the assignments in every state."""
        g = self.groups.get(group_id)
        if g is None:
            return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": "Dead",
                    "protocol_type": "", "protocol_data": "", "members": []}
        stable = g.state is G.STABLE
        return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": g.state.value,
                "protocol_type": g.protocol_type or "", "protocol_data": (g.protocol_name or "") if stable else "",
                "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                             "client_id": m.client_id, "client_host": m.client_host,
                             "member_metadata": m.metadata_for(g.protocol_name or "") if stable else b"",
                             "member_assignment": m.assignment} for m in g.members.values()]}

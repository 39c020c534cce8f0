"""The classic consumer-group coordinator (JoinGroup/SyncGroup/Heartbeat/LeaveGroup) and offsets.

Sans-IO: handlers take plain values and ``now`` from the injected clock. JoinGroup and SyncGroup
answer later (when the rebalance completes), so they take a ``respond`` callback; the server passes
one that resolves a future. ``tick()`` runs the timers (session expiry, join deadlines, pending
member ids) and returns records to append.

Persistence, records then replay:
- Offsets (OffsetCommit, TxnOffsetCommit) are visible only through ``replay``: a handler returns
  records, the server appends them to ``__consumer_offsets`` and replays them. Transactional offsets
  replay into a per-producer pending area and are applied or dropped by ``replay_control`` when the
  COMMIT/ABORT marker reaches the offsets partition (also during loading).
- Membership lives in memory (as in Kafka); every completed rebalance and every transition to Empty
  writes a group-metadata record. During loading (``loading=True``) those records rebuild groups,
  generations and assignments; restored members get a full session timeout to come back.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.clock import Clock
from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_state import GroupMetadata, GroupState, MemberMetadata
from oncelog.coordinator.group.offset_records import OffsetAndMetadata

G = GroupState
Record = tuple[bytes, bytes | None]
TopicPartition = tuple[str, int]


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


@dataclass
class OffsetCommitResult:
    errors: dict[TopicPartition, ErrorCode]
    records: list[Record] = field(default_factory=list)


class GroupCoordinator:
    def __init__(self, clock: Clock, *, group_min_session_timeout_ms: int = 6000,
                 group_max_session_timeout_ms: int = 1_800_000, group_initial_rebalance_delay_ms: int = 3000,
                 offsets_retention_ms: int = 7 * 24 * 3600 * 1000) -> None:
        self.clock = clock
        self.min_session_ms = group_min_session_timeout_ms
        self.max_session_ms = group_max_session_timeout_ms
        self.initial_rebalance_delay_ms = group_initial_rebalance_delay_ms
        self.offsets_retention_ms = offsets_retention_ms
        self.groups: dict[str, GroupMetadata] = {}
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self.pending_txn_offsets: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
        self.loading = False
        self._records: list[Record] = []
        # The newest group-metadata record value per group, as written to the log (membership in
        # memory may be mid-rebalance and is not what a restart would load).
        self._group_log: dict[str, bytes] = {}

    # --- helpers ---------------------------------------------------------------------------------
    def _group_record(self, g: GroupMetadata) -> Record:
        if g.state is G.DEAD:
            return rec.group_key(g.group_id), None
        import json

        value = {"v": 1, "protocol_type": g.protocol_type, "generation": g.generation_id,
                 "protocol": g.protocol_name, "leader": g.leader_id,
                 "members": [{"member_id": m.member_id, "instance_id": m.group_instance_id, "client_id": m.client_id,
                              "client_host": m.client_host, "session_timeout_ms": m.session_timeout_ms,
                              "rebalance_timeout_ms": m.rebalance_timeout_ms, "protocol_type": m.protocol_type,
                              "protocols": [[n, rec.b64(d)] for n, d in m.protocols],
                              "assignment": rec.b64(m.assignment)} for m in g.members.values()]}
        return rec.group_key(g.group_id), json.dumps(value, separators=(",", ":")).encode()

    def _emit_group(self, g: GroupMetadata) -> None:
        self._records.append(self._group_record(g))

    def take_records(self) -> list[Record]:
        """Records produced by membership changes since the last call (the server appends them)."""
        out, self._records = self._records, []
        return out

    def _new_member_id(self, client_id: str) -> str:
        return f"{client_id or 'member'}-{uuid.uuid4()}"

    # --- JoinGroup -------------------------------------------------------------------------------
    def join_group(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                   client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_member_id: bool,
                   respond: Callable[[JoinResult], None]) -> None:
        now = self.clock.now_ms()
        if not group_id:
            return respond(JoinResult(ErrorCode.invalid_group_id, member_id=member_id))
        if not self.min_session_ms <= session_timeout_ms <= self.max_session_ms:
            return respond(JoinResult(ErrorCode.invalid_session_timeout, member_id=member_id))
        g = self.groups.get(group_id)
        if g is None or g.state is G.DEAD:
            if member_id:
                return respond(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
            g = self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=now)
        if not g.supports(protocol_type, protocols):
            return respond(JoinResult(ErrorCode.inconsistent_group_protocol, member_id=member_id))
        rebalance_timeout_ms = rebalance_timeout_ms if rebalance_timeout_ms > 0 else session_timeout_ms

        if not member_id:
            if group_instance_id and group_instance_id in g.static_members:
                return self._rejoin_static(g, group_instance_id, client_id, client_host, session_timeout_ms,
                                           rebalance_timeout_ms, protocol_type, protocols, respond, now)
            new_id = self._new_member_id(client_id)
            if require_known_member_id and not group_instance_id:
                g.pending_members[new_id] = now + session_timeout_ms
                return respond(JoinResult(ErrorCode.member_id_required, member_id=new_id))
            member_id = new_id
        elif member_id in g.pending_members:
            del g.pending_members[member_id]
        elif member_id not in g.members:
            return respond(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
        elif group_instance_id and g.static_members.get(group_instance_id) not in (None, member_id):
            return respond(JoinResult(ErrorCode.fenced_instance_id, member_id=member_id))

        m = g.members.get(member_id)
        if m is None:
            m = MemberMetadata(member_id, group_instance_id, client_id, client_host, session_timeout_ms,
                               rebalance_timeout_ms, protocol_type, list(protocols))
            g.members[member_id] = m
            if group_instance_id:
                g.static_members[group_instance_id] = member_id
            if g.leader_id is None:
                g.leader_id = member_id
            changed = True
        else:
            changed = m.protocols != list(protocols)
            m.protocols = list(protocols)
            m.session_timeout_ms, m.rebalance_timeout_ms = session_timeout_ms, rebalance_timeout_ms
        m.last_heartbeat_ms = now
        if g.protocol_type is None:
            g.protocol_type = protocol_type

        if g.state in (G.STABLE, G.COMPLETING_REBALANCE) and not changed and member_id != g.leader_id:
            # A follower rejoining with the same metadata: give it the current generation again.
            return respond(self._join_result(g, m))
        m.awaiting_join = respond
        if g.state is not G.PREPARING_REBALANCE:
            self._prepare_rebalance(g, now)
        self._maybe_complete_join(g, now)

    def _rejoin_static(self, g: GroupMetadata, instance_id: str, client_id: str, client_host: str,
                       session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                       protocols: list[tuple[str, bytes]], respond: Callable[[JoinResult], None], now: int) -> None:
        old_id = g.static_members[instance_id]
        old = g.members.pop(old_id)
        if old.awaiting_join is not None:
            old.awaiting_join(JoinResult(ErrorCode.fenced_instance_id, member_id=old_id))
        if old.awaiting_sync is not None:
            old.awaiting_sync(SyncResult(ErrorCode.fenced_instance_id))
        new_id = self._new_member_id(client_id)
        m = MemberMetadata(new_id, instance_id, client_id, client_host, session_timeout_ms, rebalance_timeout_ms,
                           protocol_type, list(protocols), assignment=old.assignment, last_heartbeat_ms=now)
        g.members[new_id] = m
        g.static_members[instance_id] = new_id
        if g.leader_id == old_id:
            g.leader_id = new_id
        if g.state is G.STABLE and old.protocols == m.protocols:
            # Kafka's static membership: a known instance replaces its old member id without a rebalance.
            self._emit_group(g)
            return respond(self._join_result(g, m))
        m.awaiting_join = respond
        if g.state is not G.PREPARING_REBALANCE:
            self._prepare_rebalance(g, now)
        self._maybe_complete_join(g, now)

    def _join_result(self, g: GroupMetadata, m: MemberMetadata) -> JoinResult:
        members = []
        if m.member_id == g.leader_id:
            members = [(x.member_id, x.group_instance_id, x.metadata_for(g.protocol_name or ""))
                       for x in g.members.values()]
        return JoinResult(ErrorCode.none, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id or "",
                          m.member_id, members)

    def _prepare_rebalance(self, g: GroupMetadata, now: int) -> None:
        for m in g.members.values():
            if m.awaiting_sync is not None:
                m.awaiting_sync(SyncResult(ErrorCode.rebalance_in_progress))
                m.awaiting_sync = None
        if g.state is G.EMPTY:
            g.initial_delay_until_ms = now + self.initial_rebalance_delay_ms
        g.transition_to(G.PREPARING_REBALANCE, now)
        g.rebalance_deadline_ms = now + max((m.rebalance_timeout_ms for m in g.members.values()), default=0)

    def _maybe_complete_join(self, g: GroupMetadata, now: int) -> None:
        if g.state is not G.PREPARING_REBALANCE:
            return
        all_joined = all(m.awaiting_join is not None for m in g.members.values()) and not g.pending_members
        if all_joined and now < g.initial_delay_until_ms and now < g.rebalance_deadline_ms:
            return  # new group: wait a little for more members (group.initial.rebalance.delay.ms)
        if not all_joined and now < g.rebalance_deadline_ms:
            return
        for mid in [mid for mid, m in g.members.items() if m.awaiting_join is None]:
            self._remove_member(g, mid)
        g.pending_members.clear()
        g.generation_id += 1
        if not g.members:
            g.protocol_name = None
            g.leader_id = None
            g.transition_to(G.EMPTY, now)
            self._emit_group(g)
            return
        if g.leader_id not in g.members:
            g.leader_id = next(iter(g.members))
        g.protocol_name = g.select_protocol()
        g.transition_to(G.COMPLETING_REBALANCE, now)
        for m in g.members.values():
            callback, m.awaiting_join = m.awaiting_join, None
            m.last_heartbeat_ms = now
            if callback is not None:
                callback(self._join_result(g, m))
        self._emit_group(g)

    def _remove_member(self, g: GroupMetadata, member_id: str) -> None:
        m = g.members.pop(member_id, None)
        if m is None:
            return
        if m.group_instance_id and g.static_members.get(m.group_instance_id) == member_id:
            del g.static_members[m.group_instance_id]
        if m.awaiting_join is not None:
            m.awaiting_join(JoinResult(ErrorCode.unknown_member_id, member_id=member_id))
        if m.awaiting_sync is not None:
            m.awaiting_sync(SyncResult(ErrorCode.unknown_member_id))
        if g.leader_id == member_id:
            g.leader_id = next(iter(g.members), None)

    # --- SyncGroup -------------------------------------------------------------------------------
    def sync_group(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   assignments: list[tuple[str, bytes]], respond: Callable[[SyncResult], None]) -> None:
        now = self.clock.now_ms()
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return respond(SyncResult(ErrorCode.unknown_member_id))
        if group_instance_id and g.static_members.get(group_instance_id) != member_id:
            return respond(SyncResult(ErrorCode.fenced_instance_id))
        if generation_id != g.generation_id:
            return respond(SyncResult(ErrorCode.illegal_generation))
        m = g.members[member_id]
        m.last_heartbeat_ms = now
        if g.state is G.PREPARING_REBALANCE:
            return respond(SyncResult(ErrorCode.rebalance_in_progress))
        if g.state is G.STABLE:
            return respond(SyncResult(ErrorCode.none, g.protocol_type, g.protocol_name, m.assignment))
        m.awaiting_sync = respond
        if member_id == g.leader_id:
            given = dict(assignments)
            for x in g.members.values():
                x.assignment = given.get(x.member_id, b"")
            g.transition_to(G.STABLE, now)
            for x in g.members.values():
                callback, x.awaiting_sync = x.awaiting_sync, None
                if callback is not None:
                    callback(SyncResult(ErrorCode.none, g.protocol_type, g.protocol_name, x.assignment))
            self._emit_group(g)

    # --- Heartbeat / LeaveGroup ------------------------------------------------------------------
    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        g = self.groups.get(group_id)
        if g is None or member_id not in g.members:
            return ErrorCode.unknown_member_id
        if group_instance_id and g.static_members.get(group_instance_id) != member_id:
            return ErrorCode.fenced_instance_id
        g.members[member_id].last_heartbeat_ms = self.clock.now_ms()
        if g.state is G.PREPARING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        if generation_id != g.generation_id:
            return ErrorCode.illegal_generation
        return ErrorCode.none

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        now = self.clock.now_ms()
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.unknown_member_id, [(mid, iid, ErrorCode.unknown_member_id) for mid, iid in members]
        results: list[tuple[str, str | None, ErrorCode]] = []
        removed = False
        for member_id, instance_id in members:
            if instance_id and not member_id:
                member_id = g.static_members.get(instance_id, "")
            if instance_id and g.static_members.get(instance_id) not in (None, member_id):
                results.append((member_id, instance_id, ErrorCode.fenced_instance_id))
                continue
            if member_id not in g.members:
                results.append((member_id, instance_id, ErrorCode.unknown_member_id))
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
        if g.state is G.PREPARING_REBALANCE:
            self._maybe_complete_join(g, now)
        if g.state is G.EMPTY:
            self._emit_group(g)

    # --- timers ----------------------------------------------------------------------------------
    def tick(self) -> list[Record]:
        now = self.clock.now_ms()
        for g in list(self.groups.values()):
            for pid, expiry in list(g.pending_members.items()):
                if now >= expiry:
                    del g.pending_members[pid]
            # Session expiry applies in every state, rebalances included: a dead member must not hold
            # a rebalance until the (much longer) rebalance timeout.
            expired = [mid for mid, m in g.members.items()
                       if m.awaiting_join is None and now - m.last_heartbeat_ms > m.session_timeout_ms]
            for mid in expired:
                self._remove_member(g, mid)
            if expired:
                self._after_removal(g, now)
            self._maybe_complete_join(g, now)
        return self.take_records()

    # --- offsets ---------------------------------------------------------------------------------
    def _check_member(self, g: GroupMetadata | None, generation_id: int, member_id: str,
                      group_instance_id: str | None) -> ErrorCode:
        if generation_id < 0 and not member_id:
            if g is not None and g.members:
                return ErrorCode.unknown_member_id
            return ErrorCode.none  # a "simple" commit by a consumer outside any group membership
        if g is None:
            return ErrorCode.illegal_generation
        if group_instance_id and g.static_members.get(group_instance_id) not in (None, member_id):
            return ErrorCode.fenced_instance_id
        if member_id not in g.members:
            return ErrorCode.unknown_member_id
        if generation_id != g.generation_id:
            return ErrorCode.illegal_generation
        if g.state is G.COMPLETING_REBALANCE:
            return ErrorCode.rebalance_in_progress
        return ErrorCode.none

    def _offset_records(self, group_id: str, offsets: Iterable[tuple[str, int, int, int, str | None]],
                        now: int) -> tuple[dict[TopicPartition, ErrorCode], list[Record]]:
        errors: dict[TopicPartition, ErrorCode] = {}
        records: list[Record] = []
        for topic, partition, offset, leader_epoch, metadata in offsets:
            if metadata is not None and len(metadata) > 4096:
                errors[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            errors[(topic, partition)] = ErrorCode.none
            records.append((rec.offset_key(group_id, topic, partition),
                            rec.offset_value(OffsetAndMetadata(offset, leader_epoch, metadata, now))))
        return errors, records

    def offset_commit(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                      offsets: list[tuple[str, int, int, int, str | None]]) -> OffsetCommitResult:
        if not group_id:
            return OffsetCommitResult({(t, p): ErrorCode.invalid_group_id for t, p, *_ in offsets})
        g = self.groups.get(group_id)
        error = self._check_member(g, generation_id, member_id, group_instance_id)
        if error != ErrorCode.none:
            return OffsetCommitResult({(t, p): error for t, p, *_ in offsets})
        now = self.clock.now_ms()
        if g is None:
            g = self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=now)
        elif g.members and member_id in g.members:
            g.members[member_id].last_heartbeat_ms = now
        errors, records = self._offset_records(group_id, offsets, now)
        return OffsetCommitResult(errors, records)

    def txn_offset_commit(self, group_id: str, producer_id: int, generation_id: int, member_id: str,
                          group_instance_id: str | None,
                          offsets: list[tuple[str, int, int, int, str | None]]) -> OffsetCommitResult:
        """KIP-447: with a generation and member id the commit is fenced like a normal one; the records are
        appended by the server as part of the producer's transaction (pending until its marker)."""
        g = self.groups.get(group_id)
        if generation_id >= 0 or member_id:
            error = self._check_member(g, generation_id, member_id, group_instance_id)
            if error == ErrorCode.rebalance_in_progress:
                error = ErrorCode.none  # KIP-447 allows committing the fenced-by-generation check only
            if error != ErrorCode.none:
                return OffsetCommitResult({(t, p): error for t, p, *_ in offsets})
        now = self.clock.now_ms()
        if g is None:
            self.groups[group_id] = GroupMetadata(group_id, state_timestamp_ms=now)
        errors, records = self._offset_records(group_id, offsets, now)
        return OffsetCommitResult(errors, records)

    def replay(self, key: bytes, value: bytes | None, producer_id: int = -1, transactional: bool = False) -> None:
        kind, ident, payload = rec.decode(key, value)
        if kind == "offset":
            group_id, topic, partition = ident
            tp = (topic, partition)
            if transactional:
                pending = self.pending_txn_offsets.setdefault(producer_id, {}).setdefault(group_id, {})
                if payload is not None:
                    pending[tp] = payload
                return
            if payload is None:
                self.offsets.get(group_id, {}).pop(tp, None)
            else:
                self.offsets.setdefault(group_id, {})[tp] = payload
                if group_id not in self.groups:
                    self.groups[group_id] = GroupMetadata(group_id)
            return
        if value is None:
            self._group_log.pop(ident, None)
        else:
            self._group_log[ident] = value
        if not self.loading:
            return  # in-memory membership is authoritative while running; the record is for restarts
        if payload is None:
            self.groups.pop(ident, None)
            self.offsets.pop(ident, None)
            return
        g = GroupMetadata(ident, generation_id=payload["generation"], protocol_type=payload["protocol_type"],
                          protocol_name=payload["protocol"], leader_id=payload["leader"])
        for md in payload["members"]:
            m = MemberMetadata(md["member_id"], md["instance_id"], md["client_id"], md["client_host"],
                               md["session_timeout_ms"], md["rebalance_timeout_ms"], md["protocol_type"],
                               [(n, rec.unb64(d)) for n, d in md["protocols"]], rec.unb64(md["assignment"]))
            g.members[m.member_id] = m
            if m.group_instance_id:
                g.static_members[m.group_instance_id] = m.member_id
        g.state = G.STABLE if g.members else G.EMPTY
        self.groups[ident] = g

    def snapshot_records(self, owns: Callable[[str], bool]) -> list[Record]:
        """The newest record of every live key of the groups ``owns`` selects (one offsets partition),
        as log compaction would keep them: each group's last logged metadata and committed offsets.

        Transactional offsets still pending are not included: they stay in the log above the last
        stable offset, which a caller never truncates past. Replaying these records alone (with
        ``loading`` set) rebuilds the same groups and committed offsets.
        """
        out: list[Record] = []
        for gid in sorted(set(self._group_log) | set(self.offsets)):
            if not owns(gid):
                continue
            if gid in self._group_log:
                out.append((rec.group_key(gid), self._group_log[gid]))
            for (topic, partition), o in sorted(self.offsets.get(gid, {}).items()):
                out.append((rec.offset_key(gid, topic, partition), rec.offset_value(o)))
        return out

    def replay_control(self, producer_id: int, commit: bool) -> None:
        pending = self.pending_txn_offsets.pop(producer_id, None)
        if not pending or not commit:
            return
        for group_id, offsets in pending.items():
            self.offsets.setdefault(group_id, {}).update(offsets)
            self.groups.setdefault(group_id, GroupMetadata(group_id))

    def loaded(self) -> None:
        """End of loading: restored members get a full session timeout to heartbeat again."""
        now = self.clock.now_ms()
        self.loading = False
        for g in self.groups.values():
            for m in g.members.values():
                m.last_heartbeat_ms = now

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        return any(tp in groups.get(group_id, {}) for groups in self.pending_txn_offsets.values())

    def offset_fetch(self, group_id: str, partitions: list[TopicPartition] | None,
                     require_stable: bool) -> dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]]:
        committed = self.offsets.get(group_id, {})
        wanted = partitions if partitions is not None else sorted(committed)
        out: dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]] = {}
        for tp in wanted:
            if require_stable and self.has_pending(group_id, tp):
                out[tp] = (None, ErrorCode.unstable_offset_commit)
            else:
                out[tp] = (committed.get(tp), ErrorCode.none)
        return out

    # --- admin -----------------------------------------------------------------------------------
    def list_groups(self, states_filter: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        wanted = set(states_filter)
        return [(g.group_id, g.protocol_type or "", g.state.value) for g in self.groups.values()
                if g.state is not G.DEAD and (not wanted or g.state.value in wanted)]

    def describe_group(self, group_id: str) -> dict[str, Any]:
        g = self.groups.get(group_id)
        if g is None:
            return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": "Dead",
                    "protocol_type": "", "protocol_data": "", "members": []}
        return {"error_code": ErrorCode.none, "group_id": group_id, "group_state": g.state.value,
                "protocol_type": g.protocol_type or "", "protocol_data": g.protocol_name or "",
                "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                             "client_id": m.client_id, "client_host": m.client_host,
                             "member_metadata": m.metadata_for(g.protocol_name or ""),
                             "member_assignment": m.assignment} for m in g.members.values()]}

    def delete_groups(self, group_ids: Iterable[str]) -> tuple[dict[str, ErrorCode], list[Record]]:
        errors: dict[str, ErrorCode] = {}
        records: list[Record] = []
        now = self.clock.now_ms()
        for gid in group_ids:
            g = self.groups.get(gid)
            if g is None:
                errors[gid] = ErrorCode.group_id_not_found
            elif g.members:
                errors[gid] = ErrorCode.non_empty_group
            else:
                errors[gid] = ErrorCode.none
                records += [(rec.offset_key(gid, t, p), None) for t, p in self.offsets.get(gid, {})]
                g.transition_to(G.DEAD, now)
                records.append(self._group_record(g))
                del self.groups[gid]
                self.offsets.pop(gid, None)
        return errors, records

    def offset_delete(self, group_id: str, partitions: list[TopicPartition]
                      ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode], list[Record]]:
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.group_id_not_found, {}, []
        subscribed = g.subscribed_topics() if g.members else set()
        errors: dict[TopicPartition, ErrorCode] = {}
        records: list[Record] = []
        for tp in partitions:
            if tp[0] in subscribed:
                errors[tp] = ErrorCode.group_subscribed_to_topic
            else:
                errors[tp] = ErrorCode.none
                if tp in self.offsets.get(group_id, {}):
                    records.append((rec.offset_key(group_id, *tp), None))
        return ErrorCode.none, errors, records

    def expire_offsets(self) -> list[Record]:
        """Tombstones for offsets of Empty groups older than the retention (Kafka's rule)."""
        now = self.clock.now_ms()
        records: list[Record] = []
        for gid, offsets in self.offsets.items():
            g = self.groups.get(gid)
            if g is not None and g.state is not G.EMPTY:
                continue
            for tp, o in offsets.items():
                if now - o.commit_timestamp_ms > self.offsets_retention_ms:
                    records.append((rec.offset_key(gid, *tp), None))
        return records

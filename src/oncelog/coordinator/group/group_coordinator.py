"""The group coordinator: one thin facade over membership and offsets (Kafka's GroupCoordinatorShard).

It turns requests into records and replays records into state; the work is done by two modules:

- ``GroupMetadataManager`` (membership): JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the rebalance
  state machine, static membership, session timers; it answers whether a member may commit.
- ``OffsetMetadataManager`` (offsets): committed offsets and pending transactional offsets.

The facade owns the rules that need both: who may commit (asks membership, writes through offsets),
when a group dies (offsets gone and membership Empty), what a checkpoint holds.

Records, then replay. A request handler here returns the records to append and changes no durable
state; the server appends them to the group's ``__consumer_offsets`` partition and calls ``replay``
(and ``replay_control`` for COMMIT/ABORT markers), which is where offsets are committed, simple
groups are created and groups die, at runtime and while loading alike. Membership is the exception
Kafka makes too: it lives in memory and its records (``take_records``) are its durable image,
rebuilt into membership only while ``loading``.

Sans-IO and single-threaded: no method awaits; the server calls them from its event loop only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from oncelog.clock import Clock
from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_metadata_manager import (
    DEFAULT_GROUP_MAX_RECORD_BYTES,
    GroupMetadataManager,
    JoinResult,
    SyncResult,
)
from oncelog.coordinator.group.group_state import GroupMetadata, GroupState
from oncelog.coordinator.group.offset_metadata_manager import OffsetMetadataManager, OffsetToCommit
from oncelog.coordinator.group.offset_records import OffsetAndMetadata

__all__ = ["GroupCoordinator", "JoinResult", "OffsetCommitResult", "SyncResult"]

Record = tuple[bytes, bytes | None]
TopicPartition = tuple[str, int]


@dataclass
class OffsetCommitResult:
    errors: dict[TopicPartition, ErrorCode]
    records: list[Record] = field(default_factory=list)


class GroupCoordinator:
    def __init__(self, clock: Clock, *, group_min_session_timeout_ms: int = 6000,
                 group_max_session_timeout_ms: int = 1_800_000, group_initial_rebalance_delay_ms: int = 3000,
                 offsets_retention_ms: int = 7 * 24 * 3600 * 1000,
                 group_max_record_bytes: int = DEFAULT_GROUP_MAX_RECORD_BYTES,
                 store_refused: Callable[[str, int], bool] = lambda group_id, size: False,
                 group_max_count: int = 2**63 - 1) -> None:
        """``store_refused``, ``group_max_count``: see ``GroupMetadataManager``."""
        self.clock = clock
        self.offsets_retention_ms = offsets_retention_ms
        self.membership = GroupMetadataManager(
            clock, group_min_session_timeout_ms=group_min_session_timeout_ms,
            group_max_session_timeout_ms=group_max_session_timeout_ms,
            group_initial_rebalance_delay_ms=group_initial_rebalance_delay_ms,
            group_max_record_bytes=group_max_record_bytes, store_refused=store_refused,
            group_max_count=group_max_count)
        self.offset_store = OffsetMetadataManager()
        #: The earliest membership deadline ahead as of the last :meth:`tick` (None: nothing due), in
        #: wall-clock terms (see :meth:`tick`).
        self.next_timer_ms: int | None = None

    # --- views the server and tests read -------------------------------------------------------------
    @property
    def groups(self) -> dict[str, GroupMetadata]:
        return self.membership.groups

    @property
    def offsets(self) -> dict[str, dict[TopicPartition, OffsetAndMetadata]]:
        return self.offset_store.offsets

    @property
    def pending_txn_offsets(self) -> dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]]:
        return self.offset_store.pending

    @property
    def loading(self) -> bool:
        return self.membership.loading

    @loading.setter
    def loading(self, value: bool) -> None:
        self.membership.loading = value

    # --- membership (answers through ``respond``; records through ``take_records``) -------------------
    def join_group(self, group_id: str, member_id: str, group_instance_id: str | None, client_id: str,
                   client_host: str, session_timeout_ms: int, rebalance_timeout_ms: int, protocol_type: str,
                   protocols: list[tuple[str, bytes]], require_known_member_id: bool,
                   respond: Callable[[JoinResult], None]) -> None:
        self.membership.join_group(group_id, member_id, group_instance_id, client_id, client_host,
                                   session_timeout_ms, rebalance_timeout_ms, protocol_type, protocols,
                                   require_known_member_id, respond)

    def sync_group(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                   assignments: list[tuple[str, bytes]], respond: Callable[[SyncResult], None],
                   protocol_type: str | None = None, protocol_name: str | None = None) -> None:
        self.membership.sync_group(group_id, generation_id, member_id, group_instance_id, assignments, respond,
                                   protocol_type, protocol_name)

    def heartbeat(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None) -> ErrorCode:
        return self.membership.heartbeat(group_id, generation_id, member_id, group_instance_id)

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]]
                    ) -> tuple[ErrorCode, list[tuple[str, str | None, ErrorCode]]]:
        return self.membership.leave_group(group_id, members)

    def take_records(self) -> list[Record]:
        """Records produced by membership changes since the last call (the server appends them)."""
        return self.membership.take_records()

    def tick(self) -> list[Record]:
        """Run the membership timers; returns the records they produced (the next timer's
        deadline is then :attr:`next_timer_ms`).

        The timers run on the monotonic clock; :attr:`next_timer_ms` is the next one's deadline as
        the wall clock read at this tick plus the monotonic time still to go, so a caller that
        sleeps ``next_timer_ms - clock.now_ms()`` right after the tick sleeps just that long. A
        wall-clock step between the tick and that subtraction only makes the caller tick early or
        late once; the timers themselves never read the wall clock."""
        deadline = self.membership.tick()
        self.next_timer_ms = (None if deadline is None
                              else self.clock.now_ms() + deadline - self.clock.monotonic_ms())
        return self.take_records()

    # --- offsets ------------------------------------------------------------------------------------
    def offset_commit(self, group_id: str, generation_id: int, member_id: str, group_instance_id: str | None,
                      offsets: list[OffsetToCommit]) -> OffsetCommitResult:
        """The empty group id is a group id like any other here, as in Kafka (which keeps offset
        commits working for it, for backward compatibility)."""
        error = self.membership.validate_offset_commit(group_id, generation_id, member_id, group_instance_id,
                                                       transactional=False)
        if error != ErrorCode.none:
            return OffsetCommitResult({(t, p): error for t, p, *_ in offsets})
        self.membership.keep_alive_on_commit(group_id, member_id)
        errors, records = self.offset_store.commit_records(group_id, offsets, self.clock.now_ms())
        return OffsetCommitResult(errors, records)

    def txn_offset_commit(self, group_id: str, producer_id: int, generation_id: int, member_id: str,
                          group_instance_id: str | None, offsets: list[OffsetToCommit]) -> OffsetCommitResult:
        """KIP-447: with a generation or member id the commit is fenced like a normal one; the server
        appends the records as part of the producer's transaction (pending until its marker)."""
        if not group_id:
            return OffsetCommitResult({(t, p): ErrorCode.invalid_group_id for t, p, *_ in offsets})
        error = self.membership.validate_offset_commit(group_id, generation_id, member_id, group_instance_id,
                                                       transactional=True)
        if error != ErrorCode.none:
            return OffsetCommitResult({(t, p): error for t, p, *_ in offsets})
        errors, records = self.offset_store.commit_records(group_id, offsets, self.clock.now_ms())
        return OffsetCommitResult(errors, records)

    def offset_fetch(self, group_id: str, partitions: list[TopicPartition] | None,
                     require_stable: bool) -> dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]]:
        return self.offset_store.fetch(group_id, partitions, require_stable)

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        return self.offset_store.has_pending(group_id, tp)

    def offset_delete(self, group_id: str, partitions: list[TopicPartition]
                      ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode], list[Record]]:
        """Kafka's deleteOffsets: the top-level error (GROUP_ID_NOT_FOUND; NON_EMPTY_GROUP for a group
        with members that is not a consumer group), per-partition errors (GROUP_SUBSCRIBED_TO_TOPIC
        for a topic the group is, or may be, subscribed to) and the tombstones of the others that
        hold an offset, committed or pending."""
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.group_id_not_found, {}, []
        error = g.validate_offset_delete()
        if error != ErrorCode.none:
            return error, {}, []
        errors = {tp: ErrorCode.group_subscribed_to_topic if g.is_subscribed_to(tp[0]) else ErrorCode.none
                  for tp in partitions}
        records = self.offset_store.tombstones(group_id, [tp for tp, e in errors.items() if e == ErrorCode.none])
        return ErrorCode.none, errors, records

    def on_topics_deleted(self, topics: set[str]) -> list[Record]:
        """Kafka's onPartitionsDeleted: the tombstones of every group's offsets of ``topics``,
        committed or pending (``OffsetMetadataManager.tombstones_for_topics``)."""
        return self.offset_store.tombstones_for_topics(topics)

    def offsets_of_missing_topics(self, existing: set[str]) -> list[Record]:
        """The tombstones of offsets whose topic is not in ``existing``: a topic deleted by a broker
        that stopped before its offsets' tombstones were durable (no offset is ever recorded for a
        partition that does not exist, so this is the only way to hold one)."""
        return self.on_topics_deleted(self.offset_store.topics() - existing)

    def expire_offsets(self) -> list[Record]:
        """Kafka's cleanupGroupMetadata: for every group, tombstones for its expired offsets (see
        ``GroupMetadata.offset_expiration_base``; never an offset a transaction is about to
        commit), then, if that leaves an Empty group with no offsets and no open transaction holding
        offsets for it, the group's tombstone: replayed, it moves the group to Dead and forgets it,
        so it leaves ListGroups and every later checkpoint, and a restart does not bring it back."""
        now = self.clock.now_ms()
        records: list[Record] = []
        for gid in sorted(set(self.groups) | set(self.offsets)):
            g = self.groups.get(gid) or GroupMetadata(gid)
            expired, all_gone = self.offset_store.expired_records(
                gid, g.offset_expiration_base(), g.is_subscribed_to, now, self.offsets_retention_ms)
            records += expired
            if all_gone and g.state is GroupState.EMPTY:
                records.append(self.membership.tombstone(gid))
        return records

    # --- groups as a whole --------------------------------------------------------------------------
    def list_groups(self, states_filter: Iterable[str] = ()) -> list[tuple[str, str, str]]:
        return self.membership.list_groups(states_filter)

    def describe_group(self, group_id: str) -> dict[str, Any]:
        return self.membership.describe_group(group_id)

    def delete_groups(self, group_ids: Iterable[str]) -> tuple[dict[str, ErrorCode], list[Record]]:
        """Per-group errors and the records (offset tombstones, for pending transactional offsets
        too, then the group's tombstone) that delete the deletable ones once replayed."""
        errors: dict[str, ErrorCode] = {}
        records: list[Record] = []
        for gid in group_ids:
            errors[gid] = self.membership.validate_delete(gid)
            if errors[gid] == ErrorCode.none:
                records += self.offset_store.tombstones(gid)
                records.append(self.membership.tombstone(gid))
        return errors, records

    # --- replay: records into state -----------------------------------------------------------------
    def replay(self, key: bytes, value: bytes | None, producer_id: int = -1, transactional: bool = False,
               record_offset: int | None = None) -> None:
        """Apply one record of an offsets partition, found there at ``record_offset`` (the server
        always gives it; see ``OffsetMetadataManager.replay`` for None)."""
        kind, ident, payload = rec.decode(key, value)
        if kind == "offset":
            group_id, topic, partition = ident
            self.offset_store.replay(group_id, (topic, partition), payload, producer_id, transactional, record_offset)
            if payload is not None:  # transactional too: Kafka's replay (and TxnOffsetCommit) create it
                self.membership.ensure_group(group_id)
            return
        self.membership.replay_group(ident, value, payload)
        if value is None:
            self.offset_store.drop_group(ident)

    def replay_control(self, producer_id: int, commit: bool) -> None:
        """A COMMIT/ABORT marker: the producer's pending offsets are applied (each unless a newer
        regular commit of its partition is already there) or dropped. Their groups exist: the replay
        of a pending offset creates its group, and a group's tombstone drops them."""
        self.offset_store.replay_control(producer_id, commit)

    def loaded(self) -> None:
        """End of loading: restored members get a full session timeout to heartbeat again."""
        self.membership.loaded()

    def snapshot_records(self, owns: Callable[[str], bool]) -> list[Record]:
        """The newest record of every live key of the groups ``owns`` selects (one offsets partition),
        as log compaction would keep them: each group's last logged metadata and committed offsets.

        Transactional offsets still pending are not included: they stay in the log above the last
        stable offset, which a caller never truncates past. Replaying these records alone (with
        ``loading`` set) rebuilds the same groups and committed offsets, each with the
        ``record_offset`` it had, so a pending offset left below the checkpoint is ordered against
        them as against the records they replace.
        """
        out: list[Record] = []
        for gid in sorted(set(self.membership.logged) | set(self.offsets)):
            if not owns(gid):
                continue
            if gid in self.membership.logged:
                out.append((rec.group_key(gid), self.membership.logged[gid]))
            out += self.offset_store.snapshot_records(gid)
        return out

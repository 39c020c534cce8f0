"""Committed offsets and pending transactional offsets of every group (Kafka's OffsetMetadataManager).

Sans-IO and membership-blind: whether a member may commit is the membership module's question,
asked by the coordinator facade before it calls here.

Invariants:
- State changes only in ``replay``, ``replay_control`` and ``drop_group`` (the facade's replay of
  records and markers); every other method is a pure read that returns records. So the offsets a
  client sees are exactly those the log holds, at runtime and after loading alike.
- ``offsets[g]`` is never an empty dict: a group has an entry iff it has a committed offset.
- A transactional offset (TxnOffsetCommit) lives in ``pending[producer_id][group]`` from the replay
  of its record until the COMMIT or ABORT marker of its producer reaches the offsets partition; a
  commit moves it into ``offsets``, an abort drops it. An offset tombstone also drops the pending
  offsets of that partition (Kafka does the same), and DeleteGroups and OffsetDelete write one for
  every partition with a committed *or* pending offset (``tombstones``), so a group or offset deleted
  while a transaction is open does not come back when the transaction commits, nor after a restart.
- Every offset held, committed or pending, carries the ``record_offset`` of the record that
  committed it; a COMMIT marker applies a pending offset only if its record is newer than the
  committed one's (Kafka's replayEndTransactionMarker). So the committed offset is always that of
  the newest record in log order among the regular commits and the commits of committed
  transactions since the partition's last tombstone: a regular OffsetCommit made while a
  transaction holds an older pending offset is not overwritten when the transaction commits (the
  group would otherwise go back and re-read). A checkpoint's records carry the original
  ``record_offset`` in their value, so replay after a checkpoint compares the same positions.
- A committed offset replayed from a value of a version before 2ad1559 (``rec.ORDER_UNKNOWN``: no
  ``record_offset``; an old checkpoint may have re-appended an older commit after a pending offset)
  counts as older than every record: a COMMIT marker meeting it applies, as the version that wrote
  it did; a checkpoint writes it back as such, and the next regular commit of its partition
  replaces it. A pending offset is never rewritten, so its own record orders it, whatever version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from kio.schema.errors import ErrorCode

from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.offset_records import OffsetAndMetadata

Record = tuple[bytes, bytes | None]
TopicPartition = tuple[str, int]
OffsetToCommit = tuple[str, int, int, int, str | None]  # topic, partition, offset, leader epoch, metadata

MAX_METADATA_BYTES = 4096  # Kafka's offset.metadata.max.bytes


class OffsetMetadataManager:
    def __init__(self) -> None:
        self.offsets: dict[str, dict[TopicPartition, OffsetAndMetadata]] = {}
        self.pending: dict[int, dict[str, dict[TopicPartition, OffsetAndMetadata]]] = {}
        #: The highest log offset replayed (where ``replay`` was called without one, the next is this + 1).
        self.last_record_offset = -1

    # --- requests: records only ------------------------------------------------------------------
    def commit_records(self, group_id: str, offsets: Iterable[OffsetToCommit], now_ms: int
                       ) -> tuple[dict[TopicPartition, ErrorCode], list[Record]]:
        """Per-partition errors and the offset records to append for an (already validated) commit."""
        errors: dict[TopicPartition, ErrorCode] = {}
        records: list[Record] = []
        for topic, partition, offset, leader_epoch, metadata in offsets:
            if metadata is not None and len(metadata) > MAX_METADATA_BYTES:
                errors[(topic, partition)] = ErrorCode.offset_metadata_too_large
                continue
            errors[(topic, partition)] = ErrorCode.none
            records.append((rec.offset_key(group_id, topic, partition),
                            rec.offset_value(OffsetAndMetadata(offset, leader_epoch, metadata, now_ms))))
        return errors, records

    def tombstones(self, group_id: str, partitions: Iterable[TopicPartition] | None = None) -> list[Record]:
        """Tombstones for the group's offsets, committed or pending in an open transaction (all of
        them, or those of ``partitions``): Kafka's deleteAllOffsets and deleteOffsets. One per
        partition; its replay drops both kinds, so the transaction's marker brings nothing back."""
        if partitions is None:
            committed = self.offsets.get(group_id, {})
            pending_only = {tp for by_group in self.pending.values() for tp in by_group.get(group_id, {})
                            if tp not in committed}
            wanted = sorted(committed) + sorted(pending_only)
        else:
            wanted = [tp for tp in partitions if self.has_committed(group_id, tp) or self.has_pending(group_id, tp)]
        return [(rec.offset_key(group_id, *tp), None) for tp in wanted]

    def tombstones_for_topics(self, topics: set[str]) -> list[Record]:
        """Kafka's onPartitionsDeleted: in every group, a tombstone for each partition of ``topics``
        that holds an offset, committed or pending in an open transaction (whose COMMIT would
        otherwise bring it back). A topic made again under the same name must not start its
        consumers at the old topic's offsets."""
        held: dict[str, set[TopicPartition]] = {}
        for group_id, offsets in self.offsets.items():
            held.setdefault(group_id, set()).update(tp for tp in offsets if tp[0] in topics)
        for by_group in self.pending.values():
            for group_id, offsets in by_group.items():
                held.setdefault(group_id, set()).update(tp for tp in offsets if tp[0] in topics)
        return [(rec.offset_key(group_id, *tp), None) for group_id in sorted(held) for tp in sorted(held[group_id])]

    def topics(self) -> set[str]:
        """Every topic some group holds an offset of, committed or pending."""
        found = {tp[0] for offsets in self.offsets.values() for tp in offsets}
        found.update(tp[0] for by_group in self.pending.values() for offsets in by_group.values() for tp in offsets)
        return found

    def expired_records(self, group_id: str, base_ms: Callable[[int], int] | None,
                        is_subscribed: Callable[[str], bool], now_ms: int, retention_ms: int
                        ) -> tuple[list[Record], bool]:
        """Kafka's cleanupExpiredOffsets for one group: tombstones for the offsets whose retention,
        counted from ``base_ms(commit time)``, has passed, skipping topics the group subscribes to and
        partitions with a pending transactional offset. Also says whether that leaves the group with no
        offset and no open transaction holding offsets for it. ``base_ms`` None: nothing expires."""
        committed = self.offsets.get(group_id, {})
        if base_ms is None:
            return [], not committed and not self.has_open_transactions(group_id)
        records: list[Record] = []
        all_expired = True
        for tp, om in sorted(committed.items()):
            if (not is_subscribed(tp[0]) and now_ms - base_ms(om.commit_timestamp_ms) >= retention_ms
                    and not self.has_pending(group_id, tp)):
                records.append((rec.offset_key(group_id, *tp), None))
            else:
                all_expired = False
        return records, all_expired and not self.has_open_transactions(group_id)

    # --- replay: the only state changes --------------------------------------------------------------
    def replay(self, group_id: str, tp: TopicPartition, value: OffsetAndMetadata | None,
               producer_id: int = -1, transactional: bool = False, record_offset: int | None = None) -> None:
        """Apply one offset record found at ``record_offset`` in the group's offsets partition (None,
        for callers without a log: one past the last record replayed, i.e. records count in replay
        order). The offset is held with its ``record_offset``: the value's own when it has one (a
        checkpoint's rewrite of an older commit, or ``rec.ORDER_UNKNOWN`` for a committed offset of
        an old version), else the record's position (a pending offset is never a rewrite)."""
        if record_offset is None:
            record_offset = self.last_record_offset + 1
        self.last_record_offset = max(self.last_record_offset, record_offset)
        if value is not None and (value.record_offset == rec.NOT_REPLAYED
                                  or (transactional and value.record_offset == rec.ORDER_UNKNOWN)):
            value = dataclasses.replace(value, record_offset=record_offset)
        if transactional:
            if value is not None:
                self.pending.setdefault(producer_id, {}).setdefault(group_id, {})[tp] = value
            return
        if value is not None:
            self.offsets.setdefault(group_id, {})[tp] = value
            return
        committed = self.offsets.get(group_id)
        if committed is not None:
            committed.pop(tp, None)
            if not committed:
                del self.offsets[group_id]
        for by_group in self.pending.values():
            by_group.get(group_id, {}).pop(tp, None)

    def replay_control(self, producer_id: int, commit: bool) -> None:
        """The producer's COMMIT/ABORT marker reached the offsets partition: apply or drop its pending
        offsets. A committed one replaces the partition's committed offset only if its record is the
        newer (Kafka's replayEndTransactionMarker): an OffsetCommit written after it, while the
        transaction was open, stays. A committed offset of unknown order (``rec.ORDER_UNKNOWN``, below
        every record) is always replaced, as the old version that wrote it replaced it."""
        pending = self.pending.pop(producer_id, None)
        if not pending or not commit:
            return
        for group_id, offsets in pending.items():
            for tp, om in offsets.items():
                existing = self.offsets.get(group_id, {}).get(tp)
                if existing is None or om.record_offset > existing.record_offset:
                    self.offsets.setdefault(group_id, {})[tp] = om

    def drop_group(self, group_id: str) -> None:
        """The group's metadata tombstone was replayed: it has no offsets any more, committed or
        pending (the offset tombstones before it already dropped them: ``tombstones``)."""
        self.offsets.pop(group_id, None)
        for by_group in self.pending.values():
            by_group.pop(group_id, None)

    # --- reads ---------------------------------------------------------------------------------------
    def has_committed(self, group_id: str, tp: TopicPartition) -> bool:
        return tp in self.offsets.get(group_id, {})

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        return any(tp in groups.get(group_id, {}) for groups in self.pending.values())

    def has_open_transactions(self, group_id: str) -> bool:
        return any(groups.get(group_id) for groups in self.pending.values())

    def fetch(self, group_id: str, partitions: list[TopicPartition] | None, require_stable: bool
              ) -> dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]]:
        committed = self.offsets.get(group_id, {})
        wanted = partitions if partitions is not None else sorted(committed)
        out: dict[TopicPartition, tuple[OffsetAndMetadata | None, ErrorCode]] = {}
        for tp in wanted:
            if require_stable and self.has_pending(group_id, tp):
                out[tp] = (None, ErrorCode.unstable_offset_commit)
            else:
                out[tp] = (committed.get(tp), ErrorCode.none)
        return out

    def snapshot_records(self, group_id: str) -> list[Record]:
        """The newest record of each committed offset of the group (pending ones stay in the log), each
        value with the ``record_offset`` of the record that committed it: written at a higher offset,
        it still orders as that record against a pending transactional offset below it. Every value
        carries one (each was replayed), ``rec.ORDER_UNKNOWN`` too: an old value whose order was
        unknown does not become as new as the checkpoint's own position."""
        return [(rec.offset_key(group_id, *tp), rec.offset_value(o))
                for tp, o in sorted(self.offsets.get(group_id, {}).items())]

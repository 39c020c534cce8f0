"""Per-partition producer state: idempotence (epochs, sequences, the last-5-batches dedupe window) and
open transactions (which drive the last stable offset).

Validate, then apply: ``prepare`` checks every batch of an append against scratch copies and raises
``ProducerStateError`` without touching the real state; ``complete`` applies the plan only after the
bytes were written. Recovery replays batch headers through the same two calls (origin REPLAY), so a
restarted broker holds exactly the state it held before, given the same log.

Rules (KIP-98/360, Kafka's ProducerAppendInfo):
- lower epoch than known: INVALID_PRODUCER_EPOCH (the producer was fenced or bumped);
- higher epoch: the first sequence must be 0;
- same epoch: a batch equal to one of the last 5 (first_seq, last_seq) is a duplicate answered with
  its original offsets; otherwise first_seq must be last_seq + 1 (wrapping after INT32_MAX);
- unknown producer (never seen or expired): any sequence is accepted;
- a producer whose entry was evicted to keep the broker's producer state within its bound
  (``ProducerStateBound``) is remembered by epoch while its eviction is among the last
  ``remembered``: at that epoch its batches get UNKNOWN_PRODUCER_ID (the client bumps its epoch,
  or fails if it cannot tell what was written), an older epoch INVALID_PRODUCER_EPOCH, a newer one
  must start at sequence 0. Once forgotten, an unknown producer id no higher than the highest one
  the partition ever evicted (``max_evicted_pid``, kept in the snapshot) gets UNKNOWN_PRODUCER_ID
  for any batch that does not start at sequence 0 (Kafka's answer before KIP-360): what is left
  is the retry of a producer's very first batch in the partition, evicted and forgotten between the
  send and the retry (``max_entries`` later entries, all written in between);
- a non-transactional batch from a producer with an open transaction: INVALID_TXN_STATE;
- a transaction starts at the producer's first transactional batch in the partition and ends at
  the COMMIT/ABORT marker the coordinator appends; markers with a stale epoch are refused.

Only the owning partition log calls this, from the broker's event loop thread.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from kio.schema.errors import ErrorCode

from oncelog.protocol import records as rb
from oncelog.storage import fileio
from oncelog.storage.errors import ProducerStateError

NUM_BATCHES_TO_RETAIN = 5
_INT32_MAX = 2**31 - 1


class AppendOrigin(Enum):
    CLIENT = "client"
    COORDINATOR = "coordinator"
    REPLAY = "replay"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int
    timestamp: int


@dataclass
class ProducerStateEntry:
    producer_id: int
    producer_epoch: int = -1
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    coordinator_epoch: int = -1
    current_txn_first_offset: int | None = None
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def copy(self) -> ProducerStateEntry:
        return dataclasses.replace(self, batches=deque(self.batches, maxlen=NUM_BATCHES_TO_RETAIN))


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    is_aborted: bool


@dataclass
class AppendPlan:
    """What ``complete`` will apply; ``duplicate`` is set when the append must be skipped."""

    duplicate: BatchMetadata | None = None
    steps: list[tuple[int, rb.BatchHeader, rb.ControlMarker | None]] = field(default_factory=list)


def _in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == _INT32_MAX)


class ProducerStateBound:
    """At most ``max_entries`` producer-state entries (one per partition and producer id) across
    every partition log of a broker, so that clients cannot grow the broker's memory, its snapshots
    and its restart time without limit by asking for producer ids (KIP-936's concern; Kafka keeps
    every entry for ``producer.id.expiration.ms``, a day).

    Invariants:
    - every entry of an attached manager has one key ``(token, pid)`` in ``_lru``, oldest write first;
    - past ``max_entries``, the least recently written entries without an open transaction are
      evicted, a few per write (``EVICTION_SCAN``), so no write pays for a long scan; entries with an
      open transaction are never evicted (a marker must find them), so the bound can be exceeded by
      as many open transactions as there are, each ended by its timeout at the latest;
    - an evicted entry's epoch is remembered (``_evicted``, the last ``remembered`` evictions, by
      default ``max_entries``; an int key and value, a tenth of an entry's memory) so that its
      producer is answered UNKNOWN_PRODUCER_ID, not taken for a new one; once forgotten, its
      partition's ``max_evicted_pid`` still refuses it any batch but one starting at sequence 0
      (module docstring).

    Only the broker's event loop thread calls it, as it does the managers."""

    EVICTION_SCAN = 64

    def __init__(self, max_entries: int, remembered: int | None = None) -> None:
        if max_entries < 1:
            raise ValueError(f"producer_state_max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self.remembered = max_entries if remembered is None else remembered
        self._lru: OrderedDict[tuple[int, int], ProducerStateManager] = OrderedDict()
        self._evicted: OrderedDict[tuple[int, int], int] = OrderedDict()
        self._tokens = itertools.count()  # next() is atomic: partitions of new topics attach off the loop
        self.evictions = 0  # entries evicted since start

    def __len__(self) -> int:
        return len(self._lru)

    def attach(self, mgr: ProducerStateManager) -> None:
        """Count ``mgr``'s entries (a partition log's state once loaded), oldest first."""
        mgr.bound, mgr.token = self, next(self._tokens)
        if mgr.producers:
            for pid in sorted(mgr.producers, key=lambda p: mgr.producers[p].last_timestamp):
                self._lru[(mgr.token, pid)] = mgr
            self._shrink()

    def detach(self, mgr: ProducerStateManager) -> None:
        """Stop counting ``mgr`` (its partition log closed or deleted)."""
        if mgr.bound is self:
            for pid in mgr.producers:
                self._lru.pop((mgr.token, pid), None)
            mgr.bound = None

    def touched(self, mgr: ProducerStateManager, pid: int, entry: ProducerStateEntry) -> None:
        """``entry`` of ``mgr`` was written: now the newest. Its eviction is forgotten once it knows
        a sequence again, or a newer epoch than the evicted one."""
        key = (mgr.token, pid)
        lru = self._lru
        if key in lru:
            lru.move_to_end(key)
        else:
            lru[key] = mgr
        if self._evicted and key in self._evicted and \
                (entry.batches or entry.producer_epoch > self._evicted[key]):
            del self._evicted[key]
        if len(lru) > self.max_entries:  # also when an open transaction just ended
            self._shrink()

    def forgot(self, mgr: ProducerStateManager, pid: int) -> None:
        self._lru.pop((mgr.token, pid), None)

    def evicted_epoch(self, mgr: ProducerStateManager, pid: int) -> int | None:
        return self._evicted.get((mgr.token, pid)) if self._evicted else None

    def _shrink(self) -> None:
        lru, evicted = self._lru, self._evicted
        for _ in range(min(self.EVICTION_SCAN, len(lru))):
            if len(lru) <= self.max_entries:
                return
            key, mgr = lru.popitem(last=False)
            pid = key[1]
            if pid in mgr.ongoing:
                lru[key] = mgr  # an open transaction: kept, looked at again after every other entry
                continue
            entry = mgr.producers.pop(pid, None)
            if entry is not None:
                mgr.max_evicted_pid = max(mgr.max_evicted_pid, pid)
                evicted[key] = entry.producer_epoch
                self.evictions += 1
                if len(evicted) > self.remembered:
                    evicted.popitem(last=False)


class ProducerStateManager:
    def __init__(self) -> None:
        self.producers: dict[int, ProducerStateEntry] = {}
        self.ongoing: dict[int, int] = {}  # producer_id -> first offset of its open transaction
        self.bound: ProducerStateBound | None = None  # set by ProducerStateBound.attach
        self.token = -1
        self.max_evicted_pid = -1  # the highest producer id the bound ever evicted here

    def _entry_for(self, pid: int, header: rb.BatchHeader, origin: AppendOrigin,
                   control: rb.ControlMarker | None) -> ProducerStateEntry:
        """The live entry of ``pid``, or the one a producer without it starts from: empty, or, if
        the bound evicted it, at its last epoch (so an older epoch is fenced and a newer one starts
        at sequence 0). While such an entry holds no batch (a marker may have made it again), a
        client batch at that very epoch gets UNKNOWN_PRODUCER_ID: its sequence cannot be checked."""
        entry = self.producers.get(pid)
        if entry is not None and entry.batches:
            return entry
        epoch = self.bound.evicted_epoch(self, pid) if self.bound is not None else None
        if epoch is None:
            # (an entry without batches knows no sequence either: a marker may have made it again)
            if pid <= self.max_evicted_pid and header.base_sequence > 0 and origin is AppendOrigin.CLIENT and \
                    control is None and (entry is None or entry.producer_epoch == header.producer_epoch):
                raise ProducerStateError(
                    ErrorCode.unknown_producer_id,
                    f"producer {pid} is unknown here, and producers up to {self.max_evicted_pid} were evicted to keep "
                    f"producer_state_max_entries: its first batch must start at sequence 0, not "
                    f"{header.base_sequence}; bump the epoch (InitProducerId) and resend")
            return entry if entry is not None else ProducerStateEntry(pid)
        if entry is None:
            entry = ProducerStateEntry(pid, epoch)
        if origin is AppendOrigin.CLIENT and control is None and header.producer_epoch == entry.producer_epoch == epoch:
            raise ProducerStateError(
                ErrorCode.unknown_producer_id,
                f"producer {pid} epoch {epoch}: its state was evicted to keep producer_state_max_entries; "
                "bump the epoch (InitProducerId) and resend")
        return entry

    # --- validation ------------------------------------------------------------------------------
    def prepare(self, headers: list[rb.BatchHeader], origin: AppendOrigin,
                control_types: list[rb.ControlMarker | None]) -> AppendPlan:
        """Check ``headers`` (offsets not yet assigned) against scratch state; raise on refusal.

        A single batch (every client append: Produce v3+ carries one per partition) is checked
        against the live entry itself: ``_check`` only reads it, and with no later batch to check
        there is nothing to apply to a scratch copy; ``complete`` applies it once written."""
        if len(headers) == 1 and origin is not AppendOrigin.REPLAY:
            return self._prepare_one(headers[0], origin, control_types[0])
        scratch: dict[int, ProducerStateEntry] = {}
        plan = AppendPlan()
        for header, control in zip(headers, control_types, strict=True):
            pid = header.producer_id
            if pid < 0 or origin is AppendOrigin.REPLAY:
                # Replay checks nothing (the log is what happened), so it needs no scratch state.
                plan.steps.append((pid, header, control))
                continue
            entry = scratch.get(pid)
            if entry is None:
                current = self._entry_for(pid, header, origin, control)
                entry = current.copy() if pid in self.producers else current
                scratch[pid] = entry
            self._check(entry, header, origin, control, len(headers))
            if entry.producer_epoch == header.producer_epoch and header.base_sequence >= 0 and \
                    control is None and origin is AppendOrigin.CLIENT:
                for b in entry.batches:
                    if b.first_seq == header.base_sequence and b.last_seq == header.last_sequence:
                        plan.duplicate = b
                        return plan
            self._apply_to(entry, header, control, first_offset=None)
            plan.steps.append((pid, header, control))
        return plan

    def _prepare_one(self, header: rb.BatchHeader, origin: AppendOrigin,
                     control: rb.ControlMarker | None) -> AppendPlan:
        """``prepare`` of one batch: the same checks and duplicate answer, no scratch state."""
        pid = header.producer_id
        plan = AppendPlan(steps=[(pid, header, control)])
        if pid < 0:
            return plan
        entry = self._entry_for(pid, header, origin, control)
        self._check(entry, header, origin, control, 1)
        if entry.producer_epoch == header.producer_epoch and header.base_sequence >= 0 and \
                control is None and origin is AppendOrigin.CLIENT:
            first_seq, last_seq = header.base_sequence, header.last_sequence
            for b in entry.batches:
                if b.first_seq == first_seq and b.last_seq == last_seq:
                    plan.duplicate = b
                    plan.steps = []
                    return plan
        return plan

    def _check(self, entry: ProducerStateEntry, header: rb.BatchHeader, origin: AppendOrigin,
               control: rb.ControlMarker | None, n_batches: int) -> None:
        epoch = header.producer_epoch
        known = entry.producer_epoch >= 0
        if known and epoch < entry.producer_epoch:
            raise ProducerStateError(
                ErrorCode.invalid_producer_epoch,
                f"producer {entry.producer_id} epoch {epoch} is older than current epoch {entry.producer_epoch}")
        if control is not None:
            if origin is AppendOrigin.CLIENT:
                raise ProducerStateError(ErrorCode.invalid_record, "clients may not write control batches")
            if control.coordinator_epoch < entry.coordinator_epoch:
                raise ProducerStateError(
                    ErrorCode.transaction_coordinator_fenced,
                    f"marker for producer {entry.producer_id} from coordinator epoch {control.coordinator_epoch}, "
                    f"older than {entry.coordinator_epoch}")
            return
        if header.is_transactional:
            pass
        elif entry.current_txn_first_offset is not None:
            raise ProducerStateError(
                ErrorCode.invalid_txn_state,
                f"producer {entry.producer_id} wrote a non-transactional batch during its transaction")
        if origin is not AppendOrigin.CLIENT or header.base_sequence < 0:
            return
        if known and epoch > entry.producer_epoch:
            if header.base_sequence != 0:
                raise ProducerStateError(
                    ErrorCode.out_of_order_sequence_number,
                    f"producer {entry.producer_id} new epoch {epoch} must start at sequence 0, "
                    f"got {header.base_sequence}")
            return
        if not known or not entry.batches:
            return
        for b in entry.batches:
            if b.first_seq == header.base_sequence and b.last_seq == header.last_sequence:
                if n_batches > 1:
                    raise ProducerStateError(ErrorCode.duplicate_sequence_number,
                                             "duplicate batch inside a multi-batch append")
                return  # a retry; ``prepare`` answers it with the original offsets
        if not _in_sequence(entry.last_seq, header.base_sequence):
            raise ProducerStateError(
                ErrorCode.out_of_order_sequence_number,
                f"producer {entry.producer_id} epoch {epoch}: expected sequence {entry.last_seq + 1}, "
                f"got {header.base_sequence}")

    # --- application -----------------------------------------------------------------------------
    @staticmethod
    def _apply_to(entry: ProducerStateEntry, header: rb.BatchHeader, control: rb.ControlMarker | None,
                  first_offset: int | None) -> CompletedTxn | None:
        if header.producer_epoch != entry.producer_epoch:
            if header.producer_epoch > entry.producer_epoch:
                entry.batches.clear()
            entry.producer_epoch = max(entry.producer_epoch, header.producer_epoch)
        entry.last_timestamp = max(entry.last_timestamp, header.max_timestamp)
        if header.is_control and control is None:
            return None  # a marker the log cleaner emptied: it only carries the producer's epoch
        if control is not None:
            done = None
            entry.coordinator_epoch = control.coordinator_epoch
            if entry.current_txn_first_offset is not None and first_offset is not None:
                done = CompletedTxn(entry.producer_id, entry.current_txn_first_offset, first_offset,
                                    control.type == rb.CONTROL_ABORT)
            entry.current_txn_first_offset = None
            return done
        if header.is_transactional and entry.current_txn_first_offset is None:
            entry.current_txn_first_offset = first_offset if first_offset is not None else -1
        if header.base_sequence >= 0 and first_offset is not None:
            entry.batches.append(BatchMetadata(header.base_sequence, header.last_sequence, first_offset,
                                               first_offset + header.last_offset_delta, header.max_timestamp))
        return None

    def complete(self, plan: AppendPlan, base_offsets: list[int],
                 written: list[rb.BatchHeader] | None = None) -> list[CompletedTxn]:
        """Apply a plan whose batches were written at ``base_offsets``; return finished transactions.

        ``written`` are the batches' headers as written, when the log changed them (LogAppendTime
        stamps the broker's time): the state keeps those timestamps, as Kafka's, which analyses the
        validated records. The client's (a replay's CreateTime of days ago) made producer expiry
        drop a producer the moment it wrote, and a retry of its acknowledged batch was written twice."""
        completed: list[CompletedTxn] = []
        bound = self.bound
        for i, ((pid, header, control), base) in enumerate(zip(plan.steps, base_offsets, strict=True)):
            if pid < 0:
                continue
            if written is not None:
                header = written[i]
            entry = self.producers.get(pid)
            if entry is None:  # (``prepare`` checked the batch against an evicted entry's epoch)
                entry = self.producers[pid] = ProducerStateEntry(pid)
            done = self._apply_to(entry, header, control, first_offset=base)
            if control is None and header.is_transactional and not header.is_control and pid not in self.ongoing:
                self.ongoing[pid] = entry.current_txn_first_offset if entry.current_txn_first_offset is not None \
                    else base
            if control is not None:
                self.ongoing.pop(pid, None)
                if done is not None:
                    completed.append(done)
            if bound is not None:
                bound.touched(self, pid, entry)
        return completed

    # --- queries ---------------------------------------------------------------------------------
    def first_unstable_offset(self) -> int | None:
        return min(self.ongoing.values()) if self.ongoing else None

    def remove_expired_producers(self, now_ms: int, producer_id_expiration_ms: int) -> int:
        expired = [pid for pid, e in self.producers.items()
                   if pid not in self.ongoing and now_ms - e.last_timestamp >= producer_id_expiration_ms]
        for pid in expired:
            del self.producers[pid]
            if self.bound is not None:
                self.bound.forgot(self, pid)
        return len(expired)

    # --- snapshots -------------------------------------------------------------------------------
    def snapshot_bytes(self, offset: int, aborted_txns: dict[int, int] | None = None) -> bytes:
        """The state as of ``offset``; ``aborted_txns`` maps a segment's base offset to how many
        aborted-transaction index entries it holds below ``offset`` (checked on load)."""
        body = json.dumps({
            "version": 1, "offset": offset, "aborted_txns": aborted_txns, "max_evicted_pid": self.max_evicted_pid,
            "producers": [[e.producer_id, e.producer_epoch, e.coordinator_epoch, e.current_txn_first_offset,
                           e.last_timestamp, [(b.first_seq, b.last_seq, b.first_offset, b.last_offset, b.timestamp)
                                              for b in e.batches]]
                          for e in self.producers.values()],
        }, separators=(",", ":")).encode()
        return zlib.crc32(body).to_bytes(4, "big") + body

    @classmethod
    def from_snapshot(cls, data: bytes) -> tuple[ProducerStateManager, int, dict[int, int]] | None:
        """(state, offset, aborted_txns) from a snapshot, or None if it is corrupt."""
        if len(data) < 4 or zlib.crc32(data[4:]) != int.from_bytes(data[:4], "big"):
            return None
        try:
            doc = json.loads(data[4:])
        except ValueError:
            return None
        mgr = cls()
        for pid, epoch, coord_epoch, txn_first, last_ts, batches in doc["producers"]:
            entry = ProducerStateEntry(pid, epoch, deque((BatchMetadata(*b) for b in batches),
                                                         maxlen=NUM_BATCHES_TO_RETAIN),
                                       coord_epoch, txn_first, last_ts)
            mgr.producers[pid] = entry
            if txn_first is not None:
                mgr.ongoing[pid] = txn_first
        mgr.max_evicted_pid = int(doc.get("max_evicted_pid", -1))
        aborted = {int(base): int(n) for base, n in (doc.get("aborted_txns") or {}).items()}
        return mgr, int(doc["offset"]), aborted


def write_snapshot(path: Path, data: bytes) -> None:
    fileio.fs.write_atomic(path, data)

"""The transaction coordinator, sans-IO (KIP-98, KIP-360, KIP-890, KIP-664).

Every handler reads the current state, decides, and returns a ``TxnResult`` with the records to
append to ``__transaction_state`` and the markers to write; it never mutates state. The server
appends the records, calls ``replay`` for each (the only place state changes), writes the markers,
then calls ``markers_written``, whose Complete* record it appends and replays the same way. Loading
after a restart is ``replay`` over the whole log followed by ``pending_markers()``: transactions left
in PrepareCommit/PrepareAbort get their markers written again.

Pending transitions (Kafka's ``TransactionMetadata.pendingState``): a server that waits for a
result's records to be durable before replaying them (fsyncs off its event loop) puts the
transactional id in ``pending`` from the moment the result is computed until the last of its records
is replayed. While it is there every request about that id answers CONCURRENT_TRANSACTIONS (a
retriable error; fencing errors come first where Kafka's do), the timeout scan and expiration skip
it and an admin abort is refused, so no second result is ever computed from the state the first one
is about to replace. ``snapshot_records`` is exact only while ``pending`` is empty.

Fencing: a new InitProducerId for a transactional id bumps its epoch; requests and produces that
carry an older epoch are refused (PRODUCER_FENCED here, INVALID_PRODUCER_EPOCH at the partitions).
An open transaction found by InitProducerId, by the timeout scan or by an admin abort is aborted
with a bumped epoch, so its zombie producer can neither write nor commit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from oncelog.clock import Clock
from oncelog.coordinator.transaction import log as txnlog
from oncelog.coordinator.transaction.state import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    TransactionMetadata,
    TransactionState,
    is_epoch_exhausted,
)

S = TransactionState
TopicPartition = tuple[str, int]


class ProducerIds(Protocol):
    def next_producer_id(self) -> int: ...

    def is_allocated(self, producer_id: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class WriteMarkers:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]


@dataclass
class TxnResult:
    error: ErrorCode = ErrorCode.none
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH
    records: list[tuple[bytes, bytes | None]] = field(default_factory=list)
    markers: list[WriteMarkers] = field(default_factory=list)
    partition_errors: dict[TopicPartition, ErrorCode] = field(default_factory=dict)
    # The records must be durable before the reply (or the markers) go out: epoch bumps, Ongoing,
    # Prepare*. Complete* and expirations need not be: losing them replays the step before them.
    durable: bool = True


def _record(meta: TransactionMetadata) -> tuple[bytes, bytes | None]:
    return txnlog.encode_key(meta.transactional_id), txnlog.encode_value(meta)


class TransactionCoordinator:
    def __init__(self, producer_ids: ProducerIds, clock: Clock, *, transaction_max_timeout_ms: int = 900_000,
                 transactional_id_expiration_ms: int = 604_800_000, coordinator_epoch: int = 0,
                 offsets_partition_for: Callable[[str], TopicPartition] | None = None,
                 transactional_id_max_entries: int = 2**63 - 1) -> None:
        self.producer_ids = producer_ids
        self.clock = clock
        self.transaction_max_timeout_ms = transaction_max_timeout_ms
        self.transactional_id_expiration_ms = transactional_id_expiration_ms
        self.transactional_id_max_entries = transactional_id_max_entries
        self.expired_early = 0  # idle ids tombstoned by the count bound (``expire_steps``), since start
        self.coordinator_epoch = coordinator_epoch
        self.offsets_partition_for = offsets_partition_for or (lambda _g: ("__consumer_offsets", 0))
        self.transactions: dict[str, TransactionMetadata] = {}
        self._by_producer_id: dict[int, str] = {}
        # transactional ids with a computed result whose records are not all replayed yet (module doc)
        self.pending: set[str] = set()

    # --- replay: the only mutation ----------------------------------------------------------------
    def replay(self, key: bytes, value: bytes | None) -> None:
        transactional_id = txnlog.decode_key(key)
        old = self.transactions.pop(transactional_id, None)
        if old is not None:
            self._by_producer_id.pop(old.producer_id, None)
        if value is None:
            return
        meta = txnlog.decode_value(transactional_id, value)
        self.transactions[transactional_id] = meta
        self._by_producer_id[meta.producer_id] = transactional_id

    def snapshot_records(self) -> list[tuple[bytes, bytes | None]]:
        """The newest record of every live transactional id, as log compaction would keep them.

        Invariant: ``transactions`` changes only by :meth:`replay`, so it always equals the newest
        record per key of the log; replaying these records alone into an empty coordinator rebuilds
        the same ``transactions`` (Prepare* states included, so their markers are still completed).
        """
        return [(txnlog.encode_key(t), txnlog.encode_value(m)) for t, m in sorted(self.transactions.items())]

    def state_of(self, transactional_id: str) -> TransactionMetadata | None:
        return self.transactions.get(transactional_id)

    def transactional_id_of(self, producer_id: int) -> str | None:
        """The transactional id whose current producer id is ``producer_id``, if any."""
        return self._by_producer_id.get(producer_id)

    # --- InitProducerId -------------------------------------------------------------------------
    def init_producer_id(self, transactional_id: str | None, transaction_timeout_ms: int,
                         producer_id: int = NO_PRODUCER_ID, producer_epoch: int = NO_PRODUCER_EPOCH) -> TxnResult:
        """InitProducerId, fresh (no producer id/epoch) or KIP-360 re-init (the caller's current ones).

        Invariants (Kafka's TransactionCoordinator, made stricter where it let a zombie in):
        - A fresh init and every fence (an init that finds a transaction open, a timeout, an admin
          abort) set ``last_producer_epoch`` to -1: afterwards no earlier incarnation's epoch can be
          taken for a retry of the last bump.
        - A re-init is valid only with the current (producer id, epoch), or with the epoch of the
          last KIP-360 bump (a retry whose answer was lost: answered again without a new bump).
          Anything else is PRODUCER_FENCED and changes nothing, whatever the state: a zombie cannot
          take, bump or abort the current instance's epoch or transaction.
        - At most one epoch per transactional id is live: the one in the newest record.
        """
        if (producer_id == NO_PRODUCER_ID) != (producer_epoch == NO_PRODUCER_EPOCH):
            return TxnResult(ErrorCode.invalid_request)
        if transactional_id is None:
            return TxnResult(producer_id=self.producer_ids.next_producer_id(), producer_epoch=0)
        if not transactional_id:  # Kafka: only a null id is idempotent; an empty one is refused
            return TxnResult(ErrorCode.invalid_request)
        if not 0 < transaction_timeout_ms <= self.transaction_max_timeout_ms:
            return TxnResult(ErrorCode.invalid_transaction_timeout)
        if transactional_id in self.pending:  # Kafka: checked first, before the epochs
            return TxnResult(ErrorCode.concurrent_transactions)
        now = self.clock.now_ms()
        meta = self.transactions.get(transactional_id)
        if meta is None or meta.state is S.DEAD:
            new = TransactionMetadata(transactional_id, self.producer_ids.next_producer_id(), NO_PRODUCER_ID, 0,
                                      NO_PRODUCER_EPOCH, transaction_timeout_ms, S.EMPTY, frozenset(), -1, now)
            return TxnResult(producer_id=new.producer_id, producer_epoch=0, records=[_record(new)])
        expected = producer_id != NO_PRODUCER_ID
        retried = False
        if expected:
            current = (producer_id, producer_epoch) == (meta.producer_id, meta.producer_epoch)
            retried = not current and meta.last_producer_epoch != NO_PRODUCER_EPOCH and \
                producer_epoch == meta.last_producer_epoch and \
                producer_id in (meta.producer_id, meta.previous_producer_id)
            if not current and not retried:
                return TxnResult(ErrorCode.producer_fenced)
        if meta.is_prepare or meta.state is S.PREPARE_EPOCH_FENCE:
            return TxnResult(ErrorCode.concurrent_transactions)
        if meta.state is S.ONGOING:
            # Fence the previous incarnation: abort its transaction under a bumped epoch. The client
            # retries on CONCURRENT_TRANSACTIONS and then finds CompleteAbort.
            result = self._abort_with_bump(meta, now)
            result.error = ErrorCode.concurrent_transactions
            return result
        if retried:
            # The bump for this request already happened; answer it again (KIP-360 retry).
            return TxnResult(producer_id=meta.producer_id, producer_epoch=meta.producer_epoch)
        last_epoch = meta.producer_epoch if expected else NO_PRODUCER_EPOCH
        if is_epoch_exhausted(meta.producer_epoch):
            new = meta.transition(S.EMPTY, producer_id=self.producer_ids.next_producer_id(),
                                  previous_producer_id=meta.producer_id, producer_epoch=0,
                                  last_producer_epoch=last_epoch, txn_timeout_ms=transaction_timeout_ms,
                                  topic_partitions=frozenset(), txn_start_timestamp_ms=-1,
                                  txn_last_update_timestamp_ms=now)
        else:
            new = meta.transition(S.EMPTY, producer_epoch=meta.producer_epoch + 1,
                                  last_producer_epoch=last_epoch, txn_timeout_ms=transaction_timeout_ms,
                                  topic_partitions=frozenset(), txn_start_timestamp_ms=-1,
                                  txn_last_update_timestamp_ms=now)
        return TxnResult(producer_id=new.producer_id, producer_epoch=new.producer_epoch, records=[_record(new)])

    def _abort_with_bump(self, meta: TransactionMetadata, now: int) -> TxnResult:
        # Kafka's prepareFenceProducerEpoch. The bump must happen even at the last epoch a client can
        # hold (MAX_PRODUCER_EPOCH - 1): without it the fenced instance's epoch stays current, and it
        # could add partitions to and commit a transaction whose first records were just aborted.
        # No client holds MAX_PRODUCER_EPOCH (an init at an exhausted epoch allocates a new producer
        # id), so no open transaction is ever at it; the cap only keeps the epoch a short.
        # A fence clears the last epoch: the fenced incarnation's epoch must never pass for a retry
        # of a KIP-360 bump.
        epoch = min(meta.producer_epoch + 1, MAX_PRODUCER_EPOCH)
        new = meta.transition(S.PREPARE_ABORT, producer_epoch=epoch, last_producer_epoch=NO_PRODUCER_EPOCH,
                              txn_last_update_timestamp_ms=now)
        return TxnResult(producer_id=new.producer_id, producer_epoch=epoch, records=[_record(new)],
                         markers=[self._markers(new, commit=False)])

    def _markers(self, meta: TransactionMetadata, *, commit: bool) -> WriteMarkers:
        return WriteMarkers(meta.transactional_id, meta.producer_id, meta.producer_epoch, self.coordinator_epoch,
                            commit, meta.topic_partitions)

    # --- validation shared by the transactional requests ---------------------------------------
    def _check(self, transactional_id: str, producer_id: int, producer_epoch: int
               ) -> tuple[TransactionMetadata | None, ErrorCode]:
        meta = self.transactions.get(transactional_id)
        if meta is None or meta.state is S.DEAD or meta.producer_id != producer_id:
            return None, ErrorCode.invalid_producer_id_mapping
        if producer_epoch != meta.producer_epoch:
            return None, ErrorCode.producer_fenced
        if transactional_id in self.pending:
            return None, ErrorCode.concurrent_transactions
        return meta, ErrorCode.none

    # --- AddPartitionsToTxn / AddOffsetsToTxn ---------------------------------------------------
    def add_partitions_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                              partitions: Iterable[TopicPartition]) -> TxnResult:
        parts = frozenset(partitions)
        meta, error = self._check(transactional_id, producer_id, producer_epoch)
        if meta is not None and (meta.is_prepare or meta.state is S.PREPARE_EPOCH_FENCE):
            error = ErrorCode.concurrent_transactions
        if meta is None or error != ErrorCode.none:
            return TxnResult(error, partition_errors=dict.fromkeys(parts, error))
        ok = dict.fromkeys(parts, ErrorCode.none)
        if meta.state is S.ONGOING and parts <= meta.topic_partitions:
            return TxnResult(partition_errors=ok)
        now = self.clock.now_ms()
        start = meta.txn_start_timestamp_ms if meta.state is S.ONGOING else now
        new = meta.transition(S.ONGOING, topic_partitions=meta.topic_partitions | parts,
                              txn_start_timestamp_ms=start, txn_last_update_timestamp_ms=now)
        return TxnResult(producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                         records=[_record(new)], partition_errors=ok)

    def add_offsets_to_txn(self, transactional_id: str, producer_id: int, producer_epoch: int,
                           group_id: str) -> TxnResult:
        return self.add_partitions_to_txn(transactional_id, producer_id, producer_epoch,
                                          [self.offsets_partition_for(group_id)])

    # --- EndTxn ----------------------------------------------------------------------------------
    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, committed: bool) -> TxnResult:
        meta, error = self._check(transactional_id, producer_id, producer_epoch)
        if meta is None:
            return TxnResult(error)
        state = meta.state
        if state is S.ONGOING:
            now = self.clock.now_ms()
            new = meta.transition(S.PREPARE_COMMIT if committed else S.PREPARE_ABORT,
                                  txn_last_update_timestamp_ms=now)
            return TxnResult(producer_id=meta.producer_id, producer_epoch=meta.producer_epoch,
                             records=[_record(new)], markers=[self._markers(new, commit=committed)])
        if state is S.COMPLETE_COMMIT:
            return TxnResult(ErrorCode.none if committed else ErrorCode.invalid_txn_state)
        if state is S.COMPLETE_ABORT:
            return TxnResult(ErrorCode.invalid_txn_state if committed else ErrorCode.none)
        if state is S.PREPARE_COMMIT:
            return TxnResult(ErrorCode.concurrent_transactions if committed else ErrorCode.invalid_txn_state)
        if state is S.PREPARE_ABORT:
            return TxnResult(ErrorCode.invalid_txn_state if committed else ErrorCode.concurrent_transactions)
        return TxnResult(ErrorCode.invalid_txn_state)  # Empty, PrepareEpochFence

    def markers_written(self, transactional_id: str, producer_id: int, producer_epoch: int,
                        commit: bool) -> TxnResult:
        """Second phase: every marker is in place; record Complete*. The record keeps the
        transaction's start time (Kafka's prepareComplete): DescribeTransactions and the duration
        filter of ListTransactions report it until the next transaction starts or an
        InitProducerId resets it to -1."""
        meta = self.transactions.get(transactional_id)
        expected = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if meta is None or meta.state is not expected or meta.producer_id != producer_id:
            return TxnResult()
        new = meta.transition(S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT, topic_partitions=frozenset(),
                              txn_last_update_timestamp_ms=self.clock.now_ms())
        return TxnResult(producer_id=new.producer_id, producer_epoch=new.producer_epoch, records=[_record(new)],
                         durable=False)

    def pending_markers(self) -> list[WriteMarkers]:
        return [self._markers(m, commit=m.state is S.PREPARE_COMMIT)
                for m in self.transactions.values() if m.is_prepare]

    # --- timeouts and expiration -----------------------------------------------------------------
    def expire(self, now_ms: int) -> list[TxnResult]:
        return [result for _, result in self.expire_steps(now_ms)]

    def expire_steps(self, now_ms: int) -> list[tuple[str, TxnResult]]:
        """The timeout scan: (transactional id, step) for every transaction open past its timeout
        (abort with an epoch bump) and every idle id past transactional.id.expiration.ms
        (tombstone). Pending ids are skipped: their step in flight decides them first.

        And a bound on memory: while more than ``transactional_id_max_entries`` ids would remain,
        the idle ones updated longest ago are tombstoned too, as if their expiration had come
        (a client asking for id after id otherwise grows the coordinator for a week). That is as
        safe as the expiration itself: the id's next InitProducerId gets a new producer id, and the
        old one's zombie is refused by the checks on producer id ownership. Only idle ids (Empty,
        CompleteCommit, CompleteAbort) go: an open or completing transaction is never forgotten."""
        steps = []
        idle: list[TransactionMetadata] = []
        expiring = 0
        for meta in list(self.transactions.values()):
            tid = meta.transactional_id
            if tid in self.pending:
                continue
            if meta.state is S.ONGOING and now_ms - meta.txn_start_timestamp_ms > meta.txn_timeout_ms:
                steps.append((tid, self._abort_with_bump(meta, now_ms)))
            elif meta.state in (S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT):
                if now_ms - meta.txn_last_update_timestamp_ms > self.transactional_id_expiration_ms:
                    steps.append((tid, self._tombstone(tid)))
                    expiring += 1
                else:
                    idle.append(meta)
        excess = len(self.transactions) - expiring - self.transactional_id_max_entries
        if excess > 0:
            for meta in heapq.nsmallest(excess, idle, key=lambda m: m.txn_last_update_timestamp_ms):
                steps.append((meta.transactional_id, self._tombstone(meta.transactional_id)))
                self.expired_early += 1
        return steps

    @staticmethod
    def _tombstone(transactional_id: str) -> TxnResult:
        return TxnResult(records=[(txnlog.encode_key(transactional_id), None)], durable=False)

    def open_transactions(self) -> list[str]:
        """Transactional ids whose transaction is Ongoing."""
        return [t for t, m in self.transactions.items() if m.state is S.ONGOING]

    def is_tracked(self, producer_id: int, topic: str, partition: int) -> bool:
        """True if the coordinator knows ``producer_id``'s transaction as open on the partition
        (Ongoing or being completed): its marker will come from the coordinator."""
        tid = self._by_producer_id.get(producer_id)
        meta = self.transactions.get(tid) if tid is not None else None
        return meta is not None and (meta.state is S.ONGOING or meta.is_prepare) and \
            (topic, partition) in meta.topic_partitions

    def abort_transaction(self, transactional_id: str) -> TxnResult:
        """Admin abort of an open transaction (like a timeout: the epoch is bumped)."""
        meta = self.transactions.get(transactional_id)
        if meta is None:
            return TxnResult(ErrorCode.transactional_id_not_found)
        if transactional_id in self.pending:
            return TxnResult(ErrorCode.concurrent_transactions)
        if meta.state is not S.ONGOING:
            return TxnResult(ErrorCode.invalid_txn_state)
        return self._abort_with_bump(meta, self.clock.now_ms())

    # --- the produce-side checks (KIP-890, producer id ownership) --------------------------------
    def check_produce(self, producer_id: int, producer_epoch: int, transactional_id: str | None,
                      transactional: bool, topic: str, partition: int) -> ErrorCode:
        """NONE if a batch with these producer fields may be appended to ``topic``-``partition`` by a
        produce request naming ``transactional_id``.

        - A producer id this broker never handed out is refused (INVALID_PRODUCER_ID_MAPPING): a
          stranger guessing ids must not seed state that a later owner of the id would trip over.
        - A non-transactional batch carrying a transactional producer's id is refused the same way:
          only the coordinator decides that producer's epochs, and a stranger's higher epoch in a
          partition would otherwise refuse the coordinator's COMMIT marker.
        - A transactional batch must pass KIP-890 (:meth:`is_partition_in_transaction`).
        """
        if producer_id < 0:
            return ErrorCode.none
        if not self.producer_ids.is_allocated(producer_id):
            return ErrorCode.invalid_producer_id_mapping
        if transactional:
            return self.is_partition_in_transaction(transactional_id, producer_id, producer_epoch, topic, partition)
        if producer_id in self._by_producer_id:
            return ErrorCode.invalid_producer_id_mapping
        return ErrorCode.none

    def is_partition_in_transaction(self, transactional_id: str | None, producer_id: int, producer_epoch: int,
                                    topic: str, partition: int) -> ErrorCode:
        """NONE if the ongoing transaction of ``transactional_id`` is this producer's and contains
        the partition.

        Otherwise INVALID_PRODUCER_ID_MAPPING when the producer id is not the transactional id's (a
        stranger that guessed a live producer id and names a transactional id it may write to, as
        Kafka's coordinator checks the request's transactional id against the producer id),
        INVALID_PRODUCER_EPOCH for a stale epoch (a fenced zombie) and INVALID_TXN_STATE for a write
        outside an ongoing transaction, so a late produce can never land in the next one.
        """
        owner = self._by_producer_id.get(producer_id)
        meta = self.transactions.get(owner) if owner is not None else None
        if meta is None or owner != transactional_id:
            return ErrorCode.invalid_producer_id_mapping
        if producer_epoch < meta.producer_epoch:
            return ErrorCode.invalid_producer_epoch
        if meta.state is not S.ONGOING or producer_epoch != meta.producer_epoch or \
                (topic, partition) not in meta.topic_partitions:
            return ErrorCode.invalid_txn_state
        return ErrorCode.none

    # --- KIP-664 admin views --------------------------------------------------------------------
    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[dict[str, Any]]:
        """Kafka's handleDescribeTransactions: INVALID_REQUEST for an empty id,
        TRANSACTIONAL_ID_NOT_FOUND for an unknown (or Dead) one, else its state."""
        out = []
        for tid in transactional_ids:
            meta = self.transactions.get(tid)
            if not tid:
                out.append({"error_code": ErrorCode.invalid_request, "transactional_id": tid})
                continue
            if meta is None or meta.state is S.DEAD:
                out.append({"error_code": ErrorCode.transactional_id_not_found, "transactional_id": tid})
                continue
            by_topic: dict[str, list[int]] = {}
            for t, p in sorted(meta.topic_partitions):
                by_topic.setdefault(t, []).append(p)
            out.append({"error_code": ErrorCode.none, "transactional_id": tid, "transaction_state": meta.state.value,
                        "transaction_timeout_ms": meta.txn_timeout_ms,
                        "transaction_start_time_ms": meta.txn_start_timestamp_ms,
                        "producer_id": meta.producer_id, "producer_epoch": meta.producer_epoch,
                        "topics": [{"topic": t, "partitions": ps} for t, ps in by_topic.items()]})
        return out

    def list_transactions(self, state_filters: Iterable[str] = (), producer_id_filters: Iterable[int] = (),
                          duration_filter_ms: int = -1) -> list[dict[str, Any]]:
        """Kafka's listTransactionStates. Dead ids are never listed. A non-empty ``state_filters``
        keeps the ids whose state is named in it: names of no state (the caller reports them as
        unknown) match nothing, so a filter of unknown names only lists nothing. A
        ``duration_filter_ms`` >= 0 keeps the ids whose last transaction started more than that
        long ago, whatever their state (a completed one keeps its start time; an id with none, -1,
        always passes)."""
        states = set(state_filters)
        pids = set(producer_id_filters)
        now = self.clock.now_ms()
        out = []
        for meta in self.transactions.values():
            if meta.state is S.DEAD:
                continue
            if pids and meta.producer_id not in pids:
                continue
            if states and meta.state.value not in states:
                continue
            if duration_filter_ms >= 0 and now - meta.txn_start_timestamp_ms <= duration_filter_ms:
                continue
            out.append({"transactional_id": meta.transactional_id, "producer_id": meta.producer_id,
                        "transaction_state": meta.state.value})
        return out

"""Transaction states and their allowed transitions, as data (Kafka's TransactionState).

``TransactionMetadata`` is immutable: a handler computes the next metadata with ``transition``
(which refuses any move not in ``VALID_PREVIOUS``), encodes it as a ``__transaction_state`` record,
and the coordinator adopts it only when the record is replayed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum


class TransactionState(Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    DEAD = "Dead"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"


S = TransactionState

VALID_PREVIOUS: dict[TransactionState, frozenset[TransactionState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
#: Short.MAX_VALUE. Only a fence (the coordinator's abort under a bumped epoch) reaches it, so that a
#: client at the last epoch it can hold is still fenced; no client is ever handed it.
MAX_PRODUCER_EPOCH = 32767


def is_epoch_exhausted(producer_epoch: int) -> bool:
    """Kafka's ``TransactionMetadata.isEpochExhausted``: from ``MAX_PRODUCER_EPOCH - 1`` on, the next
    InitProducerId allocates a new producer id instead of bumping the epoch, which keeps one bump in
    reserve for a fence."""
    return producer_epoch >= MAX_PRODUCER_EPOCH - 1


class IllegalStateTransition(Exception):
    pass


@dataclass(frozen=True, slots=True)
class TransactionMetadata:
    transactional_id: str
    producer_id: int
    previous_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    txn_timeout_ms: int
    state: TransactionState
    topic_partitions: frozenset[tuple[str, int]]
    txn_start_timestamp_ms: int
    txn_last_update_timestamp_ms: int

    def transition(self, state: TransactionState, **changes: object) -> TransactionMetadata:
        """The metadata after moving to ``state``; raises on a move the table does not allow."""
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalStateTransition(
                f"{self.transactional_id}: {self.state.value} -> {state.value} is not a valid transition")
        return dataclasses.replace(self, state=state, **changes)  # type: ignore[arg-type]

    @property
    def is_prepare(self) -> bool:
        return self.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT)

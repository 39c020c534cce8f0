"""The sans-IO transaction coordinator, driven like the server drives it, with a manual clock."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.coordinator.producer_ids import InMemoryProducerIdManager, ProducerIdManager
from oncelog.coordinator.transaction.coordinator import TransactionCoordinator, TxnResult
from oncelog.coordinator.transaction.state import (
    MAX_PRODUCER_EPOCH,
    VALID_PREVIOUS,
    IllegalStateTransition,
    TransactionMetadata,
    TransactionState,
)

S = TransactionState
TP = ("t", 0)


class Harness:
    """Plays the server: append records to a list (the log), replay them, write markers, complete."""

    def __init__(self, clock: ManualClock | None = None, **kw: int) -> None:
        self.clock = clock or ManualClock()
        self.log: list[tuple[bytes, bytes | None]] = []
        self.markers: list[tuple[int, int, bool, frozenset]] = []
        self.tc = TransactionCoordinator(InMemoryProducerIdManager(), self.clock, **kw)
        self.write_markers = True

    def apply(self, result: TxnResult) -> TxnResult:
        for key, value in result.records:
            self.log.append((key, value))
            self.tc.replay(key, value)
        if self.write_markers:
            for m in result.markers:
                self.markers.append((m.producer_id, m.producer_epoch, m.commit, m.partitions))
                self.apply(self.tc.markers_written(m.transactional_id, m.producer_id, m.producer_epoch, m.commit))
        return result

    def init(self, tid: str = "a", timeout: int = 60_000, pid: int = -1, epoch: int = -1) -> TxnResult:
        return self.apply(self.tc.init_producer_id(tid, timeout, pid, epoch))

    def state(self, tid: str = "a") -> TransactionMetadata:
        meta = self.tc.state_of(tid)
        assert meta is not None
        return meta


def test_full_commit_cycle_and_replay_gives_the_same_state() -> None:
    h = Harness()
    r = h.init()
    pid = r.producer_id
    assert (r.error, r.producer_epoch, h.state().state) == (ErrorCode.none, 0, S.EMPTY)
    r = h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP, ("t", 1)]))
    assert r.partition_errors == {TP: ErrorCode.none, ("t", 1): ErrorCode.none}
    assert h.state().state is S.ONGOING
    # adding the same partitions again writes nothing
    assert h.tc.add_partitions_to_txn("a", pid, 0, [TP]).records == []
    h.apply(h.tc.add_offsets_to_txn("a", pid, 0, "group"))
    assert ("__consumer_offsets", 0) in h.state().topic_partitions
    r = h.apply(h.tc.end_txn("a", pid, 0, committed=True))
    assert r.error == ErrorCode.none and h.state().state is S.COMPLETE_COMMIT
    assert h.markers == [(pid, 0, True, frozenset({TP, ("t", 1), ("__consumer_offsets", 0)}))]
    # retried commit is fine, a mismatched abort is not
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.none
    assert h.tc.end_txn("a", pid, 0, committed=False).error == ErrorCode.invalid_txn_state
    fresh = TransactionCoordinator(InMemoryProducerIdManager(100), h.clock)
    for k, v in h.log:
        fresh.replay(k, v)
    assert fresh.state_of("a") == h.state()


def test_abort_cycle_and_end_txn_errors() -> None:
    h = Harness()
    pid = h.init().producer_id
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.invalid_txn_state  # Empty
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    h.apply(h.tc.end_txn("a", pid, 0, committed=False))
    assert h.state().state is S.COMPLETE_ABORT and h.markers[-1][2] is False
    assert h.tc.end_txn("a", pid, 0, committed=False).error == ErrorCode.none
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.invalid_txn_state
    assert h.tc.end_txn("a", pid + 1, 0, committed=True).error == ErrorCode.invalid_producer_id_mapping
    assert h.tc.end_txn("nope", pid, 0, committed=True).error == ErrorCode.invalid_producer_id_mapping
    assert h.tc.end_txn("a", pid, 7, committed=True).error == ErrorCode.producer_fenced


def test_prepare_states_answer_concurrent_transactions() -> None:
    h = Harness()
    pid = h.init().producer_id
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    h.write_markers = False  # crash between PrepareCommit and the markers
    h.apply(h.tc.end_txn("a", pid, 0, committed=True))
    assert h.state().state is S.PREPARE_COMMIT
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.concurrent_transactions
    assert h.tc.end_txn("a", pid, 0, committed=False).error == ErrorCode.invalid_txn_state
    assert h.tc.add_partitions_to_txn("a", pid, 0, [TP]).error == ErrorCode.concurrent_transactions
    assert h.tc.init_producer_id("a", 60_000).error == ErrorCode.concurrent_transactions
    # restart: replaying the log leaves the transaction to finish
    fresh = TransactionCoordinator(InMemoryProducerIdManager(100), h.clock)
    for k, v in h.log:
        fresh.replay(k, v)
    [pending] = fresh.pending_markers()
    assert pending.commit and pending.partitions == frozenset({TP}) and pending.producer_id == pid
    done = fresh.markers_written("a", pid, 0, True)
    for k, v in done.records:
        fresh.replay(k, v)
    assert fresh.state_of("a").state is S.COMPLETE_COMMIT  # type: ignore[union-attr]
    assert fresh.pending_markers() == []


def test_prepare_abort_answers_concurrent_for_abort_retries() -> None:
    h = Harness()
    pid = h.init().producer_id
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    h.write_markers = False
    h.apply(h.tc.end_txn("a", pid, 0, committed=False))
    assert h.tc.end_txn("a", pid, 0, committed=False).error == ErrorCode.concurrent_transactions
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.invalid_txn_state


def test_init_during_an_open_transaction_fences_and_aborts_it() -> None:
    h = Harness()
    pid = h.init().producer_id
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    r = h.init()
    assert r.error == ErrorCode.concurrent_transactions
    assert h.markers == [(pid, 1, False, frozenset({TP}))]  # the abort carries the bumped epoch
    assert h.state().state is S.COMPLETE_ABORT
    r = h.init()  # the client's retry
    assert (r.error, r.producer_id, r.producer_epoch) == (ErrorCode.none, pid, 2)
    # the zombie (epoch 0) is fenced everywhere
    assert h.tc.add_partitions_to_txn("a", pid, 0, [TP]).error == ErrorCode.producer_fenced
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.producer_fenced
    assert h.tc.is_partition_in_transaction("a", pid, 0, *TP) == ErrorCode.invalid_producer_epoch


def test_kip_890_produce_check() -> None:
    h = Harness()
    pid = h.init().producer_id
    assert h.tc.is_partition_in_transaction("a", pid, 0, *TP) == ErrorCode.invalid_txn_state  # nothing added
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    assert h.tc.is_partition_in_transaction("a", pid, 0, *TP) == ErrorCode.none
    # the same producer id and epoch under another transactional id (or none): not its transaction
    assert h.tc.is_partition_in_transaction("b", pid, 0, *TP) == ErrorCode.invalid_producer_id_mapping
    assert h.tc.is_partition_in_transaction(None, pid, 0, *TP) == ErrorCode.invalid_producer_id_mapping
    assert h.tc.is_partition_in_transaction("a", pid, 0, "t", 9) == ErrorCode.invalid_txn_state
    h.apply(h.tc.end_txn("a", pid, 0, committed=True))
    # a late produce after the commit cannot land in the next transaction
    assert h.tc.is_partition_in_transaction("a", pid, 0, *TP) == ErrorCode.invalid_txn_state
    assert h.tc.is_partition_in_transaction("a", 9999, 0, *TP) == ErrorCode.invalid_producer_id_mapping


def test_kip_360_reinit_with_current_and_retried_epochs() -> None:
    h = Harness()
    pid = h.init().producer_id
    r = h.init(pid=pid, epoch=0)
    assert (r.error, r.producer_epoch) == (ErrorCode.none, 1)
    r = h.init(pid=pid, epoch=0)  # a retry of the same request: answered with the current epoch
    assert (r.error, r.producer_epoch) == (ErrorCode.none, 1)
    assert h.init(pid=pid, epoch=5).error == ErrorCode.producer_fenced
    assert h.init(pid=pid + 50, epoch=1).error == ErrorCode.producer_fenced


LAST_CLIENT_EPOCH = MAX_PRODUCER_EPOCH - 1  # the highest epoch InitProducerId hands out


def _at_epoch(h: Harness, epoch: int, tid: str = "a") -> int:
    """Puts ``tid`` (initialised, Empty) at ``epoch``, as that many re-inits would; its producer id."""
    from oncelog.coordinator.transaction import log as txnlog

    meta = h.state(tid)
    at = TransactionMetadata(**{**{f: getattr(meta, f) for f in meta.__dataclass_fields__}, "producer_epoch": epoch})
    h.tc.replay(txnlog.encode_key(tid), txnlog.encode_value(at))
    return meta.producer_id


@pytest.mark.parametrize("epoch", [LAST_CLIENT_EPOCH, MAX_PRODUCER_EPOCH])
def test_epoch_exhaustion_allocates_a_new_producer_id(epoch: int) -> None:
    h = Harness()
    h.init()
    pid = _at_epoch(h, epoch)
    r = h.init()
    assert r.producer_id != pid and r.producer_epoch == 0
    assert h.state().previous_producer_id == pid


def test_the_epoch_before_the_last_is_bumped_into_the_last_a_client_holds() -> None:
    h = Harness()
    h.init()
    pid = _at_epoch(h, LAST_CLIENT_EPOCH - 1)
    r = h.init(pid=pid, epoch=LAST_CLIENT_EPOCH - 1)
    assert (r.error, r.producer_id, r.producer_epoch) == (ErrorCode.none, pid, LAST_CLIENT_EPOCH)


def _fence_at_the_last_epoch(how: str) -> tuple[Harness, int]:
    clock = ManualClock()
    h = Harness(clock)
    h.init(timeout=1000)
    pid = _at_epoch(h, LAST_CLIENT_EPOCH)
    h.apply(h.tc.add_partitions_to_txn("a", pid, LAST_CLIENT_EPOCH, [TP]))
    if how == "init":
        assert h.init(timeout=1000).error == ErrorCode.concurrent_transactions
    elif how == "timeout":
        clock.advance(1001)
        for r in h.tc.expire(clock.now_ms()):
            h.apply(r)
    else:
        h.apply(h.tc.abort_transaction("a"))
    return h, pid


@pytest.mark.parametrize("how", ["init", "timeout", "admin abort"])
def test_a_fence_at_the_last_epoch_a_client_holds_still_bumps_it(how: str) -> None:
    """Kafka's prepareFenceProducerEpoch bumps up to Short.MAX_VALUE. Without that bump the fenced
    instance (at the last epoch it can hold) kept a current epoch: it could add partitions to a new
    transaction and commit it, after the fence had aborted the records it wrote before (a torn
    transaction, found by an adversarial probe of 32,766 InitProducerIds on a real broker)."""
    h, pid = _fence_at_the_last_epoch(how)
    assert h.state().state is S.COMPLETE_ABORT and h.state().producer_epoch == MAX_PRODUCER_EPOCH
    assert h.markers == [(pid, MAX_PRODUCER_EPOCH, False, frozenset({TP}))]
    zombie = ("a", pid, LAST_CLIENT_EPOCH)
    assert h.tc.add_partitions_to_txn(*zombie, [("t", 1)]).error == ErrorCode.producer_fenced
    assert h.tc.add_offsets_to_txn(*zombie, "g").error == ErrorCode.producer_fenced
    assert h.tc.end_txn(*zombie, committed=True).error == ErrorCode.producer_fenced
    assert h.tc.end_txn(*zombie, committed=False).error == ErrorCode.producer_fenced
    assert h.tc.is_partition_in_transaction(*zombie, *TP) == ErrorCode.invalid_producer_epoch
    assert h.init(pid=pid, epoch=LAST_CLIENT_EPOCH).error == ErrorCode.producer_fenced
    r = h.init(timeout=1000)  # the new instance's (retried) init: the epochs are spent, a new id
    assert r.error == ErrorCode.none and r.producer_id != pid and r.producer_epoch == 0
    assert h.tc.end_txn(*zombie, committed=True).error == ErrorCode.invalid_producer_id_mapping


def test_timeout_aborts_with_a_bumped_epoch() -> None:
    clock = ManualClock()
    h = Harness(clock)
    pid = h.init(timeout=1000).producer_id
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    clock.advance(999)
    assert h.tc.expire(clock.now_ms()) == []
    clock.advance(2)
    for r in h.tc.expire(clock.now_ms()):
        h.apply(r)
    assert h.state().state is S.COMPLETE_ABORT and h.state().producer_epoch == 1
    assert h.markers == [(pid, 1, False, frozenset({TP}))]
    assert h.tc.end_txn("a", pid, 0, committed=True).error == ErrorCode.producer_fenced


def test_timeout_validation_and_idle_id_expiration() -> None:
    clock = ManualClock()
    h = Harness(clock, transaction_max_timeout_ms=10_000, transactional_id_expiration_ms=5_000)
    assert h.init(timeout=10_001).error == ErrorCode.invalid_transaction_timeout
    assert h.init(timeout=0).error == ErrorCode.invalid_transaction_timeout
    h.init(timeout=10_000)
    clock.advance(5_001)
    for r in h.tc.expire(clock.now_ms()):
        h.apply(r)
    assert h.tc.state_of("a") is None
    assert h.log[-1][1] is None  # a tombstone


def test_past_the_bound_the_idle_ids_updated_longest_ago_expire_and_transactions_in_flight_stay() -> None:
    """transactional_id_max_entries: a stranger asking for id after id cannot grow the coordinator for
    a week. The excess goes at the timeout scan, oldest idle first, as a tombstone (the expiration's
    own step); an open or pending transaction is never forgotten; the id comes back as a new
    producer id, and its old instance stays fenced."""
    clock = ManualClock()
    h = Harness(clock, transactional_id_max_entries=3)
    pids = {}
    for tid in "abcdef":
        clock.advance(10)
        pids[tid] = h.init(tid).producer_id
    h.apply(h.tc.add_partitions_to_txn("b", pids["b"], 0, [TP]))  # b: Ongoing
    h.tc.pending.add("c")  # c: a step in flight
    steps = h.tc.expire_steps(clock.now_ms())
    assert sorted(tid for tid, _ in steps) == ["a", "d", "e"] and h.tc.expired_early == 3
    for _, result in steps:
        h.apply(result)
    h.tc.pending.discard("c")
    assert sorted(h.tc.transactions) == ["b", "c", "f"] and h.log[-1] == (h.log[-1][0], None)
    assert h.state("b").state is S.ONGOING
    assert h.tc.expire_steps(clock.now_ms()) == []  # within the bound now
    again = h.init("a")
    assert again.error == ErrorCode.none and again.producer_id != pids["a"] and again.producer_epoch == 0
    assert h.tc.end_txn("a", pids["a"], 0, committed=True).error == ErrorCode.invalid_producer_id_mapping
    assert h.tc.add_partitions_to_txn("d", pids["d"], 0, [TP]).error != ErrorCode.none  # forgotten: refused
    assert h.tc.check_produce(pids["a"], 0, "a", True, *TP) != ErrorCode.none  # the old instance's batch


def test_idempotent_producers_get_fresh_ids_without_records() -> None:
    h = Harness()
    a = h.tc.init_producer_id(None, 60_000)
    b = h.tc.init_producer_id(None, 60_000)
    assert a.producer_id != b.producer_id and a.records == [] and a.producer_epoch == 0


def test_admin_abort_describe_and_list() -> None:
    clock = ManualClock()
    h = Harness(clock)
    pid = h.init().producer_id
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    h.init("b")
    [desc] = h.tc.describe_transactions(["a"])
    assert desc["transaction_state"] == "Ongoing" and desc["topics"] == [{"topic": "t", "partitions": [0]}]
    assert h.tc.describe_transactions(["zz"])[0]["error_code"] == ErrorCode.transactional_id_not_found
    assert {t["transactional_id"] for t in h.tc.list_transactions()} == {"a", "b"}
    assert [t["transactional_id"] for t in h.tc.list_transactions(["Ongoing"])] == ["a"]
    clock.advance(5000)
    # Kafka's duration filter spares no state but Dead: "b" (Empty, no start time: -1) passes it
    assert [t["transactional_id"] for t in h.tc.list_transactions(duration_filter_ms=4000)] == ["a", "b"]
    assert [t["transactional_id"] for t in h.tc.list_transactions(duration_filter_ms=5000)] == ["b"]
    assert h.tc.abort_transaction("b").error == ErrorCode.invalid_txn_state
    h.apply(h.tc.abort_transaction("a"))
    assert h.state().state is S.COMPLETE_ABORT
    assert h.tc.abort_transaction("zz").error == ErrorCode.transactional_id_not_found


def test_every_transition_outside_the_table_raises() -> None:
    base = TransactionMetadata("x", 1, -1, 0, -1, 1000, S.EMPTY, frozenset(), -1, 0)
    for target, allowed in VALID_PREVIOUS.items():
        for source in TransactionState:
            meta = TransactionMetadata(**{**{f: getattr(base, f) for f in base.__dataclass_fields__},
                                          "state": source})
            if source in allowed:
                assert meta.transition(target).state is target
            else:
                with pytest.raises(IllegalStateTransition):
                    meta.transition(target)


def test_producer_ids_are_never_reused_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "pids"
    first = ProducerIdManager(path, block_size=10)
    ids = [first.next_producer_id() for _ in range(3)]
    second = ProducerIdManager(path, block_size=10)  # as after kill -9: the block is skipped
    more = [second.next_producer_id() for _ in range(15)]
    assert not set(ids) & set(more)
    assert more == sorted(more) and more[0] == 10


def test_zombie_reinit_with_its_old_epoch_is_fenced_when_the_new_instance_is_idle() -> None:
    """KIP-360 path of a zombie: A inits (epoch 0), B inits afresh (epoch 1); A re-inits with (pid, 0).

    A fresh InitProducerId records last_producer_epoch = -1, so A's epoch is no longer a "retry of the
    last bump" and A is fenced; B keeps epoch 1 and nobody else gets it."""
    h = Harness()
    pid = h.init().producer_id          # instance A
    b = h.init()                        # instance B, fresh
    assert (b.producer_id, b.producer_epoch) == (pid, 1)
    assert h.state().last_producer_epoch == -1
    r = h.init(pid=pid, epoch=0)        # A, after an abortable error
    assert r.error == ErrorCode.producer_fenced
    assert (h.state().producer_epoch, h.state().state) == (1, S.EMPTY)
    # B is untouched: it can run and commit a transaction at epoch 1
    h.apply(h.tc.add_partitions_to_txn("a", pid, 1, [TP]))
    assert h.apply(h.tc.end_txn("a", pid, 1, committed=True)).error == ErrorCode.none


def test_zombie_reinit_does_not_abort_the_new_instances_open_transaction() -> None:
    h = Harness()
    pid = h.init().producer_id          # A
    h.init()                            # B: epoch 1
    h.apply(h.tc.add_partitions_to_txn("a", pid, 1, [TP]))
    records_before = len(h.log)
    r = h.init(pid=pid, epoch=0)        # A's KIP-360 re-init while B's transaction is open
    assert r.error == ErrorCode.producer_fenced
    assert len(h.log) == records_before and h.markers == []
    assert (h.state().state, h.state().producer_epoch) == (S.ONGOING, 1)
    assert h.apply(h.tc.end_txn("a", pid, 1, committed=True)).error == ErrorCode.none
    assert h.markers == [(pid, 1, True, frozenset({TP}))]


def test_reinit_after_a_fence_by_timeout_or_init_is_fenced() -> None:
    """The fence (InitProducerId during a transaction, a timeout, an admin abort) also clears the last epoch."""
    clock = ManualClock()
    h = Harness(clock)
    pid = h.init(timeout=1000).producer_id
    h.apply(h.tc.add_partitions_to_txn("a", pid, 0, [TP]))
    clock.advance(1001)
    for r in h.tc.expire(clock.now_ms()):
        h.apply(r)
    assert (h.state().producer_epoch, h.state().last_producer_epoch) == (1, -1)
    assert h.init(pid=pid, epoch=0).error == ErrorCode.producer_fenced


def test_init_with_only_one_of_producer_id_and_epoch_is_an_invalid_request() -> None:
    h = Harness()
    pid = h.init().producer_id
    assert h.init(pid=pid, epoch=-1).error == ErrorCode.invalid_request
    assert h.init(pid=-1, epoch=0).error == ErrorCode.invalid_request


def test_retry_of_a_kip_360_bump_after_epoch_exhaustion_gets_the_new_producer_id() -> None:
    h = Harness()
    pid = h.init().producer_id
    _at_epoch(h, LAST_CLIENT_EPOCH)
    r = h.init(pid=pid, epoch=LAST_CLIENT_EPOCH)
    assert r.error == ErrorCode.none and r.producer_id != pid and r.producer_epoch == 0
    again = h.init(pid=pid, epoch=LAST_CLIENT_EPOCH)  # the response was lost; the retry
    assert (again.error, again.producer_id, again.producer_epoch) == (ErrorCode.none, r.producer_id, 0)
    assert h.init(pid=pid, epoch=LAST_CLIENT_EPOCH - 1).error == ErrorCode.producer_fenced

"""Model-based test of the transaction coordinator, producer state and partition logs together.

A hypothesis state machine drives an in-process broker (requests encoded and decoded as on the
wire, tests/inproc.py) with several transactional ids, each with several client instances: fresh
inits (which fence the previous instance: it becomes a zombie), KIP-360 re-inits and their retries,
AddPartitions + produce, EndTxn commit/abort, transaction timeouts, restarts (kill -9 or clean),
and hostile requests (non-transactional batches with a transactional producer id, stale or future
epochs, partitions outside the transaction, producer ids never handed out, zombies on every path),
also while a live instance's EndTxn is held in the fsync of its PrepareCommit (the step is pending:
every request about that id answers CONCURRENT_TRANSACTIONS or a fence, the timeout scan passes it
by, and the step then completes as if alone).
A small reference model says what every answer must be and what read_committed must show.

Invariants, checked after every step:
- at most one live epoch per transactional id: the coordinator's (producer id, epoch) is the one
  the model handed to the newest instance that was not fenced since; every other instance's
  request fails;
- read_committed shows exactly the committed transactions' records below the first record of a
  transaction still open, in offset order: nothing from an aborted transaction, a fenced producer
  or a refused request, every committed record once;
- the LSO is never stuck: a partition with no open transaction in the model has LSO == HW;
- a restart (kill -9 or clean, with every append fsynced) rebuilds the same coordinator state,
  producer state and visible records by replay.

``ONCELOG_MODEL_EXAMPLES`` sets how many runs hypothesis tries (make test: a few hundred steps in
all; make fuzz: 10,000+).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, initialize, invariant, rule
from kio.schema.errors import ErrorCode

from oncelog.coordinator.transaction.state import MAX_PRODUCER_EPOCH
from tests.fsync_gate import FsyncGate
from tests.inproc import API_END_TXN, InProcessBroker
from tests.storage.helpers import batch

TOPIC = "m"
PARTITIONS = [(TOPIC, 0), (TOPIC, 1)]
TIDS = ["A", "B"]
TIMEOUT_MS = 10_000
MEANWHILE = ["fresh-init", "owner-reinit", "zombie-reinit", "owner-end", "zombie-end", "owner-add", "timeouts",
             "client-abort"]


@dataclass
class Instance:
    """One client incarnation of a transactional id."""

    name: str
    tid: str
    pid: int
    epoch: int
    previous: tuple[int, int] | None = None  # (pid, epoch) before its last KIP-360 re-init
    seqs: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class OpenTxn:
    owner: str
    partitions: set[tuple[str, int]] = field(default_factory=set)
    values: list[bytes] = field(default_factory=list)


class TransactionModel(RuleBasedStateMachine):
    instances = Bundle("instances")

    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="oncelog-model-"))
        self.gate = FsyncGate()
        self.b = InProcessBroker(self.dir / "d", flush_every_append=True)
        self.b.create_topic(TOPIC, len(PARTITIONS))
        self.current: dict[str, tuple[int, int] | None] = dict.fromkeys(TIDS)
        self.holder: dict[str, str | None] = dict.fromkeys(TIDS)  # instance name holding the live epoch
        self.open: dict[str, OpenTxn] = {}
        self.log_order: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in PARTITIONS}
        self.committed: set[bytes] = set()
        self.n = 0
        err, self.idem_pid, _ = self.b.init_producer_id(None)
        assert err == 0
        self._near_epoch_exhaustion(TIDS[-1])

    def _near_epoch_exhaustion(self, tid: str) -> None:
        """``tid`` starts two bumps short of Short.MAX_VALUE, as 32,765 re-inits would leave it (written
        to the transaction log, so restarts replay it): its first instance holds the last epoch a
        client can hold, so fences at that epoch and the move to a new producer id are walked."""
        from oncelog.coordinator.transaction.coordinator import TxnResult, _record

        err, pid, _ = self.b.init_producer_id(tid, timeout_ms=TIMEOUT_MS)
        assert err == 0
        coordination = self.b.broker.coordination
        meta = coordination.txn.state_of(tid)
        assert meta is not None
        coordination.apply_txn_result(TxnResult(records=[_record(meta.transition(
            meta.state, producer_epoch=MAX_PRODUCER_EPOCH - 2))]))
        self.current[tid] = (pid, MAX_PRODUCER_EPOCH - 2)

    def teardown(self) -> None:
        self.gate.close()
        self.b.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def _value(self, who: str) -> bytes:
        self.n += 1
        return f"{who}#{self.n}".encode()

    def _fence_open(self, tid: str) -> None:
        """The open transaction of ``tid`` is aborted (by a fence or a timeout)."""
        self.open.pop(tid, None)

    def _fenced_by_coordinator(self, tid: str) -> None:
        """The coordinator aborted ``tid``'s transaction under a bumped epoch that no client holds."""
        self._fence_open(tid)
        meta = self.b.broker.coordination.txn.state_of(tid)
        assert meta is not None
        assert self.current[tid] is not None and meta.producer_epoch > self.current[tid][1]  # type: ignore[index]
        self.current[tid] = (meta.producer_id, meta.producer_epoch)
        self.holder[tid] = None

    # --- clients ------------------------------------------------------------------------------------
    @initialize(target=instances, tid=st.sampled_from(TIDS))
    def first_instance(self, tid: str) -> Instance:
        return self._fresh(tid)

    @rule(target=instances, tid=st.sampled_from(TIDS))
    def fresh_init(self, tid: str) -> Instance:
        return self._fresh(tid)

    def _fresh(self, tid: str) -> Instance:
        err, pid, epoch = self.b.init_producer_id(tid, timeout_ms=TIMEOUT_MS)
        if tid in self.open:
            assert err == ErrorCode.concurrent_transactions, err  # fenced and aborted first
            self._fence_open(tid)
            err, pid, epoch = self.b.init_producer_id(tid, timeout_ms=TIMEOUT_MS)
        assert err == 0, err
        before = self.current[tid]
        if before is not None:
            assert (pid, epoch) != before and (pid != before[0] or epoch > before[1])
        self.current[tid] = (pid, epoch)
        self.n += 1
        inst = Instance(f"{tid}{self.n}", tid, pid, epoch)
        self.holder[tid] = inst.name
        return inst

    def _is_live(self, inst: Instance) -> bool:
        return self.holder[inst.tid] == inst.name and self.current[inst.tid] == (inst.pid, inst.epoch)

    @rule(inst=instances)
    def kip_360_reinit(self, inst: Instance) -> None:
        err, pid, epoch = self.b.init_producer_id(inst.tid, inst.pid, inst.epoch, timeout_ms=TIMEOUT_MS)
        if not self._is_live(inst):
            assert err == ErrorCode.producer_fenced, (inst, err)
            return
        if inst.tid in self.open:
            # Kafka's fence: the open transaction is aborted under a bumped epoch nobody holds
            assert err == ErrorCode.concurrent_transactions, err
            self._fenced_by_coordinator(inst.tid)
            return
        assert err == 0 and (pid, epoch) != (inst.pid, inst.epoch), err
        inst.previous = (inst.pid, inst.epoch)
        inst.pid, inst.epoch, inst.seqs = pid, epoch, {}
        self.current[inst.tid] = (pid, epoch)

    @rule(inst=instances)
    def kip_360_retry_of_the_last_reinit(self, inst: Instance) -> None:
        """The answer to the last re-init was lost: the same request again."""
        if inst.previous is None:
            return
        err, pid, epoch = self.b.init_producer_id(inst.tid, *inst.previous, timeout_ms=TIMEOUT_MS)
        if not self._is_live(inst):
            assert err == ErrorCode.producer_fenced, (err, inst)
        elif inst.tid not in self.open:
            assert (err, pid, epoch) == (0, inst.pid, inst.epoch), (err, pid, epoch, inst)
        else:  # a stale retry while a transaction is open fences it, as any re-init would
            assert err == ErrorCode.concurrent_transactions, err
            self._fenced_by_coordinator(inst.tid)

    @rule(inst=instances, tp=st.sampled_from(PARTITIONS), n=st.integers(1, 3))
    def add_and_produce(self, inst: Instance, tp: tuple[str, int], n: int) -> None:
        live = self._is_live(inst)
        errors = self.b.add_partitions(inst.tid, inst.pid, inst.epoch, [tp])
        if not live:
            assert errors[tp] != 0, f"zombie {inst} added a partition"
            seq = inst.seqs.get(tp, 0)
            code = self.b.produce(*tp, batch(pid=inst.pid, epoch=inst.epoch, seq=seq, txn=True,
                                             value=self._value("zombie")), transactional_id=inst.tid)
            assert code != 0, f"zombie {inst} produced"
            return
        assert errors[tp] == 0, errors
        txn = self.open.setdefault(inst.tid, OpenTxn(inst.name))
        txn.partitions.add(tp)
        for _ in range(n):
            seq = inst.seqs.get(tp, 0)
            value = self._value(inst.name)
            code = self.b.produce(*tp, batch(pid=inst.pid, epoch=inst.epoch, seq=seq, txn=True, value=value),
                                  transactional_id=inst.tid)
            assert code == 0, (code, inst)
            inst.seqs[tp] = seq + 1
            txn.values.append(value)
            self.log_order[tp].append(value)

    @rule(inst=instances, commit=st.booleans())
    def end_txn(self, inst: Instance, commit: bool) -> None:
        code = self.b.end_txn(inst.tid, inst.pid, inst.epoch, commit)
        if not self._is_live(inst):
            assert code != 0, f"zombie {inst} ended a transaction"
            return
        txn = self.open.pop(inst.tid, None)
        if txn is None:
            # nothing open: a retry of the last end (same result) is OK, anything else INVALID_TXN_STATE
            assert code in (0, ErrorCode.invalid_txn_state), code
            return
        assert code == 0, code
        if commit:
            self.committed.update(txn.values)

    @rule(inst=instances, commit=st.booleans(),
          meanwhile=st.lists(st.sampled_from(MEANWHILE), min_size=1, max_size=4))
    def end_txn_while_others_ask(self, inst: Instance, commit: bool, meanwhile: list[str]) -> None:
        """The live instance's EndTxn, held in the fsync of its Prepare record (written, not yet
        replayed); meanwhile others ask about the same transactional id."""
        tid = inst.tid
        if not self._is_live(inst) or tid not in self.open:
            return
        self.gate.hold("__transaction_state")
        started = self.b.start(API_END_TXN, 3, {"transactional_id": tid, "producer_id": inst.pid,
                                                 "producer_epoch": inst.epoch, "committed": commit})
        self.b.run_until(self.gate.reached.is_set)
        before = self.b.broker.coordination.txn.state_of(tid)
        stale = (inst.pid, inst.epoch - 1 if inst.epoch > 0 else inst.epoch + 1)
        concurrent = ErrorCode.concurrent_transactions
        for what in meanwhile:
            if what == "fresh-init":
                assert self.b.init_producer_id(tid, timeout_ms=TIMEOUT_MS)[0] == concurrent
            elif what == "owner-reinit":
                assert self.b.init_producer_id(tid, inst.pid, inst.epoch, timeout_ms=TIMEOUT_MS)[0] == concurrent
            elif what == "zombie-reinit":
                assert self.b.init_producer_id(tid, *stale, timeout_ms=TIMEOUT_MS)[0] == concurrent
            elif what == "owner-end":
                assert self.b.end_txn(tid, inst.pid, inst.epoch, not commit) == concurrent
            elif what == "zombie-end":
                assert self.b.end_txn(tid, *stale, commit) == ErrorCode.producer_fenced
            elif what == "owner-add":
                tp = next(iter(self.open[tid].partitions))
                assert self.b.add_partitions(tid, inst.pid, inst.epoch, [tp]) == {tp: concurrent}
            elif what == "timeouts":
                self.transaction_timeouts()  # every other open transaction is fenced; this one waits
            else:
                tp = next(iter(self.open[tid].partitions))
                r = self.b.call(27, 1, {"markers": [{"producer_id": inst.pid, "producer_epoch": inst.epoch,
                                                     "transaction_result": False, "coordinator_epoch": 0,
                                                     "topics": [{"name": tp[0], "partition_indexes": [tp[1]]}]}]})
                assert r.markers[0].topics[0].partitions[0].error_code == concurrent
            assert self.b.broker.coordination.txn.state_of(tid) == before, what
        self.gate.release()
        assert self.b.finish(started).error_code == 0
        txn = self.open.pop(tid)
        if commit:
            self.committed.update(txn.values)

    # --- time, restarts, strangers ------------------------------------------------------------------
    @rule()
    def transaction_timeouts(self) -> None:
        self.b.clock.advance(TIMEOUT_MS + 1)
        self.b.broker.coordination.expire_transactions()
        pending = self.b.broker.coordination.txn.pending
        for tid in list(self.open):
            if tid not in pending:
                self._fenced_by_coordinator(tid)

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        before = self._snapshot()
        self.b.restart(clean=clean)
        assert self._snapshot() == before, "replay after a restart rebuilt a different state"

    def _snapshot(self) -> tuple[object, ...]:
        txn = self.b.broker.coordination.txn
        producers = {}
        for tp in PARTITIONS:
            plog = self.b.broker.logs.get_partition(*tp)
            assert plog is not None
            producers[tp] = sorted((e.producer_id, e.producer_epoch, e.last_seq, e.current_txn_first_offset)
                                   for e in plog.producers())
        return (dict(txn.transactions), producers, {tp: self.b.visible_values(*tp) for tp in PARTITIONS},
                {tp: self.b.broker.logs.get_partition(*tp).last_stable_offset for tp in PARTITIONS})  # type: ignore[union-attr]

    @rule(tid=st.sampled_from(TIDS), tp=st.sampled_from(PARTITIONS),
          kind=st.sampled_from(["plain-with-txn-pid", "stale-epoch", "future-epoch", "outside-txn", "unknown-pid"]),
          seq=st.integers(0, 3))
    def hostile_produce(self, tid: str, tp: tuple[str, int], kind: str, seq: int) -> None:
        cur = self.current[tid]
        if cur is None:
            return
        pid, epoch = cur
        txn = self.open.get(tid)
        value = self._value("hostile")
        if kind == "plain-with-txn-pid":
            data, tx = batch(pid=pid, epoch=min(epoch + seq, MAX_PRODUCER_EPOCH), seq=seq, value=value), None
        elif kind == "stale-epoch":
            if epoch == 0:
                return
            data, tx = batch(pid=pid, epoch=epoch - 1, seq=seq, txn=True, value=value), tid
        elif kind == "future-epoch":
            if epoch == MAX_PRODUCER_EPOCH:
                return
            data, tx = batch(pid=pid, epoch=min(epoch + 1 + seq, MAX_PRODUCER_EPOCH), seq=0, txn=True, value=value), tid
        elif kind == "outside-txn":
            if txn is not None and tp in txn.partitions:
                return
            data, tx = batch(pid=pid, epoch=epoch, seq=seq, txn=True, value=value), tid
        else:
            data, tx = batch(pid=self.idem_pid + 10_000 + seq, epoch=0, seq=0, value=value), None
        code = self.b.produce(*tp, data, transactional_id=tx)
        assert code != 0, f"hostile {kind} produce accepted"

    @rule(inst=instances, tp=st.sampled_from(PARTITIONS), named=st.sampled_from([*TIDS, "stranger"]))
    def stranger_names_its_own_transactional_id(self, inst: Instance, tp: tuple[str, int], named: str) -> None:
        """A stranger that guessed an instance's producer id, epoch and next sequence, naming a
        transactional id it may write to: never lands in that instance's transaction."""
        if named == inst.tid:
            return
        code = self.b.produce(*tp, batch(pid=inst.pid, epoch=inst.epoch, seq=inst.seqs.get(tp, 0), txn=True,
                                         value=self._value("stranger")), transactional_id=named)
        assert code != 0, f"a stranger naming {named!r} produced into {inst}'s transaction"

    @rule(tid=st.sampled_from(TIDS), commit=st.booleans(), tp=st.sampled_from(PARTITIONS))
    def hostile_write_txn_markers(self, tid: str, commit: bool, tp: tuple[str, int]) -> None:
        """A client's WriteTxnMarkers: never a commit; an abort of the live transaction aborts all of it."""
        cur = self.current[tid]
        if cur is None:
            return
        r = self.b.call(27, 1, {"markers": [{"producer_id": cur[0], "producer_epoch": cur[1],
                                             "transaction_result": commit, "coordinator_epoch": 0,
                                             "topics": [{"name": tp[0], "partition_indexes": [tp[1]]}]}]})
        code = r.markers[0].topics[0].partitions[0].error_code
        txn = self.open.get(tid)
        if commit:
            assert code == ErrorCode.cluster_authorization_failed
        elif txn is not None and tp in txn.partitions:
            assert code == 0
            self._fenced_by_coordinator(tid)
        else:
            assert code != 0

    # --- invariants -----------------------------------------------------------------------------------
    @invariant()
    def one_live_epoch_per_transactional_id(self) -> None:
        for tid in TIDS:
            meta = self.b.broker.coordination.txn.state_of(tid)
            if self.current[tid] is None:
                assert meta is None
            else:
                assert meta is not None and (meta.producer_id, meta.producer_epoch) == self.current[tid]
                assert (meta.state.value == "Ongoing") == (tid in self.open), (meta.state, self.open.get(tid))

    @invariant()
    def read_committed_shows_exactly_the_committed_records(self) -> None:
        open_values = {v for t in self.open.values() for v in t.values}
        for tp in PARTITIONS:
            # read_committed stops at the LSO: the first record of a transaction still open
            order = self.log_order[tp]
            stable = next((i for i, v in enumerate(order) if v in open_values), len(order))
            expected = [v for v in order[:stable] if v in self.committed]
            assert self.b.visible_values(*tp) == expected, tp

    @invariant()
    def lso_is_never_stuck(self) -> None:
        for tp in PARTITIONS:
            plog = self.b.broker.logs.get_partition(*tp)
            assert plog is not None
            if not any(tp in t.partitions for t in self.open.values()):
                assert plog.last_stable_offset == plog.high_watermark, tp


TransactionModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("ONCELOG_MODEL_EXAMPLES", "12")), stateful_step_count=30, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_transaction_model = TransactionModel.TestCase

"""The broker-wide bound on producer-state entries (``ProducerStateBound``): a client asking for
producer id after producer id, each writing to many partitions, used to grow the broker's memory,
its snapshots and its restart time without limit for a day (``producer_id_expiration_ms``). Past the
bound the least recently written idle entries go; what must never follow is a batch the full state
would refuse (a duplicate, a gap, a zombie's epoch) accepted because its producer's entry is gone.
The state machine at the end checks exactly that against an unbounded log fed the same batches."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.protocol import records as rb
from oncelog.storage.config import LogConfig
from oncelog.storage.errors import ProducerStateError
from oncelog.storage.partition_log import AppendOrigin, LogDirState, PartitionLog
from oncelog.storage.producer_state import AppendPlan, ProducerStateBound, ProducerStateManager
from tests.storage.helpers import batch, marker

COORD = AppendOrigin.COORDINATOR


def bounded_logs(path: Path, n: int, bound: ProducerStateBound) -> list[PartitionLog]:
    state = LogDirState()
    state.producer_bound = bound
    return [PartitionLog(path / f"t-{p}", "t", p, LogConfig(), ManualClock(), state) for p in range(n)]


def refused(plog: PartitionLog, data: bytes) -> int:
    end = plog.log_end_offset
    with pytest.raises(ProducerStateError) as e:
        plog.append(data)
    assert plog.log_end_offset == end  # nothing of a refused batch is written
    return e.value.error_code


def entries(logs: list[PartitionLog]) -> set[tuple[int, int]]:
    return {(plog.partition, pid) for plog in logs for pid in plog.producer_state.producers}


def test_past_the_bound_the_least_recently_written_idle_entries_go(tmp_path: Path) -> None:
    bound = ProducerStateBound(3)
    a, b = bounded_logs(tmp_path, 2, bound)
    a.append(batch(pid=1, epoch=0, seq=0))
    b.append(batch(pid=1, epoch=0, seq=0))
    a.append(batch(pid=2, epoch=0, seq=0))
    a.append(batch(pid=1, epoch=0, seq=1))  # written again: now the newest of the three
    b.append(batch(pid=3, epoch=0, seq=0))  # the fourth entry: the oldest, (b, 1), goes
    assert entries([a, b]) == {(0, 1), (0, 2), (1, 3)} and len(bound) == 3 and bound.evictions == 1
    for pid in range(10, 20):
        a.append(batch(pid=pid, epoch=0, seq=0))
    assert len(bound) == 3 and entries([a, b]) == {(0, 17), (0, 18), (0, 19)}
    b.close()
    assert len(bound) == 3  # b holds none of them
    a.delete()
    assert len(bound) == 0


def test_an_evicted_producer_gets_unknown_producer_id_never_a_duplicate_and_its_zombie_stays_fenced(
        tmp_path: Path) -> None:
    bound = ProducerStateBound(1)
    (plog,) = bounded_logs(tmp_path, 1, bound)
    first = plog.append(batch(2, pid=1, epoch=3, seq=0))
    plog.append(batch(2, pid=1, epoch=3, seq=2))
    plog.append(batch(pid=2, epoch=0, seq=0))  # evicts producer 1
    assert 1 not in plog.producer_state.producers
    # Unbounded, the first two would be duplicates and the third out of order: not one is taken as new.
    assert refused(plog, batch(2, pid=1, epoch=3, seq=0)) == ErrorCode.unknown_producer_id
    assert refused(plog, batch(2, pid=1, epoch=3, seq=4)) == ErrorCode.unknown_producer_id
    assert refused(plog, batch(2, pid=1, epoch=3, seq=9)) == ErrorCode.unknown_producer_id
    assert refused(plog, batch(pid=1, epoch=2, seq=0)) == ErrorCode.invalid_producer_epoch  # a zombie
    assert refused(plog, batch(pid=1, epoch=4, seq=4)) == ErrorCode.out_of_order_sequence_number
    bumped = plog.append(batch(pid=1, epoch=4, seq=0))  # what librdkafka does: bump, restart at 0
    assert not bumped.duplicate and bumped.base_offset == first.base_offset + 5
    assert plog.append(batch(pid=1, epoch=4, seq=0)).duplicate  # tracked again
    assert 2 not in plog.producer_state.producers  # and it evicted producer 2 in turn
    assert refused(plog, batch(pid=2, epoch=0, seq=0)) == ErrorCode.unknown_producer_id


def test_a_producer_evicted_and_then_forgotten_may_only_start_again_at_sequence_zero(tmp_path: Path) -> None:
    bound = ProducerStateBound(1, remembered=1)
    (plog,) = bounded_logs(tmp_path, 1, bound)
    plog.append(batch(pid=1, epoch=5, seq=0))
    plog.append(batch(pid=1, epoch=5, seq=1))
    plog.append(batch(pid=2, epoch=0, seq=0))  # evicts 1
    plog.append(batch(pid=3, epoch=0, seq=0))  # evicts 2, and 1 drops out of the remembered
    assert refused(plog, batch(pid=2, epoch=0, seq=1)) == ErrorCode.unknown_producer_id  # remembered
    assert refused(plog, batch(pid=1, epoch=5, seq=2)) == ErrorCode.unknown_producer_id  # forgotten: pid <= 2
    assert refused(plog, batch(pid=1, epoch=4, seq=2)) == ErrorCode.unknown_producer_id
    assert not plog.append(batch(pid=1, epoch=6, seq=0)).duplicate  # what a client does after the bump
    assert not plog.append(batch(pid=9, epoch=0, seq=7)).duplicate  # never evicted here: Kafka's rule
    plog.close()  # the highest evicted id is kept in the snapshot
    (plog,) = bounded_logs(tmp_path, 1, ProducerStateBound(10))
    assert refused(plog, batch(pid=2, epoch=0, seq=1)) == ErrorCode.unknown_producer_id


def test_an_open_transaction_keeps_its_entry_whatever_the_bound(tmp_path: Path) -> None:
    bound = ProducerStateBound(2)
    (plog,) = bounded_logs(tmp_path, 1, bound)
    plog.append(batch(pid=1, epoch=0, seq=0, txn=True))
    plog.append(batch(pid=2, epoch=0, seq=0, txn=True))
    for pid in range(10, 20):
        plog.append(batch(pid=pid, epoch=0, seq=0))
    assert {1, 2} <= set(plog.producer_state.producers) and len(bound) == 2
    assert plog.last_stable_offset == 0
    plog.append(marker(True, pid=1, epoch=0), origin=COORD)  # the marker finds its transaction
    plog.append(marker(False, pid=2, epoch=0), origin=COORD)
    assert plog.last_stable_offset == plog.log_end_offset
    for pid in range(20, 30):
        plog.append(batch(pid=pid, epoch=0, seq=0))
    assert set(plog.producer_state.producers) == {28, 29}  # idle now, and evicted like any other


def test_the_bound_holds_over_a_restart_and_a_partition_never_counts_twice(tmp_path: Path) -> None:
    (plog,) = bounded_logs(tmp_path, 1, ProducerStateBound(100))
    for pid in range(20):
        plog.append(batch(pid=pid, epoch=0, seq=0, ts=1_000 + pid))
    plog.close()
    bound = ProducerStateBound(5)
    (plog,) = bounded_logs(tmp_path, 1, bound)  # the snapshot holds 20: the 15 oldest go on load
    assert set(plog.producer_state.producers) == set(range(15, 20)) and len(bound) == 5
    assert refused(plog, batch(pid=12, epoch=0, seq=1)) == ErrorCode.unknown_producer_id
    assert refused(plog, batch(pid=3, epoch=0, seq=1)) == ErrorCode.unknown_producer_id  # forgotten, <= 14
    assert not plog.append(batch(pid=3, epoch=0, seq=0)).duplicate
    assert len(bound) == 5 and 15 not in plog.producer_state.producers
    plog.append(batch(pid=16, epoch=0, seq=1))
    assert len(bound) == 5


def test_the_broker_config_is_checked() -> None:
    from oncelog.server.config import BrokerConfig

    cfg = BrokerConfig()
    cfg.producer_state_max_entries = 0
    with pytest.raises(ValueError, match="producer_state_max_entries: Value must be at least 1"):
        cfg.validate_security()
    with pytest.raises(ValueError):
        ProducerStateBound(0)


PIDS = st.integers(1, 4)
CLIENT = AppendOrigin.CLIENT


def verdict(mgr: ProducerStateManager, data: bytes, origin: AppendOrigin) -> AppendPlan | int:
    """What ``mgr`` makes of ``data``: its plan (nothing applied yet), or the error code."""
    batches = rb.split_batches(data, from_client=origin is CLIENT)
    controls = [rb.read_control_marker(data, pos, h) if h.is_control else None for pos, h in batches]
    try:
        return mgr.prepare([h for _, h in batches], origin, controls)
    except ProducerStateError as exc:
        return exc.error_code


class BoundedAgainstUnbounded(RuleBasedStateMachine):
    """Two partitions' producer states share a bound of 2 entries (evicting all the time); two
    unbounded ones are the reference. Every batch (any epoch near the current one, any sequence near
    the expected one, transactional or not, markers) is put to both, and applied to both only when
    the bounded one takes it, so the two see the same history. The bounded one never takes what the
    reference refuses, never answers a duplicate differently, and refuses only with
    UNKNOWN_PRODUCER_ID what the reference would take."""

    REMEMBERED = 10_000  # every eviction remembered: no residual at all

    def __init__(self) -> None:
        super().__init__()
        self.bound = ProducerStateBound(2, remembered=self.REMEMBERED)
        self.residuals = 0
        self.real = [ProducerStateManager(), ProducerStateManager()]
        for mgr in self.real:
            self.bound.attach(mgr)
        self.ref = [ProducerStateManager(), ProducerStateManager()]
        self.log_end = [0, 0]

    def _current(self, p: int, pid: int) -> tuple[int, int]:
        entry = self.ref[p].producers.get(pid)
        if entry is None:
            return 0, 0
        return max(entry.producer_epoch, 0), entry.last_seq + 1

    def _both(self, p: int, data: bytes, origin: AppendOrigin = CLIENT) -> None:
        (_, header), = rb.split_batches(data, from_client=False)
        pid = header.producer_id
        # The documented residual, for a producer evicted and forgotten here: its first batch at sequence 0;
        # and a marker (only the coordinator writes one, at the epoch it holds, so never a stale one).
        entry = self.real[p].producers.get(pid)
        forgotten = (entry is None or not entry.batches) and self.bound.evicted_epoch(self.real[p], pid) is None
        residual_allowed = forgotten and (header.base_sequence == 0 or origin is COORD)
        ref, real = verdict(self.ref[p], data, origin), verdict(self.real[p], data, origin)
        if isinstance(real, int):  # written by neither
            assert isinstance(ref, int) or real == ErrorCode.unknown_producer_id or not self.REMEMBERED, real
            return
        if isinstance(ref, int) or (real.duplicate is None) != (ref.duplicate is None):
            assert residual_allowed, f"taken after an eviction, answered {ref} by the full state"
            self.residuals += 1
            if real.duplicate is None:
                self._complete(p, real, self.real[p])
            entry = self.real[p].producers.get(pid)  # the reference follows the residual's outcome
            self.ref[p].ongoing.pop(pid, None)
            if entry is None:
                self.ref[p].producers.pop(pid, None)
                return
            self.ref[p].producers[pid] = entry.copy()
            if pid in self.real[p].ongoing:
                self.ref[p].ongoing[pid] = self.real[p].ongoing[pid]
            return
        if real.duplicate is None:
            bases = self._complete(p, real, self.real[p])
            assert self.ref[p].complete(ref, bases) is not None

    def _complete(self, p: int, plan: AppendPlan, mgr: ProducerStateManager) -> list[int]:
        bases = []
        for _, header, _ in plan.steps:
            bases.append(self.log_end[p])
            self.log_end[p] += header.last_offset_delta + 1
        mgr.complete(plan, bases)
        return bases

    @rule(p=st.integers(0, 1), pid=PIDS, d_epoch=st.integers(-1, 1), d_seq=st.integers(-2, 2), n=st.integers(1, 2),
          txn=st.booleans())
    def produce(self, p: int, pid: int, d_epoch: int, d_seq: int, n: int, txn: bool) -> None:
        epoch, seq = self._current(p, pid)
        seq = 0 if d_epoch > 0 and d_seq >= 0 else max(seq + d_seq, 0)
        self._both(p, batch(n, pid=pid, epoch=max(epoch + d_epoch, 0), seq=seq, txn=txn))

    @rule(p=st.integers(0, 1), pid=PIDS, commit=st.booleans(), d_epoch=st.integers(-1, 1))
    def end_transaction(self, p: int, pid: int, commit: bool, d_epoch: int) -> None:
        epoch, _ = self._current(p, pid)
        self._both(p, marker(commit, pid=pid, epoch=max(epoch + d_epoch, 0)), COORD)

    @invariant()
    def counted_once_and_bounded(self) -> None:
        held = sum(len(mgr.producers) for mgr in self.real)
        open_txns = sum(len(mgr.ongoing) for mgr in self.real)
        assert len(self.bound) == held <= max(self.bound.max_entries, open_txns)
        for real, ref in zip(self.real, self.ref, strict=True):
            assert real.ongoing == ref.ongoing


class ForgettingBoundedAgainstUnbounded(BoundedAgainstUnbounded):
    """The same with no eviction remembered (``max_evicted_pid`` alone): nothing is written that the
    full state refuses or answers as a duplicate, but for the residual; a refusal may be another
    code (a marker may make a forgotten entry again without the sequence it had)."""

    REMEMBERED = 0


SETTINGS = settings(max_examples=int(os.environ.get("ONCELOG_MODEL_EXAMPLES", "300")), stateful_step_count=40,
                    deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestBoundedAgainstUnbounded = BoundedAgainstUnbounded.TestCase
TestBoundedAgainstUnbounded.settings = SETTINGS
TestForgettingBoundedAgainstUnbounded = ForgettingBoundedAgainstUnbounded.TestCase
TestForgettingBoundedAgainstUnbounded.settings = SETTINGS

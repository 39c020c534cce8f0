"""A transactional offset commit never overwrites a newer regular one (Kafka's
replayEndTransactionMarker compares the offsets of the two records in ``__consumer_offsets``).

Before, a COMMIT marker applied its pending offsets unconditionally: OffsetCommit 5, TxnOffsetCommit
10 (pending), OffsetCommit 20, then the transaction commits, and the group's committed offset went
back to 10 (its consumers re-read 10..19), also after a restart; Kafka keeps 20. Found by a probe.

The order must also survive the internal-log checkpoint, which rewrites live committed offsets at
new, higher offsets and drops the prefix while a pending offset stays below them: the checkpoint's
records carry the offset of the record that committed each value.

Three levels: a few fixed sequences sans IO, a model (hypothesis) of regular and transactional
commits interleaved with markers, offset deletes, checkpoints and restarts against a declarative
rule, and the broker's own path (in process: append, checkpoint, kill -9, load).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.coordinator.group.group_coordinator import GroupCoordinator
from oncelog.server.coordination import CONSUMER_OFFSETS_TOPIC
from tests.groups.test_offsets_of_deleted_topics import _commit, _committed, _create, _pending_offset
from tests.inproc import InProcessBroker

Record = tuple[bytes, bytes | None]
TP = ("t", 0)
PARTITIONS = [("t", 0), ("t", 1)]


@dataclass
class OffsetsLog:
    """One ``__consumer_offsets`` partition as the server keeps it: records at offsets, replayed with
    them; markers; a checkpoint (the coordinator's snapshot appended, not replayed, then the prefix
    dropped up to the first record of an open transaction, as ``Coordination.checkpoint_internal_logs``
    does); and a restart (replay from the log start into a fresh coordinator)."""

    clock: ManualClock = field(default_factory=ManualClock)
    entries: list[tuple[int, Record | None, int, bool]] = field(default_factory=list)  # None record: a marker
    next_offset: int = 0
    log_start: int = 0
    open_txn_first: dict[int, int] = field(default_factory=dict)  # producer id -> first offset of its open txn
    gc: GroupCoordinator = field(init=False)

    def __post_init__(self) -> None:
        self.gc = GroupCoordinator(self.clock)

    def _append(self, record: Record | None, producer_id: int, flag: bool) -> int:
        offset = self.next_offset
        self.entries.append((offset, record, producer_id, flag))
        self.next_offset += 1
        return offset

    def apply(self, records: list[Record], producer_id: int = -1, transactional: bool = False) -> None:
        for k, v in records:
            offset = self._append((k, v), producer_id, transactional)
            if transactional:
                self.open_txn_first.setdefault(producer_id, offset)
            self.gc.replay(k, v, producer_id, transactional, record_offset=offset)

    def commit(self, offset: int, tp: tuple[str, int] = TP) -> None:
        result = self.gc.offset_commit("g", -1, "", None, [(tp[0], tp[1], offset, -1, None)])
        assert result.errors == {tp: ErrorCode.none}
        self.apply(result.records)

    def txn_commit(self, producer_id: int, offset: int, tp: tuple[str, int] = TP) -> None:
        result = self.gc.txn_offset_commit("g", producer_id, -1, "", None, [(tp[0], tp[1], offset, -1, None)])
        assert result.errors == {tp: ErrorCode.none}
        self.apply(result.records, producer_id, transactional=True)

    def marker(self, producer_id: int, commit: bool) -> None:
        self._append(None, producer_id, commit)
        self.open_txn_first.pop(producer_id, None)
        self.gc.replay_control(producer_id, commit)

    def checkpoint(self) -> None:
        start = self.next_offset
        for k, v in self.gc.snapshot_records(lambda gid: True):
            self._append((k, v), -1, False)
        self.log_start = max(self.log_start, min([start, *self.open_txn_first.values()]))
        self.entries = [e for e in self.entries if e[0] >= self.log_start]

    def restart(self) -> GroupCoordinator:
        fresh = GroupCoordinator(self.clock)
        fresh.loading = True
        for offset, record, producer_id, flag in self.entries:
            if record is None:
                fresh.replay_control(producer_id, flag)
            else:
                fresh.replay(record[0], record[1], producer_id, flag, record_offset=offset)
        fresh.loaded()
        self.gc = fresh
        return fresh

    def committed(self, tp: tuple[str, int] = TP) -> int | None:
        om, _ = self.gc.offset_fetch("g", [tp], False)[tp]
        return None if om is None else om.offset


# --- fixed sequences, sans IO -------------------------------------------------------------------------
@pytest.mark.parametrize("checkpoint_at", [None, "after_pending", "after_regular"])
@pytest.mark.parametrize("commit", [True, False])
@pytest.mark.parametrize("regular_after", [True, False])
def test_the_newest_record_wins_whatever_the_checkpoints(checkpoint_at: str | None, commit: bool,
                                                         regular_after: bool) -> None:
    h = OffsetsLog()
    h.commit(5)
    h.txn_commit(7, 10)
    if checkpoint_at == "after_pending":
        h.checkpoint()
    if regular_after:
        h.commit(20)
    if checkpoint_at == "after_regular":
        h.checkpoint()
    if checkpoint_at is not None:
        assert h.log_start == 1, "the prefix below the pending offset is dropped"
    h.marker(7, commit)
    expected = 20 if regular_after else (10 if commit else 5)
    assert h.committed() == expected
    live = dict(h.gc.offsets)
    assert h.restart().offsets == live and h.committed() == expected
    h.checkpoint()  # the transaction is over: the whole prefix goes
    assert h.restart().offsets == live and h.committed() == expected


def test_a_transactional_commit_newer_than_the_regular_one_wins_and_an_older_transaction_loses() -> None:
    h = OffsetsLog()
    h.txn_commit(1, 10)  # producer 1 first
    h.txn_commit(2, 30)  # then producer 2 (newer record)
    h.commit(20)         # then a regular commit, newer than both
    h.txn_commit(2, 40)  # producer 2 again: its newest pending offset is newer than 20
    h.marker(2, True)
    assert h.committed() == 40
    h.marker(1, True)    # older than 40: stays 40
    assert h.committed() == 40
    assert h.restart().offsets["g"][TP].offset == 40


def test_replay_without_offsets_counts_records_in_replay_order() -> None:
    """Callers without a log (the sans-IO tests) replay without ``record_offset``: the order of
    their calls is the log order."""
    gc = GroupCoordinator(ManualClock())
    for k, v in gc.offset_commit("g", -1, "", None, [("t", 0, 5, -1, None)]).records:
        gc.replay(k, v)
    for k, v in gc.txn_offset_commit("g", 7, -1, "", None, [("t", 0, 10, -1, None)]).records:
        gc.replay(k, v, 7, transactional=True)
    for k, v in gc.offset_commit("g", -1, "", None, [("t", 0, 20, -1, None)]).records:
        gc.replay(k, v)
    gc.replay_control(7, commit=True)
    assert gc.offsets["g"][TP].offset == 20


# --- the model ------------------------------------------------------------------------------------------
class TxnOffsetOrderModel(RuleBasedStateMachine):
    """Regular and transactional commits (two producers, two partitions) interleaved with markers,
    offset deletes, checkpoints and restarts. The rule checked, written without the coordinator's
    mechanism: a partition's committed offset is that of the newest record, in log order, among the
    regular commits and the commits of committed transactions since the partition's last offset
    delete; it is unstable while an open transaction holds a commit of it made since that delete."""

    def __init__(self) -> None:
        super().__init__()
        self.h = OffsetsLog()
        self.n = 0
        self.events: list[tuple[str, tuple[str, int], int, int]] = []  # (kind, tp, value, txn) in log order
        self.txn_of: dict[int, int] = {}  # producer id -> its open transaction's number
        self.outcome: dict[int, bool] = {}  # transaction number -> committed?
        self.txns = 0

    @rule(tp=st.sampled_from(PARTITIONS))
    def commit(self, tp: tuple[str, int]) -> None:
        self.n += 1
        self.h.commit(self.n, tp)
        self.events.append(("commit", tp, self.n, -1))

    @rule(producer_id=st.sampled_from([1, 2]), tp=st.sampled_from(PARTITIONS))
    def txn_commit(self, producer_id: int, tp: tuple[str, int]) -> None:
        self.n += 1
        if producer_id not in self.txn_of:
            self.txns += 1
            self.txn_of[producer_id] = self.txns
        self.h.txn_commit(producer_id, self.n, tp)
        self.events.append(("txn", tp, self.n, self.txn_of[producer_id]))

    @rule(producer_id=st.sampled_from([1, 2]), commit=st.booleans())
    def marker(self, producer_id: int, commit: bool) -> None:
        if producer_id in self.txn_of:
            self.outcome[self.txn_of.pop(producer_id)] = commit
        self.h.marker(producer_id, commit)  # a marker with no open transaction is a no-op

    @rule(tp=st.sampled_from(PARTITIONS))
    def offset_delete(self, tp: tuple[str, int]) -> None:
        top, errors, records = self.h.gc.offset_delete("g", [tp])
        if top == ErrorCode.group_id_not_found:
            return
        assert top == ErrorCode.none and errors == {tp: ErrorCode.none}
        self.h.apply(records)
        self.events.append(("delete", tp, -1, -1))

    @rule()
    def checkpoint(self) -> None:
        self.h.checkpoint()

    @rule()
    def restart(self) -> None:
        live = self.h.gc.offsets
        assert self.h.restart().offsets == live, "replay from the log start gives the state it replaced"

    def _expected(self, tp: tuple[str, int]) -> tuple[int | None, bool]:
        value: int | None = None
        unstable = False
        for kind, at, v, txn in self.events:
            if at != tp:
                continue
            if kind == "delete":
                value, unstable = None, False
            elif kind == "commit" or self.outcome.get(txn) is True:
                value = v  # a later record always wins: the events are in log order
            elif txn not in self.outcome:
                unstable = True
        return value, unstable

    @invariant()
    def committed_is_the_newest_committed_record(self) -> None:
        for tp in PARTITIONS:
            value, unstable = self._expected(tp)
            assert self.h.committed(tp) == value
            assert (self.h.gc.offset_fetch("g", [tp], True)[tp][1] == ErrorCode.unstable_offset_commit) == unstable


TxnOffsetOrderModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("ONCELOG_GROUP_MODEL_EXAMPLES", "100")), stateful_step_count=30,
    deadline=None, suppress_health_check=[HealthCheck.too_slow])
TestTxnOffsetOrderModel = TxnOffsetOrderModel.TestCase


# --- the broker's path: records at their offsets, the checkpoint, kill -9 and load ------------------------
@pytest.mark.parametrize("checkpoint_at", [None, "after_pending", "after_regular"])
@pytest.mark.parametrize("commit", [True, False])
@pytest.mark.parametrize("regular_after", [True, False])
def test_the_broker_keeps_the_newest_commit_through_checkpoints_and_kill_9(
        tmp_path: Path, checkpoint_at: str | None, commit: bool, regular_after: bool) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        _create(b, "in", 1)
        plog = b.broker.logs.get_partition(*b.broker.coordination.offsets_partition_for("g"))
        assert plog is not None and plog.topic == CONSUMER_OFFSETS_TOPIC
        _commit(b, "g", "in", 0, 5)
        pid, epoch = _pending_offset(b, "g", "in", 0, 10)
        if checkpoint_at == "after_pending":
            assert b.broker.coordination.checkpoint_internal_logs(0) >= 1
        if regular_after:
            _commit(b, "g", "in", 0, 20)
        if checkpoint_at == "after_regular":
            assert b.broker.coordination.checkpoint_internal_logs(0) >= 1
        if checkpoint_at is not None:
            assert plog.log_start_offset == 1, "the commit of 5 is gone: only the checkpoint holds it"
        assert b.end_txn("tx", pid, epoch, commit=commit) == 0
        expected = {("in", 0): 20 if regular_after else (10 if commit else 5)}
        assert _committed(b, "g") == expected
        b.restart()
        assert _committed(b, "g") == expected
    finally:
        b.close()

"""A transaction step's fsyncs run off the event loop, in their order, with its transactional id
pending meanwhile (``Coordination.answer_when_durable``).

Invariants checked here, on an in-process broker whose fsyncs can be held:

- while a commit waits for an fsync, the broker answers other clients;
- every other request about that transactional id answers CONCURRENT_TRANSACTIONS, unless a fence
  refuses it first (a stranger's producer id: INVALID_PRODUCER_ID_MAPPING; a wrong epoch on
  EndTxn or AddPartitionsToTxn: PRODUCER_FENCED); none of them changes anything, and neither do
  the timeout scan or an admin abort;
- the durability order: each data partition of a committed transaction is fsynced after its last
  write and before the PrepareCommit is written; the PrepareCommit is fsynced before any marker is
  written; every marker is fsynced before the CompleteCommit is written;
- a client that hangs up in the middle of its EndTxn does not stop the step halfway;
- the timeout scan and an admin's abort take the same steps off the loop: the scan's abort leaves
  the id pending until it is durable and replayed, an admin's abort is answered only then, and a
  disk that fails under the scan's step takes the log directory offline.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.coordinator.transaction.state import TransactionState
from oncelog.server import broker as broker_module
from oncelog.storage import fileio
from tests.fsync_gate import FsyncGate
from tests.fsync_gate import path_of as fs_path
from tests.inproc import API_END_TXN, API_WRITE_TXN_MARKERS, InProcessBroker
from tests.storage.helpers import batch

T = "t"
TID = "tx"
CONCURRENT = ErrorCode.concurrent_transactions.value


@pytest.fixture
def fs() -> Iterator[FsyncGate]:
    gate = FsyncGate(record=True)
    yield gate
    gate.close()


@pytest.fixture(params=[False, True], ids=["background-fsync", "flush-every-append"])
def b(tmp_path: Path, fs: FsyncGate, request: pytest.FixtureRequest) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "data", flush_every_append=request.param)
    broker.create_topic(T, 2)
    broker.create_topic("other", 1)
    yield broker
    fs.release()
    broker.close()


def open_transaction(b: InProcessBroker) -> tuple[int, int]:
    code, pid, epoch = b.init_producer_id(TID)
    assert code == 0
    assert b.add_partitions(TID, pid, epoch, [(T, 0), (T, 1)]) == {(T, 0): 0, (T, 1): 0}
    for p in (0, 1):
        assert b.produce(T, p, batch(2, pid=pid, epoch=epoch, seq=0, txn=True, value=b"p%d" % p),
                         transactional_id=TID) == 0
    return pid, epoch


def start_end_txn(b: InProcessBroker, pid: int, epoch: int, fs: FsyncGate) -> Any:
    """EndTxn(commit), held at the PrepareCommit's fsync: its record is written, not yet replayed."""
    fs.hold("__transaction_state")
    started = b.start(API_END_TXN, 3, {"transactional_id": TID, "producer_id": pid, "producer_epoch": epoch,
                                       "committed": True})
    b.run_until(fs.reached.is_set)
    assert TID in b.broker.coordination.txn.pending
    return started


def test_a_commit_waiting_for_its_fsync_leaves_the_broker_serving_and_its_id_pending(
        b: InProcessBroker, fs: FsyncGate) -> None:
    pid, epoch = open_transaction(b)
    txn = b.broker.coordination.txn
    started = start_end_txn(b, pid, epoch, fs)
    before = txn.state_of(TID)
    assert before is not None and before.state is TransactionState.ONGOING  # written, not replayed

    # Other clients are served meanwhile.
    assert b.produce("other", 0, batch(value=b"meanwhile")) == 0
    assert b.visible_values("other", 0) == [b"meanwhile"]
    # Everything about this transactional id waits, or is fenced first; nothing changes.
    assert b.init_producer_id(TID)[0] == CONCURRENT
    assert b.init_producer_id(TID, pid, epoch)[0] == CONCURRENT  # KIP-360 re-init by the owner
    assert b.end_txn(TID, pid, epoch, commit=True) == CONCURRENT  # a retry of the same EndTxn
    assert b.end_txn(TID, pid, epoch, commit=False) == CONCURRENT
    assert b.add_partitions(TID, pid, epoch, [(T, 0)]) == {(T, 0): CONCURRENT}
    assert b.end_txn(TID, pid, epoch + 1, commit=False) == ErrorCode.producer_fenced.value  # a wrong epoch
    assert b.end_txn(TID, pid + 1, epoch, commit=False) == ErrorCode.invalid_producer_id_mapping.value
    assert b.add_partitions(TID, pid, epoch + 1, [(T, 0)]) == {(T, 0): ErrorCode.producer_fenced.value}
    admin_abort = b.call(API_WRITE_TXN_MARKERS, 1, {"markers": [{
        "producer_id": pid, "producer_epoch": epoch, "transaction_result": False,
        "topics": [{"name": T, "partition_indexes": [0]}], "coordinator_epoch": 0}]})
    assert admin_abort.markers[0].topics[0].partitions[0].error_code == CONCURRENT
    b.clock.advance(3_600_000)  # far past the transaction's timeout
    b.broker.coordination.expire_transactions()
    assert txn.state_of(TID) == before

    fs.release()
    assert b.finish(started).error_code == 0
    after = txn.state_of(TID)
    assert after is not None and after.state is TransactionState.COMPLETE_COMMIT
    assert after.producer_epoch == epoch and TID not in txn.pending
    assert b.visible_values(T, 0) == [b"p0", b"p0"] and b.visible_values(T, 1) == [b"p1", b"p1"]
    assert b.end_txn(TID, pid, epoch, commit=True) == 0  # the retry now finds it committed


def test_a_client_hanging_up_mid_commit_does_not_stop_it_halfway(b: InProcessBroker, fs: FsyncGate) -> None:
    pid, epoch = open_transaction(b)
    started = start_end_txn(b, pid, epoch, fs)
    started.task.cancel()  # what the connection does when its client disconnects
    fs.release()
    txn = b.broker.coordination.txn
    b.run_until(lambda: TID not in txn.pending)
    state = txn.state_of(TID)
    assert state is not None and state.state is TransactionState.COMPLETE_COMMIT
    assert b.visible_values(T, 0) == [b"p0", b"p0"]
    b.restart()  # and the log says the same
    assert b.visible_values(T, 1) == [b"p1", b"p1"]
    state = b.broker.coordination.txn.state_of(TID)
    assert state is not None and state.state is TransactionState.COMPLETE_COMMIT


def _last(events: list[tuple[str, str]], op: str, where: str, before: int) -> int:
    return max((i for i, (o, path) in enumerate(events[:before]) if o == op and where in path), default=-1)


def _first(events: list[tuple[str, str]], op: str, where: str, after: int) -> int:
    return next((i for i, (o, path) in enumerate(events) if i > after and o == op and where in path), len(events))


@pytest.mark.parametrize("behind", [True, False], ids=["synced-behind", "all-at-commit"])
@pytest.mark.parametrize("transactions", [1, 3])
def test_each_step_is_durable_before_the_next_is_written(b: InProcessBroker, fs: FsyncGate, transactions: int,
                                                         behind: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The order of writes and fsyncs on disk, for consecutive commits, with the data fsynced
    behind the producer (``Broker.sync_behind``) or left for the commit to fsync."""
    if behind:
        monkeypatch.setattr(broker_module, "SYNC_BEHIND_BYTES", 1)  # after every append
    else:
        monkeypatch.setattr(type(b.broker), "sync_behind", lambda self, plog, nbytes: None)
    code, pid, epoch = b.init_producer_id(TID)
    assert code == 0
    seq = 0
    for n in range(transactions):
        start = len(fs.events)
        assert b.add_partitions(TID, pid, epoch, [(T, 0), (T, 1)]) == {(T, 0): 0, (T, 1): 0}
        for p in (0, 1):
            assert b.produce(T, p, batch(3, pid=pid, epoch=epoch, seq=seq, txn=True, value=b"%d" % n),
                             transactional_id=TID) == 0
        seq += 3
        end_txn = len(fs.events) - start
        assert b.end_txn(TID, pid, epoch, commit=True) == 0
        ev = fs.events[start:]
        log = "__transaction_state-0"
        prepare = _first(ev, "write", log, end_txn - 1)
        complete = _first(ev, "write", log, prepare)
        assert prepare < complete < len(ev), ev
        first_marker = min(_first(ev, "write", f"/{T}-{p}/", prepare) for p in (0, 1))
        assert prepare < first_marker < complete, ev
        # the PrepareCommit is durable before any marker is written
        assert prepare < _last(ev, "fsync", log, first_marker), ev
        for p in (0, 1):
            part = f"/{T}-{p}/"
            # the transaction's data is durable before the PrepareCommit is written
            last_data = _last(ev, "write", part, prepare)
            assert 0 <= last_data < _last(ev, "fsync", part, prepare), ev
            # the marker is durable before the CompleteCommit is written
            marker = _first(ev, "write", part, prepare)
            assert marker < _last(ev, "fsync", part, complete), ev
        assert b.visible_values(T, 0)[-3:] == [b"%d" % n] * 3


def test_transactional_data_is_fsynced_behind_the_producer_in_large_steps(b: InProcessBroker,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``Broker.sync_behind``: no fsync until SYNC_BEHIND_BYTES are unsynced in a partition, then
    one (off the loop), without waiting for the commit; plain appends never start one. (With
    flush_every_append every append is durable before its answer anyway.)"""
    monkeypatch.setattr(broker_module, "SYNC_BEHIND_BYTES", 3_000)
    every_append = b.config.flush_every_append
    code, pid, epoch = b.init_producer_id(TID)
    assert code == 0
    assert b.add_partitions(TID, pid, epoch, [(T, 0)]) == {(T, 0): 0}
    plog = b.broker.logs.get_partition(T, 0)
    other = b.broker.logs.get_partition("other", 0)
    assert plog is not None and other is not None
    synced = plog.synced_end
    for seq in range(2):  # about 2,100 bytes: below the threshold
        assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=seq, txn=True, size=1_000), transactional_id=TID) == 0
        assert b.produce("other", 0, batch(size=5_000)) == 0
        if every_append:
            assert plog.synced_end == plog.log_end_offset and other.synced_end == other.log_end_offset
    b.run_until(lambda: True)
    if every_append:
        return
    assert plog.synced_end == synced and other.synced_end == 0
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=2, txn=True, size=1_000), transactional_id=TID) == 0
    b.run_until(lambda: plog.synced_end == plog.log_end_offset)  # the third crosses it
    assert other.synced_end == 0
    assert b.end_txn(TID, pid, epoch, commit=True) == 0


# --- steps nobody sends a request for: the timeout scan, an admin's abort ---------------------------

def _scan_on_the_loop(b: InProcessBroker) -> None:
    """The timeout scan as the broker's timer runs it: on the event loop."""
    async def scan() -> None:
        b.broker.coordination.expire_transactions()
    b.loop.run_until_complete(scan())


def _assert_abort_order(events: list[tuple[str, str]]) -> None:
    """PrepareAbort durable before any marker is written; every marker durable before CompleteAbort."""
    log = "__transaction_state-0"
    prepare = _first(events, "write", log, -1)
    complete = _first(events, "write", log, prepare)
    assert prepare < complete < len(events), events
    markers = [_first(events, "write", f"/{T}-{p}/", prepare) for p in (0, 1)]
    assert prepare < _last(events, "fsync", log, min(markers)), events
    for p, marker in zip((0, 1), markers, strict=True):
        assert marker < complete and marker < _last(events, "fsync", f"/{T}-{p}/", complete), events


def test_the_timeout_scan_aborts_off_the_loop_with_the_id_pending(b: InProcessBroker, fs: FsyncGate) -> None:
    pid, epoch = open_transaction(b)
    txn = b.broker.coordination.txn
    b.clock.advance(3_600_000)  # past the transaction's timeout
    start = len(fs.events)
    fs.hold("__transaction_state")
    _scan_on_the_loop(b)
    b.run_until(fs.reached.is_set)  # the PrepareAbort waits for its fsync, off the loop
    assert TID in txn.pending
    before = txn.state_of(TID)
    assert before is not None and before.state is TransactionState.ONGOING  # written, not replayed
    assert b.produce("other", 0, batch(value=b"meanwhile")) == 0  # the loop serves others
    assert b.visible_values("other", 0) == [b"meanwhile"]
    assert b.end_txn(TID, pid, epoch, commit=True) == CONCURRENT  # the owner's commit must wait
    assert b.init_producer_id(TID, pid, epoch)[0] == CONCURRENT
    _scan_on_the_loop(b)  # a second scan leaves the pending id alone
    assert txn.state_of(TID) == before and len(b.broker.coordination._steps) == 1

    fs.release()
    b.run_until(lambda: TID not in txn.pending and not b.broker.coordination._steps)
    after = txn.state_of(TID)
    assert after is not None and after.state is TransactionState.COMPLETE_ABORT
    assert after.producer_epoch == epoch + 1
    assert b.end_txn(TID, pid, epoch, commit=True) == ErrorCode.producer_fenced.value  # the zombie is fenced
    assert b.visible_values(T, 0) == [] and b.visible_values(T, 1) == []
    _assert_abort_order(fs.events[start:])
    b.restart()  # the log says the same
    state = b.broker.coordination.txn.state_of(TID)
    assert state is not None and state.state is TransactionState.COMPLETE_ABORT
    assert b.visible_values(T, 0) == []


def test_an_admin_abort_answers_once_its_steps_are_durable(b: InProcessBroker, fs: FsyncGate) -> None:
    pid, epoch = open_transaction(b)
    txn = b.broker.coordination.txn
    start = len(fs.events)
    fs.hold("__transaction_state")
    started = b.start(API_WRITE_TXN_MARKERS, 1, {"markers": [{
        "producer_id": pid, "producer_epoch": epoch, "transaction_result": False,
        "topics": [{"name": T, "partition_indexes": [0]}, {"name": "other", "partition_indexes": [0]}],
        "coordinator_epoch": 0}]})
    b.run_until(fs.reached.is_set)
    assert not started.task.done() and TID in txn.pending
    assert b.produce("other", 0, batch(value=b"meanwhile")) == 0
    fs.release()
    response = b.finish(started)
    codes = [(t.name, p.error_code) for t in response.markers[0].topics for p in t.partitions]
    # the whole transaction is aborted; "other" had none of it, and was answered after the abort
    assert codes == [(T, 0), ("other", ErrorCode.invalid_txn_state.value)]
    after = txn.state_of(TID)
    assert after is not None and after.state is TransactionState.COMPLETE_ABORT and TID not in txn.pending
    assert b.visible_values(T, 1) == []
    _assert_abort_order(fs.events[start:])


def test_a_disk_failure_in_a_timeout_scan_step_takes_the_directory_offline(
        b: InProcessBroker, fs: FsyncGate, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nobody awaits the scan's step, so the step itself must report a write that fails (here the
    ABORT marker's) as a client's request would: the log directory goes offline."""
    open_transaction(b)
    real = fileio.fs.pwrite

    def failing(fd: int, data: Any, offset: int) -> Any:
        if f"/{T}-0/" in fs_path(fd):
            raise OSError(5, "Input/output error")
        return real(fd, data, offset)

    monkeypatch.setattr(fileio.fs, "pwrite", failing)
    b.clock.advance(3_600_000)
    _scan_on_the_loop(b)
    b.run_until(lambda: not b.broker.coordination._steps)
    assert b.broker.storage_failure is not None and "Input/output error" in b.broker.storage_failure


def test_a_client_gone_before_its_end_txn_ran_does_not_leave_the_step_undone(b: InProcessBroker) -> None:
    """Found by the socket fuzz: EndTxn arrives and its connection is lost in the same pass, before
    the event loop runs the task the request was handed to. The connection closes that awaitable
    unrun. The step must already be under way: left undone, its id stayed pending for good, the
    timeout scan skipped it, and the transaction's partitions (``__consumer_offsets`` in the fuzz)
    kept their last stable offset below the high watermark forever."""
    import asyncio
    import gc
    import warnings

    from oncelog.server.connection import KafkaConnection
    from tests.server.test_inline_handling import _frame, _Transport

    pid, epoch = open_transaction(b)

    async def scenario() -> None:
        conn = KafkaConnection(b.broker)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(_frame(API_END_TXN, 3, 7, {"transactional_id": TID, "producer_id": pid,
                                                      "producer_epoch": epoch, "committed": True}))
        conn.connection_lost(ConnectionResetError())
        for _ in range(3):
            await asyncio.sleep(0)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        b.loop.run_until_complete(scenario())
        gc.collect()
    txn = b.broker.coordination.txn
    b.run_until(lambda: TID not in txn.pending)
    state = txn.state_of(TID)
    assert state is not None and state.state is TransactionState.COMPLETE_COMMIT
    assert b.visible_values(T, 0) == [b"p0", b"p0"] and b.visible_values(T, 1) == [b"p1", b"p1"]
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]

"""The log cleaner and transactions, idempotence and recovery, through an in-process broker (real
coordinator markers, real produce validation)."""

from __future__ import annotations

from pathlib import Path

from oncelog.protocol import records as rb
from oncelog.storage import record_codec
from oncelog.storage.partition_log import PartitionLog
from tests.inproc import InProcessBroker
from tests.storage.cleaner_helpers import assert_compacted, batches, kv, view

DAY = 86_400_000


def broker(path: Path, **cfg: object) -> InProcessBroker:
    b = InProcessBroker(path, **cfg)
    b.broker.logs.create_topic("c", 1, {"cleanup.policy": "compact", "delete.retention.ms": str(DAY)})
    return b


def plog_of(b: InProcessBroker) -> PartitionLog:
    plog = b.broker.logs.get_partition("c", 0)
    assert plog is not None
    return plog


def seal(b: InProcessBroker) -> None:
    """Roll and flush, so everything written so far is cleanable."""
    plog = plog_of(b)
    plog.roll()
    plog.flush()


def clean(b: InProcessBroker) -> int:
    return b.broker.logs.cleaner.clean_now(b.broker.logs.compacted_logs(), b.clock.now_ms(), force=True)


def txn(b: InProcessBroker, tid: str, pairs: list[list[tuple[bytes, bytes | None]]], commit: bool | None,
        ts: int = 1_000) -> tuple[int, int]:
    err, pid, epoch = b.init_producer_id(tid)
    assert err == 0
    assert not any(b.add_partitions(tid, pid, epoch, [("c", 0)]).values())
    seq = 0
    for i, batch_pairs in enumerate(pairs):
        records = kv(batch_pairs, pid=pid, epoch=epoch, seq=seq, txn=True, ts=ts)
        assert b.produce("c", 0, records, transactional_id=tid) == 0
        seq += len(batch_pairs)
        if i % 2:
            seal(b)
    if commit is not None:
        assert b.end_txn(tid, pid, epoch, commit) == 0
    return pid, epoch


def control_batches(plog: PartitionLog) -> list[rb.BatchHeader]:
    return [h for h in batches(plog) if h.is_control]


def test_aborted_records_go_markers_stay_until_safe_and_read_committed_is_unchanged(tmp_path: Path) -> None:
    b = broker(tmp_path)
    plog = plog_of(b)
    txn(b, "t1", [[(b"a", b"a1"), (b"b", b"b1")], [(b"c", b"c1")]], commit=True)
    txn(b, "t2", [[(b"a", b"ABORTED"), (b"d", b"ABORTED")], [(b"b", b"ABORTED")]], commit=False)
    txn(b, "t3", [[(b"b", b"b2")]], commit=True)
    txn(b, "t4", [[(b"e", b"ABORTED")]], commit=False)
    b.produce("c", 0, kv([(b"c", None)]))  # a tombstone, non-transactional
    seal(b)
    before = view(plog)
    before_uncommitted = view(plog, read_committed=False)
    assert any(r[2] == b"ABORTED" for r in before_uncommitted)
    assert clean(b) == 1
    after = view(plog)
    assert_compacted(before, after)
    assert [r[2] for r in after] == [b"a1", b"b2", None]
    # aborted records are gone for every reader, not only hidden from read_committed
    assert not any(r[2] == b"ABORTED" for r in view(plog, read_committed=False))
    # markers of transactions that still have a kept batch (the last batch of each producer is
    # kept, emptied) stay, with their aborted-index entries
    kept_aborts = {(e.producer_id, e.last_offset) for s in plog.segments for e in s.txn_index.entries}
    for h in control_batches(plog):
        if h.records_count and record_codec.delete_horizon_ms(h) is None:
            assert any(x.producer_id == h.producer_id and not x.is_control for x in batches(plog))
    assert all(any(h.base_offset == off and h.is_control for h in batches(plog)) for _pid, off in kept_aborts)
    # the same answer after a crash, and after a replay of the whole cleaned log
    lso, hw = plog.last_stable_offset, plog.high_watermark
    b.restart()
    assert view(plog_of(b)) == after
    b.restart(clean=True)
    (tmp_path / "c-0" / "producer-state.snapshot").unlink()
    (tmp_path / "c-0" / "recovery-point").unlink(missing_ok=True)
    b.restart()
    assert view(plog_of(b)) == after
    assert (plog_of(b).last_stable_offset, plog_of(b).high_watermark) == (lso, hw)
    # once the producers expired (their last batches need not be kept any more) and
    # delete.retention.ms passed, markers whose transactions are gone are removed too
    markers_before = len(control_batches(plog_of(b)))
    assert markers_before == 4
    b.clock.advance(DAY + 1)
    b.broker.logs.remove_expired_producers(b.clock.now_ms(), DAY)
    b.produce("c", 0, kv([(b"f", b"f1")]))
    seal(b)
    assert clean(b) == 1
    b.clock.advance(DAY + 1)
    b.produce("c", 0, kv([(b"g", b"g1")]))
    seal(b)
    assert clean(b) == 1
    # only the COMMIT markers of transactions that still have records (a1 of t1, b2 of t3) are left
    left = plog_of(b)
    with_data = {h.producer_id for h in batches(left) if not h.is_control and h.records_count and h.is_transactional}
    assert {h.producer_id for h in control_batches(left)} == with_data and len(with_data) == 2
    assert all(s.txn_index.entries == [] for s in left.segments)
    final = view(plog_of(b))
    assert [r[2] for r in final] == [b"a1", b"b2", b"f1", b"g1"]  # the tombstone expired as well
    # and transactions still work on the cleaned log
    txn(b, "t1", [[(b"h", b"h1")]], commit=True)
    assert view(plog_of(b))[-1][2] == b"h1"
    b.close()


def test_records_of_an_open_transaction_are_never_cleaned(tmp_path: Path) -> None:
    b = broker(tmp_path)
    plog = plog_of(b)
    txn(b, "open", [[(b"a", b"open-1")], [(b"a", b"open-2")]], commit=None)
    for i in range(4):
        b.produce("c", 0, kv([(b"a", b"plain-%d" % i)]))
        seal(b)
    lso = plog.last_stable_offset
    assert lso == 0
    clean(b)
    assert len(view(plog, read_committed=False)) == 6  # nothing above the LSO was touched
    b.close()


def test_a_producer_whose_only_batch_was_compacted_away_keeps_its_idempotence(tmp_path: Path) -> None:
    b = broker(tmp_path)
    plog = plog_of(b)
    _, pid, epoch = b.init_producer_id(None)
    first = kv([(b"k", b"old")], pid=pid, epoch=epoch, seq=0)
    assert b.produce("c", 0, first) == 0
    b.produce("c", 0, kv([(b"k", b"new")]))  # supersedes the producer's only record
    seal(b)
    assert clean(b) == 1
    emptied = batches(plog)[0]
    assert (emptied.producer_id, emptied.records_count, emptied.base_offset, emptied.last_sequence) == (pid, 0, 0, 0)
    assert [r[2] for r in view(plog)] == [b"new"]
    for restart in ("none", "crash", "replay"):
        if restart == "crash":
            b.restart()
        elif restart == "replay":
            b.restart(clean=True)
            (tmp_path / "c-0" / "producer-state.snapshot").unlink()
            (tmp_path / "c-0" / "recovery-point").unlink(missing_ok=True)
            b.restart()
        # a retry of the compacted batch is still recognised as a duplicate, at its old offset
        r = b.call(0, 9, {"transactional_id": None, "acks": -1, "timeout": 30_000, "topic_data": [
            {"name": "c", "partition_data": [{"index": 0, "records": first}]}]})
        part = r.responses[0].partition_responses[0]
        assert (part.error_code, part.base_offset) == (0, 0), restart
    # the next sequence is accepted, a gap is not
    assert b.produce("c", 0, kv([(b"k", b"next")], pid=pid, epoch=epoch, seq=1)) == 0
    assert b.produce("c", 0, kv([(b"k", b"gap")], pid=pid, epoch=epoch, seq=5)) == 45  # OUT_OF_ORDER_SEQUENCE
    b.close()


def test_expired_producers_batches_go_and_a_fencing_marker_stays(tmp_path: Path) -> None:
    b = broker(tmp_path)
    plog = plog_of(b)
    _, gone, epoch = b.init_producer_id(None)
    assert b.produce("c", 0, kv([(b"x", b"1")], pid=gone, epoch=epoch, seq=0)) == 0
    # a transaction that times out: the coordinator aborts it with a bumped epoch, so the
    # producer's last entry in the log is a marker at an epoch with no data batch
    fenced, fenced_epoch = txn(b, "slow", [[(b"y", b"doomed")]], commit=None)
    b.clock.advance(120_000)
    b.broker.coordination.expire_transactions()
    assert plog.producer_state.producers[fenced].producer_epoch == fenced_epoch + 1
    b.produce("c", 0, kv([(b"x", b"2"), (b"y", b"2")]))
    seal(b)
    b.clock.advance(2 * DAY)
    plog.remove_expired_producers(b.clock.now_ms(), DAY)  # both producers expire...
    assert gone not in plog.producer_state.producers
    assert clean(b) == 1
    assert not any(h.producer_id == gone for h in batches(plog))  # ...so nothing of `gone` is kept
    b.close()
    b = broker(tmp_path / "again")
    plog = plog_of(b)
    fenced, fenced_epoch = txn(b, "slow", [[(b"y", b"doomed")]], commit=None)
    b.clock.advance(120_000)
    b.broker.coordination.expire_transactions()
    b.produce("c", 0, kv([(b"y", b"2")]))
    seal(b)
    for _ in range(3):  # past the delete horizon: the marker is emptied but kept
        b.clock.advance(DAY + 1)
        b.produce("c", 0, kv([(b"z", b"%d" % b.clock.now_ms())]))
        seal(b)
        clean(b)
    mine = [h for h in batches(plog) if h.producer_id == fenced]
    assert mine and all(h.is_control for h in mine) and mine[-1].producer_epoch == fenced_epoch + 1
    b.restart(clean=True)
    (tmp_path / "again" / "c-0" / "producer-state.snapshot").unlink()
    (tmp_path / "again" / "c-0" / "recovery-point").unlink(missing_ok=True)
    b.restart()
    state = plog_of(b).producer_state
    assert state.producers[fenced].producer_epoch == fenced_epoch + 1 and fenced not in state.ongoing
    assert plog_of(b).last_stable_offset == plog_of(b).high_watermark
    b.close()

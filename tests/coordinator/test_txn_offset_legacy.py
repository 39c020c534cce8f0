"""Offset values written by versions before 2ad1559 (no ``record_offset``) keep the answer those
versions gave: a COMMIT marker meeting one applies its pending offset.

Old brokers' internal-log checkpoints re-appended each committed offset at the log end with no
``record_offset`` in its value, after a TxnOffsetCommit still pending (the cut stops at the last
stable offset). Before, today's decode took such a value for a commit made at its own position,
newer than the pending offset, so the transaction's COMMIT was dropped after the upgrade: the group
went back to 5 instead of 10 and its consumers re-read 5..9 (upgrade probe, repro_ckpt_txn_offset.py;
also with the transaction open across the upgrade). Values written now keep Kafka's rule (the newer
record wins, ``test_txn_offset_order.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.offset_records import OffsetAndMetadata
from oncelog.server.coordination import CONSUMER_OFFSETS_TOPIC
from oncelog.server.internal_log import encode_batch
from oncelog.storage.partition_log import AppendOrigin
from tests.coordinator.test_txn_offset_order import TP, OffsetsLog
from tests.groups.test_offsets_of_deleted_topics import _commit, _committed, _create
from tests.inproc import API_ADD_OFFSETS_TO_TXN, InProcessBroker

TS = 1_700_000_000_000


def legacy_value(offset: int, ts: int = TS) -> bytes:
    """An offset value as versions before 2ad1559 wrote it (``offset_value`` of 2033735, copied)."""
    return json.dumps({"v": 1, "offset": offset, "leader_epoch": -1, "metadata": "", "ts": ts},
                      separators=(",", ":")).encode()


def old_log(*, committed_by_old_broker: bool) -> OffsetsLog:
    """An offsets partition as an old broker left it: OffsetCommit 5 at 0, TxnOffsetCommit 10 of
    producer 7 at 1, then its checkpoint re-appended the live 5 at 2 and cut the log at the pending
    offset (1); ``committed_by_old_broker``: the transaction's COMMIT marker follows at 3."""
    h = OffsetsLog()
    key = rec.offset_key("g", *TP)
    h.entries = [(1, (key, legacy_value(10)), 7, True), (2, (key, legacy_value(5)), -1, False)]
    h.next_offset, h.log_start, h.open_txn_first = 3, 1, {7: 1}
    if committed_by_old_broker:
        h.marker(7, True)
    return h


@pytest.mark.parametrize("new_checkpoint_first", [False, True])
@pytest.mark.parametrize("committed_by_old_broker", [False, True])
def test_a_commit_marker_meeting_a_legacy_checkpoint_value_applies(committed_by_old_broker: bool,
                                                                  new_checkpoint_first: bool) -> None:
    h = old_log(committed_by_old_broker=committed_by_old_broker)
    h.restart()  # the new version loads the old one's log
    if new_checkpoint_first:  # today's checkpoint rewrites the legacy value: it keeps its unknown order
        h.checkpoint()
        h.restart()
    if not committed_by_old_broker:
        assert h.committed() == 5
        h.marker(7, True)
    assert h.committed() == 10, "the committed transaction's offset wins, as the old version answered"
    for _ in range(2):
        h.checkpoint()
        h.restart()
        assert h.committed() == 10


def test_an_aborted_transaction_leaves_the_legacy_value() -> None:
    h = old_log(committed_by_old_broker=False)
    h.restart()
    h.marker(7, False)
    assert h.committed() == 5


def test_values_written_now_keep_the_newest_record_rule_after_the_upgrade() -> None:
    """A regular commit made on the new version while the old transaction is open stays when it
    commits, as in Kafka: the legacy pending offset is ordered by its own record."""
    h = old_log(committed_by_old_broker=False)
    h.restart()
    h.commit(20)
    h.marker(7, True)
    assert h.committed() == 20
    h.checkpoint()
    assert h.restart() and h.committed() == 20


def test_every_value_of_a_checkpoint_written_now_carries_its_order() -> None:
    h = old_log(committed_by_old_broker=False)
    h.restart()
    h.commit(3, ("t", 1))
    values = [json.loads(v) for k, v in h.gc.snapshot_records(lambda gid: True)
              if v is not None and k.startswith(rec.OFFSET_KEY)]
    assert len(values) == 2
    assert all(v["v"] == rec.OFFSET_VALUE_VERSION and "record_offset" in v for v in values)
    assert sorted(v["record_offset"] for v in values) == [rec.ORDER_UNKNOWN, 3]


def test_decode_tells_legacy_values_from_values_written_now() -> None:
    key = rec.offset_key("g", *TP)
    assert rec.decode(key, legacy_value(5))[2].record_offset == rec.ORDER_UNKNOWN
    request_value = rec.offset_value(OffsetAndMetadata(5, -1, "", TS))
    assert json.loads(request_value)["v"] == rec.OFFSET_VALUE_VERSION
    assert "record_offset" not in json.loads(request_value), "a request's value: its record orders it"
    assert rec.decode(key, request_value)[2].record_offset == rec.NOT_REPLAYED
    for ro in (0, 7, rec.ORDER_UNKNOWN):
        assert rec.decode(key, rec.offset_value(OffsetAndMetadata(5, -1, "", TS, ro)))[2].record_offset == ro


def test_the_broker_applies_a_commit_across_the_upgrade_over_a_legacy_checkpoint(tmp_path: Path) -> None:
    """The broker's path: the offsets partition holds an old version's records (its TxnOffsetCommit
    and its checkpoint's rewrite, the prefix cut), the transaction is open across the restart, and
    EndTxn commits it on the new version."""
    b = InProcessBroker(tmp_path / "d")
    try:
        _create(b, "in", 1)
        plog = b.broker.logs.get_partition(*b.broker.coordination.offsets_partition_for("g"))
        assert plog is not None and plog.topic == CONSUMER_OFFSETS_TOPIC
        _commit(b, "g", "in", 0, 5)
        err, pid, epoch = b.init_producer_id("tx")
        assert err == 0
        assert b.call(API_ADD_OFFSETS_TO_TXN, 3, {"transactional_id": "tx", "producer_id": pid,
                                                  "producer_epoch": epoch, "group_id": "g"}).error_code == 0
        key = rec.offset_key("g", "in", 0)
        now = b.clock.now_ms()
        first = plog.log_end_offset  # the old version's TxnOffsetCommit, then its checkpoint's rewrite of 5
        plog.append(encode_batch([(key, legacy_value(10))], now, producer_id=pid, producer_epoch=epoch,
                                 transactional=True), origin=AppendOrigin.COORDINATOR)
        plog.append(encode_batch([(key, legacy_value(5))], now), origin=AppendOrigin.COORDINATOR)
        plog.flush()
        plog.delete_records(first)
        b.restart(clean=True)
        assert _committed(b, "g") == {("in", 0): 5}
        assert b.end_txn("tx", pid, epoch, commit=True) == 0
        assert _committed(b, "g") == {("in", 0): 10}
        assert b.broker.coordination.checkpoint_internal_logs(0) >= 1
        b.restart()
        assert _committed(b, "g") == {("in", 0): 10}
    finally:
        b.close()

"""What a stranger or a zombie can send to the produce path and the markers path, driven through the
broker's own request decoding without sockets (tests/inproc.py). Each case here broke fencing,
wedged a transaction or stopped the broker from restarting before it was fixed."""

from __future__ import annotations

from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from oncelog.storage.partition_log import AppendOrigin
from tests.inproc import (
    API_ADD_OFFSETS_TO_TXN,
    API_ADD_PARTITIONS_TO_TXN,
    API_END_TXN,
    API_INIT_PRODUCER_ID,
    InProcessBroker,
)
from tests.storage.helpers import batch

T = "t"


@pytest.fixture
def b(tmp_path: Path):  # type: ignore[no-untyped-def]
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic(T, 2)
    yield broker
    broker.close()


def _txn_producer(b: InProcessBroker, tid: str = "tx") -> tuple[int, int]:
    err, pid, epoch = b.init_producer_id(tid)
    assert err == 0
    return pid, epoch


def test_stranger_idempotent_batch_with_a_transactional_producer_id_is_refused(b: InProcessBroker) -> None:
    pid, epoch = _txn_producer(b)
    assert b.add_partitions("tx", pid, epoch, [(T, 0), (T, 1)]) == {(T, 0): 0, (T, 1): 0}
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"mine"), transactional_id="tx") == 0
    # the stranger: non-transactional, a higher epoch, to a partition of the open transaction
    code = b.produce(T, 1, batch(pid=pid, epoch=epoch + 5, seq=0, value=b"stranger"))
    assert code == ErrorCode.invalid_producer_id_mapping
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    assert b.broker.coordination.txn.state_of("tx").state.value == "CompleteCommit"
    b.restart()
    assert b.visible_values(T, 0) == [b"mine"]
    assert b.visible_values(T, 1) == []


def test_a_partition_refusing_the_coordinators_marker_does_not_wedge_the_transaction(b: InProcessBroker) -> None:
    """Defence in depth: even if a higher epoch reached a partition (data written before the produce
    check existed), the commit completes, the other partitions get their marker, and the broker
    restarts -- also when the crash lands while the transaction is still PrepareCommit."""
    pid, epoch = _txn_producer(b)
    b.add_partitions("tx", pid, epoch, [(T, 0), (T, 1)])
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"mine"), transactional_id="tx") == 0
    plog1 = b.broker.logs.get_partition(T, 1)
    assert plog1 is not None
    plog1.append(batch(pid=pid, epoch=epoch + 5, seq=0, value=b"planted"), origin=AppendOrigin.CLIENT)
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    assert b.broker.coordination.txn.state_of("tx").state.value == "CompleteCommit"
    assert b.visible_values(T, 0) == [b"mine"]
    plog0 = b.broker.logs.get_partition(T, 0)
    assert plog0 is not None and plog0.last_stable_offset == plog0.high_watermark
    b.restart()
    assert b.visible_values(T, 0) == [b"mine"]


def test_pending_markers_that_a_partition_refuses_never_stop_the_broker_from_loading(b: InProcessBroker) -> None:
    pid, epoch = _txn_producer(b)
    b.add_partitions("tx", pid, epoch, [(T, 0), (T, 1)])
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"mine"), transactional_id="tx") == 0
    plog1 = b.broker.logs.get_partition(T, 1)
    assert plog1 is not None
    plog1.append(batch(pid=pid, epoch=epoch + 5, seq=0, value=b"planted"), origin=AppendOrigin.CLIENT)
    # crash right after PrepareCommit: the markers are written at load
    c = b.broker.coordination
    result = c.txn.end_txn("tx", pid, epoch, True)
    result.markers = []
    c.apply_txn_result(result)
    assert c.txn.state_of("tx").state.value == "PrepareCommit"
    b.restart()
    assert b.broker.coordination.txn.state_of("tx").state.value == "CompleteCommit"
    assert b.visible_values(T, 0) == [b"mine"]


def test_produce_carries_exactly_one_batch_per_partition(b: InProcessBroker) -> None:
    """A non-transactional first batch followed by a transactional one used to skip the KIP-890 check
    and hold the LSO forever."""
    pid, epoch = _txn_producer(b)
    two = batch(value=b"plain") + batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"sneaked")
    assert b.produce(T, 0, two, transactional_id="tx") == ErrorCode.invalid_record
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    assert plog.log_end_offset == 0 and plog.last_stable_offset == plog.high_watermark
    # two plain batches are refused the same way (Kafka: v3+ carries one batch)
    assert b.produce(T, 0, batch(value=b"a") + batch(value=b"b")) == ErrorCode.invalid_record
    assert b.produce(T, 0, batch(value=b"one")) == 0
    assert b.visible_values(T, 0) == [b"one"]


def test_producer_ids_never_handed_out_are_refused(b: InProcessBroker) -> None:
    _txn_producer(b)
    err, idem, _ = b.init_producer_id(None)
    assert err == 0
    guessed = idem + 10_000
    assert b.produce(T, 0, batch(pid=guessed, epoch=0, seq=0)) == ErrorCode.invalid_producer_id_mapping
    assert b.produce(T, 0, batch(pid=idem, epoch=0, seq=0)) == 0


def test_zombie_transactional_batch_with_an_old_epoch_is_fenced_after_a_fresh_init(b: InProcessBroker) -> None:
    pid, epoch = _txn_producer(b)
    b.add_partitions("tx", pid, epoch, [(T, 0)])
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"zombie"), transactional_id="tx") == 0
    err, pid2, epoch2 = b.init_producer_id("tx")  # the replacement fences and aborts
    assert err == ErrorCode.concurrent_transactions
    err, pid2, epoch2 = b.init_producer_id("tx")
    assert (err, pid2) == (0, pid) and epoch2 == epoch + 2
    # the zombie, on every path: produce, add partitions, commit, KIP-360 re-init
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=1, txn=True, value=b"late"),
                     transactional_id="tx") == ErrorCode.invalid_producer_epoch
    assert b.add_partitions("tx", pid, epoch, [(T, 0)]) == {(T, 0): ErrorCode.producer_fenced}
    assert b.end_txn("tx", pid, epoch, commit=True) == ErrorCode.producer_fenced
    assert b.init_producer_id("tx", pid, epoch)[0] == ErrorCode.producer_fenced
    assert b.init_producer_id("tx", pid, epoch + 1)[0] == ErrorCode.producer_fenced
    # the new instance is untouched
    b.add_partitions("tx", pid2, epoch2, [(T, 0)])
    assert b.produce(T, 0, batch(pid=pid2, epoch=epoch2, seq=0, txn=True, value=b"new"), transactional_id="tx") == 0
    assert b.end_txn("tx", pid2, epoch2, commit=True) == 0
    assert b.visible_values(T, 0) == [b"new"]


def _write_marker(b: InProcessBroker, pid: int, epoch: int, commit: bool, partition: int = 0) -> int:
    r = b.call(27, 1, {"markers": [{"producer_id": pid, "producer_epoch": epoch, "transaction_result": commit,
                                    "coordinator_epoch": 0,
                                    "topics": [{"name": T, "partition_indexes": [partition]}]}]})
    return int(r.markers[0].topics[0].partitions[0].error_code)


def test_clients_cannot_commit_through_write_txn_markers(b: InProcessBroker) -> None:
    pid, epoch = _txn_producer(b)
    b.add_partitions("tx", pid, epoch, [(T, 0)])
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"undecided"), transactional_id="tx") == 0
    assert _write_marker(b, pid, epoch, commit=True) == ErrorCode.cluster_authorization_failed
    assert b.visible_values(T, 0) == []
    assert b.broker.coordination.txn.state_of("tx").state.value == "Ongoing"


def test_a_client_abort_of_a_known_transaction_aborts_all_of_it(b: InProcessBroker) -> None:
    """One ABORT marker on one partition, then the producer's commit on the others, used to tear the
    transaction; the coordinator now aborts the whole of it and fences the producer."""
    pid, epoch = _txn_producer(b)
    b.add_partitions("tx", pid, epoch, [(T, 0), (T, 1)])
    for p in (0, 1):
        assert b.produce(T, p, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"v%d" % p),
                         transactional_id="tx") == 0
    assert _write_marker(b, pid, epoch + 3, commit=False) == ErrorCode.invalid_producer_epoch
    assert _write_marker(b, pid, epoch, commit=False) == 0
    assert b.end_txn("tx", pid, epoch, commit=True) == ErrorCode.producer_fenced
    assert b.visible_values(T, 0) == [] and b.visible_values(T, 1) == []
    for p in (0, 1):
        plog = b.broker.logs.get_partition(T, p)
        assert plog is not None and plog.last_stable_offset == plog.high_watermark


def test_a_client_abort_of_a_hanging_transaction_needs_its_exact_epoch(b: InProcessBroker) -> None:
    _txn_producer(b)
    _err, pid, _ = b.init_producer_id(None)  # an id the coordinator does not track as transactional
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    plog.append(batch(pid=pid, epoch=3, seq=0, txn=True, value=b"hanging"), origin=AppendOrigin.CLIENT)
    assert plog.last_stable_offset == 0
    assert _write_marker(b, pid, 4, commit=False) == ErrorCode.invalid_producer_epoch
    assert _write_marker(b, pid, 2, commit=False) == ErrorCode.invalid_producer_epoch
    assert _write_marker(b, pid + 1, 3, commit=False) == ErrorCode.invalid_txn_state
    assert plog.last_stable_offset == 0
    assert _write_marker(b, pid, 3, commit=False) == 0
    assert plog.last_stable_offset == plog.high_watermark
    assert b.visible_values(T, 0) == []
    assert _write_marker(b, pid, 3, commit=False) == ErrorCode.invalid_txn_state  # nothing open any more


def test_describe_producers_reports_the_coordinator_epoch_of_the_last_marker(b: InProcessBroker) -> None:
    pid, epoch = _txn_producer(b)
    b.add_partitions("tx", pid, epoch, [(T, 0)])
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True), transactional_id="tx") == 0

    def describe() -> tuple[int, int]:
        r = b.call(61, 0, {"topics": [{"name": T, "partition_indexes": [0]}]})
        [prod] = r.topics[0].partitions[0].active_producers
        return int(prod.coordinator_epoch), int(prod.current_txn_start_offset)

    assert describe() == (-1, 0)  # no marker yet, a transaction open at offset 0
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    assert describe() == (0, -1)
    b.restart()
    assert describe() == (0, -1)  # rebuilt from the marker on replay


@pytest.mark.parametrize("stranger_tid", ["stranger", "tx-other"])
def test_a_stranger_naming_its_own_transactional_id_cannot_write_into_anothers_transaction(
        b: InProcessBroker, stranger_tid: str) -> None:
    """KIP-890's check names the transactional id of the request: the batch's producer id and epoch
    must be that id's (Kafka's coordinator answers INVALID_PRODUCER_ID_MAPPING otherwise). A stranger
    that guessed a live transaction's producer id, epoch and next sequence, and names a transactional
    id it may write to (its own, or one it never initialised), must not land records in that
    transaction."""
    pid, epoch = _txn_producer(b)
    if stranger_tid == "tx-other":
        _txn_producer(b, stranger_tid)
    assert b.add_partitions("tx", pid, epoch, [(T, 0)]) == {(T, 0): 0}
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"mine"), transactional_id="tx") == 0
    code = b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=1, txn=True, value=b"stranger"),
                     transactional_id=stranger_tid)
    assert code == ErrorCode.invalid_producer_id_mapping
    # the owner's next sequence is still its own
    assert b.produce(T, 0, batch(pid=pid, epoch=epoch, seq=1, txn=True, value=b"mine2"), transactional_id="tx") == 0
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    assert b.visible_values(T, 0) == [b"mine", b"mine2"]


def test_a_stranger_naming_its_own_transactional_id_cannot_commit_offsets_in_anothers_transaction(
        b: InProcessBroker) -> None:
    """TxnOffsetCommit is checked the same way: the offsets go into the named transactional id's
    transaction only if the producer id is that id's."""
    pid, epoch = _txn_producer(b)
    assert b.call(25, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch,
                          "group_id": "g"}).error_code == 0

    def txn_offset_commit(tid: str, offset: int) -> int:
        r = b.call(28, 3, {"transactional_id": tid, "group_id": "g", "producer_id": pid, "producer_epoch": epoch,
                           "generation_id": -1, "member_id": "", "topics": [
                               {"name": T, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                           "committed_leader_epoch": -1,
                                                           "committed_metadata": None}]}]})
        return int(r.topics[0].partitions[0].error_code)

    assert txn_offset_commit("stranger", 999) == ErrorCode.invalid_producer_id_mapping
    assert txn_offset_commit("tx", 5) == 0
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    r = b.call(9, 8, {"groups": [{"group_id": "g", "topics": None}], "require_stable": True})
    assert [(p.partition_index, p.committed_offset) for t in r.groups[0].topics for p in t.partitions] == [(0, 5)]


@pytest.mark.parametrize("api, versions, fenced_since", [
    ("InitProducerId", range(0, 5), 4), ("AddPartitionsToTxn", range(0, 4), 2),
    ("AddOffsetsToTxn", range(0, 4), 2), ("EndTxn", range(0, 4), 2)])
def test_a_fenced_zombie_hears_the_fence_in_its_request_versions_words(
        b: InProcessBroker, api: str, versions: range, fenced_since: int) -> None:
    """KIP-588's PRODUCER_FENCED (90) is unknown to a request older than ``fenced_since``: Kafka answers
    those with INVALID_PRODUCER_EPOCH (47), which such a client handles as a fence. librdkafka 2.12
    sends AddPartitionsToTxn v0, for one."""
    zombie_pid, zombie_epoch = _txn_producer(b)
    _txn_producer(b)  # the new instance: the zombie's epoch is stale
    for version in versions:
        ids = {"transactional_id": "tx", "producer_id": zombie_pid, "producer_epoch": zombie_epoch}
        if api == "InitProducerId":
            if version < 3:  # no producer id and epoch before KIP-360: nothing to be fenced by
                continue
            code = b.call(API_INIT_PRODUCER_ID, version, {**ids, "transaction_timeout": 60_000}).error_code
        elif api == "AddPartitionsToTxn":
            r = b.call(API_ADD_PARTITIONS_TO_TXN, version, {
                f"v3_and_below_{k}": v for k, v in {**ids, "topics": [{"name": T, "partitions": [0]}]}.items()})
            code = r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
        elif api == "AddOffsetsToTxn":
            code = b.call(API_ADD_OFFSETS_TO_TXN, version, {**ids, "group_id": "g"}).error_code
        else:
            code = b.call(API_END_TXN, version, {**ids, "committed": True}).error_code
        want = ErrorCode.producer_fenced if version >= fenced_since else ErrorCode.invalid_producer_epoch
        assert code == want, (api, version, code)


@pytest.mark.parametrize("version", range(0, 5))
def test_an_empty_transactional_id_is_an_invalid_request(b: InProcessBroker, version: int) -> None:
    """Kafka: only a null transactional id asks for an idempotent producer id; "" is refused."""
    fields: dict = {"transactional_id": "", "transaction_timeout": 60_000}
    if version >= 3:
        fields.update(producer_id=-1, producer_epoch=-1)
    r = b.call(API_INIT_PRODUCER_ID, version, fields)
    assert (r.error_code, r.producer_id) == (ErrorCode.invalid_request, -1)
    assert b.broker.coordination.txn.state_of("") is None

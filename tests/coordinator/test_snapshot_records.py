"""snapshot_records: the newest record per live key, which alone rebuilds a coordinator's state.

This is what keeps the internal logs bounded (the server appends a checkpoint of these records and
drops the prefix), so "replay the checkpoint into an empty coordinator" must equal "replay the
whole log", for transactions in every state and for groups, offsets and tombstones.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from oncelog.clock import ManualClock
from oncelog.coordinator.group import offset_records as rec
from oncelog.coordinator.group.group_coordinator import GroupCoordinator
from oncelog.coordinator.producer_ids import InMemoryProducerIdManager
from oncelog.coordinator.transaction import log as txnlog
from oncelog.coordinator.transaction.coordinator import TransactionCoordinator
from oncelog.coordinator.transaction.state import TransactionState
from tests.coordinator.test_group_coordinator import join, sync
from tests.coordinator.test_transaction_coordinator import Harness


def test_transaction_checkpoint_rebuilds_every_state() -> None:
    h = Harness()
    for tid in ("committed", "open", "preparing", "expired"):
        h.init(tid)
    pid = {t: h.state(t).producer_id for t in ("committed", "open", "preparing", "expired")}
    h.apply(h.tc.add_partitions_to_txn("committed", pid["committed"], 0, [("t", 0)]))
    h.apply(h.tc.end_txn("committed", pid["committed"], 0, True))
    h.apply(h.tc.add_partitions_to_txn("open", pid["open"], 0, [("t", 1), ("u", 0)]))
    h.write_markers = False  # a crash between PrepareCommit and the markers
    h.apply(h.tc.add_partitions_to_txn("preparing", pid["preparing"], 0, [("t", 2)]))
    h.apply(h.tc.end_txn("preparing", pid["preparing"], 0, True))
    h.log.append((txnlog.encode_key("expired"), None))  # a tombstone, as expiry writes
    h.tc.replay(*h.log[-1])
    assert h.state("preparing").state is TransactionState.PREPARE_COMMIT

    snap = h.tc.snapshot_records()
    assert len(snap) == 3 and all(v is not None for _k, v in snap)
    fresh = TransactionCoordinator(InMemoryProducerIdManager(), ManualClock())
    for k, v in snap:
        fresh.replay(k, v)
    assert fresh.transactions == h.tc.transactions
    assert [m.transactional_id for m in fresh.pending_markers()] == ["preparing"]
    assert fresh.state_of("expired") is None
    whole_log = TransactionCoordinator(InMemoryProducerIdManager(), ManualClock())
    for k, v in h.log:
        whole_log.replay(k, v)
    assert whole_log.transactions == fresh.transactions


def _replay_all(gc: GroupCoordinator, records: list[tuple[bytes, bytes | None]]) -> None:
    for k, v in records:
        gc.replay(k, v)


def test_group_checkpoint_keeps_logged_membership_offsets_and_drops_deleted_groups() -> None:
    clock = ManualClock()
    gc = GroupCoordinator(clock, group_initial_rebalance_delay_ms=0)
    a = join(gc).value
    sync(gc, a.member_id, 1, [(a.member_id, b"assign")])
    _replay_all(gc, gc.take_records())
    _replay_all(gc, gc.offset_commit("g", 1, a.member_id, None, [("t", 0, 3, -1, None)]).records)
    _replay_all(gc, gc.offset_commit("g", 1, a.member_id, None, [("t", 0, 7, -1, None)]).records)
    _replay_all(gc, gc.offset_commit("solo", -1, "", None, [("t", 1, 1, -1, None)]).records)
    _replay_all(gc, gc.offset_commit("gone", -1, "", None, [("t", 1, 4, -1, None)]).records)
    errors, records = gc.delete_groups(["gone"])
    assert errors == {"gone": ErrorCode.none}
    _replay_all(gc, records)
    # pending transactional offsets are not part of the checkpoint (they stay above the LSO)
    for k, v in gc.txn_offset_commit("solo", 9, -1, "", None, [("t", 1, 99, -1, None)]).records:
        gc.replay(k, v, 9, transactional=True)
    # a rebalance in progress: memory differs from the log, the checkpoint keeps what the log says
    join(gc, member="", session=10_000)

    snap = gc.snapshot_records(lambda gid: True)
    keys = [k for k, _v in snap]
    assert rec.group_key("g") in keys and not any(b"gone" in k for k in keys)
    assert sum(1 for k in keys if k.startswith(rec.OFFSET_KEY)) == 2, "newest offset per key only"
    fresh = GroupCoordinator(clock)
    fresh.loading = True
    _replay_all(fresh, snap)
    fresh.loaded()
    g = fresh.groups["g"]
    assert g.generation_id == 1 and list(g.members) == [a.member_id] and g.members[a.member_id].assignment == b"assign"
    assert fresh.offsets == {"g": {("t", 0): gc.offsets["g"][("t", 0)]}, "solo": gc.offsets["solo"]}
    assert fresh.offsets["g"][("t", 0)].offset == 7 and "gone" not in fresh.groups
    assert gc.snapshot_records(lambda gid: gid == "solo") == [k_v for k_v in snap if b"solo" in k_v[0]]

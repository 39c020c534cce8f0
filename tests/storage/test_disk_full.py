"""A client filling the disk is answered with an error; the broker keeps running (``LogDirState``).

Before: on a full file system a produce's short write raised a plain OSError out of the handler (the
connection was closed as for an internal error) after its index entries were already taken, and a
write that failed with ENOSPC took the log directory offline and stopped the broker. Checked by
hand on a 20 MiB tmpfs (a broker process filling it with 100 KB records): with
``log_dir_min_free_bytes`` the produces past it are refused with KAFKA_STORAGE_ERROR, and without it
the short write is refused the same way; the broker stops cleanly afterwards in both cases. Here the
file system is simulated (free space, short and failed writes), so that the tests run anywhere.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.storage import fileio
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

STORAGE_ERROR = 56
T = "t"


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic(T, 1)
    yield broker
    broker.close()


def _produce(b: InProcessBroker, value: bytes, **kw: Any) -> Any:
    r = b.call(0, 9, {"transactional_id": kw.get("tid"), "acks": -1, "timeout": 5000, "topic_data": [
        {"name": T, "partition_data": [{"index": 0, "records": batch(value=value, **kw.get("batch", {}))}]}]})
    return r.responses[0].partition_responses[0]


def test_produces_past_the_free_space_kept_are_refused_and_markers_still_land(b: InProcessBroker) -> None:
    err, pid, epoch = b.init_producer_id("tx")
    assert err == 0 and b.add_partitions("tx", pid, epoch, [(T, 0)]) == {(T, 0): 0}
    assert _produce(b, b"in-txn", tid="tx", batch={"pid": pid, "epoch": epoch, "seq": 0, "txn": True}).error_code == 0
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    end = plog.log_end_offset
    b.broker.logs.dir_state.min_free_bytes = 1 << 62  # the disk is "full" from here on
    refused = _produce(b, b"refused")
    assert refused.error_code == STORAGE_ERROR
    assert "not enough free space" in refused.error_message and "log_dir_min_free_bytes" in refused.error_message
    assert plog.log_end_offset == end
    assert b.end_txn("tx", pid, epoch, commit=True) == 0  # the marker is the broker's own record
    assert plog.log_end_offset == end + 1
    assert b.broker.storage_failure is None
    b.broker.logs.dir_state.min_free_bytes = 0
    assert _produce(b, b"after").error_code == 0
    assert b.visible_values(T, 0) == [b"in-txn", b"after"]


@pytest.mark.parametrize("how", ["short", "enospc"])
def test_a_write_the_disk_cuts_short_is_refused_and_leaves_nothing(b: InProcessBroker, how: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    b.broker.logs.dir_state.min_free_bytes = 0  # the check off: the disk itself says it is full
    assert _produce(b, b"first").error_code == 0
    plog = b.broker.logs.get_partition(T, 0)
    assert plog is not None
    real_pwrite = fileio.fs.pwrite
    end, size, index_entries = plog.log_end_offset, plog.active.size, len(plog.active.offset_index.positions)

    def full(fd: int, data: Any, position: int) -> int:
        if how == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_pwrite(fd, bytes(data)[: len(data) // 2], position)

    monkeypatch.setattr(fileio.fs, "pwrite", full)
    refused = _produce(b, b"cut" * 1000)
    assert refused.error_code == STORAGE_ERROR
    assert "full" in refused.error_message or "No space" in refused.error_message
    assert (plog.log_end_offset, plog.active.size) == (end, size)
    assert len(plog.active.offset_index.positions) == index_entries
    assert plog.active.path.stat().st_size == size  # the short write was truncated away
    assert b.broker.storage_failure is None and b.broker.logs.dir_state.offline_reason is None
    monkeypatch.undo()
    assert _produce(b, b"second").error_code == 0
    assert b.visible_values(T, 0) == [b"first", b"second"]
    b.restart()
    assert b.visible_values(T, 0) == [b"first", b"second"]


def test_a_file_system_that_reports_no_size_is_not_taken_for_a_full_one(b: InProcessBroker,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """LazyFS (the power-cut tests' file system) answers statvfs with zeros: 0 bytes free. The bound
    is then not applied, instead of every produce being refused (found by the LazyFS power cuts)."""
    import os

    zeros = os.statvfs_result((0,) * 10)
    monkeypatch.setattr(os, "statvfs", lambda _path: zeros)
    b.broker.logs.dir_state.min_free_bytes = 1 << 20
    assert _produce(b, b"kept").error_code == 0
    assert b.visible_values(T, 0) == [b"kept"]


# --- offset commits: records a client's request adds to __consumer_offsets ---------------------------
# Found by hand (scratch disk_offsets.py, a 20 MiB tmpfs, a broker process with a 4 MiB bound): once
# produces were refused, 1,014 OffsetCommits of 4 KB metadata filled the rest of the disk; the next
# one's short write took the directory offline and stopped the broker, and it could not start again
# (its leader-epoch file could not be written). Offset commits now keep the bound too.

NOT_COORDINATOR = 16


def _commit(b: InProcessBroker, offset: int) -> int:
    r = b.call(8, 8, {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
                      "retention_time_ms": -1, "topics": [{"name": T, "partitions": [
                          {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                           "committed_metadata": "m" * 100}]}]})
    return int(r.topics[0].partitions[0].error_code)


def _txn_commit(b: InProcessBroker, pid: int, epoch: int, offset: int) -> int:
    r = b.call(28, 3, {"transactional_id": "tx", "group_id": "g", "producer_id": pid, "producer_epoch": epoch,
                       "generation_id": -1, "member_id": "", "topics": [
                           {"name": T, "partitions": [{"partition_index": 0, "committed_offset": offset,
                                                       "committed_leader_epoch": -1, "committed_metadata": None}]}]})
    return int(r.topics[0].partitions[0].error_code)


def _committed(b: InProcessBroker) -> int:
    r = b.call(9, 8, {"groups": [{"group_id": "g", "topics": [{"name": T, "partition_indexes": [0]}]}],
                      "require_stable": True})
    return int(r.groups[0].topics[0].partitions[0].committed_offset)


def _offsets_log(b: InProcessBroker) -> Any:
    coord = b.broker.coordination
    return b.broker.logs.get_partition(*coord.offsets_partition_for("g"))


def test_offset_commits_past_the_free_space_kept_are_refused_and_markers_still_land(b: InProcessBroker) -> None:
    assert _commit(b, 1) == 0
    err, pid, epoch = b.init_producer_id("tx")
    assert err == 0
    assert b.call(25, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch,
                          "group_id": "g"}).error_code == 0
    assert _txn_commit(b, pid, epoch, 2) == 0
    offsets = _offsets_log(b)
    end = offsets.log_end_offset
    b.broker.logs.dir_state.min_free_bytes = 1 << 62  # the disk is "full" from here on
    assert _commit(b, 3) == NOT_COORDINATOR  # as Kafka answers a storage error here: retriable
    assert _txn_commit(b, pid, epoch, 4) == NOT_COORDINATOR
    assert offsets.log_end_offset == end
    assert b.end_txn("tx", pid, epoch, commit=True) == 0  # its markers are the broker's own records
    assert offsets.log_end_offset == end + 1
    assert _committed(b) == 2
    assert b.broker.storage_failure is None
    b.broker.logs.dir_state.min_free_bytes = 0
    assert _commit(b, 5) == 0
    b.restart()
    assert _committed(b) == 5


def test_an_offset_commit_the_disk_cuts_short_is_refused_and_the_broker_stays_up(
        b: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    b.broker.logs.dir_state.min_free_bytes = 0  # the check off: the disk itself says it is full
    assert _commit(b, 1) == 0
    offsets = _offsets_log(b)
    end, size = offsets.log_end_offset, offsets.active.size
    real_pwrite = fileio.fs.pwrite
    monkeypatch.setattr(fileio.fs, "pwrite", lambda fd, data, position: real_pwrite(
        fd, bytes(data)[: len(data) // 2], position))
    assert _commit(b, 2) == NOT_COORDINATOR
    assert (offsets.log_end_offset, offsets.active.size) == (end, size)
    assert offsets.active.path.stat().st_size == size
    assert b.broker.storage_failure is None and b.broker.logs.dir_state.offline_reason is None
    monkeypatch.undo()
    assert _committed(b) == 1
    assert _commit(b, 3) == 0
    b.restart()
    assert _committed(b) == 3


def test_transaction_steps_that_add_records_are_refused_and_those_that_finish_one_are_not(
        b: InProcessBroker) -> None:
    """InitProducerId of a new transactional id, AddPartitionsToTxn and AddOffsetsToTxn add to
    __transaction_state (a client creating transactional ids in a loop would fill the disk): past the
    bound they get NOT_COORDINATOR, nothing written. EndTxn, which finishes a transaction, goes through."""
    b.create_topic("u", 1)
    err, pid, epoch = b.init_producer_id("tx")
    assert err == 0 and b.add_partitions("tx", pid, epoch, [(T, 0)]) == {(T, 0): 0}
    assert _produce(b, b"in-txn", tid="tx", batch={"pid": pid, "epoch": epoch, "seq": 0, "txn": True}).error_code == 0
    txn_log = b.broker.logs.get_partition("__transaction_state", 0)
    assert txn_log is not None
    end = txn_log.log_end_offset
    b.broker.logs.dir_state.min_free_bytes = 1 << 62
    assert b.init_producer_id("another")[0] == NOT_COORDINATOR
    assert b.add_partitions("tx", pid, epoch, [("u", 0)]) == {("u", 0): NOT_COORDINATOR}
    assert b.add_partitions("tx", pid, epoch, [(T, 0)]) == {(T, 0): 0}  # already in it: nothing to write
    assert b.call(25, 3, {"transactional_id": "tx", "producer_id": pid, "producer_epoch": epoch,
                          "group_id": "g"}).error_code == NOT_COORDINATOR
    assert txn_log.log_end_offset == end
    assert b.end_txn("tx", pid, epoch, commit=True) == 0
    assert txn_log.log_end_offset > end and b.broker.storage_failure is None
    assert b.visible_values(T, 0) == [b"in-txn"]
    b.broker.logs.dir_state.min_free_bytes = 0
    err2, pid2, _ = b.init_producer_id("another")
    assert err2 == 0 and pid2 >= 0
    b.restart()
    assert b.init_producer_id("another")[0] == 0


def _join(b: InProcessBroker, member_id: str = "", metadata: bytes = b"m") -> Any:
    return b.call(11, 3, {"group_id": "g", "session_timeout": 30000, "rebalance_timeout": 30000,
                          "member_id": member_id, "protocol_type": "consumer",
                          "protocols": [{"name": "range", "metadata": metadata}]})


def _sync(b: InProcessBroker, join: Any, assignment: bytes) -> Any:
    return b.call(14, 3, {"group_id": "g", "generation_id": join.generation_id, "member_id": join.member_id,
                          "group_instance_id": None,
                          "assignments": [{"member_id": join.member_id, "assignment": assignment}]})


def test_group_membership_past_the_free_space_kept_is_refused_before_it_changes_anything(
        tmp_path: Path) -> None:
    """Membership records (a group's Stable record with its assignment, up to message.max.bytes; the
    Empty record when its members go) are written after the state change they image. Before, a client
    joining new groups with large metadata and syncing large assignments filled the disk past the
    bound, and the short write stopped the broker (by hand: 4 groups of 400 KB on a 20 MiB tmpfs).
    Now past the bound a JoinGroup gets NOT_COORDINATOR before it changes anything, and a leader's
    SyncGroup whose record does not fit gets NOT_COORDINATOR and the group rebalances, as when
    Kafka's storeGroup meets a storage error; nothing is written, the broker stays up."""
    b = InProcessBroker(tmp_path / "d", group_initial_rebalance_delay_ms=0)
    try:
        dir_state = b.broker.logs.dir_state
        offsets = _offsets_log(b)
        first = _join(b)
        assert (first.error_code, first.generation_id) == (0, 1)
        assert _sync(b, first, b"a1").error_code == 0
        end = offsets.log_end_offset
        groups = b.broker.coordination.groups.groups

        dir_state.min_free_bytes = 1 << 62  # full: no JoinGroup is let in, new member or known
        assert _join(b).error_code == NOT_COORDINATOR
        assert _join(b, first.member_id).error_code == NOT_COORDINATOR
        assert (groups["g"].state.name, groups["g"].generation_id, list(groups["g"].members)) == \
            ("STABLE", 1, [first.member_id])
        assert offsets.log_end_offset == end

        dir_state.min_free_bytes = 0  # a rebalance starts with room ...
        second = _join(b, first.member_id)
        assert (second.error_code, second.generation_id) == (0, 2)
        dir_state.min_free_bytes = 1 << 62  # ... and the disk fills before the leader's SyncGroup
        assert _sync(b, second, b"a2" * 1000).error_code == NOT_COORDINATOR
        assert groups["g"].state.name == "PREPARING_REBALANCE"
        assert offsets.log_end_offset == end
        assert b.broker.storage_failure is None and dir_state.offline_reason is None

        dir_state.min_free_bytes = 0
        third = _join(b, first.member_id)
        assert (third.error_code, third.generation_id) == (0, 3)
        synced = _sync(b, third, b"a3")
        assert (synced.error_code, synced.assignment) == (0, b"a3")
        assert offsets.log_end_offset == end + 1
        b.restart()
        g = b.broker.coordination.groups.groups["g"]
        assert (g.state.name, g.generation_id) == ("STABLE", 3)
        assert g.members[first.member_id].assignment == b"a3"
    finally:
        b.close()


def test_a_checkpoint_that_would_eat_into_the_free_space_kept_is_put_off_not_fatal(
        b: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint of an internal partition writes its whole live state again. Before, a client's
    live offsets larger than the space kept made it fail once the disk reached the bound: the
    broker stopped, and again 20 s after each restart (by hand: 1,500 commits of 4 KB metadata,
    then produces to the bound, on a 20 MiB tmpfs with a 4 MiB bound). Now it is put off while it
    would not fit, a short write of it is refused with the directory online, and it runs once there
    is room; the state read back is the same throughout."""
    for offset in range(1, 40):
        assert _commit(b, offset) == 0
    coord = b.broker.coordination
    offsets = _offsets_log(b)
    bounds = (offsets.log_start_offset, offsets.log_end_offset)
    dir_state = b.broker.logs.dir_state

    dir_state.min_free_bytes = 1 << 62
    assert coord.checkpoint_internal_logs(0) == 0
    assert (offsets.log_start_offset, offsets.log_end_offset) == bounds

    dir_state.min_free_bytes = 0  # the check passes, the disk cuts the write short
    real_pwrite = fileio.fs.pwrite
    monkeypatch.setattr(fileio.fs, "pwrite", lambda fd, data, position: real_pwrite(
        fd, bytes(data)[: len(data) // 2], position))
    coord.checkpoint_internal_logs(0)  # the transaction log's (empty, nothing to write) goes through
    assert b.broker.storage_failure is None and dir_state.offline_reason is None
    assert offsets.log_start_offset == bounds[0]
    monkeypatch.undo()
    assert _committed(b) == 39

    assert coord.checkpoint_internal_logs(0) >= 1
    assert offsets.log_start_offset > bounds[0]
    assert _commit(b, 40) == 0
    b.restart()
    assert _committed(b) == 40

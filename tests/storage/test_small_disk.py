"""Every path by which a client makes the broker write, driven on a small disk until it is refused:
the broker never goes offline, the steps that finish what is written still land, and it starts again.

``SmallDisk`` is a file system of a fixed capacity over the test's directory: ``statvfs`` reports
the capacity less the bytes of every file under it, and a write that would pass the capacity is cut
short (the bytes that fit, as a real file system does) or fails with ENOSPC. The broker keeps
``log_dir_min_free_bytes`` of it for its own records. A path that writes what a client asks for
without keeping that bound fills the disk, and the broker's next write of its own fails and takes
the log directory offline: the invariant below catches it whatever the path.

Found by hand on a 20 MiB tmpfs, one path at a time (scratch ``disk_*.py``), each of which stopped
the broker before its fix: offset commits, new transactional ids, groups with large metadata, the
internal-log checkpoint, and the log cleaner (which marked the log uncleanable instead).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.protocol import records as rb
from oncelog.storage import fileio
from tests.inproc import InProcessBroker

CAPACITY = 3 << 20
KEPT = 512 << 10  # log_dir_min_free_bytes
STORAGE_ERROR, NOT_COORDINATOR = 56, 16


class SmallDisk:
    """A disk of ``capacity`` bytes holding the files under ``root`` (see the module docstring)."""

    def __init__(self, root: Path, capacity: int) -> None:
        self.root, self.capacity = root, capacity
        self.refused_writes = 0

    def used(self) -> int:
        total = 0
        for path, _dirs, files in os.walk(self.root):
            for name in files:
                try:
                    total += os.stat(os.path.join(path, name)).st_size
                except FileNotFoundError:
                    pass
        return total

    def statvfs(self, _path: Any) -> Any:
        return SimpleNamespace(f_blocks=1, f_bavail=max(0, self.capacity - self.used()), f_frsize=1)

    def _fitting(self, fd: int, data: Any, position: int) -> int:
        """How many bytes of ``data`` written at ``position`` fit; raises ENOSPC if none."""
        size = os.fstat(fd).st_size
        grow = max(0, position + len(data) - size)
        room = self.capacity - self.used()
        if grow <= room:
            return len(data)
        self.refused_writes += 1
        fits = len(data) - (grow - max(room, 0))
        if fits <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return fits

    def pwrite(self, fd: int, data: Any, position: int) -> int:
        n = self._fitting(fd, data, position)
        return os.pwrite(fd, memoryview(data)[:n], position)

    def write_all(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = self._fitting(fd, view, os.lseek(fd, 0, os.SEEK_CUR))
            view = view[os.write(fd, view[:n]):]


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SmallDisk:
    d = SmallDisk(tmp_path, CAPACITY)
    monkeypatch.setattr(os, "statvfs", d.statvfs)
    monkeypatch.setattr(fileio.fs, "pwrite", d.pwrite)
    monkeypatch.setattr(fileio.fs, "_write_all", d.write_all)
    return d


@pytest.fixture
def b(tmp_path: Path, disk: SmallDisk) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d", log_dir_min_free_bytes=KEPT, group_initial_rebalance_delay_ms=0)
    broker.create_topic("t", 1)
    yield broker
    broker.close()


def _record(key: bytes, value: bytes) -> bytes:
    return rb.build_batch([rb.encode_record(0, 0, key, value)], base_timestamp=1_000, max_timestamp=1_000)


def _produce(b: InProcessBroker, topic: str, key: bytes, value: bytes) -> int:
    r = b.call(0, 9, {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": _record(key, value)}]}]})
    return int(r.responses[0].partition_responses[0].error_code)


def _fill(b: InProcessBroker, topic: str = "t", sizes: tuple[int, ...] = (64 << 10, 4 << 10, 256)) -> int:
    """Produce to ``topic`` until refused, in ever smaller records: the disk at the bound (within
    the last of ``sizes``)."""
    n = 0
    for size in sizes:
        while (code := _produce(b, topic, b"k%d" % n, os.urandom(size))) == 0:
            n += 1
        assert code == STORAGE_ERROR
    return n


def _commit(b: InProcessBroker, group: str, offset: int, metadata: str = "m" * 4000) -> int:
    r = b.call(8, 8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                      "group_instance_id": None, "retention_time_ms": -1, "topics": [{"name": "t", "partitions": [
                          {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                           "committed_metadata": metadata}]}]})
    return int(r.topics[0].partitions[0].error_code)


def _until_refused(step: Callable[[int], int], refused: int, limit: int = 5_000) -> tuple[int, int]:
    """Run ``step(i)`` until it answers ``refused`` three times; (accepted, refused) counts."""
    accepted = seen = 0
    for i in range(limit):
        code = step(i)
        if code == 0:
            accepted += 1
        else:
            assert code == refused, code
            seen += 1
            if seen == 3:
                return accepted, seen
    raise AssertionError(f"never refused in {limit} steps ({accepted} accepted)")


def _join_and_sync(b: InProcessBroker, group: str, metadata: bytes) -> int:
    j = b.call(11, 3, {"group_id": group, "session_timeout": 30000, "rebalance_timeout": 30000, "member_id": "",
                       "protocol_type": "consumer", "protocols": [{"name": "range", "metadata": metadata}]})
    if j.error_code:
        return int(j.error_code)
    s = b.call(14, 3, {"group_id": group, "generation_id": j.generation_id, "member_id": j.member_id,
                       "group_instance_id": None, "assignments": [{"member_id": j.member_id, "assignment": metadata}]})
    return int(s.error_code)


# Each of these first fills the disk to within 64 KiB of the bound, so that its own records take the rest.
def _offset_commits(b: InProcessBroker) -> None:
    _fill(b, sizes=(64 << 10,))
    _until_refused(lambda i: _commit(b, f"g{i}", i), NOT_COORDINATOR)


def _transactional_ids(b: InProcessBroker) -> None:
    _fill(b, sizes=(64 << 10,))
    _until_refused(lambda i: b.init_producer_id(f"{i:0200d}")[0], NOT_COORDINATOR)


def _groups(b: InProcessBroker) -> None:
    _until_refused(lambda i: _join_and_sync(b, f"big{i}", os.urandom(100_000)), NOT_COORDINATOR)


def _transactions(b: InProcessBroker) -> None:
    """Transactions with data and offsets until a step is refused; the open one still commits."""
    err, pid, epoch = b.init_producer_id("tx")
    assert err == 0
    sequence = [0]

    def one(_i: int) -> int:
        if (code := b.add_partitions("tx", pid, epoch, [("t", 0)])[("t", 0)]) != 0:
            return code
        if (code := b.produce("t", 0, rb.build_batch([rb.encode_record(0, 0, b"k", os.urandom(20_000))],
                                                       base_timestamp=1, max_timestamp=1, producer_id=pid,
                                                       producer_epoch=epoch, base_sequence=sequence[0],
                                                       attributes=rb.ATTR_TRANSACTIONAL),
                              transactional_id="tx")) != 0:
            assert code == STORAGE_ERROR
            return NOT_COORDINATOR  # refused all the same; the transaction is still open
        sequence[0] += 1
        return b.end_txn("tx", pid, epoch, commit=True)

    _until_refused(one, NOT_COORDINATOR)
    assert b.end_txn("tx", pid, epoch, commit=True) == 0  # what was begun finishes


def _idempotent_producers(b: InProcessBroker) -> None:
    """A new producer id for every record (each an entry in the partition's producer state, which
    its snapshots write whole) until refused; then a roll writes the snapshot."""
    def one(_i: int) -> int:
        err, pid, epoch = b.init_producer_id(None)
        assert err == 0
        record = rb.encode_record(0, 0, b"k", os.urandom(2_000))
        return b.produce("t", 0, rb.build_batch([record], base_timestamp=1, max_timestamp=1, producer_id=pid,
                                                producer_epoch=epoch, base_sequence=0))

    _until_refused(one, STORAGE_ERROR)
    plog = b.broker.logs.get_partition("t", 0)
    plog.roll()
    plog.flush()


def _checkpoint(b: InProcessBroker) -> None:
    """Live offsets larger than the space kept, then the disk to the bound, then a checkpoint."""
    for i in range(200):
        assert _commit(b, f"g{i}", i) == 0
    _fill(b)
    b.broker.coordination.checkpoint_internal_logs(0)


def _cleaner(b: InProcessBroker) -> None:
    """A compacted topic of unique keys filled to the bound, then the log cleaner."""
    b.broker.logs.create_topic("c", 1, {"cleanup.policy": "compact", "segment.bytes": str(256 << 10),
                                        "min.cleanable.dirty.ratio": "0.01"})
    _fill(b, "c")
    logs = b.broker.logs
    plog = logs.get_partition("c", 0)
    plog.flush()  # what a cleaning may take ends at the recovery point
    assert logs.cleaner.log_to_clean(plog, b.clock.now_ms()).dirty_bytes > CAPACITY // 2
    assert logs.cleaner.clean_now([plog], b.clock.now_ms()) == 0
    assert plog.name not in logs.cleaner.uncleanable


def _create_topic(b: InProcessBroker, name: str, partitions: int = 3) -> int:
    r = b.call(19, 5, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1,
                                   "assignments": [], "configs": []}], "timeout_ms": 60000, "validate_only": False})
    return int(r.topics[0].error_code)


def _topics(b: InProcessBroker) -> None:
    """Topics with long names (topics.json is rewritten whole at each) until refused; then a
    deletion, which gives room back, still goes through."""
    _fill(b, sizes=(64 << 10,))
    _until_refused(lambda i: _create_topic(b, f"{i:0240d}"), STORAGE_ERROR)
    r = b.call(20, 4, {"topic_names": [f"{0:0240d}"], "timeout_ms": 30000})
    assert r.responses[0].error_code == 0


def _scram_users(b: InProcessBroker) -> None:
    """SCRAM users with long names (users.json is rewritten whole at each change) until refused."""
    def one(i: int) -> int:
        r = b.call(51, 0, {"deletions": [], "upsertions": [
            {"name": f"{i:05d}-{j}-" + "u" * 2000, "mechanism": 1, "iterations": 4096, "salt": b"salt",
             "salted_password": b"p" * 32} for j in range(20)]})
        codes = {int(x.error_code) for x in r.results}
        assert len(codes) == 1, codes
        return codes.pop()

    _until_refused(one, STORAGE_ERROR)


ADVERSARIES = {"produce": lambda b: _fill(b), "topics": _topics, "offset commits": _offset_commits,
               "transactional ids": _transactional_ids, "idempotent producers": _idempotent_producers,
               "groups": _groups, "transactions": _transactions,
               "checkpoint": _checkpoint, "cleaner": _cleaner, "scram users": _scram_users}


@pytest.mark.parametrize("adversary", list(ADVERSARIES))
def test_a_client_filling_the_disk_is_refused_and_never_stops_the_broker(
        b: InProcessBroker, disk: SmallDisk, adversary: str) -> None:
    ADVERSARIES[adversary](b)
    assert b.broker.storage_failure is None and b.broker.logs.dir_state.offline_reason is None
    assert disk.capacity - disk.used() > 0  # the bound held: the disk itself never filled
    assert _commit(b, "after", 1, "") in (0, NOT_COORDINATOR)
    b.restart()
    assert b.broker.storage_failure is None
    assert _produce(b, "t", b"k", b"small") in (0, STORAGE_ERROR)


def test_the_small_disk_cuts_writes_short_as_a_real_one(tmp_path: Path, disk: SmallDisk) -> None:
    """The double itself: a write past the capacity is cut short, then refused with ENOSPC."""
    disk.capacity = 1000
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    try:
        assert disk.pwrite(fd, b"x" * 600, 0) == 600
        assert disk.pwrite(fd, b"y" * 600, 600) == 400
        with pytest.raises(OSError) as exc:
            disk.pwrite(fd, b"z", 1000)
        assert exc.value.errno == errno.ENOSPC
        assert disk.pwrite(fd, b"w" * 10, 0) == 10  # overwriting takes no room
        assert disk.statvfs(tmp_path).f_bavail == 0
    finally:
        os.close(fd)


def test_a_topic_whose_metadata_the_disk_refuses_is_not_created_at_all(tmp_path: Path, disk: SmallDisk) -> None:
    """With the bound off, the disk itself refuses topics.json: the creation is answered
    KAFKA_STORAGE_ERROR and undone (not served, no directory, no temporary file left taking room),
    and a restart does not bring it back; so are new partitions, config overrides and a deletion.
    Before, the topic stayed registered in memory, unsaved."""
    b = InProcessBroker(tmp_path / "d", log_dir_min_free_bytes=0)
    try:
        b.create_topic("t", 1)
        _create_topic(b, "first")
        while _produce(b, "t", b"k", os.urandom(64 << 10)) == 0:
            pass
        while _produce(b, "t", b"k", b"x" * 200) == 0:
            pass
        assert _create_topic(b, "x" * 240, 5) == STORAGE_ERROR
        assert "x" * 240 not in b.broker.logs.topics()
        r = b.call(37, 3, {"topics": [{"name": "first", "count": 8, "assignments": None}], "timeout_ms": 5000,
                           "validate_only": False})
        assert r.results[0].error_code == STORAGE_ERROR
        assert b.broker.logs.topics()["first"].num_partitions == 3 and b.broker.logs.get_partition("first", 3) is None
        assert not (tmp_path / "d" / "first-3").exists()
        r = b.call(44, 1, {"resources": [{"resource_type": 2, "resource_name": "first", "configs": [
            {"name": "retention.ms", "config_operation": 0, "value": "1000"}]}], "validate_only": False})
        assert r.responses[0].error_code == STORAGE_ERROR and b.broker.logs.topics()["first"].configs == {}
        r = b.call(20, 4, {"topic_names": ["first"], "timeout_ms": 30000})  # no room even to say it is gone
        assert r.responses[0].error_code == STORAGE_ERROR and "first" in b.broker.logs.topics()
        assert not any(p.name.startswith("xxxx") or p.name.endswith(".tmp") for p in (tmp_path / "d").rglob("*"))
        assert b.broker.storage_failure is None
        b.restart()
        assert "x" * 240 not in b.broker.logs.topics() and "first" in b.broker.logs.topics()
    finally:
        disk.capacity *= 2  # room for the snapshots a clean close writes (the bound was off)
        b.close()

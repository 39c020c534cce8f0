"""What clients may read under fsync per append: only what is fsynced.

Kafka, with ``flush.messages=1``, flushes inside the append, before the high watermark moves, so no
consumer ever reads a record that a power cut can still take back. Our appends are fsynced after,
by the group commit (``Broker.durable``); Fetch, ListOffsets and the high watermark they report
stop at ``PartitionLog.readable_end`` (what the group commit has made durable) until then, and a
waiting fetch is woken when the fsync is recorded. With the background fsync, records are readable
at once, as in Kafka.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fsync_gate import FsyncGate
from tests.inproc import API_PRODUCE, InProcessBroker
from tests.storage.helpers import batch

TOPIC = "readable"


@pytest.fixture()
def gate() -> Iterator[FsyncGate]:
    g = FsyncGate()
    try:
        yield g
    finally:
        g.close()


def _broker(tmp_path: Path, flush_every_append: bool) -> InProcessBroker:
    ib = InProcessBroker(tmp_path / "d", flush_every_append=flush_every_append)
    ib.call(19, 5, {"topics": [{"name": TOPIC, "num_partitions": 1, "replication_factor": 1,
                                "assignments": [], "configs": []}], "timeout_ms": 5000, "validate_only": False})
    return ib


def _latest(ib: InProcessBroker) -> int:
    r = ib.call(2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
    return int(r.topics[0].partitions[0].offset)


def _produce_fields(value: bytes) -> dict[str, object]:
    return {"transactional_id": None, "acks": -1, "timeout": 30000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": batch(2, value=value)}]}]}


def test_records_are_not_readable_before_their_fsync(tmp_path: Path, gate: FsyncGate) -> None:
    ib = _broker(tmp_path, flush_every_append=True)
    try:
        assert ib.produce(TOPIC, 0, batch(1, value=b"first")) == 0
        gate.hold(TOPIC)
        started = ib.start(API_PRODUCE, 9, _produce_fields(b"second"))
        ib.run_until(gate.reached.is_set)
        plog = ib.broker.logs.partitions()[(TOPIC, 0)]
        assert plog.log_end_offset == 3  # appended...
        part = ib.fetch(TOPIC, 0, read_committed=False)
        assert (part.high_watermark, ib.visible_values(TOPIC, 0, read_committed=False)) == (1, [b"first"])
        assert ib.fetch(TOPIC, 0, read_committed=True).last_stable_offset == 1
        assert _latest(ib) == 1  # ...but not readable while its fsync is held
        assert not started.task.done()
        gate.release()
        assert ib.finish(started).responses[0].partition_responses[0].error_code == 0
        assert ib.fetch(TOPIC, 0, read_committed=False).high_watermark == 3
        assert ib.visible_values(TOPIC, 0, read_committed=False) == [b"first", b"second", b"second"]
        assert _latest(ib) == 3
    finally:
        ib.close()


def test_a_waiting_fetch_is_woken_by_the_fsync_not_by_the_append(tmp_path: Path, gate: FsyncGate) -> None:
    ib = _broker(tmp_path, flush_every_append=True)
    try:
        fetch = ib.start(1, 11, {
            "replica_id": -1, "max_wait": 10_000, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "topics": [{"topic": TOPIC, "partitions": [{
                "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""})
        gate.hold(TOPIC)
        produce = ib.start(API_PRODUCE, 9, _produce_fields(b"v"))
        ib.run_until(gate.reached.is_set)
        ib.loop.run_until_complete(asyncio.sleep(0.2))  # the append has woken the fetch by now
        assert not fetch.task.done(), "the fetch answered with records not yet fsynced"
        gate.release()
        ib.finish(produce)
        ib.run_until(fetch.task.done, timeout_s=2)  # woken when the fsync is recorded, not at max_wait
        part = ib.finish(fetch).responses[0].partitions[0]
        assert part.high_watermark == 2 and part.records
    finally:
        ib.close()


def test_with_the_background_fsync_records_are_readable_at_once(tmp_path: Path, gate: FsyncGate) -> None:
    ib = _broker(tmp_path, flush_every_append=False)
    try:
        gate.hold(TOPIC)
        assert ib.produce(TOPIC, 0, batch(2, value=b"v")) == 0
        assert ib.fetch(TOPIC, 0, read_committed=False).high_watermark == 2
        assert _latest(ib) == 2
    finally:
        ib.close()



@pytest.mark.parametrize("flush_every_append", [False, True])
def test_an_fsync_wakes_fetches_only_where_reads_wait_for_it(tmp_path: Path, flush_every_append: bool) -> None:
    """The group commit also fsyncs under background fsync (a transaction's data, ``sync_behind``);
    there reads never wait for an fsync, so recording one must not wake the waiting fetches."""
    ib = _broker(tmp_path, flush_every_append=flush_every_append)
    try:
        plog = ib.broker.logs.partitions()[(TOPIC, 0)]
        woken: list[object] = []
        real = ib.broker.notify_append

        def recording(tp: tuple[str, int]) -> None:
            woken.append(tp)
            real(tp)

        ib.broker.notify_append = recording  # type: ignore[method-assign]
        assert ib.produce(TOPIC, 0, batch(2, value=b"v")) == 0
        if flush_every_append:  # the append, then the fsync that made it readable
            assert woken == [(TOPIC, 0), (TOPIC, 0)] and plog.synced_end == 2
            return
        assert woken == [(TOPIC, 0)] and plog.synced_end == 0
        ib.loop.run_until_complete(ib.broker.durable(plog, plog.log_end_offset))  # a group-commit fsync
        assert plog.synced_end == 2
        assert woken == [(TOPIC, 0)], "an fsync woke the fetches although reads never wait for one"
    finally:
        ib.close()

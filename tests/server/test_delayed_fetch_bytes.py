"""A fetch waiting for ``min_bytes`` counts what it could return from positions in the log and
reads once, when that count reaches ``min_bytes`` or at the deadline (Kafka's DelayedFetch: bytes
from ``positionDiff``, no read until it completes). It re-read everything since its offset after
every append: one waiter with a large min_bytes made each append cost the broker more and more
(probe s37: ~400 us per append at first, 6 ms by 4,000 appends)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from oncelog.protocol.messages import build, decode_request, encode_request, request_type
from oncelog.server.handlers import fetch as fetch_handler
from oncelog.storage.log_segment import LogSegment
from oncelog.storage.producer_state import AppendOrigin
from tests.inproc import API_FETCH, InProcessBroker
from tests.storage.helpers import batch, marker

RECORD = batch(1, value=b"v" * 60)
SIZE = len(RECORD)  # bytes each one-record batch takes in the log


def _request(b: InProcessBroker, *, offset: int, min_bytes: int, read_committed: bool = False,
             max_wait_ms: int = 60_000) -> Any:
    fields = {
        "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": min_bytes, "max_bytes": 64 << 20,
        "isolation_level": 1 if read_committed else 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 64 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""}
    frame = encode_request(API_FETCH, 11, 1, build(request_type(API_FETCH, 11), fields), client_id="t")
    return decode_request(frame[4:], b.broker.supported_versions)


class _Counts:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads = 0
        self.preads = 0
        read_fetch, pread = fetch_handler.read_fetch, LogSegment.pread

        def counting_read(*args: Any, **kw: Any) -> Any:
            self.reads += 1
            return read_fetch(*args, **kw)

        def counting_pread(seg: LogSegment, *args: Any, **kw: Any) -> Any:
            self.preads += 1
            return pread(seg, *args, **kw)

        monkeypatch.setattr(fetch_handler, "read_fetch", counting_read)
        monkeypatch.setattr(LogSegment, "pread", counting_pread)


async def _turns(n: int = 3) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def _records(response: Any) -> bytes:
    return bytes(response["responses"][0]["partitions"][0]["records"])


@pytest.mark.parametrize("roll_first", [False, True])
def test_a_waiting_fetch_counts_appends_and_reads_once_at_min_bytes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, roll_first: bool) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        b.create_topic("t", 1)
        plog = b.broker.logs.get_partition("t", 0)
        assert plog is not None
        for _ in range(3):
            plog.append(RECORD)
        start = plog.log_end_offset
        appends = 300
        counts = _Counts(monkeypatch)

        async def scenario() -> tuple[Any, int, int]:
            result = fetch_handler.handle_fetch(b.broker, _request(b, offset=start, min_bytes=appends * SIZE))
            assert not isinstance(result, dict)
            task = asyncio.ensure_future(result)
            await _turns()
            if roll_first:  # the fetch offset's batch goes to a new segment
                plog.roll()
            preads_before = counts.preads
            for i in range(appends):
                assert not task.done(), i
                if i == appends - 1:  # what the appends before cost the waiting fetch
                    preads_waiting = counts.preads - preads_before
                plog.append(RECORD)
                b.broker.notify_append(("t", 0))
                await _turns()
                if i < appends - 1:
                    assert counts.reads == 1, (i, counts.reads)
            assert task.done()
            return task.result(), counts.reads, preads_waiting

        response, reads, preads = b.loop.run_until_complete(scenario())
        assert reads == 2  # the first read, then one when min_bytes is there
        # the fetch offset's position, found once (a few headers from an index entry), then nothing
        assert preads <= 5, preads
        assert len(_records(response)) == appends * SIZE
    finally:
        b.close()


def test_read_committed_counts_up_to_the_lso(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        b.create_topic("t", 1)
        plog = b.broker.logs.get_partition("t", 0)
        assert plog is not None
        counts = _Counts(monkeypatch)
        txn = [batch(1, pid=7, epoch=0, seq=i, txn=True, value=b"v" * 60) for i in range(10)]

        async def scenario() -> Any:
            result = fetch_handler.handle_fetch(b.broker, _request(b, offset=0, min_bytes=5 * SIZE,
                                                                   read_committed=True))
            assert not isinstance(result, dict)
            task = asyncio.ensure_future(result)
            await _turns()
            for i in range(10):  # an open transaction: nothing visible, however much of it
                plog.append(txn[i])
                b.broker.notify_append(("t", 0))
                await _turns()
                assert not task.done()
            plog.append(RECORD)  # plain records behind it: still below the LSO's
            b.broker.notify_append(("t", 0))
            await _turns()
            assert not task.done() and counts.reads == 1
            plog.append(marker(True, 7, 0), origin=AppendOrigin.COORDINATOR)  # the LSO jumps past it all
            b.broker.notify_append(("t", 0))
            await _turns()
            assert task.done()
            return task.result()

        response = b.loop.run_until_complete(scenario())
        assert counts.reads == 2
        assert len(_records(response)) == plog.size_in_bytes
    finally:
        b.close()


def test_too_little_is_read_once_at_the_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        b.create_topic("t", 1)
        plog = b.broker.logs.get_partition("t", 0)
        assert plog is not None
        counts = _Counts(monkeypatch)

        async def scenario() -> Any:
            result = fetch_handler.handle_fetch(b.broker, _request(b, offset=0, min_bytes=100 * SIZE,
                                                                   max_wait_ms=200))
            assert not isinstance(result, dict)
            task = asyncio.ensure_future(result)
            for _ in range(20):
                plog.append(RECORD)
                b.broker.notify_append(("t", 0))
                await _turns()
            return await asyncio.wait_for(task, 5)

        response = b.loop.run_until_complete(scenario())
        assert counts.reads == 2
        assert len(_records(response)) == 20 * SIZE
    finally:
        b.close()

"""A fetch of log pages that are not in memory does not wait for the disk on the event loop (issue
14): the read is tried with RWF_NOWAIT, the pages are read on the broker's read thread, and the
fetch starts its pass again. Checked with the page cache really emptied (fsync, then
POSIX_FADV_DONTNEED), with a file system that answers every nowait read EAGAIN, and with the
topic deleted while the read is off the loop."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.protocol import records as rb
from oncelog.storage import log_segment
from oncelog.storage.errors import ReadWouldBlock
from tests.inproc import InProcessBroker
from tests.server.test_delayed_fetch import fetch_request, fetched
from tests.storage.helpers import batch

pytestmark = pytest.mark.skipif(not log_segment.nowait_reads, reason="no preadv2/RWF_NOWAIT on this platform")


@pytest.fixture
def broker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[InProcessBroker]:
    monkeypatch.setattr(log_segment, "nowait_reads", True)
    b = InProcessBroker(tmp_path / "d")
    b.broker.logs.create_topic("t", 1, {"segment.bytes": str(64 << 10)})
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    for i in range(40):
        plog.append(batch(5, size=1000, value=b"v%d" % i))
    plog.flush()
    try:
        yield b
    finally:
        b.close()


def _evict(b: InProcessBroker) -> None:
    """Drop the partition's (clean, fsynced) pages from the page cache."""
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    for _attempt in range(50):  # a page under writeback or just read elsewhere may stay a moment
        for seg in plog.segments:
            os.fsync(seg.fd)
            os.posix_fadvise(seg.fd, 0, 0, os.POSIX_FADV_DONTNEED)
        try:
            log_segment.pread_nowait(plog.segments[0].fd, 4096, 0)
        except ReadWouldBlock:
            return
        time.sleep(0.02)
    pytest.skip("this file system keeps every page in memory (tmpfs?): nothing can be cold")


def _fetch(b: InProcessBroker) -> Any:
    response = b.loop.run_until_complete(fetched(b.broker, fetch_request(b, False, 0)))
    return response["responses"][0]["partitions"][0]


def _fetch_cold(b: InProcessBroker, monkeypatch: pytest.MonkeyPatch, meanwhile: Callable[[], Any]) -> Any:
    """Evict and fetch until a fetch finds the pages cold and sends the read to the read thread,
    with ``meanwhile()`` run as that read starts (a few tries: see the first test); its answer."""
    real = b.broker.read_into_cache
    ran: list[bool] = []

    async def hooked(fd: int, position: int, length: int) -> None:
        if not ran:
            ran.append(True)
            meanwhile()
        await real(fd, position, length)

    monkeypatch.setattr(b.broker, "read_into_cache", hooked)
    for _attempt in range(5):
        _evict(b)
        part = _fetch(b)
        if ran:
            return part
    pytest.fail("no fetch of the evicted pages went to the read thread")


def _blocking_reads_on(thread_name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Lengths of plain (waiting) ``os.pread`` calls made by ``thread_name``."""
    calls: list[int] = []
    real = os.pread

    def spy(fd: int, length: int, position: int) -> bytes:
        if threading.current_thread().name == thread_name:
            calls.append(length)
        return real(fd, length, position)

    monkeypatch.setattr(os, "pread", spy)
    return calls


def test_a_cold_fetch_reads_off_the_event_loop(broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    warm = _fetch(broker)
    assert warm["error_code"] == 0 and len(warm["records"]) > 0
    expected = bytes(warm["records"])
    cold_reads: list[tuple[int, int]] = []
    real = broker.broker.read_into_cache

    async def counting(fd: int, position: int, length: int) -> None:
        cold_reads.append((position, length))
        await real(fd, position, length)

    monkeypatch.setattr(broker.broker, "read_into_cache", counting)
    on_loop = _blocking_reads_on(threading.current_thread().name, monkeypatch)
    # Under load the kernel sometimes has the pages back before the fetch (readahead started by
    # the eviction's own probe): then the fetch is simply warm. Evict and fetch again, a few times;
    # whatever happens, the loop thread never waits on the disk.
    for _attempt in range(5):
        _evict(broker)
        cold = _fetch(broker)
        assert cold["error_code"] == 0 and bytes(cold["records"]) == expected
        assert on_loop == [], f"the event loop thread waited on the disk: {on_loop}"
        if cold_reads:
            break
    assert cold_reads, "no fetch of the evicted pages went to the read thread"
    assert [h.base_offset for _, h in rb.iter_headers(expected)][:2] == [0, 5]
    # warm again: no read leaves the loop
    cold_reads.clear()
    assert bytes(_fetch(broker)["records"]) == expected and cold_reads == []


def test_a_file_system_that_always_says_eagain_falls_back_to_blocking_reads(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = bytes(_fetch(broker)["records"])

    def always_eagain(fd: int, buffers: Any, position: int, flags: int = 0) -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "preadv", always_eagain)
    assert bytes(_fetch(broker)["records"]) == expected
    assert log_segment.nowait_reads is False  # stopped trying after pages just read were "not in memory"
    assert bytes(_fetch(broker)["records"]) == expected


def test_the_topic_deleted_while_its_pages_are_read_off_the_loop(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    part = _fetch_cold(broker, monkeypatch, lambda: broker.broker.logs.delete_topic("t"))  # closes the files
    assert part["error_code"] == 3 and not part["records"]  # UNKNOWN_TOPIC_OR_PARTITION, no stale bytes


def test_retention_moves_the_log_start_while_pages_are_read_off_the_loop(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    plog = broker.broker.logs.get_partition("t", 0)
    assert plog is not None and len(plog.segments) > 2
    part = _fetch_cold(broker, monkeypatch, lambda: plog.delete_records(plog.segments[2].base_offset))
    assert part["error_code"] == 1 and not part["records"]  # OFFSET_OUT_OF_RANGE: offset 0 is gone

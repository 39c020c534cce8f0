"""A fetch that waits for data (max_wait, min_bytes) is woken by appends to its partitions; it reads
again only when what it may return changed: the LSO under read_committed (an open transaction's
records do not move it), the high watermark otherwise, or the log start offset."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from oncelog.server.handlers import fetch as fetch_handler
from tests.inproc import API_FETCH, InProcessBroker
from tests.storage.helpers import batch


async def fetched(broker: Any, request: Any) -> Any:
    """``handle_fetch``'s answer: given at once, or awaited when the fetch had to wait or read cold pages."""
    result = fetch_handler.handle_fetch(broker, request)
    return result if isinstance(result, dict) else await result


def fetch_request(b: InProcessBroker, read_committed: bool, max_wait_ms: int) -> Any:
    from oncelog.protocol.messages import build, decode_request, encode_request, request_type

    fields = {
        "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 1 << 20,
        "isolation_level": 1 if read_committed else 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": ""}
    frame = encode_request(API_FETCH, 11, 1, build(request_type(API_FETCH, 11), fields), client_id="t")
    return decode_request(frame[4:], b.broker.supported_versions)


@pytest.mark.parametrize("read_committed", [True, False])
def test_open_transaction_appends_wake_but_do_not_reread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         read_committed: bool) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        b.broker.logs.create_topic("t", 1, {})
        plog = b.broker.logs.get_partition("t", 0)
        assert plog is not None
        reads: list[int] = []
        real = fetch_handler.read_fetch

        def counting(*args: Any, **kw: Any) -> Any:
            reads.append(1)
            return real(*args, **kw)

        monkeypatch.setattr(fetch_handler, "read_fetch", counting)
        # an open transaction: records that read_committed may not return yet
        plog.append(batch(2, pid=7, epoch=0, seq=0, txn=True))

        async def scenario() -> Any:
            task = asyncio.ensure_future(fetched(b.broker, fetch_request(b, read_committed, 2000)))
            for i in range(5):  # more of the open transaction, each append notified
                await asyncio.sleep(0.02)
                if i == 0 and not read_committed:
                    break
                plog.append(batch(1, pid=7, epoch=0, seq=2 + i, txn=True))
                b.broker.notify_append(("t", 0))
            await asyncio.sleep(0.02)
            return await asyncio.wait_for(task, 5)

        started = b.loop.time()
        response = b.loop.run_until_complete(scenario())
        elapsed = b.loop.time() - started
        records = response["responses"][0]["partitions"][0]["records"]
        if read_committed:
            # nothing visible: five wake-ups, no re-read, answered empty at max_wait
            assert len(reads) == 2 and elapsed >= 1.9 and not records
        else:
            # read_uncommitted sees the open transaction at once
            assert len(reads) == 1 and records
    finally:
        b.close()


def test_a_waiting_fetch_cancelled_as_an_append_arrives_stays_cancelled(tmp_path: Path) -> None:
    """A connection's task cancelled (the client gone, the broker stopping) in the same turn of the
    loop as an append woke its fetch: Python 3.11's ``asyncio.wait_for`` returned instead of
    raising, so the fetch went on and read; at a broker's stop that read closed segments (EBADF,
    an internal error in the log, caught by test_inline_handling under CI load)."""
    b = InProcessBroker(tmp_path / "d")
    try:
        b.create_topic("t", 1)

        async def main() -> None:
            task = asyncio.ensure_future(b.broker.wait_for_append([("t", 0)], 10))
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            b.broker.notify_append(("t", 0))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        b.loop.run_until_complete(main())
        assert not b.broker._waiters  # nothing left behind
    finally:
        b.close()

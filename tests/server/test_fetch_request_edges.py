"""Fetch and ListOffsets requests at the edges of what Kafka allows, in process: a response limit of
0 (KIP-74 still returns the first batch), an incremental fetch of a session this broker never
opened (KIP-227: FETCH_SESSION_ID_NOT_FOUND, not a full fetch that ignores its forgotten topics),
and a ListOffsets that names a partition twice (INVALID_REQUEST for each copy). Each case was
answered otherwise before an adversarial probe compared them with Kafka."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.inproc import API_FETCH, API_LIST_OFFSETS, InProcessBroker
from tests.storage.helpers import batch


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic("t", 2)
    for p in (0, 1):
        for i in range(3):
            assert broker.produce("t", p, batch(2, value=b"p%d-%d" % (p, i))) == 0
    yield broker
    broker.close()


def _fetch(b: InProcessBroker, *, max_bytes: int, session_id: int = 0, session_epoch: int = -1,
           partition_max_bytes: int = 1 << 20, forgotten: list[Any] | None = None) -> Any:
    return b.call(API_FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": session_id, "session_epoch": session_epoch,
        "topics": [{"topic": "t", "partitions": [
            {"partition": p, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": partition_max_bytes} for p in (0, 1)]}],
        "forgotten_topics_data": forgotten or [], "rack_id": ""})


def _batches(part: Any) -> int:
    from oncelog.protocol import records as rb

    return len(list(rb.iter_headers(bytes(part.records or b""))))


@pytest.mark.parametrize("max_bytes, partition_max_bytes", [(0, 1 << 20), (1, 1 << 20), (0, 0)])
def test_a_response_limit_below_one_batch_still_returns_the_first_batch(
        b: InProcessBroker, max_bytes: int, partition_max_bytes: int) -> None:
    """KIP-74 (Fetch v3+): the first batch of the first partition with data is returned whole
    whatever the limits, so that a consumer always progresses; the rest waits for the next fetch.
    With max_bytes 0 no partition was read at all: a Java consumer with fetch.max.bytes=0 (which it
    accepts) never progressed."""
    r = _fetch(b, max_bytes=max_bytes, partition_max_bytes=partition_max_bytes)
    assert r.error_code == ErrorCode.none
    parts = r.responses[0].partitions
    assert [p.error_code for p in parts] == [ErrorCode.none, ErrorCode.none]
    assert [_batches(p) for p in parts] == [1, 0]


@pytest.mark.parametrize("session_id, session_epoch", [(12345, 3), (0, 5), (7, 1)])
def test_an_incremental_fetch_of_an_unknown_session_is_refused(
        b: InProcessBroker, session_id: int, session_epoch: int) -> None:
    r = _fetch(b, max_bytes=1 << 20, session_id=session_id, session_epoch=session_epoch,
               forgotten=[{"topic": "t", "partitions": [1]}])
    assert (r.error_code, r.session_id, list(r.responses)) == (ErrorCode.fetch_session_id_not_found, 0, [])


@pytest.mark.parametrize("session_id, session_epoch", [(0, -1), (0, 0), (12345, -1), (12345, 0)])
def test_full_fetches_are_answered_sessionless(b: InProcessBroker, session_id: int, session_epoch: int) -> None:
    """Epoch 0 asks for a new session and -1 closes one: both are full fetches. The broker opens no
    session (session id 0 in every answer), which the protocol allows."""
    r = _fetch(b, max_bytes=1 << 20, session_id=session_id, session_epoch=session_epoch)
    assert (r.error_code, r.session_id) == (ErrorCode.none, 0)
    assert [_batches(p) for p in r.responses[0].partitions] == [3, 3]


def test_list_offsets_answers_invalid_request_for_a_partition_named_twice(b: InProcessBroker) -> None:
    def part(p: int, ts: int) -> dict[str, Any]:
        return {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}

    r = b.call(API_LIST_OFFSETS, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "t", "partitions": [part(0, -1), part(1, -1)]}, {"name": "t", "partitions": [part(0, -2)]}]})
    got = [(t.name, p.partition_index, p.error_code, p.offset) for t in r.topics for p in t.partitions]
    assert got == [("t", 0, ErrorCode.invalid_request, -1), ("t", 1, ErrorCode.none, 6),
                   ("t", 0, ErrorCode.invalid_request, -1)]

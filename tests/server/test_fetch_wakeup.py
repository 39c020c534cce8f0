"""A Fetch whose first read (inline, in ``data_received``) finds too little and a Produce to its
partition arriving in the same turn of the loop, before the task that waits has started: the
append must answer the fetch at once. The task took its snapshot of what the fetch may return
when it started, after the append, and so waited for the next append or max_wait (6 of 10 runs
of probe s37's socket repro). Kafka's tryCompleteElseWatch checks again once it watches."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import pytest

from oncelog.protocol.messages import build, decode_response, encode_request, request_type
from oncelog.server.connection import KafkaConnection
from tests.inproc import InProcessBroker
from tests.server.fake_transport import FakeTransport
from tests.storage.helpers import batch

MAX_WAIT_MS = 3000


def _frame(api_key: int, version: int, corr: int, fields: dict[str, object]) -> bytes:
    return encode_request(api_key, version, corr, build(request_type(api_key, version), fields))


def _fetch(offset: int, read_committed: bool) -> bytes:
    return _frame(1, 12, 1, {
        "replica_id": -1, "max_wait": MAX_WAIT_MS, "min_bytes": 1, "max_bytes": 1 << 20,
        "isolation_level": 1 if read_committed else 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": offset,
                                                   "last_fetched_epoch": -1, "log_start_offset": -1,
                                                   "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": []})


def _produce(value: bytes) -> bytes:
    return _frame(0, 9, 1, {"transactional_id": None, "acks": 1, "timeout": 30000, "topic_data": [
        {"name": "t", "partition_data": [{"index": 0, "records": batch(1, value=value)}]}]})


@pytest.mark.parametrize("read_committed", [False, True])
def test_an_append_in_the_same_turn_as_a_waiting_fetch_answers_it(tmp_path: Path, read_committed: bool) -> None:
    ib = InProcessBroker(tmp_path / "d")
    try:
        ib.create_topic("t", 1)
        ib.produce("t", 0, batch(1, value=b"before"), acks=1)

        async def scenario() -> tuple[list[bytes], float]:
            loop = asyncio.get_running_loop()
            consumer, producer = KafkaConnection(ib.broker), KafkaConnection(ib.broker)
            fetched, produced = FakeTransport(), FakeTransport()
            consumer.connection_made(fetched)  # type: ignore[arg-type]
            producer.connection_made(produced)  # type: ignore[arg-type]
            started = loop.time()
            consumer.data_received(_fetch(1, read_committed))  # at the log end: waits, handed to a task
            assert not fetched.written and consumer.task is not None
            producer.data_received(_produce(b"after"))  # appended before that task has run
            assert produced.written
            while not fetched.written and loop.time() - started < 1.0:
                await asyncio.sleep(0.005)
            elapsed = loop.time() - started
            consumer.connection_lost(None)
            producer.connection_lost(None)
            await asyncio.sleep(0)
            return fetched.written, elapsed

        written, elapsed = ib.loop.run_until_complete(scenario())
        assert written, f"the fetch was not answered within {elapsed:.2f} s (max_wait {MAX_WAIT_MS} ms)"
        frame = b"".join(written)
        (size,) = struct.unpack(">i", frame[:4])
        response = decode_response(1, 12, frame[4:4 + size])[1]
        part = response.responses[0].partitions[0]
        assert part.error_code == 0 and b"after" in bytes(part.records)
    finally:
        ib.close()

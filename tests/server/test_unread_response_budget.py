"""Clients that never read their responses hold memory of the broker's: each connection stops being
served once its send buffer passes ``socket_send_buffer_high_bytes``, but the response that got it
there (a Fetch of up to ``fetch_max_bytes``) stays in memory. Forty such consumers held 1.9 GiB
(probe s37's mem_fetch.py). ``queued_max_response_bytes`` bounds them together: what connections past
their mark hold shrinks every Fetch's ``max_bytes`` (the first batch still goes whole, KIP-74)."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from oncelog.protocol.messages import build, decode_response, encode_request, request_type
from oncelog.server.connection import KafkaConnection
from tests.inproc import InProcessBroker
from tests.server.fake_transport import FakeTransport
from tests.storage.helpers import batch

VALUE = b"v" * 50_000
BATCHES = 20


class HeldTransport(FakeTransport):
    """A transport whose client reads nothing: it reports what it was given as still buffered."""

    def get_write_buffer_size(self) -> int:
        return sum(len(w) for w in self.written)


def _fetch(max_bytes: int) -> bytes:
    fields = {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                   "last_fetched_epoch": -1, "log_start_offset": -1,
                                                   "partition_max_bytes": max_bytes}]}],
        "forgotten_topics_data": []}
    return encode_request(1, 12, 1, build(request_type(1, 12), fields))


def _records_bytes(written: list[bytes]) -> int:
    frame = b"".join(written)
    (size,) = struct.unpack(">i", frame[:4])
    part = decode_response(1, 12, frame[4:4 + size])[1].responses[0].partitions[0]
    assert part.error_code == 0
    return len(bytes(part.records))


def test_consumers_that_do_not_read_shrink_every_fetch_to_the_room_left(tmp_path: Path) -> None:
    ib = InProcessBroker(tmp_path / "d", queued_max_response_bytes=400_000, socket_send_buffer_high_bytes=100_000)
    try:
        ib.create_topic("t", 1)
        for _ in range(BATCHES):
            ib.produce("t", 0, batch(1, value=VALUE), acks=1)

        def fetch(conn: KafkaConnection, transport: FakeTransport) -> int:
            transport.written.clear()
            conn.data_received(_fetch(10 << 20))
            return _records_bytes(transport.written)

        async def scenario() -> None:
            stalled = [KafkaConnection(ib.broker) for _ in range(3)]
            held = [HeldTransport() for _ in stalled]
            for conn, tr in zip(stalled, held, strict=True):
                conn.connection_made(tr)  # type: ignore[arg-type]
            reader, rt = KafkaConnection(ib.broker), FakeTransport()
            reader.connection_made(rt)  # type: ignore[arg-type]
            whole = fetch(reader, rt)
            assert whole > BATCHES * len(VALUE)  # nobody holds anything: the whole log
            # The first stalled consumer's fetch takes the log (about 1 MB), and its transport says
            # so: the connection pauses writing, as asyncio does past the high mark.
            conn0 = stalled[0]
            conn0.data_received(_fetch(10 << 20))
            conn0.pause_writing()
            assert ib.broker.response_room() == 0
            # The others get one batch each (KIP-74: the first batch whole), not the log again.
            for conn, tr in zip(stalled[1:], held[1:], strict=True):
                conn.data_received(_fetch(10 << 20))
                conn.pause_writing()
                assert len(b"".join(tr.written)) < 2 * len(VALUE)
            assert fetch(reader, rt) < 2 * len(VALUE)
            # Clients that read again (or go) give the room back.
            for conn, tr in zip(stalled, held, strict=True):
                tr.written.clear()
                conn.resume_writing()
            stalled[0].connection_lost(None)
            assert not ib.broker.unread_writers
            assert fetch(reader, rt) == whole
            for conn in [*stalled[1:], reader]:
                conn.connection_lost(None)
            await asyncio.sleep(0)

        ib.loop.run_until_complete(scenario())
    finally:
        ib.close()

"""What a misbehaving client can send: the broker answers with an error or closes that connection,
and keeps serving everybody else."""

from __future__ import annotations

import socket
import struct

import pytest
from confluent_kafka import Producer
from kio.schema.api_versions.v0.request import ApiVersionsRequest as ApiVersionsV0
from kio.schema.metadata.v12.request import MetadataRequest

from oncelog.protocol.messages import decode_response, encode_request
from oncelog.testing.broker_process import BrokerProcess, oncelog_broker


def _connect(b: BrokerProcess) -> socket.socket:
    s = socket.create_connection((b.host, b.port), timeout=5)
    return s


def _recv_frame(s: socket.socket) -> bytes:
    size = struct.unpack(">i", _recv_exact(s, 4))[0]
    return _recv_exact(s, size)


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


def _closed(s: socket.socket) -> bool:
    try:
        return s.recv(1) == b""
    except (ConnectionResetError, TimeoutError):
        return True


def _still_serves(b: BrokerProcess) -> None:
    p = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": False})
    errors: list[object] = []
    p.produce("alive", b"x", on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(15) == 0 and errors == [None]


def test_oversized_frame_closes_the_connection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    b = oncelog_broker(tmp_path / "d", "--auto-create-topics", "--socket-request-max-bytes", "1048576").start()
    try:
        s = _connect(b)
        s.sendall(struct.pack(">i", 1048577) + b"\0" * 64)
        assert _closed(s)
        _still_serves(b)
    finally:
        b.kill()


@pytest.mark.parametrize("payload", [
    struct.pack(">i", -1),
    struct.pack(">i", 6) + b"\x00\x03\x00",  # shorter than a request header
    struct.pack(">i", 14) + struct.pack(">hhi", 3, 12, 1) + b"\xff\xff\xff\xff\xff\xff",  # garbage body
    struct.pack(">i", 10) + struct.pack(">hhi", 999, 0, 1) + b"\0\0",  # unknown api key
    struct.pack(">i", 10) + struct.pack(">hhi", 0, 99, 1) + b"\0\0",  # Produce v99
], ids=["negative-size", "short-header", "garbage-body", "unknown-key", "unsupported-version"])
def test_malformed_requests_close_only_their_connection(broker: BrokerProcess, payload: bytes) -> None:
    bystander = _connect(broker)
    s = _connect(broker)
    s.sendall(payload)
    assert _closed(s)
    # the other connection still gets answers
    bystander.sendall(encode_request(3, 12, 5, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                               include_topic_authorized_operations=False)))
    corr, body = decode_response(3, 12, _recv_frame(bystander))
    assert corr == 5 and body.brokers[0].port == broker.port
    _still_serves(broker)


def test_api_versions_at_an_unknown_version_gets_error_35_in_a_v0_body(broker: BrokerProcess) -> None:
    s = _connect(broker)
    frame = bytearray(encode_request(18, 0, 42, ApiVersionsV0()))
    struct.pack_into(">h", frame, 6, 99)  # claim ApiVersions v99
    s.sendall(bytes(frame))
    corr, body = decode_response(18, 0, _recv_frame(s))
    assert corr == 42 and body.error_code == 35
    keys = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert keys[18] == (0, 3) and keys[0][0] == 3
    # the connection stays usable: a proper v0 request now works
    s.sendall(encode_request(18, 0, 43, ApiVersionsV0()))
    corr, body = decode_response(18, 0, _recv_frame(s))
    assert corr == 43 and body.error_code == 0


def test_answers_to_pipelined_requests_arrive_in_order_before_a_bad_frame_closes(broker: BrokerProcess) -> None:
    """Responses of requests that arrived together are written together (one writev per pass over
    the queue): those before a malformed frame must still go out, in order, before the close."""
    s = _connect(broker)
    good = [encode_request(18, 0, 100 + i, ApiVersionsV0()) for i in range(3)]
    good.append(encode_request(3, 12, 103, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                           include_topic_authorized_operations=False)))
    garbage = struct.pack(">i", 14) + struct.pack(">hhi", 3, 12, 104) + b"\xff\xff\xff\xff\xff\xff"
    s.sendall(b"".join(good) + garbage)
    for i in range(3):
        corr, body = decode_response(18, 0, _recv_frame(s))
        assert corr == 100 + i and body.error_code == 0
    corr, body = decode_response(3, 12, _recv_frame(s))
    assert corr == 103 and body.brokers[0].port == broker.port
    assert _closed(s)

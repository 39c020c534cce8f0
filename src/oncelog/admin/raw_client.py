"""A minimal blocking Kafka protocol client for the admin APIs librdkafka's AdminClient lacks
(KIP-664: DescribeProducers, DescribeTransactions, ListTransactions, WriteTxnMarkers).

It negotiates versions with ApiVersions and uses kio's generated messages, so it speaks to any
broker that implements these APIs, Apache Kafka included.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

from kio.schema.api_versions.v0.request import ApiVersionsRequest

from oncelog.protocol.messages import decode_response, encode_request, request_type


class KafkaProtocolError(Exception):
    pass


class RawClient:
    def __init__(self, bootstrap: str, timeout_s: float = 15.0) -> None:
        host, _, port = bootstrap.rpartition(":")
        if not host or not port.isdigit():
            raise KafkaProtocolError(f"cannot reach a broker at {bootstrap}: expected HOST:PORT")
        try:
            self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
        except (OSError, ValueError) as exc:
            raise KafkaProtocolError(f"cannot reach a broker at {bootstrap}: {exc}") from exc
        self._corr = 0
        self.versions: dict[int, tuple[int, int]] = {}
        resp = self._call(18, 0, ApiVersionsRequest())
        self.versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def version_for(self, api_key: int, ours: tuple[int, int]) -> int:
        theirs = self.versions.get(api_key)
        if theirs is None or theirs[1] < ours[0] or theirs[0] > ours[1]:
            raise KafkaProtocolError(f"the broker does not support API key {api_key} in versions {ours}")
        return min(theirs[1], ours[1])

    def request(self, api_key: int, ours: tuple[int, int], fields: dict[str, Any]) -> Any:
        from oncelog.protocol.messages import build

        version = self.version_for(api_key, ours)
        return self._call(api_key, version, build(request_type(api_key, version), fields))

    def _call(self, api_key: int, version: int, body: Any) -> Any:
        self._corr += 1
        self.sock.sendall(encode_request(api_key, version, self._corr, body, client_id="oncelog-admin"))
        size = struct.unpack(">i", self._recv(4))[0]
        try:
            corr, resp = decode_response(api_key, version, self._recv(size))
        except (ValueError, TypeError, ArithmeticError) as exc:
            raise KafkaProtocolError(f"cannot parse the broker's response to API key {api_key}: {exc}") from exc
        if corr != self._corr:
            raise KafkaProtocolError(f"correlation id mismatch: {corr} != {self._corr}")
        return resp

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise KafkaProtocolError("connection closed by the broker")
            buf += chunk
        return bytes(buf)

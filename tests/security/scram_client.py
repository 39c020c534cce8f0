"""An RFC 5802 SCRAM client written for the tests from the RFC alone (it shares no code with
oncelog.security, so a mistake there cannot hide in both), plus a raw-socket Kafka client that
speaks SaslHandshake/SaslAuthenticate by hand for the adversarial tests."""

from __future__ import annotations

import base64
import hashlib
import hmac
import socket
import ssl
import struct
from typing import Any

from kio.schema.api_versions.v0.request import ApiVersionsRequest

from oncelog.protocol.messages import build, decode_response, encode_request, request_type

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


class ScramClient:
    def __init__(self, mechanism: str, username: str, password: str, nonce: str = "fyko+d2lbbFgONRv9qkxdawL",
                 authzid: str = "") -> None:
        self.hash = HASHES[mechanism]
        self.username = username
        self.password = password
        self.nonce = nonce
        self.gs2 = "n," + (f"a={self._escape(authzid)}" if authzid else "") + ","
        self.first_bare = f"n={self._escape(username)},r={nonce}"
        self.server_first = ""
        self.auth_message = b""
        self.salted = b""

    @staticmethod
    def _escape(name: str) -> str:
        return name.replace("=", "=3D").replace(",", "=2C")

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self.hash).digest()

    def client_first(self) -> bytes:
        return (self.gs2 + self.first_bare).encode()

    def client_final(self, server_first: bytes, *, nonce: str | None = None, binding: str | None = None) -> bytes:
        self.server_first = server_first.decode()
        attrs = dict(kv.split("=", 1) for kv in self.server_first.split(","))
        full_nonce = attrs["r"]
        assert full_nonce.startswith(self.nonce), "the server must extend the client nonce"
        salt = base64.b64decode(attrs["s"])
        iterations = int(attrs["i"])
        # Hi() as RFC 5802 section 2.2 defines it, iterated by hand (not PBKDF2 from a library).
        u = self._hmac(self.password.encode(), salt + b"\0\0\0\1")
        result = bytearray(u)
        for _ in range(iterations - 1):
            u = self._hmac(self.password.encode(), u)
            result = bytearray(a ^ b for a, b in zip(result, u, strict=True))
        self.salted = bytes(result)
        client_key = self._hmac(self.salted, b"Client Key")
        stored_key = hashlib.new(self.hash, client_key).digest()
        cbind = binding if binding is not None else base64.b64encode(self.gs2.encode()).decode()
        without_proof = f"c={cbind},r={nonce if nonce is not None else full_nonce}"
        self.auth_message = f"{self.first_bare},{self.server_first},{without_proof}".encode()
        signature = self._hmac(stored_key, self.auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def verify_server_final(self, server_final: bytes) -> bool:
        expected = self._hmac(self._hmac(self.salted, b"Server Key"), self.auth_message)
        return server_final == b"v=" + base64.b64encode(expected)


class RawKafka:
    """A blocking connection sending kio requests one at a time."""

    def __init__(self, host: str, port: int, tls: ssl.SSLContext | None = None) -> None:
        sock = socket.create_connection((host, port), timeout=10)
        self.sock = tls.wrap_socket(sock, server_hostname=host) if tls is not None else sock
        self.corr = 0

    def send(self, api_key: int, version: int, fields: dict[str, Any]) -> int:
        self.corr += 1
        self.sock.sendall(encode_request(api_key, version, self.corr, build(request_type(api_key, version), fields)))
        return self.corr

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, api_key: int, version: int) -> Any:
        size = struct.unpack(">i", self._exact(4))[0]
        corr, body = decode_response(api_key, version, self._exact(size))
        assert corr == self.corr
        return body

    def call(self, api_key: int, version: int, fields: dict[str, Any]) -> Any:
        self.send(api_key, version, fields)
        return self.recv(api_key, version)

    def api_versions(self) -> Any:
        self.corr += 1
        self.sock.sendall(encode_request(18, 0, self.corr, ApiVersionsRequest()))
        return self.recv(18, 0)

    def handshake(self, mechanism: str) -> Any:
        return self.call(17, 1, {"mechanism": mechanism})

    def authenticate(self, token: bytes, version: int = 2) -> Any:
        return self.call(36, version, {"auth_bytes": token})

    def closed(self) -> bool:
        """True once the broker closed the connection (EOF or reset) with nothing more to read."""
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, ssl.SSLError):
            return True

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()

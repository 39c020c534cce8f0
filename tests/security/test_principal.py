"""The connection's principal, in process: what the authorizer will read as ``req.session.principal``."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

from oncelog.protocol.messages import build, decode_response, encode_request, request_type
from oncelog.security.credentials import CredentialStore
from oncelog.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramCredential
from oncelog.server.broker import Broker
from oncelog.server.config import BrokerConfig


async def _call(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, api_key: int, version: int,
                fields: dict[str, object], corr: int) -> object:
    writer.write(encode_request(api_key, version, corr, build(request_type(api_key, version), fields)))
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return decode_response(api_key, version, await reader.readexactly(size))[1]


def test_principal_is_anonymous_until_authenticated_then_the_user(tmp_path: Path) -> None:
    CredentialStore(tmp_path).alter(upsertions=[
        ("alice", SCRAM_SHA_256, ScramCredential.from_password(SCRAM_SHA_256, "pw", 4096)),
        ("bob", SCRAM_SHA_512, ScramCredential.from_password(SCRAM_SHA_512, "pw2", 4096))])

    async def main() -> list[str]:
        broker = Broker(BrokerConfig(data_dir=tmp_path, listen_port=0, sasl_enabled=True))
        await broker.start()
        seen = []
        try:
            for user, password in (("alice", "pw"), ("bob", "pw2")):
                reader, writer = await asyncio.open_connection("127.0.0.1", broker.bound_port)
                await _call(reader, writer, 17, 1, {"mechanism": "PLAIN"}, 1)
                (conn,) = [c for c in broker.connections if c.principal == "User:ANONYMOUS"]
                seen.append(conn.principal)
                r = await _call(reader, writer, 36, 2, {"auth_bytes": f"\0{user}\0{password}".encode()}, 2)
                assert r.error_code == 0  # type: ignore[attr-defined]
                seen.append(conn.principal)
        finally:
            await broker.stop()
        return seen

    assert asyncio.run(main()) == ["User:ANONYMOUS", "User:alice", "User:ANONYMOUS", "User:bob"]

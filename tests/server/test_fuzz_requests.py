"""Random bodies for every advertised API and version, from a raw socket: the broker may close the
connection or answer, but it keeps serving (seeded, bounded)."""

from __future__ import annotations

import random
import socket
import struct

from confluent_kafka import Producer

from oncelog.protocol.versions import SUPPORTED_VERSIONS
from oncelog.testing.broker_process import BrokerProcess


def test_random_request_bodies_never_kill_the_broker(broker: BrokerProcess) -> None:
    rng = random.Random(1234)
    sent = 0
    for api_key, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()):
        for version in range(lo, hi + 1):
            for _ in range(3):
                body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
                header = struct.pack(">hhih", api_key, version, sent, 4) + b"fuzz"
                if rng.random() < 0.5:
                    header += b"\x00"  # an empty tagged-field section, as flexible headers have
                frame = header + body
                with socket.create_connection((broker.host, broker.port), timeout=5) as s:
                    s.sendall(struct.pack(">i", len(frame)) + frame)
                    s.settimeout(0.5)
                    try:
                        s.recv(65536)
                    except (TimeoutError, ConnectionResetError):
                        pass
                sent += 1
    assert sent > 200
    p = Producer({"bootstrap.servers": broker.bootstrap})
    p.produce("after-fuzz", b"still alive")
    assert p.flush(15) == 0

"""Limits a slow or hostile client meets: a client that never reads its responses costs a bounded
amount of broker memory, a flood of connections is refused past max.connections while a connected
client keeps working, idle connections are closed, a fetch response is capped by fetch.max.bytes,
and byte-rate quotas answer with a throttle time and mute the connection."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path

from confluent_kafka import Producer
from kio.schema.fetch.v11.request import FetchRequest

from oncelog.admin.raw_client import RawClient
from oncelog.protocol.messages import build, encode_request
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker


def _broker(tmp_path: Path, config: str) -> BrokerProcess:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(config)
    return oncelog_broker(tmp_path / "d", "--auto-create-topics", "--config", str(cfg),
                          log_path=tmp_path / "broker.log").start()


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fetch_frame(corr: int, topic: str, max_bytes: int) -> bytes:
    body = build(FetchRequest, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                                    "last_fetched_epoch": -1, "log_start_offset": -1,
                                                    "partition_max_bytes": max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    return encode_request(1, 11, corr, body, client_id="never-reads")


def _fill(bootstrap: str, topic: str, n: int, size: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, b"%06d" % i + b"x" * (size - 6))
    assert p.flush(30) == 0


def test_a_client_that_never_reads_its_responses_costs_bounded_memory(tmp_path: Path) -> None:
    """200,000 pipelined fetches of 512 KiB each (100 GiB of responses) from a client that never reads:
    the broker stops handling that connection's requests once ~1 MiB waits unsent, stops reading
    it, and its memory stays within a bound while another client produces normally."""
    b = _broker(tmp_path, "socket_send_buffer_high_bytes = 1048576\n")
    try:
        create_topic(b.bootstrap, "big")
        _fill(b.bootstrap, "big", 512, 1024)
        assert b.proc is not None
        base = _rss_kib(b.proc.pid)
        s = socket.create_connection((b.host, b.port))
        s.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 20
        one = bytearray(_fetch_frame(0, "big", 512 * 1024))
        frames = []
        for i in range(200_000):
            struct.pack_into(">i", one, 8, i)  # the correlation id
            frames.append(bytes(one))
        pending = b"".join(frames)
        view = memoryview(pending)
        while view and time.monotonic() < deadline:
            try:
                n = s.send(view[: 1 << 16])
            except BlockingIOError:
                time.sleep(0.05)  # the broker stopped reading us: good
                if time.monotonic() > deadline - 15:
                    break
                continue
            view = view[n:]
            sent += n
        time.sleep(2)
        grown_mib = (_rss_kib(b.proc.pid) - base) / 1024
        # A well-behaved client is unaffected meanwhile.
        p = Producer({"bootstrap.servers": b.bootstrap})
        errors: list[object] = []
        for _ in range(100):
            p.produce("ok", b"v", on_delivery=lambda err, msg: errors.append(err))
        assert p.flush(20) == 0 and errors == [None] * 100
        assert sent < len(pending), "the broker kept reading a client that never reads"
        # bound: send buffer high mark + one response + queued requests + interpreter noise
        print(f"broker RSS grew {grown_mib:.1f} MiB; {sent} of {len(pending)} request bytes accepted")
        assert grown_mib < 64, f"broker grew {grown_mib:.0f} MiB for a client that never reads"
        s.close()
    finally:
        b.kill()


def test_connections_past_max_connections_are_refused_while_a_connected_client_works(tmp_path: Path) -> None:
    b = _broker(tmp_path, "max_connections = 12\n")
    try:
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce("flood", b"first")
        assert p.flush(15) == 0
        flood = [socket.create_connection((b.host, b.port)) for _ in range(60)]
        time.sleep(1)
        refused = 0
        for s in flood:
            s.settimeout(0.5)
            try:
                if s.recv(1) == b"":
                    refused += 1
            except (TimeoutError, ConnectionResetError):
                pass
        assert refused >= 48, f"only {refused} of 60 flood connections were refused"
        delivered: list[object] = []
        for i in range(50):
            p.produce("flood", b"%d" % i, on_delivery=lambda err, msg: delivered.append(err))
        assert p.flush(15) == 0 and delivered == [None] * 50
        for s in flood:
            s.close()
        assert "max.connections (12) reached" in (tmp_path / "broker.log").read_text()
    finally:
        b.kill()


def test_idle_connections_are_closed(tmp_path: Path) -> None:
    b = _broker(tmp_path, "connections_max_idle_ms = 400\n")
    try:
        s = socket.create_connection((b.host, b.port))
        s.settimeout(5)
        assert s.recv(1) == b""  # closed by the broker, not by a timeout here
    finally:
        b.kill()


def test_fetch_max_bytes_caps_a_response(tmp_path: Path) -> None:
    b = _broker(tmp_path, "fetch_max_bytes = 65536\n")
    try:
        create_topic(b.bootstrap, "capped")
        _fill(b.bootstrap, "capped", 200, 2048)
        with socket.create_connection((b.host, b.port)) as s:
            s.sendall(_fetch_frame(1, "capped", 50 * 1024 * 1024))
            size = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))[0]
        # 64 KiB, plus at most one batch that straddles the limit (linger-batched: < 1 MiB)
        assert 1024 < size < 65536 + 1024 * 1024
    finally:
        b.kill()


def test_produce_quota_answers_with_a_throttle_time(tmp_path: Path) -> None:
    b = _broker(tmp_path, "quota_producer_default = 102400\n")
    try:
        create_topic(b.bootstrap, "q")
        from tests.storage.helpers import batch

        with RawClient(b.bootstrap) as client:
            throttles = []
            start = time.monotonic()
            for i in range(4):
                records = batch(1, value=b"%d" % i, size=200_000)
                r = client.request(0, (3, 9), {"acks": -1, "timeout": 10_000, "topic_data": [
                    {"name": "q", "partition_data": [{"index": 0, "records": records}]}]})
                assert r.responses[0].partition_responses[0].error_code == 0
                throttles.append(int(r.throttle_time.total_seconds() * 1000))
            elapsed = time.monotonic() - start
        assert all(t > 0 for t in throttles), throttles  # 200 KB requests against 100 KB/s
        # the connection was muted for the throttle times: the client's rate stays near the quota
        assert 800_000 / elapsed < 3 * 102_400, (elapsed, throttles)
    finally:
        b.kill()

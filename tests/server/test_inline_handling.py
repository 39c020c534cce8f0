"""Requests handled inline in ``data_received`` and requests that wait (handed to a task) share one
queue per connection: answers keep request order whichever way each request goes, and a connection
that goes away while its handed-off request has not started leaves nothing unawaited behind."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from oncelog.protocol.messages import build, decode_response, encode_request, peek_header, request_type
from oncelog.server.answers import AnsweredWhenDurable
from oncelog.server.connection import KafkaConnection
from oncelog.server.handlers import produce as produce_handlers
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker
from tests.fsync_gate import FsyncGate
from tests.inproc import InProcessBroker
from tests.server.fake_transport import FakeTransport as _Transport
from tests.server.test_raw_socket import _recv_exact
from tests.storage.helpers import batch

TOPIC = "inline"


def _frame(api_key: int, version: int, corr: int, fields: dict[str, object]) -> bytes:
    return encode_request(api_key, version, corr, build(request_type(api_key, version), fields))


def _api_versions(corr: int) -> bytes:
    return _frame(18, 3, corr, {"client_software_name": "t", "client_software_version": "1"})


def _produce(corr: int, acks: int = -1) -> bytes:  # waits for its fsync under --flush-every-append
    return _frame(0, 9, corr, {"transactional_id": None, "acks": acks, "timeout": 30000, "topic_data": [
        {"name": TOPIC, "partition_data": [{"index": 0, "records": batch(2, value=b"r%d" % corr)}]}]})


def _fetch(corr: int, max_wait_ms: int) -> bytes:  # waits: min_bytes (1 MiB) is more than the topic holds
    return _frame(1, 11, corr, {
        "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1 << 20, "max_bytes": 1 << 20, "isolation_level": 1,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                     "fetch_offset": 0, "log_start_offset": -1,
                                                     "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": []})


def _metadata(corr: int) -> bytes:
    return _frame(3, 12, corr, {"topics": None, "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": False})


def _correlation_ids(s: socket.socket, n: int) -> list[int]:
    out = []
    for _ in range(n):
        size = struct.unpack(">i", _recv_exact(s, 4))[0]
        out.append(struct.unpack(">i", _recv_exact(s, size)[:4])[0])
    return out


def _started(tmp_path: Path) -> BrokerProcess:
    b = oncelog_broker(tmp_path / "data", "--flush-every-append", log_path=tmp_path / "broker.log").start()
    create_topic(b.bootstrap, TOPIC, 1)
    return b


def test_answers_keep_request_order_around_requests_that_wait(tmp_path: Path) -> None:
    with _started(tmp_path) as b:
        sequences = [
            [_api_versions(1), _produce(2), _api_versions(3), _metadata(4), _fetch(5, 50), _api_versions(6)],
            [_produce(11), _produce(12), _api_versions(13), _fetch(14, 0), _produce(15, acks=1), _metadata(16)],
            [_fetch(21, 100), _api_versions(22), _produce(23, acks=0), _api_versions(24)],
        ]
        unanswered = {23}  # acks=0: no answer at all
        for frames in sequences:
            s = socket.create_connection((b.host, b.port), timeout=10)
            try:
                s.sendall(b"".join(frames))
                answered = [c for c in (peek_header(f[4:])[2] for f in frames) if c not in unanswered]
                assert _correlation_ids(s, len(answered)) == answered
            finally:
                s.close()


def test_connections_gone_right_after_a_request_that_waits_leave_no_trace(tmp_path: Path) -> None:
    """Over sockets: each request that must wait (a Fetch, a produce waiting for its fsync) is sent
    with the end of the stream or a reset. The broker keeps serving and logs no error or unawaited
    coroutine. (The socket fuzz and the in-process test below reach the narrow race itself.)"""
    with _started(tmp_path) as b:
        for i in range(100):
            s = socket.create_connection((b.host, b.port), timeout=10)
            s.sendall(_fetch(i, 500) if i % 2 else _produce(i))
            if i % 4 < 2:
                s.shutdown(socket.SHUT_WR)
            else:  # a reset (SO_LINGER 0), not a FIN
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce(TOPIC, b"still-served")
        assert p.flush(15) == 0
        b.stop()
        log = (tmp_path / "broker.log").read_text()
        for bad in ("never awaited", "never retrieved", "Traceback", "internal error"):
            assert bad not in log, log[-3000:]


def _in_process_with_topic(tmp_path: Path, **config: object) -> InProcessBroker:
    """An in-process broker (no sockets: tests drive a KafkaConnection themselves) holding TOPIC."""
    ib = InProcessBroker(tmp_path / "d", **config)
    ib.call(19, 5, {"topics": [{"name": TOPIC, "num_partitions": 1, "replication_factor": 1,
                                "assignments": [], "configs": []}], "timeout_ms": 5000, "validate_only": False})
    return ib


class _SyncedWhenAnswered(_Transport):
    """Records, for each answer written, the partition's synced end at that moment."""

    def __init__(self, plog: Any) -> None:
        super().__init__()
        self.plog = plog
        self.synced: dict[int, int] = {}  # correlation id -> synced end when its answer went out

    def writelines(self, data: list[bytes]) -> None:
        super().writelines(data)
        for f in data:
            self.synced[struct.unpack(">i", bytes(f[4:8]))[0]] = self.plog.synced_end


def test_a_connection_lost_in_the_same_pass_as_its_request_closes_the_handed_off_work(tmp_path: Path) -> None:
    """Deterministic form of the race the socket fuzz found: the request arrives and the connection is
    lost before the event loop runs the task the request was handed to (here the rest of a Fetch
    that waits for more than the topic holds). The coroutine must be closed, not left to warn 'never awaited'."""
    ib = _in_process_with_topic(tmp_path)
    try:

        async def scenario() -> tuple[list[bytes], bool]:
            conn = KafkaConnection(ib.broker)
            transport = _Transport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            conn.data_received(_api_versions(1) + _fetch(2, 500))
            answered_inline = list(transport.written)
            conn.connection_lost(ConnectionResetError())
            for _ in range(3):
                await asyncio.sleep(0)
            return answered_inline, conn.task is not None and conn.task.cancelled()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            answered_inline, cancelled = ib.loop.run_until_complete(scenario())
            gc.collect()
        assert [struct.unpack(">i", f[4:8])[0] for f in answered_inline] == [1], "ApiVersions answered inline"
        assert cancelled
        assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
    finally:
        ib.close()


def test_pipelined_produces_that_wait_for_their_fsync_share_it_and_keep_their_order(tmp_path: Path) -> None:
    """A client that pipelines produce requests under --flush-every-append (librdkafka sends each
    record as its own request when linger.ms=0): the requests queued behind one that waits for its
    fsync are handled meanwhile, so one group-commit fsync covers them, and every answer still goes
    out in request order. Handled one at a time, each request paid an fsync of its own, and a client
    at 2,000 records/s waited a second and more for its acknowledgements."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    try:
        broker = ib.broker
        syncs = []
        real_synced = broker._synced

        def counted(plog: Any, *args: Any) -> None:
            syncs.append(plog)
            real_synced(plog, *args)

        broker._synced = counted  # type: ignore[method-assign,assignment]
        frames = [_produce(1), _produce(2), _api_versions(3), _produce(4), _metadata(5), _produce(6, acks=0),
                  _produce(7, acks=1)] + [_produce(c) for c in range(8, 30)] + [_api_versions(30)]
        expected = [c for c in range(1, 31) if c != 6]  # acks=0: no answer

        plog = broker.logs.partitions()[(TOPIC, 0)]
        transport = _SyncedWhenAnswered(plog)

        async def scenario() -> list[int]:
            conn = KafkaConnection(broker)
            conn.connection_made(transport)  # type: ignore[arg-type]
            conn.data_received(b"".join(frames))
            for _ in range(500):
                if len(transport.written) >= len(expected):
                    break
                await asyncio.sleep(0.01)
            return [struct.unpack(">i", f[4:8])[0] for f in transport.written]

        assert ib.loop.run_until_complete(scenario()) == expected
        assert len(syncs) <= 2, f"{len(syncs)} fsyncs for 27 produce requests"
        # No acknowledgement went out before the fsync of its records (2 records a produce, in order).
        produces = [c for c in range(1, 30) if c not in (3, 5)]
        for n, corr in enumerate(produces, 1):
            if corr != 6:
                assert transport.synced[corr] >= 2 * n, (corr, transport.synced[corr])
        assert plog.log_end_offset == 27 * 2 and plog.synced_end == plog.log_end_offset
    finally:
        ib.close()


def _lose_connections(ib: InProcessBroker, frames: Callable[[int], bytes], passes: tuple[int, ...]) -> None:
    """For each ``n`` of ``passes``: a connection receives ``frames(n)`` in one read and is lost ``n``
    passes of the event loop later. Fails if any coroutine was left 'never awaited'."""

    async def scenario(lose_after: int) -> None:
        conn = KafkaConnection(ib.broker)
        conn.connection_made(_Transport())  # type: ignore[arg-type]
        conn.data_received(frames(lose_after))
        for _ in range(lose_after):
            await asyncio.sleep(0)
        conn.connection_lost(ConnectionResetError())
        for _ in range(20):
            await asyncio.sleep(0.005)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for lose_after in passes:
            ib.loop.run_until_complete(scenario(lose_after))
        gc.collect()
    assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]


def test_a_connection_lost_while_pipelined_produces_wait_for_their_fsync_leaves_nothing_unawaited(
        tmp_path: Path) -> None:
    """The produces handled before the loss are appended (their records stay; the client gets no
    answer, as after any lost connection); the answers held behind the fsync are dropped without a
    coroutine left unawaited, whichever pass the connection is lost in."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    try:
        _lose_connections(ib, lambda _: b"".join(_produce(c) for c in range(1, 6)) + _api_versions(6),
                          (0, 1, 2, 3, 5))
        # Each run's first produce is handled in data_received; frames not yet handled when the
        # connection goes are dropped with it (as Kafka drops a closed connection's requests).
        plog = ib.broker.logs.partitions()[(TOPIC, 0)]
        assert 5 * 2 <= plog.log_end_offset < 5 * 5 * 2
    finally:
        ib.close()


def test_a_handler_failing_behind_produces_that_wait_for_their_fsync_leaves_nothing_unawaited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A handler bug on a request queued behind waiting produces closes the connection (only it); the
    produces' held answers are dropped with it, not left as coroutines nobody awaits."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    try:

        def broken(broker: object, request: object) -> object:
            raise RuntimeError("a handler bug")

        # The handler table is shared by every broker in the process: restored after the test.
        monkeypatch.setitem(ib.broker.handlers, 3, broken)  # Metadata
        made: list[AnsweredWhenDurable] = []

        class Recorded(AnsweredWhenDurable):
            __slots__ = ()

            def __init__(self, *args: Any) -> None:
                super().__init__(*args)
                made.append(self)

        monkeypatch.setattr(produce_handlers, "AnsweredWhenDurable", Recorded)

        async def scenario() -> _Transport:
            conn = KafkaConnection(ib.broker)
            transport = _Transport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            conn.data_received(_produce(1) + _produce(2) + _api_versions(3) + _metadata(4) + _produce(5))
            for _ in range(50):
                await asyncio.sleep(0.005)
            return transport

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            transport = ib.loop.run_until_complete(scenario())
            gc.collect()
        assert transport.closed
        assert not [w for w in caught if "never awaited" in str(w.message)], [str(w.message) for w in caught]
        # Nothing runs for a held answer until it is awaited; the fsyncs its handler asked for ran
        # (the group commit is idle again, its records durable).
        assert len(made) == 2
        assert not ib.broker._wanted and not ib.broker._syncing
        assert all(a.durable_now() for a in made)
        assert ib.broker.logs.partitions()[(TOPIC, 0)].log_end_offset == 2 * 2  # produce 5 never handled
    finally:
        ib.close()


def test_produces_arriving_while_one_waits_for_its_fsync_are_appended_before_it_is_answered(
        tmp_path: Path) -> None:
    """The first produce's fsync is held. Produces that arrive meanwhile, one read at a time, are
    appended at once (so the next group commit covers them) instead of queueing until the first is
    answered; every answer still goes out in request order, and none before its records' fsync."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    gate = FsyncGate()
    try:
        plog = ib.broker.logs.partitions()[(TOPIC, 0)]
        transport = _SyncedWhenAnswered(plog)

        async def scenario() -> tuple[list[int], list[int], list[int]]:
            conn = KafkaConnection(ib.broker)
            conn.connection_made(transport)  # type: ignore[arg-type]
            gate.hold(TOPIC)
            conn.data_received(_produce(1))
            while not gate.reached.is_set():
                await asyncio.sleep(0.001)
            ends = []
            for corr in (2, 3, 4):  # each arrives in a read of its own while the first waits
                conn.data_received(_produce(corr))
                for _ in range(5):
                    await asyncio.sleep(0)
                ends.append(plog.log_end_offset)
            answered_while_held = [struct.unpack(">i", f[4:8])[0] for f in transport.written]
            gate.release()
            for _ in range(500):
                if len(transport.written) >= 4:
                    break
                await asyncio.sleep(0.01)
            return ends, answered_while_held, [struct.unpack(">i", f[4:8])[0] for f in transport.written]

        ends, answered_while_held, answered = ib.loop.run_until_complete(scenario())
        assert ends == [4, 6, 8], "a produce that arrived while the first waited was not appended meanwhile"
        assert answered_while_held == []
        assert answered == [1, 2, 3, 4]
        for corr in (1, 2, 3, 4):
            assert transport.synced[corr] >= 2 * corr, (corr, transport.synced)
    finally:
        gate.close()
        ib.close()


def test_a_failed_fsync_under_a_waiting_produce_closes_the_connection(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk refuses the fsync a held produce waits for: the log directory goes offline, and the
    connection, which listens for new requests while it waits, stops waiting and closes (it does not
    keep asking for fsyncs of an offline log)."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    try:
        def failing(fds: list[Any]) -> None:
            for fd in fds:
                if not isinstance(fd, Path):
                    os.close(fd)
            raise OSError(5, "Input/output error")

        monkeypatch.setattr("oncelog.server.broker._fsync_and_close", failing)
        stopped: list[bool] = []
        ib.broker.on_storage_failure = lambda: stopped.append(True)

        async def scenario() -> _Transport:
            conn = KafkaConnection(ib.broker)
            transport = _Transport()
            conn.connection_made(transport)  # type: ignore[arg-type]
            conn.data_received(_produce(1))
            for _ in range(200):
                if transport.closed:
                    break
                await asyncio.sleep(0.005)
            return transport

        transport = ib.loop.run_until_complete(scenario())
        assert transport.closed, "the connection kept waiting on an offline log"
        assert transport.written == []  # never acknowledged
        assert ib.broker.storage_failure is not None and stopped
    finally:
        ib.close()


def test_a_topic_deleted_while_its_produce_waits_for_the_fsync_is_no_internal_error(tmp_path: Path) -> None:
    """Found by the socket fuzz under --flush-every-append: a produce is appended and waits for its
    fsync, and another client's DeleteTopics removes the partition (its files closed) before the
    fsync is planned. The produce is answered (it was appended; the deletion came after) and its
    connection stays open: no handler error, no dup of a closed descriptor."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    try:
        delete = _frame(20, 5, 2, {"topic_names": [TOPIC], "timeout_ms": 5000})

        async def scenario() -> tuple[_Transport, _Transport]:
            producer, admin = KafkaConnection(ib.broker), KafkaConnection(ib.broker)
            produced, deleted = _Transport(), _Transport()
            producer.connection_made(produced)  # type: ignore[arg-type]
            admin.connection_made(deleted)  # type: ignore[arg-type]
            # In one pass of the loop: the produce is appended and its fsync asked for, then another
            # client's DeleteTopics removes the partition before the fsync is planned.
            producer.data_received(_produce(1) + _api_versions(2))
            admin.data_received(delete)
            for _ in range(2000):  # DeleteTopics answers once its files are removed, on a worker thread
                if (len(produced.written) >= 2 or produced.closed) and deleted.written:
                    break
                await asyncio.sleep(0.005)
            return produced, deleted

        produced, deleted = ib.loop.run_until_complete(scenario())
        assert not produced.closed
        assert [struct.unpack(">i", f[4:8])[0] for f in produced.written] == [1, 2]
        _, answer = decode_response(0, 9, produced.written[0][4:])
        assert answer.responses[0].partition_responses[0].error_code == 0
        _, gone = decode_response(20, 5, deleted.written[0][4:])
        assert gone.responses[0].error_code == 0
        assert TOPIC not in ib.broker.logs.topics()
    finally:
        ib.close()


def _offset_commit(corr: int, offset: int) -> bytes:
    return _frame(8, 8, corr, {
        "group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "", "group_instance_id": None,
        "retention_time_ms": -1, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
             "committed_metadata": None}]}]})


def test_a_connection_lost_while_offset_commits_wait_for_their_fsync_leaves_nothing_unawaited(
        tmp_path: Path) -> None:
    """Found by the socket fuzz under --flush-every-append: an OffsetCommit's answer waited for its
    fsync through a coroutine made when the records were appended; a connection lost before the
    answer was awaited left it 'never awaited'. The commits stand (they were appended) and nothing
    is left behind, whichever pass the connection is lost in."""
    ib = _in_process_with_topic(tmp_path, flush_every_append=True)
    try:
        _lose_connections(ib, lambda n: _offset_commit(1, 10 + n) + _offset_commit(2, 20 + n), (0, 1, 2, 3))
        r = ib.call(9, 8, {"groups": [{"group_id": "g", "topics": [{"name": TOPIC, "partition_indexes": [0]}]}],
                           "require_stable": True})
        assert r.groups[0].topics[0].partitions[0].committed_offset == 23
    finally:
        ib.close()


def _fetch_now(corr: int, max_bytes: int) -> bytes:  # answered at once, up to max_bytes of records
    return _frame(1, 11, corr, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": TOPIC, "partitions": [{"partition": 0, "current_leader_epoch": -1,
                                                     "fetch_offset": 0, "log_start_offset": -1,
                                                     "partition_max_bytes": max_bytes}]}],
        "forgotten_topics_data": []})


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_client_that_never_reads_while_its_answers_wait_for_fsyncs_costs_bounded_memory(tmp_path: Path) -> None:
    """The held-answer path meets a client that never reads: it pipelines produces (each answer
    waits for its fsync, under --flush-every-append) alternating with fetches of 512 KiB (answered at
    once, so held behind the produce before them): 10 GiB of answers. The connection must stop
    handling and reading it once about a send buffer's worth waits, whether in the held answers or
    in the transport; its memory stays bounded, another client is served meanwhile, and when the
    client reads at last its answers come in request order."""
    cfg = tmp_path / "broker.toml"
    # Many requests may queue, so that what bounds the held answers is their bytes, not their count.
    cfg.write_text("socket_send_buffer_high_bytes = 1048576\nqueued_max_requests_per_connection = 2000\n")
    b = oncelog_broker(tmp_path / "data", "--flush-every-append", "--config", str(cfg),
                       log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, TOPIC, 1)
        filler = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
        for i in range(512):
            filler.produce(TOPIC, b"%06d" % i + b"x" * 1018)
        assert filler.flush(30) == 0
        assert b.proc is not None
        base = _rss_kib(b.proc.pid)
        pair = bytearray(_produce(0))
        fetch_at = len(pair)
        pair += _fetch_now(1, 512 * 1024)
        pairs = []
        for i in range(100_000):  # 23 MB of requests (far more than the kernel's buffers take), 50 GiB of answers
            struct.pack_into(">i", pair, 8, 2 * i)  # the correlation ids
            struct.pack_into(">i", pair, fetch_at + 8, 2 * i + 1)
            pairs.append(bytes(pair))
        pending = memoryview(b"".join(pairs))
        s = socket.create_connection((b.host, b.port))
        s.setblocking(False)
        sent = 0
        stalled_since = None
        deadline = time.monotonic() + 30
        while sent < len(pending) and time.monotonic() < deadline:
            try:
                sent += s.send(pending[sent:sent + (1 << 16)])
                stalled_since = None
            except BlockingIOError:
                stalled_since = stalled_since or time.monotonic()
                if time.monotonic() - stalled_since > 3:
                    break  # the broker stopped reading us
                time.sleep(0.05)
        assert sent < len(pending), "the broker kept reading a client that never reads"
        grown_mib = (_rss_kib(b.proc.pid) - base) / 1024
        ok = Producer({"bootstrap.servers": b.bootstrap, "enable.idempotence": True})
        delivered: list[object] = []
        for _ in range(50):
            ok.produce(TOPIC, b"ok", on_delivery=lambda err, msg: delivered.append(err))
        assert ok.flush(20) == 0 and delivered == [None] * 50
        print(f"broker RSS grew {grown_mib:.1f} MiB; {sent} of {len(pending)} request bytes accepted")
        assert grown_mib < 64, f"broker grew {grown_mib:.0f} MiB for a client that never reads"
        s.setblocking(True)
        s.settimeout(20)
        assert _correlation_ids(s, 300) == list(range(300))
        s.close()
        assert "internal error" not in (tmp_path / "broker.log").read_text()
    finally:
        b.kill()

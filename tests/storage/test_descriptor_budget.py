"""Connections and client segment rolls share one descriptor budget (``storage.descriptors``).

Probe s37 (``fd_exhaust.py``, a broker under ``ulimit -n 1024``): 887 idle connections were admitted
against the few segments open then; about 100 segment rolls of a topic with segment.bytes=2000 later,
a roll's ``open`` failed with EMFILE, the log directory went offline and the broker stopped.
``roll_refused`` counted segment files only. Here the same happens in process: the soft limit is
lowered for the test, and each connection the broker admits holds a real descriptor.
"""

from __future__ import annotations

import errno
import os
import resource
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from oncelog.storage import descriptors, fileio
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

STORAGE_ERROR = 56


@dataclass(eq=False)
class _Conn:
    """What ``Broker.admit`` reads of a connection; ``fd`` stands for its socket."""

    fd: int
    host: str = "127.0.0.1"


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[InProcessBroker]:
    ib = InProcessBroker(tmp_path / "d")
    ib.broker.logs.create_topic("roll", 1, {"segment.bytes": "200"})
    ib.create_topic("other", 1)
    try:
        yield ib
    finally:
        ib.close()


def _produce(ib: InProcessBroker, topic: str, value: bytes) -> tuple[int, str | None]:
    r = ib.call(0, 9, {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch(value=value, size=150)}]}]})
    p = r.responses[0].partition_responses[0]
    return int(p.error_code), p.error_message


def test_rolls_count_the_connections_admitted_and_are_refused_before_the_descriptors_run_out(
        broker: InProcessBroker) -> None:
    """Connections are admitted up to their part of the budget; a client's rolls are then refused
    (KAFKA_STORAGE_ERROR) before a roll's ``open`` can meet EMFILE, the log directory stays online,
    and the partitions take appends again once the connections are gone."""
    ib = broker
    assert _produce(ib, "roll", b"first")[0] == 0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    open_now = len(os.listdir("/proc/self/fd"))
    # The budget counts every segment file this process has open, twice (its file and a flush's
    # duplicate), the other tests' brokers in this worker among them (CI's xdist worker: a few
    # hundred, and a limit of open + 600 admitted no connection at all).
    limit = open_now + 600 + 2 * descriptors.segments_open()
    assert soft == resource.RLIM_INFINITY or soft >= limit, "the test needs room to lower the limit into"
    conns: list[_Conn] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        descriptors._count = None  # counted afresh under this limit
        while True:
            conn = _Conn(os.open(os.devnull, os.O_RDONLY))
            if ib.broker.admit(conn) is not None:
                os.close(conn.fd)
                break
            conns.append(conn)
        assert len(conns) > 100, "connections were admitted"
        outcomes = []
        for i in range(300):  # each append rolls: 200-byte segments
            code, message = _produce(ib, "roll", b"%d" % i)
            outcomes.append(code)
            if code != 0:
                assert code == STORAGE_ERROR and message is not None and "segment roll refused" in message, message
                assert "Too many open files" not in message, "the budget refused nothing: the open failed"
                break
        assert outcomes[-1] == STORAGE_ERROR, "no roll was refused"
        assert ib.broker.logs.dir_state.offline_reason is None
        assert _produce(ib, "other", b"o")[0] == 0  # appends that do not roll still go in
    finally:
        for conn in conns:
            os.close(conn.fd)
            ib.broker.connections.discard(conn)  # type: ignore[arg-type]
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        descriptors._count = None
    assert _produce(ib, "roll", b"after")[0] == 0
    assert ib.broker.logs.dir_state.offline_reason is None


def test_a_client_roll_that_meets_emfile_is_refused_and_the_directory_stays_online(
        broker: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net behind the budget: a client's roll whose ``open`` fails for want of a
    descriptor answers KAFKA_STORAGE_ERROR, leaves the log as it was, and takes nothing offline."""
    ib = broker
    assert _produce(ib, "roll", b"first")[0] == 0
    plog = ib.broker.logs.get_partition("roll", 0)
    assert plog is not None
    segments, end = len(plog.segments), plog.log_end_offset

    def no_descriptor(path: Path) -> int:
        raise OSError(errno.EMFILE, "Too many open files", str(path))

    monkeypatch.setattr(fileio.fs, "open_rw", no_descriptor)
    code, message = _produce(ib, "roll", b"second")
    assert code == STORAGE_ERROR and message is not None and "segment roll refused" in message
    assert ib.broker.logs.dir_state.offline_reason is None
    assert (len(plog.segments), plog.log_end_offset) == (segments, end)
    monkeypatch.undo()
    assert _produce(ib, "roll", b"third")[0] == 0
    assert len(plog.segments) == segments + 1

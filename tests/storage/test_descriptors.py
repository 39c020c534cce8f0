"""A client cannot use up the broker's file descriptors (``storage.descriptors``).

Every segment keeps its file open. Before these checks, on a broker limited to 1,500 open files:
- a CreateTopics of 1,000 partitions after another one failed half way with "Too many open files",
  kept the files of the half it had made, and the broker accepted no connection after it;
- a topic created with ``segment.bytes=100`` rolled a segment at every produce until a roll failed:
  the data directory was taken offline, the broker stopped, and it could not start again (its load
  opened every segment).

Here the broker runs as a process under ``ulimit -n 1500`` (soft and hard, so that it cannot raise
it), as a user would run it.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from oncelog.admin.raw_client import RawClient
from oncelog.storage import descriptors
from oncelog.testing.broker_process import BrokerProcess, oncelog_broker
from tests.storage.helpers import batch

LIMIT = 1500
STORAGE_ERROR, INVALID_PARTITIONS = 56, 37


def _limited_broker(tmp_path: Path) -> BrokerProcess:
    b = oncelog_broker(tmp_path / "data", log_path=tmp_path / "broker.log")
    b.args = ["bash", "-c", f"ulimit -n {LIMIT} && exec {shlex.join(b.args)}"]
    return b


def _create(c: RawClient, name: str, partitions: int, configs: dict[str, str] | None = None) -> Any:
    r = c.request(19, (0, 5), {"topics": [{
        "name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
        "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}],
        "timeout_ms": 60_000, "validate_only": False})
    return r.topics[0]


def _produce(c: RawClient, topic: str, value: bytes) -> Any:
    r = c.request(0, (0, 9), {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch(value=value)}]}]})
    return r.responses[0].partition_responses[0]


def _open_files(b: BrokerProcess) -> int:
    assert b.proc is not None
    return len(list(Path(f"/proc/{b.proc.pid}/fd").iterdir()))


def _errors_in_log(tmp_path: Path) -> list[str]:
    return [line for line in (tmp_path / "broker.log").read_text().splitlines()
            if "CRITICAL" in line or "ERROR" in line or "Traceback" in line or "cannot start" in line]


def test_topics_past_the_descriptor_budget_are_refused_and_the_broker_stays_up(tmp_path: Path) -> None:
    b = _limited_broker(tmp_path).start()
    try:
        with RawClient(b.bootstrap) as c:
            t = _create(c, "big", 1000)
            assert t.error_code == INVALID_PARTITIONS
            assert f"limit of {LIMIT} open files (ulimit -n)" in t.error_message
            assert _create(c, "fits", 300).error_code == 0
            r = c.request(37, (0, 3), {"topics": [{"name": "fits", "count": 1300, "assignments": None}],
                                       "timeout_ms": 5000, "validate_only": False})
            assert r.results[0].error_code == INVALID_PARTITIONS
            assert _produce(c, "fits", b"v").error_code == 0
        assert _open_files(b) < LIMIT // 2
        assert not list((tmp_path / "data").glob("big-*"))
        with RawClient(b.bootstrap) as c:  # the broker still accepts connections
            assert _create(c, "small", 3).error_code == 0
        assert b.stop() == 0
        b.start()
        with RawClient(b.bootstrap) as c:
            r = c.request(3, (0, 12), {"topics": None, "allow_auto_topic_creation": False,
                                       "include_topic_authorized_operations": False})
            assert {t.name: len(t.partitions) for t in r.topics if not t.name.startswith("__")} == \
                {"fits": 300, "small": 3}
        assert b.stop() == 0
        assert _errors_in_log(tmp_path) == []
    finally:
        b.kill()


def test_a_tiny_segment_bytes_topic_is_refused_rolls_before_the_broker_runs_out(tmp_path: Path) -> None:
    b = _limited_broker(tmp_path).start()
    try:
        with RawClient(b.bootstrap) as c:
            assert _create(c, "tiny", 1, {"segment.bytes": "100"}).error_code == 0
            assert _create(c, "other", 1).error_code == 0
            accepted, refused = 0, None
            for i in range(LIMIT):
                p = _produce(c, "tiny", b"t%d" % i)
                if p.error_code != 0:
                    refused = p
                    break
                accepted += 1
            assert refused is not None and refused.error_code == STORAGE_ERROR, "a roll was never refused"
            assert "segment roll refused" in refused.error_message and "ulimit -n" in refused.error_message
            assert 2 * accepted + descriptors.headroom(LIMIT) <= LIMIT + 2
            assert _produce(c, "other", b"o").error_code == 0  # other partitions still take writes
        assert b.stop() == 0, "the broker did not stop cleanly"
        b.start()  # ... and starts again: its load opens every segment
        with RawClient(b.bootstrap) as c:
            assert _produce(c, "other", b"o2").error_code == 0
            r = c.request(2, (0, 5), {"replica_id": -1, "isolation_level": 0, "topics": [
                {"name": "tiny", "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                                 "timestamp": -1}]}]})
            assert r.topics[0].partitions[0].offset == accepted
        assert b.stop() == 0
        assert _errors_in_log(tmp_path) == []
    finally:
        b.kill()


def test_a_creation_that_fails_half_way_closes_and_removes_what_it_made(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The safety net behind the budget: a partition whose files cannot all be made (here the 5th of
    8: its segment file is open when the directory's fsync fails, as "Too many open files" did)
    leaves no descriptor open and no directory behind, and the error is a storage error, not a
    dropped connection."""
    from oncelog.storage import fileio
    from tests.inproc import InProcessBroker

    ib = InProcessBroker(tmp_path / "d")
    try:
        before = descriptors.segments_open()
        real_fsync_dir = fileio.fs.fsync_dir

        def failing_fsync_dir(path: Path) -> None:
            if path.name == "half-4":
                raise OSError(24, "Too many open files", str(path))
            real_fsync_dir(path)

        monkeypatch.setattr(fileio.fs, "fsync_dir", failing_fsync_dir)
        r = ib.call(19, 5, {"topics": [{"name": "half", "num_partitions": 8, "replication_factor": 1,
                                        "assignments": [], "configs": []}], "timeout_ms": 5000,
                            "validate_only": False})
        assert r.topics[0].error_code == STORAGE_ERROR
        assert "Too many open files" in r.topics[0].error_message
        assert descriptors.segments_open() == before
        assert not list((tmp_path / "d").glob("half-*"))
        monkeypatch.undo()
        ib.create_topic("half", 2)  # the name was released
        assert ib.produce("half", 1, batch(value=b"x")) == 0
    finally:
        ib.close()


def test_a_client_holding_connections_open_cannot_stop_the_broker(tmp_path: Path) -> None:
    """Connections take descriptors too. Before, 1,600 idle connections took every one of them; the
    next segment roll failed, and the broker stopped. Now connections past the budget are closed
    at once, and the connections held count against a client's rolls too (one budget): a produce
    that would roll is refused while they hold the descriptors (about 100 rolls later a roll's
    open met EMFILE and stopped the broker: probe s37), and rolls go on once they are closed."""
    import socket
    import time

    b = _limited_broker(tmp_path).start()
    socks: list[socket.socket] = []
    try:
        try:
            with RawClient(b.bootstrap) as c:
                assert _create(c, "t", 1, {"segment.bytes": "1000"}).error_code == 0
            for _ in range(LIMIT + 100):
                socks.append(socket.create_connection((b.host, b.port), 5))
            time.sleep(1)
            assert _open_files(b) < LIMIT - 100  # room left for files and rolls
            for s in socks[:20]:  # the first ones were taken: their places free up
                s.close()
            time.sleep(0.5)
            with RawClient(b.bootstrap) as c:
                codes = [_produce(c, "t", b"%03d" % i * 100).error_code for i in range(5)]  # a roll every 2-3
                assert codes[0] == 0 and STORAGE_ERROR in codes, codes
                assert b.proc is not None and b.proc.poll() is None
                assert "refusing a connection" in (tmp_path / "broker.log").read_text()
                for s in socks:
                    s.close()
                time.sleep(0.5)
                for i in range(50):
                    assert _produce(c, "t", b"%03d" % i * 100).error_code == 0
        finally:
            for s in socks:
                s.close()
        assert b.stop() == 0
        assert _errors_in_log(tmp_path) == []
    finally:
        b.kill()

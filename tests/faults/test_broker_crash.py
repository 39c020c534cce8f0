"""kill -9 the broker and restart it on the same data directory: every acknowledged record is served
at its original offset; a corrupted segment tail is truncated with a log line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.storage.fsync_ring import open_ring
from oncelog.testing.broker_process import create_topic, oncelog_broker

_ring = open_ring()
open_ring_here = _ring is not None
if _ring is not None:
    _ring.close()


def _consume(bootstrap: str, topic: str, partitions: int, expected: int) -> dict[tuple[int, int], bytes]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "crash", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 30
    while len(got) < expected and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and not m.error():
            got[(m.partition(), m.offset())] = m.value()
    c.close()
    return got


@pytest.mark.parametrize("flush_flag", [[], ["--flush-every-append"], ["--flush-every-append", "--no-fsync-io-uring"]],
                         ids=["background-fsync", "fsync-each", "fsync-each-threads"])
def test_acked_records_survive_sigkill_at_their_offsets(tmp_path: Path, flush_flag: list[str]) -> None:
    """With fsync per append, the acknowledgements wait for fsyncs on an io_uring by default
    (storage/fsync_ring.py), on sync threads with ``--no-fsync-io-uring``; the broker's log says
    which."""
    broker = oncelog_broker(tmp_path / "data", *flush_flag, log_path=tmp_path / "broker.log").start()
    try:
        create_topic(broker.bootstrap, "dur", 2)
        acked: dict[tuple[int, int], bytes] = {}

        def on_delivery(err: object, msg: object) -> None:
            if err is None:
                acked[(msg.partition(), msg.offset())] = msg.value()  # type: ignore[attr-defined]

        p = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all", "enable.idempotence": False,
                      "linger.ms": 1})
        for i in range(2000):
            p.produce("dur", b"r-%d" % i, partition=i % 2, on_delivery=on_delivery)
            if i % 500 == 0:
                p.poll(0)
        assert p.flush(20) == 0
        assert len(acked) == 2000
        ring = open_ring_here and "--no-fsync-io-uring" not in flush_flag
        said = (tmp_path / "broker.log").read_text()
        assert ("fsyncs an answer waits for run on an io_uring" in said) == ring
        assert ("fsyncs an answer waits for run on 4 threads" in said) == (not ring)
        broker.restart()  # SIGKILL, then start on the same data dir
        got = _consume(broker.bootstrap, "dur", 2, len(acked))
        assert got == acked
        assert "recovered" in (tmp_path / "broker.log").read_text() or flush_flag
    finally:
        broker.kill()


def test_corrupt_tail_is_truncated_with_a_log_line(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    broker = oncelog_broker(data_dir, log_path=tmp_path / "broker.log").start()
    try:
        create_topic(broker.bootstrap, "cor")
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False, "linger.ms": 0})
        for i in range(20):
            p.produce("cor", b"c-%d" % i)
            p.flush(10)  # one batch per record
        broker.kill()  # crash: the tail is not covered by the recovery point
        seg = data_dir / "cor-0" / "00000000000000000000.log"
        raw = bytearray(seg.read_bytes())
        raw[-3] ^= 0xFF  # flip a byte inside the last batch (covered by its CRC)
        raw += b"\x00\x01garbage"
        seg.write_bytes(bytes(raw))
        broker.start()
        got = _consume(broker.bootstrap, "cor", 1, 19)
        assert got == {(0, i): b"c-%d" % i for i in range(19)}
        log_text = (tmp_path / "broker.log").read_text()
        assert "truncating segment" in log_text and "cor-0" in log_text
        # the partition keeps working after the truncation
        p.produce("cor", b"after")
        assert p.flush(10) == 0
        assert _consume(broker.bootstrap, "cor", 1, 20)[(0, 19)] == b"after"
    finally:
        broker.kill()


def test_clean_shutdown_on_sigterm(tmp_path: Path) -> None:
    broker = oncelog_broker(tmp_path / "data", log_path=tmp_path / "broker.log").start()
    assert broker.stop() == 0
    assert "stopped cleanly" in (tmp_path / "broker.log").read_text()

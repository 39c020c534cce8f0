"""Produce acknowledgement latency (p50/p99/max) while a consumer reads 800 MB of cold log.

Usage: .venv/bin/python scripts/bench/cold_read_latency.py
Writes 800,000 records of 1 KiB to our broker, fsyncs them and evicts them from the page cache
(POSIX_FADV_DONTNEED), then reads them all with one consumer while an acks=all producer sends a
record every 2 ms and records each acknowledgement's latency.
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.testing.broker_process import create_topic, oncelog_broker

RECORDS = 800_000


def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="oncelog-cold-"))
    b = oncelog_broker(d / "data", log_path=d / "broker.log").start()
    try:
        create_topic(b.bootstrap, "t", 2)
        create_topic(b.bootstrap, "lat", 1)
        p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "batch.size": 1 << 20})
        value = os.urandom(1024)
        for _ in range(RECORDS):
            while True:
                try:
                    p.produce("t", value)
                    break
                except BufferError:
                    p.poll(0.01)
        p.flush(60)
        for f in (d / "data").rglob("*.log"):
            fd = os.open(f, os.O_RDONLY)
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        latencies: list[float] = []
        stop = threading.Event()

        def pace() -> None:
            q = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0, "acks": "all"})
            q.produce("lat", b"x")
            q.flush(10)
            while not stop.is_set():
                q.produce("lat", b"x", on_delivery=lambda _err, m: latencies.append(m.latency()))
                q.poll(0)
                time.sleep(0.002)
            q.flush(10)

        thread = threading.Thread(target=pace)
        thread.start()
        time.sleep(0.5)
        latencies.clear()
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "cold", "enable.partition.eof": True})
        c.assign([TopicPartition("t", 0, 0), TopicPartition("t", 1, 0)])
        eof = count = 0
        started = time.monotonic()
        while eof < 2:
            for m in c.consume(1000, 1.0):
                if m.error():
                    eof += 1
                else:
                    count += 1
        elapsed = time.monotonic() - started
        stop.set()
        thread.join()
        c.close()
    finally:
        b.kill(signal.SIGKILL)
    latencies.sort()

    def ms(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000

    print(f"consumed {count:,} cold records in {elapsed:.2f} s; produce acknowledgements meanwhile: "
          f"n={len(latencies)} p50 {ms(0.5):.2f} p99 {ms(0.99):.2f} max {latencies[-1] * 1000:.1f} ms")


if __name__ == "__main__":
    main()

"""Compacted topics with a real client (confluent-kafka / librdkafka) against a broker process whose
cleaner runs on its own threads: keyed records, tombstones, transactions with aborts, consumers in
both isolation levels, a committed offset inside a removed range, kill -9 mid-clean."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker

TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01",
                "delete.retention.ms": "3600000"}


def start_broker(tmp_path: Path, extra: str = "") -> BrokerProcess:
    cfg = tmp_path / "broker.toml"
    cfg.write_text("log_cleaner_backoff_ms = 100\nflush_interval_ms = 50\n" + extra)
    return oncelog_broker(tmp_path / "data", "--config", str(cfg), log_path=tmp_path / "broker.log").start()


def read_all(bootstrap: str, topic: str, isolation: str, *, group: str | None = None,
             start: int | None = 0, idle_s: float = 2.0) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every (offset, key, value) from ``start`` (or the group's committed offset) until idle."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group or f"reader-{random.random()}",
                  "isolation.level": isolation, "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        if start is None:
            c.subscribe([topic])
        else:
            c.assign([TopicPartition(topic, 0, start)])
        out: list[tuple[int, bytes | None, bytes | None]] = []
        last = time.monotonic() + 15  # the first message may wait for a group join (3 s rebalance delay)
        while time.monotonic() - last < idle_s:
            msg = c.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append((msg.offset(), msg.key(), msg.value()))
            last = time.monotonic()
        return out
    finally:
        c.close()


def produce_workload(bootstrap: str, topic: str) -> dict[bytes, bytes | None]:
    """Keyed values, tombstones and transactions (one aborted); returns the newest committed value
    per key."""
    newest: dict[bytes, bytes | None] = {}
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 2})
    for rnd in range(30):
        for k in range(20):
            key, value = b"k%d" % k, b"v%d-%d" % (k, rnd)
            p.produce(topic, value, key, partition=0)
            newest[key] = value
        if rnd == 20:
            for k in range(15, 20):  # these keys end as tombstones
                p.produce(topic, None, b"k%d" % k, partition=0)
                newest[b"k%d" % k] = None
            for k in range(15, 20):
                del newest[b"k%d" % k]
        p.poll(0)
    assert p.flush(30) == 0
    for k in range(15, 20):  # tombstones are the newest records of these keys
        p.produce(topic, None, b"k%d" % k, partition=0)
        newest[b"k%d" % k] = None
    assert p.flush(30) == 0
    t = Producer({"bootstrap.servers": bootstrap, "transactional.id": "compacting", "linger.ms": 2})
    t.init_transactions(30)
    for commit, tag in ((True, b"committed-1"), (False, b"ABORTED"), (True, b"committed-2"), (False, b"ABORTED")):
        t.begin_transaction()
        for k in range(5):
            t.produce(topic, tag, b"t%d" % k, partition=0)
        if commit:
            t.commit_transaction(30)
            for k in range(5):
                newest[b"t%d" % k] = tag
        else:
            t.flush(30)
            t.abort_transaction(30)
    # padding, so that the transactions end up in segments the cleaner may clean (never the active one)
    for _ in range(40):
        for j in range(3):
            p.produce(topic, b"pad" * 100, b"pad-%d" % j, partition=0)
            newest[b"pad-%d" % j] = b"pad" * 100
        assert p.flush(30) == 0
    return newest


def wait_until_clean(bootstrap: str, topic: str, timeout_s: float = 60) -> list[tuple[int, bytes | None, bytes | None]]:
    """Read until the cleaner is done: no aborted value left, and two reads in a row the same (the
    cleaner runs on while segments become cleanable, as flushes move the recovery point)."""
    deadline = time.monotonic() + timeout_s
    previous = None
    while True:
        recs = read_all(bootstrap, topic, "read_uncommitted", idle_s=1.0)
        if not any(v == b"ABORTED" for _, _, v in recs) and len(recs) < 120 and recs == previous:
            return recs
        previous = recs
        assert time.monotonic() < deadline, f"not cleaned after {timeout_s}s: {len(recs)} records"
        time.sleep(0.5)


def check(recs: list[tuple[int, bytes | None, bytes | None]], newest: dict[bytes, bytes | None]) -> None:
    offsets = [o for o, _, _ in recs]
    assert offsets == sorted(set(offsets)), "offsets must increase"
    assert offsets[-1] - offsets[0] + 1 > len(offsets), "a compacted log has gaps"
    seen: dict[bytes, bytes | None] = {}
    for _o, k, v in recs:
        assert k is not None
        seen[k] = v
    assert seen == newest  # the newest value per key, tombstones included, nothing aborted
    assert not any(v == b"ABORTED" for _, _, v in recs)


def test_a_compacted_topic_with_librdkafka(tmp_path: Path) -> None:
    broker = start_broker(tmp_path)
    try:
        create_topic(broker.bootstrap, "table", 1, TOPIC_CONFIG)
        # a consumer group that committed an offset early on, in a range compaction will remove
        newest = produce_workload(broker.bootstrap, "table")
        c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "slow", "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition("table", 0, 45)], asynchronous=False)
        c.close()
        recs = wait_until_clean(broker.bootstrap, "table")
        assert "table-0: cleaned" in (tmp_path / "broker.log").read_text()
        check(recs, newest)
        committed = read_all(broker.bootstrap, "table", "read_committed")
        check(committed, newest)
        assert committed == recs
        present = sorted(o for o, _, _ in recs)
        assert 45 not in present
        resumed = read_all(broker.bootstrap, "table", "read_committed", group="slow", start=None)
        assert resumed[0][0] == min(o for o in present if o > 45)
        assert resumed == [r for r in recs if r[0] > 45]
        # keyless records are refused on a compacted topic
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": False})
        errors: list[object] = []
        p.produce("table", b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
        p.flush(15)
        assert errors and errors[0] is not None and "INVALID_RECORD" in str(errors[0])
        # a restart (kill -9) changes nothing
        broker.restart()
        assert read_all(broker.bootstrap, "table", "read_committed") == committed
    finally:
        broker.kill()


def test_kill_9_while_cleaning_loses_nothing(tmp_path: Path) -> None:
    # a throttled cleaner (Kafka's log.cleaner.io.max.bytes.per.second) takes a second or two per
    # cleaning here, so the kills below land in the middle of one
    broker = start_broker(tmp_path, "log_cleaner_io_max_bytes_per_second = 100000\n")
    rng = random.Random(3)
    try:
        create_topic(broker.bootstrap, "t", 1, {**TOPIC_CONFIG, "segment.bytes": "4096"})
        newest: dict[bytes, bytes] = {}
        for rnd in range(6):
            p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5})
            for i in range(1500):
                key, value = b"k%d" % rng.randrange(300), b"r%d-%d" % (rnd, i)
                p.produce("t", value * 8, key, partition=0)
                newest[key] = value * 8
                if i % 200 == 0:
                    p.poll(0)
            assert p.flush(30) == 0
            # Kill while a cleaning has written part of its output (.cleaned files), so the restart
            # must find and discard it; on a loaded machine the cleaner may not have begun yet.
            cleaning = time.monotonic() + 8
            while not any((tmp_path / "data" / "t-0").glob("*.cleaned")) and time.monotonic() < cleaning:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.3))
            broker.restart()  # SIGKILL, then start on the same data dir
        deadline = time.monotonic() + 30
        while ": cleaned [" not in (tmp_path / "broker.log").read_text():
            assert time.monotonic() < deadline, "no cleaning finished"
            time.sleep(0.2)
        assert "a cleaning interrupted before its swap" in (tmp_path / "broker.log").read_text()
        recs = read_all(broker.bootstrap, "t", "read_committed", idle_s=3.0)
        offsets = [o for o, _, _ in recs]
        assert offsets == sorted(set(offsets))
        seen: dict[bytes, bytes] = {}
        for _o, k, v in recs:
            assert k is not None and v is not None
            seen[k] = v
        assert seen == newest
    finally:
        broker.kill()


def test_oncelog_topics_create_with_cleanup_policy_compact(tmp_path: Path) -> None:
    broker = start_broker(tmp_path)
    try:
        bs = ["--bootstrap", broker.bootstrap]

        def oncelog(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "oncelog", *args], capture_output=True, text=True,
                                  timeout=60)

        r = oncelog("topics", "create", "changelog", "--config", "cleanup.policy=compact",
                    "--config", "min.compaction.lag.ms=1000", *bs)
        assert r.returncode == 0, r.stderr
        r = oncelog("topics", "create", "both", "--config", "cleanup.policy=compact,delete", *bs)
        assert r.returncode == 0, r.stderr
        r = oncelog("topics", "create", "bad", "--config", "cleanup.policy=shred", *bs)
        assert r.returncode == 1 and "cleanup.policy" in r.stderr
        r = oncelog("topics", "describe", "changelog", "both", *bs)
        assert r.returncode == 0
        assert "cleanup.policy=compact" in r.stdout and "cleanup.policy=compact,delete" in r.stdout
        assert "min.compaction.lag.ms=1000" in r.stdout
    finally:
        broker.kill()


def test_emptied_batches_and_markers_do_not_stall_librdkafka(tmp_path: Path) -> None:
    """A fenced producer's last entry is the coordinator's ABORT marker at a bumped epoch: the
    cleaner keeps it (fencing) but, once delete.retention.ms passed, empties it. Consumers in
    both isolation levels read across emptied data batches and an emptied control batch."""
    from oncelog.protocol import records as rb

    broker = start_broker(tmp_path)
    try:
        create_topic(broker.bootstrap, "fenced", 1, {**TOPIC_CONFIG, "delete.retention.ms": "0",
                                                     "segment.bytes": "1024"})
        zombie = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "z"})
        zombie.init_transactions(30)
        zombie.begin_transaction()
        for k in range(3):
            zombie.produce("fenced", b"doomed", b"d%d" % k, partition=0)
        zombie.flush(30)
        fresh = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "z"})
        fresh.init_transactions(30)  # fences the zombie: its transaction is aborted at a bumped epoch
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        deadline = time.monotonic() + 60
        empty_marker = False
        while not empty_marker:
            assert time.monotonic() < deadline, "the marker was never emptied"
            for j in range(6):
                p.produce("fenced", b"pad" * 60, b"pad-%d" % j, partition=0)
                assert p.flush(30) == 0
            time.sleep(0.3)
            for seg in sorted((tmp_path / "data" / "fenced-0").glob("*.log")):
                data = seg.read_bytes()
                empty_marker |= any(h.is_control and h.records_count == 0 for _, h in rb.iter_headers(data))
        fresh.begin_transaction()
        fresh.produce("fenced", b"alive", b"alive", partition=0)
        fresh.commit_transaction(30)
        for isolation in ("read_committed", "read_uncommitted"):
            recs = read_all(broker.bootstrap, "fenced", isolation)
            assert recs and recs[-1][2] == b"alive", isolation
            assert not any(v == b"doomed" for _, _, v in recs)
    finally:
        broker.kill()

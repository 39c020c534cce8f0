"""Fault harness for the Spark pipeline: input generation, driver SIGKILL-and-restart, final reads.

Used by tests/spark and by `oncelog demo`. Everything talks to the broker through confluent-kafka,
so the harness works against any Kafka-protocol broker.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


def produce_transactions(bootstrap: str, topic: str, records: Sequence[tuple[bytes, bytes]], per_txn: int,
                         abort_every: int, partitions: int | None = None,
                         on_commit: Callable[[int], None] | None = None) -> list[tuple[bytes, bytes]]:
    """Write ``records`` in transactions of ``per_txn``; every ``abort_every``-th transaction also
    gets a batch of poison records (value prefixed ``aborted-``) and is aborted, then the real records
    are written again in a committed one. Returns the committed records (all of ``records``);
    ``on_commit(n)`` is called after each committed transaction of ``n`` records."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"oncelog-demo-gen-{uuid.uuid4()}"})
    p.init_transactions(30)
    for n, i in enumerate(range(0, len(records), per_txn)):
        chunk = records[i:i + per_txn]
        if abort_every and n % abort_every == abort_every - 1:
            p.begin_transaction()
            for j, (k, v) in enumerate(chunk):
                p.produce(topic, key=k, value=b"aborted-" + v, partition=j % partitions if partitions else -1)
            p.abort_transaction(30)
        p.begin_transaction()
        for j, (k, v) in enumerate(chunk):
            p.produce(topic, key=k, value=v, partition=j % partitions if partitions else -1)
        p.commit_transaction(30)
        if on_commit is not None:
            on_commit(len(chunk))
    return list(records)


def high_watermark_sum(consumer: Any, topic: str) -> int:
    from confluent_kafka import TopicPartition

    md = consumer.list_topics(topic, timeout=10).topics.get(topic)
    if md is None or md.error is not None:
        return 0
    return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
               for p in md.partitions)


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed",
               timeout_s: float = 60.0) -> list[tuple[bytes | None, bytes | None]]:
    """Every (key, value) of ``topic`` up to its current end, partition by partition in offset order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oncelog-read-{uuid.uuid4()}",
                  "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True})
    try:
        md = c.list_topics(topic, timeout=10).topics[topic]
        parts = sorted(md.partitions)
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1] for p in parts}
        out: list[tuple[bytes | None, bytes | None]] = []
        for p in parts:
            if ends[p] <= 0:
                continue
            c.assign([TopicPartition(topic, p, 0)])
            deadline = time.monotonic() + timeout_s
            position = 0
            while position < ends[p] and time.monotonic() < deadline:
                for m in c.consume(num_messages=max(1, min(5000, ends[p] - position)), timeout=0.2):
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            position = max(position, m.offset() or 0)
                        continue
                    position = (m.offset() or 0) + 1
                    out.append((m.key(), m.value()))
                pos = c.position([TopicPartition(topic, p)])[0].offset
                position = max(position, pos)
        return out
    finally:
        c.close()


@dataclass
class KillEvent:
    """One SIGKILL of the driver's process group: ``at`` (time.monotonic()), ``by_us`` (the harness
    killed it mid-batch) or by the job's own commit-window fault point, and the topic watched."""

    at: float
    by_us: bool
    topic: str = ""


@dataclass
class KillReport:
    kills: int = 0
    #: SIGKILLs the job's own fault points dealt (oncelog.demo.fault_sink), each followed by a restart
    self_kills: int = 0
    restarts: int = 0
    exit_code: int | None = None
    seconds: float = 0.0
    log: list[str] = field(default_factory=list)
    events: list[KillEvent] = field(default_factory=list)
    #: time.monotonic() of each start of the job (the first and every restart)
    starts: list[float] = field(default_factory=list)


def run_with_driver_kills(cmd: list[str], bootstrap: str, watch_topic: str | Sequence[str], kills: int, seed: int,
                          log_path: Path, timeout_s: float = 300.0,
                          on_event: Callable[[str], None] | None = None, max_self_kills: int = 4,
                          on_kill: Callable[[KillEvent], None] | None = None) -> KillReport:
    """Run the job ``cmd``; ``kills`` times, SIGKILL its whole process group (Python driver, the JVM,
    the Python workers) shortly after new records appear in ``watch_topic`` (read_uncommitted, so
    the kill lands while a batch is being written), then start it again. A job that dies of SIGKILL
    by its own fault point (``--kill-driver-in-commit``) is restarted too, up to ``max_self_kills``
    times. Finally let it finish. With several topics (a job running several queries), kill ``i``
    watches topic ``i mod n``. ``on_kill`` is called after each kill, before the restart: the job's
    whole process group was SIGKILLed, so this is the moment to look at what the kill left behind.
    """
    from confluent_kafka import Consumer

    rng = random.Random(seed)
    topics = [watch_topic] if isinstance(watch_topic, str) else list(watch_topic)
    report = KillReport()
    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oncelog-watch-{uuid.uuid4()}",
                        "isolation.level": "read_uncommitted"})
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYTHONUNBUFFERED="1")
    start = time.monotonic()

    def note(msg: str) -> None:
        report.log.append(msg)
        if on_event is not None:
            on_event(msg)

    try:
        with open(log_path, "ab") as log:
            while True:
                report.starts.append(time.monotonic())
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
                killed_by_us = False
                try:
                    if report.kills < kills:
                        topic = topics[report.kills % len(topics)]
                        seen = high_watermark_sum(watcher, topic)
                        while proc.poll() is None and time.monotonic() - start < timeout_s:
                            now = high_watermark_sum(watcher, topic)
                            if now > seen:
                                time.sleep(rng.uniform(0.0, 0.3))
                                if proc.poll() is not None:
                                    break
                                os.killpg(proc.pid, signal.SIGKILL)
                                proc.wait(timeout=30)
                                killed_by_us = True
                                report.events.append(KillEvent(time.monotonic(), True, topic))
                                report.kills += 1
                                note(f"driver killed (SIGKILL) mid-batch ({topic}), kill {report.kills}/{kills}")
                                break
                            time.sleep(0.05)
                    remaining = max(1.0, timeout_s - (time.monotonic() - start))
                    code = proc.wait(timeout=remaining)
                    if code == -signal.SIGKILL:
                        if not killed_by_us:
                            report.events.append(KillEvent(time.monotonic(), False))
                            report.self_kills += 1
                            note("driver killed (SIGKILL) by its fault point after the batch's tasks committed, "
                                 "before Spark's commit log entry")
                            if report.self_kills > max_self_kills:
                                report.exit_code = code
                                break
                        if on_kill is not None:
                            on_kill(report.events[-1])
                        report.restarts += 1
                        note("driver restarting from its checkpoint")
                        continue
                    report.exit_code = code
                    break
                finally:
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait(timeout=30)
    finally:
        watcher.close()
    report.seconds = time.monotonic() - start
    return report


def duplicates_and_losses(expected: Sequence[bytes], got: Sequence[bytes]) -> tuple[int, int, int]:
    """(lost, duplicated, unexpected): expected values never seen, extra copies, values not expected."""
    want = Counter(expected)
    have = Counter(got)
    lost = sum(1 for v in want if have[v] == 0)
    dup = sum(have[v] - want[v] for v in have if v in want and have[v] > want[v])
    unexpected = sum(c for v, c in have.items() if v not in want)
    return lost, dup, unexpected


def zombie_attempt(bootstrap: str, guarantee: str, topic: str, progress_topic: str, rows: int = 50,
                   delay_ms: int = 2000) -> tuple[int, int]:
    """Two attempts of one (batch, partition): the first stalls before committing (a zombie) while a
    second attempt of the same task runs to completion. Returns (lost, duplicated) in ``topic``."""
    import threading

    from oncelog.demo.fault_sink import FaultHooks
    from oncelog.spark.guarantees import Guarantee
    from oncelog.spark.sink import SinkSettings, TaskIdentity, write_partition

    g = Guarantee.parse(guarantee)
    base = SinkSettings(client={"bootstrap.servers": bootstrap}, guarantee=g, topic=topic,
                        progress_topic=progress_topic, progress_partitions=2, timeout_s=30)
    base.progress().ensure_topic()
    stall = FaultHooks(delay_before_commit_ms=delay_ms)
    ident = TaskIdentity(f"zombie-{uuid.uuid4()}", 0, 0)
    values = [f"{ident.query_id}-{i}".encode() for i in range(rows)]
    records = [(None, v, None, None, None) for v in values]
    watch = progress_topic if g is Guarantee.at_most_once else topic
    from confluent_kafka import Consumer

    watcher = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oncelog-watch-{uuid.uuid4()}",
                        "isolation.level": "read_uncommitted"})
    try:
        before = high_watermark_sum(watcher, watch)

        def zombie() -> None:
            try:
                write_partition(records, ident, base, stall)
            except Exception:
                pass  # fenced: expected for exactly_once

        t = threading.Thread(target=zombie, daemon=True)
        t.start()
        deadline = time.monotonic() + 20
        while high_watermark_sum(watcher, watch) <= before and time.monotonic() < deadline:
            time.sleep(0.02)
        write_partition(records, ident, base)
        t.join(60)
    finally:
        watcher.close()
    got = [v for _k, v in read_topic(bootstrap, topic) if v and v.startswith(ident.query_id.encode())]
    lost, dup, _unexpected = duplicates_and_losses(values, got)
    return lost, dup


def latest_per_account(updates: Sequence[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """(count, total) of each account's newest update (highest batch id) in an update-mode output."""
    latest: dict[str, dict[str, Any]] = {}
    for u in updates:
        if u["account"] not in latest or u["batch"] >= latest[u["account"]]["batch"]:
            latest[u["account"]] = u
    return {a: (int(u["count"]), int(u["total"])) for a, u in latest.items()}


def repeated_updates(updates: Sequence[dict[str, Any]]) -> int:
    """Extra copies of one (batch, account) update: what a replayed micro-batch leaves behind."""
    per_batch = Counter((u["batch"], u["account"]) for u in updates)
    return sum(n - 1 for n in per_batch.values() if n > 1)


def expected_per_account(values: Sequence[bytes]) -> dict[str, tuple[int, int]]:
    """(count, total) per account of JSON payments ``{"account": a, "amount": n}``."""
    import json

    count: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for v in values:
        d = json.loads(v)
        count[d["account"]] += 1
        total[d["account"]] += int(d["amount"])
    return {a: (count[a], total[a]) for a in count}

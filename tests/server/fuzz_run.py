"""A fuzz run against a real broker process: many raw connections send structure-aware fuzz
(tests/server/fuzz_requests.py) while librdkafka clients keep producing (idempotent and
transactional) and consuming (read_committed, in a group); then the checks of issue 13:

- the broker never died and never logged an internal error (a handler exception) or a traceback;
- every well-behaved delivery and commit succeeded, the consumer saw no aborted record;
- no transaction is wedged: once the transaction timeout has passed, every partition's last stable
  offset equals its high watermark, and a new transactional producer commits;
- the broker's RSS did not keep growing (the end is compared with the RSS after a warm-up);
- after kill -9 and a restart on the same data dir, every committed record of the well-behaved
  clients is there exactly once, no aborted one is visible, and every partition of every topic
  (fuzzed ones included) reads back from its log start to its high watermark.

``run_fuzz`` returns a report; tests assert on it. Seeded and bounded in time and connections.
"""

from __future__ import annotations

import asyncio
import random
import re
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker
from tests.server.fuzz_requests import FUZZ_TOPICS, FuzzState, RequestFuzzer

GOOD_IDEM = "good-idem"
GOOD_TXN = "good-txn"
GOOD_GROUP = "good-group"
TXN_MAX_TIMEOUT_MS = 10_000
BAD_LOG = re.compile(r"internal error|Traceback|Exception in callback|exception was never retrieved|"
                     r"background task .* failed|Fatal error|never awaited", re.I)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass
class Report:
    requests: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    apis: dict[int, int] = field(default_factory=dict)
    answered: int = 0
    reconnects: int = 0
    idem_delivered: list[bytes] = field(default_factory=list)
    txn_committed: list[bytes] = field(default_factory=list)
    txn_aborted: list[bytes] = field(default_factory=list)
    consumed: list[bytes] = field(default_factory=list)
    client_errors: list[str] = field(default_factory=list)
    bad_log_lines: list[str] = field(default_factory=list)
    broker_died: bool = False
    rss_warm: int = 0
    rss_end: int = 0
    rss_max: int = 0
    wedged: list[str] = field(default_factory=list)
    final_txn_error: str | None = None
    missing_after_restart: list[bytes] = field(default_factory=list)
    duplicated_after_restart: list[bytes] = field(default_factory=list)
    aborted_visible: list[bytes] = field(default_factory=list)
    unreadable: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)

    def problems(self) -> list[str]:
        out = []
        if self.broker_died:
            out.append("the broker died")
        out += [f"broker log: {line}" for line in self.bad_log_lines[:20]]
        out += [f"client: {e}" for e in self.client_errors[:20]]
        out += [f"wedged: {w}" for w in self.wedged]
        if self.final_txn_error:
            out.append(f"a new transactional producer could not commit: {self.final_txn_error}")
        if self.missing_after_restart:
            out.append(f"{len(self.missing_after_restart)} committed records missing after restart, "
                       f"e.g. {self.missing_after_restart[:5]}")
        if self.duplicated_after_restart:
            out.append(f"duplicates after restart: {self.duplicated_after_restart[:5]}")
        if self.aborted_visible:
            out.append(f"aborted records visible: {self.aborted_visible[:5]}")
        out += [f"unreadable: {u}" for u in self.unreadable[:20]]
        return out


# --- the well-behaved clients ---------------------------------------------------------------------

class GoodClients:
    """librdkafka producing idempotently and transactionally and consuming read_committed in a group,
    each in its own thread, recording every success and error into the report."""

    def __init__(self, bootstrap: str, report: Report) -> None:
        self.bootstrap = bootstrap
        self.report = report
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._guard, args=(fn,), daemon=True)
                        for fn in (self._idempotent, self._transactional, self._consumer)]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)
            if t.is_alive():
                self._error(f"{t.name} did not finish")

    def _error(self, msg: str) -> None:
        with self.lock:
            self.report.client_errors.append(msg)

    def _guard(self, fn: Any) -> None:
        try:
            fn()
        except Exception as exc:
            self._error(f"{fn.__name__}: {exc!r}")

    def _idempotent(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "compression.type": "lz4"})

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                self._error(f"idempotent delivery: {err}")
            else:
                with self.lock:
                    self.report.idem_delivered.append(msg.value())

        i = 0
        while not self.stop.is_set():
            p.produce(GOOD_IDEM, b"idem-%d" % i, on_delivery=done)
            i += 1
            p.poll(0.01 if i % 20 == 0 else 0)
        if p.flush(60) != 0:
            self._error("idempotent producer could not flush")

    def _transactional(self) -> None:
        p = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": "good-tx", "linger.ms": 5,
                      "compression.type": "zstd", "transaction.timeout.ms": TXN_MAX_TIMEOUT_MS})
        p.init_transactions(60)
        t = 0
        while not self.stop.is_set():
            values = [b"txn-%d-%d" % (t, j) for j in range(5)]
            p.begin_transaction()
            for v in values:
                p.produce(GOOD_TXN, v)
            if t % 4 == 3:
                p.abort_transaction(60)
                with self.lock:
                    self.report.txn_aborted += values
            else:
                p.commit_transaction(60)
                with self.lock:
                    self.report.txn_committed += values
            t += 1
            time.sleep(0.05)

    def _consumer(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": GOOD_GROUP, "auto.offset.reset": "earliest",
                      "isolation.level": "read_committed", "enable.auto.commit": True,
                      "session.timeout.ms": 10_000})
        c.subscribe([GOOD_TXN])
        try:
            while not self.stop.is_set():
                m = c.poll(0.2)
                if m is None:
                    continue
                if m.error():
                    if m.error().code() != KafkaError._PARTITION_EOF:
                        self._error(f"consumer: {m.error()}")
                    continue
                with self.lock:
                    self.report.consumed.append(m.value())
        finally:
            c.close()


# --- the fuzzing connections -----------------------------------------------------------------------

async def _read_frame(reader: asyncio.StreamReader, timeout: float) -> bytes:
    size = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), timeout))[0]
    return await asyncio.wait_for(reader.readexactly(size), timeout)


async def fuzz_connection(host: str, port: int, fz: RequestFuzzer, deadline: float, report: Report) -> None:
    rng = fz.rng
    while time.monotonic() < deadline:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.2)
            continue
        report.reconnects += 1
        pipeline = rng.random() < 0.15
        try:
            pending: list[tuple[int, int, Any]] = []
            for _ in range(rng.randint(1, 300)):
                if time.monotonic() > deadline:
                    break
                frame, expects, key, ver, _corr, body, kind = fz.frame()
                report.requests += 1
                report.kinds[kind] = report.kinds.get(kind, 0) + 1
                report.apis[key] = report.apis.get(key, 0) + 1
                writer.write(frame)
                await asyncio.wait_for(writer.drain(), 5)
                if kind.startswith("fatal"):
                    await asyncio.sleep(rng.choice([0, 0.05]))
                    break
                if not expects:
                    continue
                if kind != "ok" or not pipeline:
                    if pending:
                        break
                    resp = await _read_frame(reader, 3)
                    report.answered += 1
                    if kind == "ok":
                        fz.learn(key, ver, resp, body)
                    continue
                pending.append((key, ver, body))
                if len(pending) >= 30:
                    for k, v, b in pending:
                        fz.learn(k, v, await _read_frame(reader, 5), b)
                        report.answered += 1
                    pending.clear()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, struct.error):
            pass
        finally:
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), 2)
            except (OSError, TimeoutError):
                pass


async def fuzz_all(host: str, port: int, seed: int, seconds: float, connections: int, state: FuzzState,
                   report: Report) -> None:
    deadline = time.monotonic() + seconds
    fuzzers = [RequestFuzzer(random.Random(seed * 1000 + i), state) for i in range(connections)]
    await asyncio.gather(*(fuzz_connection(host, port, fz, deadline, report) for fz in fuzzers))


# --- checks ----------------------------------------------------------------------------------------

def partitions_of(bootstrap: str) -> dict[str, int]:
    with RawClient(bootstrap) as rc:
        md = rc.request(3, (1, 9), {"topics": None, "allow_auto_topic_creation": False})
    return {t.name: len(t.partitions) for t in md.topics if int(t.error_code) == 0}


def stable_offsets(bootstrap: str, topics: dict[str, int]) -> dict[tuple[str, int], tuple[int, int]]:
    """(high watermark, last stable offset) of every partition, by ListOffsets(-1) in both isolations."""
    out: dict[tuple[str, int], list[int]] = {}
    with RawClient(bootstrap) as rc:
        for isolation in (0, 1):
            resp = rc.request(2, (2, 7), {
                "replica_id": -1, "isolation_level": isolation,
                "topics": [{"name": t, "partitions": [{"partition_index": p, "timestamp": -1,
                                                       "current_leader_epoch": -1} for p in range(n)]}
                           for t, n in topics.items()]})
            for t in resp.topics:
                for p in t.partitions:
                    out.setdefault((t.name, p.partition_index), []).append(int(p.offset))
    return {k: (v[0], v[1]) for k, v in out.items()}


def wait_unwedged(bootstrap: str, timeout_s: float) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        offsets = stable_offsets(bootstrap, partitions_of(bootstrap))
        stuck = [f"{t}-{p}: LSO {lso} < HW {hw}" for (t, p), (hw, lso) in sorted(offsets.items()) if lso != hw]
        if not stuck or time.monotonic() > deadline:
            return stuck
        time.sleep(1)


def final_transaction(bootstrap: str, topics: list[str]) -> str | None:
    try:
        p = Producer({"bootstrap.servers": bootstrap, "transactional.id": "good-final",
                      "transaction.timeout.ms": TXN_MAX_TIMEOUT_MS})
        p.init_transactions(60)
        p.begin_transaction()
        for t in topics:
            p.produce(t, b"final", partition=0)
        p.commit_transaction(60)
        return None
    except KafkaException as exc:
        return repr(exc)


def read_partitions(bootstrap: str, tps: list[tuple[str, int]],
                    isolation: str) -> tuple[dict[tuple[str, int], list[bytes]], list[str]]:
    """Every record value of each partition from its log start to its end (HW or LSO), with one
    consumer; and the errors met on the way (a corrupt batch, a partition not read to the end)."""
    values: dict[tuple[str, int], list[bytes]] = {tp: [] for tp in tps}
    errors: list[str] = []
    if not tps:
        return values, errors
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-reader", "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True, "check.crcs": True})
    try:
        c.assign([TopicPartition(t, p, -2) for t, p in tps])  # OFFSET_BEGINNING
        todo = set(tps)
        deadline = time.monotonic() + 90
        while todo and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            tp = (m.topic(), m.partition())
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    todo.discard(tp)
                else:
                    errors.append(f"{tp[0]}-{tp[1]}: {m.error()}")
                    todo.discard(tp)
                continue
            values[tp].append(m.value())
        errors += [f"{t}-{p}: not read to the end in 90 s" for t, p in sorted(todo)]
    finally:
        c.close()
    return values, errors


def check_after_restart(bootstrap: str, report: Report) -> None:
    good = [(t, p) for t in (GOOD_IDEM, GOOD_TXN) for p in range(2)]
    values, errors = read_partitions(bootstrap, good, "read_committed")
    report.unreadable += errors
    idem = values[(GOOD_IDEM, 0)] + values[(GOOD_IDEM, 1)]
    txn = [v for v in values[(GOOD_TXN, 0)] + values[(GOOD_TXN, 1)] if v != b"final"]
    for expected, got in ((report.idem_delivered, idem), (report.txn_committed, txn)):
        seen: dict[bytes, int] = {}
        for v in got:
            seen[v] = seen.get(v, 0) + 1
        report.missing_after_restart += [v for v in expected if v not in seen]
        report.duplicated_after_restart += [v for v, n in seen.items() if n > 1]
    aborted = set(report.txn_aborted)
    report.aborted_visible += [v for v in txn if v in aborted]
    others = [(t, p) for t, n in sorted(partitions_of(bootstrap).items())
              if not t.startswith("__") and t not in (GOOD_IDEM, GOOD_TXN) for p in range(n)]
    _, errors = read_partitions(bootstrap, others, "read_uncommitted")
    report.unreadable += errors


# --- the whole run ---------------------------------------------------------------------------------

def start_broker(data_dir: Path, log_path: Path, port: int | None = None,
                 flush_every_append: bool = False) -> BrokerProcess:
    """``flush_every_append``: every answer that acknowledges an append waits for its fsync, so
    produces take the connection's held-answer path (``AnsweredWhenDurable``) under the fuzz."""
    extra = ("--flush-every-append",) if flush_every_append else ()
    return oncelog_broker(data_dir, "--auto-create-topics", "--transaction-max-timeout-ms", str(TXN_MAX_TIMEOUT_MS),
                          "--transaction-abort-interval-ms", "1000", "--group-initial-rebalance-delay-ms", "0",
                          *extra, log_path=log_path, port=port).start()


def protected_producer_ids(bootstrap: str) -> set[int]:
    """The well-behaved clients' producer ids (DescribeProducers on their partitions), kept out of
    the fuzzer's pools."""
    with RawClient(bootstrap) as rc:
        resp = rc.request(61, (0, 0), {"topics": [{"name": t, "partition_indexes": [0, 1]}
                                                  for t in (GOOD_IDEM, GOOD_TXN)]})
    return {int(s.producer_id) for t in resp.topics for p in t.partitions for s in p.active_producers}


def run_fuzz(tmp: Path, *, seconds: float, seed: int = 1, connections: int = 12,
             flush_every_append: bool = False) -> Report:
    report = Report()
    started = time.monotonic()
    log_path = tmp / "broker.log"
    b = start_broker(tmp / "data", log_path, flush_every_append=flush_every_append)
    try:
        create_topic(b.bootstrap, GOOD_IDEM, 2)
        create_topic(b.bootstrap, GOOD_TXN, 2)
        for t in FUZZ_TOPICS[:3]:
            create_topic(b.bootstrap, t, 2)
        good = GoodClients(b.bootstrap, report)
        good.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (report.idem_delivered and report.txn_committed):
            time.sleep(0.2)
        state = FuzzState(protected_pids=protected_producer_ids(b.bootstrap))
        assert b.proc is not None
        pid = b.proc.pid
        warm = min(max(seconds * 0.2, 3.0), 120.0)

        async def fuzz_and_sample() -> None:
            task = asyncio.ensure_future(fuzz_all(b.host, b.port, seed, seconds, connections, state, report))
            start = time.monotonic()
            while not task.done():
                await asyncio.sleep(0.5)
                if b.proc is not None and b.proc.poll() is not None:
                    report.broker_died = True
                    break
                rss = rss_bytes(pid)
                report.rss_max = max(report.rss_max, rss)
                if not report.rss_warm and time.monotonic() - start >= warm:
                    report.rss_warm = rss
            await task

        t0 = time.monotonic()
        report.phases["setup"] = t0 - started
        asyncio.run(fuzz_and_sample())
        report.phases["fuzz"] = time.monotonic() - t0
        report.rss_end = rss_bytes(pid) if b.proc.poll() is None else 0
        good.join()
        report.broker_died = report.broker_died or b.proc.poll() is not None
        if not report.broker_died:
            report.wedged = wait_unwedged(b.bootstrap, TXN_MAX_TIMEOUT_MS / 1000 + 15)
            fuzz_topics = [t for t in partitions_of(b.bootstrap) if t in FUZZ_TOPICS]
            report.final_txn_error = final_transaction(b.bootstrap, [GOOD_TXN, *fuzz_topics])
        report.phases["unwedge+final"] = time.monotonic() - t0 - report.phases["fuzz"]
        report.bad_log_lines = [line for line in log_path.read_text(errors="replace").splitlines()
                                if BAD_LOG.search(line)]
        b.kill()  # kill -9
        b = start_broker(tmp / "data", tmp / "broker-restarted.log", port=b.port,
                         flush_every_append=flush_every_append)
        t1 = time.monotonic()
        check_after_restart(b.bootstrap, report)
        report.phases["restart+read"] = time.monotonic() - t1
        report.bad_log_lines += [line for line in (tmp / "broker-restarted.log").read_text(errors="replace")
                                 .splitlines() if BAD_LOG.search(line)]
    finally:
        b.kill()
    return report

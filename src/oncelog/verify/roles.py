"""The workload's clients, run as threads inside worker processes (``worker_main``).

Three roles, each a loop over real confluent-kafka clients:

- producer ``p<n>``: transactions of 1-4 sends of unique values, 15% aborted on purpose (idempotent
  non-transactional sends with ``--no-txn``);
- copier ``x<n>``: Kafka's transactional copier (consume-transform-produce). A read_committed consumer
  in one group polls the topic; a transactional producer writes a copy of every original value it
  read (``c:<value>@<copier>.<txn>``, to the same partition of the same topic), sends the consumer's
  positions with ``send_offsets_to_transaction`` and commits (10% aborted on purpose, then the
  consumer is rewound). Copies are read back and consumed but never copied again, so copier
  transactions read each other's writes: write-read cycles (G1c) are possible if the broker leaks
  uncommitted data. After each commit and each assignment it reads the group's committed offsets;
- reader ``c<n>``: a read_committed consumer that only polls (even n: manual assignment of every
  partition; odd n: a member of its own group).

Each role writes its operations, as they complete, to its own JSON-lines file; the parent merges them.
Zombie and crash faults arrive on the role's command queue between two transactions.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import queue
import random
import signal
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from oncelog.verify.history import Fault, Offsets, Poll, RoleError, Send, Txn, dump_line

COPY_PREFIX = "c:"

# librdkafka logs fatal errors (a fenced producer) even at log_level 0: the workload provokes them on
# purpose, so they go to a silent logger instead of stderr.
_QUIET = logging.getLogger("oncelog.verify.librdkafka")
_QUIET.addHandler(logging.NullHandler())
log = logging.getLogger("oncelog.verify")
_QUIET.propagate = False


def client_conf(bootstrap: str, **conf: Any) -> dict[str, Any]:
    """Configuration shared by every client of the workload. ``metadata.recovery.strategy=none``:
    when the proxy resets every connection at once, librdkafka >= 2.10 "re-bootstraps" and
    decommissions its coordinators, after which send_offsets_to_transaction and commit_transaction can
    block forever whatever their timeout (librdkafka issues #5456 and #5511); with a single broker
    behind one address nothing is lost by reconnecting to it instead."""
    return {"bootstrap.servers": bootstrap, "log_level": 0, "logger": _QUIET, "metadata.recovery.strategy": "none",
            **conf}


class Stuck(Exception):
    """A client call did not return within its deadline (a client library hang, not a broker answer)."""


def bounded(fn: Callable[[], Any], deadline_s: float) -> Any:
    """Run ``fn`` in a helper thread and give up waiting after ``deadline_s``: the caller then
    abandons the client (a new instance with the same transactional.id fences it and settles its
    transaction) instead of hanging with it."""
    box: dict[str, Any] = {}

    def call() -> None:
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=call, name="bounded-call", daemon=True)
    t.start()
    t.join(deadline_s)
    if t.is_alive():
        raise Stuck(f"no answer within {deadline_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box.get("result")


@dataclass(frozen=True)
class RunSpec:
    bootstrap: str
    topic: str
    seed: int
    txn: bool
    t0: float  # time.monotonic() of the parent at the start of the run (one clock for every process)
    out_dir: str
    prefix: str  # unique per run: transactional ids and group ids start with it
    partitions: int

    @property
    def copier_group(self) -> str:
        return f"{self.prefix}-copier"


@dataclass(frozen=True)
class RoleSpec:
    kind: str  # "producer" | "copier" | "reader"
    index: int

    @property
    def name(self) -> str:
        return {"producer": "p", "copier": "x", "reader": "c"}[self.kind] + str(self.index)

    @property
    def transactional(self) -> bool:
        return self.kind in ("producer", "copier")


# Slots of Controls.counters: what the roles did so far, for the progress line and the fault schedule
# (a broker-kill waits until the writing roles committed again since the last one).
TXNS, POLLS, COPIER_TXNS, PRODUCER_COMMITS, COPIER_COMMITS = range(5)
COUNTERS = 5


@dataclass
class Controls:
    """Shared with the worker processes (multiprocessing primitives, picklable at spawn)."""

    stop_writes: Any  # Event: producers stop after their current transaction
    stop_all: Any  # Event: copiers and readers stop
    commands: dict[str, Any]  # role name -> Queue of "zombie" | "crash"
    done: dict[str, Any]  # role name -> Event set when the role's loop returned
    counters: Any  # Array('q', COUNTERS), indexed by the slots above


class Recorder:
    """Appends one role's operations to its file, a line at a time (line-buffered)."""

    def __init__(self, path: Path, t0: float, counters: Any) -> None:
        self.f = open(path, "a", buffering=1)  # noqa: SIM115
        self.t0 = t0
        self.counters = counters
        self.lock = threading.Lock()

    def ms(self) -> int:
        return int((time.monotonic() - self.t0) * 1000)

    def write(self, kind: str, item: Any) -> None:
        with self.lock:
            self.f.write(dump_line(kind, item))

    def count(self, slot: int) -> None:
        with self.counters.get_lock():
            self.counters[slot] += 1

    def close(self) -> None:
        self.f.close()


def _offset(x: Any) -> int:
    return int(x) if isinstance(x, int) and x >= 0 else -1


def _record(m: Any) -> tuple[int, int, str]:
    raw = m.value()
    value = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
    partition = m.partition()
    return (int(partition) if isinstance(partition, int) else -1), _offset(m.offset()), value


def _reporter(s: Send) -> Callable[[Any, Any], None]:
    def report(err: Any, msg: Any) -> None:
        if err is None:
            # A broker may acknowledge without an offset (the delivery report's offset is None):
            # recorded as -1 and reported by the checker, never trusted.
            s.acked, s.offset = True, _offset(msg.offset())
    return report


def _txn_producer(spec: RunSpec, transactional_id: str, stop: Any) -> Producer:
    p = Producer(client_conf(spec.bootstrap, **{
        "linger.ms": 2, "message.timeout.ms": 10000, "request.timeout.ms": 5000, "socket.timeout.ms": 5000,
        "transactional.id": transactional_id, "transaction.timeout.ms": 10000}))
    deadline = time.monotonic() + 90
    while True:
        try:
            p.init_transactions(20)
            return p
        except KafkaException as exc:
            if not exc.args[0].retriable() or time.monotonic() > deadline:
                raise
            if stop.is_set() and time.monotonic() > deadline - 60:
                raise


def _finish(producer: Producer, abort: bool) -> tuple[str, bool]:
    """Commit (or abort) the open transaction: (outcome, usable). The outcome is "committed",
    "aborted" or "unknown"; ``usable`` is False when the producer must be replaced (a fatal error, no
    answer, retries spent), which settles the transaction either way.

    A transaction whose commit was never requested is "aborted" whatever became of its abort (fenced,
    no answer): without an EndTxn(commit) no coordinator can commit it, and the replacement's
    InitProducerId aborts it. Recording it "unknown" let the checker infer it committed as soon as one
    of its values was read, so a broker that made an aborted transaction visible passed."""
    commit_requested = False
    for _attempt in range(5):
        try:
            if abort:
                bounded(lambda: producer.abort_transaction(20), 60)
                return "aborted", True
            commit_requested = True
            bounded(lambda: producer.commit_transaction(20), 60)
            return "committed", True
        except Stuck:
            break
        except KafkaException as exc:
            err = exc.args[0]
            if err.fatal():
                break
            if err.txn_requires_abort():
                abort = True
                continue
            if not err.retriable():
                break
    return ("unknown" if commit_requested else "aborted"), False


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(Exception):
        fn(*args)


def _take_command(ctl: Controls, name: str) -> str | None:
    q = ctl.commands.get(name)
    if q is None:
        return None
    try:
        return str(q.get_nowait())
    except queue.Empty:
        return None


class _Fence:
    """A zombie or crash fault: a new instance with the same transactional.id replaces the current
    one. "zombie": the successor fences it mid-transaction, then the zombie sends once more and tries
    to commit (both must fail; its transaction is aborted). "crash": the client dies mid-transaction
    (abandoned; aborted by the successor) or, half of the time, right after it asked to commit (the
    EndTxn may or may not have reached the coordinator: the outcome is unknown, and the transaction
    must be all visible or not at all)."""

    def __init__(self, spec: RunSpec, tid: str, ctl: Controls, rec: Recorder, name: str,
                 rng: random.Random) -> None:
        self.spec, self.tid, self.ctl, self.rec, self.name, self.rng = spec, tid, ctl, rec, name, rng

    def _replace_then(self, commit: threading.Thread) -> Producer:
        """Start the replacement's initialisation, then let the old instance's commit go."""
        box: dict[str, Any] = {}
        init = threading.Thread(target=lambda: box.update(p=_txn_producer(self.spec, self.tid, self.ctl.stop_all)),
                                daemon=True)
        init.start()
        time.sleep(self.rng.uniform(0, 0.6))  # initialising takes 0.1-0.6 s here: the EndTxn lands before or after
        commit.start()
        init.join(120)
        if "p" not in box:
            raise Stuck("the replacement producer did not initialise within 120 s")
        producer: Producer = box["p"]
        return producer

    def run(self, kind: str, old: Producer, txn_no: int, sends: list[Send],
            extra: Send | None) -> tuple[Producer, str, int, int]:
        start = self.rec.ms()
        if kind == "crash" and self.rng.random() < 0.5:
            # The dying client's EndTxn and its replacement's InitProducerId race: the commit wins
            # (visible) or the replacement aborts the transaction first (invisible).
            commit = threading.Thread(target=_quietly, args=(old.commit_transaction, 20), daemon=True)
            if self.rng.random() < 0.5:
                successor = self._replace_then(commit)
            else:
                commit.start()
                time.sleep(self.rng.uniform(0, 0.01))
                successor = bounded(lambda: _txn_producer(self.spec, self.tid, self.ctl.stop_all), 120)
            self.rec.write("fault", Fault("crash", start, self.rec.ms(), f"{self.name} txn {txn_no} mid-commit"))
            return successor, "unknown", start, -1
        successor = _txn_producer(self.spec, self.tid, self.ctl.stop_all)
        while self.rec.ms() <= start:
            time.sleep(0.001)
        fenced_ms = self.rec.ms()
        outcome = "aborted"
        if kind == "zombie":
            if extra is not None:
                extra.time_ms = self.rec.ms()
                try:
                    old.produce(self.spec.topic, extra.value.encode(), partition=extra.partition,
                                on_delivery=_reporter(extra))
                    sends.append(extra)
                except (KafkaException, BufferError):
                    pass
            try:
                bounded(lambda: old.commit_transaction(10), 40)
                outcome = "committed"  # a fenced producer's commit acknowledged: zombie-accepted
            except (KafkaException, Stuck):
                outcome = "aborted"
            with contextlib.suppress(Exception):
                old.flush(3)
        self.rec.write("fault", Fault(kind, start, self.rec.ms(), f"{self.name} txn {txn_no}"))
        return successor, outcome, start, fenced_ms


def producer_loop(spec: RunSpec, role: RoleSpec, ctl: Controls, rec: Recorder) -> None:
    rng = random.Random(spec.seed * 1000 + role.index)
    name = role.name
    if not spec.txn:
        _idempotent_loop(spec, role, ctl, rec, rng)
        return
    tid = f"{spec.prefix}-{name}"
    producer = _txn_producer(spec, tid, ctl.stop_all)
    fence = _Fence(spec, tid, ctl, rec, name, random.Random(spec.seed * 1000 + 900 + role.index))
    txn_no = 0
    while not ctl.stop_writes.is_set():
        txn_no += 1
        sends: list[Send] = []
        try:
            producer.begin_transaction()
        except KafkaException:
            producer = _txn_producer(spec, tid, ctl.stop_all)
            continue
        for j in range(rng.randint(1, 4)):
            s = Send(name, txn_no, f"{name}-{txn_no}-{j}", rng.randrange(spec.partitions), time_ms=rec.ms())
            try:
                producer.produce(spec.topic, s.value.encode(), partition=s.partition, on_delivery=_reporter(s))
            except (KafkaException, BufferError):
                break
            sends.append(s)
            if rng.random() < 0.3:
                # a separate request: concurrent transactions' writes interleave in the partitions
                with contextlib.suppress(KafkaException):
                    producer.flush(5)
        with contextlib.suppress(KafkaException):
            producer.flush(20)
        fenced_ms = -1
        command = _take_command(ctl, name)
        if command in ("zombie", "crash"):
            extra = Send(name, txn_no, f"{name}-{txn_no}-z", rng.randrange(spec.partitions))
            producer, outcome, start, fenced_ms = fence.run(command, producer, txn_no, sends, extra)
        else:
            start = rec.ms()
            outcome, usable = _finish(producer, rng.random() < 0.15)
            if not usable:
                # A new instance fences this one and settles the transaction either way.
                producer = _txn_producer(spec, tid, ctl.stop_all)
        for s in sends:
            rec.write("send", s)
        rec.write("txn", Txn(name, txn_no, outcome, start, rec.ms(), [s.value for s in sends],
                             fenced_ms=fenced_ms))
        rec.count(TXNS)
        if outcome == "committed" and fenced_ms < 0:
            rec.count(PRODUCER_COMMITS)


def _idempotent_loop(spec: RunSpec, role: RoleSpec, ctl: Controls, rec: Recorder, rng: random.Random) -> None:
    name = role.name
    producer = Producer(client_conf(spec.bootstrap, **{
        "linger.ms": 2, "message.timeout.ms": 10000, "request.timeout.ms": 5000, "socket.timeout.ms": 5000,
        "enable.idempotence": True, "acks": "all"}))
    n = 0
    while not ctl.stop_writes.is_set():
        sends = []
        for _ in range(rng.randint(1, 4)):
            s = Send(name, -1, f"{name}-{n}", rng.randrange(spec.partitions), time_ms=rec.ms())
            n += 1
            try:
                producer.produce(spec.topic, s.value.encode(), partition=s.partition, on_delivery=_reporter(s))
            except (KafkaException, BufferError):
                break
            sends.append(s)
        producer.flush(20)
        for s in sends:
            rec.write("send", s)
        rec.count(TXNS)
        if any(s.acked for s in sends):
            rec.count(PRODUCER_COMMITS)
    producer.flush(20)


class _Copier:
    def __init__(self, spec: RunSpec, role: RoleSpec, ctl: Controls, rec: Recorder) -> None:
        self.spec, self.role, self.ctl, self.rec = spec, role, ctl, rec
        self.name = role.name
        self.tid = f"{spec.prefix}-{self.name}"
        self.rng = random.Random(spec.seed * 1000 + 500 + role.index)
        self.session = 0
        self.pending_assign: set[int] = set()
        # Where each partition's next read must start, where the copier knows it (see ``_moved_back``).
        self.expected: dict[int, int] = {}
        self.consumer = self._consumer()
        self.producer = _txn_producer(spec, self.tid, ctl.stop_all)
        self.fence = _Fence(spec, self.tid, ctl, rec, self.name, random.Random(spec.seed * 1000 + 950 + role.index))

    def _consumer(self) -> Consumer:
        c = Consumer(client_conf(self.spec.bootstrap, **{
            "group.id": self.spec.copier_group, "isolation.level": "read_committed", "enable.auto.commit": False,
            "auto.offset.reset": "earliest", "session.timeout.ms": 10000, "heartbeat.interval.ms": 1000}))

        def on_assign(_consumer: Any, partitions: Any) -> None:
            self.session += 1
            self.pending_assign = {tp.partition for tp in partitions}
            self.expected = {}

        def on_revoke(_consumer: Any, _partitions: Any) -> None:
            self.session += 1
            self.pending_assign = set()
            self.expected = {}

        c.subscribe([self.spec.topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    @property
    def session_key(self) -> str:
        return f"{self.name}.{self.session}"

    def observe(self, after: str, partitions: set[int]) -> None:
        """Read the group's committed offsets (librdkafka asks for stable offsets at read_committed)."""
        if not partitions:
            return
        start = self.rec.ms()
        try:
            got = self.consumer.committed([TopicPartition(self.spec.topic, p) for p in sorted(partitions)], 10)
        except KafkaException:
            return
        offsets = {int(tp.partition): _offset(tp.offset) for tp in got if tp.error is None}
        if after == "assign":
            self.expected.update({p: o for p, o in offsets.items() if o >= 0 and p not in self.expected})
        if offsets:
            self.rec.write("offsets", Offsets(self.name, self.spec.copier_group, start, self.rec.ms(), after,
                                              offsets, self.session_key))

    def rewind(self, first: dict[int, int]) -> dict[int, int]:
        """An aborted transaction's input must be consumed again: seek back to where it started. The
        partitions sought (the next reads of each, in the new session, must start there)."""
        self.session += 1
        sought = {}
        for p, o in first.items():
            try:
                self.consumer.seek(TopicPartition(self.spec.topic, p, o))
                sought[p] = o
            except KafkaException:
                pass  # no longer assigned: the next owner resumes from the committed offset
        self.expected.update(sought)
        return sought

    def _moved_back(self, first: dict[int, int]) -> bool:
        """The consumer's position went back by itself: a read starts below where the copier knows
        the partition stands (after a commit, a rewind or the assignment's committed offset). Seen
        with librdkafka 2.16 (probe s36): an offset lookup (auto.offset.reset) whose answer comes
        after a rebalance or a seek is out of date, yet arms a 500 ms timer that looks the offset up
        again in any state and moves an active partition back to it, undoing the copier's seek; the
        copier then copied its input twice. Kafka's Java consumer has no such path. The records are
        dropped and every partition read is sought back to where it stood (a later read may start
        above it: aborted records and markers are skipped under read_committed)."""
        back = {p: self.expected[p] for p, o in first.items() if p in self.expected and o < self.expected[p]}
        if not back:
            return False
        log.warning("%s: the consumer's position moved back by itself (%s): sought again, nothing copied", self.name,
                    ", ".join(f"partition {p} read from {first[p]}, not {o}" for p, o in sorted(back.items())))
        for p, o in first.items():
            with contextlib.suppress(KafkaException):
                self.consumer.seek(TopicPartition(self.spec.topic, p, back.get(p, o)))
        return True

    def restart(self) -> None:
        """After an unknown outcome or a producer that failed: new instances settle the transaction
        (fencing the old producer) and resume from whatever offsets the group committed."""
        self.session += 1
        with contextlib.suppress(Exception):
            self.consumer.close()
        self.pending_assign = set()
        self.expected = {}
        self.producer = _txn_producer(self.spec, self.tid, self.ctl.stop_all)
        self.consumer = self._consumer()

    def step(self, txn_no: int) -> bool:
        try:
            msgs = self.consumer.consume(100, 0.3)
        except KafkaException:
            return False
        records = [_record(m) for m in msgs if m.error() is None]
        if self.pending_assign:
            pending, self.pending_assign = self.pending_assign, set()
            self.observe("assign", pending)
        if not records:
            return False
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for p, o, _v in records:
            if p >= 0 and o >= 0:
                first[p] = min(first.get(p, o), o)
                last[p] = max(last.get(p, o), o)
        if self._moved_back(first):
            return False
        spec, rec = self.spec, self.rec
        rec.write("poll", Poll(self.session_key, rec.ms(), records, txn_process=self.name, txn=txn_no))
        rec.count(POLLS)
        sends: list[Send] = []
        offsets: dict[int, int] = {}
        outcome = ""
        replace = False  # the producer must be replaced (which settles the transaction)
        start = rec.ms()
        fenced_ms = -1
        try:
            self.producer.begin_transaction()
            for p, o, v in records:
                if v.startswith(COPY_PREFIX) or p < 0 or o < 0:
                    continue
                s = Send(self.name, txn_no, f"{COPY_PREFIX}{v}@{self.name}.{txn_no}", p, time_ms=rec.ms(),
                         source=v)
                self.producer.produce(spec.topic, s.value.encode(), partition=p, on_delivery=_reporter(s))
                sends.append(s)
            self.producer.flush(20)
            positions = self.consumer.position([TopicPartition(spec.topic, p) for p in sorted(last)])
            offsets = {int(tp.partition): int(tp.offset) for tp in positions if tp.offset >= 0}
            producer, group = self.producer, self.consumer.consumer_group_metadata()
            bounded(lambda: producer.send_offsets_to_transaction(
                [tp for tp in positions if tp.offset >= 0], group, 20), 60)
        except Stuck:
            # No commit was requested: the replacement's InitProducerId aborts the transaction.
            outcome, replace = "aborted", True
        except (KafkaException, BufferError):
            outcome, usable = _finish(self.producer, True)
            replace = not usable
        if not outcome:
            command = _take_command(self.ctl, self.name)
            if command in ("zombie", "crash"):
                self.producer, outcome, start, fenced_ms = self.fence.run(command, self.producer, txn_no, sends,
                                                                          None)
            else:
                start = rec.ms()
                outcome, usable = _finish(self.producer, self.rng.random() < 0.1)
                replace = not usable
        end = rec.ms()
        committed = outcome == "committed" and fenced_ms < 0
        restart = outcome == "unknown" or replace
        rewound = {} if committed or restart else self.rewind(first)
        for s in sends:
            rec.write("send", s)
        rec.write("txn", Txn(self.name, txn_no, outcome, start, end, [s.value for s in sends],
                             group=spec.copier_group, offsets=offsets, fenced_ms=fenced_ms, rewound=rewound,
                             rewind_session=self.session_key if rewound else ""))
        rec.count(TXNS)
        rec.count(COPIER_TXNS)
        if committed:
            rec.count(COPIER_COMMITS)
            self.expected.update({p: o + 1 for p, o in last.items()})
            self.observe("commit", set(last))
        elif restart:
            self.restart()
        return True

    def run(self) -> None:
        txn_no = 0
        while not self.ctl.stop_all.is_set():
            if self.step(txn_no + 1):
                txn_no += 1
        with contextlib.suppress(Exception):
            self.consumer.close()


def copier_loop(spec: RunSpec, role: RoleSpec, ctl: Controls, rec: Recorder) -> None:
    _Copier(spec, role, ctl, rec).run()


def reader_loop(spec: RunSpec, role: RoleSpec, ctl: Controls, rec: Recorder) -> None:
    group = role.index % 2 == 1
    generation = [0]
    c = Consumer(client_conf(spec.bootstrap, **{
        "group.id": f"{spec.prefix}-g{role.index}", "isolation.level": "read_committed", "enable.auto.commit": group,
        "auto.offset.reset": "earliest", "session.timeout.ms": 10000}))

    def on_assign(_consumer: Any, _partitions: Any) -> None:
        generation[0] += 1

    if group:
        c.subscribe([spec.topic], on_assign=on_assign)
    else:
        c.assign([TopicPartition(spec.topic, p, 0) for p in range(spec.partitions)])
    catch_up_until = 0.0
    while True:
        if ctl.stop_all.is_set():
            now = time.monotonic()
            catch_up_until = catch_up_until or now + READER_CATCH_UP_S
            if now > catch_up_until or _caught_up(c, spec.topic):
                break
        try:
            msgs = c.consume(100, 0.2)
        except KafkaException:
            continue
        records = [_record(m) for m in msgs if m.error() is None]
        if records:
            session = f"{role.name}.g{generation[0]}" if group else role.name
            rec.write("poll", Poll(session, rec.ms(), records))
            rec.count(POLLS)
    with contextlib.suppress(Exception):
        c.close()


READER_CATCH_UP_S = 45.0
"""After the workload stops, a reader reads on until it has reached the end of its partitions (a reader
that joined its group late, under faults, would otherwise stop having checked nothing), for at most
this long."""


def _caught_up(c: Consumer, topic: str) -> bool:
    """True when ``c`` has partitions and its position on each is at least the partition's end as its
    isolation level sees it (the last stable offset at read_committed): nothing is left to read."""
    try:
        assigned = [tp for tp in c.assignment() if tp.topic == topic]
        if not assigned:
            return False
        for tp in c.position(assigned):
            _low, end = c.get_watermark_offsets(tp, timeout=5, cached=False)
            if tp.offset < 0 or tp.offset < end:
                return False
    except KafkaException:
        return False
    return True


LOOPS: dict[str, Callable[[RunSpec, RoleSpec, Controls, Recorder], None]] = {
    "producer": producer_loop, "copier": copier_loop, "reader": reader_loop}


def run_role(spec: RunSpec, role: RoleSpec, ctl: Controls) -> None:
    rec = Recorder(Path(spec.out_dir) / f"{role.name}.jsonl", spec.t0, ctl.counters)
    try:
        LOOPS[role.kind](spec, role, ctl, rec)
    except BaseException as exc:  # recorded for the parent: the run did not complete as planned
        detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        rec.write("error", RoleError(role.name, rec.ms(), detail))
    finally:
        rec.close()
        ctl.done[role.name].set()


def worker_main(spec: RunSpec, roles: list[RoleSpec], ctl: Controls) -> None:
    """Entry point of one worker process: its roles run as threads. SIGUSR1 dumps every thread's stack
    to ``<out_dir>/<first role>.stack`` (the parent asks before terminating a worker that hangs)."""
    stacks = open(Path(spec.out_dir) / f"{roles[0].name}.stack", "w")  # noqa: SIM115 (lives with the process)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    threads = [threading.Thread(target=run_role, args=(spec, role, ctl), name=role.name, daemon=True)
               for role in roles]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stacks.close()
    # Every role closed its file. Leave without running client destructors: a client abandoned in a
    # hung call (``bounded``) could block the interpreter's exit.
    os._exit(0)

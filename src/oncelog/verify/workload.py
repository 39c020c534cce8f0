"""The verify workload: real clients (confluent-kafka) against any Kafka broker, under faults.

Transactional producers send unique values in transactions of 1-4 sends, commit most and abort some
on purpose; read_committed consumers (manual assignment and a consumer group) poll concurrently; a
final reader reads every partition to its end. Every operation lands in a ``History``.

Faults (chosen from ``faults``, scheduled by a seeded RNG): ``drop`` (the proxy drops responses to
Produce/EndTxn/AddPartitionsToTxn after the broker processed them), ``reset`` (connections reset),
``delay`` (responses delayed), ``zombie`` (a second producer with the same transactional id fences the
first mid-transaction; the old one then tries to commit), ``crash`` (a producer is abandoned
mid-transaction and replaced), ``broker-kill`` / ``broker-pause`` (SIGKILL + restart / SIGSTOP of the
broker process, only when verify started it).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.verify.history import Fault, History, Poll, Send, Txn
from oncelog.verify.proxy import API_ADD_PARTITIONS_TO_TXN, API_END_TXN, API_PRODUCE, FaultProxy

ALL_FAULTS = ("drop", "reset", "delay", "zombie", "crash", "broker-kill", "broker-pause")
PARTITIONS = 3


def _record(m: Any) -> tuple[int, int, str]:
    return int(m.partition()), int(m.offset()), (m.value() or b"").decode()


class WorkloadError(Exception):
    """The workload itself could not run (exit code 2)."""


@dataclass
class BrokerControl:
    kill_and_restart: Callable[[], None]
    pause: Callable[[float], None]


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def ms(self) -> int:
        return int((time.monotonic() - self.t0) * 1000)


class Workload:
    def __init__(self, bootstrap: str, *, duration_s: float, seed: int, faults: set[str], txn: bool = True,
                 proxy: FaultProxy | None = None, broker: BrokerControl | None = None,
                 producers: int = 2, consumers: int = 2,
                 progress: Callable[[str], None] | None = None) -> None:
        self.bootstrap = bootstrap
        self.duration_s = duration_s
        self.rng = random.Random(seed)
        self.seed = seed
        self.faults = faults
        self.txn = txn
        self.proxy = proxy
        self.broker = broker
        self.n_producers = producers
        self.n_consumers = consumers
        self.progress = progress or (lambda _s: None)
        self.history = History(meta={"seed": seed, "faults": sorted(faults), "duration_s": duration_s})
        self.clock = Clock()
        self.topic = f"verify-{seed}-{int(time.time())}"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.zombie_requests: set[int] = set()
        self.crash_requests: set[int] = set()

    # --- setup -----------------------------------------------------------------------------------
    def _create_topic(self) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
        try:
            # Fail fast (exit 2) on an unreachable broker instead of waiting out the create timeout;
            # a broker started by --broker-cmd is already listening when we get here.
            admin.list_topics(timeout=8)
        except Exception as exc:
            raise WorkloadError(f"cannot reach the broker at {self.bootstrap}: {exc}") from exc
        try:
            admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])[self.topic].result(timeout=30)
        except KafkaException as exc:
            raise WorkloadError(f"cannot create topic {self.topic}: {exc.args[0].str()}") from exc
        except Exception as exc:
            raise WorkloadError(f"cannot reach the broker at {self.bootstrap}: {exc}") from exc

    def _producer(self, index: int) -> Producer:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "linger.ms": 2, "log_level": 0,
                                "message.timeout.ms": 10000, "request.timeout.ms": 5000,
                                "socket.timeout.ms": 5000}
        if self.txn:
            conf.update({"transactional.id": f"verify-{self.seed}-{index}", "transaction.timeout.ms": 10000})
        else:
            conf.update({"enable.idempotence": True, "acks": "all"})
        p = Producer(conf)
        if self.txn:
            deadline = time.monotonic() + 60
            while True:
                try:
                    p.init_transactions(20)
                    break
                except KafkaException as exc:
                    if not exc.args[0].retriable() or time.monotonic() > deadline:
                        raise
        return p

    # --- producers -------------------------------------------------------------------------------
    def _produce_loop(self, index: int) -> None:
        rng = random.Random(self.seed * 1000 + index)
        name = f"p{index}"
        producer = self._producer(index)
        txn_no = 0
        while not self.stop.is_set():
            txn_no += 1
            values = [f"{name}-{txn_no}-{j}" for j in range(rng.randint(1, 4))]
            sends = [Send(name, txn_no if self.txn else -1, v, rng.randrange(PARTITIONS), time_ms=self.clock.ms())
                     for v in values]

            def reporter(s: Send) -> Callable[[Any, Any], None]:
                def report(err: Any, msg: Any) -> None:
                    if err is None:
                        s.acked, s.offset = True, msg.offset()
                return report

            try:
                if self.txn:
                    producer.begin_transaction()
                for s in sends:
                    producer.produce(self.topic, s.value.encode(), key=str(s.partition).encode(),
                                     partition=s.partition, on_delivery=reporter(s))
                producer.flush(20)
            except (KafkaException, BufferError):
                pass
            with self.lock:
                self.history.sends.extend(sends)
            if not self.txn:
                continue
            with self.lock:
                zombie = index in self.zombie_requests
                crash = index in self.crash_requests
                self.zombie_requests.discard(index)
                self.crash_requests.discard(index)
            if zombie or crash:
                successor = self._producer(index)  # fences this one and aborts its transaction
                start = self.clock.ms()
                if zombie:
                    try:
                        producer.commit_transaction(10)
                        outcome = "committed"  # the broker let a fenced producer commit: checker will see it
                    except KafkaException:
                        outcome = "aborted"
                else:
                    outcome = "aborted"
                self._record_txn(name, txn_no, outcome, start, values)
                self._fault("zombie" if zombie else "crash", start, self.clock.ms(), f"{name} txn {txn_no}")
                producer = successor
                continue
            start = self.clock.ms()
            outcome = self._finish(producer, rng.random() < 0.15)
            if outcome == "fatal":
                producer = self._producer(index)
                outcome = "unknown"
            self._record_txn(name, txn_no, outcome, start, values)

    def _finish(self, producer: Producer, abort: bool) -> str:
        for _attempt in range(5):
            try:
                if abort:
                    producer.abort_transaction(20)
                    return "aborted"
                producer.commit_transaction(20)
                return "committed"
            except KafkaException as exc:
                err = exc.args[0]
                if err.fatal():
                    return "fatal"
                if err.txn_requires_abort():
                    abort = True
                    continue
                if not err.retriable():
                    return "unknown"
        return "unknown"

    def _record_txn(self, name: str, txn_no: int, outcome: str, start: int, values: list[str]) -> None:
        with self.lock:
            self.history.txns.append(Txn(name, txn_no, outcome, start, self.clock.ms(), values))

    def _fault(self, kind: str, start: int, end: int, detail: str = "") -> None:
        with self.lock:
            self.history.faults.append(Fault(kind, start, end, detail))

    # --- consumers -------------------------------------------------------------------------------
    def _consume_loop(self, index: int) -> None:
        group = index % 2 == 1
        generation = [0]
        conf = {"bootstrap.servers": self.bootstrap, "group.id": f"verify-{self.seed}-g{index}",
                "isolation.level": "read_committed", "enable.auto.commit": group, "auto.offset.reset": "earliest",
                "log_level": 0, "session.timeout.ms": 10000}
        c = Consumer(conf)

        def on_assign(consumer: Any, partitions: Any) -> None:
            generation[0] += 1

        if group:
            c.subscribe([self.topic], on_assign=on_assign)
        else:
            c.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        while not self.stop.is_set():
            try:
                msgs = c.consume(100, 0.2)
            except KafkaException:
                continue
            records = [_record(m) for m in msgs if m.error() is None]
            if records:
                with self.lock:
                    self.history.polls.append(Poll(f"c{index}-g{generation[0]}", self.clock.ms(), records))
        c.close()

    def _final_read(self) -> None:
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"verify-{self.seed}-final",
                      "isolation.level": "read_committed", "enable.auto.commit": False, "log_level": 0})
        ends = {}
        deadline = time.monotonic() + 60
        for p in range(PARTITIONS):
            while True:
                try:
                    ends[p] = c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                    break
                except KafkaException:
                    if time.monotonic() > deadline:
                        raise WorkloadError("cannot read the end offsets for the final read") from None
        c.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        records = []
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < PARTITIONS and time.monotonic() < deadline:
            for m in c.consume(500, 0.5):
                if m.error() is None:
                    records.append(_record(m))
            for p in range(PARTITIONS):
                pos = c.position([TopicPartition(self.topic, p)])[0].offset
                if pos >= ends[p]:
                    done.add(p)
        c.close()
        if len(done) < PARTITIONS:
            raise WorkloadError("the final read did not reach the end of every partition")
        with self.lock:
            self.history.polls.append(Poll("final", self.clock.ms(), records, final=True))

    # --- faults ----------------------------------------------------------------------------------
    def _fault_loop(self) -> None:
        kinds = [f for f in self.faults if f in ALL_FAULTS]
        if not kinds:
            return
        while not self.stop.wait(self.rng.uniform(0.8, 2.0)):
            kind = self.rng.choice(kinds)
            start = self.clock.ms()
            if kind == "drop" and self.proxy is not None:
                api = self.rng.choice([API_PRODUCE, API_PRODUCE, API_END_TXN, API_ADD_PARTITIONS_TO_TXN])
                self.proxy.drop_responses(api, 2, probability=0.7)
                self._fault("drop", start, start + 500, f"api {api}")
            elif kind == "reset" and self.proxy is not None:
                self.proxy.reset_connections()
                self._fault("reset", start, start + 50)
            elif kind == "delay" and self.proxy is not None:
                self.proxy.set_delay_ms(150)
                time.sleep(0.8)
                self.proxy.set_delay_ms(0)
                self._fault("delay", start, self.clock.ms(), "150 ms")
            elif kind == "zombie" and self.txn:
                with self.lock:
                    self.zombie_requests.add(self.rng.randrange(self.n_producers))
            elif kind == "crash" and self.txn:
                with self.lock:
                    self.crash_requests.add(self.rng.randrange(self.n_producers))
            elif kind == "broker-kill" and self.broker is not None:
                self.broker.kill_and_restart()
                self._fault("broker-kill", start, self.clock.ms(), "SIGKILL + restart")
            elif kind == "broker-pause" and self.broker is not None:
                self.broker.pause(1.0)
                self._fault("broker-pause", start, self.clock.ms(), "SIGSTOP 1 s")

    # --- run -------------------------------------------------------------------------------------
    def run(self) -> History:
        self._create_topic()
        errors: list[BaseException] = []

        def guard(fn: Callable[..., None], *args: Any) -> Callable[[], None]:
            def run() -> None:
                try:
                    fn(*args)
                except BaseException as exc:
                    errors.append(exc)
            return run

        threads = [threading.Thread(target=guard(self._produce_loop, i), daemon=True) for i in range(self.n_producers)]
        threads += [threading.Thread(target=guard(self._consume_loop, i), daemon=True) for i in range(self.n_consumers)]
        fault_thread = threading.Thread(target=guard(self._fault_loop), daemon=True)
        for t in threads:
            t.start()
        fault_thread.start()
        end = time.monotonic() + self.duration_s
        while time.monotonic() < end:
            time.sleep(0.5)
            self.progress(f"{len(self.history.txns)} transactions, {len(self.history.polls)} polls, "
                          f"{len(self.history.faults)} faults")
        self.stop.set()
        fault_thread.join(30)
        if self.proxy is not None:
            self.proxy.clear()
        for t in threads:
            t.join(60)
        if errors and not self.history.txns:
            raise WorkloadError(f"the workload failed: {errors[0]!r}")
        self.progress("final read of every partition")
        self._final_read()
        if not any(t.outcome == "committed" for t in self.history.txns) and self.txn:
            raise WorkloadError("no transaction committed: the broker does not support transactions?")
        return self.history

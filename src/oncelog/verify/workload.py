"""The verify workload: real clients (confluent-kafka) against any Kafka broker, under faults.

Producers, consume-transform-produce copiers and read-only consumers (``roles.py``) run as threads in
several worker processes (multiprocessing, spawn); this process runs the fault proxy, the fault
schedule and, at the end, the drain and the final read. Phases:

1. for ``duration_s``: every role runs; faults are injected by a seeded schedule;
2. faults stop, the producers finish their current transaction and stop;
3. drain: the copiers run until their group's committed offsets have passed every record
   (a read_committed read from the committed offsets to the end finds nothing), or ``drain_s``;
4. copiers stop; readers read on to the end of their partitions (``READER_CATCH_UP_S`` at most) and
   stop; a final reader reads every partition to its end (the LSO);
5. the roles' files are merged into one ``History``.

Faults (chosen from ``faults``): ``drop`` (the proxy drops responses to Produce/EndTxn/
AddPartitionsToTxn after the broker processed them), ``reset`` (connections reset), ``delay``
(responses delayed), ``zombie`` (a second instance with the same transactional id fences a producer
or copier mid-transaction; the old one then sends and tries to commit), ``crash`` (a producer or
copier is abandoned mid-transaction and replaced), ``broker-kill`` / ``broker-pause`` (SIGKILL +
restart / SIGSTOP of the broker process, only when verify started it).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from pathlib import Path

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from oncelog.verify.history import Fault, History, HistoryError, Poll, parse_line
from oncelog.verify.proxy import API_ADD_PARTITIONS_TO_TXN, API_END_TXN, API_PRODUCE, FaultProxy
from oncelog.verify.roles import (
    COPIER_COMMITS,
    COPIER_TXNS,
    COUNTERS,
    POLLS,
    PRODUCER_COMMITS,
    TXNS,
    Controls,
    RoleSpec,
    RunSpec,
    _record,
    client_conf,
    worker_main,
)

NETWORK_FAULTS = ("drop", "reset", "delay")  # made by the fault proxy
CLIENT_FAULTS = ("zombie", "crash")  # made by the transactional clients themselves
BROKER_FAULTS = ("broker-kill", "broker-pause")  # made to the broker process verify started
ALL_FAULTS = (*NETWORK_FAULTS, *CLIENT_FAULTS, *BROKER_FAULTS)
PARTITIONS = 3


def default_faults(*, proxy: bool, txn: bool) -> set[str]:
    """The faults a run makes when none are named: the network ones through the proxy, zombies and
    crashes of transactional clients (the broker's are opt-in: they need --broker-cmd)."""
    return {*(NETWORK_FAULTS if proxy else ()), *(CLIENT_FAULTS if txn else ())}


def unrunnable_faults(faults: set[str], *, proxy: bool, broker: bool, txn: bool) -> list[str]:
    """Why some of ``faults`` cannot be made in this configuration (empty: all of them can). Such a
    request is refused before the run starts: it used to be skipped silently, and the run's title
    named faults that never happened."""
    why = []
    chosen = set(faults)
    if not proxy and (network := sorted(chosen & set(NETWORK_FAULTS))):
        why.append(f"{','.join(network)} need the fault proxy (not with --no-proxy)")
    if not broker and (brokers := sorted(chosen & set(BROKER_FAULTS))):
        why.append(f"{','.join(brokers)} need a broker that verify starts itself (--broker-cmd, not --bootstrap)")
    if not txn and (clients := sorted(chosen & set(CLIENT_FAULTS))):
        why.append(f"{','.join(clients)} replace transactional clients (not with --no-txn)")
    return why


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


def plan_processes(roles: list[RoleSpec], processes: int) -> list[list[RoleSpec]]:
    """Spread the roles over ``processes`` workers, interleaving kinds so each worker has a mix."""
    by_kind: dict[str, list[RoleSpec]] = {}
    for r in roles:
        by_kind.setdefault(r.kind, []).append(r)
    interleaved: list[RoleSpec] = []
    while any(by_kind.values()):
        for kind in list(by_kind):
            if by_kind[kind]:
                interleaved.append(by_kind[kind].pop(0))
    n = max(1, min(processes, len(interleaved)))
    size = -(-len(interleaved) // n)
    return [interleaved[i:i + size] for i in range(0, len(interleaved), size)]


class Workload:
    DROP_WINDOW_S = 0.5  # how long a drop fault's rule stays armed
    FAULT_INTERVAL_S = (0.8, 2.0)  # the pause before each fault, drawn uniformly
    PROGRESS_WAIT_S = 30.0  # the longest a broker-kill waits for the roles to commit again

    def __init__(self, bootstrap: str, *, duration_s: float, seed: int, faults: set[str], txn: bool = True,
                 proxy: FaultProxy | None = None, broker: BrokerControl | None = None,
                 producers: int = 3, copiers: int = 2, consumers: int = 2, processes: int = 3,
                 drain_s: float = 90.0, display_bootstrap: str | None = None,
                 progress: Callable[[str], None] | None = None) -> None:
        self.bootstrap = bootstrap
        self.display_bootstrap = display_bootstrap or bootstrap
        self.duration_s = duration_s
        self.rng = random.Random(seed)
        self.seed = seed
        why = unrunnable_faults(faults, proxy=proxy is not None, broker=broker is not None, txn=txn)
        if why:
            raise WorkloadError("cannot make the requested faults: " + "; ".join(why))
        self.faults = faults
        self.txn = txn
        self.proxy = proxy
        self.broker = broker
        self.roles = ([RoleSpec("producer", i) for i in range(producers)] +
                      [RoleSpec("copier", i) for i in range(copiers if txn else 0)] +
                      [RoleSpec("reader", i) for i in range(consumers)])
        self.processes = processes
        self.drain_s = drain_s
        self.stall_s = min(drain_s, 30.0)  # a transaction left open times out within 10 s (+ a scan)
        self.progress = progress or (lambda _s: None)
        stamp = int(time.time() * 1000)
        self.topic = f"verify-{seed}-{stamp}"
        self.prefix = f"verify-{seed}-{stamp}"
        self.history = History(meta={"seed": seed, "faults": sorted(faults), "duration_s": duration_s,
                                     "topic": self.topic, "roles": [r.name for r in self.roles],
                                     "processes": 0})
        self.clock = Clock()
        self.stop = threading.Event()
        self.fault_errors: list[str] = []

    # --- setup -----------------------------------------------------------------------------------
    def _create_topic(self) -> None:
        admin = AdminClient(client_conf(self.bootstrap))
        try:
            # Fail fast (exit 2) on an unreachable broker instead of waiting out the create timeout;
            # a broker started by --broker-cmd is already listening when we get here.
            admin.list_topics(timeout=8)
        except Exception as exc:
            raise WorkloadError(f"cannot reach the broker at {self.display_bootstrap}: {_kafka_text(exc)}") from exc
        try:
            admin.create_topics([NewTopic(self.topic, PARTITIONS, 1)])[self.topic].result(timeout=30)
        except Exception as exc:
            raise WorkloadError(f"cannot create topic {self.topic} on {self.display_bootstrap}: "
                                f"{_kafka_text(exc)}") from exc

    # --- faults ----------------------------------------------------------------------------------
    def _fault(self, kind: str, start: int, end: int, detail: str = "") -> None:
        self.history.faults.append(Fault(kind, start, end, detail))

    def _commits(self, controls: Controls) -> tuple[int, int]:
        """Commits so far by the producers (acknowledged writes with --no-txn) and by the copiers."""
        return int(controls.counters[PRODUCER_COMMITS]), int(controls.counters[COPIER_COMMITS])

    def _progressed(self, controls: Controls, mark: tuple[int, int]) -> bool:
        """Every kind of writing role in the run committed since ``mark``."""
        producers, copiers = self._commits(controls)
        has_copiers = any(r.kind == "copier" for r in self.roles)
        return producers > mark[0] and (copiers > mark[1] or not has_copiers)

    def _fault_loop(self, controls: Controls) -> None:
        """A fault every FAULT_INTERVAL_S, of a kind drawn from the run's faults. A broker-kill waits
        until the producers and the copiers committed since the previous one (at most
        PROGRESS_WAIT_S): a restarted broker has lost its groups, and the copier group takes the
        broker's initial rebalance delay (3 s) and more to form again, so kills every 2-3 s left the
        copiers no transaction under faults in 15 of 16 runs. Other kinds go on meanwhile."""
        kinds = sorted(f for f in self.faults if f in ALL_FAULTS)
        targets = [r.name for r in self.roles if r.transactional]
        if not kinds:
            return
        mark, since = self._commits(controls), time.monotonic()
        while not self.stop.wait(self.rng.uniform(*self.FAULT_INTERVAL_S)):
            choices = kinds
            if ("broker-kill" in kinds and time.monotonic() - since < self.PROGRESS_WAIT_S
                    and not self._progressed(controls, mark)):
                choices = [k for k in kinds if k != "broker-kill"]
                if not choices:
                    continue
            kind = self.rng.choice(choices)
            start = self.clock.ms()
            try:
                self._inject(kind, start, controls, targets)
            except Exception as exc:  # a fault that cannot be injected makes the run incomplete
                self.fault_errors.append(f"fault {kind}: {exc}")
                return
            if kind == "broker-kill":
                mark, since = self._commits(controls), time.monotonic()

    def _inject(self, kind: str, start: int, controls: Controls, targets: list[str]) -> None:
        """Make one fault and record it, only if it happened: a fault that cannot be made raises (the
        run is then incomplete), and a drop that found no response to drop is not counted."""
        if kind == "drop" and self.proxy is not None:
            # EndTxn and AddPartitionsToTxn exist only in transactional runs.
            apis = [API_PRODUCE, API_PRODUCE, *((API_END_TXN, API_ADD_PARTITIONS_TO_TXN) if self.txn else ())]
            api = self.rng.choice(apis)
            before = self.proxy.stats.dropped_by_api.get(api, 0)
            self.proxy.drop_responses(api, 2, probability=0.7)
            time.sleep(self.DROP_WINDOW_S)
            self.proxy.stop_dropping(api)
            dropped = self.proxy.stats.dropped_by_api.get(api, 0) - before
            if dropped:
                self._fault("drop", start, self.clock.ms(), f"api {api}: {dropped} response(s) dropped")
        elif kind == "reset" and self.proxy is not None:
            self.proxy.reset_connections()
            self._fault("reset", start, start + 50)
        elif kind == "delay" and self.proxy is not None:
            self.proxy.set_delay_ms(150)
            time.sleep(0.8)
            self.proxy.set_delay_ms(0)
            self._fault("delay", start, self.clock.ms(), "150 ms")
        elif kind in ("zombie", "crash") and self.txn and targets:
            controls.commands[self.rng.choice(targets)].put(kind)  # the role records the fault
        elif kind == "broker-kill" and self.broker is not None:
            self.broker.kill_and_restart()
            self._fault("broker-kill", start, self.clock.ms(), "SIGKILL + restart")
        elif kind == "broker-pause" and self.broker is not None:
            self.broker.pause(1.0)
            self._fault("broker-pause", start, self.clock.ms(), "SIGSTOP 1 s")
        else:  # refused up front (unrunnable_faults); never skipped silently
            raise WorkloadError(f"{kind} cannot be made in this run")

    # --- end of run ------------------------------------------------------------------------------
    def _consumer(self, group: str) -> Consumer:
        return Consumer(client_conf(self.bootstrap, **{"group.id": group, "isolation.level": "read_committed",
                                                       "enable.auto.commit": False}))

    def _read_range(self, start: dict[int, int], deadline_s: float,
                    label: str) -> tuple[list[tuple[int, int, str]], dict[int, int]]:
        """Read every partition from ``start`` (-1: the beginning) to its end (the LSO) at read_committed:
        the records, and the end offsets it read up to (every offset below them was read)."""
        c = self._consumer(f"{self.prefix}-{label}")
        try:
            deadline = time.monotonic() + deadline_s
            ends: dict[int, int] = {}
            for p in range(PARTITIONS):
                while True:
                    try:
                        ends[p] = int(c.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1])
                        break
                    except KafkaException:
                        if time.monotonic() > deadline:
                            raise WorkloadError(f"{label}: cannot read the end offsets") from None
            c.assign([TopicPartition(self.topic, p, start.get(p, -1) if start.get(p, -1) >= 0 else 0)
                      for p in range(PARTITIONS)])
            records: list[tuple[int, int, str]] = []
            done = {p for p, end in ends.items() if end <= max(start.get(p, 0), 0)}
            while len(done) < PARTITIONS and time.monotonic() < deadline:
                for m in c.consume(500, 0.5):
                    if m.error() is None:
                        records.append(_record(m))
                for p in range(PARTITIONS):
                    pos = c.position([TopicPartition(self.topic, p)])[0].offset
                    if pos >= ends[p]:
                        done.add(p)
            if len(done) < PARTITIONS:
                raise WorkloadError(f"{label}: the read did not reach the end of every partition "
                                    f"(ends {ends}, reached {sorted(done)})")
            return records, ends
        finally:
            c.close()

    def _drain(self, spec: RunSpec) -> None:
        """Let the copiers catch up: done when a read from the group's committed offsets finds nothing."""
        deadline = time.monotonic() + self.drain_s
        probe = self._consumer(spec.copier_group)
        detail = "no attempt"
        previous: dict[int, int] = {}
        moved = time.monotonic()
        try:
            while True:
                try:
                    got = probe.committed([TopicPartition(self.topic, p) for p in range(PARTITIONS)], timeout=10)
                    committed = {int(tp.partition): int(tp.offset) for tp in got}
                    if committed != previous:
                        previous, moved = committed, time.monotonic()
                    left, _ends = self._read_range(committed, 20, "tail")
                    if not left:
                        self.history.meta["drained"] = True
                        return
                    first = min(left, key=lambda r: r[1])
                    detail = (f"{len(left)} records after the copier group's committed offsets {committed}, "
                              f"e.g. {first[2]} at {first[0]}/{first[1]}")
                except (KafkaException, WorkloadError) as exc:
                    detail = f"cannot read the copier group's progress: {_kafka_text(exc)}"
                now = time.monotonic()
                if now > deadline or now - moved > self.stall_s:
                    why = (f"within {self.drain_s:.0f} s" if now > deadline
                           else f"(its committed offsets did not move for {self.stall_s:.0f} s)")
                    self.history.meta["drained"] = False
                    self.history.meta["drain_detail"] = (f"the copier group did not catch up {why} after the "
                                                         f"producers stopped: {detail}")
                    return
                self.progress(f"draining the copiers: {detail}")
                time.sleep(1)
        finally:
            probe.close()

    def _merge(self, out_dir: Path) -> None:
        for role in self.roles:
            path = out_dir / f"{role.name}.jsonl"
            if not path.exists():
                continue
            lines = path.read_text().splitlines()
            for n, line in enumerate(lines, 1):
                try:
                    kind, item = parse_line(json.loads(line))
                except (ValueError, TypeError, KeyError) as exc:
                    if n == len(lines):
                        continue  # a worker terminated mid-line
                    raise HistoryError(f"{path}, line {n}: {exc}") from exc
                if kind is not None and kind != "meta":
                    self.history.add(kind, item)

    # --- run -------------------------------------------------------------------------------------
    def run(self) -> History:
        self._create_topic()
        out_dir = Path(tempfile.mkdtemp(prefix="oncelog-verify-"))
        ctx = mp.get_context("spawn")
        controls = Controls(stop_writes=ctx.Event(), stop_all=ctx.Event(),
                            commands={r.name: ctx.Queue() for r in self.roles if r.transactional},
                            done={r.name: ctx.Event() for r in self.roles}, counters=ctx.Array("q", COUNTERS))
        spec = RunSpec(self.bootstrap, self.topic, self.seed, self.txn, self.clock.t0, str(out_dir), self.prefix,
                       PARTITIONS)
        plan = plan_processes(self.roles, self.processes)
        self.history.meta["processes"] = len(plan)
        self.history.meta["copier_group"] = spec.copier_group if any(r.kind == "copier" for r in self.roles) else ""
        workers = [ctx.Process(target=worker_main, args=(spec, roles, controls), daemon=True,
                               name="verify-" + "+".join(r.name for r in roles)) for roles in plan]
        try:
            for w in workers:
                w.start()
            fault_thread = threading.Thread(target=self._fault_loop, args=(controls,), daemon=True)
            fault_thread.start()
            end = time.monotonic() + self.duration_s
            while time.monotonic() < end:
                time.sleep(0.5)
                self.progress(self._status(controls))
                if all(controls.done[r.name].is_set() for r in self.roles if r.kind == "producer"):
                    break  # every producer died: nothing more will happen
            self.stop.set()
            fault_thread.join(60)
            self.history.meta["faults_stopped_ms"] = self.clock.ms()
            if self.proxy is not None:
                self.proxy.clear()
            controls.stop_writes.set()
            self.progress("waiting for the producers' last transactions")
            for r in self.roles:
                if r.kind == "producer":
                    controls.done[r.name].wait(120)
            if any(r.kind == "copier" for r in self.roles):
                self._drain(spec)
            controls.stop_all.set()
            for w in workers:
                w.join(90)
            for w, roles in zip(workers, plan, strict=True):
                if w.is_alive():
                    self.fault_errors.append(f"worker {w.name} did not stop and was terminated; "
                                             f"{_stuck_in(w, out_dir / f'{roles[0].name}.stack')}")
                    w.terminate()
                    w.join(10)
                elif w.exitcode not in (0, None):
                    self.fault_errors.append(f"worker {w.name} exited with {w.exitcode}")
            self._merge(out_dir)
        finally:
            controls.stop_writes.set()
            controls.stop_all.set()
            for w in workers:
                if w.is_alive():
                    w.terminate()
            shutil.rmtree(out_dir, ignore_errors=True)
        self.history.meta["errors"] = [f"{e.process}: {e.error}" for e in self.history.errors] + self.fault_errors
        produced = [s for s in self.history.sends if not s.source]
        if not produced:
            why = "; ".join(self.history.meta["errors"][:3]) or "no client sent anything"
            raise WorkloadError(f"the workload did not run: {why}")
        self.progress("final read of every partition")
        records, ends = self._read_range({}, 120 + len(self.history.sends) / 500, "final")
        self.history.polls.append(Poll("final", self.clock.ms(), records, final=True, ends=ends))
        if self.txn and not any(t.outcome == "committed" for t in self.history.txns):
            raise WorkloadError("no transaction committed: the broker does not support transactions?")
        return self.history

    def _status(self, controls: Controls) -> str:
        c = controls.counters
        return (f"{c[TXNS]} transactions ({c[COPIER_TXNS]} by copiers), {c[POLLS]} polls, "
                f"{len(self.history.faults)} broker/network faults")


def _stuck_in(worker: BaseProcess, stack_file: Path) -> str:
    """Where a hanging worker's role threads are (faulthandler dump on SIGUSR1): the innermost
    frame of ours per thread."""
    try:
        os.kill(worker.pid or 0, signal.SIGUSR1)
        time.sleep(1)
        text = stack_file.read_text()
    except OSError as exc:
        return f"no stack: {exc}"
    where = []
    for block in text.split("\n\n"):
        frames = [line.strip() for line in block.splitlines() if "oncelog" in line]
        if frames:
            where.append(frames[0])
    return "stuck in " + " | ".join(where) if where else "no stack"


def _kafka_text(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
        return str(exc.args[0].str())
    return str(exc) or type(exc).__name__


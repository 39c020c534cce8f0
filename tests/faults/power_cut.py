"""Power cuts under a transactional workload, with LazyFS: does what was fsynced survive, and nothing else?

LazyFS (github.com/dsrhaslab/lazyfs) is a FUSE file system that keeps every write in its own page cache
until the file is fsynced; ``lazyfs::clear-cache`` written to its control FIFO drops every write that
was not fsynced, as a power cut would. Each round:

1. mount LazyFS over a fresh backing directory and start ``oncelog broker`` with its data dir on it;
2. run several transactional producers (confluent-kafka), each transaction writing one value to each
   of 2-4 partitions of 2+ topics; a random fraction is aborted on purpose (after flushing its records
   to the broker, so the aborted data really is in the log); record which transactions were
   acknowledged committed (``commit_transaction`` returned) or aborted. Beside them one plain
   idempotent producer (``enable.idempotence``, ``acks=all``, ``linger.ms=0``, ``batch.num.messages=1``,
   the default max in flight, i.e. 5) writes numbered values ``pl|r<round>|<topic>|<partition>|n<k>``
   (k = 1, 2, ... per partition) round-robin to ``--plain-partitions`` of the round's partitions, so one
   connection pipelines one small Produce request per record; at most ``--plain-window`` records are
   unanswered at a time (which bounds what is in doubt at the cut). A value counts as acknowledged once
   its delivery report says so; what has no report when the producer stops, or is purged or failed by
   the cut, is in doubt: it may or may not be visible;
3. cut: SIGKILL the broker (so it writes nothing more), then ``lazyfs::clear-cache`` (wait for
   LazyFS's "finished" notice), then unmount; what is left in the backing directory is exactly what
   the broker fsynced. Cut styles: ``commit`` (right after a commit acknowledgement, producers still
   running), ``busy`` (a random moment while producers run), ``idle`` (producers stopped, the cut
   0.2-2.5 s after the last acknowledgement, plain or transactional, so a background flush is in
   progress or done); ``fsync`` (LazyFS itself crashes right before/after an fsync of one file);
   ``kill`` (only with ``--cut kill``, not among the random styles, so that a seed's other rounds
   stay as they were): a process crash first -- SIGKILL, the producers halted, the broker restarted
   on the same mount, whose LazyFS page cache still holds every write it had not fsynced, which
   recovery reads back -- then, the loss window and 0.5-2.5 s later (several flushes), the cut; its
   brokers run with 16 KiB segments (unless ``--broker-arg`` sets ``--segment-bytes``). What
   recovery read back must have been fsynced before any flush moved a recovery point past it (probe
   s37, ``s4_kill_then_cut.py``). The
   plain producer is stopped like the transactional ones (``Workload.halt``, after the restart, or
   before an idle cut): it waits up to ``--txn-timeout-s`` for its outstanding reports, then purges
   the rest; its bootstrap is the old broker's port, so it never reaches the restarted broker;
4. remount LazyFS, restart the broker on the same data dir, re-initialise every transactional id (as a
   restarted application does: fences the old epoch, aborts what was open), commit a sentinel
   transaction from a new transactional id to every partition, and read every partition with a
   read_committed consumer up to the sentinel (the plain values, written to the old broker only, all
   lie before it; they are not transactional, so read_committed shows them as they are in the log).

Checks (a violation makes the exit status 1; 2 means the harness itself could not run):

- ``restart``: the broker restarts and listens (otherwise its log tail is printed);
- ``aborted-read``: no value of a transaction that was aborted, or never asked to commit, is visible;
- ``torn``: every transaction is all-or-nothing across its partitions;
- ``duplicate``: no value is visible twice;
- ``lost-acked``: no acknowledged committed transaction is lost, in either mode (the broker makes a
  transaction's data, Prepare record and markers durable before answering EndTxn). With
  ``--allow-recent-loss`` (to measure versions without that protocol) losing whole recent
  transactions in the default mode is counted as ``lost (allowed)``, and only one acknowledged more
  than ``--loss-window-ms`` before the cut is ``lost-old``, a violation;
- ``lso-stuck``: the sentinel commits and a read_committed consumer reaches it on every partition;
- ``lost-acked-plain`` (``every-append`` only, where the broker fsyncs before it acknowledges, and
  ``kill`` rounds in both modes, whose values were all acknowledged more than the loss window before
  the cut): every acknowledged plain value is visible (judged on a partition read to the sentinel,
  or where a later plain value is visible). Otherwise, in the default mode, a plain acknowledgement
  promises no durability: acknowledged plain values lost after the last visible one are only
  counted (``plain lost, allowed``);
- ``duplicate-plain``: no plain value is visible twice;
- ``gap-plain`` (both modes): per partition, the visible plain values, in offset order, are exactly
  k = 1, 2, ..., K for some K: nothing sent before a visible value is missing, nothing out of order.
  The idempotent producer sends a partition's records in order on one connection, and the broker
  takes a sequence number only right after its predecessor, so the log held them in that order; the
  log that survives a cut is a prefix of it (the broker truncates to a consistent prefix). So a
  missing k below a visible one is a violation whatever the mode and whether k was acknowledged or
  in doubt (in ``every-append`` an acknowledged one is reported as ``lost-acked-plain`` instead).
  Only a value whose delivery failed before the cut (the producer may then have reset its sequence)
  may be missing below a visible one; such failures are noted;
- ``foreign`` also covers a plain value not written to that partition in that round.

Usage (from the repository root)::

    python -m tests.faults.power_cut --lazyfs /path/to/lazyfs --rounds 20 --mode background --seed 1
    python -m tests.faults.power_cut --lazyfs ... --mode both --python /other/checkout/.venv/bin/python

Every random choice (which transactions abort, which partitions, the cut style and its timing) comes
from ``--seed`` and the round number; a round is rerun alone with ``--seed S --first-round R
--rounds 1`` (thread timing still varies). ``--python`` picks the interpreter whose ``oncelog``
runs as the broker (a checkout directory means its ``.venv/bin/python``); the harness itself only
needs confluent-kafka.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import random
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from oncelog.testing.broker_process import BrokerProcess, create_topic, free_port

MODES = ("background", "every-append")
CUT_STYLES = ("commit", "busy", "idle", "fsync")
KILL_SEGMENT_BYTES = 16_384  # kill rounds' segment.bytes, unless --broker-arg sets --segment-bytes
VIOLATIONS = ("restart", "aborted-read", "torn", "duplicate", "lost-acked", "lost-old", "lso-stuck", "foreign",
              "lost-acked-plain", "duplicate-plain", "gap-plain")
PLAIN_PREFIX = "pl|"  # plain values: parse_value (transactional values, "pc|...") returns None for them
CLEAR_CACHE = b"lazyfs::clear-cache\n"
CLEAR_DONE = b"finished::clear-cache"
CHECKPOINT = b"lazyfs::cache-checkpoint\n"
CHECKPOINT_DONE = "checkpoint is done."


class HarnessError(RuntimeError):
    """The harness could not do its job (LazyFS did not mount, the first broker did not start, ...)."""


# --- LazyFS -----------------------------------------------------------------------------------------

class LazyFS:
    """One LazyFS mount of ``backing`` at ``mountpoint``, run in the foreground as our child process.

    The config is written next to the mount (never in it): FIFO paths, a cache large enough for a
    round (``apply_eviction=false``: nothing is written back until fsync), no operation log.
    """

    def __init__(self, binary: Path, workdir: Path, backing: Path, mountpoint: Path, cache_mb: int) -> None:
        self.binary = binary
        self.backing = backing
        self.mountpoint = mountpoint
        self.fifo = workdir / "lazyfs-faults.fifo"
        self.done_fifo = workdir / "lazyfs-done.fifo"
        self.config = workdir / "lazyfs.toml"
        self.log_path = workdir / "lazyfs.log"
        self.cache_mb = cache_mb
        self.proc: subprocess.Popen | None = None
        self._done_fd = -1

    def mount(self, timeout_s: float = 15.0) -> None:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "[faults]\n"
            f'fifo_path="{self.fifo}"\n'
            f'fifo_path_completed="{self.done_fifo}"\n'
            "[cache]\napply_eviction=false\n"
            f'[cache.simple]\ncustom_size="{self.cache_mb}mb"\nblocks_per_page=1\n'
            '[filesystem]\nlog_all_operations=false\nlogfile=""\n')
        for fifo in (self.fifo, self.done_fifo):
            if not fifo.exists():
                os.mkfifo(fifo, 0o600)
        # LazyFS's fault thread opens the "done" FIFO for writing and blocks until a reader exists.
        self._done_fd = os.open(self.done_fifo, os.O_RDONLY | os.O_NONBLOCK)
        log = open(self.log_path, "ab")  # noqa: SIM115 (the child owns it)
        # The config path is given relative to the round directory: LazyFS ignores a --config-path
        # containing "-o" anywhere (as in /tmp/pytest-of-root/...), taking it for a FUSE option.
        self.proc = subprocess.Popen(
            [str(self.binary), str(self.mountpoint), "--config-path", self.config.name,
             "-o", "modules=subdir", "-o", f"subdir={self.backing}", "-f"],
            cwd=self.config.parent, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + timeout_s
        while not self.is_mounted():
            if self.proc.poll() is not None:
                raise HarnessError(f"LazyFS exited with {self.proc.returncode} before mounting; "
                                   f"see {self.log_path}:\n{tail(self.log_path)}")
            if time.monotonic() > deadline:
                raise HarnessError(f"LazyFS did not mount {self.mountpoint} within {timeout_s}s")
            time.sleep(0.05)

    def is_mounted(self) -> bool:
        target = str(self.mountpoint)
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == target for line in f)

    def _command(self, command: bytes) -> None:
        # One command per write, and never a second before the first was handled: LazyFS reads the
        # FIFO in chunks and takes each chunk as one command.
        try:
            fd = os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK)  # LazyFS holds it open read-write
        except OSError as exc:  # ENXIO: nobody reads it, LazyFS is gone
            raise HarnessError(f"cannot send {command.strip()!r} to LazyFS ({exc}); see {self.log_path}") from None
        try:
            os.write(fd, command)
        finally:
            os.close(fd)

    def checkpoint(self, timeout_s: float = 20.0) -> None:
        """Write every cached page to the backing directory (what unmounting alone would drop)."""
        before = self.log_path.read_text(errors="replace").count(CHECKPOINT_DONE)
        self._command(CHECKPOINT)
        deadline = time.monotonic() + timeout_s
        while self.log_path.read_text(errors="replace").count(CHECKPOINT_DONE) <= before:
            if time.monotonic() > deadline:
                raise HarnessError(f"LazyFS did not finish cache-checkpoint within {timeout_s}s; see {self.log_path}")
            time.sleep(0.05)

    def arm_crash(self, timing: str, path_regex: str) -> None:
        """LazyFS kills itself (losing its whole cache) right ``timing`` (before/after) the next fsync
        of a file whose path matches ``path_regex``: a power cut at an exact point of a flush."""
        command = f"lazyfs::crash::timing={timing}::op=fsync::from_rgx={path_regex}\n".encode()
        if len(command) >= 100:  # LazyFS reads commands in 100-byte chunks
            raise HarnessError(f"LazyFS command too long: {command!r}")
        self._command(command)

    def wait_exit(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.proc is not None and self.proc.poll() is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)
        return True

    def clear_cache(self, timeout_s: float = 20.0) -> float:
        """Drop every write not fsynced; return how long LazyFS took. Raises if it did not confirm."""
        start = time.monotonic()
        self._command(CLEAR_CACHE)
        got = b""
        deadline = start + timeout_s
        while CLEAR_DONE not in got:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HarnessError(f"LazyFS did not confirm clear-cache within {timeout_s}s; see {self.log_path}")
            ready, _, _ = select.select([self._done_fd], [], [], min(left, 0.2))
            if ready:
                try:
                    got += os.read(self._done_fd, 256)
                except BlockingIOError:
                    pass
            if self.proc is not None and self.proc.poll() is not None:
                raise HarnessError(f"LazyFS exited ({self.proc.returncode}) during clear-cache; see {self.log_path}")
        return time.monotonic() - start

    def unmount(self) -> None:
        if self.is_mounted():
            for attempt in range(20):
                r = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True, text=True)
                if r.returncode == 0 or not self.is_mounted():
                    break
                time.sleep(0.1 * (attempt + 1))
            else:
                subprocess.run(["fusermount3", "-uz", str(self.mountpoint)], capture_output=True)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait(timeout=5)
        if self._done_fd >= 0:
            os.close(self._done_fd)
            self._done_fd = -1


# --- workload ---------------------------------------------------------------------------------------

@dataclass
class Txn:
    producer: int
    number: int
    intent: str                      # "commit" or "abort"
    values: list[tuple[str, int, str]] = field(default_factory=list)  # (topic, partition, value)
    # open (EndTxn never sent) -> commit-requested -> committed | abort-requested -> aborted
    status: str = "open"
    acked_at: float | None = None    # monotonic time commit_transaction returned
    error: str | None = None

    @property
    def name(self) -> str:
        return f"p{self.producer}#{self.number}"

    @property
    def may_be_visible(self) -> bool:
        return self.status in ("commit-requested", "committed")


def txn_value(round_no: int, producer: int, number: int, topic: str, partition: int, intent: str,
              pad: int) -> str:
    head = f"pc|r{round_no}|p{producer}|t{number}|{topic}|{partition}|{'C' if intent == 'commit' else 'A'}|"
    return head + "x" * max(0, pad - len(head))


def parse_value(value: str) -> tuple[int, int, int, str, int] | None:
    """(round, producer, txn, topic, partition) of a workload value, None for anything else."""
    parts = value.split("|")
    if len(parts) < 7 or parts[0] != "pc":
        return None
    try:
        return int(parts[1][1:]), int(parts[2][1:]), int(parts[3][1:]), parts[4], int(parts[5])
    except ValueError:
        return None


@dataclass
class PlainRecord:
    """One value of the plain idempotent producer."""
    topic: str
    partition: int
    number: int                      # 1, 2, ... per partition, in send order
    value: str
    # in-flight (no delivery report yet) -> acked | failed (before the cut) | in-doubt (purged, or failed by
    # the cut); whatever is not "acked" at the end may or may not be visible
    status: str = "in-flight"
    offset: int = -1                 # from the delivery report
    acked_at: float | None = None
    error: str | None = None


def plain_value(round_no: int, topic: str, partition: int, number: int) -> str:
    return f"{PLAIN_PREFIX}r{round_no}|{topic}|{partition}|n{number}"


def parse_plain(value: str) -> tuple[int, str, int, int] | None:
    """(round, topic, partition, number) of a plain producer's value, None for anything else."""
    parts = value.split("|")
    if len(parts) != 5 or not value.startswith(PLAIN_PREFIX):
        return None
    try:
        return int(parts[1][1:]), parts[2], int(parts[3]), int(parts[4][1:])
    except ValueError:
        return None


def client_logger(path: Path) -> logging.Logger:
    logger = logging.getLogger(f"power_cut.clients.{path}")
    logger.propagate = False
    if not logger.handlers:
        handler = logging.FileHandler(path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return logger


class Workload:
    """Transactional producers in threads, and one plain idempotent producer writing to ``plain_partitions``
    (none if empty); every transaction is recorded before it starts, every plain value before any delivery
    report on it can arrive (reports are served in the plain producer's own thread)."""

    def __init__(self, bootstrap: str, round_no: int, partitions: list[tuple[str, int]], opts: argparse.Namespace,
                 rng: random.Random, logger: logging.Logger,
                 plain_partitions: list[tuple[str, int]] | None = None) -> None:
        self.bootstrap = bootstrap
        self.round_no = round_no
        self.partitions = partitions
        self.opts = opts
        self.logger = logger
        self.txns: list[Txn] = []
        self.stop = threading.Event()
        self.commit_acked = threading.Event()
        self.last_ack = 0.0
        self.errors: list[str] = []
        self._seeds = [rng.getrandbits(64) for _ in range(opts.producers)]
        self.plain_partitions = list(plain_partitions or [])
        self.plain: list[PlainRecord] = []
        self.plain_last_ack = 0.0
        self.plain_failures = 0
        self._plain_unanswered = 0
        self._ready = threading.Barrier(opts.producers + 1 + bool(self.plain_partitions))
        self.threads = [threading.Thread(target=self._run, args=(i,), name=f"producer-{i}", daemon=True)
                        for i in range(opts.producers)]
        if self.plain_partitions:
            self.threads.append(threading.Thread(target=self._plain_run, name="plain-producer", daemon=True))

    @property
    def last_any_ack(self) -> float:
        """When the last acknowledgement, transactional or plain, arrived (0.0: none yet)."""
        return max(self.last_ack, self.plain_last_ack)

    def transactional_id(self, i: int) -> str:
        return f"pc-r{self.round_no}-p{i}"

    def producer_config(self, transactional_id: str, bootstrap: str | None = None) -> dict[str, Any]:
        return {"bootstrap.servers": bootstrap or self.bootstrap, "transactional.id": transactional_id, "linger.ms": 2,
                "transaction.timeout.ms": 15000, "message.timeout.ms": 12000, "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500, "logger": self.logger, "log_level": 4,
                "error_cb": self._client_error}

    def _client_error(self, err: KafkaError) -> None:
        self.logger.info("client error: %s", err)

    def start(self) -> None:
        for t in self.threads:
            t.start()
        try:
            self._ready.wait(timeout=30)  # every producer initialised before the clock starts
        except threading.BrokenBarrierError:
            raise HarnessError(f"producers did not initialise within 30 s: {self.errors}") from None

    def _ready_or_abort(self, make: Callable[[], Producer], what: str) -> Producer | None:
        """``make()`` a producer, then wait at the barrier until every producer is made; None (and the
        barrier broken for all, the error recorded) when one could not be made."""
        try:
            p = make()
        except KafkaException as exc:
            self.errors.append(f"{what}: {exc}")
            self._ready.abort()
            return None
        try:
            self._ready.wait()
        except threading.BrokenBarrierError:
            return None
        return p

    def _transactional(self, i: int) -> Producer:
        p = Producer(self.producer_config(self.transactional_id(i)))
        p.init_transactions(30)
        return p

    def _run(self, i: int) -> None:
        rng = random.Random(self._seeds[i])
        p = self._ready_or_abort(lambda: self._transactional(i), f"producer {i} init")
        if p is None:
            return
        try:
            self._transactions(i, p, rng)
        finally:
            p.poll(0)  # serve queued error events, or librdkafka complains on stderr when p is destroyed

    def _transactions(self, i: int, p: Producer, rng: random.Random) -> None:
        timeout = self.opts.txn_timeout_s
        number = 0
        while not self.stop.is_set():
            number += 1
            k = rng.randint(2, min(4, len(self.partitions)))
            chosen = rng.sample(self.partitions, k)
            intent = "abort" if rng.random() < self.opts.abort_fraction else "commit"
            txn = Txn(i, number, intent)
            txn.values = [(t, part, txn_value(self.round_no, i, number, t, part, intent, self.opts.value_bytes))
                          for t, part in chosen]
            self.txns.append(txn)
            try:
                p.begin_transaction()
                for t, part, value in txn.values:
                    p.produce(t, value.encode(), partition=part)
                if intent == "commit":
                    txn.status = "commit-requested"
                    p.commit_transaction(timeout)
                    txn.acked_at = time.monotonic()
                    txn.status = "committed"
                    self.last_ack = txn.acked_at
                    self.commit_acked.set()
                else:
                    remaining = p.flush(timeout)  # the aborted records really reach the log
                    txn.status = "abort-requested"
                    if remaining:
                        raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"{remaining} not flushed"))
                    p.abort_transaction(timeout)
                    txn.status = "aborted"
            except KafkaException as exc:
                txn.error = str(exc.args[0] if exc.args else exc)
                if not self.stop.is_set():
                    self.errors.append(f"producer {i} txn {number} ({txn.status}) before the cut: {txn.error}")
                return
            if self.opts.txn_pause_ms:
                time.sleep(rng.uniform(0, self.opts.txn_pause_ms) / 1000)

    # --- the plain idempotent producer ---

    def plain_config(self) -> dict[str, Any]:
        # linger.ms=0 and one record per batch: every record is its own Produce request, pipelined up to
        # the idempotent producer's limit of 5 in flight on its one connection.
        return {"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
                "batch.num.messages": 1, "message.timeout.ms": 12000, "reconnect.backoff.ms": 50,
                "reconnect.backoff.max.ms": 500, "logger": self.logger, "log_level": 4,
                "error_cb": self._client_error}

    def _plain_run(self) -> None:
        p = self._ready_or_abort(lambda: Producer(self.plain_config()), "plain producer")
        if p is None:
            return
        try:
            self._plain_stream(p)
        finally:
            self._plain_settle(p)

    def _plain_stream(self, p: Producer) -> None:
        numbers = dict.fromkeys(self.plain_partitions, 0)
        turn = 0
        while not self.stop.is_set():
            if self._plain_unanswered >= self.opts.plain_window:
                p.poll(0.01)  # delivery reports are served here, in this thread
                continue
            t, part = self.plain_partitions[turn % len(self.plain_partitions)]
            turn += 1
            numbers[(t, part)] += 1
            rec = PlainRecord(t, part, numbers[(t, part)], plain_value(self.round_no, t, part, numbers[(t, part)]))
            try:
                p.produce(t, rec.value.encode(), partition=part,
                          on_delivery=functools.partial(self._plain_report, rec))
            except (KafkaException, BufferError) as exc:
                if not self.stop.is_set():
                    self.errors.append(f"plain producer: produce of {rec.value} refused before the cut: {exc}")
                return  # never handed to the client: not recorded, and nothing after it is sent
            self.plain.append(rec)
            self._plain_unanswered += 1
            p.poll(0)

    def _plain_report(self, rec: PlainRecord, err: KafkaError | None, msg: Any) -> None:
        self._plain_unanswered -= 1
        if err is None:
            rec.status, rec.offset, rec.acked_at = "acked", msg.offset(), time.monotonic()
            self.plain_last_ack = rec.acked_at
            return
        rec.error = err.str()
        if self.stop.is_set() or err.code() in (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT):
            rec.status = "in-doubt"
        else:
            rec.status = "failed"
            self.plain_failures += 1
            if self.plain_failures <= 3:
                self.errors.append(f"plain producer: {rec.value} failed before the cut: {rec.error}")

    def _plain_settle(self, p: Producer) -> None:
        """Wait (at most --txn-timeout-s) for the outstanding delivery reports, then purge the rest: a
        value purged, or still without a report, stays in doubt."""
        try:
            p.flush(self.opts.txn_timeout_s)
            p.purge()
            p.flush(1)  # serves the purged values' reports
        except KafkaException as exc:
            self.errors.append(f"plain producer: stopping it: {exc}")

    def halt(self, join_timeout_s: float) -> None:
        self.stop.set()
        deadline = time.monotonic() + join_timeout_s
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))


# --- one round --------------------------------------------------------------------------------------

@dataclass
class Finding:
    kind: str
    detail: str


@dataclass
class RoundResult:
    round_no: int
    mode: str
    seed: int
    cut: str = ""
    since_ack_ms: int = -1
    txns: int = 0
    committed: int = 0
    aborted: int = 0
    in_doubt: int = 0
    open: int = 0
    visible_committed: int = 0
    lost_allowed: int = 0
    lost_acked: int = 0
    lost_old: int = 0
    torn: int = 0
    aborted_read: int = 0
    duplicates: int = 0
    foreign: int = 0
    gaps: int = 0
    plain_sent: int = 0
    plain_acked: int = 0
    plain_in_doubt: int = 0          # no acknowledgement when the producer stopped (in flight at the cut)
    plain_failed: int = 0            # delivery failed before the cut
    plain_visible: int = 0
    lost_acked_plain: int = 0
    plain_lost_allowed: int = 0
    plain_duplicates: int = 0
    plain_gaps: int = 0
    restarted: bool = False
    lso_ok: bool = False
    seconds: float = 0.0
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    workdir: str = ""

    def add(self, kind: str, detail: str) -> None:
        self.findings.append(Finding(kind, detail))

    @property
    def violation_kinds(self) -> list[str]:
        return sorted({f.kind for f in self.findings})


def round_seed(seed: int, mode: str, round_no: int) -> int:
    return seed * 1_000_003 + MODES.index(mode) * 10_007 + round_no


def broker_python(spec: str) -> str:
    path = Path(spec)
    if path.is_dir():
        path = path / ".venv" / "bin" / "python"
    if not path.exists():
        raise HarnessError(f"--python: {path} does not exist")
    return str(path)


def broker_args(opts: argparse.Namespace, mode: str, data_dir: Path, port: int) -> list[str]:
    args = [opts.python, "-m", "oncelog", "broker", "--data-dir", str(data_dir),
            "--listen", f"127.0.0.1:{port}", "--auto-create-topics"]
    if mode == "every-append":
        args.append("--flush-every-append")
    elif opts.flush_interval_ms is not None:
        args += ["--flush-interval-ms", str(opts.flush_interval_ms)]
    return args + list(opts.broker_arg)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable)"
    return "\n".join(text[-lines:])


def start_broker(opts: argparse.Namespace, mode: str, data_dir: Path, log_path: Path,
                 avoid_port: int | None = None) -> BrokerProcess:
    port = free_port()
    while port == avoid_port:
        port = free_port()
    b = BrokerProcess("127.0.0.1", port, data_dir, broker_args(opts, mode, data_dir, port), log_path=log_path)
    b.start(timeout_s=opts.start_timeout_s)
    return b


def run_round(opts: argparse.Namespace, mode: str, round_no: int, workroot: Path) -> RoundResult:
    seed = round_seed(opts.seed, mode, round_no)
    rng = random.Random(seed)
    res = RoundResult(round_no, mode, seed)
    started = time.monotonic()
    workdir = workroot / f"{mode}-r{round_no:03d}"
    workdir.mkdir(parents=True)
    res.workdir = str(workdir)
    fs = LazyFS(opts.lazyfs, workdir, workdir / "backing", workdir / "mnt", opts.cache_mb)
    broker: BrokerProcess | None = None
    logger = client_logger(workdir / "clients.log")
    # the round's first random choice (nothing before it draws from rng)
    styles = CUT_STYLES if opts.cut == "random" else tuple(opts.cut.split(","))
    style = rng.choice(styles) if opts.cut == "random" else styles[(round_no - 1) % len(styles)]
    if style == "kill" and not any(a.startswith("--segment-bytes") for a in opts.broker_arg):
        # small segments: recovery then reads back segments the kill left rolled and unflushed
        opts = argparse.Namespace(**{**vars(opts), "broker_arg": [*opts.broker_arg,
                                                                   f"--segment-bytes={KILL_SEGMENT_BYTES}"]})
    try:
        fs.mount()
        data_dir = fs.mountpoint / "data"
        try:
            broker = start_broker(opts, mode, data_dir, workdir / "broker-1.log")
        except (RuntimeError, TimeoutError) as exc:
            raise HarnessError(f"the broker did not start on LazyFS: {exc}\n{tail(workdir / 'broker-1.log')}") from None
        topics = [f"pc-{chr(ord('a') + t)}" for t in range(opts.topics)]
        for topic in topics:
            create_topic(broker.bootstrap, topic, opts.partitions)
        partitions = [(t, p) for t in topics for p in range(opts.partitions)]

        # --- workload, then the cut ---
        warmup = rng.uniform(opts.min_run_s, opts.max_run_s)
        idle_delay = rng.uniform(0.2, 2.5)
        # drawn from their own generator, as the plain values' below
        kill_wait = random.Random(seed * 11 + 5).uniform(0.5, 2.5) + opts.loss_window_ms / 1000
        fsync_targets = {**{f"{t}-{p}": rf"/{t}-{p}/[0-9]+\.log" for t, p in partitions},
                         "txnlog": r"/__transaction_state-[0-9]+/[0-9]+\.log",
                         "snapshot": "/producer-state",  # its offset is the recovery point
                         "txnindex": r"\.txnindex"}
        fsync_target = rng.choice(sorted(fsync_targets))
        fsync_timing = rng.choice(("before", "after"))
        # drawn from their own generator, so a seed's other choices are those it made before plain values existed
        plain_rng = random.Random(seed * 7 + 3)
        plain_tps = sorted(plain_rng.sample(partitions, min(opts.plain_partitions, len(partitions))))
        work = Workload(broker.bootstrap, round_no, partitions, opts, rng, logger, plain_tps)
        work.start()
        time.sleep(warmup)
        res.cut = style
        if style == "commit":
            work.commit_acked.clear()
            work.commit_acked.wait(timeout=10)
        elif style == "idle":
            work.halt(opts.txn_timeout_s + 5)
            time.sleep(max(0.0, work.last_any_ack + idle_delay - time.monotonic()))
            res.cut = f"idle {idle_delay:.1f}s"
        crashed = killed = False
        if style == "kill":
            # a process crash, a restart on the page cache it left, flushes, then the cut below
            broker.kill()
            killed = True
            work.stop.set()
            work.halt(opts.txn_timeout_s + 5)  # every outcome known; nothing reaches the restarted broker
            try:
                broker = start_broker(opts, mode, data_dir, workdir / "broker-1k.log", avoid_port=broker.port)
                time.sleep(kill_wait)
            except (RuntimeError, TimeoutError) as exc:
                res.add("restart", f"the broker did not restart after the kill: {exc}\n"
                                   f"{tail(workdir / 'broker-1k.log')}")
            res.cut = f"kill, {kill_wait:.1f}s, cut"
        elif style == "fsync" and not opts.no_power_cut:
            fs.arm_crash(fsync_timing, fsync_targets[fsync_target])
            crashed = fs.wait_exit(opts.fsync_wait_s)
            res.cut = f"{fsync_timing} fsync {fsync_target}" if crashed else f"fsync {fsync_target} missed"
            if not crashed:
                res.notes.append(f"no fsync of {fsync_target} within {opts.fsync_wait_s}s: cut by clear-cache instead")
        cut_at = time.monotonic()
        broker.kill()  # SIGKILL and reap: from here on the broker writes nothing
        work.stop.set()  # errors from here on are the cut's, not findings
        last_ack = work.last_any_ack
        if opts.no_power_cut:
            fs.checkpoint()  # LazyFS drops its cache when unmounted: keep it, the broker's writes all survive
        cleared_in = 0.0 if opts.no_power_cut or crashed else fs.clear_cache()
        res.since_ack_ms = int((cut_at - last_ack) * 1000) if last_ack else -1
        if cleared_in > 1:
            res.notes.append(f"LazyFS took {cleared_in:.1f}s to clear its cache")
        fs.unmount()
        # what survived the cut, before the restart changes it (kept with the round if it fails)
        shutil.copytree(fs.backing, workdir / "after-cut", symlinks=True)

        # --- restart on what was fsynced (a new port: the old producers, still timing out, never reach it) ---
        fs.mount()
        old_port = broker.port
        try:
            broker = start_broker(opts, mode, data_dir, workdir / "broker-2.log", avoid_port=old_port)
            res.restarted = True
        except (RuntimeError, TimeoutError) as exc:
            broker = None
            res.add("restart", f"the broker did not restart after the cut: {exc}\n"
                               f"{tail(workdir / 'broker-2.log')}")
        work.halt(opts.txn_timeout_s + 5)  # every outcome is known before anything is judged
        res.notes.extend(work.errors)
        if any(t.is_alive() for t in work.threads):
            res.notes.append("a producer thread was still blocked after the cut; its transaction (or plain values) "
                             "counts as in doubt")
        txns = list(work.txns)
        plain = list(work.plain)
        if res.restarted and broker is not None:
            by_value = {v: t for t in txns for _, _, v in t.values}
            visible, complete = verify_after_restart(broker.bootstrap, round_no, work, partitions, opts, res, logger,
                                                     by_value)
            plain_visible = {tp: [(o, v) for o, v in records if v.startswith(PLAIN_PREFIX)]
                             for tp, records in visible.items()}
            txn_visible = {tp: [(o, v) for o, v in records if not v.startswith(PLAIN_PREFIX)]
                           for tp, records in visible.items()}
            check(res, txns, txn_visible, complete, mode, cut_at, opts)
            check_plain(res, plain, plain_visible, complete, mode, cut_at, opts, acked_durable=killed)
        else:
            count_txns(res, txns)
            count_plain(res, plain)
    finally:
        if broker is not None:
            broker.kill()
        fs.unmount()
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
            handler.close()
        res.seconds = round(time.monotonic() - started, 1)
    if not opts.keep and not res.findings:
        shutil.rmtree(workdir, ignore_errors=True)
        res.workdir = ""
    return res


def verify_after_restart(bootstrap: str, round_no: int, work: Workload, partitions: list[tuple[str, int]],
                         opts: argparse.Namespace, res: RoundResult, logger: logging.Logger,
                         by_value: dict[str, Txn]
                         ) -> tuple[dict[tuple[str, int], list[tuple[int, str]]], set[tuple[str, int]]]:
    """Re-init every old transactional id, commit a sentinel to every partition from a new one, then read
    every partition with read_committed up to the sentinel. Returns what was read, and the partitions
    read completely (up to the sentinel; if it could not commit, to the read_committed end)."""
    for i in range(opts.producers):
        tid = work.transactional_id(i)
        p = Producer(work.producer_config(tid, bootstrap))
        try:
            p.init_transactions(opts.verify_timeout_s)
        except KafkaException as exc:
            res.add("lso-stuck", f"re-initialising transactional id {tid} after the restart failed: {exc}")
        finally:
            p.poll(0)
    sentinels = {tp: f"sentinel|r{round_no}|{tp[0]}|{tp[1]}" for tp in partitions}
    committed = False
    p = Producer(work.producer_config(f"pc-r{round_no}-sentinel", bootstrap))
    try:
        p.init_transactions(opts.verify_timeout_s)
        p.begin_transaction()
        for (t, part), value in sentinels.items():
            p.produce(t, value.encode(), partition=part)
        p.commit_transaction(opts.verify_timeout_s)
        committed = True
    except KafkaException as exc:
        res.add("lso-stuck", f"a new transactional producer could not commit after the restart: {exc}")
    finally:
        p.poll(0)

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"pc-check-r{round_no}-{os.getpid()}",
                         "isolation.level": "read_committed", "enable.auto.commit": False,
                         "enable.partition.eof": True, "fetch.wait.max.ms": 100, "logger": logger, "log_level": 4})
    visible: dict[tuple[str, int], list[tuple[int, str]]] = {tp: [] for tp in partitions}
    reached: set[tuple[str, int]] = set()
    at_eof: set[tuple[str, int]] = set()
    try:
        consumer.assign([TopicPartition(t, part, OFFSET_BEGINNING) for t, part in partitions])
        deadline = time.monotonic() + opts.verify_timeout_s
        settle_until: float | None = None
        while time.monotonic() < deadline:
            for m in consumer.consume(500, 0.2):
                tp = (m.topic(), m.partition())
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        at_eof.add(tp)
                    continue
                at_eof.discard(tp)
                value = m.value().decode(errors="replace")
                if value == sentinels.get(tp):
                    reached.add(tp)
                else:
                    visible[tp].append((m.offset(), value))
            if committed and len(reached) == len(partitions) and len(at_eof) == len(partitions):
                break
            if not committed and len(at_eof) == len(partitions):
                # nothing to wait for: read what is readable, for a little longer
                settle_until = settle_until or time.monotonic() + 2
                if time.monotonic() > settle_until:
                    break
        if committed and len(reached) < len(partitions):
            where = end_offsets(bootstrap, consumer, sorted(set(partitions) - reached), logger, by_value)
            res.add("lso-stuck", f"the sentinel committed after the restart was not reached within "
                                 f"{opts.verify_timeout_s}s on {where}")
    finally:
        consumer.close()
    res.lso_ok = committed and reached == set(partitions)
    return visible, (reached if committed else at_eof)


def end_offsets(bootstrap: str, committed_consumer: Consumer, tps: list[tuple[str, int]],
                logger: logging.Logger, by_value: dict[str, Txn]) -> str:
    """'topic-p (LSO x, high watermark y, at the LSO: txn ...)' per partition, for a stuck-LSO report."""
    config = {"bootstrap.servers": bootstrap, "group.id": "pc-watermarks", "isolation.level": "read_uncommitted",
              "enable.auto.commit": False, "logger": logger, "log_level": 4}
    uncommitted = Consumer(config)
    out = []
    try:
        for t, part in tps:
            tp = TopicPartition(t, part)
            try:
                lso = committed_consumer.get_watermark_offsets(tp, timeout=5, cached=False)[1]
                hw = uncommitted.get_watermark_offsets(tp, timeout=5, cached=False)[1]
            except KafkaException as exc:
                out.append(f"{t}-{part} (offsets unavailable: {exc})")
                continue
            at_lso = ""
            if lso < hw:
                uncommitted.assign([TopicPartition(t, part, lso)])
                m = uncommitted.poll(5)
                if m is not None and not m.error():
                    value = m.value().decode(errors="replace")
                    txn = by_value.get(value)
                    at_lso = (f", at the LSO: txn {txn.name} ({txn.status})" if txn
                              else f", at the LSO: {value[:40]!r}")
            out.append(f"{t}-{part} (last stable offset {lso}, high watermark {hw}{at_lso})")
    finally:
        uncommitted.close()
    return ", ".join(out)


def count_txns(res: RoundResult, txns: list[Txn]) -> None:
    res.txns = len(txns)
    res.committed = sum(t.status == "committed" for t in txns)
    res.aborted = sum(t.intent == "abort" for t in txns)
    res.in_doubt = sum(t.status == "commit-requested" for t in txns)
    res.open = sum(t.status == "open" and t.intent == "commit" for t in txns)


def check(res: RoundResult, txns: list[Txn], visible: dict[tuple[str, int], list[tuple[int, str]]],
          complete: set[tuple[str, int]], mode: str, cut_at: float, opts: argparse.Namespace) -> None:
    """Judge what a read_committed consumer saw after the restart against what the producers were told.

    Aborted reads, duplicates and foreign values count wherever they were read; torn and lost
    transactions only on partitions read completely (``complete``), as elsewhere the rest may simply
    not be readable yet."""
    count_txns(res, txns)
    by_key = {(t.producer, t.number): t for t in txns}
    seen: dict[str, list[tuple[str, int, int]]] = {}
    for (topic, part), records in visible.items():
        for offset, value in records:
            seen.setdefault(value, []).append((topic, part, offset))
    add = finding_adder(res, opts)

    for value, places in seen.items():
        where = ", ".join(f"{t}-{p}@{o}" for t, p, o in places)
        parsed = parse_value(value)
        if parsed is None or parsed[0] != res.round_no or (parsed[1], parsed[2]) not in by_key:
            res.foreign += 1
            add("foreign", f"a value nobody wrote in this round: {value[:60]!r} at {where}")
            continue
        if len(places) > 1:
            res.duplicates += 1
            add("duplicate", f"{value[:40]!r} visible {len(places)} times: {where}")
        txn = by_key[(parsed[1], parsed[2])]
        if not txn.may_be_visible:
            res.aborted_read += 1
            add("aborted-read", f"txn {txn.name} ({txn.status}, intent {txn.intent}): {value[:40]!r} "
                                f"visible to read_committed at {where}")

    window_s = opts.loss_window_ms / 1000
    lost_keys: set[tuple[int, int]] = set()
    for txn in txns:
        if not txn.may_be_visible:
            continue
        present = [(t, p) for t, p, v in txn.values if v in seen]
        missing = [(t, p) for t, p, v in txn.values if v not in seen]
        if any(tp not in complete for tp in missing):
            continue  # undecidable: that partition could not be read to its end
        if present and missing:
            res.torn += 1
            add("torn", f"txn {txn.name} ({txn.status}"
                        f"{f', acked {(cut_at - txn.acked_at) * 1000:.0f} ms before the cut' if txn.acked_at else ''})"
                        f": visible on {fmt_tps(present)}, missing on {fmt_tps(missing)}")
        elif present:
            if txn.status == "committed":
                res.visible_committed += 1
        elif txn.status == "committed":
            lost_keys.add((txn.producer, txn.number))
            age = cut_at - (txn.acked_at or cut_at)
            what = f"txn {txn.name} acked {age * 1000:.0f} ms before the cut, on {fmt_tps(missing)}"
            if mode == "every-append" or not opts.allow_recent_loss:
                res.lost_acked += 1
                add("lost-acked", f"{what}: an acknowledged commit was lost ({mode})")
            elif age > window_s:
                res.lost_old += 1
                add("lost-old", f"{what}: lost, older than the {opts.loss_window_ms} ms loss window")
            else:
                res.lost_allowed += 1
    # informational: a producer's committed transaction lost while a later one of it survived
    for txn in txns:
        if (txn.producer, txn.number) in lost_keys and any(
                t.producer == txn.producer and t.number > txn.number and t.status == "committed"
                and all(v in seen for _, _, v in t.values) for t in txns):
            res.gaps += 1


def finding_adder(res: RoundResult, opts: argparse.Namespace) -> Callable[[str, str], None]:
    """``add(kind, detail)``: a finding, at most --examples of a kind per call of this (then a note)."""
    examples: dict[str, int] = {}

    def add(kind: str, detail: str) -> None:
        examples[kind] = examples.get(kind, 0) + 1
        if examples[kind] <= opts.examples:
            res.add(kind, detail)
        elif examples[kind] == opts.examples + 1:
            res.notes.append(f"more {kind} findings than shown (see the counts)")

    return add


def count_plain(res: RoundResult, plain: list[PlainRecord]) -> None:
    res.plain_sent = len(plain)
    res.plain_acked = sum(r.status == "acked" for r in plain)
    res.plain_failed = sum(r.status == "failed" for r in plain)
    res.plain_in_doubt = res.plain_sent - res.plain_acked - res.plain_failed


def check_plain(res: RoundResult, plain: list[PlainRecord], visible: dict[tuple[str, int], list[tuple[int, str]]],
                complete: set[tuple[str, int]], mode: str, cut_at: float, opts: argparse.Namespace, *,
                acked_durable: bool = False) -> None:
    """Judge the plain values read after the restart (``visible``: per partition, (offset, value) in offset
    order) against the delivery reports. See the module docstring: duplicate-plain and gap-plain in both
    modes, lost-acked-plain in every-append mode, and in both with ``acked_durable`` (a kill round: every
    acknowledgement came more than the loss window before the cut); an acknowledged value missing after
    the last visible one is judged only on a partition read to the sentinel (``complete``)."""
    count_plain(res, plain)
    add = finding_adder(res, opts)
    sent: dict[tuple[str, int], dict[int, PlainRecord]] = {}
    for rec in plain:
        sent.setdefault((rec.topic, rec.partition), {})[rec.number] = rec
    for tp in sorted(set(visible) | set(sent)):
        name = f"{tp[0]}-{tp[1]}"
        mine = sent.get(tp, {})
        offsets: dict[int, list[int]] = {}  # number -> the offsets it is visible at
        for offset, value in visible.get(tp, []):
            parsed = parse_plain(value)
            if parsed is None or parsed[0] != res.round_no or (parsed[1], parsed[2]) != tp or parsed[3] not in mine:
                res.foreign += 1
                add("foreign", f"a plain value not written to {name} in this round: {value[:60]!r} at {name}@{offset}")
                continue
            offsets.setdefault(parsed[3], []).append(offset)
        res.plain_visible += len(offsets)
        for n, where in offsets.items():
            if len(where) > 1:
                res.plain_duplicates += 1
                add("duplicate-plain", f"{mine[n].value!r} visible {len(where)} times: "
                                       f"{', '.join(f'{name}@{o}' for o in where)}")
        in_log_order = sorted(offsets, key=lambda n: offsets[n][0])
        if in_log_order != sorted(in_log_order):
            res.plain_gaps += 1
            bad = next(i for i in range(1, len(in_log_order)) if in_log_order[i] < in_log_order[i - 1])
            a, b = in_log_order[bad - 1], in_log_order[bad]
            add("gap-plain", f"{name}: plain values out of order: #{a} at offset {offsets[a][0]} "
                             f"before #{b} at offset {offsets[b][0]}")
        top = max(offsets, default=0)
        last = f"#{top} at offset {offsets[top][0]}" if top else "none"
        for n, rec in sorted(mine.items()):
            if n in offsets:
                continue
            acked = (f"acknowledged at offset {rec.offset} {(cut_at - rec.acked_at) * 1000:.0f} ms before the cut"
                     if rec.status == "acked" and rec.acked_at is not None else rec.status)
            if rec.status == "acked" and (mode == "every-append" or acked_durable) and (n < top or tp in complete):
                res.lost_acked_plain += 1
                why = f"fsynced before its acknowledgement in {mode}" if mode == "every-append" else \
                    "acknowledged before a kill, flushed after the restart"
                add("lost-acked-plain", f"{name}: {rec.value!r} {acked} is not visible ({why}); "
                                        f"last plain value visible there: {last}")
            elif n < top and rec.status != "failed":
                res.plain_gaps += 1
                add("gap-plain", f"{name}: {rec.value!r} ({acked}) is missing below the visible {last}")
            elif rec.status == "acked" and tp in complete:
                res.plain_lost_allowed += 1


def fmt_tps(tps: list[tuple[str, int]]) -> str:
    return ", ".join(f"{t}-{p}" for t, p in tps)


# --- reporting --------------------------------------------------------------------------------------

COLUMNS = [("round", 5), ("mode", 12), ("cut", 26), ("since-ack", 9), ("txns", 5), ("commit", 6), ("abort", 5),
           ("doubt", 5), ("visible", 7), ("lost-ok", 7), ("lost!", 5), ("torn", 5), ("abrt-rd", 7), ("dup", 4),
           ("pl-ack", 6), ("pl-vis", 6), ("pl-lost!", 8), ("pl-gap", 6), ("pl-dup", 6),
           ("restart", 7), ("lso", 5), ("secs", 5)]


def header() -> str:
    return "  ".join(name.rjust(w) for name, w in COLUMNS)


def row(r: RoundResult) -> str:
    cells = [r.round_no, r.mode, r.cut, f"{r.since_ack_ms}ms" if r.since_ack_ms >= 0 else "-", r.txns, r.committed,
             r.aborted, r.in_doubt, r.visible_committed, r.lost_allowed, r.lost_acked + r.lost_old, r.torn,
             r.aborted_read, r.duplicates, r.plain_acked, r.plain_visible, r.lost_acked_plain, r.plain_gaps,
             r.plain_duplicates, "ok" if r.restarted else "FAIL",
             "ok" if r.lso_ok else ("-" if not r.restarted else "STUCK"), r.seconds]
    return "  ".join(str(c).rjust(w) for c, (_, w) in zip(cells, COLUMNS, strict=True))


def print_round(r: RoundResult, verbose: bool) -> None:
    print(row(r), flush=True)
    for f in r.findings:
        print(f"      {f.kind.upper()}: {f.detail}")
    if verbose or r.findings:
        for n in r.notes:
            print(f"      note: {n}")
    if r.workdir:
        print(f"      kept: {r.workdir}")
    sys.stdout.flush()


def totals(results: list[RoundResult], mode: str) -> dict[str, Any]:
    rs = [r for r in results if r.mode == mode]
    return {
        "mode": mode, "rounds": len(rs),
        "rounds_with_aborted_reads": sum(r.aborted_read > 0 for r in rs),
        "aborted_reads": sum(r.aborted_read for r in rs),
        "rounds_with_torn": sum(r.torn > 0 for r in rs), "torn": sum(r.torn for r in rs),
        "rounds_with_lost_acked": sum(r.lost_acked + r.lost_old > 0 for r in rs),
        "lost_acked": sum(r.lost_acked for r in rs), "lost_old": sum(r.lost_old for r in rs),
        "lost_allowed": sum(r.lost_allowed for r in rs),
        "rounds_with_duplicates": sum(r.duplicates > 0 for r in rs), "duplicates": sum(r.duplicates for r in rs),
        "restart_failures": sum(not r.restarted for r in rs),
        "lso_stuck": sum(r.restarted and not r.lso_ok for r in rs),
        "committed": sum(r.committed for r in rs), "visible_committed": sum(r.visible_committed for r in rs),
        "gaps": sum(r.gaps for r in rs),
        "plain_sent": sum(r.plain_sent for r in rs), "plain_acked": sum(r.plain_acked for r in rs),
        "plain_in_doubt": sum(r.plain_in_doubt for r in rs), "plain_failed": sum(r.plain_failed for r in rs),
        "plain_visible": sum(r.plain_visible for r in rs),
        "rounds_with_lost_acked_plain": sum(r.lost_acked_plain > 0 for r in rs),
        "lost_acked_plain": sum(r.lost_acked_plain for r in rs),
        "plain_lost_allowed": sum(r.plain_lost_allowed for r in rs),
        "rounds_with_plain_gaps": sum(r.plain_gaps > 0 for r in rs), "plain_gaps": sum(r.plain_gaps for r in rs),
        "rounds_with_plain_duplicates": sum(r.plain_duplicates > 0 for r in rs),
        "plain_duplicates": sum(r.plain_duplicates for r in rs),
        "rounds_with_violations": sum(bool(r.findings) for r in rs),
    }


def print_totals(results: list[RoundResult]) -> None:
    for mode in sorted({r.mode for r in results}, key=MODES.index):
        t = totals(results, mode)
        print(f"\n{mode}: {t['rounds']} rounds, {t['rounds_with_violations']} with violations")
        print(f"  aborted reads        {t['aborted_reads']:6d} values in {t['rounds_with_aborted_reads']} round(s)")
        print(f"  torn transactions    {t['torn']:6d} in {t['rounds_with_torn']} round(s)")
        print(f"  lost acknowledged    {t['lost_acked']:6d} (every-append), {t['lost_old']} older than the "
              f"loss window (background), in {t['rounds_with_lost_acked']} round(s)")
        print(f"  lost, allowed        {t['lost_allowed']:6d} recent committed transactions (background mode)")
        print(f"  duplicates           {t['duplicates']:6d} in {t['rounds_with_duplicates']} round(s)")
        print(f"  restart failures     {t['restart_failures']:6d}")
        print(f"  LSO stuck            {t['lso_stuck']:6d}")
        print(f"  committed / visible  {t['committed']:6d} / {t['visible_committed']}  "
              f"(lost-then-later-kept gaps, informational: {t['gaps']})")
        print(f"  plain sent / acked   {t['plain_sent']:6d} / {t['plain_acked']}  (in doubt at the cut: "
              f"{t['plain_in_doubt']}, failed before it: {t['plain_failed']}); visible {t['plain_visible']}")
        print(f"  plain lost, acked    {t['lost_acked_plain']:6d} (every-append) in "
              f"{t['rounds_with_lost_acked_plain']} round(s); allowed (background): {t['plain_lost_allowed']}")
        print(f"  plain gaps           {t['plain_gaps']:6d} in {t['rounds_with_plain_gaps']} round(s)")
        print(f"  plain duplicates     {t['plain_duplicates']:6d} in {t['rounds_with_plain_duplicates']} round(s)")


# --- main -------------------------------------------------------------------------------------------

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tests.faults.power_cut", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lazyfs", type=Path, default=os.environ.get("ONCELOG_LAZYFS"),
                    help="the LazyFS binary (default: $ONCELOG_LAZYFS)")
    ap.add_argument("--mode", choices=[*MODES, "both"], default="background")
    ap.add_argument("--rounds", type=int, default=20, help="rounds per mode")
    ap.add_argument("--first-round", type=int, default=1, help="number of the first round (to rerun one)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter whose oncelog runs as the broker, or a checkout with .venv/")
    ap.add_argument("--broker-arg", action="append", default=[], help="extra broker flag (repeatable)")
    ap.add_argument("--flush-interval-ms", type=int, default=None,
                    help="background mode: the broker's --flush-interval-ms (default: the broker's, 1000)")
    ap.add_argument("--allow-recent-loss", action="store_true",
                    help="background mode: tolerate losing commits acknowledged within the loss window")
    ap.add_argument("--loss-window-ms", type=int, default=None,
                    help="background mode: committed transactions acknowledged longer than this before the cut "
                         "must survive (default: 2 flush intervals + 1500)")
    ap.add_argument("--cut", default="random",
                    help="cut style: random (commit, busy, idle, fsync), or a comma list of "
                         "commit,busy,idle,fsync,kill used in turn")
    ap.add_argument("--fsync-wait-s", type=float, default=4.0,
                    help="fsync cut: how long to wait for the armed fsync before cutting anyway")
    ap.add_argument("--producers", type=int, default=3)
    ap.add_argument("--topics", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=3, help="partitions per topic")
    ap.add_argument("--abort-fraction", type=float, default=0.3)
    ap.add_argument("--value-bytes", type=int, default=120)
    ap.add_argument("--plain-partitions", type=int, default=2,
                    help="partitions the plain idempotent producer writes to (0: no plain producer)")
    ap.add_argument("--plain-window", type=int, default=10,
                    help="most plain values unanswered at a time (the idempotent producer has 5 requests in flight)")
    ap.add_argument("--txn-pause-ms", type=int, default=0, help="random pause between transactions, up to this")
    ap.add_argument("--min-run-s", type=float, default=2.0, help="shortest workload before the cut")
    ap.add_argument("--max-run-s", type=float, default=5.0, help="longest workload before the cut")
    ap.add_argument("--txn-timeout-s", type=float, default=4.0, help="commit/abort call timeout")
    ap.add_argument("--verify-timeout-s", type=float, default=20.0)
    ap.add_argument("--start-timeout-s", type=float, default=60.0, help="how long a broker may take to listen")
    ap.add_argument("--cache-mb", type=int, default=256, help="LazyFS cache size")
    ap.add_argument("--examples", type=int, default=3, help="findings printed per kind and round")
    ap.add_argument("--workdir", type=Path, default=None, help="where rounds run (default: a new temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep every round's directory (default: failing ones)")
    ap.add_argument("--json", type=Path, default=None, help="write every round's result here")
    ap.add_argument("--no-power-cut", action="store_true",
                    help="control run: SIGKILL only, LazyFS keeps every write (must show no violation)")
    ap.add_argument("--fail-fast", action="store_true", help="stop after the first round with a violation")
    ap.add_argument("-v", "--verbose", action="store_true")
    opts = ap.parse_args(argv)
    if opts.loss_window_ms is None:
        opts.loss_window_ms = 2 * (opts.flush_interval_ms or 1000) + 1500
    if opts.partitions * opts.topics < 2:
        ap.error("need at least two partitions in all")
    return opts


def preflight(opts: argparse.Namespace) -> None:
    if opts.lazyfs is None:
        raise HarnessError("no LazyFS binary: pass --lazyfs or set ONCELOG_LAZYFS (github.com/dsrhaslab/lazyfs)")
    opts.lazyfs = Path(opts.lazyfs).resolve()
    if not (opts.lazyfs.is_file() and os.access(opts.lazyfs, os.X_OK)):
        raise HarnessError(f"{opts.lazyfs} is not an executable LazyFS binary")
    if not Path("/dev/fuse").exists() or not stat.S_ISCHR(os.stat("/dev/fuse").st_mode):
        raise HarnessError("/dev/fuse is missing: LazyFS needs FUSE")
    if shutil.which("fusermount3") is None:
        raise HarnessError("fusermount3 not found (Debian package fuse3)")
    opts.python = broker_python(opts.python)
    r = subprocess.run([opts.python, "-c", "import oncelog, os; print(os.path.dirname(oncelog.__file__))"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise HarnessError(f"{opts.python} cannot import oncelog:\n{r.stderr}")
    opts.broker_source = r.stdout.strip()


def run(opts: argparse.Namespace) -> list[RoundResult]:
    """Run the rounds; returns their results. Raises HarnessError if it cannot run."""
    preflight(opts)
    modes = list(MODES) if opts.mode == "both" else [opts.mode]
    own_root = opts.workdir is None
    workroot = Path(tempfile.mkdtemp(prefix="oncelog-powercut-")) if own_root else opts.workdir
    workroot.mkdir(parents=True, exist_ok=True)
    what = "SIGKILL only (control, no power cut)" if opts.no_power_cut else "power cuts"
    print(f"{what} with {opts.lazyfs}; broker {opts.python} (oncelog from {opts.broker_source}); "
          f"seed {opts.seed}; rounds in {workroot}", flush=True)
    results: list[RoundResult] = []
    try:
        for mode in modes:
            print(f"\n{header()}", flush=True)
            for round_no in range(opts.first_round, opts.first_round + opts.rounds):
                try:
                    r = run_round(opts, mode, round_no, workroot)
                except HarnessError:
                    raise
                except Exception as exc:
                    import traceback
                    traceback.print_exc()
                    raise HarnessError(f"{mode} round {round_no} failed in the harness: {exc!r} "
                                       f"(its files: {workroot / f'{mode}-r{round_no:03d}'})") from exc
                results.append(r)
                print_round(r, opts.verbose)
                if opts.json:
                    write_json(opts.json, opts, results)
                if opts.fail_fast and r.findings:
                    return results
    finally:
        if own_root and not any(r.workdir for r in results):
            shutil.rmtree(workroot, ignore_errors=True)
    return results


def write_json(path: Path, opts: argparse.Namespace, results: list[RoundResult]) -> None:
    doc = {"seed": opts.seed, "python": opts.python, "broker_source": opts.broker_source,
           "totals": [totals(results, m) for m in MODES if any(r.mode == m for r in results)],
           "rounds": [asdict(r) for r in results]}
    path.write_text(json.dumps(doc, indent=1))


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)

    def on_term(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    try:
        results = run(opts)
    except HarnessError as exc:
        print(f"power_cut: cannot run: {exc}", file=sys.stderr)
        return 2
    print_totals(results)
    bad = [r for r in results if r.findings]
    if bad:
        kinds = sorted({k for r in bad for k in r.violation_kinds})
        print(f"\nVIOLATIONS in {len(bad)} of {len(results)} round(s): {', '.join(kinds)}")
        return 1
    print(f"\nno violation in {len(results)} round(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

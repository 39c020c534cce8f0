"""Power cuts at random instants, in both fsync modes, checked against what the clients were told.

Each round runs an in-process broker whose storage writes through the recording file system
(tests/storage/crashfs.py), drives transactional producers (commits, aborts, transactions left
open, several partitions and topics), idempotent producers, background flushes and internal-log
checkpoints, and cuts the power at a random write, fsync or rename -- in the middle of a
background flush, between a commit's fsyncs, anywhere. What survives is written to a fresh
directory and a new broker starts there. Invariants:

- the broker starts (nothing on disk stops it);
- no record of an aborted transaction is visible to read_committed;
- every transaction is all or nothing across its partitions;
- a commit the client was told succeeded is fully visible, in both modes (a transaction's data,
  Prepare record and markers are durable before the EndTxn reply) -- also a commit the client
  retries after the restart (for a transaction open or mid-EndTxn at the cut);
- with ``flush_every_append``, no acknowledged write is lost; in both modes none is duplicated;
- the LSO is never stuck: after the coordinator's timeout scan, every partition's LSO equals its
  high watermark, and a new transaction commits and is visible.

Half the rounds use 2 KiB segments, so that rolls (which fsync nothing themselves) happen
throughout.

``ONCELOG_POWER_CUT_ROUNDS`` sets the number of rounds per mode (make test runs a few dozen,
make fuzz thousands); ``ONCELOG_POWER_CUT_SEED`` the first seed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from oncelog.storage import fileio, partition_log
from tests.inproc import InProcessBroker
from tests.storage.crashfs import CrashFS, PowerCut
from tests.storage.helpers import batch

TOPICS = {"pa": 3, "pb": 2}
PARTITIONS = [(t, p) for t, n in TOPICS.items() for p in range(n)]
ROUNDS = int(os.environ.get("ONCELOG_POWER_CUT_ROUNDS", "40"))
FIRST_SEED = int(os.environ.get("ONCELOG_POWER_CUT_SEED", "1"))
TXN_TIMEOUT_MS = 60_000


@dataclass
class Txn:
    key: str
    values: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)  # acknowledged
    sent: dict[tuple[str, int], list[bytes]] = field(default_factory=dict)  # sent when the power went out
    outcome: str = "open"  # open, committed (acked), aborted (acked or refused), unknown (cut mid-EndTxn)


@dataclass
class Producer:
    tid: str
    pid: int = -1
    epoch: int = -1
    seqs: dict[tuple[str, int], int] = field(default_factory=dict)
    txn: Txn | None = None
    n: int = 0


class Workload:
    """Drives the broker and keeps what each client was told."""

    def __init__(self, b: InProcessBroker, rng: random.Random, tag: str) -> None:
        self.b = b
        self.rng = rng
        self.tag = tag
        self.producers = [Producer(f"tx-{i}") for i in range(3)]
        self.txns: list[Txn] = []
        self.idem_pid = -1
        self.idem_seq: dict[tuple[str, int], int] = {}
        self.idem_acked: dict[tuple[str, int], list[bytes]] = {}
        self.idem_sent: set[bytes] = set()
        self.n_idem = 0
        self.flushing: list[Any] = []  # background flush passes planned, not yet run
        self.checkpoints = 0  # passes that wrote the recovery-point checkpoint

    def step(self) -> None:
        r = self.rng.random()
        if r < 0.55:
            self._txn_step(self.rng.choice(self.producers))
        elif r < 0.75:
            self._idempotent_write()
        elif r < 0.8:
            # the broker's background flush: a pass planned now on the loop, run later on the
            # flush thread (passes in any order: the thread is not assumed to keep theirs)
            self.b.clock.advance(self.rng.randint(50, 700))
            flush_pass = self.b.broker.logs.begin_flush_pass(self.b.clock.now_ms())
            if flush_pass is not None:
                self.flushing.append(flush_pass)
        elif r < 0.86 and self.flushing:
            flush_pass = self.flushing.pop(self.rng.randrange(len(self.flushing)))
            flush_pass.run()  # a PowerCut (not an OSError) goes through
            self.checkpoints += flush_pass.wrote_checkpoint
            self.b.broker.logs.finish_flush_pass(flush_pass)
        elif r < 0.9:
            self.b.clock.advance(self.rng.randint(50, 700))
            self.b.broker.logs.flush_all(self.b.clock.now_ms())
        elif r < 0.95:
            self.b.broker.coordination.checkpoint_internal_logs(2048)
        else:
            self.b.clock.advance(self.rng.randint(1, 300))

    def _init(self, p: Producer) -> bool:
        for _ in range(3):
            err, pid, epoch = self.b.init_producer_id(p.tid, timeout_ms=TXN_TIMEOUT_MS)
            if err == 0:
                p.pid, p.epoch, p.seqs = pid, epoch, {}
                return True
        return False

    def _txn_step(self, p: Producer) -> None:
        if p.pid < 0 and not self._init(p):
            return
        if p.txn is None:
            p.n += 1
            p.txn = Txn(f"{self.tag}/{p.tid}/{p.n}")
            self.txns.append(p.txn)
        txn = p.txn
        action = self.rng.random()
        if action < 0.6 or not txn.values:
            parts = self.rng.sample(PARTITIONS, self.rng.randint(1, 3))
            errors = self.b.add_partitions(p.tid, p.pid, p.epoch, parts)
            if any(errors.values()):
                self._lose(p)
                return
            for tp in parts:
                seq = p.seqs.get(tp, 0)
                values = [f"{txn.key}/{tp[0]}-{tp[1]}/{seq + i}".encode() for i in range(self.rng.randint(1, 3))]
                data = b"".join(batch(1, pid=p.pid, epoch=p.epoch, seq=seq + i, txn=True, value=v)
                                for i, v in enumerate(values[:1]))
                if len(values) > 1:  # one batch of several records
                    data = _multi(values, p.pid, p.epoch, seq)
                txn.sent[tp] = values
                code = self.b.produce(tp[0], tp[1], data, transactional_id=p.tid)
                del txn.sent[tp]
                if code != 0:
                    self._lose(p)
                    return
                p.seqs[tp] = seq + len(values)
                txn.values.setdefault(tp, []).extend(values)
        else:
            commit = action < 0.9
            if commit:
                txn.outcome = "unknown"  # a cut inside EndTxn leaves it unknown
            code = self.b.end_txn(p.tid, p.pid, p.epoch, commit)
            if code == 0:
                txn.outcome = "committed" if commit else "aborted"
            else:
                txn.outcome = "aborted"  # refused: never committed
                p.pid = -1
            p.txn = None

    def _lose(self, p: Producer) -> None:
        """The producer's transaction failed (fenced, or its state lost): it is never committed."""
        if p.txn is not None:
            p.txn.outcome = "aborted"
        p.txn = None
        p.pid = -1

    def _idempotent_write(self) -> None:
        if self.idem_pid < 0:
            err, self.idem_pid, _ = self.b.init_producer_id(None)
            assert err == 0
            self.idem_seq = {}
        tp = self.rng.choice(PARTITIONS)
        seq = self.idem_seq.get(tp, 0)
        self.n_idem += 1
        value = f"{self.tag}/idem/{self.n_idem}".encode()
        self.idem_sent.add(value)
        code = self.b.produce(tp[0], tp[1], batch(1, pid=self.idem_pid, epoch=0, seq=seq, value=value))
        if code == 0:
            self.idem_seq[tp] = seq + 1
            self.idem_acked.setdefault(tp, []).append(value)
        else:
            self.idem_pid = -1


def _multi(values: list[bytes], pid: int, epoch: int, seq: int) -> bytes:
    from oncelog.protocol import records as rb

    recs = [rb.encode_record(i, i, None, v) for i, v in enumerate(values)]
    return rb.build_batch(recs, base_timestamp=1_000, attributes=rb.ATTR_TRANSACTIONAL, producer_id=pid,
                          producer_epoch=epoch, base_sequence=seq)


@pytest.fixture
def real_fs() -> Iterator[None]:
    saved = fileio.fs
    yield
    fileio.fs = saved


def run_round(seed: int, flush_every_append: bool, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    rng = random.Random(seed)
    before, after = tmp / f"r{seed}-before", tmp / f"r{seed}-after"
    recording = CrashFS(before)
    fileio.fs = recording
    # Half the rounds roll a segment every few batches: a roll leaves its fsyncs to the next flush
    # or sync, which must make the new file's name durable before counting data in it (its own RNG,
    # so a seed's workload is the same either way).
    segment_bytes = 2_048 if random.Random(seed * 7_919).random() < 0.5 else 1_073_741_824
    # And a periodic flush writes a producer-state snapshot every time, after the default 30 s, or
    # never (only at a roll or a full flush): the recovery point then reaches the disk through the
    # directory's checkpoint, and recovery replays producer state from an older snapshot.
    monkeypatch.setattr(partition_log, "SNAPSHOT_INTERVAL_MS",
                        random.Random(seed * 104_729).choice([0, partition_log.SNAPSHOT_INTERVAL_MS, 10**12]))
    b = InProcessBroker(before, flush_every_append=flush_every_append, flush_interval_ms=500,
                        log_segment_bytes=segment_bytes)
    for topic, n in TOPICS.items():
        b.create_topic(topic, n)
    w = Workload(b, rng, f"s{seed}")
    for _ in range(rng.randint(0, 40)):  # warm up
        w.step()
    recording.cut_after(rng.randint(1, 400))
    try:
        for _ in range(400):
            w.step()
        raise PowerCut("at the end of the workload")
    except PowerCut:
        pass
    b.broker.release_data_dir()
    b.loop.close()
    writeback = rng.choice([0.0, 0.0, 0.5])
    stats = recording.materialize(after, rng, writeback)
    fileio.fs = fileio.FileSystem()
    b2 = InProcessBroker(after, clock=b.clock, flush_every_append=flush_every_append,
                         log_segment_bytes=segment_bytes)  # must start
    try:
        check(b2, w, flush_every_append, f"seed {seed} (writeback {writeback}, segments of {segment_bytes} bytes)")
    finally:
        b2.close()
    return {"ops": recording.ops, "checkpoints": w.checkpoints, **stats}


def check_offsets_backed(b: InProcessBroker, where: str) -> None:
    """Every partition's log end offset is backed by its files: the last batch ends just below it.
    A recovery point on disk above the durable data would leave a log end with nothing below it.
    (A gap *between* segments above the recovery point is accepted, as Kafka's recovery accepts it:
    a segment whose unsynced tail was lost while the next segment's data reached the disk ends
    short, with nothing torn; such a gap also exists in every compacted log.)"""
    for (topic, partition), plog in b.broker.logs.partitions().items():
        last_end = max((h.last_offset + 1 for seg in plog.segments for _pos, h, _data in seg.iter_batches()),
                       default=plog.active.base_offset)
        assert last_end == plog.log_end_offset, \
            f"{where}: {topic}-{partition}'s data ends at {last_end}, its log end offset is {plog.log_end_offset}"


def check(b: InProcessBroker, w: Workload, flush_every_append: bool, where: str) -> None:
    check_offsets_backed(b, where)
    # Each client whose transaction was open (or whose EndTxn was cut) commits it now, as an
    # application retrying commit_transaction would: the broker's answer must match what it shows.
    for p in w.producers:
        if p.txn is not None and p.pid >= 0:
            code = b.end_txn(p.tid, p.pid, p.epoch, True)
            p.txn.outcome = "committed" if code == 0 else "aborted"
    # The timeout scan ends what is still open.
    b.clock.advance(TXN_TIMEOUT_MS + 1)
    b.broker.coordination.expire_transactions()
    visible: dict[tuple[str, int], list[bytes]] = {tp: b.visible_values(*tp) for tp in PARTITIONS}
    seen_anywhere: dict[bytes, int] = {}
    for vs in visible.values():
        for v in vs:
            seen_anywhere[v] = seen_anywhere.get(v, 0) + 1
    dups = [v for v, n in seen_anywhere.items() if n > 1]
    assert not dups, f"{where}: duplicated {dups[:5]}"
    for txn in w.txns:
        shown = {tp: [v for v in visible[tp] if v.startswith(txn.key.encode() + b"/")] for tp in PARTITIONS}
        n_shown = sum(len(v) for v in shown.values())
        n_sent = sum(len(v) for v in txn.values.values())
        # A batch whose produce was cut may or may not be part of the transaction (its ack was lost).
        n_unacked = sum(len([v for v in shown[tp] if v in txn.sent.get(tp, [])]) for tp in PARTITIONS)
        if txn.outcome in ("aborted", "open"):
            assert n_shown == 0, f"{where}: {txn.outcome} transaction {txn.key} visible: {shown}"
        elif txn.outcome == "committed":
            assert n_shown - n_unacked == n_sent, \
                f"{where}: acknowledged commit {txn.key} shows {n_shown} of {n_sent}: {shown}"
        else:  # unknown
            assert n_shown - n_unacked in (0, n_sent), \
                f"{where}: transaction {txn.key} torn: {n_shown} of {n_sent}: {shown}"
        if n_shown:
            for tp in PARTITIONS:
                acked, maybe = txn.values.get(tp, []), txn.sent.get(tp, [])
                extra = shown[tp][len(acked):]
                assert shown[tp][:len(acked)] == acked and extra == maybe[:len(extra)], \
                    f"{where}: {txn.key} in {tp}: {shown[tp]} is not {acked} then a prefix of {maybe}"
    for tp in PARTITIONS:
        idem = [v for v in visible[tp] if b"/idem/" in v]
        acked = w.idem_acked.get(tp, [])
        assert all(v in w.idem_sent for v in idem)
        if flush_every_append:
            missing = [v for v in acked if v not in idem]
            assert not missing, f"{where}: acknowledged writes lost in {tp}: {missing[:5]}"
        kept = [v for v in acked if v in idem]
        assert kept == [v for v in idem if v in acked], f"{where}: reordered in {tp}"
    for tp in [*PARTITIONS, ("__consumer_offsets", 0), ("__transaction_state", 0)]:
        plog = b.broker.logs.get_partition(*tp)
        assert plog is not None
        assert plog.last_stable_offset == plog.high_watermark, f"{where}: LSO stuck in {tp}"
    # a new transaction commits and is read
    err, pid, epoch = b.init_producer_id("after-the-cut")
    assert err == 0, f"{where}: InitProducerId after restart: {err}"
    assert b.add_partitions("after-the-cut", pid, epoch, [("pa", 0)]) == {("pa", 0): 0}
    assert b.produce("pa", 0, batch(1, pid=pid, epoch=epoch, seq=0, txn=True, value=b"after"),
                     transactional_id="after-the-cut") == 0
    assert b.end_txn("after-the-cut", pid, epoch, True) == 0
    assert b.visible_values("pa", 0)[-1] == b"after", f"{where}: the new commit is not visible"


@pytest.mark.parametrize("flush_every_append", [False, True], ids=["background-fsync", "flush-every-append"])
def test_power_cuts(tmp_path: Path, real_fs: None, flush_every_append: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    totals = {"ops": 0, "files": 0, "checkpoints": 0}
    for seed in range(FIRST_SEED, FIRST_SEED + ROUNDS):
        stats = run_round(seed, flush_every_append, tmp_path, monkeypatch)
        for key in totals:
            totals[key] += stats[key]
    assert totals["ops"] > ROUNDS * 10  # the cuts did land inside real work
    print(totals)
    assert totals["checkpoints"] > 0  # and so did recovery points recorded by the checkpoint alone

"""A Jepsen-style checker over a recorded history (pure: history in, anomalies out).

After Jepsen's Kafka workload (``jepsen.tests.kafka``) and Kafka's transactions system test. Every
check is linear or n log n in the size of the history; docs/design/verify.md lists each anomaly,
how it is detected and what it costs. Each anomaly names the operations involved (process,
transaction, value, partition/offset). Nothing a broker answers makes the checker raise: missing or
odd offsets and values nobody wrote are anomalies like any other.

Outcomes: a transaction the client saw commit is *committed*, one it aborted (or that a newer
instance with the same transactional.id fenced) is *aborted*; one whose commit failed ambiguously
is *unknown*, and is inferred committed as soon as any of its values was read (then all of them must
be visible: atomicity), aborted otherwise.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise

from oncelog.verify.cycles import shortest_cycle, strongly_connected
from oncelog.verify.history import History, Poll, Send, Txn, normalized

KINDS = ("lost-write", "unseen", "torn-transaction", "duplicate", "inconsistent-offset", "aborted-read",
         "read-above-lso", "garbage-read", "missing-offset", "zombie-accepted", "non-monotonic-send",
         "non-monotonic-poll", "poll-skip", "output-missing", "output-duplicate", "output-stalled",
         "offset-commit-mismatch", "rewind-mismatch", "G1c")

TxnKey = tuple[str, int]


@dataclass
class Anomaly:
    kind: str
    detail: str


@dataclass
class RoleActivity:
    """What one client did inside the fault window (from the first fault to when faults stopped):
    transactions by their outcome as the checker settled it (committed includes unknown outcomes
    inferred committed), non-transactional writes acknowledged (--no-txn), records its polls returned."""

    role: str
    kind: str  # "producer" | "copier" | "reader"
    committed: int = 0
    aborted: int = 0
    unknown: int = 0
    acked: int = 0
    reads: int = 0

    @property
    def active(self) -> bool:
        """Did what the run's guarantees need of it under faults: a reader read, a writer committed."""
        return self.reads > 0 if self.kind == "reader" else self.committed + self.acked > 0


@dataclass
class Report:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # found but allowed (G0), or what was not checked
    window: tuple[int, int] | None = None  # the fault window (ms), None without faults
    activity: list[RoleActivity] = field(default_factory=list)  # per client, inside the fault window
    inconclusive: list[str] = field(default_factory=list)  # why "no anomaly" proves less than it says

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for a in self.anomalies:
            out[a.kind] = out.get(a.kind, 0) + 1
        return out

    @property
    def ok(self) -> bool:
        return not self.anomalies

    def add(self, kind: str, detail: str) -> None:
        self.anomalies.append(Anomaly(kind, detail))


def _name(key: TxnKey) -> str:
    return f"{key[0]} txn {key[1]}"


class Index:
    """What every check needs, built once in O(n): writers, outcomes, reads, the final read."""

    def __init__(self, h: History) -> None:
        h = normalized(h)
        self.h = h
        self.txns: dict[TxnKey, Txn] = {}
        for t in h.txns:
            self.txns.setdefault((t.process, t.txn), t)
        self.writer: dict[str, Send] = {}
        self.sends_of: dict[TxnKey, list[Send]] = defaultdict(list)
        self.copies_of: dict[str, list[str]] = defaultdict(list)
        for s in h.sends:
            if s.value in self.writer:
                continue  # values are unique by construction; a repeat is a replayed history line
            self.writer[s.value] = s
            self.sends_of[(s.process, s.txn)].append(s)
            if s.source:
                self.copies_of[s.source].append(s.value)
        # Reads with a usable position; a record without one is reported as missing-offset.
        self.reads: list[tuple[Poll, int, int, str]] = []
        self.bad_reads: list[tuple[Poll, int, int, str]] = []
        self.txn_reads: list[tuple[Poll, int, int, str]] = []  # reads inside consume-transform-produce txns
        self.seen: set[str] = set()
        self.final_values: set[str] = set()
        self.final_max: dict[int, int] = {}
        self.final_order: dict[int, list[tuple[int, str]]] = defaultdict(list)
        self.final_ends: dict[int, int] = {}  # partition -> the end offset the final read read up to
        self.has_final = False
        for p in h.polls:
            self.has_final |= p.final
            if p.final:
                for partition, end in p.ends.items():
                    self.final_ends[partition] = max(end, self.final_ends.get(partition, end))
            for partition, offset, value in p.records:
                if partition < 0 or offset < 0:
                    self.bad_reads.append((p, partition, offset, value))
                    self.seen.add(value)
                    continue
                self.reads.append((p, partition, offset, value))
                if p.txn >= 0 and p.txn_process:
                    self.txn_reads.append((p, partition, offset, value))
                self.seen.add(value)
                if p.final:
                    self.final_values.add(value)
                    self.final_order[partition].append((offset, value))
                    if offset > self.final_max.get(partition, -1):
                        self.final_max[partition] = offset
        # Effective outcome of every transaction (and of every non-transactional send).
        self.status: dict[TxnKey, str] = {}
        for key, t in self.txns.items():
            if t.fenced_ms >= 0 or t.outcome == "aborted":
                self.status[key] = "aborted"
            elif t.outcome == "committed":
                self.status[key] = "committed"
            else:
                values = t.values or [s.value for s in self.sends_of.get(key, [])]
                self.status[key] = "unknown-visible" if any(v in self.seen for v in values) else "unknown"
        self.must_exist: set[str] = set()  # a correct broker returns these to the final read
        self.visible: set[str] = set()  # must_exist plus values of unknown transactions inferred committed
        self.forbidden: set[str] = set()  # values of aborted transactions
        for s in h.sends:
            state = self.outcome_of(s)
            if state == "committed":
                self.must_exist.add(s.value)
                self.visible.add(s.value)
            elif state == "unknown-visible":
                self.visible.add(s.value)
            elif state == "aborted":
                self.forbidden.add(s.value)

    def final_reached(self, partition: int) -> int:
        """The offset below which the final read read everything in ``partition``: the end offset it
        recorded (the LSO when it started), or one past the last offset it returned (older
        histories, and records it returned past that end)."""
        past_last = self.final_max.get(partition, -1) + 1
        return max(self.final_ends.get(partition, past_last), past_last)

    def key_of(self, value: str) -> TxnKey | None:
        s = self.writer.get(value)
        return None if s is None else (s.process, s.txn)

    def outcome_of(self, s: Send) -> str:
        if s.txn < 0:
            return "committed" if s.acked else "unknown"
        return self.status.get((s.process, s.txn), "unknown")

    def copier_txns(self) -> list[Txn]:
        return [t for t in self.txns.values() if t.group]


# --- the checks: each is O(n) or O(n log n) in the history's size ------------------------------------

def check_offsets_present(ix: Index, r: Report) -> None:
    """missing-offset: an acknowledged send, or a record read, without a (non-negative) offset."""
    for s in ix.h.sends:
        if s.acked and (s.offset < 0 or s.partition < 0):
            r.add("missing-offset", f"{s.value} ({_name((s.process, s.txn))}) was acknowledged without an "
                                    f"offset (partition {s.partition}, offset {s.offset})")
    for p, partition, offset, value in ix.bad_reads:
        r.add("missing-offset", f"{p.process} read {value} without a position (partition {partition}, "
                                f"offset {offset})")


def check_garbage(ix: Index, r: Report) -> None:
    """garbage-read: a record whose value no client ever sent."""
    for p, partition, offset, value in [*ix.reads, *ix.bad_reads]:
        if value not in ix.writer:
            r.add("garbage-read", f"{p.process} read {value!r} at {partition}/{offset}, a value no client sent")


def check_offsets_agree(ix: Index, r: Report) -> None:
    """duplicate: one value at two positions; inconsistent-offset: one position holding two values.
    Positions come from reads and from delivery reports (as Jepsen's version orders do)."""
    at_offset: dict[tuple[int, int], set[str]] = defaultdict(set)
    offsets_of: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for _p, partition, offset, value in ix.reads:
        at_offset[(partition, offset)].add(value)
        offsets_of[value].add((partition, offset))
    for s in ix.h.sends:
        if s.acked and s.offset >= 0 and s.partition >= 0:
            at_offset[(s.partition, s.offset)].add(s.value)
            offsets_of[s.value].add((s.partition, s.offset))
    for value, where in offsets_of.items():
        if len(where) > 1:
            r.add("duplicate", f"{value} at {sorted(where)}")
    for (partition, offset), values in at_offset.items():
        if len(values) > 1:
            r.add("inconsistent-offset", f"partition {partition} offset {offset} holds {sorted(values)}")


def check_aborted_and_early_reads(ix: Index, r: Report) -> None:
    """aborted-read (G1a): a read_committed consumer returned a value of an aborted transaction.
    read-above-lso: a value returned before its transaction even started to commit."""
    for p, partition, offset, value in ix.reads:
        key = ix.key_of(value)
        if key is None:
            continue
        if value in ix.forbidden:
            t = ix.txns.get(key)
            why = " (fenced by a newer instance)" if t is not None and t.fenced_ms >= 0 else ""
            r.add("aborted-read", f"{p.process} read {value} at {partition}/{offset} from aborted "
                                  f"txn {key[1]} of {key[0]}{why}")
            continue
        t = ix.txns.get(key)
        if t is not None and not p.final and t.commit_started_ms >= 0 and p.time_ms < t.commit_started_ms:
            r.add("read-above-lso", f"{p.process} read {value} at t={p.time_ms} ms, before txn {key[1]} "
                                    f"of {key[0]} started to commit at t={t.commit_started_ms} ms")


def check_lost(ix: Index, r: Report) -> None:
    """lost-write: committed, but the final read passed its position without returning it;
    unseen: committed and acknowledged at a position the final read never reached. Where the final
    read ended is its recorded end offset (so a lost write at a partition's end, past the last record
    it returned but below that end, is a lost write), or one past its last record in older histories."""
    if not ix.has_final:
        r.notes.append("no final read in the history: lost writes were not checked")
        return
    for value in sorted(ix.must_exist - ix.final_values):
        s = ix.writer[value]
        who = f"{value} (process {s.process}, txn {s.txn})"
        reached = ix.final_reached(s.partition)
        known = s.partition in ix.final_ends
        if s.acked and s.offset >= 0 and s.offset >= reached:
            where = (f"ended at {s.partition}/{reached}, the partition's end when it started" if known
                     else f"stopped at {s.partition}/{reached - 1}")
            r.add("unseen", f"{who} was acknowledged at {s.partition}/{s.offset} but the final read {where}")
            continue
        passed = (f" (acknowledged at {s.partition}/{s.offset}; the final read read every offset of partition "
                  f"{s.partition} below {reached})" if known and s.acked and s.offset >= 0 else "")
        r.add("lost-write", f"{who} was committed but the final read did not return it{passed}")


def check_atomicity(ix: Index, r: Report) -> None:
    """torn-transaction: a transaction with an unknown outcome some of whose values were read (so it
    committed) but not all of them are in the final read."""
    if not ix.has_final:
        return
    for key, state in ix.status.items():
        if state != "unknown-visible":
            continue
        values = [s.value for s in ix.sends_of.get(key, [])]
        missing = [v for v in values if v not in ix.final_values]
        if missing:
            read = [v for v in values if v in ix.seen]
            r.add("torn-transaction", f"{_name(key)} (outcome unknown) is partly visible: read {read[:6]}, "
                                      f"but the final read lacks {missing[:6]}")


def check_zombies(ix: Index, r: Report) -> None:
    """zombie-accepted: after a newer instance with the same transactional.id initialised, the broker
    acknowledged a write or the commit of the fenced instance."""
    for key, t in ix.txns.items():
        if t.fenced_ms < 0:
            continue
        if t.outcome == "committed":
            r.add("zombie-accepted", f"{_name(key)} was fenced at t={t.fenced_ms} ms, yet its commit was "
                                     "acknowledged")
        for s in ix.sends_of.get(key, []):
            if s.acked and s.time_ms > t.fenced_ms:
                r.add("zombie-accepted", f"{_name(key)} was fenced at t={t.fenced_ms} ms, yet {s.value} sent "
                                         f"at t={s.time_ms} ms was acknowledged at {s.partition}/{s.offset}")


def check_send_order(ix: Index, r: Report) -> None:
    """non-monotonic-send: one producer's acknowledged offsets in a partition went backwards
    (sends are recorded in the order each process made them)."""
    last: dict[tuple[str, int], Send] = {}
    for s in ix.h.sends:
        if not s.acked or s.offset < 0:
            continue
        prev = last.get((s.process, s.partition))
        if prev is not None and s.offset <= prev.offset:
            r.add("non-monotonic-send", f"{s.process} sent {s.value} (acknowledged at {s.partition}/{s.offset}) "
                                        f"after {prev.value} (acknowledged at {s.partition}/{prev.offset})")
        last[(s.process, s.partition)] = s


def _visible_offsets(ix: Index) -> dict[int, list[int]]:
    """Per partition, the sorted positions at which values that must be visible were read."""
    out: dict[int, set[int]] = defaultdict(set)
    for _p, partition, offset, value in ix.reads:
        if value in ix.visible:
            out[partition].add(offset)
    return {p: sorted(o) for p, o in out.items()}


def _between(offsets: list[int], lo: int, hi: int) -> list[int]:
    """The elements of sorted ``offsets`` strictly between lo and hi (O(log n) + the answer)."""
    i, j = bisect_right(offsets, lo), bisect_left(offsets, hi)
    return offsets[i:j] if i < j else []


def check_polls(ix: Index, r: Report) -> None:
    """non-monotonic-poll: within one consumer session a partition's offsets did not increase;
    poll-skip: a session jumped over a position holding a committed value. One pass over the reads in
    time order plus a binary search per read: O(R log R) (it was a scan of every committed offset per
    read before)."""
    visible = _visible_offsets(ix)
    last: dict[tuple[str, int], int] = {}
    order = sorted(range(len(ix.h.polls)), key=lambda i: ix.h.polls[i].time_ms)
    for i in order:
        p = ix.h.polls[i]
        for partition, offset, value in p.records:
            if partition < 0 or offset < 0:
                continue
            prev = last.get((p.process, partition))
            if prev is not None:
                if offset <= prev:
                    r.add("non-monotonic-poll", f"{p.process} read {partition}/{offset} ({value}) after "
                                                f"{partition}/{prev}")
                else:
                    skipped = _between(visible.get(partition, []), prev, offset)
                    if skipped:
                        r.add("poll-skip", f"{p.process} jumped from {partition}/{prev} to {partition}/{offset}, "
                                           f"skipping {skipped[:5]}")
            last[(p.process, partition)] = offset


def check_output(ix: Index, r: Report) -> None:
    """The consume-transform-produce copier's exactly-once output: every visible original value has
    exactly one visible copy written by a transaction that was not aborted (output-missing,
    output-duplicate); output-stalled when the copier group never caught up with its input after the
    producers stopped (then output-missing is not reported)."""
    if not ix.copier_txns() and not ix.copies_of:
        return
    drained = ix.h.meta.get("drained", True)
    if drained is False:
        r.add("output-stalled", str(ix.h.meta.get("drain_detail", "the copier group did not catch up")))
    if not ix.has_final:
        return
    for value in sorted(ix.final_values):
        s = ix.writer.get(value)
        if s is None or s.source:
            continue
        t = ix.txns.get((s.process, s.txn))
        if t is not None and t.group:
            continue  # written by a copier: output, not input
        # Copies by aborted copier transactions do not count (if visible, they are aborted reads).
        copies = [c for c in ix.copies_of.get(value, []) if c in ix.final_values and c not in ix.forbidden]
        if len(copies) > 1:
            writers = [_name(k) for k in (ix.key_of(c) for c in copies) if k is not None]
            r.add("output-duplicate", f"{value} was copied {len(copies)} times: {copies[:4]} by {writers[:4]}")
        elif not copies and drained is not False:
            r.add("output-missing", f"{value} (at {s.partition}) is in the input but no committed copy of it "
                                    f"is in the output")


def check_committed_offsets(ix: Index, r: Report) -> None:
    """offset-commit-mismatch: (a) a committed copier transaction must carry, for every partition it
    consumed, an offset past the last record it consumed with no visible record in between; (b) the
    group's committed offset a client reads must be one some committed (or unknown) transaction sent,
    and not below what a transaction that committed before the read had sent; (c) a consumer that
    resumes at a committed offset must not skip a visible record nor start below it."""
    txns = ix.copier_txns()
    if not txns:
        return
    visible = _visible_offsets(ix)
    consumed: dict[TxnKey, dict[int, tuple[int, int]]] = defaultdict(dict)  # partition -> (first, last)
    for p, partition, offset, _value in ix.txn_reads:
        seen = consumed[(p.txn_process, p.txn)].get(partition)
        consumed[(p.txn_process, p.txn)][partition] = (
            (offset, offset) if seen is None else (min(seen[0], offset), max(seen[1], offset)))
    for t in txns:
        key = (t.process, t.txn)
        if ix.status.get(key) not in ("committed", "unknown-visible"):
            continue  # an unknown outcome with nothing visible did not commit: what it sent is moot
        for partition, (_first, last) in sorted(consumed.get(key, {}).items()):
            sent = t.offsets.get(partition)
            if sent is None:
                r.add("offset-commit-mismatch", f"{_name(key)} consumed {partition}/{last} but sent no offset "
                                                f"for partition {partition}")
            elif sent <= last:
                r.add("offset-commit-mismatch", f"{_name(key)} consumed {partition}/{last} but sent offset "
                                                f"{sent}")
            elif skipped := _between(visible.get(partition, []), last, sent):
                r.add("offset-commit-mismatch", f"{_name(key)} consumed up to {partition}/{last} and sent "
                                                f"offset {sent}, skipping visible {skipped[:5]}")
    # (b): per (group, partition): offsets sent by transactions that may have committed, and a prefix
    # maximum of those that certainly committed, by end time.
    valid: dict[tuple[str, int], set[int]] = defaultdict(set)
    aborted_sent: dict[tuple[str, int], dict[int, TxnKey]] = defaultdict(dict)
    done: dict[tuple[str, int], list[tuple[int, int, TxnKey]]] = defaultdict(list)
    committed_sent: dict[tuple[str, int], dict[int, list[Txn]]] = defaultdict(lambda: defaultdict(list))
    for t in txns:
        key = (t.process, t.txn)
        state = ix.status.get(key)
        for partition, off in t.offsets.items():
            gp = (t.group, partition)
            if state == "aborted":
                aborted_sent[gp][off] = key
                continue
            valid[gp].add(off)
            if state == "committed":
                done[gp].append((t.end_ms, off, key))
                committed_sent[gp][off].append(t)
    backwards: set[tuple[TxnKey, int]] = set()  # (transaction, partition) already reported as going back
    prefix: dict[tuple[str, int], tuple[list[int], list[tuple[int, TxnKey]]]] = {}
    for gp, items in done.items():
        items.sort()
        ends, best = [], []
        top: tuple[int, TxnKey] = (-1, ("", -1))
        for end, off, key in items:
            if off > top[0]:
                top = (off, key)
            ends.append(end)
            best.append(top)
        prefix[gp] = (ends, best)
    sessions = _first_reads(ix)
    for obs in ix.h.offsets:
        for partition, c in sorted(obs.offsets.items()):
            gp = (obs.group, partition)
            ends, best = prefix.get(gp, ([], []))
            i = bisect_left(ends, obs.start_ms)
            low, low_key = best[i - 1] if i > 0 else (-1, None)
            who = f"{obs.process} read the committed offset of group {obs.group} partition {partition} " \
                  f"(after {obs.after}, t={obs.start_ms} ms) as {c}"
            if c < 0:
                if low_key is not None:
                    r.add("offset-commit-mismatch", f"{who} (none), but {_name(low_key)} had committed {low}")
            elif c < low and low_key is not None:
                # Did a later committed transaction send this lower offset? Then the broker answered
                # right, and what went wrong is that transaction: it consumed input below the group's
                # committed offset (its consumer's position went back), and committed it.
                low_end = ix.txns[low_key].end_ms
                later = sorted((t for t in committed_sent.get(gp, {}).get(c, [])
                                if low_end < t.end_ms and t.commit_started_ms <= obs.end_ms),
                               key=lambda t: t.end_ms)
                if not later:
                    r.add("offset-commit-mismatch", f"{who}, below the {low} that {_name(low_key)} had committed")
                else:
                    back = (later[0].process, later[0].txn)
                    if (back, partition) not in backwards:  # once per transaction, however often read back
                        backwards.add((back, partition))
                        span = consumed.get(back, {}).get(partition)
                        input_ = f" (it consumed {partition}/{span[0]}-{span[1]})" if span else ""
                        r.add("offset-commit-mismatch",
                              f"{_name(back)} committed offset {c} for partition {partition}{input_} after "
                              f"{_name(low_key)} had committed {low}: a committed transaction consumed input "
                              f"below the group's committed offset ({obs.process} read {c} back at "
                              f"t={obs.start_ms} ms)")
            elif c not in valid.get(gp, set()):
                origin = aborted_sent.get(gp, {}).get(c)
                why = f", sent only by aborted {_name(origin)}" if origin else ", an offset no transaction sent"
                r.add("offset-commit-mismatch", f"{who}{why}")
            if obs.after == "assign" and obs.session and c >= 0:
                first = sessions.get((obs.session, partition))
                if first is None:
                    continue
                if first < c:
                    r.add("offset-commit-mismatch", f"{obs.session} resumed at committed {partition}/{c} "
                                                    f"but read {partition}/{first} first")
                elif skipped := _between(visible.get(partition, []), c - 1, first):
                    r.add("offset-commit-mismatch", f"{obs.session} resumed at committed {partition}/{c} but "
                                                    f"its first read was {partition}/{first}, skipping {skipped[:5]}")


def check_rewinds(ix: Index, r: Report) -> None:
    """rewind-mismatch: a copier transaction that did not commit has its consumer sought back to the
    transaction's first offsets (recorded as ``rewound``, with the session that follows); that
    session's first read of each such partition must be at that offset. Elsewhere, the position moved
    by itself: below, input already committed is copied again; above, input is skipped. A rebalance
    starts another session, so it is not mistaken for one. O(R)."""
    firsts = _first_reads(ix)
    for t in ix.copier_txns():
        if not t.rewind_session:
            continue
        for partition, target in sorted(t.rewound.items()):
            got = firsts.get((t.rewind_session, partition))
            if got is not None and got != target:
                r.add("rewind-mismatch", f"{t.rewind_session} read {partition}/{got} first, but "
                                         f"{_name((t.process, t.txn))} did not commit and its consumer was sought "
                                         f"back to {partition}/{target}")


def _first_reads(ix: Index) -> dict[tuple[str, int], int]:
    first: dict[tuple[str, int], tuple[int, int]] = {}
    for p, partition, offset, _value in ix.reads:
        k = (p.process, partition)
        if k not in first or (p.time_ms, offset) < first[k]:
            first[k] = (p.time_ms, offset)
    return {k: v[1] for k, v in first.items()}


def dependency_graphs(ix: Index) -> tuple[dict[TxnKey, set[TxnKey]], dict[TxnKey, set[TxnKey]]]:
    """(ww, wr) edges between transactions that committed (or were inferred committed).
    ww: T1's value immediately precedes T2's in a partition's log (the final read's offset order);
    wr: T2 read, inside its transaction, a value T1 wrote. O(R)."""
    live = {k for k, s in ix.status.items() if s in ("committed", "unknown-visible")}
    ww: dict[TxnKey, set[TxnKey]] = defaultdict(set)
    wr: dict[TxnKey, set[TxnKey]] = defaultdict(set)
    for records in ix.final_order.values():
        prev: TxnKey | None = None
        for _offset, value in sorted(records):
            key = ix.key_of(value)
            if key is None or key not in live:
                continue
            if prev is not None and prev != key:
                ww[prev].add(key)
            prev = key
    for p, _partition, _offset, value in ix.txn_reads:
        reader = (p.txn_process, p.txn)
        writer = ix.key_of(value)
        if writer is None or writer == reader or writer not in live or reader not in live:
            continue
        wr[writer].add(reader)
    return ww, wr


def _describe_cycle(cycle: list[TxnKey], ww: dict[TxnKey, set[TxnKey]], ix: Index,
                    reads_by: dict[TxnKey, dict[TxnKey, str]]) -> str:
    steps = []
    for a, b in pairwise(cycle):
        if b in reads_by.get(a, {}):
            steps.append(f"{_name(a)} -wr-> {_name(b)} (read {reads_by[a][b]})")
        elif b in ww.get(a, set()):
            steps.append(f"{_name(a)} -ww-> {_name(b)}")
        else:
            steps.append(f"{_name(a)} -> {_name(b)}")
    return "; ".join(steps)


def check_cycles(ix: Index, r: Report) -> None:
    """G1c: a cycle of write-read dependencies (circular information flow), which read_committed
    forbids. G0 (write cycles) and cycles mixing ww and wr edges are normal in Kafka's model, where
    concurrent transactions' writes interleave in every partition: they are counted as notes, as
    Jepsen's Kafka checker allows them. Tarjan's SCC, O(V + E)."""
    ww, wr = dependency_graphs(ix)
    reads_by: dict[TxnKey, dict[TxnKey, str]] = defaultdict(dict)
    for p, _partition, _offset, value in ix.txn_reads:
        writer = ix.key_of(value)
        if writer is not None and writer in wr and (p.txn_process, p.txn) in wr[writer]:
            reads_by[writer].setdefault((p.txn_process, p.txn), value)
    for component in strongly_connected(wr):
        start = min(component)
        cycle = shortest_cycle(wr, component, start)
        r.add("G1c", f"{len(component)} transactions in a write-read cycle: "
                     f"{_describe_cycle(cycle, ww, ix, reads_by)}")
    g0 = strongly_connected(ww)
    both: dict[TxnKey, set[TxnKey]] = defaultdict(set)
    for graph in (ww, wr):
        for a, succs in graph.items():
            both[a] |= succs
    mixed = strongly_connected(both)
    r.stats["ww-edges"] = sum(len(s) for s in ww.values())
    r.stats["wr-edges"] = sum(len(s) for s in wr.values())
    if g0:
        big = max(g0, key=len)
        cycle = shortest_cycle(ww, big, min(big))
        r.notes.append(f"G0 (allowed in Kafka: writes are not isolated): {len(g0)} write cycles, e.g. "
                       f"{_describe_cycle(cycle, ww, ix, reads_by)}")
    with_wr = [m for m in map(set, mixed) if any(wr.get(a, set()) & m for a in m)]
    if with_wr:
        r.notes.append(f"G1c through ww edges (allowed in Kafka, as in Jepsen): {len(with_wr)} components "
                       f"mixing ww and wr dependencies, the largest of {max(map(len, with_wr))} transactions")


ROLE_KINDS = {"p": "producer", "x": "copier", "c": "reader"}
_ROLE = re.compile(r"([pxc])\d+")
_UNTESTED = {"producer": ("completed no write (no transaction committed, no write acknowledged)",
                          "no write was tested under faults"),
             "copier": ("committed no transaction",
                        "the exactly-once copy (consume-transform-produce) was not tested under faults"),
             "reader": ("read nothing", "no read_committed read was tested under faults")}


def fault_window(h: History) -> tuple[int, int] | None:
    """From the first fault's start to when the run stopped making faults (``faults_stopped_ms`` in
    the meta; the last fault's end in histories without it). A zombie or crash a client carries out
    after that, in the drain, does not stretch it. None when no fault was made."""
    if not h.faults:
        return None
    start = min(f.start_ms for f in h.faults)
    stopped = h.meta.get("faults_stopped_ms")
    if isinstance(stopped, int | float) and not isinstance(stopped, bool):
        return start, max(start, int(stopped))
    return start, max(f.end_ms for f in h.faults)


def _roles(h: History) -> list[str]:
    """The run's clients: the meta's list, or (a history without one) every process named in it."""
    named = h.meta.get("roles")
    if isinstance(named, list) and named:
        names = [str(n) for n in named]
    else:
        found = {t.process for t in h.txns} | {s.process for s in h.sends}
        found |= {p.process.split(".", 1)[0] for p in h.polls if not p.final}
        names = sorted(found)
    return [n for n in names if _ROLE.fullmatch(n)]


def check_coverage(ix: Index, r: Report) -> None:
    """Whether the faults met the roles the run's guarantees rest on. Per client, what it did inside
    the fault window (``Report.activity``); the result is *inconclusive* when faults were asked for
    and none was made, or when every producer, every copier or every reader did nothing while faults
    were active (e.g. broker kills every 2-3 s never let the copier group form: the exactly-once copy
    then ran only in the drain, after the faults, and the run passed having tested it under none).
    Not an anomaly of the broker: a run that proves less than it says. O(n)."""
    h = ix.h
    window = fault_window(h)
    if window is None:
        requested = h.meta.get("faults")
        if isinstance(requested, list) and requested:
            r.inconclusive.append(f"faults were asked for ({', '.join(map(str, requested))}) but none was made")
        return
    lo, hi = window
    r.window = window
    activity = {name: RoleActivity(name, ROLE_KINDS[name[0]]) for name in _roles(h)}
    for key, t in ix.txns.items():
        a = activity.get(t.process)
        if a is None or not lo <= t.end_ms <= hi:
            continue
        state = ix.status.get(key)
        if state in ("committed", "unknown-visible"):
            a.committed += 1
        elif state == "aborted":
            a.aborted += 1
        else:
            a.unknown += 1
    for snd in h.sends:
        a = activity.get(snd.process)
        if a is not None and snd.txn < 0 and snd.acked and lo <= snd.time_ms <= hi:
            a.acked += 1
    for p in h.polls:
        a = activity.get(p.process.split(".", 1)[0])
        if a is not None and not p.final and lo <= p.time_ms <= hi:
            a.reads += len(p.records)
    r.activity = list(activity.values())
    for kind, (did, meaning) in _UNTESTED.items():
        members = [a for a in r.activity if a.kind == kind]
        if members and not any(a.active for a in members):
            names = ", ".join(a.role for a in members)
            r.inconclusive.append(f"{kind}s ({names}) {did} while faults were active (t={lo / 1000:.1f}-"
                                  f"{hi / 1000:.1f} s): {meaning}")


CHECKS: tuple[Callable[[Index, Report], None], ...] = (
    check_offsets_present, check_garbage, check_offsets_agree, check_aborted_and_early_reads, check_lost,
    check_atomicity, check_zombies, check_send_order, check_polls, check_output, check_committed_offsets,
    check_rewinds, check_cycles, check_coverage)


def check(h: History, checks: Iterable[Callable[[Index, Report], None]] = CHECKS) -> Report:
    ix = Index(h)
    report = Report()
    for fn in checks:
        fn(ix, report)
    committed = sum(1 for s in ix.status.values() if s == "committed")
    report.stats = {"sends": len(h.sends), "transactions": len(h.txns), "committed": committed,
                    "aborted": sum(1 for s in ix.status.values() if s == "aborted"),
                    "unknown": sum(1 for t in h.txns if t.outcome == "unknown"),
                    "unknown inferred committed": sum(1 for s in ix.status.values() if s == "unknown-visible"),
                    "copier transactions": len(ix.copier_txns()),
                    "reads": sum(len(p.records) for p in h.polls), "faults": len(h.faults),
                    **report.stats}
    return report

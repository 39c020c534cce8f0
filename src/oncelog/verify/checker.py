"""A Jepsen-style checker over a recorded history (pure: history in, anomalies out).

Definitions (after Jepsen's Kafka workload and Kafka's transactions system test):
- lost write: a value of a committed transaction (or an acknowledged non-transactional send) that
  the final read of every partition did not return although it read past the value's acknowledged
  offset (or the offset is unknown);
- unseen: such a value whose acknowledged offset lies beyond everything the final read returned in
  its partition (the final read stopped short of an acknowledged write);
- duplicate: one value read at two different offsets;
- inconsistent offsets: one (partition, offset) read with two different values;
- aborted read (G1a): a read_committed consumer returned a value of an aborted transaction;
- read above LSO: a value returned before its transaction even started to commit;
- non-monotonic poll: within one consumer, a partition's offsets did not increase;
- poll skip: a consumer jumped over a committed value between two consecutive reads of a partition.
Each anomaly names the operations (process, transaction, value, offsets) involved.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from oncelog.verify.history import History

KINDS = ("lost-write", "unseen", "duplicate", "inconsistent-offset", "aborted-read", "read-above-lso",
         "non-monotonic-poll", "poll-skip")


@dataclass
class Anomaly:
    kind: str
    detail: str


@dataclass
class Report:
    anomalies: list[Anomaly] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for a in self.anomalies:
            out[a.kind] += 1
        return out

    @property
    def ok(self) -> bool:
        return not self.anomalies


def check(h: History) -> Report:
    report = Report()
    txn_of: dict[str, tuple[str, int]] = {}
    outcome: dict[tuple[str, int], str] = {}
    commit_started: dict[tuple[str, int], int] = {}
    for t in h.txns:
        outcome[(t.process, t.txn)] = t.outcome
        commit_started[(t.process, t.txn)] = t.commit_started_ms
    must_exist: set[str] = set()
    acked_at: dict[str, tuple[int, int]] = {}
    aborted: set[str] = set()
    for s in h.sends:
        txn_of[s.value] = (s.process, s.txn)
        if s.acked and s.offset >= 0:
            acked_at[s.value] = (s.partition, s.offset)
        state = outcome.get((s.process, s.txn)) if s.txn >= 0 else ("committed" if s.acked else "unknown")
        if state == "committed":
            must_exist.add(s.value)
        elif state == "aborted":
            aborted.add(s.value)

    at_offset: dict[tuple[int, int], set[str]] = defaultdict(set)
    offsets_of: dict[str, set[tuple[int, int]]] = defaultdict(set)
    final_values: set[str] = set()
    final_max: dict[int, int] = {}
    for p in h.polls:
        for partition, offset, value in p.records:
            at_offset[(partition, offset)].add(value)
            offsets_of[value].add((partition, offset))
            if p.final:
                final_values.add(value)
                final_max[partition] = max(final_max.get(partition, -1), offset)

    for value in sorted(must_exist - final_values):
        proc, txn = txn_of[value]
        acked = acked_at.get(value)
        if acked is not None and final_max.get(acked[0], -1) < acked[1]:
            report.anomalies.append(Anomaly("unseen", f"{value} (process {proc}, txn {txn}) was acknowledged at "
                                                      f"{acked[0]}/{acked[1]} but the final read stopped at "
                                                      f"{acked[0]}/{final_max.get(acked[0], -1)}"))
            continue
        report.anomalies.append(Anomaly("lost-write", f"{value} (process {proc}, txn {txn}) was committed "
                                                      "but the final read did not return it"))
    for value, where in sorted(offsets_of.items()):
        if len(where) > 1:
            report.anomalies.append(Anomaly("duplicate", f"{value} read at {sorted(where)}"))
    for (partition, offset), values in sorted(at_offset.items()):
        if len(values) > 1:
            report.anomalies.append(Anomaly("inconsistent-offset",
                                            f"partition {partition} offset {offset} read as {sorted(values)}"))
    for p in h.polls:
        for partition, offset, value in p.records:
            if value in aborted:
                proc, txn = txn_of[value]
                report.anomalies.append(Anomaly("aborted-read", f"{p.process} read {value} at {partition}/{offset} "
                                                                f"from aborted txn {txn} of {proc}"))
            key = txn_of.get(value)
            if key is not None and key[1] >= 0 and key in commit_started and p.time_ms < commit_started[key] \
                    and not p.final:
                report.anomalies.append(Anomaly("read-above-lso",
                                                f"{p.process} read {value} at t={p.time_ms} ms, before txn {key[1]} "
                                                f"of {key[0]} started to commit at t={commit_started[key]} ms"))

    committed_offsets: dict[int, list[int]] = defaultdict(list)
    for (partition, offset), values in at_offset.items():
        if values & must_exist:
            committed_offsets[partition].append(offset)
    for offsets in committed_offsets.values():
        offsets.sort()
    last: dict[tuple[str, int], int] = {}
    for p in sorted(h.polls, key=lambda p: p.time_ms):
        consumer = p.process
        for partition, offset, value in p.records:
            prev = last.get((consumer, partition))
            if prev is not None:
                if offset <= prev:
                    report.anomalies.append(Anomaly("non-monotonic-poll",
                                                    f"{consumer} read {partition}/{offset} ({value}) after "
                                                    f"{partition}/{prev}"))
                else:
                    skipped = [o for o in committed_offsets.get(partition, []) if prev < o < offset]
                    if skipped:
                        report.anomalies.append(Anomaly("poll-skip", f"{consumer} jumped from {partition}/{prev} to "
                                                                     f"{partition}/{offset}, skipping {skipped[:5]}"))
            last[(consumer, partition)] = offset
    report.stats = {"sends": len(h.sends), "transactions": len(h.txns),
                    "committed": sum(1 for t in h.txns if t.outcome == "committed"),
                    "aborted": sum(1 for t in h.txns if t.outcome == "aborted"),
                    "unknown": sum(1 for t in h.txns if t.outcome == "unknown"),
                    "reads": sum(len(p.records) for p in h.polls), "faults": len(h.faults)}
    return report

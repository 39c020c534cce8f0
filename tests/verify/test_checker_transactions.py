"""The transactional checks on hand-made histories: unknown outcomes (atomicity), zombies, the
consume-transform-produce copier's exactly-once output and committed offsets, and dependency cycles.
Each anomaly has a history that must trigger it; the clean histories must not."""

from __future__ import annotations

from oncelog.verify.checker import check
from oncelog.verify.history import History, Offsets, Poll, Send, Txn

G = "grp"


def kinds(h: History) -> dict[str, int]:
    return {k: v for k, v in check(h).counts().items() if v}


def details(h: History, kind: str) -> list[str]:
    return [a.detail for a in check(h).anomalies if a.kind == kind]


# --- unknown outcomes: atomicity -------------------------------------------------------------------

def unknown_txn(read_u1: bool, final: list[str]) -> History:
    h = History()
    h.sends = [Send("p0", 1, "a", 0, 0, True, 1), Send("p0", 2, "u1", 0, 2, True, 10),
               Send("p0", 2, "u2", 1, 0, True, 10)]
    h.txns = [Txn("p0", 1, "committed", 3, 4, ["a"]), Txn("p0", 2, "unknown", 12, 40, ["u1", "u2"])]
    where = {"a": (0, 0), "u1": (0, 2), "u2": (1, 0)}
    h.polls = [Poll("c1", 50, [(0, 0, "a"), *([(0, 2, "u1")] if read_u1 else [])]),
               Poll("final", 90, [(*where[v], v) for v in final], final=True)]
    return h


def test_unknown_transaction_all_or_nothing_is_clean() -> None:
    nothing = unknown_txn(False, ["a"])
    assert check(nothing).ok and check(nothing).stats["unknown inferred committed"] == 0
    everything = unknown_txn(True, ["a", "u1", "u2"])
    assert check(everything).ok and check(everything).stats["unknown inferred committed"] == 1


def test_unknown_transaction_partly_visible_is_torn() -> None:
    h = unknown_txn(True, ["a", "u1"])
    assert kinds(h) == {"torn-transaction": 1}
    assert "p0 txn 2 (outcome unknown) is partly visible" in details(h, "torn-transaction")[0]
    assert "['u2']" in details(h, "torn-transaction")[0]


def test_unknown_transaction_seen_by_a_consumer_but_missing_from_the_final_read_is_torn() -> None:
    h = unknown_txn(True, ["a"])  # c1 saw u1, so it committed; the final read has none of it
    assert kinds(h) == {"torn-transaction": 1}


# --- zombies ---------------------------------------------------------------------------------------

def zombie(outcome: str, late_acked: bool, visible: bool) -> History:
    h = History()
    h.sends = [Send("p0", 1, "a", 0, 0, True, 1), Send("p0", 2, "z1", 0, 1, True, 50),
               Send("p0", 2, "z2", 1, 0 if late_acked else -1, late_acked, 120)]
    h.txns = [Txn("p0", 1, "committed", 3, 4, ["a"]),
              Txn("p0", 2, outcome, 60, 130, ["z1", "z2"], fenced_ms=100)]
    h.polls = [Poll("final", 200, [(0, 0, "a"), *([(0, 1, "z1")] if visible else [])], final=True)]
    return h


def test_fenced_zombie_that_failed_is_clean() -> None:
    assert check(zombie("aborted", late_acked=False, visible=False)).ok


def test_zombie_commit_or_late_write_acknowledged() -> None:
    h = zombie("committed", late_acked=False, visible=False)
    assert kinds(h) == {"zombie-accepted": 1}
    assert "yet its commit was acknowledged" in details(h, "zombie-accepted")[0]
    h = zombie("aborted", late_acked=True, visible=False)
    assert kinds(h) == {"zombie-accepted": 1}
    assert "z2 sent at t=120 ms was acknowledged" in details(h, "zombie-accepted")[0]


def test_zombie_values_visible_are_aborted_reads_even_if_its_commit_succeeded() -> None:
    h = zombie("committed", late_acked=False, visible=True)
    assert kinds(h) == {"zombie-accepted": 1, "aborted-read": 1}
    assert "fenced by a newer instance" in details(h, "aborted-read")[0]


# --- the consume-transform-produce copier ----------------------------------------------------------

def copier() -> History:
    """p0 commits a, b at 0/0, 0/1 (marker at 2); copier x0 txn 1 reads them and writes copies at 0/3,
    0/4 (marker at 5) with offset 3; x0 txn 2 reads the copies (copies are not copied again) and
    commits offset 6. x0 reads the committed offsets after each commit; x1 resumes later at 6."""
    h = History(meta={"drained": True})
    h.sends = [Send("p0", 1, "a", 0, 0, True, 1), Send("p0", 1, "b", 0, 1, True, 1),
               Send("x0", 1, "c:a@x0.1", 0, 3, True, 22, source="a"),
               Send("x0", 1, "c:b@x0.1", 0, 4, True, 22, source="b")]
    h.txns = [Txn("p0", 1, "committed", 5, 10, ["a", "b"]),
              Txn("x0", 1, "committed", 25, 30, ["c:a@x0.1", "c:b@x0.1"], group=G, offsets={0: 3}),
              Txn("x0", 2, "committed", 45, 50, [], group=G, offsets={0: 6})]
    h.polls = [Poll("x0.1", 20, [(0, 0, "a"), (0, 1, "b")], txn_process="x0", txn=1),
               Poll("x0.1", 40, [(0, 3, "c:a@x0.1"), (0, 4, "c:b@x0.1")], txn_process="x0", txn=2),
               Poll("final", 200, [(0, 0, "a"), (0, 1, "b"), (0, 3, "c:a@x0.1"), (0, 4, "c:b@x0.1")],
                    final=True)]
    h.offsets = [Offsets("x0", G, 31, 33, "commit", {0: 3}), Offsets("x0", G, 51, 53, "commit", {0: 6}),
                 Offsets("x1", G, 60, 61, "assign", {0: 6}, session="x1.1")]
    return h


def test_clean_copier_history() -> None:
    report = check(copier())
    assert report.ok, report.anomalies
    assert report.stats["copier transactions"] == 2


def test_input_never_copied_is_output_missing() -> None:
    h = copier()
    h.sends = [s for s in h.sends if s.value != "c:b@x0.1"]
    h.txns[1].values = ["c:a@x0.1"]
    h.polls[1].records = [(0, 3, "c:a@x0.1")]
    h.polls[2].records = [r for r in h.polls[2].records if r[2] != "c:b@x0.1"]
    assert kinds(h) == {"output-missing": 1}
    assert details(h, "output-missing")[0].startswith("b ")


def test_input_copied_by_two_committed_transactions_is_output_duplicate() -> None:
    h = copier()
    h.sends.append(Send("x1", 1, "c:a@x1.1", 0, 6, True, 70, source="a"))
    h.txns.append(Txn("x1", 1, "committed", 72, 80, ["c:a@x1.1"], group=G, offsets={0: 1}))
    h.polls.append(Poll("x1.1", 65, [(0, 0, "a")], txn_process="x1", txn=1))
    h.polls[2].records.append((0, 6, "c:a@x1.1"))
    found = kinds(h)
    assert found["output-duplicate"] == 1
    assert "x0 txn 1" in details(h, "output-duplicate")[0] and "x1 txn 1" in details(h, "output-duplicate")[0]
    # x1 resumed at the committed 6 yet read offset 0 first
    assert any("resumed at committed 0/6 but read 0/0 first" in d for d in details(h, "offset-commit-mismatch"))


def test_an_aborted_copy_does_not_count_as_output() -> None:
    h = copier()
    h.sends.append(Send("x1", 1, "c:a@x1.1", 0, 6, True, 70, source="a"))
    h.txns.append(Txn("x1", 1, "aborted", 72, 80, ["c:a@x1.1"], group=G, offsets={0: 1}))
    assert check(h).ok  # written (offset 6) but aborted and not read
    h.polls[2].records.append((0, 6, "c:a@x1.1"))
    assert kinds(h) == {"aborted-read": 1}


def test_copier_that_never_caught_up_is_output_stalled() -> None:
    h = copier()
    h.meta["drained"] = False
    h.meta["drain_detail"] = "the copier group did not catch up"
    assert kinds(h) == {"output-stalled": 1}
    assert details(h, "output-stalled") == ["the copier group did not catch up"]


def test_offsets_sent_must_pass_what_was_consumed() -> None:
    h = copier()
    h.txns[1].offsets = {0: 1}  # consumed 0/1 but sent 1: b would be consumed again
    assert any("consumed 0/1 but sent offset 1" in d for d in details(h, "offset-commit-mismatch"))
    h = copier()
    h.txns[1].offsets = {}
    assert any("sent no offset for partition 0" in d for d in details(h, "offset-commit-mismatch"))
    h = copier()
    h.txns[1].offsets = {0: 5}  # jumps over the visible copies at 3 and 4
    assert any("skipping visible [3, 4]" in d for d in details(h, "offset-commit-mismatch"))


def test_an_unknown_copier_transaction_that_shows_nothing_is_not_held_to_its_offsets() -> None:
    """A copier whose commit hung (watchdog: outcome unknown) before it recorded its offsets, and whose
    copies are nowhere visible, did not commit (soak seed 7 flagged it as sent no offset)."""
    h = copier()
    h.txns[1].outcome = "unknown"
    h.txns[1].offsets = {}
    for s in h.sends[2:]:
        s.offset, s.acked = -1, False
    for poll in h.polls:
        poll.records = [r for r in poll.records if "@x0.1" not in r[2]]
    assert not any("x0 txn 1" in d and "sent no offset" in d for d in details(h, "offset-commit-mismatch"))
    h = copier()
    h.txns[1].outcome = "unknown"  # visible: it committed, so its offsets are checked
    h.txns[1].offsets = {}
    assert any("sent no offset for partition 0" in d for d in details(h, "offset-commit-mismatch"))


def test_committed_offset_read_back_below_a_commit() -> None:
    h = copier()
    h.offsets[1] = Offsets("x0", G, 51, 53, "commit", {0: 3})  # txn 2 committed 6 by t=50
    assert kinds(h) == {"offset-commit-mismatch": 1}
    assert "as 3, below the 6 that x0 txn 2 had committed" in details(h, "offset-commit-mismatch")[0]


def test_a_transaction_that_consumed_below_the_committed_offset_is_named() -> None:
    """x0's position went back to 0 by itself: txn 2 re-read a and committed offset 1 after txn 1 had
    committed 3. The broker answers the read-back right (1); what went wrong is txn 2, and the anomaly
    says so instead of "below the 3 that x0 txn 1 had committed" (probe s36,
    repro_backwards_commit.py). Read back twice, it is reported once."""
    h = History()
    h.sends = [Send("p0", 1, "a", 0, 0, True, 1), Send("p0", 1, "b", 0, 1, True, 1),
               Send("x0", 1, "c:a@x0.1", 0, 3, True, 12, source="a"),
               Send("x0", 1, "c:b@x0.1", 0, 4, True, 12, source="b"),
               Send("x0", 2, "c:a@x0.2", 0, 6, True, 32, source="a")]
    h.txns = [Txn("p0", 1, "committed", 5, 6, ["a", "b"]),
              Txn("x0", 1, "committed", 14, 15, ["c:a@x0.1", "c:b@x0.1"], group=G, offsets={0: 3}),
              Txn("x0", 2, "committed", 34, 35, ["c:a@x0.2"], group=G, offsets={0: 1})]
    h.polls = [Poll("x0.1", 10, [(0, 0, "a"), (0, 1, "b")], txn_process="x0", txn=1),
               Poll("x0.2", 30, [(0, 0, "a")], txn_process="x0", txn=2),
               Poll("final", 90, [(0, 0, "a"), (0, 1, "b"), (0, 3, "c:a@x0.1"), (0, 4, "c:b@x0.1"),
                                  (0, 6, "c:a@x0.2")], final=True)]
    h.offsets = [Offsets("x0", G, 16, 17, "commit", {0: 3}), Offsets("x0", G, 36, 37, "commit", {0: 1}),
                 Offsets("x1", G, 40, 41, "commit", {0: 1})]
    found = details(h, "offset-commit-mismatch")
    assert found == ["x0 txn 2 committed offset 1 for partition 0 (it consumed 0/0-0) after x0 txn 1 had "
                     "committed 3: a committed transaction consumed input below the group's committed offset "
                     "(x0 read 1 back at t=36 ms)"]
    assert kinds(h)["output-duplicate"] == 1  # a copied twice


def rewound(first_read: int, session: str = "x0.2") -> History:
    """x0 txn 1 reads a, b (0/0, 0/1) and aborts; its consumer is sought back to 0/0 and session x0.2
    follows; x0 txn 2 then reads from ``first_read`` in ``session`` and commits."""
    h = History(meta={"drained": True})
    h.sends = [Send("p0", 1, "a", 0, 0, True, 1), Send("p0", 1, "b", 0, 1, True, 1),
               Send("x0", 1, "c:a@x0.1", 0, 3, True, 22, source="a"),
               Send("x0", 2, "c:a@x0.2", 0, 5, True, 42, source="a"),
               Send("x0", 2, "c:b@x0.2", 0, 6, True, 42, source="b")]
    h.txns = [Txn("p0", 1, "committed", 5, 10, ["a", "b"]),
              Txn("x0", 1, "aborted", 25, 30, ["c:a@x0.1"], group=G, offsets={0: 2}, rewound={0: 0},
                  rewind_session="x0.2"),
              Txn("x0", 2, "committed", 45, 50, ["c:a@x0.2", "c:b@x0.2"], group=G, offsets={0: 2})]
    read = [(0, o, v) for o, v in ((0, "a"), (1, "b")) if o >= first_read]
    h.polls = [Poll("x0.1", 20, [(0, 0, "a"), (0, 1, "b")], txn_process="x0", txn=1),
               Poll(session, 40, read, txn_process="x0", txn=2),
               Poll("final", 200, [(0, 0, "a"), (0, 1, "b"), (0, 5, "c:a@x0.2"), (0, 6, "c:b@x0.2")], final=True)]
    if first_read > 0:  # b's copy only
        h.sends = [s for s in h.sends if s.value != "c:a@x0.2"]
        h.txns[2].values = ["c:b@x0.2"]
        h.polls[2].records.remove((0, 5, "c:a@x0.2"))
    return h


def test_a_copier_reads_again_from_where_it_was_sought_back() -> None:
    assert check(rewound(0)).ok
    h = rewound(1)  # the position stayed at 1 (or moved) after the seek back to 0: a is never copied
    assert kinds(h) == {"rewind-mismatch": 1, "output-missing": 1}
    assert details(h, "rewind-mismatch") == ["x0.2 read 0/1 first, but x0 txn 1 did not commit and its consumer "
                                             "was sought back to 0/0"]
    # a rebalance started another session: it resumes from the committed offset, not the seek
    assert "rewind-mismatch" not in kinds(rewound(1, session="x0.3"))


def test_committed_offset_nobody_sent_or_only_an_aborted_transaction_sent() -> None:
    h = copier()
    h.offsets[1] = Offsets("x0", G, 51, 53, "commit", {0: 7})
    assert "an offset no transaction sent" in details(h, "offset-commit-mismatch")[0]
    h = copier()
    h.txns.append(Txn("x0", 3, "aborted", 55, 56, [], group=G, offsets={0: 9}))
    h.offsets[2] = Offsets("x1", G, 60, 61, "assign", {0: 9}, session="x1.1")
    assert "sent only by aborted x0 txn 3" in details(h, "offset-commit-mismatch")[0]


def test_committed_offset_missing_after_a_commit() -> None:
    h = copier()
    h.offsets[0] = Offsets("x0", G, 31, 33, "commit", {0: -1})
    assert "(none), but x0 txn 1 had committed 3" in details(h, "offset-commit-mismatch")[0]


def test_resuming_past_visible_records() -> None:
    h = copier()
    h.offsets[2] = Offsets("x1", G, 60, 61, "assign", {0: 3}, session="x1.1")  # stale, and then ...
    h.polls.append(Poll("x1.1", 65, [(0, 4, "c:b@x0.1")], txn_process="x1", txn=1))
    h.txns.append(Txn("x1", 1, "aborted", 70, 71, [], group=G, offsets={0: 5}))
    found = details(h, "offset-commit-mismatch")
    assert any("below the 6 that x0 txn 2 had committed" in d for d in found)
    assert any("resumed at committed 0/3 but its first read was 0/4, skipping [3]" in d for d in found)


# --- dependency cycles -----------------------------------------------------------------------------

def test_write_read_cycle_is_g1c_and_names_the_transactions() -> None:
    """x0 txn 1 reads v1 written by x1 txn 1, which read v0 written by x0 txn 1: impossible at
    read_committed (and, with the times recorded, one of the reads is also above the LSO)."""
    h = History()
    h.sends = [Send("x0", 1, "v0", 0, 0, True, 1), Send("x1", 1, "v1", 1, 0, True, 1)]
    h.txns = [Txn("x0", 1, "committed", 30, 40, ["v0"], group=G, offsets={1: 1}),
              Txn("x1", 1, "committed", 30, 40, ["v1"], group=G, offsets={0: 1})]
    h.polls = [Poll("x0.1", 10, [(1, 0, "v1")], txn_process="x0", txn=1),
               Poll("x1.1", 10, [(0, 0, "v0")], txn_process="x1", txn=1),
               Poll("final", 90, [(0, 0, "v0"), (1, 0, "v1")], final=True)]
    found = kinds(h)
    assert found["G1c"] == 1 and found["read-above-lso"] == 2
    cycle = details(h, "G1c")[0]
    assert "2 transactions in a write-read cycle" in cycle
    assert "x0 txn 1 -wr-> x1 txn 1 (read v0)" in cycle and "x1 txn 1 -wr-> x0 txn 1 (read v1)" in cycle


def test_write_read_chain_without_cycle_and_aborted_reader_are_not_g1c() -> None:
    h = History()
    h.sends = [Send("x0", 1, "v0", 0, 0, True, 1), Send("x1", 1, "v1", 1, 0, True, 50)]
    h.txns = [Txn("x0", 1, "committed", 30, 40, ["v0"], group=G, offsets={}),
              Txn("x1", 1, "committed", 60, 70, ["v1"], group=G, offsets={0: 1})]
    h.polls = [Poll("x1.1", 45, [(0, 0, "v0")], txn_process="x1", txn=1),
               Poll("final", 90, [(0, 0, "v0"), (1, 0, "v1")], final=True)]
    report = check(h)
    assert report.ok and report.stats["wr-edges"] == 1


def test_write_cycles_g0_are_noted_but_allowed() -> None:
    """Concurrent transactions interleave their writes: p0 before p1 in partition 0, p1 before p0 in
    partition 1. Kafka does not isolate writes, so Jepsen allows G0; we report it as a note."""
    h = History()
    h.sends = [Send("p0", 1, "a0", 0, 0, True, 1), Send("p1", 1, "b0", 0, 1, True, 2),
               Send("p1", 1, "b1", 1, 0, True, 2), Send("p0", 1, "a1", 1, 1, True, 3)]
    h.txns = [Txn("p0", 1, "committed", 5, 6, ["a0", "a1"]), Txn("p1", 1, "committed", 5, 6, ["b0", "b1"])]
    h.polls = [Poll("final", 90, [(0, 0, "a0"), (0, 1, "b0"), (1, 0, "b1"), (1, 1, "a1")], final=True)]
    report = check(h)
    assert report.ok
    assert any(n.startswith("G0 (allowed in Kafka") and "p0 txn 1 -ww-> p1 txn 1" in n for n in report.notes)
    h.polls[0].records = [(0, 0, "a0"), (0, 1, "b0"), (1, 0, "a1"), (1, 1, "b1")]  # same order everywhere
    h.sends[2].offset, h.sends[3].offset = 1, 0
    assert check(h).ok and not check(h).notes

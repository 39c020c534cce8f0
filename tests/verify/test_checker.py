"""The checker must be able to fail: hand-made histories with each anomaly, and a clean one."""

from __future__ import annotations

from pathlib import Path

from oncelog.verify.checker import check
from oncelog.verify.history import History, Poll, Send, Txn


def base() -> History:
    h = History()
    h.sends = [Send("p1", 0, "a", 0, 0, True, 1), Send("p1", 0, "b", 0, 1, True, 2),
               Send("p1", 1, "c", 0, 3, True, 5), Send("p1", 2, "d", 0, 5, True, 8)]
    h.txns = [Txn("p1", 0, "committed", 3, 4, ["a", "b"]), Txn("p1", 1, "aborted", 6, 7, ["c"]),
              Txn("p1", 2, "committed", 9, 10, ["d"])]
    h.polls = [Poll("c1", 20, [(0, 0, "a"), (0, 1, "b")]), Poll("c1", 21, [(0, 5, "d")]),
               Poll("final", 30, [(0, 0, "a"), (0, 1, "b"), (0, 5, "d")], final=True)]
    return h


def kinds(h: History) -> dict[str, int]:
    return {k: v for k, v in check(h).counts().items() if v}


def test_clean_history_has_no_anomaly(tmp_path: Path) -> None:
    h = base()
    assert check(h).ok
    h.dump(tmp_path / "h.jsonl")
    assert check(History.load(tmp_path / "h.jsonl")).ok


def test_lost_write() -> None:
    h = base()
    h.polls[-1] = Poll("final", 30, [(0, 0, "a"), (0, 5, "d")], final=True)
    # the final reader also jumped over the committed offset 1 that another consumer saw
    assert kinds(h) == {"lost-write": 1, "poll-skip": 1}
    assert "b (process p1, txn 0)" in check(h).anomalies[0].detail


def test_duplicate_and_inconsistent_offsets() -> None:
    h = base()
    h.polls.append(Poll("c2", 25, [(0, 7, "a")]))
    assert kinds(h) == {"duplicate": 1}
    h = base()
    h.polls.append(Poll("c2", 25, [(0, 1, "zz")]))
    assert kinds(h)["inconsistent-offset"] == 1


def test_aborted_read_g1a() -> None:
    h = base()
    h.polls.append(Poll("c2", 25, [(0, 3, "c")]))
    found = check(h)
    assert kinds(h) == {"aborted-read": 1}
    assert "aborted txn 1 of p1" in found.anomalies[0].detail


def test_read_above_lso() -> None:
    h = base()
    h.polls.insert(0, Poll("c0", 2, [(0, 0, "a")]))  # before txn 0 started committing at t=3
    assert kinds(h) == {"read-above-lso": 1}


def test_non_monotonic_poll_and_poll_skip() -> None:
    h = base()
    h.polls.append(Poll("c1", 22, [(0, 1, "b")]))  # c1 goes back after reading offset 5
    assert kinds(h) == {"non-monotonic-poll": 1}
    h = base()
    h.polls[0] = Poll("c1", 20, [(0, 0, "a")])  # c1 jumps from 0 to 5, skipping committed offset 1
    assert kinds(h) == {"poll-skip": 1}


def test_unacknowledged_non_transactional_sends_are_not_required() -> None:
    h = History()
    h.sends = [Send("p", -1, "x", 0, 0, True, 1), Send("p", -1, "y", 0, -1, False, 2)]
    h.polls = [Poll("final", 5, [(0, 0, "x")], final=True)]
    assert check(h).ok
    h.polls = [Poll("final", 5, [], final=True)]
    assert kinds(h) == {"unseen": 1}  # acknowledged at offset 0, but the final read returned nothing


def test_a_write_lost_at_the_end_of_a_partition_is_lost_when_the_final_read_reached_the_end(
        tmp_path: Path) -> None:
    """The final read returned 0/0 and 0/1 and read partition 0 up to its end, 7 (d at 0/5, its marker
    at 6): d is lost, not unseen. It was labelled unseen because the final read's last record (0/1)
    was below d's offset; the end offsets the final read reached are recorded now."""
    h = base()
    h.polls = [Poll("c1", 20, [(0, 0, "a"), (0, 1, "b")]),
               Poll("final", 30, [(0, 0, "a"), (0, 1, "b")], final=True, ends={0: 7})]
    assert kinds(h) == {"lost-write": 1}
    detail = check(h).anomalies[0].detail
    assert detail.startswith("d (process p1, txn 2) was committed but the final read did not return it")
    assert "acknowledged at 0/5; the final read read every offset of partition 0 below 7" in detail
    h.dump(tmp_path / "h.jsonl")  # the end offsets survive the file
    assert kinds(History.load(tmp_path / "h.jsonl")) == {"lost-write": 1}
    # an end below the acknowledged offset: the final read could not reach it
    h.polls[-1].ends = {0: 5}
    assert kinds(h) == {"unseen": 1}
    assert "the final read ended at 0/5, the partition's end when it started" in check(h).anomalies[0].detail


def test_unseen_acknowledged_write() -> None:
    h = base()
    # the final read stopped at offset 1, short of the committed "d" acknowledged at offset 5
    h.polls = [Poll("c1", 20, [(0, 0, "a"), (0, 1, "b")]),
               Poll("final", 30, [(0, 0, "a"), (0, 1, "b")], final=True)]
    assert kinds(h) == {"unseen": 1}
    assert "d (process p1, txn 2)" in check(h).anomalies[0].detail and "0/5" in check(h).anomalies[0].detail

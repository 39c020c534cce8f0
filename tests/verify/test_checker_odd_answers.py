"""A broker that answers oddly (no offsets, offsets going backwards, values nobody wrote) is reported by
the checker, never a traceback (issue 11, defect 8)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oncelog.verify.checker import check
from oncelog.verify.history import History, HistoryError, Poll, Send, Txn


def kinds(h: History) -> dict[str, int]:
    return {k: v for k, v in check(h).counts().items() if v}


def committed(values: list[str], offsets: list[int | None]) -> History:
    h = History()
    h.sends = [Send("p1", 0, v, 0, o, True, 1) for v, o in zip(values, offsets, strict=True)]  # type: ignore[arg-type]
    h.txns = [Txn("p1", 0, "committed", 3, 4, list(values))]
    h.polls = [Poll("final", 30, [(0, i, v) for i, v in enumerate(values)], final=True)]
    return h


def test_acknowledged_write_without_an_offset_is_a_finding_not_a_crash() -> None:
    # Tansu's delivery reports carry no offset: confluent-kafka's Message.offset() returns None.
    h = committed(["a", "b"], [0, None])
    found = check(h)  # raised TypeError before
    assert kinds(h) == {"missing-offset": 1}
    assert "b (p1 txn 0) was acknowledged without an offset" in found.anomalies[0].detail


def test_a_history_file_with_null_and_garbage_offsets_loads_and_checks(tmp_path: Path) -> None:
    lines = [
        {"type": "meta", "seed": 1},
        {"type": "send", "process": "p1", "txn": 0, "value": "a", "partition": 0, "offset": None, "acked": True,
         "time_ms": 1},
        {"type": "send", "process": "p1", "txn": 0, "value": "b", "partition": "0", "offset": "x", "acked": True,
         "time_ms": 1, "something_new": 3},
        {"type": "txn", "process": "p1", "txn": 0, "outcome": "committed", "commit_started_ms": 2, "end_ms": 3,
         "values": ["a", "b"]},
        {"type": "poll", "process": "final", "time_ms": 9, "final": True,
         "records": [[0, None, "a"], [0, 1, "b"], [None, 2, "zz"]]},
        {"type": "a-kind-from-the-future", "x": 1},
    ]
    path = tmp_path / "h.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    h = History.load(path)
    found = kinds(h)
    # two acknowledgements and two records without a position, and "zz" that nobody wrote
    assert found["missing-offset"] == 4
    assert found["garbage-read"] == 1
    # "a" was read without a position, so the final read cannot vouch for it
    assert found["lost-write"] == 1


@pytest.mark.parametrize("text", ["not json\n", '{"type": "send"}\n', '[1, 2]\n',
                                  '{"type": "poll", "process": "c", "time_ms": 1, "records": 5}\n'])
def test_a_file_that_is_not_a_history_raises_history_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "h.jsonl"
    path.write_text(text)
    with pytest.raises(HistoryError):
        History.load(path)


def test_values_nobody_wrote_are_garbage_reads() -> None:
    h = committed(["a"], [0])
    h.polls.append(Poll("c1", 20, [(0, 0, "a"), (0, 1, "ghost")]))
    assert kinds(h) == {"garbage-read": 1}
    assert "'ghost' at 0/1" in check(h).anomalies[0].detail


def test_acknowledged_offsets_going_backwards() -> None:
    h = committed(["a", "b", "c"], [0, 1, 2])
    assert check(h).ok
    h = committed(["a", "b", "c"], [0, 2, 1])  # acknowledged out of order; the log holds a, b, c at 0, 1, 2
    found = kinds(h)
    assert found["non-monotonic-send"] == 1
    # b acknowledged at 2 but read at 1: the ack and the log disagree
    assert found["duplicate"] == 2 and found["inconsistent-offset"] == 2


def test_every_write_acknowledged_at_the_same_offset() -> None:
    h = committed(["a", "b"], [0, 0])
    found = kinds(h)
    assert found["inconsistent-offset"] >= 1 and found["non-monotonic-send"] == 1


def test_offsets_going_backwards_in_a_poll() -> None:
    h = committed(["a", "b"], [0, 1])
    h.polls.append(Poll("c1", 20, [(0, 1, "b"), (0, 0, "a")]))
    assert kinds(h) == {"non-monotonic-poll": 1}


def test_negative_partition_in_an_acknowledgement() -> None:
    h = committed(["a"], [0])
    h.sends[0].partition = -1
    assert "missing-offset" in kinds(h)


def test_values_that_look_like_markup_are_printed_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    from oncelog.verify.report import print_table

    h = committed(["a"], [0])
    h.polls.append(Poll("c1", 20, [(0, 0, "a"), (0, 1, "[/red] [bold]x")]))
    print_table(check(h), "t [/x]")
    out = capsys.readouterr().out
    assert "garbage-read: c1 read '[/red] [bold]x' at 0/1" in out

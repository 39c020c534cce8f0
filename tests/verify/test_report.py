"""The verify HTML report: Jepsen-style charts, and every anomaly linked to the operations it names.

Histories are made by hand (with faults, a copier, readers and a final read) so that the report's
content can be checked exactly; tests/verify/test_report_render.py looks at it in Chromium.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

from oncelog.verify.checker import Anomaly, check
from oncelog.verify.history import Fault, History, Offsets, Poll, Send, Txn
from oncelog.verify.report import Operations, write_html


def history(seed: int = 1, *, aborted_read: bool = True, lost_write: bool = True) -> History:
    """Three producers writing 2-value transactions for 20 s, a reader polling every 200 ms, a copier
    reading back its group's offsets, faults; optionally a reader returns a value of an aborted
    transaction, and the final read misses a committed value."""
    rng = random.Random(seed)
    h = History(meta={"seed": seed})
    plans = []  # (time of the first send, producer, transaction number), in the order they happen
    for p in range(3):
        t_ms = 100 + p * 37
        for n in range(40):
            plans.append((t_ms, p, n))
            t_ms += rng.randint(300, 560) + (900 if n == 20 and p == 2 else 0)
    next_offset = {0: 0, 1: 0}
    visible: list[tuple[int, int, str, int]] = []  # partition, offset, value, visible from (ms)
    for t_ms, p, n in sorted(plans):
        values = [f"p{p}-{n}-{i}" for i in range(2)]
        outcome = "aborted" if n % 7 == 3 else "unknown" if n == 20 and p == 2 else "committed"
        for i, v in enumerate(values):
            part = (n + i) % 2
            h.sends.append(Send(f"p{p}", n, v, part, next_offset[part], True, t_ms + i))
            if outcome == "committed":
                visible.append((part, next_offset[part], v, t_ms + 60))
            next_offset[part] += 1
        start = t_ms + rng.randint(10, 40)
        end = start + rng.randint(5, 20) + (900 if outcome == "unknown" else 0)
        h.txns.append(Txn(f"p{p}", n, outcome, start, end, values))
    visible.sort(key=lambda r: r[3])
    for poll_ms in range(300, 20_000, 200):
        got = [(pa, o, v) for pa, o, v, at in visible if poll_ms - 200 < at <= poll_ms]
        if got:
            h.polls.append(Poll("c0", poll_ms, sorted(got)))
    if aborted_read:
        aborted = next(s for s in h.sends if s.value == "p1-3-0")
        h.polls.append(Poll("c1", 5_000, [(aborted.partition, aborted.offset, aborted.value)]))
    final = sorted((pa, o, v) for pa, o, v, _ in visible)
    if lost_write:
        final = [r for r in final if r[2] != "p0-11-1"]
    h.polls.append(Poll("final", 21_000, final, final=True))
    for i in range(10):
        h.offsets.append(Offsets("x0", "g", 1_000 + i * 1_500, 1_004 + i * 1_500, "commit", {}))
    h.faults = [Fault("drop", 2_000, 2_100, "produce response"), Fault("broker-kill", 6_000, 7_500),
                Fault("zombie", 11_000, 11_050, "p1 txn 9"), Fault("delay", 15_000, 16_000)]
    return h


def test_a_clean_history_reports_no_anomaly_with_every_chart(tmp_path: Path) -> None:
    h = history(aborted_read=False, lost_write=False)
    report = check(h)
    assert report.ok, report.anomalies[:3]
    out = tmp_path / "r.html"
    write_html(out, h, report, "clean")
    page = out.read_text()
    assert "Verdict: no anomaly found." in page
    for alt in ("operations over time", "operations per second", "latency over time", "latency by percentile"):
        assert f'alt="{alt}"' in page
    assert "<area" not in page and 'id="anomaly-' not in page
    for op in ("commit (committed)", "commit (aborted)", "commit (unknown)", "send → acknowledged",
               "send → first read", "offsets read-back"):
        assert f"<td>{op}</td>" in page.replace("&gt;", ">").replace("&#x27;", "'"), op
    # fault kinds appear in the legend of the page
    for kind in ("drop", "broker-kill", "zombie", "delay"):
        assert kind in page


def test_every_anomaly_is_listed_with_its_operations_and_linked_from_the_timeline(tmp_path: Path) -> None:
    h = history()
    report = check(h)
    kinds = {a.kind for a in report.anomalies}
    assert {"aborted-read", "lost-write"} <= kinds, report.anomalies
    out = tmp_path / "r.html"
    write_html(out, h, report, "bad")
    page = out.read_text()
    assert f"Verdict: {len(report.anomalies):,} anomalies." in page
    for i, a in enumerate(report.anomalies, 1):
        item = re.search(rf'<li id="anomaly-{i}">(.*?)</li>', page, re.S)
        assert item, f"anomaly {i} is not listed"
        assert a.kind in item.group(1)
        assert '<a href="#timeline">' in item.group(1)
    # the timeline's image map links each anomaly's crosses to its entry
    areas = re.findall(r'<area shape="rect" coords="(\d+),(\d+),(\d+),(\d+)" href="#anomaly-(\d+)"', page)
    linked = {int(a[4]) for a in areas}
    assert linked >= set(range(1, len(report.anomalies) + 1)) - {i for i, a in enumerate(report.anomalies, 1)
                                                                  if a.kind == "poll-skip"}
    size = re.search(r'width="(\d+)" height="(\d+)" alt="operations over time"', page)
    assert size is not None
    width, height = int(size.group(1)), int(size.group(2))
    for left, top, right, bottom, _ in areas:
        assert 0 <= int(left) < int(right) <= width + 8 and 0 <= int(top) < int(bottom) <= height + 8
    aborted = next(i for i, a in enumerate(report.anomalies, 1) if a.kind == "aborted-read")
    item = re.search(rf'<li id="anomaly-{aborted}">(.*?)</li>', page, re.S)
    assert item is not None
    text = item.group(1)
    assert "txn 3: aborted" in text and "poll by c1" in text and "send p1-3-0" in text, text
    assert 'alt="close-up' in text  # the first anomalies get a close-up of the timeline


def test_operations_are_found_for_every_way_the_checker_names_them() -> None:
    h = history()
    ops = Operations(h)

    def named(detail: str) -> set[tuple[str, str]]:
        return {(op.kind, op.process) for op in ops.of(Anomaly("x", detail))}

    assert named("c1 read p1-3-0 at 1/7 from aborted txn 3 of p1") >= {("txn", "p1"), ("send", "p1")}
    poll = next(p for p in h.polls if p.process == "c0")
    partition, offset, value = poll.records[0]
    assert ("poll", "c0") in named(f"c0 read {value} at {partition}/{offset} from aborted txn 1 of p0")
    assert named("p0-11-1 (process p0, txn 11) was committed but the final read did not return it") == {
        ("send", "p0"), ("txn", "p0")}
    assert ("txn", "p2") in named("p2 txn 20 (outcome unknown) is partly visible: read ['p2-20-0'], but ...")
    assert ("txn", "p1") in named("p1 txn 9 was fenced at t=11000 ms, yet its commit was acknowledged")
    assert named("a text that names nothing of this history") == set()
    ordered = ops.of(Anomaly("x", "c1 read p1-3-0 at 1/7 from aborted txn 3 of p1"))
    assert [op.start_ms for op in ordered] == sorted(op.start_ms for op in ordered)


def test_the_report_bounds_what_it_draws(tmp_path: Path) -> None:
    """Thousands of anomalies (Tansu's aborted reads): the first 500 are listed, all are counted."""
    h = history()
    report = check(h)
    first = report.anomalies[0]
    report.anomalies = [Anomaly(first.kind, first.detail) for _ in range(700)]
    out = tmp_path / "r.html"
    write_html(out, h, report, "many")
    page = out.read_text()
    assert page.count('<li id="anomaly-') == 500
    assert "… and 200 more" in page
    assert page.count('alt="close-up') <= 12 * 3

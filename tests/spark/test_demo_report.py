"""The demo report, built from synthetic outcomes and a synthetic timeline (no broker, no Spark), looked
at as a person would: rendered in headless Chromium, every chart decoded and a picture, the page's
screenshot not blank, and the facts a reader looks for present."""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from oncelog.demo.cli import add_arguments, write_html
from oncelog.demo.outcome import Outcome
from oncelog.demo.report import SETUP_ROW
from oncelog.demo.timeline import COMMIT_WINDOW_KILL, DRIVER_KILL, DROPPED_ACK, RUNNING, ZOMBIE, Timeline
from oncelog.demo.windows import BATCH_OPEN, COMMITTED, PARTLY, TXN_OPEN, KillRecord
from tests.bench.render import assert_rendered

RECORDS = 100_000


def synthetic() -> tuple[list[Outcome], Timeline]:
    tl = Timeline(t0=0.0)
    tl.span(SETUP_ROW, "generating payments", 0.0, 12.0)
    outcomes = []
    plans = [("exactly_once", 0, 0, TXN_OPEN), ("at_least_once", 0, 1870, BATCH_OPEN),
             ("at_most_once", 1650, 0, PARTLY)]
    start = 12.0
    for g, lost, dup, first_window in plans:
        kills = [(start + 20, False, "ledger", 0, first_window, 0), (start + 45, True, "ledger", 1, COMMITTED, 2),
                 (start + 70, True, "totals", 1, COMMITTED, 2)]
        records = [KillRecord(g, at, cw, q, b, w, other_window="totals: transaction open", skipped=s)
                   for at, cw, q, b, w, s in kills]
        edges = [start, *(k[0] for k in kills), start + 100]
        for a, b in itertools.pairwise(edges):
            tl.span(g, RUNNING, a + (4 if a != start else 0), b)
        for at, cw, *_ in kills:
            tl.event(g, COMMIT_WINDOW_KILL if cw else DRIVER_KILL, at)
        for i in range(6):
            tl.event(g, DROPPED_ACK, start + 8 + i * 14)
        out = RECORDS - lost + dup
        tl.samples[g] = [(start + t, min(out, int(out * t / 95))) for t in range(0, 101, 2)]
        tl.span(g, ZOMBIE, start + 101, start + 104)
        tl.span(SETUP_ROW, "reading and verifying", start + 100, start + 106)
        outcomes.append(Outcome(g, 1, 0, out, lost, dup, 0, 0 if g == "exactly_once" else 310, 100.0,
                                repeated_updates=0 if g == "exactly_once" else 420,
                                wrong_totals_topic=0 if g == "exactly_once" else 12,
                                zombie_duplicated=50 if g == "at_least_once" else 0,
                                zombie_lost=50 if g == "at_most_once" else 0, dropped_acks=6,
                                commit_window_kills=2, replay_skipped=4, kill_records=records))
        start += 110
    return outcomes, tl


def test_demo_report_renders_in_chromium_with_every_chart(tmp_path: Path) -> None:
    outcomes, tl = synthetic()
    p = argparse.ArgumentParser()
    add_arguments(p)
    args = p.parse_args([])
    assert args.records >= 100_000 and args.accounts >= 1000, "the demo's default scale"
    out = tmp_path / "demo-report.html"
    write_html(out, outcomes, args, tl, wall_s=345.0)
    text = out.read_text()
    for fact in ("exactly_once: no record lost", "1,870", "committed, before commit log", "transaction open",
                 "partitions the replays skipped", "open 1, committed&lt;log 2", "took 345 s"):
        assert fact in text, fact
    # records lost/duplicated, wrong totals, kill windows, timeline, output count over time
    assert_rendered(out, tmp_path, min_charts=5)


def test_a_wrong_exactly_once_says_so() -> None:
    from oncelog.demo.report import build

    outcomes, tl = synthetic()
    outcomes[0].duplicated = 3
    p = argparse.ArgumentParser()
    add_arguments(p)
    text = build(outcomes, tl, p.parse_args(["--records", "100"]))
    assert "exactly_once got something wrong" in text and "no record lost" not in text

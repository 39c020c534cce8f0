"""The demo's HTML report: one self-contained page, charts from :mod:`oncelog.charts` as inline PNGs.

It shows, per guarantee, what went wrong (records lost and duplicated, accounts whose totals are
wrong, repeated updates: charts and the table), which window each driver kill hit and how many
partitions the replays skipped, a timeline of the run with every injected fault marked, and the
ledger's visible output over time. Built from :class:`~oncelog.demo.outcome.Outcome` and
:class:`~oncelog.demo.timeline.Timeline` only, so a test can build it from synthetic values.
"""

from __future__ import annotations

import argparse
import html
from collections.abc import Sequence
from pathlib import Path

from oncelog import charts
from oncelog.charts import Point, Series, Window
from oncelog.demo.outcome import HEADINGS, Outcome
from oncelog.demo.timeline import COMMIT_WINDOW_KILL, DRIVER_KILL, DROPPED_ACK, RUNNING, ZOMBIE, Timeline
from oncelog.demo.windows import AFTER, BATCH_OPEN, COMMITTED, NO_BATCH, PARTLY, TXN_OPEN, WINDOWS

GUARANTEE_COLORS = {"exactly_once": "#009E73", "at_least_once": "#E69F00", "at_most_once": "#CC79A7"}
TIMELINE_COLORS = {"generating payments": "#999999", "reading and verifying": "#56B4E9", RUNNING: "#0072B2",
                   ZOMBIE: "#6A3D9A", DRIVER_KILL: "#C00000", COMMIT_WINDOW_KILL: "#000000",
                   DROPPED_ACK: "#E69F00"}
WINDOW_COLORS = {NO_BATCH: "#BBBBBB", TXN_OPEN: "#0072B2", BATCH_OPEN: "#56B4E9", PARTLY: "#E69F00",
                 COMMITTED: "#D55E00", AFTER: "#009E73"}
SETUP_ROW = "setup / checks"

WINDOW_MEANING = {
    TXN_OPEN: "the batch's tasks were writing, nothing of it committed: its transactions were open "
              "(the replay fences and aborts them, then writes every partition again)",
    BATCH_OPEN: "the same window for a sink without transactions: the tasks were writing, no partition had "
                "recorded its progress (the replay writes them again: at_least_once duplicates)",
    PARTLY: "some partitions of the batch had committed, others not (the replay skips the former)",
    COMMITTED: "every task of the batch had committed in the sink, Spark had not written its commit log entry "
               "(the replay must find every partition committed and skip it; at_most_once 'commits' a "
               "partition by marking it before writing)",
    AFTER: "Spark's commit log entry was written: the kill fell between batches, nothing to replay",
    NO_BATCH: "no batch planned yet",
}


def max_offsets(args: argparse.Namespace) -> int:
    """The job's maxOffsetsPerTrigger: ``--max-offsets``, or a third of the records (three batches per
    query: the mid-batch kill lands in batch 0, the commit-window kills in batch 1). Fewer, larger
    batches keep the demo's time down: each batch costs Spark seconds whatever its size."""
    return int(args.max_offsets) or max(50, -(-args.records // 3))


def _cell(v: object) -> str:
    return html.escape(str(v))


def damage_charts(outcomes: Sequence[Outcome]) -> list[charts.Chart]:
    names = [o.guarantee for o in outcomes]
    records = charts.bar_chart(
        "Records lost and duplicated (ledger and zombie test)", ["lost", "duplicated", "zombie\nlost",
                                                                 "zombie\nduplicated"],
        {o.guarantee: [o.lost, o.duplicated, o.zombie_lost, o.zombie_duplicated] for o in outcomes},
        ylabel="records", colors=GUARANTEE_COLORS, note="0 everywhere is the exactly-once promise")
    accounts = charts.bar_chart(
        "Wrong totals and repeated updates", ["ledger sums\nwrong", "totals wrong\n(topic)",
                                              "totals wrong\n(database)", "repeated\nupdates"],
        {o.guarantee: [o.wrong_accounts, o.wrong_totals_topic, o.wrong_totals_sqlite, o.repeated_updates]
         for o in outcomes},
        ylabel="accounts (repeated updates: updates)", colors=GUARANTEE_COLORS,
        note="an account is wrong when its newest (count, total) differs from the committed input's")
    hit = {w: [float(o.windows()[w]) for o in outcomes] for w in WINDOWS if any(o.windows()[w] for o in outcomes)}
    windows = charts.stacked_bar_chart(
        "Which window each driver kill hit", names, hit or {"no kills": [0.0] * len(names)},
        ylabel="driver kills", colors=WINDOW_COLORS)
    return [records, accounts, windows]


def timeline_chart(outcomes: Sequence[Outcome], tl: Timeline) -> charts.Chart:
    guarantees = [o.guarantee for o in outcomes]
    rows = [SETUP_ROW, *guarantees]
    spans = [charts.Span(s.row, s.start, s.end, s.kind) for s in tl.spans if s.row in rows]
    lanes = {DRIVER_KILL: 0.0, COMMIT_WINDOW_KILL: 0.0, DROPPED_ACK: -0.3}
    points = [Point(e.guarantee, e.at, e.kind, lanes.get(e.kind, 0.0)) for e in tl.events
              if e.kind in lanes and e.guarantee in rows]
    return charts.timeline("The run: Spark job attempts and every injected fault", rows, spans=spans, points=points,
                           colors=TIMELINE_COLORS, x_range=(0.0, max(tl.end(), 1.0)),
                           xlabel="seconds since the demo started",
                           point_styles={DRIVER_KILL: ("X", 110.0), COMMIT_WINDOW_KILL: ("D", 60.0),
                                         DROPPED_ACK: ("v", 28.0)})


def output_chart(outcomes: Sequence[Outcome], tl: Timeline, expected: int) -> charts.Chart:
    series = []
    windows = []
    for o in outcomes:
        samples = tl.samples.get(o.guarantee, [])
        if samples:
            series.append(Series(o.guarantee, [t for t, _ in samples], [float(n) for _t, n in samples],
                                 color=GUARANTEE_COLORS.get(o.guarantee), marker=""))
    xs = [t for s in series for t in s.x]
    if xs:
        series.append(Series("committed input", [min(xs), max(xs)], [float(expected)] * 2, color="#555555",
                             linestyle="--", marker=""))
    for e in tl.events:
        if e.kind in (DRIVER_KILL, COMMIT_WINDOW_KILL):
            windows.append(Window(e.at, e.at, e.kind))
    return charts.line_chart("Ledger records visible (read_committed) over time", series,
                             xlabel="seconds since the demo started", ylabel="records", windows=windows,
                             window_colors={DRIVER_KILL: "#C00000", COMMIT_WINDOW_KILL: "#000000/"},
                             width_px=1300, height_px=420)


def outcome_table(outcomes: Sequence[Outcome]) -> str:
    head = "".join(f"<th>{_cell(h)}</th>" for h in (*HEADINGS, "seconds"))
    rows = []
    for o in outcomes:
        cells = (*tuple(f"{c:,}" if isinstance(c, int) else c for c in o.cells()), f"{o.seconds:.0f}")
        verdict = f'<span class="{"good" if o.ok else "bad"}">{_cell(cells[-2])}</span>'
        tds = "".join(f"<td>{_cell(c)}</td>" for c in cells[:-2]) + f"<td>{verdict}</td><td>{cells[-1]}</td>"
        rows.append(f"<tr>{tds}</tr>")
    return f'<table class="num"><tr>{head}</tr>{"".join(rows)}</table>'


def kill_table(outcomes: Sequence[Outcome]) -> str:
    head = ("guarantee", "at (s)", "kill", "query aimed at", "batch", "window it hit", "other query's window",
            "partitions the replays skipped")
    rows = []
    for o in outcomes:
        for k in o.kill_records:
            kind = "commit window (job's fault point)" if k.commit_window else "mid-batch (harness)"
            cells = (k.guarantee, f"{k.at:.1f}", kind, k.query, "-" if k.batch is None else k.batch, k.window,
                     k.other_window or "-", k.skipped)
            rows.append("<tr>" + "".join(f"<td>{_cell(c)}</td>" for c in cells) + "</tr>")
    if not rows:
        return '<p class="muted">No driver kills in this run.</p>'
    return ("<table><tr>" + "".join(f"<th>{_cell(h)}</th>" for h in head) + "</tr>" + "".join(rows)
            + "</table>")


def build(outcomes: Sequence[Outcome], tl: Timeline, args: argparse.Namespace, wall_s: float | None = None) -> str:
    eo = [o for o in outcomes if o.guarantee == "exactly_once"]
    if eo and all(o.ok for o in eo):
        verdict = '<p class="good">exactly_once: no record lost, none duplicated, every total right.</p>'
    elif eo:
        verdict = '<p class="bad">exactly_once got something wrong: see the table.</p>'
    else:
        verdict = '<p class="muted">exactly_once was not run.</p>'
    commit_window = ("off" if args.commit_window_batch < 0 else
                     f"once per query, at batch {args.commit_window_batch}")
    subtitle = (f"{args.records:,} committed payments over {args.accounts:,} accounts (plus aborted transactions "
                f"that must not count); maxOffsetsPerTrigger {max_offsets(args):,}; driver SIGKILLs mid-batch: "
                f"{args.kills} per guarantee; in the commit window: {commit_window}; dropped acknowledgements: "
                f"{args.drop_acks:.0%} of Produce/EndTxn responses"
                + (f"; the whole demo took {wall_s:.0f} s" if wall_s is not None else ""))
    damage = damage_charts(outcomes)
    windows_list = "".join(f"<li><b>{_cell(w)}</b>: {_cell(WINDOW_MEANING[w])}</li>"
                           for w in (TXN_OPEN, BATCH_OPEN, PARTLY, COMMITTED, AFTER))
    body = (
        verdict
        + "<p>A PySpark application with two streaming queries runs under each guarantee: the <b>ledger</b> "
          "(each payment, oncelog source → oncelog sink) and the <b>running totals</b> per account (a stateful "
          "aggregation in update mode through <code>foreachBatch</code> into a topic and a database). Its driver "
          "is SIGKILLed mid-batch and in the commit window and restarted from its checkpoints, a proxy drops "
          "acknowledgements, and a zombie task attempt races its retry. Then every output is read "
          "read_committed and checked against the committed input.</p>"
        + "<h2>What went wrong, per guarantee</h2>"
        + '<div class="row">' + damage[0].img("records lost and duplicated per guarantee")
        + damage[1].img("wrong totals and repeated updates per guarantee") + "</div>"
        + outcome_table(outcomes)
        + '<p class="muted">driver kills: mid-batch+commit-window; replay skipped: partitions a replay found '
          "already committed and skipped; ledger sums wrong: accounts whose sum over the ledger differs from "
          "the input's; totals wrong: accounts whose newest total (topic, database) differs; zombie: a task "
          "attempt stalled before its commit while a retry ran.</p>"
        + "<h2>The run</h2>" + timeline_chart(outcomes, tl).img("timeline of the run with the injected faults")
        + output_chart(outcomes, tl, args.records).img("ledger records visible over time")
        + '<p class="muted">The output count comes from a read_committed consumer reading each ledger while its '
          "job runs: exactly_once grows in steps as transactions commit and ends on the committed input; "
          "at_least_once ends above it (duplicates), at_most_once may end below it (losses).</p>"
        + "<h2>Driver kills: which window each hit</h2>"
        + damage[2].img("driver kills per window and guarantee")
        + f"<ul>{windows_list}</ul>" + kill_table(outcomes)
        + '<p class="muted">Each kill takes down both queries; "window it hit" is the one of the query the kill '
          "aimed at (the topic the harness watched, or the query whose fault point fired), read from Spark's "
          "checkpoint right after the kill and from what the replay of that batch skipped.</p>"
    )
    return charts.page("oncelog demo: payments pipeline on PySpark under faults", body, subtitle=subtitle)


def write_report(path: Path, outcomes: Sequence[Outcome], tl: Timeline, args: argparse.Namespace,
                 wall_s: float | None = None) -> Path:
    path.write_text(build(outcomes, tl, args, wall_s))
    return path

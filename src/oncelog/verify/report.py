"""Reports: a rich table of anomaly counts, and a Jepsen-style HTML page.

The page (one self-contained file, charts from ``oncelog.charts`` embedded as PNGs) shows:

- every operation over time, one row per client: transactions as bars coloured by outcome
  (committed / aborted / unknown), sends as ticks (acknowledged or not), polls and offset read-backs
  as dots, fault windows shaded by kind, and each listed anomaly as a numbered red cross on the
  operations that show it (click a cross to jump to the anomaly);
- operations per second over time (Jepsen's rate plot), faults shaded;
- latency per operation type, over time (faults shaded) and by percentile, with a table;
- each anomaly with the operations the checker names in it (a transaction, a send, the poll that
  returned a value), their times and outcomes, and for the first few a close-up of the timeline.

The checker names operations in its text (``p1 txn 3``, ``txn 3 of p1``, ``c0 read p1-3-0 at 0/12``,
values); ``operations_of`` finds them in the history, so the checker stays as it is.
"""

from __future__ import annotations

import html
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oncelog import charts
from oncelog.charts import Marker, Point, Series, Span, Window
from oncelog.verify.checker import KINDS, Anomaly, Report
from oncelog.verify.history import History, Poll, Send, Txn

COLORS = {"committed": "#009E73", "aborted": "#E69F00", "unknown": "#7F7F7F",
          "send acked": "#0072B2", "send not acked": "#D55E00", "poll": "#56B4E9", "offsets read": "#CC79A7"}
EXAMPLES = 5  # anomalies printed per kind; the HTML report lists the first 500
LISTED = 500
ZOOMED = 12  # anomalies with a close-up timeline
FAULT_COLORS = {"drop": "#D55E00", "reset": "#CC79A7", "delay": "#E6C700", "zombie": "#6A3D9A",
                "crash": "#8C564B", "broker-kill": "#000000/", "broker-pause": "#3366CC"}
LATENCY_COLORS = {"commit (committed)": "#009E73", "commit (aborted)": "#E69F00", "commit (unknown)": "#7F7F7F",
                  "send → acknowledged": "#0072B2", "send → first read": "#56B4E9",
                  "offsets read-back": "#CC79A7"}


def print_table(report: Report, title: str) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=escape(title))
    t.add_column("anomaly")
    t.add_column("count", justify="right")
    for kind, n in report.counts().items():
        t.add_row(kind, f"[red]{n}[/red]" if n else "0")
    console = Console(soft_wrap=True)  # one anomaly per line, whatever the terminal width
    console.print(t)
    console.print(escape(", ".join(f"{k} {v}" for k, v in report.stats.items())), highlight=False)
    if report.window is not None:
        console.print(_activity_table(report))
    for why in report.inconclusive:
        console.print(f"[yellow]INCONCLUSIVE[/yellow]: {escape(why)}", highlight=False)
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    shown: dict[str, int] = {}
    for a in report.anomalies:  # a few of every kind, so that no kind hides behind another
        shown[a.kind] = shown.get(a.kind, 0) + 1
        if shown[a.kind] <= EXAMPLES:
            console.print(f"[red]{escape(a.kind)}[/red]: {escape(a.detail)}", highlight=False)
    for kind, n in shown.items():
        if n > EXAMPLES:
            console.print(f"... and {n - EXAMPLES} more {escape(kind)}", highlight=False)


def _activity_columns(report: Report) -> list[str]:
    columns = ["committed", "aborted", "unknown"]
    if any(a.acked for a in report.activity):
        columns.append("acked")  # non-transactional writes (--no-txn)
    return [*columns, "reads"]


def _window_text(report: Report) -> str:
    lo, hi = report.window or (0, 0)
    return f"activity while faults were active (t={lo / 1000:.1f}-{hi / 1000:.1f} s)"


def _activity_table(report: Report) -> Any:
    """Per client, its transactions by outcome and the records it read inside the fault window; a
    client that did nothing there is flagged."""
    from rich.table import Table

    t = Table(title=_window_text(report))
    columns = _activity_columns(report)
    for name in ["client", *columns]:
        t.add_column(name, justify="left" if name == "client" else "right")
    for a in report.activity:
        cells = [str(getattr(a, c)) for c in columns]
        t.add_row(a.role if a.active else f"[yellow]{a.role} (idle)[/yellow]", *cells)
    return t


# --- operations named by an anomaly -----------------------------------------------------------------

@dataclass(frozen=True)
class Operation:
    """One operation of the history as the report shows it: where (row), when (ms), what."""

    kind: str  # "txn" | "send" | "poll"
    process: str
    row: str
    start_ms: int
    end_ms: int
    what: str


def row_of(process: str) -> str:
    """The timeline row of a process or consumer session (``c1.g2`` and ``x0.3`` are sessions of c1, x0)."""
    return process.split(".", 1)[0]


def _row_key(row: str) -> tuple[int, str, int]:
    order = {"p": 0, "x": 1, "c": 2}
    m = re.fullmatch(r"([a-z]+)(\d+)", row)
    if m:
        return (order.get(m.group(1), 3), m.group(1), int(m.group(2)))
    return (4 if row == "final" else 3, row, 0)


_TXN_REFS = (re.compile(r"(?:^|[\s(,\[])([\w.:@-]+) txn (-?\d+)"), re.compile(r"txn (-?\d+) of ([\w.:@-]+)"),
             re.compile(r"process ([\w.:@-]+), txn (-?\d+)"))
_READ = re.compile(r"([\w.:@-]+) (?:read|resumed at committed|jumped from) .*?(\d+)/(\d+)")
_POSITION = re.compile(r"(\d+)/(\d+)")
_TOKEN = re.compile(r"[\w.:@-]+")


class Operations:
    """Finds the operations an anomaly's text names, in O(size of the text) per anomaly after an
    O(n) index of the history."""

    def __init__(self, h: History) -> None:
        self.txns: dict[tuple[str, int], Txn] = {}
        for t in h.txns:
            self.txns.setdefault((t.process, t.txn), t)
        self.sends: dict[str, Send] = {}
        self.first_send: dict[tuple[str, int], int] = {}
        for s in h.sends:
            self.sends.setdefault(s.value, s)
            key = (s.process, s.txn)
            self.first_send[key] = min(self.first_send.get(key, s.time_ms), s.time_ms)
        self.reads: dict[tuple[str, int, int], Poll] = {}  # (session, partition, offset) -> first poll
        self.sessions: set[str] = set()
        for p in h.polls:
            self.sessions.add(p.process)
            for partition, offset, _value in p.records:
                self.reads.setdefault((p.process, partition, offset), p)
        self.processes = {t.process for t in h.txns} | {s.process for s in h.sends} | self.sessions

    def txn_op(self, key: tuple[str, int]) -> Operation | None:
        t = self.txns.get(key)
        if t is None:
            return None
        start = min(self.first_send.get(key, t.commit_started_ms), t.commit_started_ms)
        fenced = f", fenced at {t.fenced_ms / 1000:.3f} s" if t.fenced_ms >= 0 else ""
        return Operation("txn", t.process, row_of(t.process), start, t.end_ms,
                         f"txn {t.txn}: {t.outcome}{fenced}; {len(t.values)} values")

    def send_op(self, s: Send) -> Operation:
        ack = f"acknowledged at {s.partition}/{s.offset}" if s.acked else "not acknowledged"
        return Operation("send", s.process, row_of(s.process), s.time_ms, s.time_ms,
                         f"send {s.value} (txn {s.txn}), {ack}")

    def poll_op(self, p: Poll, partition: int, offset: int) -> Operation:
        value = next((v for pa, o, v in p.records if pa == partition and o == offset), "?")
        return Operation("poll", p.process, row_of(p.process), p.time_ms, p.time_ms,
                         f"poll by {p.process}: {value} at {partition}/{offset} ({len(p.records)} records)")

    def of(self, a: Anomaly, limit: int = 8) -> list[Operation]:
        text = a.detail
        ops: list[Operation] = []
        seen: set[tuple[str, str, int]] = set()

        def add(op: Operation | None) -> None:
            if op is not None and (op.kind, op.process, op.start_ms) not in seen and len(ops) < limit:
                seen.add((op.kind, op.process, op.start_ms))
                ops.append(op)

        for pattern in _TXN_REFS:
            for m in pattern.finditer(text):
                a_, b_ = m.group(1), m.group(2)
                process, number = (b_, a_) if pattern.pattern.startswith("txn") else (a_, b_)
                try:
                    add(self.txn_op((process, int(number))))
                except ValueError:
                    continue
        read = _READ.search(text)
        if read and read.group(1) in self.sessions:
            session = read.group(1)
            for pm in _POSITION.finditer(text[read.start():]):
                p = self.reads.get((session, int(pm.group(1)), int(pm.group(2))))
                if p is not None:
                    add(self.poll_op(p, int(pm.group(1)), int(pm.group(2))))
        for token in _TOKEN.findall(text):
            s = self.sends.get(token.strip(".,:")) if token not in self.processes else None
            if s is not None:
                add(self.send_op(s))
                add(self.txn_op((s.process, s.txn)))
        return sorted(ops, key=lambda op: op.start_ms)


# --- what the charts draw ---------------------------------------------------------------------------

def _t(ms: float) -> float:
    return ms / 1000.0


def _latencies(h: History) -> dict[str, list[tuple[float, float]]]:
    """(time in s, latency in ms) per operation type, from what the history records:

    - commit: from commit (or abort) requested to its answer, by outcome;
    - send → acknowledged: a producer transaction's last send until its flush returned (an upper
      bound on that send's acknowledgement latency: the history keeps no per-send acknowledgement time);
    - send → first read: from a send until a read_committed reader first returned the value
      (visibility, including the transaction's commit);
    - offsets read-back: a copier's OffsetFetch of its group's committed offsets.
    """
    out: dict[str, list[tuple[float, float]]] = defaultdict(list)
    last_send: dict[tuple[str, int], int] = {}
    for s in h.sends:
        key = (s.process, s.txn)
        last_send[key] = max(last_send.get(key, s.time_ms), s.time_ms)
    for t in h.txns:
        if t.end_ms >= t.commit_started_ms >= 0:
            out[f"commit ({t.outcome})"].append((_t(t.commit_started_ms), float(t.end_ms - t.commit_started_ms)))
        last = last_send.get((t.process, t.txn))
        if not t.group and last is not None and t.commit_started_ms >= last:
            out["send → acknowledged"].append((_t(last), float(t.commit_started_ms - last)))
    first_read: dict[str, int] = {}
    for p in h.polls:
        if p.final or p.txn_process:
            continue
        for _partition, _offset, value in p.records:
            if p.time_ms < first_read.get(value, 1 << 62):
                first_read[value] = p.time_ms
    for s in h.sends:
        seen = first_read.get(s.value)
        if seen is not None and seen >= s.time_ms:
            out["send → first read"].append((_t(s.time_ms), float(seen - s.time_ms)))
    for o in h.offsets:
        if o.end_ms >= o.start_ms:
            out["offsets read-back"].append((_t(o.start_ms), float(o.end_ms - o.start_ms)))
    return {k: out[k] for k in LATENCY_COLORS if out.get(k)}


def _rates(h: History, end_s: float) -> list[Series]:
    """Operations per second, in 1 s bins (Jepsen's rate plot)."""
    bins = max(int(end_s) + 1, 1)
    counts: dict[str, list[float]] = {k: [0.0] * bins for k in
                                      ("committed", "aborted", "unknown", "send acked", "send not acked", "poll")}

    def add(kind: str, ms: float) -> None:
        counts[kind][min(max(int(ms / 1000), 0), bins - 1)] += 1

    for t in h.txns:
        add(t.outcome if t.outcome in counts else "unknown", t.end_ms)
    for s in h.sends:
        add("send acked" if s.acked else "send not acked", s.time_ms)
    for p in h.polls:
        if not p.final:
            add("poll", p.time_ms)
    xs = [i + 0.5 for i in range(bins)]
    labels = {"committed": "txn committed", "aborted": "txn aborted", "unknown": "txn unknown",
              "poll": "poll (returning records)"}
    return [Series(labels.get(k, k), xs, v, color=COLORS[k], marker="") for k, v in counts.items() if any(v)]


def _windows(h: History) -> list[Window]:
    return [Window(_t(f.start_ms), _t(f.end_ms), f.kind) for f in h.faults]


def _timeline_parts(h: History, rows: set[str] | None = None, lo_ms: float = -1,
                    hi_ms: float = float("inf")) -> tuple[list[Span], list[Point]]:
    def inside(a: float, b: float) -> bool:
        return b >= lo_ms and a <= hi_ms

    first_send: dict[tuple[str, int], int] = {}
    for s in h.sends:
        key = (s.process, s.txn)
        first_send[key] = min(first_send.get(key, s.time_ms), s.time_ms)
    spans = []
    for t in h.txns:
        row = row_of(t.process)
        start = min(first_send.get((t.process, t.txn), t.commit_started_ms), t.commit_started_ms)
        if (rows is None or row in rows) and inside(start, t.end_ms):
            outcome = t.outcome if t.outcome in COLORS else "unknown"
            spans.append(Span(row, _t(start), _t(t.end_ms), outcome))
    points = []
    for s in h.sends:
        row = row_of(s.process)
        if (rows is None or row in rows) and inside(s.time_ms, s.time_ms):
            points.append(Point(row, _t(s.time_ms), "send acked" if s.acked else "send not acked", lane=0.32))
    for p in h.polls:
        row = row_of(p.process)
        if (rows is None or row in rows) and inside(p.time_ms, p.time_ms):
            points.append(Point(row, _t(p.time_ms), "poll", lane=-0.32))
    for o in h.offsets:
        row = row_of(o.process)
        if (rows is None or row in rows) and inside(o.start_ms, o.end_ms):
            points.append(Point(row, _t(o.end_ms), "offsets read", lane=-0.32))
    return spans, points


def _html_table(head: Iterable[str], rows: Iterable[Iterable[str]], numbers: bool = True) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{"num" if numbers else "text"}"><tr>{th}</tr>{body}</table>'


def _fmt_ms(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}"


def write_html(path: Path, history: History, report: Report, title: str) -> None:
    h = history
    e = html.escape
    ends = ([t.end_ms for t in h.txns] + [p.time_ms for p in h.polls] + [f.end_ms for f in h.faults]
            + [s.time_ms for s in h.sends] + [1])
    end_s = _t(max(ends))
    x_range = (0.0, end_s * 1.01)
    all_rows = sorted({row_of(t.process) for t in h.txns} | {row_of(p.process) for p in h.polls}
                      | {row_of(s.process) for s in h.sends}, key=_row_key)
    windows = _windows(h)
    ops = Operations(h)
    listed = report.anomalies[:LISTED]
    anomaly_ops = [ops.of(a) for a in listed]

    markers = []
    for i, found in enumerate(anomaly_ops, 1):
        for op in found:
            markers.append(Marker(op.row, _t(op.start_ms), f"#{i}", f"#anomaly-{i}",
                                  f"#{i} {listed[i - 1].kind}: {op.what}"))
    spans, points = _timeline_parts(h)
    timeline = charts.timeline(
        "Operations over time", all_rows, spans=spans, points=points, windows=windows, markers=markers,
        colors=COLORS, window_colors=FAULT_COLORS, x_range=x_range, width_px=1340, row_px=34)
    rate_series = _rates(h, end_s)  # transactions apart: sends outnumber them ten to one
    txn_rates = charts.line_chart(
        "Transactions per second by outcome (1 s bins), faults shaded",
        [r for r in rate_series if r.label.startswith("txn")], xlabel="time since the start (s)",
        ylabel="transactions / s", windows=windows, window_colors=FAULT_COLORS, width_px=1340, height_px=300)
    op_rates = charts.line_chart(
        "Sends and polls per second (1 s bins), faults shaded",
        [r for r in rate_series if not r.label.startswith("txn")], xlabel="time since the start (s)",
        ylabel="operations / s", windows=windows, window_colors=FAULT_COLORS, width_px=1340, height_px=300)

    latencies = _latencies(h)
    lat_series = [Series(k, [p[0] for p in v], [p[1] for p in v], color=LATENCY_COLORS[k])
                  for k, v in latencies.items()]
    lat_time = charts.scatter_chart(
        "Latency of each operation over time (ms, log scale), faults shaded", lat_series,
        xlabel="time the operation started (s)", ylabel="ms", logy=True, windows=windows,
        window_colors=FAULT_COLORS, x_range=x_range, width_px=1340)
    tables = {k: charts.quantile_table([p[1] for p in v]) for k, v in latencies.items()}
    lat_pct = charts.quantile_chart("Latency by percentile, per operation type", tables, colors=LATENCY_COLORS,
                                    counts={k: len(v) for k, v in latencies.items()}, width_px=760, height_px=420)
    lat_rows = []
    for k, v in latencies.items():
        vals = sorted(p[1] for p in v)
        lat_rows.append([e(k), f"{len(vals):,}", *[_fmt_ms(charts.percentile(vals, q)) for q in (50, 90, 99)],
                         _fmt_ms(vals[-1])])

    counts = report.counts()
    count_rows = [[e(k), f'<span class="bad">{n}</span>' if n else "0"] for k, n in counts.items()]
    outcomes = Counter(t.outcome for t in h.txns)
    faults = Counter(f.kind for f in h.faults)
    summary = (f"{len(h.txns):,} transactions ({', '.join(f'{n:,} {k}' for k, n in outcomes.most_common())}), "
               f"{len(h.sends):,} sends ({sum(s.acked for s in h.sends):,} acknowledged), "
               f"{len(h.polls):,} polls returning {sum(len(p.records) for p in h.polls):,} records, "
               f"{len(h.offsets):,} offset read-backs, {len(h.faults):,} faults"
               + (f" ({', '.join(f'{n} {k}' for k, n in faults.most_common())})" if faults else "")
               + f", over {end_s:.1f} s.")

    items = []
    for i, (a, found) in enumerate(zip(listed, anomaly_ops, strict=True), 1):
        op_table = _html_table(
            ["operation", "process", "from (s)", "to (s)", "what"],
            [[e(op.kind), e(op.process), f"{_t(op.start_ms):.3f}", f"{_t(op.end_ms):.3f}", e(op.what)]
             for op in found], numbers=False) if found else \
            '<p class="muted">no operation of the history matches its text</p>'
        zoom = ""
        if i <= ZOOMED and found:
            zoom = _zoom(h, i, a, found, windows)
        items.append(f'<li id="anomaly-{i}"><b class="bad">#{i} {e(a.kind)}</b>: {e(a.detail)} '
                     f'<a href="#timeline">(timeline)</a>{op_table}{zoom}</li>')
    more = (f"<p>… and {len(report.anomalies) - LISTED:,} more (<code>oncelog verify --check HISTORY</code> "
            "lists them all).</p>" if len(report.anomalies) > LISTED else "")
    if not report.ok:
        verdict = f'<p class="bad">Verdict: {len(report.anomalies):,} anomalies.</p>'
    elif report.inconclusive:
        verdict = ('<p style="color:#9a5b00;font-weight:bold">Verdict: INCONCLUSIVE — no anomaly found, but '
                   + "; ".join(e(w) for w in report.inconclusive) + ".</p>")
    else:
        verdict = '<p class="good">Verdict: no anomaly found.</p>'
    activity = ""
    if report.window is not None:
        columns = _activity_columns(report)
        rows = [[e(a.role) if a.active else f'<span class="bad">{e(a.role)} (idle)</span>',
                 *[f"{getattr(a, c):,}" for c in columns]] for a in report.activity]
        activity = f"<h2>{e(_window_text(report).capitalize())}</h2>" + _html_table(["client", *columns], rows)
    legend_faults = ", ".join(f'<span style="background:{c.rstrip("/")}38;padding:0 .4em">{e(k)}</span>'
                              for k, c in FAULT_COLORS.items() if k in faults)
    body = f"""{verdict}
<p>{e(summary)}</p>
<p class="muted">Checked: {e(", ".join(KINDS))}.</p>
<div class="row"><div>{_html_table(["anomaly", "count"], count_rows)}</div>
<div><p>{e(", ".join(f"{k} {v}" for k, v in report.stats.items()))}</p>
<ul>{"".join(f"<li>{e(n)}</li>" for n in report.notes)}</ul></div></div>
{activity}
<h2 id="timeline">Operations over time</h2>
<p>One row per client. Bars: transactions from their first send to the answer to their commit or abort,
coloured by the outcome the client saw. Ticks below a bar: sends (acknowledged or not); dots above:
polls and offset read-backs. Shaded: fault windows ({legend_faults or "none"}). Red crosses: the
operations each listed anomaly names (click one to read it).</p>
{timeline.img("operations over time", map_name="ops-map")}
{txn_rates.img("transactions per second")}
{op_rates.img("operations per second")}
<h2>Latency per operation type</h2>
<p>Commit: from commit (or abort) requested to its answer. Send → acknowledged: a producer transaction's last
send until its flush returned (an upper bound on that send's acknowledgement latency; the history keeps no
per-send acknowledgement time). Send → first read: until a read_committed reader first returned the value
(includes waiting for the commit). Offsets read-back: a copier's OffsetFetch.</p>
{lat_time.img("latency over time")}
<div class="row">{lat_pct.img("latency by percentile")}
<div>{_html_table(["operation", "n", "p50 ms", "p90 ms", "p99 ms", "max ms"], lat_rows)}</div></div>
<h2>Anomalies</h2>
<ol style="list-style:none;padding-left:0">{"".join(items) or "<li>none</li>"}</ol>{more}
"""
    path.write_text(charts.page(title, body, subtitle="oncelog verify: a Jepsen-style history check"))


def _zoom(h: History, i: int, a: Anomaly, found: list[Operation], windows: list[Window]) -> str:
    """Close-ups of the timeline around an anomaly's operations, on the rows they are on: one panel
    per group of operations less than 2 s apart (a value written at 11 s and read at 35 s gets two)."""
    ordered = sorted(found, key=lambda op: op.start_ms)
    groups: list[list[Operation]] = [[ordered[0]]]
    for op in ordered[1:]:
        if op.start_ms - max(o.end_ms for o in groups[-1]) > 2000:
            groups.append([op])
        else:
            groups[-1].append(op)
    groups = groups[:3]
    width = 1100 if len(groups) == 1 else 640
    panels = []
    for n, group in enumerate(groups, 1):
        lo = min(op.start_ms for op in group)
        hi = max(op.end_ms for op in group)
        pad = max(400.0, (hi - lo) * 0.2)
        rows = sorted({op.row for op in group}, key=_row_key)
        spans, points = _timeline_parts(h, set(rows), lo - pad, hi + pad)
        markers = [Marker(op.row, _t(op.start_ms), f"#{i}", f"#anomaly-{i}", op.what) for op in group]
        near = [w for w in windows if w.end >= _t(lo - pad) and w.start <= _t(hi + pad)]
        part = f" ({n} of {len(groups)})" if len(groups) > 1 else ""
        chart = charts.timeline(f"#{i} {a.kind}{part}", rows, spans=spans, points=points, windows=near,
                                markers=markers, colors=COLORS, window_colors=FAULT_COLORS,
                                x_range=(_t(lo - pad), _t(hi + pad)), width_px=width, row_px=40)
        panels.append(chart.img(f"close-up {n} of anomaly {i}"))
    return f'<div class="row">{"".join(panels)}</div>'

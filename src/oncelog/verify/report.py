"""Reports: a rich table of anomaly counts, and an HTML page with an inline SVG timeline."""

from __future__ import annotations

import html
from pathlib import Path

from oncelog.verify.checker import KINDS, Report
from oncelog.verify.history import History

COLORS = {"committed": "#2a9d8f", "aborted": "#e9c46a", "unknown": "#9aa0a6"}
EXAMPLES = 5  # anomalies printed per kind; the HTML report lists the first 500
FAULT_COLORS = {"drop": "#e76f51", "reset": "#d62828", "delay": "#f4a261", "zombie": "#6a4c93",
                "crash": "#8338ec", "broker-kill": "#000000", "broker-pause": "#555555"}


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


def write_html(path: Path, history: History, report: Report, title: str) -> None:
    end = max([t.end_ms for t in history.txns] + [p.time_ms for p in history.polls] +
              [f.end_ms for f in history.faults] + [1])
    processes = sorted({t.process for t in history.txns} | {p.process for p in history.polls})
    width, row_h, left = 1000, 22, 110
    height = row_h * (len(processes) + 2) + 30
    x = lambda ms: left + (width - left - 10) * ms / end  # noqa: E731
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-size="11">']
    for f in history.faults:
        parts.append(f'<rect x="{x(f.start_ms):.1f}" y="0" width="{max(x(f.end_ms) - x(f.start_ms), 2):.1f}" '
                     f'height="{height - 20}" fill="{FAULT_COLORS.get(f.kind, "#ccc")}" opacity="0.25">'
                     f'<title>{html.escape(f.kind)} {html.escape(f.detail)}</title></rect>')
    for i, proc in enumerate(processes):
        y = row_h * (i + 1)
        parts.append(f'<text x="4" y="{y + 4}">{html.escape(proc)}</text>')
        for t in history.txns:
            if t.process == proc:
                w = max(x(t.end_ms) - x(t.commit_started_ms), 2)
                parts.append(f'<rect x="{x(t.commit_started_ms):.1f}" y="{y - 6}" width="{w:.1f}" height="12" '
                             f'fill="{COLORS.get(t.outcome, "#999")}"><title>txn {t.txn} {t.outcome}: '
                             f'{html.escape(", ".join(t.values))}</title></rect>')
        for p in history.polls:
            if p.process == proc:
                parts.append(f'<circle cx="{x(p.time_ms):.1f}" cy="{y}" r="3" fill="#264653">'
                             f'<title>{len(p.records)} records</title></circle>')
    parts.append(f'<text x="{left}" y="{height - 6}">0 ms</text>'
                 f'<text x="{width - 80}" y="{height - 6}">{end} ms</text>')
    parts.append("</svg>")
    rows = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in report.counts().items())
    details = "".join(f"<li><b>{html.escape(a.kind)}</b>: {html.escape(a.detail)}</li>" for a in report.anomalies[:500])
    legend = " ".join(f'<span style="background:{c};opacity:.5;padding:0 6px">{k}</span>'
                      for k, c in FAULT_COLORS.items())
    path.write_text(f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}td{{padding:2px 10px;border-bottom:1px solid #ddd}}</style></head>
<body><h1>{html.escape(title)}</h1>
<p>{"no anomaly found" if report.ok else f"{len(report.anomalies)} anomalies"}; checked: {", ".join(KINDS)}.</p>
<table>{rows}</table><p>{html.escape(", ".join(f"{k} {v}" for k, v in report.stats.items()))}</p>
<ul>{"".join(f"<li>{html.escape(n)}</li>" for n in report.notes)}</ul>
<h2>Timeline</h2><p>transactions: <span style="color:{COLORS['committed']}">committed</span>,
<span style="color:{COLORS['aborted']}">aborted</span>, <span style="color:{COLORS['unknown']}">unknown</span>;
dots are polls; faults: {legend}</p>{"".join(parts)}
<h2>Anomalies</h2><ul>{details or "<li>none</li>"}</ul></body></html>""")

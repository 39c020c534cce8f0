"""Charts for every report (`oncelog bench`, `oncelog verify`, the demo): PNGs drawn by matplotlib's
Agg renderer and embedded in HTML as base64 data URIs, so that a report is one self-contained file a
person opens in any browser.

Only matplotlib's object API is used (``Figure`` + ``FigureCanvasAgg``), never ``pyplot``: nothing
global changes (no backend switch, no "current figure"), and charts may be drawn from any thread.
Every helper returns a ``Chart``: the PNG bytes, their pixel size, and the pixel boxes of labelled
markers, so that a report can make them clickable (an HTML image map).

Colours are the Okabe-Ito palette (distinguishable with the common colour-vision deficiencies);
a caller may name its own per category.
"""

from __future__ import annotations

import base64
import html
import io
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
DPI = 100
GRID = "#dddddd"


@dataclass
class Series:
    """One line of a line chart (or one cloud of a scatter chart). ``None`` in ``y`` leaves a gap."""

    label: str
    x: Sequence[float]
    y: Sequence[float | None]
    color: str | None = None
    linestyle: str = "-"
    marker: str = "o"


@dataclass
class Window:
    """A shaded stretch of a time axis (a fault, a phase), coloured by ``kind``."""

    start: float
    end: float
    kind: str


@dataclass
class Span:
    """A bar on one row of a timeline (an operation that lasted), coloured by ``category``."""

    row: str
    start: float
    end: float
    category: str


@dataclass
class Point:
    """A mark on one row of a timeline (an instantaneous operation), coloured by ``category``;
    ``lane`` shifts it up (+) or down (-) within the row, in row heights (-0.4 to 0.4)."""

    row: str
    x: float
    category: str
    lane: float = 0.0


@dataclass
class Marker:
    """A labelled marker (an anomaly): drawn on top, and its pixel box returned for an image map."""

    row: str
    x: float
    label: str
    href: str
    title: str = ""


@dataclass
class Area:
    """A clickable box of a chart, in the PNG's pixels (origin top left)."""

    href: str
    title: str
    box: tuple[int, int, int, int]  # left, top, right, bottom


@dataclass
class Chart:
    png: bytes
    width: int
    height: int
    areas: list[Area] = field(default_factory=list)

    def data_uri(self) -> str:
        return data_uri(self.png)

    def img(self, alt: str, *, css_class: str = "chart", map_name: str = "") -> str:
        """An ``<img>`` element with the PNG inline (and its image map when it has clickable areas)."""
        usemap = f' usemap="#{html.escape(map_name)}"' if map_name and self.areas else ""
        tag = (f'<img class="{css_class}" src="{self.data_uri()}" width="{self.width}" height="{self.height}" '
               f'alt="{html.escape(alt)}"{usemap}>')
        if not usemap:
            return tag
        areas = "".join(f'<area shape="rect" coords="{a.box[0]},{a.box[1]},{a.box[2]},{a.box[3]}" '
                        f'href="{html.escape(a.href)}" title="{html.escape(a.title)}" alt="{html.escape(a.title)}">'
                        for a in self.areas)
        return f'{tag}<map name="{html.escape(map_name)}">{areas}</map>'


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def color_for(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _figure(width_px: int, height_px: int, *, left: int = 80, right: int = 20, top: int = 36,
            bottom: int = 50) -> tuple[Any, Any]:
    """A figure of exactly ``width_px`` x ``height_px`` with one axes inside fixed pixel margins.
    (Fixed margins, not matplotlib's constrained layout: that layout costs two thirds of a chart's
    drawing time, and the pixel positions of markers must not move after they are computed.)"""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width_px / DPI, height_px / DPI), dpi=DPI)
    canvas = FigureCanvasAgg(fig)
    fig.subplots_adjust(left=left / width_px, right=1 - right / width_px, top=1 - top / height_px,
                        bottom=bottom / height_px)
    return fig, canvas


def _style(ax: Any, title: str, xlabel: str, ylabel: str) -> None:
    text = ax.set_title(title, fontsize=12, loc="left", fontweight="bold")
    # The title starts at the axes' left edge; one too long for the figure would be cut off at its
    # right edge, so it is set smaller until it fits (down to 7 points; the margins are fixed).
    renderer = ax.figure.canvas.get_renderer()
    room = ax.figure.bbox.width * (1 - ax.get_position().x0) - 6
    width = text.get_window_extent(renderer).width
    if width > room:
        text.set_fontsize(max(7.0, 12 * room / width))
    ax.set_xlabel(xlabel, fontsize=10)
    ax.set_ylabel(ylabel, fontsize=10)
    ax.grid(True, color=GRID, linewidth=0.7)
    ax.set_axisbelow(True)
    ax.tick_params(labelsize=9)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _png(fig: Any, canvas: Any, areas: list[Area] | None = None) -> Chart:
    buf = io.BytesIO()
    canvas.print_png(buf)
    width, height = (round(v) for v in fig.get_size_inches() * fig.dpi)
    return Chart(buf.getvalue(), width, height, areas or [])


def _shade(ax: Any, windows: Sequence[Window], colors: Mapping[str, str], span: float) -> dict[str, Any]:
    """Shade each window (at least 0.3% of the axis wide, so a fault of a few milliseconds shows).
    A colour given as "#rrggbb/" is drawn hatched (tells apart two kinds of similar hue)."""
    handles: dict[str, Any] = {}
    minimum = span * 0.003
    for w in sorted(windows, key=lambda w: list(colors).index(w.kind) if w.kind in colors else len(colors)):
        end = max(w.end, w.start + minimum)
        color = colors.get(w.kind, "#999999")
        hatch = "//" if color.endswith("/") else None
        color = color.rstrip("/")
        patch = ax.axvspan(w.start, end, facecolor=color, alpha=0.22, linewidth=0, zorder=0, hatch=hatch,
                           edgecolor=color if hatch else None)
        handles.setdefault(w.kind, patch)
    return handles


def _log_ticks(ax: Any, axis: str) -> None:
    """Plain numbers (1, 10, 100, 1k) at 1-2-5 steps on a log axis instead of 10^n, and no minor
    ticks (they cost most of a chart's drawing time and add unreadable labels)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, NullLocator

    which = ax.xaxis if axis == "x" else ax.yaxis
    lo, hi = ax.get_xlim() if axis == "x" else ax.get_ylim()
    decades = math.log10(max(hi, 1e-12) / max(lo, 1e-12)) if lo > 0 else 3.0
    subs = (1.0, 2.0, 3.0, 5.0, 7.0) if decades < 1.5 else (1.0, 2.0, 5.0) if decades < 4 else (1.0,)
    which.set_major_locator(LogLocator(base=10, subs=subs, numticks=12))
    which.set_major_formatter(FuncFormatter(lambda v, _pos: human(v)))
    which.set_minor_locator(NullLocator())
    which.set_minor_formatter(NullFormatter())


def human(v: float) -> str:
    """1234 -> 1.2k, 0.5 -> 0.5, 1e6 -> 1M: short labels for ticks and bar values."""
    if v == 0 or not math.isfinite(v):
        return "0" if v == 0 else str(v)
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            n = v / div
            return f"{n:.0f}{suffix}" if abs(n) >= 10 or n == int(n) else f"{n:.1f}{suffix}"
    if a >= 10 or v == int(v):
        return f"{v:.0f}"
    if a >= 1:
        return f"{v:.1f}"
    return f"{v:.2g}"


def line_chart(title: str, series: Sequence[Series], *, xlabel: str, ylabel: str, logx: bool = False,
               logy: bool = False, windows: Sequence[Window] = (), window_colors: Mapping[str, str] | None = None,
               width_px: int = 640, height_px: int = 380, annotate: bool = False, note: str = "") -> Chart:
    """Lines with markers, one per series; ``annotate`` writes each point's value beside it;
    ``windows`` shades stretches of the x axis (fault windows on a time axis)."""
    fig, canvas = _figure(width_px, height_px, bottom=64 if note else 50, right=190 if windows else 20)
    ax = fig.add_subplot()
    _style(ax, title, xlabel, ylabel)
    xs = [x for s in series for x in s.x]
    handles = _shade(ax, windows, window_colors or {}, (max(xs) - min(xs)) if xs else 1.0)
    for i, s in enumerate(series):
        pts = [(x, y) for x, y in zip(s.x, s.y, strict=False) if y is not None and math.isfinite(y)]
        if not pts:
            continue
        color = s.color or color_for(i)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle=s.linestyle, marker=s.marker,
                markersize=5 if s.marker else 0, linewidth=1.8, color=color, label=s.label)
        if annotate:
            for x, y in pts:
                ax.annotate(human(y), (x, y), textcoords="offset points", xytext=(0, 6), ha="center",
                            fontsize=8, color=color)
    if logx:
        ax.set_xscale("log")
        _log_ticks(ax, "x")
    if logy:
        ax.set_yscale("log")
        _log_ticks(ax, "y")
    elif not windows:
        ax.set_ylim(bottom=0)
        ax.margins(y=0.15)
    if series or handles:
        lines, labels = ax.get_legend_handles_labels()
        for kind, h in handles.items():
            lines.append(h)
            labels.append(kind)
        if lines and windows:
            ax.legend(lines, labels, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        elif lines:
            ax.legend(lines, labels, fontsize=8, frameon=False, loc="best")
    if note:
        fig.text(0.01, 0.005, note, fontsize=8, color="#555555", ha="left", va="bottom")
    return _png(fig, canvas)


def bar_chart(title: str, categories: Sequence[str], groups: Mapping[str, Sequence[float | None]], *,
              ylabel: str, logy: bool = False, colors: Mapping[str, str] | None = None, width_px: int = 640,
              height_px: int = 380, fmt: str = "", note: str = "") -> Chart:
    """Grouped bars: one group of bars per category, one bar per key of ``groups`` (e.g. per broker),
    each labelled with its value (``fmt`` formats it; the default is ``human``). A missing value
    (None) leaves its place empty."""
    fig, canvas = _figure(width_px, height_px, bottom=76 if note else 60, right=150 if len(groups) > 2 else 20)
    ax = fig.add_subplot()
    _style(ax, title, "", ylabel)
    ax.grid(True, axis="y", color=GRID, linewidth=0.7)
    ax.grid(False, axis="x")
    n = max(len(groups), 1)
    width = 0.8 / n
    for i, (label, values) in enumerate(groups.items()):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(categories))]
        pairs = [(x, v) for x, v in zip(xs, values, strict=False) if v is not None and math.isfinite(v)]
        color = (colors or {}).get(label) or color_for(i)
        bars = ax.bar([p[0] for p in pairs], [p[1] for p in pairs], width=width * 0.92, color=color, label=label)
        ax.bar_label(bars, labels=[fmt.format(p[1]) if fmt else human(p[1]) for p in pairs], fontsize=8,
                     padding=2)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, fontsize=9)
    if logy:
        ax.set_yscale("log")
        _log_ticks(ax, "y")
    else:
        ax.margins(y=0.15)
    if len(groups) > 2:
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    elif len(groups) > 1:
        ax.legend(fontsize=8, frameon=False)
    if note:
        fig.text(0.01, 0.005, note, fontsize=8, color="#555555", ha="left", va="bottom")
    return _png(fig, canvas)


def stacked_bar_chart(title: str, categories: Sequence[str], stacks: Mapping[str, Sequence[float]], *,
                      ylabel: str, colors: Mapping[str, str] | None = None, width_px: int = 640,
                      height_px: int = 380, hline: float | None = None, hline_label: str = "") -> Chart:
    """One bar per category, made of ``stacks`` (e.g. broker CPU and clients' CPU); ``hline`` draws a
    reference line (e.g. the machine's capacity)."""
    fig, canvas = _figure(width_px, height_px, bottom=120, right=230)
    ax = fig.add_subplot()
    _style(ax, title, "", ylabel)
    ax.grid(False, axis="x")
    bottom = [0.0] * len(categories)
    for i, (label, values) in enumerate(stacks.items()):
        vals = [float(v) for v in values]
        color = (colors or {}).get(label) or color_for(i)
        bars = ax.bar(range(len(categories)), vals, bottom=bottom, color=color, label=label, width=0.6)
        ax.bar_label(bars, labels=[human(v) if v >= 8 else "" for v in vals], label_type="center", fontsize=8,
                     color="white")
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    if hline is not None:
        ax.axhline(hline, color="#333333", linestyle="--", linewidth=1, label=hline_label or None)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, fontsize=8, rotation=30, ha="right")
    ax.margins(y=0.1)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    return _png(fig, canvas)


def scatter_chart(title: str, series: Sequence[Series], *, xlabel: str, ylabel: str, logy: bool = False,
                  windows: Sequence[Window] = (), window_colors: Mapping[str, str] | None = None,
                  width_px: int = 1300, height_px: int = 420, x_range: tuple[float, float] | None = None) -> Chart:
    """Points (e.g. each operation's latency against the time it started), one colour per series,
    over shaded windows (faults)."""
    fig, canvas = _figure(width_px, height_px, right=230)
    ax = fig.add_subplot()
    _style(ax, title, xlabel, ylabel)
    span = (x_range[1] - x_range[0]) if x_range else max([x for s in series for x in s.x] + [1.0])
    handles = _shade(ax, windows, window_colors or {}, span)
    for i, s in enumerate(series):
        pts = [(x, y) for x, y in zip(s.x, s.y, strict=False) if y is not None and math.isfinite(y)]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=6, alpha=0.6, linewidths=0,
                       color=s.color or color_for(i), label=f"{s.label} ({len(pts):,})", marker=s.marker or "o")
    if logy:
        ax.set_yscale("log")
        _log_ticks(ax, "y")
    if x_range:
        ax.set_xlim(*x_range)
    lines, labels = ax.get_legend_handles_labels()
    for kind, h in handles.items():
        lines.append(h)
        labels.append(kind)
    if lines:
        ax.legend(lines, labels, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                  markerscale=3)
    return _png(fig, canvas)


def timeline(title: str, rows: Sequence[str], *, spans: Sequence[Span] = (), points: Sequence[Point] = (),
             windows: Sequence[Window] = (), markers: Sequence[Marker] = (), colors: Mapping[str, str],
             window_colors: Mapping[str, str] | None = None, x_range: tuple[float, float] | None = None,
             xlabel: str = "time since the start of the run (s)", width_px: int = 1300,
             row_px: int = 30, labelled_markers: int = 40,
             point_styles: Mapping[str, tuple[str, float]] | None = None) -> Chart:
    """Operations over time: one row per process, bars for operations that lasted (``spans``), dots
    for instantaneous ones (``points``), shaded ``windows`` (faults) behind them, and ``markers``
    (anomalies) on top; only the first ``labelled_markers`` markers carry their label as text, every
    marker gets a clickable box in the returned chart. ``point_styles`` gives a category of points
    its own matplotlib marker and size (e.g. ``("X", 80)`` for events that must stand out)."""
    rows = list(rows) or ["(none)"]
    n_entries = len({s.category for s in spans} | {p.category for p in points} | {w.kind for w in windows}) + 1
    height_px = max(220, 120 + row_px * len(rows), 70 + 19 * n_entries)  # room for the legend
    fig, canvas = _figure(width_px, height_px, left=24 + 7 * max((len(r) for r in rows), default=4), right=190)
    ax = fig.add_subplot()
    _style(ax, title, xlabel, "")
    ax.grid(True, axis="x", color=GRID, linewidth=0.7)
    ax.grid(False, axis="y")
    index = {r: i for i, r in enumerate(rows)}
    xs = [s.start for s in spans] + [s.end for s in spans] + [p.x for p in points] + [w.end for w in windows]
    lo, hi = x_range or ((min(xs), max(xs)) if xs else (0.0, 1.0))
    if hi <= lo:
        hi = lo + 1.0
    handles = _shade(ax, windows, window_colors or {}, hi - lo)
    legend: dict[str, Any] = {}
    min_width = (hi - lo) * 0.0015  # a commit of a few milliseconds is still a visible tick
    by_category: dict[str, list[tuple[float, float, int]]] = {}
    for s in spans:
        if s.row in index:
            by_category.setdefault(s.category, []).append((s.start, max(s.end - s.start, min_width), index[s.row]))
    for category, bars in by_category.items():
        color = colors.get(category, "#888888")
        for row in sorted({b[2] for b in bars}):
            ranges = [(b[0], b[1]) for b in bars if b[2] == row]
            coll = ax.broken_barh(ranges, (row - 0.22, 0.44), facecolors=color, linewidth=0, zorder=2)
            legend.setdefault(category, coll)
    by_point: dict[str, tuple[list[float], list[float]]] = {}
    for p in points:
        if p.row in index:
            xs_, ys_ = by_point.setdefault(p.category, ([], []))
            xs_.append(p.x)
            ys_.append(index[p.row] + p.lane)
    for category, (pxs, pys) in by_point.items():
        style = (point_styles or {}).get(category)
        if style is not None:
            sc = ax.scatter(pxs, pys, s=style[1], color=colors.get(category, "#444444"), marker=style[0],
                            edgecolors="white", linewidths=0.6, zorder=4)
        else:
            tick = category.startswith("send")
            sc = ax.scatter(pxs, pys, s=22 if tick else 9, color=colors.get(category, "#444444"),
                            linewidths=1.0 if tick else 0, zorder=3, marker="|" if tick else "o")
        legend.setdefault(category, sc)
    # Markers closer than about 8 pixels on one row share one cross, labelled "#1 +2".
    bucket = (hi - lo) * 8 / max(width_px, 1)
    clusters: dict[tuple[int, int], list[Marker]] = {}
    for m in markers:
        if m.row in index:
            clusters.setdefault((index[m.row], int((m.x - lo) / bucket)), []).append(m)
    placed = [(group, float(row)) for (row, _b), group in clusters.items()]
    if placed:
        sc = ax.scatter([g[0].x for g, _ in placed], [y for _, y in placed], s=70, marker="X", color="#C00000",
                        edgecolors="white", linewidths=0.8, zorder=5)
        legend.setdefault("anomaly", sc)
        # Label a cross only where its text does not run into another label on the same row.
        axes_px = width_px - fig.subplotpars.left * width_px - (1 - fig.subplotpars.right) * width_px
        taken: dict[float, list[tuple[float, float]]] = {}
        shown = 0
        for group, y in sorted(placed, key=lambda gy: (gy[1], gy[0][0].x)):
            labels = list(dict.fromkeys(m.label for m in group))
            text = labels[0] + (f" +{len(labels) - 1}" if len(labels) > 1 else "")
            left_px = (group[0].x - lo) / (hi - lo) * axes_px + 4
            box = (left_px, left_px + 7 * len(text) + 6)
            if shown >= labelled_markers or any(a < box[1] and box[0] < b for a, b in taken.get(y, [])):
                continue
            taken.setdefault(y, []).append(box)
            shown += 1
            ax.annotate(text, (group[0].x, y), textcoords="offset points", xytext=(5, 5), fontsize=8,
                        color="#C00000", fontweight="bold", zorder=6)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows, fontsize=9)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    ax.set_xlim(lo, hi)
    order = {k: i for i, k in enumerate(colors)}  # the caller's order of categories, then anomalies, faults
    entries = sorted(legend.items(), key=lambda kv: order.get(kv[0], len(order)))
    entries += [(k, h) for k, h in handles.items() if k not in legend]
    if entries:
        ax.legend([h for _, h in entries], [k for k, _ in entries], fontsize=8, frameon=False, loc="upper left",
                  bbox_to_anchor=(1.0, 1.0), markerscale=1.2)
    canvas.draw()  # fixes the layout, so that data coordinates map to the PNG's final pixels
    areas = []
    for group, y in placed:
        px, py = ax.transData.transform((group[0].x, y))
        top = height_px - py
        titles = list(dict.fromkeys(m.title or m.label for m in group))
        title_text = "; ".join(titles[:4]) + (f"; and {len(titles) - 4} more" if len(titles) > 4 else "")
        areas.append(Area(group[0].href, title_text, (int(px) - 8, int(top) - 8, int(px) + 8, int(top) + 8)))
    return _png(fig, canvas, areas)


def _exact(q: float | Fraction) -> Fraction:
    """``q`` as the decimal it is written as: 99.9 is 999/10, not the binary float just above it."""
    return Fraction(repr(q)) if isinstance(q, float) else Fraction(q)


def nearest_rank(n: int, q: float | Fraction) -> int:
    """The 1-based rank of the q-th percentile (0-100) of ``n`` values, nearest rank: the smallest
    ``r`` with ``r / n >= q / 100``, between 1 and ``n``. In exact arithmetic: ``ceil(99.9 / 100 * n)``
    in floats is one rank high whenever n is a multiple of 1,000 (99.9 / 100 * 2000 = 1998.0000000000002)."""
    return min(max(math.ceil(_exact(q) * n / 100), 1), n)


def percentile(sorted_values: Sequence[float], q: float | Fraction) -> float:
    """The q-th percentile (0-100) of already sorted values, nearest rank (nan when empty)."""
    if not sorted_values:
        return math.nan
    return float(sorted_values[nearest_rank(len(sorted_values), q) - 1])


TABLE_QUANTILES = (0.0, 50.0, 75.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95, 99.99, 100.0)


def quantile_table(samples: Sequence[float]) -> list[tuple[float, float]]:
    """(percentile, value) at the percentiles that ``samples`` can tell apart (99.9% needs at least
    1,000 samples: n * (100 - q) >= 100, exactly), and the maximum."""
    ordered = sorted(samples)
    n = len(ordered)
    return [(q, percentile(ordered, q)) for q in TABLE_QUANTILES
            if n and (q in (0.0, 100.0) or n * (100 - _exact(q)) >= 100)]


def quantile_chart(title: str, tables: Mapping[str, Sequence[tuple[float, float]]], *, ylabel: str = "ms (log scale)",
                   colors: Mapping[str, str] | None = None, width_px: int = 640, height_px: int = 380,
                   counts: Mapping[str, int] | None = None) -> Chart:
    """Latency by percentile (HdrHistogram's plot) from ``quantile_table``s: x is the percentile on a
    log scale of 1/(1-q), so the tail (99%, 99.9%) gets as much room as the median; the maximum is
    drawn as a hollow marker at the right edge."""
    fig, canvas = _figure(width_px, height_px, right=230 if len(tables) > 4 else 20)
    ax = fig.add_subplot()
    _style(ax, title, "percentile", ylabel)
    right = 3e4
    for i, (label, table) in enumerate(tables.items()):
        pts = [(1 / (1 - q / 100), v) for q, v in table if q < 100 and v > 0]
        top = [v for q, v in table if q == 100.0 and v > 0]
        if not pts:
            continue
        color = (colors or {}).get(label) or color_for(i)
        n = (counts or {}).get(label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, linewidth=1.6, color=color,
                label=f"{label} (n={n:,})" if n else label)
        if top:
            ax.plot([right], top, marker="o", markersize=5, markerfacecolor="white", color=color)
    ax.set_xscale("log")
    ax.set_xticks([1, 2, 10, 100, 1000, 1e4, right])
    ax.set_xticklabels(["0%", "50%", "90%", "99%", "99.9%", "99.99%", "max"])
    ax.set_xlim(0.9, right * 1.5)
    ax.set_yscale("log")
    _log_ticks(ax, "y")
    if len(tables) > 4:
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    elif tables:
        ax.legend(fontsize=8, frameon=False, loc="lower right")
    return _png(fig, canvas)


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;margin:2em auto;
     max-width:1360px;padding:0 1.5em;color:#222;line-height:1.45}
h1{font-size:1.6em;margin-bottom:.2em} h2{margin-top:1.8em;border-bottom:1px solid #ddd;padding-bottom:.2em}
h3{margin-bottom:.3em}
table{border-collapse:collapse;margin:.6em 0;font-size:.92em}
th,td{padding:3px 10px;border-bottom:1px solid #e3e3e3;text-align:left;vertical-align:top}
th{background:#f4f4f4} table.num td,table.num th{text-align:right}
table.num td:first-child,table.num th:first-child{text-align:left}
.muted{color:#666;font-size:.9em} .bad{color:#b00020;font-weight:bold} .good{color:#1b7a3d;font-weight:bold}
img.chart{max-width:100%;height:auto;border:1px solid #eee;margin:.4em 0}
.row{display:flex;flex-wrap:wrap;gap:1em}
code{background:#f4f4f4;padding:0 .3em;border-radius:3px}
li{margin:.2em 0}
"""


def page(title: str, body: str, *, subtitle: str = "") -> str:
    """A whole HTML document with the reports' common style."""
    sub = f'<p class="muted">{subtitle}</p>' if subtitle else ""
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1"><style>{STYLE}</style></head>'
            f"<body><h1>{html.escape(title)}</h1>{sub}{body}</body></html>")

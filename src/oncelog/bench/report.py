"""The bench's output: rich tables in the terminal, and ``report.html`` (PNG charts from
``oncelog.charts``, embedded) next to ``bench.json`` (every raw figure) and the charts as PNG files.

Everything is computed from the JSON document, so a saved ``bench.json`` can be re-rendered.
"""

from __future__ import annotations

import html
import math
from pathlib import Path
from typing import Any

from oncelog import charts
from oncelog.charts import Chart, Series

BROKER_COLORS = {"oncelog": "#0072B2", "tansu": "#E69F00"}
GUARANTEE_COLORS = {"at_most_once": "#CC79A7", "at_least_once": "#009E73", "exactly_once": "#0072B2"}
LIMIT_TEXT = {
    "broker": "the broker's CPU (≥ 85% of the cores it can use)",
    "client": "a client process's CPU (≥ 85% of a core)",
    "machine": "the machine (≥ 90% of every core busy, others' work included)",
    "waiting": "neither CPU: round trips, fsync or the in-flight limit",
}


def mb(thr: dict[str, Any]) -> str:
    """MB/s, marked with "!" when records timed out (the broker fell behind the producers' queue)."""
    return _f(thr["mb_per_s"]) + ("!" if thr.get("timed_out") else "")


def _f(v: Any, digits: int = 1) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.{digits}f}"


def _ms(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


#: A fixed-rate figure is marked "!" when its run did not do what its rate promised: it offered, or had
#: acknowledged, less than this share of the rate...
SHORTFALL = 0.95
#: ... or its records went out later than this against their schedule (p99 of the send lag, ms) ...
SEND_LAG_BOUND_MS = 10.0
#: ... or its consumers never saw some of the records acknowledged (they count as the worst case).
MARK_NOTE = (f"Latency marked ! : the run offered or had acknowledged less than {SHORTFALL:.0%} of its rate, its "
             f"records went out more than {SEND_LAG_BOUND_MS:g} ms late against their schedule (p99 send lag), or "
             "its consumers never saw some acknowledged records (counted as the worst case); each is listed with "
             "its reasons.")


def latency_flags(lat: dict[str, Any] | None) -> list[str]:
    """Why a fixed-rate figure does not measure what its rate promised, in words (empty: it does)."""
    if not lat or "error" in lat:
        return []
    out: list[str] = []
    rate = lat.get("rate") or 0.0
    for key, what in (("offered_per_s", "offered"), ("acked_per_s", "acknowledged")):
        got = lat.get(key)
        if rate and got is not None and got < SHORTFALL * rate:
            out.append(f"{what} {got:,.0f}/s of {rate:,.0f}/s ({got / rate:.0%})")
    lag = (lat.get("send_lag_ms") or {}).get("p99")
    if lag is not None and lag > SEND_LAG_BOUND_MS:
        out.append(f"records went out {_ms(lag)} ms late against their schedule (p99 send lag)")
    if lat.get("unseen"):
        out.append(f"{lat['unseen']:,} of {lat.get('expected', 0):,} acknowledged records never seen (counted as "
                   f"{_ms(lat.get('unseen_ms'))} ms)")
    return out


def latency_cell(lat: dict[str, Any] | None) -> str:
    if not lat:
        return "-"
    if "error" in lat:
        return "failed"
    if not lat.get("n"):
        return "no samples"
    mark = " !" if latency_flags(lat) else ""
    return f"{_ms(lat.get('p50'))} / {_ms(lat.get('p99'))} / {_ms(lat.get('p99.9'))}{mark}"


def p99_cell(lat: dict[str, Any] | None) -> str:
    """A curve point's p99, marked as ``latency_cell`` marks."""
    if not lat or not lat.get("n"):
        return "-"
    return _ms(lat.get("p99")) + (" !" if latency_flags(lat) else "")


def marked_latencies(doc: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(where, reasons) of every marked fixed-rate figure of the workload rows and curves."""
    out: list[tuple[str, list[str]]] = []
    for row in doc["rows"].values():
        for broker, entry in row.get("brokers", {}).items():
            for fraction, lat in (entry.get("latency") or {}).items():
                if why := latency_flags(lat):
                    out.append((f"{row['label']}, {broker}, at {fraction} of peak", why))
    for name, curve in doc.get("curves", {}).items():
        for x, point in zip(curve["x"], curve["points"], strict=True):
            for broker, entry in point.get("brokers", {}).items():
                if why := latency_flags(entry.get("latency")):
                    out.append((f"{name} curve, {x:,}, {broker}", why))
    return out


def ratio(a: Any, b: Any) -> float | None:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b > 0 and a > 0:
        return a / b
    return None


def _thr(doc: dict[str, Any], row: str, broker: str, key: str = "records_per_s") -> float | None:
    value = doc["rows"].get(row, {}).get("brokers", {}).get(broker, {}).get("throughput", {}).get(key)
    return float(value) if value is not None else None


def _p99(entry: dict[str, Any], fraction: str) -> float | None:
    lat = entry.get("latency", {}).get(fraction) or {}
    return lat.get("p99") if lat.get("n") else None


def brokers_of(doc: dict[str, Any]) -> list[str]:
    return list(doc["conditions"]["brokers"])


def ratios(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The ratios that mean something, per broker (and ours / Tansu), with how to read each."""
    out: list[dict[str, Any]] = []
    names = brokers_of(doc)

    def per_broker(label: str, num: str, den: str, meaning: str) -> None:
        values = {b: ratio(_thr(doc, num, b), _thr(doc, den, b)) for b in names}
        if any(v is not None for v in values.values()):
            out.append({"ratio": label, "values": values, "meaning": meaning})

    per_broker("transactional / acks=all", "produce_transactional", "produce",
               "the cost of transactions (AddPartitionsToTxn, markers, commits every 100 ms) at the same "
               "batch.size, linger.ms and in-flight limit (5)")
    per_broker("idempotent / acks=all", "produce_idempotent", "produce",
               "the cost of sequence checks and producer state at the same batch size and in-flight limit")
    per_broker("fsync per append / acks=all", "produce_fsync", "produce",
               "the cost of an fsync before every acknowledgement (flush.messages=1; ours only: Tansu keeps "
               "everything in memory and fsyncs nothing, so its two rows do the same work)")
    per_broker("read_committed / read_uncommitted", "consume_read_committed", "consume",
               "the cost of the LSO and aborted-transaction index on reads (of transactional data)")
    if "oncelog" in names and "tansu" in names:
        for spec in doc["rows"].values():
            brokers = spec.get("brokers", {})
            o, t = brokers.get("oncelog", {}), brokers.get("tansu", {})
            thr = ratio(o.get("throughput", {}).get("records_per_s"), t.get("throughput", {}).get("records_per_s"))
            values: dict[str, float | None] = {"throughput": thr}
            for fraction in spec.get("brokers", {}).get("oncelog", {}).get("latency", {}):
                values[f"p99 at {fraction}"] = ratio(_p99(o, fraction), _p99(t, fraction))
            out.append({"ratio": f"oncelog / tansu: {spec['label']}", "values": values,
                        "meaning": "throughput > 1: ours is faster; p99 > 1: ours has the longer tail"})
    for name, target in doc.get("curves", {}).items():
        if not name.startswith("scale target") or len(target["points"]) != 2:
            continue
        lo, hi = target["points"]
        how = spread_of(target)
        kept = {b: ratio(hi["brokers"].get(b, {}).get("throughput", {}).get("records_per_s"),
                         lo["brokers"].get(b, {}).get("throughput", {}).get("records_per_s")) for b in names}
        out.append({"ratio": f"1,000 partitions x 100 producers / 3 partitions x 1 producer, {how}", "values": kept,
                    "meaning": "throughput kept at scale (issue 14's target: at least 0.8); when the clients "
                               "limit a point (its limited-by column), this is the machine's figure, not the broker's"})
        per_core = {b: ratio(per_broker_core(hi["brokers"].get(b, {})), per_broker_core(lo["brokers"].get(b, {})))
                    for b in names}
        out.append({"ratio": f"MB/s per core of broker CPU, 1,000 x 100 / 3 x 1, {how}", "values": per_core,
                    "meaning": "the broker's own cost per byte at scale, whoever limits the run: 1.0 means a byte "
                               "costs the broker as much CPU at 1,000 x 100 as at 3 x 1"})
    return out


# how the producers of a scale-target curve spread records (runner.SCALE_TARGETS)
SCALE_SPREAD = {"round_robin": "records round robin", "client": "keyless records"}


def spread_of(curve: dict[str, Any]) -> str:
    """A scale-target curve's spread of records, in words (bench.json before the keyless target
    had only the round-robin one, with no partitioner named)."""
    partitioner = curve.get("partitioner", "round_robin")
    return SCALE_SPREAD.get(partitioner, partitioner)


def per_broker_core(entry: dict[str, Any]) -> float | None:
    """A throughput run's MB/s per core of CPU the broker used in it (None without both figures)."""
    thr = entry.get("throughput") or {}
    busy = (thr.get("cpu") or {}).get("broker_pct")
    if thr.get("mb_per_s") is None or not busy:
        return None
    return float(thr["mb_per_s"]) / (float(busy) / 100.0)


# --- terminal --------------------------------------------------------------------------------------

def repeats_note(plan: dict[str, Any]) -> str:
    """How the workload rows' latency figures were chosen (bench.json of older runs: one run each)."""
    n = plan.get("latency_repeats", 1)
    if n <= 1:
        return "One fixed-rate run per broker and rate."
    return (f"{n} fixed-rate runs per broker and rate of the workload rows, the brokers taking turns; each figure "
            "is the run with the median p99 (every run's p99 is in bench.json, p99_runs).")


def client_priority_note(plan: dict[str, Any]) -> str:
    """What the load generator's CPU priority means for the figures (bench.json of older runs has none)."""
    if plan.get("client_priority", "normal") == "idle":
        return ("The fixed-rate runs' client processes ran at idle CPU priority (SCHED_IDLE, nice 19, an "
                "autogroup of their own): on a machine they share with the broker they take only the CPU the "
                "broker leaves, as clients on other machines would; throughput runs' clients at normal priority.")
    return ("Every client process ran at normal CPU priority, competing with the broker for the cores "
            "(librdkafka's idempotent producer polls without sleeping while a partition waits for an answer).")


def print_tables(doc: dict[str, Any], console: Any) -> None:
    from rich.table import Table

    cond = doc["conditions"]
    names = brokers_of(doc)
    fractions = [f"{f * 100:g}%" for f in cond["plan"]["fractions"]]
    plan = cond["plan"]
    t = Table(title=f"oncelog bench ({cond['mode']}): {plan['size']} B records, {plan['partitions']} partitions, "
                    f"{plan['processes']} client processes, librdkafka {cond['librdkafka']}",
              caption="CPU: % of one core over the run (clients: all client processes; others: the rest of the "
                      f"machine, {cond.get('machine_cpus', cond['cpus'])} cores). Latency p50 / p99 / p99.9 in ms at "
                      "fixed rates, the same for both brokers (a fraction of the lower peak); produce rows: "
                      "acknowledgement, consume rows: produce-to-consume. MB/s marked ! : some records were not "
                      "acknowledged within 60 s (message.timeout.ms): the broker fell behind. " + MARK_NOTE + " "
                      + repeats_note(plan) + " " + client_priority_note(plan))
    for col, justify in [("workload", "left"), ("broker", "left"), ("MB/s", "right"), ("records/s", "right"),
                         ("vs tansu" if "tansu" in names else "", "right"), ("rec/batch", "right"),
                         ("CPU broker", "right"), ("CPU clients", "right"), ("CPU others", "right"),
                         ("limited by", "left")]:
        t.add_column(col, justify=justify)  # type: ignore[arg-type]
    for fraction in fractions:
        t.add_column(f"@{fraction} of peak (ms)", justify="right")
    for name, row in doc["rows"].items():
        for i, broker in enumerate(names):
            row_cells, lat, error = _workload_cells(doc, name, broker, fractions)
            label = row["label"] if i == 0 else ""
            if error is not None:
                t.add_row(label, broker, f"[red]{error[:60]}[/red]", *[""] * 7, *lat)
                continue
            t.add_row(label, broker, *row_cells, *lat, end_section=i == len(names) - 1)
    console.print(t)
    marked = marked_latencies(doc)
    if marked:
        console.print("[bold]Latency figures marked ![/bold] (they do not measure what their rate promised):")
        for where, why in marked:
            console.print(f"  ! {where}: {'; '.join(why)}", highlight=False)

    rt = Table(title="Ratios (same run, same machine)")
    rt.add_column("ratio")
    keys: list[str] = []
    for item in ratios(doc):
        for k in item["values"]:
            if k not in keys:
                keys.append(k)
    for k in keys:
        rt.add_column(k, justify="right")
    rt.add_column("how to read it")
    for item in ratios(doc):
        rt.add_row(item["ratio"], *[f"{v:.2f}" if (v := item["values"].get(k)) else "" for k in keys],
                   item["meaning"])
    if rt.row_count:
        console.print(rt)

    for name, curve in doc.get("curves", {}).items():
        how = f" ({spread_of(curve)})" if name.startswith("scale target") else ""
        c = Table(title=f"{name}{how}: throughput (MB/s) and p99 ack latency at "
                        f"{plan['curve_fraction'] * 100:g}% of the peak (ms)")
        c.add_column(curve["xlabel"])
        for broker in names:
            c.add_column(f"{broker} MB/s", justify="right")
            c.add_column(f"{broker} rec/s", justify="right")
            c.add_column(f"{broker} p99", justify="right")
            c.add_column(f"{broker} limited by")
        for x, point in zip(curve["x"], curve["points"], strict=True):
            cells: list[str] = []
            for broker in names:
                e = point["brokers"].get(broker, {})
                thr, point_lat = e.get("throughput"), e.get("latency") or {}
                cells += [mb(thr) if thr else "[red]failed[/red]",
                          _f(thr["records_per_s"], 0) if thr else "",
                          p99_cell(point_lat),
                          thr["limited_by"] if thr else ""]
            label = f"{point['processes']}x{point['per_process']}" if name == "producers" else f"{x:,}"
            if name.startswith("scale target"):
                label = f"{point['partitions']:,} partitions, {point['producers']} producer(s)"
            c.add_row(label, *cells)
        console.print(c)

    rec = doc.get("recovery")
    if rec and rec.get("points"):
        t = Table(title=f"Recovery after SIGKILL, {rec['bytes'] / 2**20:,.0f} MiB unflushed. {RECOVERY_NOTE}")
        for col in RECOVERY_COLUMNS:
            t.add_column(col, justify="right")
        for point in rec["points"]:
            cells = recovery_cells(point)
            if "error" in point:
                cells[-1] = f"[red]{cells[-1][:80]}[/red]"
            t.add_row(*cells)
        console.print(t)

    pipe = doc.get("pipeline")
    if pipe and pipe.get("points"):
        p = Table(title=f"Spark pipeline (oncelog source -> oncelog sink), {pipe['records']:,} records of "
                        f"{pipe['size']} B, {pipe.get('master', 'local[2]')}: records/s per micro-batch size "
                        "(maxOffsetsPerTrigger), beside a single-process transactional copier; latency: "
                        "produce -> visible read_committed in the output, p50/p99 ms. " + pipeline_rounds_note(pipe))
        for col in PIPELINE_COLUMNS:
            p.add_column(col, justify="right")
        for point in pipe["points"]:
            if "error" in point:
                p.add_row(f"{point['max_offsets']:,}", f"[red]{point['error'][:80]}[/red]")
                continue
            p.add_row(*pipeline_cells(point))
        console.print(p)
        good = [point for point in pipe["points"] if "error" not in point]
        if any(point.get("cpu_s") for point in good):
            pc = Table(title=PIPELINE_CPU_NOTE)
            for col in PIPELINE_CPU_COLUMNS:
                pc.add_column(col, justify="right")
            for point in good:
                pc.add_row(*pipeline_cpu_cells(point))
            console.print(pc)
        marked = pipeline_marks(pipe)
        if marked:
            console.print(f"[bold]Pipeline figures marked ![/bold] {PIPELINE_MARK_NOTE}")
            for where, why in marked:
                console.print(f"  ! {where}: {'; '.join(why)}", highlight=False)


#: Columns of the recovery table (terminal and HTML).
RECOVERY_COLUMNS = ["batch.size", "log MiB", "empty start s", "listening after s", "answering after s", "s per GiB",
                    "beyond an empty start, s per GiB"]


def recovery_cells(point: dict[str, Any]) -> list[str]:
    if "log_bytes" not in point:
        return [f"{point['batch_size']:,}", point.get("error", "-")]
    return [f"{point['batch_size']:,}", _f(point["log_bytes"] / 2**20, 0), _f(point["empty_start_s"], 2),
            _f(point["listening_s"], 2), _f(point["answering_s"], 2), _f(point["s_per_gib"], 2),
            _f(point["beyond_empty_start_s_per_gib"], 2)] + ([point["error"]] if "error" in point else [])


RECOVERY_NOTE = ("Our broker restarted after SIGKILL with the whole log unflushed (--flush-interval-ms of an hour): "
                 "the restart re-reads and CRC-checks every batch and replays producer state. 1 KiB records from an "
                 "idempotent producer; the restarted broker must answer with the end offsets it had acknowledged. "
                 "Issue 14's target: under 2 s per GiB.")


#: Columns of the pipeline table (terminal and HTML): records/s, the three target ratios, latency.
PIPELINE_COLUMNS = ["micro-batch", "copier", *GUARANTEE_COLORS, "eo / copier (per round)", "eo / alo (per round)",
                    "amo / alo (per round)", *(f"{g} p50/p99 ms" for g in ("copier", *GUARANTEE_COLORS))]
#: Columns of the pipeline's CPU table (terminal and HTML).
PIPELINE_CPU_COLUMNS = ["micro-batch", *(f"{g} broker/pipeline" for g in ("copier", *GUARANTEE_COLORS))]
PIPELINE_CPU_NOTE = ("Spark pipeline: where the CPU went, in % of one core over each column's timed runs (every "
                     "round): the broker's / the pipeline side's (Spark's JVM and Python workers; for the copier, "
                     "its process).")


def pipeline_cpu(point: dict[str, Any], who: str) -> str:
    """``who``'s CPU over its timed runs of every round (``cpu_s`` phases ``{who}-{round}``), as
    "broker/pipeline" in % of one core; "-" without figures."""
    phases = [v for k, v in (point.get("cpu_s") or {}).items()
              if k.rpartition("-")[0] == who and k.rpartition("-")[2].isdigit()]
    wall = sum(v.get("wall_s", 0.0) for v in phases)
    if not wall:
        return "-"
    broker = sum(v.get("broker_cpu_s", 0.0) for v in phases)
    side = sum(v.get("clients_cpu_s", 0.0) for v in phases)
    return f"{broker / wall * 100:.0f}/{side / wall * 100:.0f}" if broker else f"-/{side / wall * 100:.0f}"
#: The pipeline table's ratio columns, as bench.json names them
PIPELINE_RATIOS = ("ratio_eo_vs_copier", "ratio_eo_vs_alo", "ratio_amo_vs_alo")


def pipeline_rounds_note(pipe: dict[str, Any]) -> str:
    """Which figures of the pipeline table come from where: they need not agree with each other."""
    rounds = pipe.get("rounds", 1)
    if rounds <= 1:
        return "One round: every figure and ratio of a row from the same round."
    return (f"{rounds} rounds per micro-batch size: each records/s figure is that column's own median round (the "
            "columns' medians may come from different rounds); each ratio is the median of the ratios taken within "
            "each round (copier and guarantees run back to back), the lowest and highest round in brackets, so a "
            "ratio need not equal the ratio of the figures printed beside it. Every round is in bench.json.")


PIPELINE_MARK_NOTE = ("A pipeline figure marked ! : in some round its output, read read_committed when its clock "
                      "stopped, did not hold every input record exactly once, or its latency run never saw some "
                      "records (counted as the worst case); each is listed with its reasons.")


def _output_flags(f: dict[str, Any]) -> list[str]:
    out = []
    if f.get("missing"):
        out.append(f"{f['missing']:,} of {f.get('records', f['missing'] + f.get('visible', 0)):,} records not "
                   "visible read_committed in the output when the clock stopped")
    if f.get("duplicates"):
        out.append(f"{f['duplicates']:,} duplicate records in the output")
    if f.get("foreign"):
        out.append(f"{f['foreign']:,} records in the output that are not input records")
    if f.get("unread_partitions"):
        out.append(f"{f['unread_partitions']} output partitions not read to their end")
    return out


def pipeline_flags(point: dict[str, Any]) -> dict[tuple[str, str], list[str]]:
    """Why a pipeline point's figures do not say what they seem to, by (who, "records/s" | "latency"):
    a round whose output was incomplete or duplicated when its clock stopped (every round is checked,
    the figure shown being one of them), a latency run that did not see every record."""
    out: dict[tuple[str, str], list[str]] = {}
    for who in ("copier", *GUARANTEE_COLORS):
        rounds = [r[who] for r in point.get("rounds", []) if isinstance(r.get(who), dict)] or (
            [point[who]] if isinstance(point.get(who), dict) else [])
        why = [f"round {k + 1}: {w}" if len(rounds) > 1 else w for k, f in enumerate(rounds) for w in _output_flags(f)]
        if why:
            out[(who, "records/s")] = why
        lat = (point.get("latency") or {}).get(who) or {}
        why = []
        if lat.get("unseen"):
            why.append(f"{lat['unseen']:,} of {lat.get('sent', 0):,} records never seen in the output (counted as "
                       f"{_f(lat.get('unseen_ms'), 0)} ms)")
        if lat.get("duplicates"):
            why.append(f"{lat['duplicates']:,} duplicate records read in the output")
        if why:
            out[(who, "latency")] = why
    return out


def pipeline_marks(pipe: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """(where, reasons) of every marked figure of the pipeline table."""
    return [(f"micro-batch {point['max_offsets']:,}, {who} {what}", why) for point in pipe.get("points", [])
            if "error" not in point for (who, what), why in pipeline_flags(point).items()]


def pipeline_cells(point: dict[str, Any]) -> list[str]:
    lat = point.get("latency") or {}
    flags = pipeline_flags(point)

    def mark(who: str, what: str) -> str:
        return " !" if (who, what) in flags else ""

    def ms(who: str) -> str:
        got = lat.get(who) or {}
        return f"{_f(got.get('p50_ms'), 0)}/{_f(got.get('p99_ms'), 0)}{mark(who, 'latency')}" if got else "-"

    def ratio_cell(key: str) -> str:
        """The median of the rounds' own ratios, with their range when there were several rounds."""
        per_round = [r[key] for r in point.get("rounds", []) if isinstance(r.get(key), (int, float))]
        spread = f" ({min(per_round):.2f}-{max(per_round):.2f})" if len(per_round) > 1 else ""
        return _f(point.get(key), 3) + spread

    who = ("copier", *GUARANTEE_COLORS)
    figures = [_f(point.get(g, {}).get("records_per_s"), 0) + mark(g, "records/s") for g in who]
    return [f"{point['max_offsets']:,}", *figures, *[ratio_cell(key) for key in PIPELINE_RATIOS],
            *[ms(w) for w in who]]


def pipeline_cpu_cells(point: dict[str, Any]) -> list[str]:
    return [f"{point['max_offsets']:,}", *[pipeline_cpu(point, w) for w in ("copier", *GUARANTEE_COLORS)]]


# --- HTML and charts -------------------------------------------------------------------------------

def _target_charts(name: str, curve: dict[str, Any], names: list[str], fraction: float,
                   ) -> list[tuple[str, Chart]]:
    """Two points that are not a scale: bars, not a line."""
    slug = name.replace(",", "").replace(" ", "-")
    how = spread_of(curve)
    cats = [f"{p['partitions']:,} partitions\n{p['producers']} producer{'s' if p['producers'] != 1 else ''}"
            for p in curve["points"]]
    thr = {b: [p["brokers"].get(b, {}).get("throughput", {}).get("mb_per_s") for p in curve["points"]]
           for b in names}
    p99 = {b: [(p["brokers"].get(b, {}).get("latency") or {}).get("p99") for p in curve["points"]] for b in names}
    return [(f"curve-{slug}-throughput", charts.bar_chart(
                f"Throughput at scale, {how}", cats, thr,
                ylabel="MB/s (acknowledged)", colors=BROKER_COLORS, fmt="{:.1f}")),
            (f"curve-{slug}-p99", charts.bar_chart(
                f"p99 at scale, {how} (ms, log scale)", cats, p99, ylabel="ms", logy=True,
                colors=BROKER_COLORS,
                note=f"at {fraction * 100:g}% of the lower of the two brokers' peaks at each point, linger.ms=0"))]


def _curve_charts(name: str, curve: dict[str, Any], names: list[str], fraction: float) -> list[tuple[str, Chart]]:
    if name.startswith("scale target"):
        return _target_charts(name, curve, names, fraction)
    xs = curve["x"]
    logx = True
    thr, p99, recs = [], [], []
    for broker in names:
        mb = [p["brokers"].get(broker, {}).get("throughput", {}).get("mb_per_s") for p in curve["points"]]
        rs = [p["brokers"].get(broker, {}).get("throughput", {}).get("records_per_s") for p in curve["points"]]
        lat = [(p["brokers"].get(broker, {}).get("latency") or {}) for p in curve["points"]]
        color = BROKER_COLORS.get(broker)
        thr.append(Series(broker, xs, mb, color=color))
        recs.append(Series(broker, xs, rs, color=color))
        p99.append(Series(broker, xs, [e.get("p99") if e.get("n") else None for e in lat], color=color))
    slug = name.replace(" ", "-")
    out = [(f"curve-{slug}-throughput", charts.line_chart(
        f"Throughput against {name}", thr, xlabel=curve["xlabel"], ylabel="MB/s (acknowledged)", logx=logx,
        annotate=True))]
    if name == "record size":
        out.append((f"curve-{slug}-records", charts.line_chart(
            "Records/s against record size", recs, xlabel=curve["xlabel"], ylabel="records/s", logx=True,
            logy=True, annotate=True)))
    out.append((f"curve-{slug}-p99", charts.line_chart(
        f"p99 acknowledgement latency against {name}", p99, xlabel=curve["xlabel"], ylabel="ms (log scale)",
        logx=logx, logy=True, annotate=True,
        note=f"at {fraction * 100:g}% of the lower of the two brokers' peaks at each point, linger.ms=0")))
    return out


def make_charts(doc: dict[str, Any]) -> list[tuple[str, str, Chart]]:
    """(file name, section, chart) for every chart of the report."""
    names = brokers_of(doc)
    rows = doc["rows"]
    plan = doc["conditions"]["plan"]
    fractions = [f"{f * 100:g}%" for f in plan["fractions"]]
    out: list[tuple[str, str, Chart]] = []
    labels = [r["label"].replace("produce ", "").replace("consume ", "consume\n") for r in rows.values()]
    groups = {b: [r["brokers"].get(b, {}).get("throughput", {}).get("mb_per_s") for r in rows.values()]
              for b in names}
    out.append(("throughput", "rows", charts.bar_chart(
        "Throughput per workload (MB/s acknowledged or consumed)", labels, groups, ylabel="MB/s",
        colors=BROKER_COLORS, width_px=900, fmt="{:.1f}")))
    cpu_labels, broker_cpu, client_cpu, other_cpu = [], [], [], []
    for r in rows.values():
        for b in names:
            thr = r["brokers"].get(b, {}).get("throughput")
            if thr:
                cpu_labels.append(f"{r['label'].replace('produce ', '').replace('consume ', 'consume ')}\n{b}")
                broker_cpu.append(thr["cpu"]["broker_pct"])
                client_cpu.append(thr["cpu"]["clients_pct"])
                other_cpu.append(thr["cpu"]["others_pct"])
    machine = doc["conditions"].get("machine_cpus", doc["conditions"]["cpus"])
    if cpu_labels:
        out.append(("cpu", "rows", charts.stacked_bar_chart(
            "Where the CPU went during each throughput run (% of one core)", cpu_labels,
            {"broker": broker_cpu, "clients": client_cpu, "everyone else on the machine": other_cpu},
            ylabel="% of one core", colors={"broker": "#0072B2", "clients": "#009E73",
                                            "everyone else on the machine": "#BBBBBB"},
            hline=machine * 100, hline_label=f"all {machine} cores",
            width_px=1100, height_px=420)))
    lat_groups: dict[str, list[float | None]] = {}
    for f in fractions:
        for b in names:
            lat_groups[f"{b} @{f}"] = [_p99(r["brokers"].get(b, {}), f) for r in rows.values()]
    lat_colors = {}
    for i, f in enumerate(fractions):
        for b in names:
            base = BROKER_COLORS.get(b, "#555555")
            lat_colors[f"{b} @{f}"] = base if i == len(fractions) - 1 else _lighter(base)
    out.append(("latency-p99", "rows", charts.bar_chart(
        "p99 latency per workload at fixed rates (ms, log scale)", labels, lat_groups, ylabel="ms",
        logy=True, colors=lat_colors, width_px=1100, fmt="{:.1f}",
        note="produce rows: acknowledgement latency (delivery report); consume rows: produce-to-consume")))
    for name, r in rows.items():
        tables: dict[str, list[tuple[float, float]]] = {}
        colors: dict[str, str] = {}
        for i, f in enumerate(fractions):
            for b in names:
                lat = r["brokers"].get(b, {}).get("latency", {}).get(f) or {}
                if lat.get("n"):
                    tables[f"{b} @{f}"] = [(q, v) for q, v in lat["table"]]
                    base = BROKER_COLORS.get(b, "#555555")
                    colors[f"{b} @{f}"] = base if i == len(fractions) - 1 else _lighter(base)
        if tables:
            kind = "produce-to-consume" if r["kind"] == "consume" else "acknowledgement"
            out.append((f"latency-{name}", "latency", charts.quantile_chart(
                f"{r['label']}: {kind}", tables, colors=colors, ylabel=f"{kind} latency, ms (log scale)")))
    for name, curve in doc.get("curves", {}).items():
        for file, chart in _curve_charts(name, curve, names, plan["curve_fraction"]):
            out.append((file, "curves", chart))
    pipe = doc.get("pipeline")
    good = [p for p in (pipe or {}).get("points", []) if "error" not in p]
    if good:
        xs = [p["max_offsets"] for p in good]
        series = [Series(g, xs, [p.get(g, {}).get("records_per_s") for p in good], color=c)
                  for g, c in {**GUARANTEE_COLORS, "copier": "#999999"}.items()
                  if any(p.get(g) for p in good)]
        out.append(("pipeline", "pipeline", charts.line_chart(
            "Spark pipeline records/s against micro-batch size", series,
            xlabel="micro-batch size (maxOffsetsPerTrigger, records)", ylabel="records/s", logx=True,
            annotate=True, width_px=760)))
    return out


def _lighter(color: str) -> str:
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    return "#" + "".join(f"{int(c + (255 - c) * 0.55):02x}" for c in (r, g, b))


def _html_table(head: list[str], rows: list[list[str]], text_last: bool = False) -> str:
    """A table of figures (right-aligned); ``text_last``: the last column is prose (left-aligned)."""
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    left = ' style="text-align:left"'
    body = "".join("<tr>" + "".join(
        f'<td{left if text_last and i == len(row) - 1 else ""}>{c}</td>'
        for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f'<table class="num"><tr>{th}</tr>{body}</table>'


def _workload_cells(doc: dict[str, Any], name: str, broker: str,
                    fractions: list[str]) -> tuple[list[str], list[str], str | None]:
    """One broker's cells of a workload row, as plain text, for the terminal and the HTML table:
    (MB/s, records/s, vs tansu, records/batch, CPU broker/clients/others, limited by), the latency
    cells per fraction of peak, and the error text when the throughput run did not happen."""
    entry = doc["rows"][name]["brokers"].get(broker, {})
    lat = [latency_cell(entry.get("latency", {}).get(f)) for f in fractions]
    thr = entry.get("throughput")
    if thr is None:
        return [], lat, str(entry.get("error", "not run"))
    vs = ""
    if broker == "oncelog" and "tansu" in brokers_of(doc):
        rr = ratio(thr["records_per_s"], _thr(doc, name, "tansu"))
        vs = f"{rr:.2f}x" if rr else "-"
    cpu = thr["cpu"]
    return [mb(thr), _f(thr["records_per_s"], 0), vs,
            _f(thr.get("batch_records_avg"), 0) if "batch_records_avg" in thr else "",
            f"{cpu['broker_pct']:.0f}%", f"{cpu['clients_pct']:.0f}%", f"{cpu['others_pct']:.0f}%",
            thr["limited_by"]], lat, None


def write_html(doc: dict[str, Any], out: Path, chart_list: list[tuple[str, str, Chart]]) -> Path:
    cond = doc["conditions"]
    plan = cond["plan"]
    names = brokers_of(doc)
    fractions = [f"{f * 100:g}%" for f in plan["fractions"]]
    e = html.escape
    rows_html = []
    for name, row in doc["rows"].items():
        for i, broker in enumerate(names):
            cells, lat, error = _workload_cells(doc, name, broker, fractions)
            lat = [e(c) for c in lat]
            label = e(row["label"]) if i == 0 else ""
            if error is not None:
                rows_html.append([label, e(broker), f'<span class="bad">{e(error)}</span>', *[""] * 7, *lat])
                continue
            limited_by = cells[-1]
            rows_html.append([label, e(broker), *map(e, cells[:-1]),
                              f'<span title="{e(LIMIT_TEXT.get(limited_by, ""))}">{e(limited_by)}</span>', *lat])
    main = _html_table(["workload", "broker", "MB/s", "records/s", "vs tansu", "records/batch", "CPU broker",
                        "CPU clients", "CPU others", "limited by",
                        *[f"p50 / p99 / p99.9 ms at {f} of peak" for f in fractions]], rows_html)
    keys: list[str] = []
    for item in ratios(doc):
        keys += [k for k in item["values"] if k not in keys]
    ratio_rows = [[e(item["ratio"]), *[f"{v:.2f}" if (v := item["values"].get(k)) else "" for k in keys],
                   e(item["meaning"])] for item in ratios(doc)]
    ratio_table = _html_table(["ratio", *keys, "how to read it"], ratio_rows, text_last=True)
    sections: dict[str, list[str]] = {}
    for file, section, chart in chart_list:
        sections.setdefault(section, []).append(chart.img(file.replace("-", " ")))
    limits = "".join(f"<li><b>{e(k)}</b>: {e(v)}</li>" for k, v in LIMIT_TEXT.items())
    brokers = "".join(f"<li><b>{e(n)}</b>: <code>{e(b['command'])}</code></li>" for n, b in cond["brokers"].items())
    curve_note = (f"Each point: throughput (producers send as fast as they can for {plan['duration_s']:g} s, "
                  f"linger.ms=5), then p99 acknowledgement latency at {plan['curve_fraction'] * 100:g}% of the "
                  "lower of the two brokers' peaks at that point (linger.ms=0). Producers write each record to "
                  "the next partition in turn, except in the keyless scale target, where records have no key and "
                  "the client's own partitioner (librdkafka's sticky one) chooses.")
    pipe = doc.get("pipeline") or {}
    pipe_html = ("<p>Not measured in this run" + (" (--quick)" if cond["mode"] == "quick" else "") + ".</p>"
                 if not pipe.get("points") else
                 f"<p>{pipe['records']:,} records of {pipe['size']} B per guarantee, oncelog source to oncelog sink, "
                 f"{e(pipe.get('master', 'local[2]'))}, each micro-batch size in its own Spark session and broker "
                 "(<code>python -m oncelog.demo.pipeline_bench</code>), beside the anchor: a single-process "
                 "confluent-kafka transactional copier (one transaction per consume call of up to a micro-batch). "
                 "Latency: a fixed-rate producer's record to a read_committed consumer seeing it in the output, "
                 f"p50/p99 in ms. {e(pipeline_rounds_note(pipe))}</p>"
                 + _html_table(PIPELINE_COLUMNS,
                               [pipeline_cells(p) if "error" not in p else
                                [f"{p['max_offsets']:,}", f'<span class="bad">{e(p["error"])}</span>']
                                for p in pipe["points"]])
                 + ("" if not pipeline_marks(pipe) else f"<p>{e(PIPELINE_MARK_NOTE)}</p><ul>" + "".join(
                     f"<li>! <b>{e(where)}</b>: {e('; '.join(why))}</li>" for where, why in pipeline_marks(pipe))
                    + "</ul>")
                 + f"<p>{e(PIPELINE_CPU_NOTE)}</p>"
                 + _html_table(PIPELINE_CPU_COLUMNS,
                               [pipeline_cpu_cells(p) for p in pipe["points"] if "error" not in p]))
    marked = marked_latencies(doc)
    marked_html = ("" if not marked else f"<p>{e(MARK_NOTE)}</p><ul>" + "".join(
        f"<li>! <b>{e(where)}</b>: {e('; '.join(why))}</li>" for where, why in marked) + "</ul>")
    rec = doc.get("recovery") or {}
    rec_html = ("<p>Not measured in this run.</p>" if not rec.get("points") else
                f"<p>{e(RECOVERY_NOTE)}</p>"
                + _html_table([*RECOVERY_COLUMNS, "error"],
                              [[e(c) for c in recovery_cells(p)] for p in rec["points"]]))
    body = f"""
<p>{e(cond['date'])}, {cond['cpus']} cores ({e(cond['machine'])}), load average before the run
{', '.join(str(x) for x in cond['load_average_1_5_15'])} (a shared machine: absolute figures are noisy, ratios
measured side by side in one run are what to read). Python {e(cond['python'])}, librdkafka {e(cond['librdkafka'])}.
Records of {plan['size']} B, {plan['partitions']} partitions, {plan['processes']} client processes x
{plan['producers_per_process']} producer each; throughput runs of {plan['duration_s']:g} s, fixed-rate runs of
{plan['latency_s']:g} s (the first {plan['warmup_s']:g} s dropped). {e(repeats_note(plan))}
{e(client_priority_note(plan))} Raw figures: <code>bench.json</code>.</p>
<ul>{brokers}</ul>
<h2>Workloads</h2>
<p>Producers: acks=all, linger.ms=5, batch.size=1 MiB, at most 5 requests in flight for every mode, so the
ratios between modes are the cost of the guarantee at the same batching. "fsync per append": the topic has
<code>flush.messages=1</code>, so our broker acknowledges an append only once it is fsynced (a group commit:
one fsync covers every append made before it started); Tansu keeps everything in memory and fsyncs nothing,
in every row. MB/s marked "!": some records were not
acknowledged within 60 s (<code>message.timeout.ms</code>), the broker fell behind. "limited by" says who ran
out:</p>
<ul>{limits}</ul>
{main}
{marked_html}
<div class="row">{"".join(sections.get("rows", []))}</div>
<h2>Ratios</h2>{ratio_table}
<h2>Latency by percentile</h2>
<p>At fixed rates, the same for both brokers, every latency counted from the time the record was
<em>scheduled</em> to be sent (start + i / rate), not from the <code>produce()</code> call, which runs late
when the client is held up (a transaction's commit, a full queue): the wait counts, as a client at that rate
would see it. Produce rows: to librdkafka's delivery report (<code>linger.ms=0</code>); consume rows: to the
consumer, through the scheduled time stamped in each record. How late the sends ran against the schedule is
<code>send_lag_ms</code> in <code>bench.json</code>.</p>
<div class="row">{"".join(sections.get("latency", []))}</div>
<h2>Scaling curves</h2><p>{e(curve_note)}</p>
<div class="row">{"".join(sections.get("curves", [])) or "<p>Not measured in this run.</p>"}</div>
<h2>Recovery after SIGKILL</h2>{rec_html}
<h2>Spark pipeline</h2>{pipe_html}
<div class="row">{"".join(sections.get("pipeline", []))}</div>
"""
    path = out / "report.html"
    path.write_text(charts.page("oncelog bench: our broker and the Tansu broker, side by side", body))
    return path


def write_all(doc: dict[str, Any], out: Path) -> Path:
    """bench.json, the charts as PNG files, and report.html, all in ``out``."""
    from oncelog.bench.runner import as_json

    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(as_json(doc))
    chart_list = make_charts(doc)
    for file, _section, chart in chart_list:
        (out / f"{file}.png").write_bytes(chart.png)
    return write_html(doc, out, chart_list)

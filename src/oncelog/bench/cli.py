"""`oncelog bench` (= `make bench`): our broker and the Tansu broker side by side, in one run.

Every figure is measured in this run on this machine; the table reports ratios (ours / Tansu) so
that the result does not depend on how fast the machine is. Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker, tansu_binary, tansu_broker


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=int, default=200_000, help="records per run (default 200000)")
    p.add_argument("--size", type=int, default=1024, help="record value size in bytes (default 1024)")
    p.add_argument("--json", type=Path, help="also write the results as JSON to this file")
    p.add_argument("--no-tansu", action="store_true", help="measure only our broker")
    p.add_argument("--rows", default="produce,consume,produce_idempotent,produce_transactional",
                   help="comma-separated workloads to run")
    p.add_argument("--pipeline-records", type=int, default=200_000,
                   help="records for the Spark pipeline rows (0 skips them; default 200000)")


def run_workload(name: str, bootstrap: str, topic: str, records: int, size: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-m", "oncelog.bench.workloads", name, bootstrap, topic, str(records),
                          str(size)], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{name} failed: {out.stderr.strip().splitlines()[-1:] or out.returncode}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def measure(broker: BrokerProcess, rows: list[str], records: int, size: int,
            progress: Callable[[str], None]) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    produced_topic = None
    for i, row in enumerate(rows):
        topic = f"bench-{i}-{row}"
        if row == "consume":
            if produced_topic is None:
                continue
            topic = produced_topic
        else:
            create_topic(broker.bootstrap, topic)
        progress(f"{row} on {broker.args[0].rsplit('/', 1)[-1]}")
        try:
            r = run_workload(row, broker.bootstrap, topic, records, size)
            r["mb_per_s"] = r["bytes"] / r["seconds"] / 1e6
            results[row] = r
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            results[row] = {"error": str(exc)}
        if row == "produce":
            produced_topic = topic
    return results


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    if "consume" in rows and "produce" in rows:
        rows.remove("consume")
        rows.insert(rows.index("produce") + 1, "consume")
    brokers: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp, \
            console.status("starting oncelog broker") as status:
        ours = oncelog_broker(Path(tmp) / "data").start()
        try:
            brokers["oncelog"] = measure(ours, rows, args.records, args.size, lambda s: status.update(s))
        finally:
            ours.stop()
        if not args.no_tansu and tansu_binary() is not None:
            status.update("starting Tansu broker")
            tansu = tansu_broker().start()
            try:
                brokers["tansu"] = measure(tansu, rows, args.records, args.size, lambda s: status.update(s))
            finally:
                tansu.kill()
    table = Table(title=f"{args.records} records of {args.size} B, librdkafka, acks=all, one partition")
    table.add_column("workload")
    for name in brokers:
        table.add_column(f"{name} MB/s", justify="right")
    if "tansu" in brokers:
        table.add_column("oncelog / tansu", justify="right")
    for row in rows:
        cells = []
        for name in brokers:
            r = brokers[name].get(row, {})
            cells.append(f"{r['mb_per_s']:.1f}" if "mb_per_s" in r else r.get("error", "-")[:40])
        if "tansu" in brokers:
            a, b = brokers["oncelog"].get(row, {}), brokers["tansu"].get(row, {})
            cells.append(f"{a['mb_per_s'] / b['mb_per_s']:.2f}x" if "mb_per_s" in a and "mb_per_s" in b else "-")
        table.add_row(row, *cells)
    ours_rows = brokers["oncelog"]
    idem, txn = ours_rows.get("produce_idempotent", {}), ours_rows.get("produce_transactional", {})
    if "mb_per_s" in idem and "mb_per_s" in txn:
        ratio = ours_rows["produce_transactional"]["mb_per_s"] / ours_rows["produce_idempotent"]["mb_per_s"]
        table.caption = f"oncelog transactional (commit every 100 ms) / idempotent = {ratio:.3f}"
    console.print(table)
    if args.json:
        args.json.write_text(json.dumps({"records": args.records, "size": args.size, "results": brokers}, indent=2))
    failed = any("error" in r for r in ours_rows.values())
    if args.pipeline_records > 0:
        failed |= _pipeline(console, args.pipeline_records, args.json)
    return 1 if failed else 0


def _pipeline(console: Any, records: int, json_path: Path | None) -> bool:
    """End-to-end Spark pipeline throughput per guarantee, in one Spark session (our broker)."""
    from rich.table import Table

    with console.status(f"Spark pipeline, {records} records per guarantee (takes a minute or two)"):
        out = subprocess.run([sys.executable, "-m", "oncelog.demo.pipeline_bench", "--records", str(records)],
                             capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        console.print(f"[red]pipeline bench failed[/red]: {out.stderr.strip().splitlines()[-1:]}")
        return True
    result = json.loads(out.stdout.strip().splitlines()[-1])
    table = Table(title=f"Spark pipeline (oncelog source -> oncelog sink), {records} records, local[2]")
    table.add_column("guarantee")
    table.add_column("records/s", justify="right")
    table.add_column("vs at_least_once", justify="right")
    base = result.get("at_least_once", {}).get("records_per_s")
    for g in ("at_most_once", "at_least_once", "exactly_once"):
        r = result.get(g)
        if r:
            ratio = f"{r['records_per_s'] / base:.3f}" if base else "-"
            table.add_row(g, f"{r['records_per_s']:,.0f}", ratio)
    console.print(table)
    if json_path:
        doc = json.loads(json_path.read_text()) if json_path.exists() else {}
        doc["pipeline"] = result
        json_path.write_text(json.dumps(doc, indent=2))
    return False

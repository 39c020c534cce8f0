"""`oncelog demo` (= `make demo`): the payments pipeline on PySpark under each guarantee, with faults.

1. Starts our broker in a temporary directory (loopback only).
2. Generates payments per account, written in transactions; some transactions are aborted (their
   records must never count).
3. For each guarantee runs the Spark job (oncelog source -> oncelog sink, micro-batches) in its own
   process and SIGKILLs the driver's whole process group mid-batch several times, restarting it
   from its checkpoint each time.
4. Reads the output read_committed, counts records lost and duplicated, rebuilds running totals per
   account into SQLite (``totals`` table, upsert per (guarantee, account)), compares them with the
   expected totals, prints a table and writes an HTML report.

Exits 1 if exactly_once shows any loss or duplicate (or wrong total), 2 if a run failed.
"""

from __future__ import annotations

import argparse
import html
import json
import random
import shutil
import sqlite3
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from oncelog.demo.faults import (
    duplicates_and_losses,
    produce_transactions,
    read_topic,
    run_with_driver_kills,
    zombie_attempt,
)
from oncelog.testing.broker_process import create_topic, oncelog_broker

GUARANTEES = ("exactly_once", "at_least_once", "at_most_once")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=int, default=300, help="committed payments to generate (default 300)")
    p.add_argument("--accounts", type=int, default=8)
    p.add_argument("--kills", type=int, default=2, help="driver SIGKILLs per guarantee (default 2)")
    p.add_argument("--guarantees", default=",".join(GUARANTEES))
    p.add_argument("--max-offsets", type=int, default=80, help="maxOffsetsPerTrigger of the job")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--report", type=Path, default=Path("oncelog-demo-report.html"), help="HTML report path")
    p.add_argument("--sqlite", type=Path, default=Path("oncelog-demo-totals.sqlite"),
                   help="SQLite file for the totals per guarantee and account")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (broker data, logs)")
    p.add_argument("--drop-acks", type=float, default=0.03,
                   help="probability that the proxy between the job and the broker drops a Produce or EndTxn "
                        "response after the broker processed it (a lost acknowledgement; default 0.03, 0 = off)")


@dataclass
class Outcome:
    guarantee: str
    kills: int
    exit_code: int | None
    records_out: int
    lost: int
    duplicated: int
    unexpected: int
    wrong_accounts: int
    seconds: float
    zombie_lost: int = 0
    zombie_duplicated: int = 0
    dropped_acks: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 \
            and self.wrong_accounts == 0 \
            and self.zombie_lost == 0 and self.zombie_duplicated == 0


def payments(n: int, accounts: int, seed: int) -> list[tuple[bytes, bytes]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        acct = f"acct-{rng.randrange(accounts):03d}"
        amount = rng.randrange(1, 500)
        out.append((acct.encode(), json.dumps({"id": i, "account": acct, "amount": amount}).encode()))
    return out


def totals_of(values: list[bytes]) -> dict[str, int]:
    t: Counter[str] = Counter()
    for v in values:
        d = json.loads(v)
        t[d["account"]] += int(d["amount"])
    return dict(t)


def store_totals(db: Path, guarantee: str, totals: dict[str, int]) -> None:
    """Idempotent: upsert by (guarantee, account), so rerunning the demo never double counts."""
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS totals (guarantee TEXT, account TEXT, total INTEGER, "
                     "PRIMARY KEY (guarantee, account))")
        conn.executemany("INSERT INTO totals VALUES (?, ?, ?) ON CONFLICT (guarantee, account) "
                         "DO UPDATE SET total = excluded.total", [(guarantee, a, t) for a, t in totals.items()])


def write_html(path: Path, outcomes: list[Outcome], args: argparse.Namespace) -> None:
    head = ("guarantee", "driver kills", "dropped acks", "records out", "lost", "duplicated", "wrong totals",
            "zombie lost/dup", "seconds", "verdict")
    rows = []
    for o in outcomes:
        verdict = "exact" if o.ok else ("FAILED RUN" if o.exit_code != 0 else "inexact")
        cells = (o.guarantee, o.kills, o.dropped_acks, o.records_out, o.lost, o.duplicated, o.wrong_accounts,
                 f"{o.zombie_lost}/{o.zombie_duplicated}", f"{o.seconds:.0f}", verdict)
        color = "#d4f7d4" if o.ok else "#f7d4d4"
        rows.append(f"<tr style='background:{color}'>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                    + "</tr>")
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>oncelog demo</title>"
        "<style>body{font-family:sans-serif}td,th{padding:4px 10px;border:1px solid #999}"
        "table{border-collapse:collapse}</style>"
        f"<h1>oncelog demo: payments pipeline on PySpark</h1><p>{args.records} committed payments over "
        f"{args.accounts} accounts (plus aborted transactions that must not count); the Spark driver was "
        f"killed with SIGKILL mid-batch {args.kills} time(s) per guarantee and restarted from its checkpoint; "
        "then one task attempt was left stalled before its commit (a zombie) while a retry of the same task ran; "
        f"a proxy dropped {args.drop_acks:.0%} of Produce/EndTxn responses after the broker processed them.</p>"
        "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # a log file or CI: do not squeeze the table to 80 columns
    guarantees = [g.strip() for g in args.guarantees.split(",") if g.strip()]
    work = Path(tempfile.mkdtemp(prefix="oncelog-demo-"))
    db = args.sqlite
    broker = oncelog_broker(work / "broker", "--auto-create-topics", log_path=work / "broker.log")
    outcomes: list[Outcome] = []
    proxy = None
    try:
        with console.status("starting the broker") as status:
            broker.start()
            bs = broker.bootstrap
            console.log(f"broker on {bs}, data in {work / 'broker'}")
            create_topic(bs, "payments", 2)
            status.update("writing payments (some in aborted transactions)")
            events = payments(args.records, args.accounts, args.seed)
            produce_transactions(bs, "payments", events, per_txn=25, abort_every=4, partitions=2)
            expected_values = [v for _k, v in events]
            expected_totals = totals_of(expected_values)
            console.log(f"{len(events)} committed payments, {args.accounts} accounts")
            job_bs = bs
            dropped_before = 0
            if args.drop_acks > 0:
                from oncelog.verify.proxy import API_END_TXN, API_PRODUCE, FaultProxy

                proxy = FaultProxy(broker.host, broker.port, seed=args.seed).start()
                job_bs = proxy.address
                console.log(f"the Spark jobs talk to the broker through a proxy on {job_bs} that drops "
                            f"{args.drop_acks:.0%} of Produce/EndTxn responses after the broker processed them")
            for g in guarantees:
                if proxy is not None:
                    proxy.clear()
                    proxy.drop_responses(API_PRODUCE, 10**6, probability=args.drop_acks)
                    proxy.drop_responses(API_END_TXN, 10**6, probability=args.drop_acks)
                out_topic = f"ledger-{g}"
                progress_topic = f"progress-{g}"
                create_topic(bs, out_topic, 2)
                create_topic(bs, progress_topic, 2)
                status.update(f"{g}: running the Spark job, killing its driver {args.kills} time(s)")
                cmd = [sys.executable, "-m", "oncelog.demo.job", "--bootstrap", job_bs, "--input", "payments",
                       "--output", out_topic, "--checkpoint", str(work / f"ckpt-{g}"), "--guarantee", g,
                       "--max-offsets", str(args.max_offsets), "--delay-ms", "1000",
                       "--progress-topic", progress_topic]
                watch = progress_topic if g == "at_most_once" else out_topic
                def on_event(msg: str, g: str = g) -> None:
                    console.log(f"{g}: {msg}")

                report = run_with_driver_kills(cmd, bs, watch, kills=args.kills, seed=args.seed,
                                               log_path=work / f"job-{g}.log", timeout_s=600,
                                               on_event=on_event)
                got = [v or b"" for _k, v in read_topic(bs, out_topic)]
                lost, dup, unexpected = duplicates_and_losses(expected_values, got)
                totals = totals_of([v for v in got if not v.startswith(b"aborted-")])
                store_totals(db, g, totals)
                wrong = sum(1 for a in set(expected_totals) | set(totals)
                            if totals.get(a) != expected_totals.get(a))
                o = Outcome(g, report.kills, report.exit_code, len(got), lost, dup, unexpected, wrong, report.seconds)
                if proxy is not None:
                    o.dropped_acks = proxy.stats.dropped_responses - dropped_before
                    dropped_before = proxy.stats.dropped_responses
                    proxy.clear()
                status.update(f"{g}: a zombie task attempt racing its retry")
                o.zombie_lost, o.zombie_duplicated = zombie_attempt(bs, g, f"zombie-{g}", progress_topic)
                outcomes.append(o)
                console.log(f"{g}: done in {o.seconds:.0f}s: {o.records_out} out, {lost} lost, {dup} duplicated, "
                            f"{wrong} wrong account totals; zombie attempt: {o.zombie_lost} lost, "
                            f"{o.zombie_duplicated} duplicated")
    finally:
        if proxy is not None:
            proxy.stop()
        broker.kill()

    table = Table(title="records lost and duplicated per guarantee (driver SIGKILL mid-batch + restart, "
                        "dropped acknowledgements, a zombie attempt)")
    for col in ("guarantee", "kills", "dropped acks", "records out", "lost", "duplicated", "wrong totals",
                "zombie lost/dup", "verdict"):
        table.add_column(col, no_wrap=True)
    for o in outcomes:
        verdict = "[green]exact[/green]" if o.ok else "[red]inexact[/red]"
        table.add_row(o.guarantee, str(o.kills), str(o.dropped_acks), str(o.records_out), str(o.lost),
                      str(o.duplicated), str(o.wrong_accounts), f"{o.zombie_lost}/{o.zombie_duplicated}", verdict)
    console.print(table)
    write_html(args.report, outcomes, args)
    console.print(f"report: {args.report.resolve()}   totals in SQLite: {db.resolve()} (table totals)")
    if args.keep:
        console.print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if any(o.exit_code != 0 for o in outcomes):
        return 2
    eo = [o for o in outcomes if o.guarantee == "exactly_once"]
    return 0 if all(o.ok for o in eo) else 1

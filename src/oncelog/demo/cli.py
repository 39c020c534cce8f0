"""`oncelog demo` (= `make demo`): the payments pipeline on PySpark under each guarantee, with faults.

1. Starts our broker in a temporary directory (loopback only).
2. Generates payments per account, written in transactions; some transactions are aborted (their
   records must never count).
3. For each guarantee runs one Spark application in its own process with two streaming queries on
   the payments: the ledger (each payment, oncelog source -> oncelog sink) and the running totals
   per account (a stateful aggregation in update mode, through ``foreachBatch`` into a totals topic
   under the same guarantee and into SQLite, table ``totals_<guarantee>``). It SIGKILLs the driver's
   whole process group mid-batch (transactions open), and once per query in the commit window
   (after every task of a batch committed, before Spark's commit log entry: the replay must skip
   those partitions), restarting it from its checkpoints each time, while a proxy drops
   acknowledgements; then races a zombie task attempt against its retry.
4. Reads the outputs read_committed: payments lost and duplicated in the ledger, what a consumer
   summing the ledger would get per account, repeated updates in the totals topic, and whether the
   newest total per account (topic and SQLite) equals the expected one. Prints a table and writes
   an HTML report.

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
from typing import Any

from oncelog.demo.faults import (
    duplicates_and_losses,
    expected_per_account,
    latest_per_account,
    produce_transactions,
    read_topic,
    repeated_updates,
    run_with_driver_kills,
    zombie_attempt,
)
from oncelog.testing.broker_process import create_topic, oncelog_broker

GUARANTEES = ("exactly_once", "at_least_once", "at_most_once")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=int, default=300, help="committed payments to generate (default 300)")
    p.add_argument("--accounts", type=int, default=8)
    p.add_argument("--kills", type=int, default=1, help="driver SIGKILLs mid-batch per guarantee (default 1)")
    p.add_argument("--commit-window-batch", type=int, default=1,
                   help="also SIGKILL the driver after every task of this batch committed and before Spark's "
                        "commit log entry, once per query (default 1; -1: off)")
    p.add_argument("--guarantees", default=",".join(GUARANTEES))
    p.add_argument("--max-offsets", type=int, default=80, help="maxOffsetsPerTrigger of the job")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--report", type=Path, default=Path("oncelog-demo-report.html"), help="HTML report path")
    p.add_argument("--sqlite", type=Path, default=Path("oncelog-demo-totals.sqlite"),
                   help="SQLite file for the totals per guarantee and account")
    p.add_argument("--database", default="",
                   help="database URL for the totals instead of the SQLite file, e.g. "
                        "postgresql://user@127.0.0.1:5432/db (tables totals_<guarantee> are replaced)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (broker data, logs)")
    p.add_argument("--drop-acks", type=float, default=0.03,
                   help="probability that the proxy between the job and the broker drops a Produce or EndTxn "
                        "response after the broker processed it (a lost acknowledgement; default 0.03, 0 = off)")


HEADINGS = ("guarantee", "driver kills", "replay skipped", "acks dropped", "ledger out", "lost", "dup",
            "ledger sums wrong", "total updates repeated", "totals wrong topic", "totals wrong SQLite",
            "zombie lost/dup", "verdict")


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
    repeated_updates: int = 0
    wrong_totals_topic: int = 0
    wrong_totals_sqlite: int = 0
    zombie_lost: int = 0
    zombie_duplicated: int = 0
    dropped_acks: int = 0
    commit_window_kills: int = 0
    replay_skipped: int = 0

    def cells(self) -> tuple[object, ...]:
        verdict = "exact" if self.ok else ("FAILED RUN" if self.exit_code != 0 else "inexact")
        kills = f"{self.kills}+{self.commit_window_kills}" if self.commit_window_kills else self.kills
        return (self.guarantee, kills, self.replay_skipped, self.dropped_acks, self.records_out, self.lost,
                self.duplicated,
                self.wrong_accounts, self.repeated_updates, self.wrong_totals_topic, self.wrong_totals_sqlite,
                f"{self.zombie_lost}/{self.zombie_duplicated}", verdict)

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.lost == 0 and self.duplicated == 0 and self.unexpected == 0 \
            and self.wrong_accounts == 0 and self.repeated_updates == 0 \
            and self.wrong_totals_topic == 0 and self.wrong_totals_sqlite == 0 \
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


def _sql(url: str, statements: list[str], fetch: bool = False) -> list[tuple[Any, ...]]:
    """Run ``statements`` on a sqlite:/// or postgresql:// database; rows of the last if ``fetch``."""
    rows: list[tuple[Any, ...]] = []
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url[len("sqlite:///"):]) as conn:
            for st in statements:
                cur = conn.execute(st)
            if fetch:
                rows = cur.fetchall()
        return rows
    import psycopg

    with psycopg.connect(url) as pg:
        for st in statements:
            pcur = pg.execute(st)
        if fetch:
            rows = pcur.fetchall()
    return rows


def reset_tables(url: str, guarantees: list[str]) -> None:
    """Each run starts its totals tables empty (query ids are new each run, so old batches would not clash,
    but accounts of an earlier run with other settings would linger)."""
    _sql(url, [f"DROP TABLE IF EXISTS totals_{g}" for g in guarantees]
         + ["DROP TABLE IF EXISTS oncelog_batches", "DROP TABLE IF EXISTS oncelog_sink_batches"])


def db_totals(url: str, table: str) -> dict[str, tuple[int, int]]:
    """(count, total) per account in ``table``; empty if the table was never written (a failed run)."""
    try:
        rows = _sql(url, [f'SELECT account, "count", total FROM {table}'], fetch=True)
    except Exception as exc:  # sqlite3.OperationalError / psycopg.errors.UndefinedTable
        if "no such table" in str(exc) or "does not exist" in str(exc):
            return {}
        raise
    return {a: (int(c), int(t)) for a, c, t in rows}


def wrong(got: dict[str, Any], want: dict[str, Any]) -> int:
    return sum(1 for a in set(got) | set(want) if got.get(a) != want.get(a))


def write_html(path: Path, outcomes: list[Outcome], args: argparse.Namespace) -> None:
    head = (*HEADINGS, "seconds")
    rows = []
    for o in outcomes:
        cells = (*o.cells(), f"{o.seconds:.0f}")
        color = "#d4f7d4" if o.ok else "#f7d4d4"
        rows.append(f"<tr style='background:{color}'>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
                    + "</tr>")
    path.write_text(
        "<!doctype html><meta charset='utf-8'><title>oncelog demo</title>"
        "<style>body{font-family:sans-serif}td,th{padding:4px 10px;border:1px solid #999}"
        "table{border-collapse:collapse}</style>"
        f"<h1>oncelog demo: payments pipeline on PySpark</h1><p>{args.records} committed payments over "
        f"{args.accounts} accounts (plus aborted transactions that must not count); the Spark driver was "
        f"killed with SIGKILL mid-batch {args.kills} time(s) per guarantee, and once per query after every task "
        "of a batch committed and before Spark's commit log entry ('driver kills' shows mid-batch+commit-window; "
        "'replay skipped' counts the partitions the replays found committed and skipped), and restarted from "
        "its checkpoint each time; "
        "a second query kept running totals per account (update mode, foreachBatch) in a topic and in SQLite; "
        "then one task attempt was left stalled before its commit (a zombie) while a retry of the same task ran; "
        f"a proxy dropped {args.drop_acks:.0%} of Produce/EndTxn responses after the broker processed them.</p>"
        "<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>" + "".join(rows) + "</table>")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # a log file or CI: do not squeeze the table to 80 columns
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        console.print("oncelog demo needs PySpark: pip install 'oncelog[spark]'")
        return 2
    guarantees = [g.strip() for g in args.guarantees.split(",") if g.strip()]
    work = Path(tempfile.mkdtemp(prefix="oncelog-demo-"))
    db_url = args.database or f"sqlite:///{args.sqlite.resolve()}"
    db_name = "the database" if args.database else "SQLite"
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
            expected_accounts = expected_per_account(expected_values)
            reset_tables(db_url, guarantees)
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
                totals_topic = f"totals-{g}"
                progress_topic = f"progress-{g}"
                create_topic(bs, out_topic, 2)
                create_topic(bs, totals_topic, 2)
                create_topic(bs, progress_topic, 2)
                status.update(f"{g}: running the Spark job, killing its driver {args.kills} time(s) mid-batch and "
                              "in the commit window")
                cmd = [sys.executable, "-m", "oncelog.demo.job", "--bootstrap", job_bs, "--input", "payments",
                       "--output", out_topic, "--checkpoint", str(work / f"ckpt-{g}"), "--guarantee", g,
                       "--max-offsets", str(args.max_offsets), "--delay-ms", "1000",
                       "--kill-driver-in-commit", str(args.commit_window_batch),
                       "--marker-dir", str(work / f"markers-{g}"), "--commit-report", str(work / f"commits-{g}.jsonl"),
                       "--progress-topic", progress_topic, "--totals-output", totals_topic,
                       "--database", db_url, "--table", f"totals_{g}"]
                # at_most_once records progress before writing (acks=0): its progress topic shows a batch start.
                watch = [progress_topic] if g == "at_most_once" else [out_topic, totals_topic]
                def on_event(msg: str, g: str = g) -> None:
                    console.log(f"{g}: {msg}")

                report = run_with_driver_kills(cmd, bs, watch, kills=args.kills, seed=args.seed,
                                               log_path=work / f"job-{g}.log", timeout_s=600,
                                               on_event=on_event)
                got = [v or b"" for _k, v in read_topic(bs, out_topic)]
                lost, dup, unexpected = duplicates_and_losses(expected_values, got)
                ledger_sums = totals_of([v for v in got if not v.startswith(b"aborted-")])
                updates = [json.loads(v or b"{}") for _k, v in read_topic(bs, totals_topic)]
                reports = [work / f"commits-{g}.jsonl", work / f"commits-{g}.jsonl-totals"]
                skipped = sum(len(json.loads(line)["skipped"]) for r in reports if r.exists()
                              for line in r.read_text().splitlines())
                o = Outcome(g, report.kills, report.exit_code, len(got), lost, dup, unexpected,
                            wrong(ledger_sums, expected_totals), report.seconds,
                            repeated_updates=repeated_updates(updates),
                            wrong_totals_topic=wrong(latest_per_account(updates), expected_accounts),
                            wrong_totals_sqlite=wrong(db_totals(db_url, f"totals_{g}"), expected_accounts),
                            commit_window_kills=report.self_kills, replay_skipped=skipped)
                if proxy is not None:
                    o.dropped_acks = proxy.stats.dropped_responses - dropped_before
                    dropped_before = proxy.stats.dropped_responses
                    proxy.clear()
                status.update(f"{g}: a zombie task attempt racing its retry")
                o.zombie_lost, o.zombie_duplicated = zombie_attempt(bs, g, f"zombie-{g}", progress_topic)
                outcomes.append(o)
                console.log(f"{g}: done in {o.seconds:.0f}s: ledger {o.records_out} out, {lost} lost, "
                            f"{dup} duplicated, {o.wrong_accounts} accounts' sums wrong; totals: "
                            f"{o.repeated_updates} repeated updates, {o.wrong_totals_topic} wrong in the topic, "
                            f"{o.wrong_totals_sqlite} wrong in {db_name}; zombie attempt: {o.zombie_lost} lost, "
                            f"{o.zombie_duplicated} duplicated")
    finally:
        if proxy is not None:
            proxy.stop()
        broker.kill()

    table = Table(title="records lost and duplicated per guarantee (driver SIGKILL mid-batch + restart, "
                        "dropped acknowledgements, a zombie attempt)")
    for col in HEADINGS:
        table.add_column(col, no_wrap=col == "guarantee")
    for o in outcomes:
        verdict = "[green]exact[/green]" if o.ok else "[red]inexact[/red]"
        table.add_row(*map(str, o.cells()[:-1]), verdict)
    console.print(table)
    write_html(args.report, outcomes, args)
    where = args.database.split("@")[-1] if args.database else str(args.sqlite.resolve())
    console.print(f"report: {args.report.resolve()}   totals in {db_name}: {where} (tables totals_<guarantee>)")
    if args.keep:
        console.print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if any(o.exit_code != 0 for o in outcomes):
        return 2
    eo = [o for o in outcomes if o.guarantee == "exactly_once"]
    return 0 if all(o.ok for o in eo) else 1

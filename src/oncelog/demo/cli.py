"""`oncelog demo` (= `make demo`): the payments pipeline on PySpark under each guarantee, with faults.

1. Starts our broker in a temporary directory (loopback only).
2. Generates payments per account (default 100 000 over 1 000 accounts), written in transactions;
   some transactions are aborted (their records must never count).
3. For each guarantee runs one Spark application in its own process with two streaming queries on
   the payments: the ledger (each payment, oncelog source -> oncelog sink) and the running totals
   per account (a stateful aggregation in update mode, through ``foreachBatch`` into a totals topic
   under the same guarantee and into SQLite, table ``totals_<guarantee>``). It SIGKILLs the driver's
   whole process group mid-batch (transactions open), and once per query in the commit window
   (after every task of a batch committed, before Spark's commit log entry: the replay must skip
   those partitions), restarting it from its checkpoints each time, while a proxy drops
   acknowledgements; then races a zombie task attempt against its retry. After each kill it reads
   the checkpoints, to tell which window the kill hit (:mod:`oncelog.demo.windows`); a consumer
   counts the ledger's visible records while the job runs (:mod:`oncelog.demo.timeline`).
4. Reads the outputs read_committed: payments lost and duplicated in the ledger, what a consumer
   summing the ledger would get per account, repeated updates in the totals topic, and whether the
   newest total per account (topic and SQLite) equals the expected one. Prints a table and writes
   an HTML report with charts (:mod:`oncelog.demo.report`).

Progress bars (``rich``) show each phase while it runs (:mod:`oncelog.demo.progress`).
Exits 1 if exactly_once shows any loss or duplicate (or wrong total), 2 if a run failed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from oncelog.cli_args import at_least, count, one_of, positive, probability
from oncelog.demo.faults import (
    KillEvent,
    duplicates_and_losses,
    expected_per_account,
    latest_per_account,
    produce_transactions,
    read_topic,
    repeated_updates,
    run_with_driver_kills,
    zombie_attempt,
)
from oncelog.demo.outcome import HEADINGS, Outcome
from oncelog.demo.report import SETUP_ROW, max_offsets, write_report
from oncelog.demo.timeline import COMMIT_WINDOW_KILL, DRIVER_KILL, RUNNING, ZOMBIE, Timeline
from oncelog.demo.windows import KillRecord, QueryState, checkpoint_state, classify, in_flight, replay_after
from oncelog.testing.broker_process import create_topic, oncelog_broker

__all__ = ["HEADINGS", "Outcome", "add_arguments", "run"]

GUARANTEES = ("exactly_once", "at_least_once", "at_most_once")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--records", type=positive(int), default=100_000,
                   help="committed payments to generate (default 100000)")
    p.add_argument("--accounts", type=positive(int), default=1000,
                   help="accounts the payments go to (default 1000)")
    p.add_argument("--kills", type=count, default=1, help="driver SIGKILLs mid-batch per guarantee (default 1)")
    p.add_argument("--commit-window-batch", type=at_least(-1), default=1,
                   help="also SIGKILL the driver after every task of this batch committed and before Spark's "
                        "commit log entry, once per query (default 1; -1: off)")
    p.add_argument("--guarantees", type=one_of(GUARANTEES), default=list(GUARANTEES),
                   help=f"comma-separated, from {','.join(GUARANTEES)} (default: all three)")
    p.add_argument("--max-offsets", type=count, default=0,
                   help="maxOffsetsPerTrigger of the job (default: a third of --records, at least 50: three batches)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--report", type=Path, default=Path("oncelog-demo-report.html"), help="HTML report path")
    p.add_argument("--sqlite", type=Path, default=Path("oncelog-demo-totals.sqlite"),
                   help="SQLite file for the totals per guarantee and account")
    p.add_argument("--database", default="",
                   help="database URL for the totals instead of the SQLite file, e.g. "
                        "postgresql://user@127.0.0.1:5432/db (tables totals_<guarantee> are replaced)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (broker data, logs)")
    p.add_argument("--drop-acks", type=probability, default=0.03,
                   help="probability that the proxy between the job and the broker drops a Produce or EndTxn "
                        "response after the broker processed it (a lost acknowledgement; default 0.03, 0 = off)")


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


def write_html(path: Path, outcomes: list[Outcome], args: argparse.Namespace, timeline: Timeline | None = None,
               wall_s: float | None = None) -> None:
    """The HTML report (:mod:`oncelog.demo.report`)."""
    write_report(path, outcomes, timeline or Timeline(), args, wall_s)


def kill_records(g: str, kills: list[tuple[float, KillEvent, str, dict[str, QueryState]]],
                 reports: dict[str, Path]) -> list[KillRecord]:
    """Each kill's window (for the query it aimed at, and the other) and the partitions the replays
    skipped, once the run is over and the replays are in the commit reports."""
    out = []
    for at, ev, target, states in kills:
        replays = {q: replay_after(reports[q], st) for q, st in states.items()}
        other = next((q for q in states if q != target), "")
        out.append(KillRecord(g, at, not ev.by_us, target, states[target].planned,
                              classify(states[target], replays[target], g),
                              f"{other}: {classify(states[other], replays[other], g)}" if other else "",
                              sum(r.skipped for r in replays.values() if r is not None)))
    return out


def run(args: argparse.Namespace) -> int:
    from rich.table import Table

    from oncelog.console import output_console
    from oncelog.demo.progress import DemoProgress, RichProgress

    console = output_console()
    import importlib.util

    if importlib.util.find_spec("pyspark") is None:
        console.print("oncelog demo needs PySpark: pip install 'oncelog[spark]'")
        return 2
    started = time.monotonic()
    guarantees: list[str] = args.guarantees
    work = Path(tempfile.mkdtemp(prefix="oncelog-demo-"))
    db_url = args.database or f"sqlite:///{args.sqlite.resolve()}"
    db_name = "the database" if args.database else "SQLite"
    broker = oncelog_broker(work / "broker", "--auto-create-topics", log_path=work / "broker.log")
    outcomes: list[Outcome] = []
    proxy = None
    tl = Timeline(t0=started)
    progress = DemoProgress(args.records, guarantees)
    try:
        with RichProgress(progress, console):
            broker.start()
            bs = broker.bootstrap
            console.log(f"broker on {bs}, data in {work / 'broker'}")
            create_topic(bs, "payments", 2)
            generating = tl.now()
            events = payments(args.records, args.accounts, args.seed)
            # Transactions of at least 25 payments, at most about 250 of them (each commit is a round trip).
            produce_transactions(bs, "payments", events, per_txn=max(25, args.records // 200), abort_every=4,
                                 partitions=2, on_commit=progress.generated)
            tl.span(SETUP_ROW, "generating payments", generating)
            expected_values = [v for _k, v in events]
            expected_totals = totals_of(expected_values)
            expected_accounts = expected_per_account(expected_values)
            reset_tables(db_url, guarantees)
            console.log(f"{len(events):,} committed payments over {args.accounts:,} accounts "
                        f"(maxOffsetsPerTrigger {max_offsets(args):,})")
            job_bs = bs
            dropped_before = 0
            if args.drop_acks > 0:
                from oncelog.verify.proxy import FaultProxy

                proxy = FaultProxy(broker.host, broker.port, seed=args.seed).start()
                job_bs = proxy.address
                console.log(f"the Spark jobs talk to the broker through a proxy on {job_bs} that drops "
                            f"{args.drop_acks:.0%} of Produce/EndTxn responses after the broker processed them")
            for g in guarantees:
                outcomes.append(run_guarantee(g, args, work, bs, job_bs, proxy, tl, progress, console,
                                              expected_values, expected_totals, expected_accounts, db_url, db_name))
                if proxy is not None:
                    outcomes[-1].dropped_acks = proxy.stats.dropped_responses - dropped_before
                    dropped_before = proxy.stats.dropped_responses
    finally:
        if proxy is not None:
            proxy.stop()
        from oncelog.spark import clients

        clients.clear_all()  # the zombie attempts' pooled clients, before their broker goes (not at exit)
        broker.kill()

    table = Table(title="records lost and duplicated per guarantee (driver SIGKILL mid-batch and in the commit "
                        "window + restart, dropped acknowledgements, a zombie attempt)")
    for col in HEADINGS:
        table.add_column(col, no_wrap=col in ("guarantee", "kill windows"))
    for o in outcomes:
        verdict = "[green]exact[/green]" if o.ok else "[red]inexact[/red]"
        table.add_row(*map(str, o.cells()[:-1]), verdict)
    console.print(table)
    for o in outcomes:
        for k in o.kill_records:
            how = "commit-window fault point" if k.commit_window else "mid-batch"
            console.print(f"  {o.guarantee}: kill at {k.at:.0f}s ({how}) hit the {k.query} query's batch "
                          f"{'-' if k.batch is None else k.batch} with its [bold]{k.window}[/bold] "
                          f"({k.other_window}); the replays skipped {k.skipped} partition(s)", highlight=False)
    wall = time.monotonic() - started
    write_html(args.report, outcomes, args, tl, wall)
    where = args.database.split("@")[-1] if args.database else str(args.sqlite.resolve())
    console.print(f"report: {args.report.resolve()}   totals in {db_name}: {where} (tables totals_<guarantee>)")
    console.print(f"the demo took {wall:.0f} s")
    if args.keep:
        console.print(f"work directory kept: {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)
    if any(o.exit_code != 0 for o in outcomes):
        return 2
    eo = [o for o in outcomes if o.guarantee == "exactly_once"]
    return 0 if all(o.ok for o in eo) else 1


def run_guarantee(g: str, args: argparse.Namespace, work: Path, bs: str, job_bs: str, proxy: Any, tl: Timeline,
                  progress: Any, console: Any, expected_values: list[bytes], expected_totals: dict[str, int],
                  expected_accounts: dict[str, tuple[int, int]], db_url: str, db_name: str) -> Outcome:
    """One guarantee: the Spark application under kills (watched and classified), its outputs read and
    checked, then the zombie attempt."""
    from oncelog.demo.timeline import OutputSampler

    if proxy is not None:
        from oncelog.verify.proxy import API_END_TXN, API_PRODUCE

        proxy.clear()
        proxy.drop_responses(API_PRODUCE, 10**6, probability=args.drop_acks)
        proxy.drop_responses(API_END_TXN, 10**6, probability=args.drop_acks)
    out_topic, totals_topic, progress_topic = f"ledger-{g}", f"totals-{g}", f"progress-{g}"
    for t in (out_topic, totals_topic, progress_topic):
        create_topic(bs, t, 2)
    checkpoints = {"ledger": work / f"ckpt-{g}", "totals": work / f"ckpt-{g}-totals"}
    reports = {"ledger": work / f"commits-{g}.jsonl", "totals": work / f"commits-{g}.jsonl-totals"}
    markers = work / f"markers-{g}"
    cmd = [sys.executable, "-m", "oncelog.demo.job", "--bootstrap", job_bs, "--input", "payments",
           "--output", out_topic, "--checkpoint", str(checkpoints["ledger"]), "--guarantee", g,
           "--max-offsets", str(max_offsets(args)), "--delay-ms", "1000",
           "--kill-driver-in-commit", str(args.commit_window_batch),
           "--marker-dir", str(markers), "--commit-report", str(reports["ledger"]),
           "--progress-topic", progress_topic, "--totals-output", totals_topic,
           "--database", db_url, "--table", f"totals_{g}"]
    # at_most_once records progress before writing (acks=0): its progress topic shows a batch start.
    watch = [progress_topic] if g == "at_most_once" else [out_topic, totals_topic]
    query_of_topic = {out_topic: "ledger", totals_topic: "totals"}
    kills: list[tuple[float, KillEvent, str, dict[str, QueryState]]] = []
    seen_markers: set[str] = set()
    report_lines = dict.fromkeys(checkpoints, 0)  # each commit report's length when the job last started

    def on_kill(ev: KillEvent) -> None:
        states = {q: checkpoint_state(checkpoints[q], reports[q], report_lines[q]) for q in checkpoints}
        report_lines.update({q: st.report_lines for q, st in states.items()})
        new = {p.name for p in markers.iterdir()} - seen_markers if markers.is_dir() else set()
        seen_markers.update(new)
        if ev.by_us:
            target = query_of_topic.get(ev.topic) or next((q for q in states if in_flight(states[q])), "ledger")
        else:  # the fault point that fired left its marker: driver-commit-B (ledger) or driver-foreach-B
            target = "totals" if any(n.startswith("driver-foreach") for n in new) else "ledger"
        at = tl.since(ev.at)
        kills.append((at, ev, target, states))
        tl.event(g, DRIVER_KILL if ev.by_us else COMMIT_WINDOW_KILL, at, target)
        progress.killed(g, not ev.by_us)

    def on_event(msg: str) -> None:
        console.log(f"{g}: {msg}")
        if msg.startswith("driver restarting"):
            progress.restarted(g)

    sampler = OutputSampler(bs, out_topic, tl, g, on_count=lambda n: progress.output(g, n),
                            dropped=(lambda: proxy.stats.dropped_responses) if proxy is not None else None).start()
    try:
        report = run_with_driver_kills(cmd, bs, watch, kills=args.kills, seed=args.seed,
                                       log_path=work / f"job-{g}.log", timeout_s=900, on_event=on_event,
                                       on_kill=on_kill)
    finally:
        sampler.stop()
    run_end = report.starts[0] + report.seconds if report.starts else time.monotonic()
    for i, start in enumerate(report.starts):
        end = report.events[i].at if i < len(report.events) else run_end
        tl.span(g, RUNNING, tl.since(start), tl.since(end))
    if proxy is not None:
        proxy.clear()
    progress.run_finished(g)
    checking = tl.now()
    got = [v or b"" for _k, v in read_topic(bs, out_topic)]
    tl.samples.setdefault(g, []).append((tl.now(), len(got)))
    updates = [json.loads(v or b"{}") for _k, v in read_topic(bs, totals_topic)]
    sql_totals = db_totals(db_url, f"totals_{g}")
    progress.read(g)
    lost, dup, unexpected = duplicates_and_losses(expected_values, got)
    ledger_sums = totals_of([v for v in got if not v.startswith(b"aborted-")])
    skipped = sum(len(json.loads(line)["skipped"]) for r in reports.values() if r.exists()
                  for line in r.read_text().splitlines())
    o = Outcome(g, report.kills, report.exit_code, len(got), lost, dup, unexpected,
                wrong(ledger_sums, expected_totals), report.seconds,
                repeated_updates=repeated_updates(updates),
                wrong_totals_topic=wrong(latest_per_account(updates), expected_accounts),
                wrong_totals_sqlite=wrong(sql_totals, expected_accounts),
                commit_window_kills=report.self_kills, replay_skipped=skipped,
                kill_records=kill_records(g, kills, reports))
    progress.verified(g)
    tl.span(SETUP_ROW, "reading and verifying", checking)
    zombie_start = tl.now()
    o.zombie_lost, o.zombie_duplicated = zombie_attempt(bs, g, f"zombie-{g}", progress_topic)
    tl.span(g, ZOMBIE, zombie_start)
    tl.event(g, ZOMBIE, zombie_start)
    console.log(f"{g}: done in {o.seconds:.0f}s: ledger {o.records_out:,} out, {lost} lost, "
                f"{dup} duplicated, {o.wrong_accounts} accounts' sums wrong; totals: "
                f"{o.repeated_updates} repeated updates, {o.wrong_totals_topic} wrong in the topic, "
                f"{o.wrong_totals_sqlite} wrong in {db_name}; zombie attempt: {o.zombie_lost} lost, "
                f"{o.zombie_duplicated} duplicated; kill windows: {o.windows_text()}")
    return o

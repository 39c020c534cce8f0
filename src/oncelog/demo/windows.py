"""Which window a driver kill hit, told from what the kill left behind.

A micro-batch of a query goes through three windows, and a SIGKILL of the driver in each one asks
something different of the sink:

1. **open** — Spark planned batch ``B`` (its ``offsets/B`` file exists) and the tasks are writing;
   nothing of the batch is committed by the sink (exactly_once: its transactions are open). The
   replay writes every partition again (exactly_once: the open transactions are fenced and aborted).
2. **committed, before commit log** — every task of ``B`` committed in the sink (the driver's
   ``commit`` ran: the batch's line is in the commit report), but Spark had not written
   ``commits/B``. Spark replays ``B``; an exactly-once sink must find every partition committed and
   skip it. at_least_once keeps no progress and writes it all again (duplicates); at_most_once
   records a partition's progress *before* writing it, so for it "committed" means "marked done".
3. **after commit log** — ``commits/B`` is written: the kill fell between batches; nothing is replayed.

A kill where only some partitions of ``B`` had committed (the replay skipped some, wrote the
others) is **partly committed**.

The state is read right after the kill (the job's process group is dead, nothing moves): the
checkpoint's ``offsets`` and ``commits`` logs and the commit report (``fault.commitReport``: one
JSON line per batch the driver committed, with the partitions written and skipped). The replay is
read afterwards from the same report.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

TXN_OPEN = "transaction open"
BATCH_OPEN = "batch open"  # the same window for the sinks without transactions
PARTLY = "partly committed"
COMMITTED = "committed, before commit log"
AFTER = "after commit log"
NO_BATCH = "before the first batch"

#: every window, in the order a batch goes through them (the report's order and colours)
WINDOWS = (NO_BATCH, TXN_OPEN, BATCH_OPEN, PARTLY, COMMITTED, AFTER)
#: short names for the terminal table
SHORT = {NO_BATCH: "no batch", TXN_OPEN: "open", BATCH_OPEN: "open", PARTLY: "partly",
         COMMITTED: "committed<log", AFTER: "after log"}


@dataclass(frozen=True)
class QueryState:
    """One query's checkpoint when the driver died: the newest batch Spark planned (``offsets/``),
    the newest in its commit log (``commits/``), how many lines its commit report had, and whether
    the driver had committed the planned batch in the sink (its line in the report, written since
    the job's last start)."""

    planned: int | None
    committed: int | None
    report_lines: int = 0
    driver_committed: bool = False


@dataclass(frozen=True)
class Replay:
    """What the driver committed for a batch: partitions written and partitions found committed."""

    batch: int
    written: int
    skipped: int


def batch_ids(log_dir: Path) -> list[int]:
    """Batch ids of a Spark metadata log directory (``offsets`` or ``commits``): files named by number."""
    if not log_dir.is_dir():
        return []
    return sorted(int(p.name) for p in log_dir.iterdir() if p.name.isdigit())


def checkpoint_state(checkpoint: Path, commit_report: Path, since_line: int = 0) -> QueryState:
    """The state of one query; ``since_line``: the report's length when this attempt of the job
    started (lines before it are earlier attempts')."""
    planned = batch_ids(checkpoint / "offsets")
    committed = batch_ids(checkpoint / "commits")
    lines = commit_report.read_text().splitlines() if commit_report.exists() else []
    newest = planned[-1] if planned else None
    driver_committed = newest is not None and any(json.loads(line)["batch"] == newest
                                                  for line in lines[since_line:])
    return QueryState(newest, committed[-1] if committed else None, len(lines), driver_committed)


def replay_after(commit_report: Path, state: QueryState) -> Replay | None:
    """The first commit of the batch that was planned at the kill, among the lines written after it."""
    if state.planned is None or not commit_report.exists():
        return None
    for line in commit_report.read_text().splitlines()[state.report_lines:]:
        d = json.loads(line)
        if d["batch"] == state.planned:
            return Replay(d["batch"], len(d["written"]), len(d["skipped"]))
    return None


def classify(state: QueryState, replay: Replay | None, guarantee: str) -> str:
    """The window a kill hit for one query (see the module doc). Without a replay (the run failed
    before replaying the batch) a planned, uncommitted batch counts as open."""
    if state.planned is None:
        return NO_BATCH
    if state.committed is not None and state.committed >= state.planned:
        return AFTER
    if state.driver_committed:
        return COMMITTED
    if replay is not None and replay.skipped:
        return COMMITTED if replay.written == 0 else PARTLY
    return TXN_OPEN if guarantee == "exactly_once" else BATCH_OPEN


def in_flight(state: QueryState) -> bool:
    """A batch was planned and not in the commit log: the kill hit that query mid-batch."""
    return state.planned is not None and (state.committed is None or state.committed < state.planned)


@dataclass
class KillRecord:
    """One driver kill as the demo reports it: when (seconds since the run started), whether the
    harness dealt it mid-batch or the job's commit-window fault point did, the query it aimed at and
    that query's batch and window, the other query's window, and the partitions the replays of both
    queries found committed and skipped."""

    guarantee: str
    at: float
    commit_window: bool
    query: str
    batch: int | None
    window: str
    other_window: str = ""
    skipped: int = 0

"""The demo's kill-window classification and progress accounting (pure: no broker, no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

from oncelog.demo.outcome import Outcome
from oncelog.demo.progress import DemoProgress
from oncelog.demo.windows import (
    AFTER,
    BATCH_OPEN,
    COMMITTED,
    NO_BATCH,
    PARTLY,
    TXN_OPEN,
    KillRecord,
    QueryState,
    Replay,
    checkpoint_state,
    classify,
    in_flight,
    replay_after,
)


def test_each_window_is_told_apart() -> None:
    open_batch = QueryState(planned=2, committed=1)
    assert classify(open_batch, Replay(2, written=2, skipped=0), "exactly_once") == TXN_OPEN
    assert classify(open_batch, Replay(2, written=2, skipped=0), "at_least_once") == BATCH_OPEN
    assert classify(open_batch, None, "exactly_once") == TXN_OPEN, "no replay seen: still open"
    assert classify(open_batch, Replay(2, written=1, skipped=1), "exactly_once") == PARTLY
    assert classify(open_batch, Replay(2, written=0, skipped=2), "exactly_once") == COMMITTED
    assert classify(QueryState(planned=0, committed=None), Replay(0, 0, 2), "at_most_once") == COMMITTED
    assert classify(QueryState(planned=2, committed=2), None, "exactly_once") == AFTER
    assert classify(QueryState(planned=None, committed=None), None, "exactly_once") == NO_BATCH
    # The driver's commit of the batch ran (its report line), the commit log entry did not: the
    # commit window, whatever the replay did (at_least_once skips nothing and writes it all again).
    committed = QueryState(planned=2, committed=1, driver_committed=True)
    assert classify(committed, Replay(2, written=2, skipped=0), "at_least_once") == COMMITTED
    assert in_flight(open_batch) and in_flight(QueryState(0, None))
    assert not in_flight(QueryState(2, 2)) and not in_flight(QueryState(None, None))


def test_state_and_replay_are_read_from_the_checkpoint_and_the_commit_report(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    for log, ids in (("offsets", [0, 1, 2]), ("commits", [0, 1])):
        (ckpt / log).mkdir(parents=True)
        for i in ids:
            (ckpt / log / str(i)).write_text("v1")
            (ckpt / log / f".{i}.crc").write_text("")  # Spark's checksum files are not batches
    report = tmp_path / "commits.jsonl"
    lines = [{"batch": 0, "rows": 5, "written": [0, 1], "skipped": []},
             {"batch": 1, "rows": 5, "written": [0, 1], "skipped": []}]
    report.write_text("".join(json.dumps(d) + "\n" for d in lines))
    state = checkpoint_state(ckpt, report)
    assert state == QueryState(planned=2, committed=1, report_lines=2)
    # batch 2 was committed by the sink before the kill (its line is before the kill): not the replay
    with report.open("a") as f:
        f.write(json.dumps({"batch": 3, "rows": 1, "written": [0], "skipped": []}) + "\n")
        f.write(json.dumps({"batch": 2, "rows": 0, "written": [], "skipped": [0, 1]}) + "\n")
    assert replay_after(report, state) == Replay(2, written=0, skipped=2)
    assert classify(state, replay_after(report, state), "exactly_once") == COMMITTED
    assert checkpoint_state(tmp_path / "none", tmp_path / "none.jsonl") == QueryState(None, None, 0)
    # Killed again after the driver committed batch 2 of the replay: that line counts only if this
    # attempt wrote it (it is after ``since_line``, the report's length when the attempt started).
    assert checkpoint_state(ckpt, report, since_line=2).driver_committed
    assert not checkpoint_state(ckpt, report, since_line=4).driver_committed
    assert replay_after(tmp_path / "none.jsonl", state) is None


def test_outcome_counts_kill_windows_for_the_table() -> None:
    o = Outcome("exactly_once", 1, 0, 10, 0, 0, 0, 0, 1.0, commit_window_kills=2, replay_skipped=4,
                kill_records=[KillRecord("exactly_once", 3.0, False, "ledger", 0, TXN_OPEN),
                              KillRecord("exactly_once", 9.0, True, "ledger", 1, COMMITTED, skipped=2),
                              KillRecord("exactly_once", 12.0, True, "totals", 1, COMMITTED, skipped=2)])
    assert o.windows_text() == "open 1, committed<log 2"
    assert o.cells()[1:4] == ("1+2", "open 1, committed<log 2", 4)
    assert Outcome("at_most_once", 0, 0, 0, 0, 0, 0, 0, 0.0).windows_text() == "-"


def test_progress_counts_each_phase_and_caps_runs_at_the_input() -> None:
    p = DemoProgress(1000, ["exactly_once", "at_least_once"])
    seen: list[tuple[str, int]] = []
    p.listen(lambda phase: seen.append((phase.key, phase.completed)))
    assert p.fraction() == 0.0
    p.generated(400)
    p.generated(700)
    assert p.phases["generate"].completed == 1000 and p.phases["generate"].done
    p.output("exactly_once", 600)
    p.killed("exactly_once", commit_window=False)
    p.killed("exactly_once", commit_window=True)
    p.restarted("exactly_once")
    p.restarted("exactly_once")
    eo = p.phases["exactly_once"]
    assert eo.completed == 600 and not eo.done
    assert eo.detail == "600 out, 2 kills (1 in the commit window), 2 restarts"
    p.output("exactly_once", 1000)
    p.run_finished("exactly_once")
    p.output("at_least_once", 1250)  # duplicates: the bar stops at the input, the detail tells
    alo = p.phases["at_least_once"]
    assert alo.completed == 1000 and alo.detail.startswith("1,250 out")
    p.run_finished("at_least_once")
    for g in ("exactly_once", "at_least_once"):
        p.read(g)
        p.verified(g)
    assert all(ph.done for ph in p.phases.values()) and p.fraction() == 1.0
    assert p.phases["verify"].detail == "verified at_least_once"
    assert ("generate", 400) in seen and ("exactly_once", 600) in seen


def test_a_run_cut_short_is_not_complete() -> None:
    p = DemoProgress(100, ["at_most_once"])
    p.generated(100)
    p.output("at_most_once", 80)  # at_most_once lost 20; the bar is only full once the job exited
    assert p.phases["at_most_once"].completed == 80
    assert 0.0 < p.fraction() < 1.0
    p.run_finished("at_most_once")
    assert p.phases["at_most_once"].completed == 100 and p.phases["at_most_once"].detail.startswith("80 out")

"""Whether the faults met the roles: per client, what it did inside the fault window, and an
inconclusive result when the producers, the copiers or the readers all did nothing under faults
(probe s36: broker kills every 2-3 s never let the copier group form; the copier ran only in the
drain and the run passed). Hand-made histories, no broker."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from oncelog.verify.checker import check, fault_window
from oncelog.verify.history import Fault, History, Poll, Send, Txn

G = "grp"


def run(copier_at: int, *, stopped: int | None = 10_000, faults: bool = True) -> History:
    """p0 commits at t=1-9 s, c0 reads all along; x0 copies what was committed in one transaction at
    ``copier_at`` and the rest in the drain (t=30 s); broker kills from t=2 s until faults stop at
    ``stopped``."""
    h = History(meta={"faults": ["broker-kill"], "roles": ["p0", "x0", "c0"], "drained": True})
    if stopped is not None:
        h.meta["faults_stopped_ms"] = stopped
    for n in range(1, 10):
        h.sends.append(Send("p0", n, f"p0-{n}-0", 0, 2 * n - 2, True, n * 1000))
        h.txns.append(Txn("p0", n, "committed", n * 1000 + 5, n * 1000 + 9, [f"p0-{n}-0"]))
    h.polls = [Poll("c0", n * 1000 + 50, [(0, 2 * n - 2, f"p0-{n}-0")]) for n in range(1, 10)]
    final = [(0, 2 * n - 2, f"p0-{n}-0") for n in range(1, 10)]
    offset, first = 18, 1
    for txn, at in enumerate(sorted({copier_at, 30_000}), 1):
        read = [(0, 2 * n - 2, f"p0-{n}-0") for n in range(first, 10) if n * 1000 + 9 < at - 20]
        if not read:
            continue
        copies = [f"c:{v}@x0.{txn}" for _p, _o, v in read]
        h.polls.append(Poll(f"x0.{txn}", at - 20, read, txn_process="x0", txn=txn))
        for (_p, _o, v), c in zip(read, copies, strict=True):
            h.sends.append(Send("x0", txn, c, 0, offset, True, at - 10, source=v))
            final.append((0, offset, c))
            offset += 1
        offset += 1  # the commit marker
        h.txns.append(Txn("x0", txn, "committed", at - 5, at, copies, group=G, offsets={0: read[-1][1] + 2}))
        first += len(read)
    h.polls.append(Poll("final", 40_000, sorted(final), final=True))
    if faults:
        h.faults = [Fault("broker-kill", t, t + 1200, "SIGKILL + restart") for t in (2_000, 5_000, 8_000)]
    return h


def test_copier_active_under_faults_is_conclusive() -> None:
    report = check(run(copier_at=6_500))
    assert report.ok and not report.inconclusive
    assert report.window == (2_000, 10_000)
    x0 = next(a for a in report.activity if a.role == "x0")
    assert (x0.kind, x0.committed, x0.reads, x0.active) == ("copier", 1, 6, True)
    p0 = next(a for a in report.activity if a.role == "p0")
    assert (p0.committed, p0.aborted, p0.unknown) == (8, 0, 0)  # t=2..9 s


def test_copier_that_ran_only_in_the_drain_is_inconclusive() -> None:
    report = check(run(copier_at=25_000))
    assert report.ok  # no anomaly of the broker ...
    assert report.inconclusive == ["copiers (x0) committed no transaction while faults were active "
                                   "(t=2.0-10.0 s): the exactly-once copy (consume-transform-produce) "
                                   "was not tested under faults"]
    assert not next(a for a in report.activity if a.role == "x0").active


def test_an_aborted_or_unknown_copier_transaction_is_not_activity() -> None:
    for outcome in ("aborted", "unknown"):
        h = run(copier_at=6_500)
        h.txns[-2].outcome = outcome  # the copier's transaction under faults, whose copies nobody read
        h.polls[-1].records = [r for r in h.polls[-1].records if not r[2].endswith("@x0.1")]
        report = check(h)
        assert any(w.startswith("copiers (x0)") for w in report.inconclusive), (outcome, report.inconclusive)


def test_the_window_ends_when_faults_stopped_or_at_the_last_fault() -> None:
    assert fault_window(run(6_500)) == (2_000, 10_000)
    assert fault_window(run(6_500, stopped=None)) == (2_000, 9_200)  # a history without the meta
    assert fault_window(run(6_500, faults=False)) is None
    # a client's zombie carried out in the drain does not stretch the window
    h = run(6_500)
    h.faults.append(Fault("zombie", 30_000, 30_100, "x0 txn 7"))
    assert fault_window(h) == (2_000, 10_000)


def test_faults_asked_for_and_none_made_is_inconclusive() -> None:
    report = check(run(6_500, faults=False))
    assert report.inconclusive == ["faults were asked for (broker-kill) but none was made"]
    h = run(6_500, faults=False)
    h.meta["faults"] = []
    assert not check(h).inconclusive and check(h).window is None


def test_readers_and_non_transactional_producers() -> None:
    h = run(6_500)
    h.polls = [p for p in h.polls if not p.process.startswith("c0")]
    assert any(w.startswith("readers (c0) read nothing") for w in check(h).inconclusive)
    # --no-txn: acknowledged writes are the producers' activity
    h = History(meta={"faults": ["drop"], "roles": ["p0", "c0"]}, faults=[Fault("drop", 100, 600)])
    h.sends = [Send("p0", -1, "p0-0", 0, 0, True, 300)]
    h.polls = [Poll("c0", 400, [(0, 0, "p0-0")]), Poll("final", 900, [(0, 0, "p0-0")], final=True)]
    report = check(h)
    assert not report.inconclusive and report.activity[0].acked == 1
    h.sends[0].time_ms = 50  # before the first fault
    assert any(w.startswith("producers (p0) completed no write") for w in check(h).inconclusive)


def test_roles_are_inferred_without_the_meta() -> None:
    h = run(25_000)
    del h.meta["roles"]
    assert [a.role for a in check(h).activity] == ["c0", "p0", "x0"]
    assert check(h).inconclusive


def test_check_exits_3_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    run(copier_at=25_000).dump(path)
    r = subprocess.run([sys.executable, "-m", "oncelog", "verify", "--check", str(path), "--report",
                        str(tmp_path / "r.html")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "x0 (idle)" in r.stdout and "INCONCLUSIVE: copiers (x0) committed no transaction" in r.stdout
    assert r.stderr.strip().startswith("inconclusive: no anomaly found, but copiers (x0)")
    page = (tmp_path / "r.html").read_text()
    assert "Verdict: INCONCLUSIVE" in page and "x0 (idle)" in page and "Activity while faults were active" in page
    run(copier_at=6_500).dump(path)
    ok = subprocess.run([sys.executable, "-m", "oncelog", "verify", "--check", str(path)], capture_output=True,
                        text=True, timeout=120)
    assert ok.returncode == 0 and "activity while faults were active (t=2.0-10.0 s)" in ok.stdout, ok.stdout

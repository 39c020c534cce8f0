"""`oncelog verify` exit codes: 0 clean, 1 anomalies, 2 could not run. Every way of not running ends
with exit 2 and one line on stderr, never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.verify.history import History, Poll, Send, Txn


def verify(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", "verify", *args], capture_output=True, text=True,
                          timeout=timeout)


def assert_cannot_run(r: subprocess.CompletedProcess[str], *words: str) -> None:
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2, (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.mark.parametrize(("bootstrap", "why"), [
    ("127.0.0.1", "expected HOST:PORT"),
    ("127.0.0.1:abc", "is not a number"),
    ("127.0.0.1:0", "between 1 and 65535"),
    ("127.0.0.1:70000", "between 1 and 65535"),
    (":9092", "expected HOST:PORT"),
    ("a:1,b:2", "give one HOST:PORT"),
])
def test_bad_bootstrap_exits_2_with_one_line(bootstrap: str, why: str) -> None:
    assert_cannot_run(verify("--bootstrap", bootstrap, "--duration", "1"), why)


@pytest.mark.parametrize("proxy", [True, False])
def test_unreachable_broker_exits_2(proxy: bool) -> None:
    r = verify("--bootstrap", "127.0.0.1:1", "--duration", "1", *([] if proxy else ["--no-proxy"]))
    assert_cannot_run(r, "cannot reach the broker at 127.0.0.1:1")


@pytest.mark.parametrize(("command", "why"), [
    ("/nonexistent/broker --port {port}", "cannot start"),
    ("false {port}", "exited with 1"),
    ("'unbalanced {port}", "--broker-cmd"),
    ("", "give --bootstrap or --broker-cmd"),
])
def test_broker_command_that_does_not_start_exits_2(command: str, why: str) -> None:
    assert_cannot_run(verify("--broker-cmd", command, "--duration", "1"), why)


@pytest.mark.parametrize(("args", "why"), [
    (["--duration", "-1"], "must be positive"),
    (["--duration", "soon"], "expected a number"),
    (["--duration", "nan"], "expected a finite number"),
    (["--drain-timeout", "nan"], "expected a finite number"),
    (["--processes", "0"], "must be positive"),
    (["--copiers", "-2"], "must not be negative"),
    (["--faults", "drop,nonsense"], "unknown faults"),
    (["--producers", "0"], "--producers must be at least 1"),
    (["--bootstrap", "127.0.0.1:1", "--broker-cmd", "x {port}"], "not both"),
])
def test_bad_options_exit_2_with_one_line(args: list[str], why: str) -> None:
    if "--bootstrap" not in args and "--broker-cmd" not in args:
        args = [*args, "--bootstrap", "127.0.0.1:1"]
    assert_cannot_run(verify(*args), why)


@pytest.mark.parametrize(("args", "why"), [
    (["--bootstrap", "127.0.0.1:1", "--faults", "broker-kill,broker-pause"],
     "broker-kill,broker-pause need a broker that verify starts itself (--broker-cmd"),
    (["--bootstrap", "127.0.0.1:1", "--no-proxy", "--faults", "drop,reset,delay,zombie"],
     "delay,drop,reset need the fault proxy (not with --no-proxy)"),
    (["--bootstrap", "127.0.0.1:1", "--no-txn", "--faults", "drop,zombie,crash"],
     "crash,zombie replace transactional clients (not with --no-txn)"),
])
def test_faults_the_run_cannot_make_are_refused_up_front(args: list[str], why: str) -> None:
    """They used to be skipped silently: the title named them, the stats said 0 faults, exit 0."""
    assert_cannot_run(verify(*args), "--faults:", why)


def test_unknown_option_exits_2() -> None:
    r = verify("--bootstrap", "127.0.0.1:1", "--no-such-option")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "unrecognized arguments" in r.stderr


def history(tmp_path: Path, *, second_offset: int | None = 1, read_second: bool = True) -> Path:
    h = History(meta={"seed": 1})
    h.sends = [Send("p1", 1, "a", 0, 0, True, 1), Send("p1", 1, "b", 0, second_offset, True, 1)]  # type: ignore[arg-type]
    h.txns = [Txn("p1", 1, "committed", 2, 3, ["a", "b"])]
    h.polls = [Poll("final", 9, [(0, 0, "a"), *([(0, 1, "b")] if read_second else [])], final=True)]
    path = tmp_path / "h.jsonl"
    h.dump(path)
    return path


def test_check_a_recorded_history_clean_and_with_anomalies(tmp_path: Path) -> None:
    clean = verify("--check", str(history(tmp_path)), "--report", str(tmp_path / "r.html"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "no anomaly found" in (tmp_path / "r.html").read_text()
    lost = verify("--check", str(history(tmp_path, read_second=False)))
    assert lost.returncode == 1 and "unseen: b (process p1, txn 1)" in lost.stdout


def test_check_a_history_with_an_acknowledgement_without_offset(tmp_path: Path) -> None:
    r = verify("--check", str(history(tmp_path, second_offset=None)))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "missing-offset: b (p1 txn 1) was acknowledged without an offset" in r.stdout
    assert "Traceback" not in r.stderr


def test_check_what_is_not_a_history_exits_2(tmp_path: Path) -> None:
    assert_cannot_run(verify("--check", str(tmp_path / "missing.jsonl")), "cannot read")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"type": "send", "process": "p"}) + "\n")
    assert_cannot_run(verify("--check", str(bad)), "line 1")
    assert_cannot_run(verify("--check", str(bad), "--bootstrap", "127.0.0.1:1"), "neither")
    # Nothing the checker knows (an empty file, lines of other kinds only) is not a clean history:
    # it used to pass (exit 0) with a note that no final read was found.
    for text in ("", "\n\n", json.dumps({"type": "meta"}) + "\n" + json.dumps({"type": "nope", "x": 1}) + "\n"):
        bad.write_text(text)
        assert_cannot_run(verify("--check", str(bad)), "holds no history entry")


def test_unwritable_report_exits_2(tmp_path: Path) -> None:
    r = verify("--check", str(history(tmp_path)), "--report", str(tmp_path / "no" / "such" / "r.html"))
    assert_cannot_run(r, "cannot write --report")

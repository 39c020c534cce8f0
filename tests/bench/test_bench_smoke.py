"""`oncelog bench` runs end to end with a tiny record count and prints a row per broker and workload.

Only the shape of the output is checked: benchmarks never gate CI on a time or a ratio.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from oncelog.testing.broker_process import tansu_binary


def test_bench_smoke_prints_both_brokers(tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    env = {**os.environ, "COLUMNS": "200"}
    r = subprocess.run(
        [sys.executable, "-m", "oncelog", "bench", "--records", "300", "--rows", "produce,consume",
         "--pipeline-records", "0", "--json", str(out_json)],
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    produce = [line for line in lines if "produce" in line]
    consume = [line for line in lines if "consume" in line]
    assert produce and consume, r.stdout
    assert "oncelog MB/s" in r.stdout
    doc = json.loads(out_json.read_text())
    assert doc["records"] == 300
    for row in ("produce", "consume"):
        assert doc["results"]["oncelog"][row]["mb_per_s"] > 0
        assert doc["results"]["oncelog"][row]["bytes"] == 300 * 1024
    if tansu_binary() is not None:
        assert "tansu MB/s" in r.stdout and "oncelog / tansu" in r.stdout
        for row in ("produce", "consume"):
            assert doc["results"]["tansu"][row]["mb_per_s"] > 0
        assert any(re.search(r"\d+\.\d\dx", line) for line in produce), r.stdout

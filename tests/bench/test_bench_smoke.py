"""`oncelog bench --quick` end to end: both brokers, every row, every curve, the report and its JSON.

Only the shape is checked (every figure present, positive, percentiles in order, the report renders):
benchmarks never gate CI on a time or a ratio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from oncelog.bench.runner import ROWS
from oncelog.testing.broker_process import tansu_binary
from tests.bench.render import assert_rendered

Quick = tuple[subprocess.CompletedProcess[str], Path]

LIMITS = {"broker", "client", "machine", "waiting"}


@pytest.fixture(scope="module")
def quick(tmp_path_factory: pytest.TempPathFactory) -> Quick:
    out = tmp_path_factory.mktemp("bench") / "report"
    r = subprocess.run([sys.executable, "-m", "oncelog", "bench", "--quick", "--out", str(out),
                        "--broker-arg=--fsync-io-uring"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "250"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, out


def brokers() -> list[str]:
    return ["oncelog", "tansu"] if tansu_binary() is not None else ["oncelog"]


def assert_latency(lat: dict[str, Any], where: str) -> None:
    assert "error" not in lat, (where, lat)
    assert lat["n"] > 0 and lat["offered_per_s"] > 0, (where, lat)
    assert 0 <= lat["p50"] <= lat["p99"] <= lat["max"], (where, lat)
    qs = [v for _q, v in lat["table"]]
    assert qs == sorted(qs), (where, lat["table"])


def assert_throughput(thr: dict[str, Any], where: str) -> None:
    assert thr["records"] > 0 and thr["bytes"] > 0 and thr["seconds"] > 0 and thr["mb_per_s"] > 0, (where, thr)
    cpu = thr["cpu"]
    assert set(cpu) == {"broker_pct", "clients_pct", "client_max_pct", "machine_pct", "others_pct"}, cpu
    assert cpu["clients_pct"] > 0 and all(v >= 0 for v in cpu.values()), (where, cpu)
    assert thr["limited_by"] in LIMITS, (where, thr["limited_by"])


def test_the_terminal_table_has_every_row_for_every_broker(quick: Quick) -> None:
    r, _ = quick
    for row in ROWS.values():
        assert row.label in r.stdout, row.label
    for name in brokers():
        assert name in r.stdout
    for heading in ("CPU broker", "CPU clients", "limited by", "of peak (ms)", "Ratios", "transactional / acks=all",
                    "idempotent / acks=all", "fsync per append / acks=all", "partitions: throughput",
                    "producers: throughput", "record size: throughput", "Recovery after SIGKILL"):
        assert heading in r.stdout, heading
    if "tansu" in brokers():
        assert "oncelog / tansu: produce acks=all" in r.stdout
    assert "report:" in r.stdout


def test_the_json_has_every_figure(quick: Quick) -> None:
    _, out = quick
    doc = json.loads((out / "bench.json").read_text())
    assert doc["conditions"]["mode"] == "quick" and doc["conditions"]["cpus"] >= 1
    assert list(doc["conditions"]["brokers"]) == brokers()
    # --broker-arg reaches our broker's command line (the default engine, so the figures are the usual)
    assert doc["conditions"]["brokers"]["oncelog"]["command"].endswith(" --fsync-io-uring")
    assert list(doc["rows"]) == list(ROWS)
    for name, row in doc["rows"].items():
        assert row["peak_records_per_s"] > 0
        for broker in brokers():
            entry = row["brokers"][broker]
            assert_throughput(entry["throughput"], f"{name} on {broker}")
            assert set(entry["latency"]) == {"5%", "50%"}, entry["latency"]
            for fraction, lat in entry["latency"].items():
                assert_latency(lat, f"{name} on {broker} at {fraction}")
                assert lat["kind"] == ("produce-to-consume" if row["kind"] == "consume" else "acknowledgement")
                assert lat["rate"] == pytest.approx(row["peak_records_per_s"] * float(fraction[:-1]) / 100, rel=1e-3)
    # the same fixed rate for every broker, the lower peak: both can sustain it
    produce = doc["rows"]["produce"]
    assert produce["peak_records_per_s"] == min(produce["brokers"][b]["throughput"]["records_per_s"] for b in brokers())
    assert set(doc["curves"]) == {"partitions", "producers", "record size"}
    for name, curve in doc["curves"].items():
        assert len(curve["x"]) == len(curve["points"]) >= 2, name
        for point in curve["points"]:
            for broker in brokers():
                assert_throughput(point["brokers"][broker]["throughput"], f"{name} {point}")
                assert_latency(point["brokers"][broker]["latency"], f"{name} {point}")
    assert [p["producers"] for p in doc["curves"]["producers"]["points"]] == doc["curves"]["producers"]["x"]
    assert "pipeline" not in doc  # --quick leaves out the Spark pipeline
    recovery = doc["recovery"]
    assert recovery["bytes"] == 16 << 20
    assert [p["batch_size"] for p in recovery["points"]] == [16_384, 1 << 20]
    for point in recovery["points"]:
        assert "error" not in point, point  # the restart answered with the acknowledged end offsets
        assert point["log_bytes"] >= 15 << 20, point  # what was produced is on disk before the kill
        assert point["empty_start_s"] > 0 and 0 < point["listening_s"] <= point["answering_s"], point


def test_the_report_renders_with_every_chart(quick: Quick,
                                             tmp_path: Path) -> None:
    _, out = quick
    pngs = sorted(p.name for p in out.glob("*.png"))
    for name in ("throughput.png", "cpu.png", "latency-p99.png", "curve-partitions-throughput.png",
                 "curve-partitions-p99.png", "curve-producers-p99.png", "curve-record-size-throughput.png"):
        assert name in pngs, pngs
    assert len([p for p in pngs if p.startswith("latency-")]) == 1 + len(ROWS)
    page = (out / "report.html").read_text()
    assert "Not measured in this run (--quick)" in page
    assert "Recovery after SIGKILL" in page and "s per GiB" in page
    assert_rendered(out / "report.html", tmp_path, min_charts=len(pngs))

"""Where the CPU went: the machine's share scaled by the CPUs /proc/stat counts, and the pipeline
table's CPU columns."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oncelog.bench import cpu
from oncelog.bench.cpu import CpuSample, CpuUse, cpu_count, machine_cpus
from oncelog.bench.report import PIPELINE_CPU_COLUMNS, pipeline_cpu, pipeline_cpu_cells


def test_machine_cpus_counts_every_cpu_of_proc_stat() -> None:
    with open("/proc/stat") as f:
        listed = sum(1 for line in f if line.startswith("cpu") and line[3].isdigit())
    assert machine_cpus() == listed >= cpu_count()


def test_others_are_the_machines_busy_time_whatever_this_process_affinity(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU 0 all ours (broker 60% + clients 40%), CPU 1 all someone else's, for 1 s: others is one
    core, also when this process may run on CPU 0 only (taskset, a cpuset)."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0})
    monkeypatch.setattr(cpu, "machine_cpus", lambda: 2)
    use = CpuUse.between(CpuSample(0.0, 0.0, 0.0, 0.0), CpuSample(1.0, 0.6, 2.0, 2.0), [0.4])
    assert (use.broker_pct, use.clients_pct, use.machine_pct, use.others_pct) == (60.0, 40.0, 100.0, 100.0)


def test_the_pipeline_table_has_each_columns_cpu() -> None:
    point = {"max_offsets": 10, "cpu_s": {
        "copier-0": {"wall_s": 2.0, "broker_cpu_s": 1.0, "clients_cpu_s": 1.8},
        "copier-1": {"wall_s": 2.0, "broker_cpu_s": 1.0, "clients_cpu_s": 2.2},
        "exactly_once-0": {"wall_s": 4.0, "broker_cpu_s": 2.0, "clients_cpu_s": 6.0},
        "latency-copier": {"wall_s": 10.0, "broker_cpu_s": 10.0, "clients_cpu_s": 0.0}}}
    assert pipeline_cpu(point, "copier") == "50/100"  # the latency run is not a timed round
    assert pipeline_cpu(point, "exactly_once") == "50/150" and pipeline_cpu(point, "at_most_once") == "-"
    assert pipeline_cpu_cells(point) == ["10", "50/100", "-", "-", "50/150"]
    assert PIPELINE_CPU_COLUMNS == ["micro-batch", "copier broker/pipeline", "at_most_once broker/pipeline",
                                    "at_least_once broker/pipeline", "exactly_once broker/pipeline"]


def test_the_pipelines_cpu_table_reaches_the_terminal_and_the_html(tmp_path: Path) -> None:
    from rich.console import Console

    from oncelog.bench.report import print_tables, write_all
    from tests.bench.test_bench_parts import fake_doc

    doc = fake_doc()
    doc["pipeline"]["points"][0]["cpu_s"] = {"exactly_once-0": {"wall_s": 4.0, "broker_cpu_s": 2.0,
                                                                "clients_cpu_s": 6.0}}
    console = Console(record=True, width=250)
    print_tables(doc, console)
    text = console.export_text()
    assert "where the CPU went" in text and "50/150" in text
    page = write_all(doc, tmp_path).read_text()
    assert "exactly_once broker/pipeline" in page and "50/150" in page

"""The bench's parts that need no broker: CPU accounting, who-limits, the report from a saved JSON."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from oncelog.bench.cpu import CpuSample, CpuUse, machine_cpu_s, process_cpu_s
from oncelog.bench.report import make_charts, print_tables, ratios, write_all
from oncelog.bench.runner import limited_by


def test_process_cpu_counts_this_process_work() -> None:
    before = process_cpu_s(os.getpid())
    end = time.process_time() + 0.3
    while time.process_time() < end:
        pass
    assert process_cpu_s(os.getpid()) - before >= 0.2
    assert process_cpu_s(2 ** 30) == 0.0  # no such process
    busy, total = machine_cpu_s()
    assert 0 < busy <= total


def test_cpu_use_splits_the_machine_between_broker_clients_and_others() -> None:
    a = CpuSample(at=0.0, broker_s=10.0, machine_busy_s=100.0, machine_total_s=200.0)
    b = CpuSample(at=2.0, broker_s=11.8, machine_busy_s=103.6, machine_total_s=204.0)
    use = CpuUse.between(a, b, [0.5, 0.7])
    assert use.broker_pct == pytest.approx(90.0)
    assert use.clients_pct == pytest.approx(60.0)
    assert use.client_max_pct == pytest.approx(35.0)
    assert use.machine_pct == pytest.approx(90.0)


@pytest.mark.parametrize(("broker", "client_max", "machine", "cores", "expected"), [
    (95, 40, 80, 1, "broker"), (95, 40, 80, 2, "waiting"), (50, 97, 80, 1, "client"),
    (50, 40, 95, 1, "machine"), (50, 40, 60, 1, "waiting"), (180, 40, 95, 2, "broker")])
def test_who_limits(broker: float, client_max: float, machine: float, cores: int, expected: str) -> None:
    use = CpuUse(broker_pct=broker, clients_pct=client_max, client_max_pct=client_max, machine_pct=machine,
                 others_pct=0)
    assert limited_by(use, cores) == expected


def fake_doc() -> dict[str, Any]:
    """A bench document as `oncelog bench` writes it, with made-up figures."""
    cpu = {"broker_pct": 80.0, "clients_pct": 60.0, "client_max_pct": 30.0, "machine_pct": 95.0, "others_pct": 50.0}

    def lat(p50: float) -> dict[str, Any]:
        return {"rate": 1000.0, "offered_per_s": 1000.0, "acked_per_s": 1000.0, "kind": "acknowledgement",
                "n": 4000, "p50": p50, "p90": p50 * 2, "p99": p50 * 4, "p99.9": p50 * 8, "max": p50 * 9,
                "table": [[0.0, p50 / 2], [50.0, p50], [90.0, p50 * 2], [99.0, p50 * 4], [99.9, p50 * 8],
                          [100.0, p50 * 9]], "cpu": cpu}

    def thr(rps: float) -> dict[str, Any]:
        return {"records": int(rps * 3), "bytes": int(rps * 3 * 1024), "seconds": 3.0, "mb_per_s": rps * 1024 / 1e6,
                "records_per_s": rps, "cpu": cpu, "limited_by": "machine", "processes": 2}

    rows: dict[str, Any] = {}
    for name, label, kind, ours, tansu in [
            ("produce", "produce acks=all", "produce", 40_000, 20_000),
            ("produce_fsync", "produce acks=all, fsync per append", "produce", 10_000, 20_000),
            ("produce_idempotent", "produce idempotent", "produce", 30_000, 20_000),
            ("produce_transactional", "produce transactional", "produce", 20_000, 10_000),
            ("consume", "consume", "consume", 80_000, 80_000)]:
        rows[name] = {"label": label, "kind": kind, "config": {}, "peak_records_per_s": min(ours, tansu), "brokers": {
            "oncelog": {"throughput": thr(ours), "latency": {"5%": lat(1.0), "50%": lat(2.0)}},
            "tansu": {"throughput": thr(tansu), "latency": {"5%": lat(0.5), "50%": lat(1.0)}}}}
    rows["consume_read_committed"] = {"label": "consume read_committed", "kind": "consume", "config": {},
                                      "brokers": {"oncelog": {"error": "client process 0: boom", "latency": {}},
                                                  "tansu": {"throughput": thr(70_000), "latency": {}}}}

    def point(x: int, ours: float, tansu: float, busy: tuple[float, float] | None = None) -> dict[str, Any]:
        o, t = thr(ours), thr(tansu)
        if busy:  # the broker's CPU in the run, % of one core: ours, Tansu's
            o["cpu"], t["cpu"] = {**o["cpu"], "broker_pct": busy[0]}, {**t["cpu"], "broker_pct": busy[1]}
        return {"partitions": x, "producers": 2, "processes": 2, "per_process": 1, "size": 1024, "brokers": {
            "oncelog": {"throughput": o, "latency": lat(3.0)},
            "tansu": {"throughput": t, "latency": lat(1.0)}}}

    return {"conditions": {"date": "2026-11-23", "mode": "full", "cpus": 2, "load_average_1_5_15": [1.0, 1.0, 1.0],
                           "machine": "x86_64", "python": "3.11", "librdkafka": "2.16.0", "confluent_kafka": "2.16",
                           "plan": {"size": 1024, "partitions": 3, "processes": 2, "producers_per_process": 1,
                                    "fractions": [0.05, 0.5], "curve_fraction": 0.5, "duration_s": 3.0,
                                    "latency_s": 4.0, "warmup_s": 1.0},
                           "brokers": {"oncelog": {"command": "oncelog broker", "cores_for_requests": 1},
                                       "tansu": {"command": "tansu broker", "cores_for_requests": 2}}},
            "rows": rows,
            "curves": {"partitions": {"x": [1, 1000], "xlabel": "partitions",
                                      "points": [point(1, 40_000, 20_000), point(1000, 8_000, 16_000)]},
                       "scale target": {"x": [1, 100], "xlabel": "target", "partitioner": "round_robin",
                                        "points": [point(3, 40_000, 20_000), point(1000, 10_000, 18_000)]},
                       "scale target, keyless": {"x": [1, 100], "xlabel": "target", "partitioner": "client",
                                                 "points": [point(3, 40_000, 20_000, busy=(80.0, 100.0)),
                                                            point(1000, 24_000, 16_000, busy=(40.0, 100.0))]}},
            "pipeline": {"records": 1000, "size": 100, "points": [
                {"max_offsets": 100, "at_most_once": {"records_per_s": 900}, "at_least_once": {"records_per_s": 1000},
                 "exactly_once": {"records_per_s": 800}, "copier": {"records_per_s": 640}, "ratio_eo_vs_alo": 0.8,
                 "ratio_eo_vs_copier": 1.25, "ratio_amo_vs_alo": 0.9,
                 "latency": {"exactly_once": {"p50_ms": 312.4, "p99_ms": 987.6}}},
                {"max_offsets": 1000, "error": "spark failed"}]}}


def test_ratios_are_the_ones_that_mean_something() -> None:
    found = {r["ratio"]: r["values"] for r in ratios(fake_doc())}
    assert found["transactional / acks=all"] == {"oncelog": 0.5, "tansu": 0.5}
    assert found["idempotent / acks=all"]["oncelog"] == pytest.approx(0.75)
    assert found["fsync per append / acks=all"] == {"oncelog": 0.25, "tansu": 1.0}
    assert found["oncelog / tansu: produce acks=all"] == {"throughput": 2.0, "p99 at 5%": 2.0, "p99 at 50%": 2.0}
    assert found["1,000 partitions x 100 producers / 3 partitions x 1 producer, records round robin"] == {
        "oncelog": 0.25, "tansu": 0.9}
    # keyless: ours kept 0.6 of its throughput on half the broker CPU: 1.2x the MB/s per broker core
    assert found["1,000 partitions x 100 producers / 3 partitions x 1 producer, keyless records"] == {
        "oncelog": 0.6, "tansu": 0.8}
    assert found["MB/s per core of broker CPU, 1,000 x 100 / 3 x 1, keyless records"] == {
        "oncelog": pytest.approx(1.2), "tansu": pytest.approx(0.8)}
    assert "read_committed / read_uncommitted" in found  # Tansu's figure; ours failed and has none
    assert found["read_committed / read_uncommitted"]["oncelog"] is None


def test_the_report_is_written_from_the_json_alone(tmp_path: Path) -> None:
    from rich.console import Console

    doc = fake_doc()
    console = Console(record=True, width=250)
    print_tables(doc, console)
    text = console.export_text()
    assert "2.00x" in text and "client process 0: boom" in text and "spark failed" in text
    # the pipeline's three targets and its end-to-end latency, beside the copier anchor
    assert "1.250" in text and "0.900" in text and "312/988" in text and "640" in text
    path = write_all(doc, tmp_path)
    assert json.loads((tmp_path / "bench.json").read_text())["rows"]["produce"]["peak_records_per_s"] == 20_000
    page = path.read_text()
    assert page.count("<img ") == len(make_charts(doc)) == len(list(tmp_path.glob("*.png")))
    assert "client process 0: boom" in page and "spark failed" in page and "312/988" in page
    assert (tmp_path / "pipeline.png").exists() and (tmp_path / "curve-scale-target-p99.png").exists()
    assert (tmp_path / "curve-scale-target-keyless-throughput.png").exists()
    assert "keyless records" in text and "own partitioner (librdkafka" in page


@pytest.mark.parametrize(("args", "why"), [(["--rows", "bogus"], "unknown rows"), (["--size", "0"], "must be positive"),
                                           (["--out", "/proc/no/such"], "cannot write to --out"),
                                           (["--pipeline-rounds", "0"], "must be at least 1")])
def test_bad_options_exit_2_with_one_line(args: list[str], why: str) -> None:
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "oncelog", "bench", *args], capture_output=True, text=True, timeout=60)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and why in lines[0], (r.returncode, r.stderr)


def _report_priority(conn: Any) -> None:
    """In a spawned process: lower it as a bench client does, then say what the scheduler sees,
    for this thread and for a thread started afterwards (librdkafka starts its threads then)."""
    import threading

    from oncelog.bench.clients import lower_priority

    lower_priority("idle")
    seen: dict[str, Any] = {}
    t = threading.Thread(target=lambda: seen.update(policy=os.sched_getscheduler(0), nice=os.getpriority(
        os.PRIO_PROCESS, threading.get_native_id())))
    t.start()
    t.join()
    conn.send({"policy": os.sched_getscheduler(0), "nice": os.nice(0), "leader": os.getsid(0) == os.getpid(),
               "autogroup": Path("/proc/self/autogroup").read_text() if Path("/proc/self/autogroup").exists() else "",
               "thread": seen})


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux only")
def test_idle_clients_yield_to_the_broker_and_leave_the_callers_session_alone() -> None:
    import multiprocessing

    mine = (os.sched_getscheduler(0), os.nice(0), os.getsid(0),
            Path("/proc/self/autogroup").read_text() if Path("/proc/self/autogroup").exists() else "")
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_report_priority, args=(child,))
    proc.start()
    try:
        assert parent.poll(60)
        got = parent.recv()
    finally:
        proc.join(10)
    assert got["policy"] == os.SCHED_IDLE and got["nice"] == 19 and got["leader"]
    assert got["thread"] == {"policy": os.SCHED_IDLE, "nice": 19}  # threads started later inherit both
    if got["autogroup"]:
        assert got["autogroup"].strip().endswith("nice 19"), got["autogroup"]
    # the caller (here: pytest; in the bench: the user's shell session) keeps its priority and autogroup
    assert (os.sched_getscheduler(0), os.nice(0), os.getsid(0),
            Path("/proc/self/autogroup").read_text() if Path("/proc/self/autogroup").exists() else "") == mine


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux only")
def test_the_pools_processes_run_at_the_priority_asked_for() -> None:
    from oncelog.bench.clients import ClientPool

    with pytest.raises(ValueError, match="unknown client priority"):
        ClientPool(1, "high")
    for priority, policy in (("idle", os.SCHED_IDLE), ("normal", os.sched_getscheduler(0))):
        pool = ClientPool(1, priority)
        try:
            pid = pool.procs[0].pid
            deadline = time.monotonic() + 60
            while os.sched_getscheduler(pid) != policy and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # a normal worker that were to lower itself late would be caught here
            assert os.sched_getscheduler(pid) == policy, priority
        finally:
            pool.close()


def test_repeated_latency_runs_keep_the_median_p99_run() -> None:
    from oncelog.bench.runner import median_run

    runs = [{"p99": 30.0, "p50": 3.0}, {"p99": 10.0, "p50": 1.0}, {"p99": 20.0, "p50": 2.0}]
    assert median_run(runs) == {"p99": 20.0, "p50": 2.0, "p99_runs": [30.0, 10.0, 20.0]}
    assert median_run(runs[:2])["p50"] == 1.0  # an even count: the lower middle run
    assert median_run([{"p99": 5.0}])["p99_runs"] == [5.0]
    assert median_run([*runs, {"error": "client process 1 did not answer"}]) == {
        "error": "client process 1 did not answer"}


def test_the_fsync_per_append_rows_topics_carry_flush_messages_1(tmp_path: Path) -> None:
    """The row is what it says: its topics are created with flush.messages=1, with which our
    broker answers a produce only once the append is fsynced (tests/server/test_admin_configs.py::
    test_flush_messages_and_flush_ms); the other rows' topics keep the broker's defaults."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    from oncelog.bench.runner import FSYNC_PER_APPEND, ROWS, Broker
    from oncelog.testing.broker_process import oncelog_broker

    assert ROWS["produce_fsync"].topic_config == FSYNC_PER_APPEND == (("flush.messages", "1"),)
    assert all(not r.topic_config for name, r in ROWS.items() if name != "produce_fsync")
    process = oncelog_broker(tmp_path / "data").start()
    try:
        broker = Broker("oncelog", process, cores=1)
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for config, expected in ((FSYNC_PER_APPEND, "1"), ((), str(2**63 - 1))):
            res = ConfigResource(ConfigResource.Type.TOPIC, broker.topic("t", 1, config))
            assert admin.describe_configs([res])[res].result(timeout=30)["flush.messages"].value == expected
    finally:
        process.stop()


def test_keyless_producers_leave_the_partition_to_the_client(tmp_path: Path) -> None:
    """The keyless scale target is what it says: its records carry no partition and no key, so
    librdkafka's sticky partitioner fills one partition at a time, in the throughput runs
    (linger.ms=5) and in the fixed-rate runs (linger.ms=0, where librdkafka would otherwise pick a
    random partition per record); the round-robin jobs put record i in partition i mod n."""
    from collections import Counter

    from oncelog.bench.clients import STAMP, Job, _ProducerThread
    from oncelog.bench.runner import SCALE_TARGETS, Broker
    from oncelog.testing.broker_process import oncelog_broker

    assert {p for _, p, _ in SCALE_TARGETS} == {"round_robin", "client"}
    process = oncelog_broker(tmp_path / "data").start()
    try:
        broker = Broker("oncelog", process, cores=1)
        for partitioner, linger_ms, rate in (("round_robin", 5, 0.0), ("client", 5, 0.0), ("client", 0, 5_000.0)):
            topic = broker.topic(f"spread-{partitioner}-{linger_ms}", 12)
            job = Job("produce", broker.bootstrap, topic, list(range(12)), size=100, duration_s=0.6,
                      partitioner=partitioner, linger_ms=linger_ms, rate=rate)
            thread = _ProducerThread(job, 0)
            sent: list[tuple[int, int]] = []  # (send time stamped in the value, partition)
            deliver = thread._on_delivery

            def on_delivery(err: Any, msg: Any, sent: list[tuple[int, int]] = sent, deliver: Any = deliver) -> None:
                assert msg.key() is None
                sent.append((STAMP.unpack_from(msg.value())[0], msg.partition()))
                deliver(err, msg)

            thread._on_delivery = on_delivery  # type: ignore[method-assign]
            thread.run(time.monotonic())
            assert thread.errors == 0 and thread.acked == len(sent) > 1_000
            order = [p for _, p in sorted(sent)]
            switches = sum(a != b for a, b in itertools.pairwise(order))
            counts = Counter(order)
            if partitioner == "round_robin":
                assert switches == len(order) - 1 and max(counts.values()) - min(counts.values()) <= 1
            else:  # a partition per 10 ms, not per record
                assert switches < len(order) / 20, (linger_ms, switches, len(order))
    finally:
        process.stop()


def test_pipeline_rounds_rotate_the_guarantees_so_each_runs_first_once() -> None:
    from oncelog.demo.pipeline_bench import GUARANTEES, round_order

    orders = [round_order(list(GUARANTEES), r) for r in range(len(GUARANTEES))]
    assert sorted(o[0] for o in orders) == sorted(GUARANTEES)
    assert all(sorted(o) == sorted(GUARANTEES) for o in orders)
    assert round_order(list(GUARANTEES), len(GUARANTEES)) == list(GUARANTEES)


def test_the_copiers_transactions_are_as_large_as_the_micro_batches() -> None:
    from oncelog.demo.pipeline_bench import copier_batch

    assert copier_batch(500_000, 4_000_000) == 500_000  # was capped at 100,000: not the same unit
    assert copier_batch(5_000, 4_000_000) == 5_000
    assert copier_batch(0, 4_000_000) == 100_000  # one micro-batch: the copier still commits as it goes
    assert copier_batch(0, 20_000) == 20_000
    assert copier_batch(3_000_000, 4_000_000) == 1_000_000  # confluent-kafka's consume() limit


def test_the_tables_written_into_a_file_keep_their_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """Into a pipe or a log (``make bench > log``, CI), rich would lay the tables out in 80 columns
    and cut every figure to an ellipsis; the bench's console is wide there."""
    from oncelog.console import output_console

    print_tables(fake_doc(), output_console())
    out = capsys.readouterr().out
    assert "…" not in out
    assert "312/988" in out and "0.900" in out and "1.250" in out


@pytest.mark.parametrize("keep", [False, True], ids=["removed", "kept"])
def test_the_pipeline_bench_removes_its_broker_data_and_checkpoints(tmp_path: Path, keep: bool,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run of the pipeline bench writes gigabytes (its broker's records, the queries'
    checkpoints) into temporary directories; they go at the end unless --keep. (They used to stay:
    62 of them, up to 3 GB each, had piled up in /tmp on this machine.)"""
    import tempfile
    from types import SimpleNamespace

    import oncelog.spark
    from oncelog.demo import pipeline_bench

    fake_spark = SimpleNamespace(dataSource=SimpleNamespace(register=lambda _source: None), stop=lambda: None)
    monkeypatch.setattr(oncelog.spark, "local_session", lambda *_a, **_k: fake_spark)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    args = ["--records", "10", "--guarantees", "", "--no-copier", "--latency-seconds", "0"]
    assert pipeline_bench.main(args + (["--keep"] if keep else [])) == 0
    left = sorted(p.name.rsplit("-", 1)[0] for p in tmp_path.iterdir() if p.name.startswith("oncelog-pipeline-bench"))
    assert left == (["oncelog-pipeline-bench", "oncelog-pipeline-bench-broker"] if keep else [])


@pytest.mark.parametrize("samples_per_run,runs,n", [([[], [1.5, 2.5]], 2, 2), ([[3.0]], 1, 1), ([[], []], 2, 0)])
def test_a_fixed_rate_run_without_a_sample_is_run_once_more(samples_per_run: list[list[float]], runs: int,
                                                            n: int) -> None:
    """A fixed-rate run whose consumers saw no record of the window (CI saw it once, --quick, the
    Tansu broker's read_committed row at 50%) is run again, once; ``runs`` tells."""
    from oncelog.bench.clients import Result, RunResult
    from oncelog.bench.runner import Bench, Plan

    bench = Bench(Plan.quick_plan(), [], pool=None, progress=lambda _msg: None)  # type: ignore[arg-type]
    given = iter(samples_per_run)
    calls: list[int] = []

    def fake_run(broker: Any, jobs: Any, pool: Any = None) -> Any:
        calls.append(len(jobs))
        sample = CpuSample.take(os.getpid())
        consumer = Result(records=5, latencies_ms=next(given))
        return RunResult([Result(records=5, sent_per_s=10.0), consumer], 0.0, 1.0), sample, sample

    bench._run = fake_run  # type: ignore[method-assign]
    broker = type("B", (), {"bootstrap": "127.0.0.1:1"})()
    lat = bench.latency(broker, "t", 1, 10.0, processes=1, per_process=1, size=100,  # type: ignore[arg-type]
                        consume="read_committed")
    assert (lat["runs"], lat["n"], len(calls)) == (runs, n, runs)
    assert calls == [2] * runs  # the same producer and consumer jobs each time

"""A fixed-rate figure whose run did not do what its rate promised is marked, in the terminal and in
report.html, with its reasons: it must not read like a good one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oncelog.bench.report import latency_cell, latency_flags, marked_latencies, print_tables, write_all
from tests.bench.test_bench_parts import fake_doc


def bad_doc() -> dict[str, Any]:
    doc = fake_doc()
    ours = doc["rows"]["produce"]["brokers"]["oncelog"]["latency"]
    ours["50%"].update(rate=1000.0, offered_per_s=100.0, acked_per_s=100.0)  # offered a tenth of its rate
    ours["5%"].update(send_lag_ms={"p50": 0.2, "p99": 45.0, "max": 80.0})  # the client could not keep up
    cons = doc["rows"]["consume"]["brokers"]["tansu"]["latency"]["50%"]
    cons.update(kind="produce-to-consume", expected=3000, seen=1600, unseen=1400, unseen_ms=31_000.0)
    doc["curves"]["partitions"]["points"][1]["brokers"]["oncelog"]["latency"]["acked_per_s"] = 500.0
    return doc


def test_a_short_run_is_marked_with_its_reasons() -> None:
    doc = bad_doc()
    ours = doc["rows"]["produce"]["brokers"]["oncelog"]["latency"]
    assert latency_flags(ours["50%"]) == ["offered 100/s of 1,000/s (10%)", "acknowledged 100/s of 1,000/s (10%)"]
    assert latency_cell(ours["50%"]).endswith(" !") and latency_cell(ours["5%"]).endswith(" !")
    good = doc["rows"]["produce"]["brokers"]["tansu"]["latency"]["50%"]
    assert latency_flags(good) == [] and "!" not in latency_cell(good)
    # a lag under the bound and a complete consume run are not marked
    assert latency_flags({**good, "send_lag_ms": {"p99": 2.0}, "expected": 10, "seen": 10, "unseen": 0}) == []
    where = dict(marked_latencies(doc))
    assert set(where) == {"produce acks=all, oncelog, at 50% of peak", "produce acks=all, oncelog, at 5% of peak",
                          "consume, tansu, at 50% of peak", "partitions curve, 1,000, oncelog"}
    assert where["consume, tansu, at 50% of peak"] == [
        "1,400 of 3,000 acknowledged records never seen (counted as 31000 ms)"]
    assert where["produce acks=all, oncelog, at 5% of peak"] == [
        "records went out 45.0 ms late against their schedule (p99 send lag)"]


def test_the_marks_reach_the_terminal_and_the_html(tmp_path: Path) -> None:
    from rich.console import Console

    doc = bad_doc()
    console = Console(record=True, width=250)
    print_tables(doc, console)
    text = console.export_text()
    assert "2.00 / 8.00 / 16.0 !" in text  # our produce row at 50%
    assert "1.00 / 4.00 / 8.00 !" in text and "0.50 / 2.00 / 4.00 !" not in text
    assert "offered 100/s of 1,000/s (10%)" in text and "1,400 of 3,000 acknowledged records never seen" in text
    assert "Latency marked !" in text
    page = write_all(doc, tmp_path).read_text()
    assert "2.00 / 8.00 / 16.0 !" in page and "offered 100/s of 1,000/s (10%)" in page
    assert "partitions curve, 1,000, oncelog" in page and "never seen" in page

"""The pipeline bench's accounting, with crafted inputs: its figures look at the output (every input
record visible exactly once when the clock stopped), and its latency is one sample per distinct
record, the unseen counted."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from oncelog.bench.report import pipeline_cells, pipeline_marks
from oncelog.demo import pipeline_bench
from oncelog.demo.pipeline_bench import LATENCY_STAMP, RECORD_INDEX, latency_figures, tally


class CapturingProducer:
    produced: list[tuple[bytes, bytes]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def produce(self, topic: str, key: bytes, value: bytes) -> None:
        self.produced.append((key, value))

    def poll(self, _timeout: float) -> int:
        return 0

    def flush(self, _timeout: float) -> int:
        return 0


def test_fill_writes_each_records_index_in_a_value_of_the_same_size(monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka

    monkeypatch.setattr(confluent_kafka, "Producer", CapturingProducer)
    CapturingProducer.produced = []
    pipeline_bench.fill("-", "t", 1_500, 100)
    got = CapturingProducer.produced
    assert [RECORD_INDEX.unpack_from(v)[0] for _, v in got] == list(range(1_500))
    assert {len(v) for _, v in got} == {100}
    assert [k for k, _ in got][999:1002] == [b"999", b"0", b"1"]  # keys as before: i mod 1000


def test_tally_counts_distinct_records_duplicates_and_strangers() -> None:
    values = [RECORD_INDEX.pack(i) + b"x" * 92 for i in (0, 1, 1, 3, 1)] + [b"short", None, RECORD_INDEX.pack(7)]
    assert tally(iter(values), 5) == {"visible": 3, "missing": 2, "duplicates": 2, "foreign": 3}
    assert tally(iter(RECORD_INDEX.pack(i) for i in range(4)), 4) == {
        "visible": 4, "missing": 0, "duplicates": 0, "foreign": 0}


def test_every_round_checks_its_output_and_the_report_marks_a_short_one(monkeypatch: pytest.MonkeyPatch) -> None:
    import oncelog.spark

    fake_spark = SimpleNamespace(dataSource=SimpleNamespace(register=lambda _source: None), stop=lambda: None)
    monkeypatch.setattr(oncelog.spark, "local_session", lambda *_a, **_k: fake_spark)
    for name in ("create_topic", "fill"):
        monkeypatch.setattr(pipeline_bench, name, lambda *_a, **_k: None)
    monkeypatch.setattr(pipeline_bench, "run_one", lambda *_a, **_k: 1.0)
    monkeypatch.setattr(pipeline_bench, "run_copier", lambda *_a, **_k: {"records": 100, "records_per_s": 90})
    checked: list[str] = []

    def check_output(bootstrap: str, topic: str, records: int) -> dict[str, int]:
        checked.append(topic)
        missing = 40 if topic == "bench-out-at_most_once-1" else 0
        return {"visible": records - missing, "missing": missing, "duplicates": 0, "foreign": 0}

    monkeypatch.setattr(pipeline_bench, "check_output", check_output)
    result = pipeline_bench.measure("-", 100, 100, 50, list(pipeline_bench.GUARANTEES), rounds=2)
    assert sorted(checked) == sorted([f"bench-copy-{r}" for r in range(2)] + [
        f"bench-out-{g}-{r}" for g in pipeline_bench.GUARANTEES for r in range(2)])
    assert result["rounds"][1]["at_most_once"]["missing"] == 40 and result["rounds"][0]["at_most_once"]["missing"] == 0
    point = {"max_offsets": 50, **result}
    cells = pipeline_cells(point)
    # columns: micro-batch, copier, at_most_once, at_least_once, exactly_once, ...
    assert cells[2].endswith(" !") and not any(c.endswith("!") for c in cells[:2] + cells[3:])
    assert pipeline_marks({"points": [point]}) == [("micro-batch 50, at_most_once records/s", [
        "round 2: 40 of 100 records not visible read_committed in the output when the clock stopped"])]


class FakeConsumer:
    """Hands out ``batches`` (lists of values), one per consume call, then nothing."""

    batches: list[list[bytes]] = []

    def __init__(self, conf: dict[str, Any]) -> None:
        self.left = list(self.batches)

    def list_topics(self, topic: str, timeout: float) -> Any:
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions={0: None, 1: None})})

    def assign(self, _parts: Any) -> None:
        pass

    def consume(self, num_messages: int, timeout: float) -> list[Any]:
        if not self.left:
            time.sleep(timeout)
            return []
        return [SimpleNamespace(error=lambda: None, value=lambda v=v: v) for v in self.left.pop(0)]

    def close(self) -> None:
        pass


def test_the_latency_consumer_takes_one_sample_per_distinct_record(monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka

    since = time.time_ns()
    early, late = since - 10**9, since - 10**6 + 10**6  # before and at the end of the warm-up
    FakeConsumer.batches = [[LATENCY_STAMP.pack(early, 0), LATENCY_STAMP.pack(late, 1)],
                            [LATENCY_STAMP.pack(late, 1), LATENCY_STAMP.pack(late, 2), b"short"],
                            [LATENCY_STAMP.pack(late, 2)]]
    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    stop = threading.Event()
    got: list[float] = []
    seen = [0, 0]
    reader = threading.Thread(target=pipeline_bench._latency_consumer, args=("-", "t", since, stop, got, seen))
    reader.start()
    time.sleep(0.3)
    stop.set()
    reader.join(5)
    assert seen == [3, 2]  # records 0, 1, 2; 1 and 2 read twice
    assert len(got) == 2  # 1 and 2, once each (0 was sent during the warm-up)


def test_records_never_seen_count_as_the_worst_case() -> None:
    got = [1.0] * 89 + [300.0]
    fig = latency_figures(1_000, 10.0, sent=100, seen=90, duplicates=3, got=got, waited_ms=120_000.0)
    assert (fig["unseen"], fig["duplicates"], fig["samples"], fig["unseen_ms"]) == (10, 3, 90, 120_000.0)
    assert fig["p50_ms"] == 1.0 and fig["p99_ms"] == fig["max_ms"] == 120_000.0
    fig = latency_figures(1_000, 10.0, sent=90, seen=90, duplicates=0, got=got, waited_ms=5.0)
    assert fig["unseen"] == 0 and "unseen_ms" not in fig and fig["max_ms"] == 300.0
    marks = pipeline_marks({"points": [{"max_offsets": 10, "latency": {"exactly_once": latency_figures(
        1_000, 10.0, sent=100, seen=90, duplicates=3, got=got, waited_ms=120_000.0)}}]})
    assert marks == [("micro-batch 10, exactly_once latency", [
        "10 of 100 records never seen in the output (counted as 120,000 ms)",
        "3 duplicate records read in the output"])]


def test_the_pipeline_table_says_which_figures_come_from_which_round() -> None:
    """Each records/s figure is its column's own median round, each ratio the median of the rounds'
    own ratios: the table says so and shows the rounds' range, since eo / alo of the figures printed
    (70,000 / 100,000) is not the ratio column (0.636)."""
    from rich.console import Console

    from oncelog.bench.report import print_tables
    from tests.bench.test_bench_parts import fake_doc

    rounds = [{"copier": 100_000, "exactly_once": 95_000, "at_least_once": 60_000, "at_most_once": 70_000},
              {"copier": 150_000, "exactly_once": 60_000, "at_least_once": 100_000, "at_most_once": 90_000},
              {"copier": 120_000, "exactly_once": 70_000, "at_least_once": 110_000, "at_most_once": 130_000}]
    per_round = [{**{k: {"records_per_s": v} for k, v in r.items()},
                  **pipeline_bench._ratios({k: {"records_per_s": v} for k, v in r.items()})} for r in rounds]
    point = {"max_offsets": 100, "rounds": per_round, "ratio_eo_vs_alo": 0.636, "ratio_eo_vs_copier": 0.583,
             "ratio_amo_vs_alo": 1.167, **{k: {"records_per_s": v} for k, v in rounds[2].items()}}
    cells = pipeline_cells(point)
    assert cells[5:8] == ["0.583 (0.40-0.95)", "0.636 (0.60-1.58)", "1.167 (0.90-1.18)"]
    doc = fake_doc()
    doc["pipeline"] = {"records": 1000, "size": 100, "rounds": 3, "points": [point]}
    console = Console(record=True, width=400)
    print_tables(doc, console)
    text = " ".join(console.export_text().split())
    assert "each records/s figure is that column's own median round" in text
    assert "a ratio need not equal the ratio of the figures printed beside it" in text
    assert "0.636 (0.60-1.58)" in text


class FakeTransactionalProducer:
    def __init__(self, conf: dict[str, Any]) -> None:
        pass

    def __getattr__(self, name: str) -> Any:  # init_transactions, begin, produce, commit, ...
        return lambda *_a, **_k: None


def test_the_copiers_latency_run_ends_when_the_producer_sent_fewer_than_planned(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The stamped producer sends at most rate x seconds, often a few fewer; the copier was told to
    copy exactly that many, never got there, and outlived its run (join(30) timed out)."""
    import confluent_kafka

    FakeConsumer.batches = []
    monkeypatch.setattr(confluent_kafka, "Consumer", FakeConsumer)
    monkeypatch.setattr(confluent_kafka, "Producer", FakeTransactionalProducer)
    monkeypatch.setattr(pipeline_bench, "create_topic", lambda *_a, **_k: None)
    monkeypatch.setattr(pipeline_bench, "_stamped_producer",
                        lambda bs, topic, rate, seconds, size, stop, sent: sent.append(int(rate * seconds) - 3))

    def reader(bs: str, topic: str, since: int, stop: threading.Event, got: list[float], seen: list[int]) -> None:
        seen[0] = 97  # everything the producer sent
        got.extend([1.0] * 97)
        stop.wait()

    monkeypatch.setattr(pipeline_bench, "_latency_consumer", reader)
    before = set(threading.enumerate())
    began = time.monotonic()
    fig = pipeline_bench.measure_latency(None, "-", "copier", None, 100, 1.0, 100, 0)  # type: ignore[arg-type]
    assert time.monotonic() - began < 10
    assert (fig["sent"], fig["seen"], fig["unseen"]) == (97, 97, 0)
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]  # no copier left behind

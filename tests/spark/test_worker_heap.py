"""A Spark Python worker freezes its long-lived heap once, so PySpark's ``gc.collect()`` after each
task stops walking every imported module (``clients.settle_worker``).

``gc.freeze()`` is process-wide, so each check runs in a child process of its own: the test
process's collector is never touched."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from confluent_kafka import Producer

from oncelog.spark import clients, sink
from oncelog.testing.broker_process import BrokerProcess, create_topic

AS_WORKER = """
import gc, json, sys
from pyspark.core.files import SparkFiles
from oncelog.spark import clients
"""


def _child(script: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", AS_WORKER + textwrap.dedent(script), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_only_a_spark_worker_freezes_and_only_once() -> None:
    got = _child("""
        outside = [clients.settle_worker(), gc.get_freeze_count()]
        thresholds = [list(gc.get_threshold())]
        SparkFiles._is_running_on_worker = True  # what PySpark's worker sets for a task
        first = clients.settle_worker()
        frozen = gc.get_freeze_count()
        thresholds.append(list(gc.get_threshold()))
        second = clients.settle_worker()
        print(json.dumps({"outside": outside, "first": first, "frozen": frozen, "second": second,
                          "thresholds": thresholds,
                          "after": gc.get_freeze_count(),
                          "imported": all(m in sys.modules for m in ("pyarrow", "confluent_kafka"))}))
    """)
    assert got["outside"] == [False, 0], "a driver or test process keeps its collector"
    assert got["thresholds"][0] == [700, 10, 10], "outside a worker the thresholds stay CPython's"
    assert got["thresholds"][1] == [clients.WORKER_GC_THRESHOLD0, 10, 10]
    assert got["first"] is True and got["second"] is False
    assert got["frozen"] > 10_000, "the imported libraries' objects are frozen"
    assert got["after"] == got["frozen"], "a second task freezes nothing more"
    assert got["imported"]


RECORDS = 30_000


def test_the_sources_read_settles_its_worker(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "heap", 1)
    p = Producer({"bootstrap.servers": bs})
    for i in range(RECORDS):
        p.produce("heap", value=b"%d" % i)
        if i % 10_000 == 0:
            p.poll(0)
    assert p.flush(15) == 0
    got = _child("""
        from pyspark.sql.streaming.datasource import ReadAllAvailable
        from oncelog.spark.source import KafkaStreamReader
        SparkFiles._is_running_on_worker = True
        reader = KafkaStreamReader({"kafka.bootstrap.servers": sys.argv[1], "subscribe": "heap",
                                    "startingOffsets": "earliest"})
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        before = gc.get_freeze_count()
        collections = []
        # Automatic collections once the heap is frozen (those before are the set-up's and the freeze's own).
        gc.callbacks.append(lambda phase, info: collections.append(info["generation"])
                            if phase == "start" and gc.get_freeze_count() else None)
        rows = sum(b.num_rows for part in reader.partitions(start, end) for b in reader.read(part))
        reader.stop()
        print(json.dumps({"before": before, "after": gc.get_freeze_count(), "rows": rows,
                          "collections": len(collections)}))
    """, bs)
    assert got == {"before": 0, "after": got["after"], "rows": RECORDS, "collections": got["collections"]}
    assert got["after"] > 10_000
    # At CPython's threshold (700) this read ran 72 automatic collections; each walked the
    # pending librdkafka messages again.
    assert got["collections"] == 0


def test_the_sinks_write_settles_its_worker_before_writing(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    monkeypatch.setattr(sink, "settle_worker", lambda: calls.append("settle"))
    monkeypatch.setattr(sink, "current_task_identity", lambda: sink.TaskIdentity("q", 0, 0))
    monkeypatch.setattr(sink, "write_partition", lambda *a, **k: calls.append("write"))
    writer = sink.KafkaStreamWriter.__new__(sink.KafkaStreamWriter)  # no driver-side preparation
    writer.settings = None  # type: ignore[assignment]
    writer.write(iter(()))
    assert calls == ["settle", "write"]

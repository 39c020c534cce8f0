"""Real Spark (local[2]) against our broker: batch reads of committed ranges, a stateful streaming
aggregation written exactly once. One SparkSession and one broker for the module (Spark starts slowly)."""

from __future__ import annotations

import argparse
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.demo.faults import produce_transactions, read_topic
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker

pytest.importorskip("pyspark")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mod_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    d = tmp_path_factory.mktemp("spark-broker")
    with oncelog_broker(d / "data", "--auto-create-topics", log_path=d / "broker.log").start() as b:
        yield b


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from oncelog.spark import local_session

    s = local_session("oncelog-tests", quick_start=True)
    try:
        yield s
    finally:
        s.stop()


def _worker_view(_: Any) -> tuple[str, list[str]]:
    import sys

    import pyspark

    return pyspark.__file__ or "", list(sys.path)


def test_python_workers_import_the_installed_pyspark_not_the_zip(spark: Any) -> None:
    """``local_session`` points ``SPARK_HOME`` at the shadow home (``oncelog.spark.spark_home``):
    the worker's path still names ``<home>/python/lib/pyspark.zip`` (so Spark built it from that
    home), the file is absent, and PySpark comes from the installed package, bytecode cached."""
    import os

    import pyspark

    from oncelog.spark.spark_home import ZIP_NAME

    file_, path = spark.sparkContext.parallelize([0], 1).map(_worker_view).collect()[0]
    real = os.path.dirname(os.path.realpath(pyspark.__file__))
    assert os.path.realpath(file_) == os.path.join(real, "__init__.py"), file_
    zips = [p for p in path if p.endswith(os.sep + ZIP_NAME)]
    assert zips and not any(os.path.exists(p) for p in zips), path
    assert os.environ["SPARK_HOME"] != real


def test_quick_start_reaches_the_driver_jvm(spark: Any) -> None:
    from oncelog.spark import QUICK_START_JAVA_OPTIONS

    args = list(spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
                .getInputArguments())
    assert QUICK_START_JAVA_OPTIONS in args, args


def test_checkpoints_go_through_the_filesystem_based_manager(spark: Any) -> None:
    """``local_session`` (local checkpoints by default) names Spark's FileSystem-based checkpoint
    manager, and Spark took it: every streaming test of this module writes its offsets and commits
    through it."""
    from oncelog.spark import CHECKPOINT_MANAGER_KEY, FS_CHECKPOINT_MANAGERS

    assert spark.conf.get(CHECKPOINT_MANAGER_KEY) == FS_CHECKPOINT_MANAGERS[0]


def committed_with_offsets(bootstrap: str, topic: str) -> list[tuple[int, int, bytes]]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-{uuid.uuid4()}", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    try:
        out = []
        for p in sorted(c.list_topics(topic, timeout=10).topics[topic].partitions):
            end = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            c.assign([TopicPartition(topic, p, 0)])
            while c.position([TopicPartition(topic, p)])[0].offset < end:
                for m in c.consume(50, timeout=0.2):
                    if m.error() is None:
                        out.append((p, m.offset(), m.value()))
        return out
    finally:
        c.close()


def test_batch_read_returns_exactly_the_committed_records_in_a_range(mod_broker: BrokerProcess, spark: Any) -> None:
    bs = mod_broker.bootstrap
    create_topic(bs, "ranged", 2)
    recs = [(b"k%d" % (i % 3), b"v%d" % i) for i in range(90)]
    produce_transactions(bs, "ranged", recs, per_txn=10, abort_every=2, partitions=2)
    truth = committed_with_offsets(bs, "ranged")
    assert sorted(v for _p, _o, v in truth) == sorted(v for _k, v in recs)

    df = spark.read.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "ranged").load()
    rows = df.collect()
    assert sorted(r.value for r in rows) == sorted(v for _k, v in recs)
    assert {(r.partition, r.offset, r.value) for r in rows} == set(truth)
    assert {r.key for r in rows} == {b"k0", b"k1", b"k2"} and all(r.topic == "ranged" for r in rows)

    # A range whose bounds fall on arbitrary offsets (some on markers or aborted records).
    lo = {0: 7, 1: 13}
    hi = {0: 41, 1: 40}
    ranged = (spark.read.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "ranged")
              .option("startingOffsets", json.dumps({"ranged": {str(p): o for p, o in lo.items()}}))
              .option("endingOffsets", json.dumps({"ranged": {str(p): o for p, o in hi.items()}})).load())
    got = sorted((r.partition, r.offset, r.value) for r in ranged.collect())
    want = sorted(t for t in truth if lo[t[0]] <= t[1] < hi[t[0]])
    assert got == want and want


def test_stateful_counts_per_key_are_exact_with_exactly_once(mod_broker: BrokerProcess, spark: Any,
                                                              tmp_path: Path) -> None:
    from oncelog.demo.job import build_query

    bs = mod_broker.bootstrap
    create_topic(bs, "payments", 2)
    create_topic(bs, "totals", 1)
    events = [(f"acct{i % 5}".encode(), json.dumps({"account": f"acct{i % 5}", "amount": i}).encode())
              for i in range(120)]
    produce_transactions(bs, "payments", events, per_txn=15, abort_every=3, partitions=2)
    args = argparse.Namespace(bootstrap=bs, input="payments", output="totals", checkpoint=str(tmp_path / "ck"),
                              guarantee="exactly_once", mode="totals", max_offsets=60, delay_ms=0,
                              progress_topic="progress-pipeline")
    query = build_query(spark, args)
    query.awaitTermination(120)
    assert query.exception() is None
    batches = len(query.recentProgress)
    assert batches >= 2
    last: dict[str, dict[str, int]] = {}
    outputs = read_topic(bs, "totals")
    for _k, v in outputs:
        d = json.loads(v or b"{}")
        last[d["account"]] = d
    want_total: Counter[str] = Counter()
    want_count: Counter[str] = Counter()
    for i in range(120):
        want_total[f"acct{i % 5}"] += i
        want_count[f"acct{i % 5}"] += 1
    assert {a: d["total"] for a, d in last.items()} == dict(want_total)
    assert {a: d["count"] for a, d in last.items()} == dict(want_count)
    # complete mode: every non-empty batch emits each account seen so far exactly once.
    assert len(outputs) <= 5 * batches


def test_headers_are_read_when_asked(mod_broker: BrokerProcess, spark: Any) -> None:
    from confluent_kafka import Producer

    bs = mod_broker.bootstrap
    create_topic(bs, "with-headers", 1)
    p = Producer({"bootstrap.servers": bs})
    p.produce("with-headers", value=b"v", headers=[("trace", b"abc"), ("n", b"1")])
    p.flush(10)
    df = (spark.read.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "with-headers")
          .option("includeHeaders", "true").load())
    (row,) = df.collect()
    assert [(h.key, h.value) for h in row.headers] == [("trace", b"abc"), ("n", b"1")]


def test_foreach_batch_update_mode_counts_once_per_batch(mod_broker: BrokerProcess, spark: Any,
                                                         tmp_path: Path) -> None:
    from oncelog.spark.foreach_batch import SqliteUpsertSink, kafka_foreach_batch

    bs = mod_broker.bootstrap
    create_topic(bs, "clicks", 2)
    create_topic(bs, "click-counts", 1)
    produce_transactions(bs, "clicks", [(b"u%d" % (i % 4), b"c%d" % i) for i in range(80)], per_txn=10,
                         abort_every=4, partitions=2)
    to_kafka = kafka_foreach_batch(bs, "click-counts", "clicks-q", options={"progress.topic": "progress-fb"})
    to_db = SqliteUpsertSink(tmp_path / "counts.sqlite", "counts", "clicks-q", key_columns=["user"])

    def both(df: Any, batch_id: int) -> None:
        df = df.selectExpr("CAST(key AS STRING) AS user", "cnt").cache()
        to_kafka(df.selectExpr("CAST(user AS BINARY) AS key", "CAST(CAST(cnt AS STRING) AS BINARY) AS value"),
                 batch_id)
        to_db(df, batch_id)
        df.unpersist()

    counts = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "clicks")
              .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "30").load()
              .groupBy("key").count().withColumnRenamed("count", "cnt"))
    q = (counts.writeStream.outputMode("update").foreachBatch(both)
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert q.exception() is None
    import sqlite3

    with sqlite3.connect(tmp_path / "counts.sqlite") as conn:
        assert dict(conn.execute("SELECT user, cnt FROM counts").fetchall()) == {f"u{i}": 20 for i in range(4)}
    last = {k: int(v or b"0") for k, v in read_topic(bs, "click-counts")}
    assert last == {b"u%d" % i: 20 for i in range(4)}


def test_one_query_writes_each_batch_to_two_topics_and_two_tables_under_one_query_id(
        mod_broker: BrokerProcess, spark: Any, tmp_path: Path) -> None:
    """The issue's case: ``kafka_foreach_batch(..., query_id="q")`` to two topics and
    ``database_sink(db, table, "q")`` to two tables of one database, each batch; before sink
    identities the second topic got nothing and the second table was never created. The progress
    topic exists with 2 partitions while the batches have 4: the helpers adopt its count."""
    import sqlite3

    from oncelog.spark.foreach_batch import database_sink, kafka_foreach_batch

    bs = mod_broker.bootstrap
    create_topic(bs, "fan-in", 2)
    create_topic(bs, "fan-a", 1)
    create_topic(bs, "fan-b", 1)
    create_topic(bs, "progress-fan", 2)
    records = [(b"k%d" % (i % 9), b"v%d" % i) for i in range(300)]
    produce_transactions(bs, "fan-in", records, per_txn=25, abort_every=4, partitions=2)
    opts = {"progress.topic": "progress-fan"}
    to_a = kafka_foreach_batch(bs, "fan-a", "q", options=opts)
    to_b = kafka_foreach_batch(bs, "fan-b", "q", options=opts)
    assert to_a.settings.progress_partitions == 2
    db = tmp_path / "fan.sqlite"
    t1, t2 = database_sink(str(db), "t1", "q"), database_sink(str(db), "t2", "q")
    skipped: list[int] = []

    def fan_out(df: Any, batch_id: int) -> None:
        df = df.selectExpr("key", "value", "topic", "partition", "offset").repartition(4, "key").cache()
        for sink in (to_a, to_b):
            sink(df.select("key", "value"), batch_id)
            skipped.extend(sink.last_commit.skipped if sink.last_commit else [])
        for table in (t1, t2):
            table(df.selectExpr("topic", "partition", "offset", "CAST(value AS STRING) AS value"), batch_id)
        df.unpersist()

    q = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "fan-in")
         .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "100").load()
         .writeStream.foreachBatch(fan_out).option("checkpointLocation", str(tmp_path / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination(180)
    assert q.exception() is None, q.exception()
    want = Counter(v for _k, v in records)
    for topic in ("fan-a", "fan-b"):
        assert Counter(v for _k, v in read_topic(bs, topic)) == want, topic
    with sqlite3.connect(db) as conn:
        for table in ("t1", "t2"):
            assert Counter(r[0].encode() for r in conn.execute(f"SELECT value FROM {table}")) == want, table
    assert skipped == []
    progress_parts = {p for p, _o, _v in committed_with_offsets(bs, "progress-fan")}
    assert progress_parts == {0, 1}, "4 Spark partitions mapped onto the topic's 2 progress partitions"


def test_a_rewound_checkpoint_fails_the_query_instead_of_dropping_batches(mod_broker: BrokerProcess, spark: Any,
                                                                           tmp_path: Path) -> None:
    """A checkpoint restored from an older copy: Spark re-plans batch 2 while the sink already
    committed batch 3. Before, the sink skipped it silently (its records never reached the output)."""
    import shutil

    from confluent_kafka import Producer

    bs = mod_broker.bootstrap
    create_topic(bs, "rw-in", 1)
    create_topic(bs, "rw-out", 1)
    p = Producer({"bootstrap.servers": bs})
    ck, old = tmp_path / "ck", tmp_path / "ck-old"

    def run() -> Any:
        from pyspark.errors import StreamingQueryException

        q = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "rw-in")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "10").load()
             .selectExpr("key", "value").writeStream.format("oncelog").option("kafka.bootstrap.servers", bs)
             .option("topic", "rw-out").option("progress.topic", "progress-rw")
             .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        except StreamingQueryException:
            pass  # q.exception() has it
        return q

    for round_ in range(2):
        for i in range(20):
            p.produce("rw-in", value=b"%d-%d" % (round_, i))
        p.flush(10)
        assert run().exception() is None
        if round_ == 0:
            shutil.copytree(ck, old)  # batches 0 and 1 committed
    assert len(read_topic(bs, "rw-out")) == 40
    shutil.rmtree(ck)
    shutil.copytree(old, ck)
    q = run()
    assert q.exception() is not None and "rewound" in str(q.exception()), q.exception()
    assert len(read_topic(bs, "rw-out")) == 40


def test_a_value_column_of_another_type_fails_the_query_naming_it(mod_broker: BrokerProcess, spark: Any,
                                                                 tmp_path: Path) -> None:
    """As Spark's Kafka sink: an int value is refused when the query starts (it used to be written as
    its digits), and nothing reaches the output topic; cast, the same query writes."""
    from confluent_kafka import Producer
    from pyspark.errors import StreamingQueryException

    bs = mod_broker.bootstrap
    create_topic(bs, "typed-in", 1)
    create_topic(bs, "typed-out", 1)
    p = Producer({"bootstrap.servers": bs})
    for i in range(5):
        p.produce("typed-in", value=b"%d" % i)
    p.flush(10)

    def run(value: str, ck: str) -> Any:
        q = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("subscribe", "typed-in")
             .option("startingOffsets", "earliest").load().selectExpr(f"{value} AS value")
             .writeStream.format("oncelog").option("kafka.bootstrap.servers", bs).option("topic", "typed-out")
             .option("progress.topic", "progress-typed").option("checkpointLocation", str(tmp_path / ck))
             .trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        except StreamingQueryException:
            pass  # q.exception() has it
        return q

    q = run("CAST(offset AS INT)", "ck1")
    assert q.exception() is not None and "'value' column must be string or binary, not int" in str(q.exception())
    assert read_topic(bs, "typed-out") == []
    assert run("CAST(CAST(offset AS INT) AS STRING)", "ck2").exception() is None
    assert sorted(v for _k, v in read_topic(bs, "typed-out")) == [b"%d" % i for i in range(5)]

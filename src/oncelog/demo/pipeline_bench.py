"""End-to-end pipeline throughput per guarantee, measured side by side in one Spark session.

``python -m oncelog.demo.pipeline_bench [--bootstrap H:P] [--records N]`` prints one JSON line:
``{"exactly_once": {"records": N, "seconds": s, "records_per_s": r}, ..., "ratio_eo_vs_alo": x}``.
Without ``--bootstrap`` it starts our broker in a temporary directory. Each guarantee reads the same
input topic (oncelog source) and writes its own output topic (oncelog sink) with
``trigger(availableNow=True)``; the clock runs from ``start()`` to termination, after the session
and the Python workers are warm (a small warm-up query runs first). Nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from oncelog.testing.broker_process import create_topic, oncelog_broker


def fill(bootstrap: str, topic: str, records: int, size: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    value = b"x" * size
    for i in range(records):
        while True:
            try:
                p.produce(topic, key=b"%d" % (i % 1000), value=value)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def run_one(spark: Any, bootstrap: str, source: str, guarantee: str, work: Path, max_offsets: int) -> float:
    out = f"{source}-out-{guarantee}"
    create_topic(bootstrap, out, 2)
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", source).option("startingOffsets", "earliest"))
    if max_offsets:
        src = src.option("maxOffsetsPerTrigger", str(max_offsets))
    start = time.perf_counter()
    q = (src.load().selectExpr("key", "value").writeStream.format("oncelog")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", out)
         .option("processing.guarantee", guarantee).option("progress.topic", f"{source}-progress-{guarantee}")
         .option("checkpointLocation", str(work / f"ck-{guarantee}")).trigger(availableNow=True).start())
    q.awaitTermination()
    if q.exception() is not None:
        raise RuntimeError(f"{guarantee}: {q.exception()}")
    return time.perf_counter() - start


def measure(bootstrap: str, records: int, size: int, max_offsets: int,
            guarantees: list[str]) -> dict[str, Any]:
    from oncelog.spark import local_session

    work = Path(tempfile.mkdtemp(prefix="oncelog-pipeline-bench-"))
    create_topic(bootstrap, "bench-in", 2)
    create_topic(bootstrap, "bench-warm", 2)
    fill(bootstrap, "bench-in", records, size)
    fill(bootstrap, "bench-warm", 1000, size)
    spark = local_session("oncelog-pipeline-bench")
    try:
        run_one(spark, bootstrap, "bench-warm", "exactly_once", work / "warm", 0)
        result: dict[str, Any] = {}
        for g in guarantees:
            s = run_one(spark, bootstrap, "bench-in", g, work, max_offsets)
            result[g] = {"records": records, "seconds": round(s, 3), "records_per_s": round(records / s)}
    finally:
        spark.stop()
    if "exactly_once" in result and "at_least_once" in result:
        result["ratio_eo_vs_alo"] = round(result["exactly_once"]["records_per_s"]
                                          / result["at_least_once"]["records_per_s"], 3)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap")
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--max-offsets", type=int, default=50_000, help="maxOffsetsPerTrigger (0: one batch)")
    p.add_argument("--guarantees", default="at_least_once,exactly_once,at_most_once")
    args = p.parse_args(argv)
    guarantees = [g for g in args.guarantees.split(",") if g]
    if args.bootstrap:
        print(json.dumps(measure(args.bootstrap, args.records, args.size, args.max_offsets, guarantees)))
        return 0
    d = Path(tempfile.mkdtemp(prefix="oncelog-pipeline-bench-broker-"))
    broker = oncelog_broker(d / "data", log_path=d / "broker.log").start()
    try:
        print(json.dumps(measure(broker.bootstrap, args.records, args.size, args.max_offsets, guarantees)))
    finally:
        broker.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())

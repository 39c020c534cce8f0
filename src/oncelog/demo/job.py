"""A PySpark streaming job run as its own process, so tests and the demo can SIGKILL its driver.

``python -m oncelog.demo.job --bootstrap H:P --input IN --output OUT --checkpoint DIR --guarantee G``
reads ``IN`` with the oncelog source (read_committed) and writes ``OUT`` with the oncelog sink, with
``trigger(availableNow=True)``: it exits 0 once everything committed in ``IN`` when it started is
processed. Restarted with the same checkpoint it resumes (and replays the unfinished batch).

Modes:
- ``passthrough``: each input record's key and value, unchanged.
- ``totals``: input values are JSON ``{"account": a, "amount": n, ...}``; a stateful aggregation
  keeps per account the running total and count, output in complete mode as JSON keyed by account.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def build_query(spark: Any, args: argparse.Namespace) -> Any:
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.input).option("startingOffsets", "earliest"))
    if args.max_offsets:
        src = src.option("maxOffsetsPerTrigger", str(args.max_offsets))
    df = src.load()
    mode = "append"
    if args.mode == "passthrough":
        out = df.selectExpr("key", "value")
    else:
        out = (df.selectExpr("CAST(value AS STRING) AS json")
               .selectExpr("get_json_object(json, '$.account') AS account",
                           "CAST(get_json_object(json, '$.amount') AS BIGINT) AS amount")
               .groupBy("account").agg({"amount": "sum", "*": "count"})
               .withColumnRenamed("sum(amount)", "total").withColumnRenamed("count(1)", "count")
               .selectExpr("CAST(account AS BINARY) AS key",
                           "CAST(to_json(named_struct('account', account, 'total', total, 'count', count)) "
                           "AS BINARY) AS value"))
        mode = "complete"
    writer = (out.writeStream.format("oncelog").outputMode(mode)
              .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.output)
              .option("processing.guarantee", args.guarantee)
              .option("checkpointLocation", args.checkpoint)
              .option("progress.topic", args.progress_topic))
    if args.delay_ms:
        writer = writer.option("fault.delayBeforeCommitMs", str(args.delay_ms))
    return writer.trigger(availableNow=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--guarantee", default="exactly_once")
    p.add_argument("--mode", choices=["passthrough", "totals"], default="passthrough")
    p.add_argument("--max-offsets", type=int, default=0, help="maxOffsetsPerTrigger (0: no limit)")
    p.add_argument("--delay-ms", type=int, default=0, help="pause between flushing and committing each task")
    p.add_argument("--progress-topic", default="oncelog-spark-progress")
    args = p.parse_args(argv)

    from oncelog.spark import local_session

    spark = local_session("oncelog-job")
    try:
        query = build_query(spark, args)
        query.awaitTermination()
        exc = query.exception()
        if exc is not None:
            print(f"query failed: {exc}", file=sys.stderr)
            return 1
        print("done", flush=True)
        return 0
    finally:
        spark.stop()


if __name__ == "__main__":
    sys.exit(main())

"""A PySpark streaming job run as its own process, so tests and the demo can SIGKILL its driver.

``python -m oncelog.demo.job --bootstrap H:P --input IN --output OUT --checkpoint DIR --guarantee G``
reads ``IN`` with the oncelog source (read_committed) and writes ``OUT`` with the oncelog sink, with
``trigger(availableNow=True)``: it exits 0 once everything committed in ``IN`` when it started is
processed. Restarted with the same checkpoint it resumes (and replays the unfinished batch).

Modes:
- ``passthrough``: each input record's key and value, unchanged.
- ``totals``: input values are JSON ``{"account": a, "amount": n, ...}``; a stateful aggregation
  keeps per account the running total and count, output in complete mode as JSON keyed by account.
- ``counts``: the same aggregation in **update** mode through ``foreachBatch``: each micro-batch's
  changed accounts go to ``OUT`` (JSON with the batch id, keyed by account) with
  :func:`~oncelog.spark.foreach_batch.kafka_foreach_batch` under the guarantee, and are upserted
  by account into every ``--database`` URL (``--table``, SQLite or PostgreSQL).

``passthrough`` with ``--totals-output T`` runs both queries in one application (the demo): the
ledger and the running totals, killed and restarted together.

Faults come from :mod:`oncelog.demo.fault_sink`, never from the sink's own options: ``--delay-ms``
pauses each task at its most fragile moment, ``--kill-driver-in-commit B`` kills the driver after
every task of batch ``B`` committed and before Spark's commit log entry, ``--kill-executor-*-commit
B:P`` kill the executor JVM writing partition ``P`` of batch ``B`` (``--master local-cluster[...]``),
and ``--commit-report`` records what each committed batch wrote and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from typing import Any


def _per_account(df: Any) -> Any:
    return (df.selectExpr("CAST(value AS STRING) AS json")
            .selectExpr("get_json_object(json, '$.account') AS account",
                        "CAST(get_json_object(json, '$.amount') AS BIGINT) AS amount")
            .groupBy("account").agg({"amount": "sum", "*": "count"})
            .withColumnRenamed("sum(amount)", "total").withColumnRenamed("count(1)", "count"))


def query_id_for(checkpoint: str) -> str:
    """Stable across restarts of one query (same checkpoint), distinct between queries."""
    import hashlib
    import os

    return "q-" + hashlib.sha256(os.path.abspath(checkpoint).encode()).hexdigest()[:12]


def fault_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``fault.*`` options of ``format("oncelog-faults")`` for this job's arguments (empty: none)."""
    get = vars(args).get
    opts = {}
    if get("delay_ms"):
        opts["fault.delayBeforeCommitMs"] = str(get("delay_ms"))
    kill_batch = get("kill_driver_in_commit")
    if kill_batch is not None and kill_batch >= 0:
        opts["fault.killDriverInCommit"] = str(get("kill_driver_in_commit"))
        opts["fault.driverPgid"] = str(os.getpgrp())
    if get("kill_executor_before_commit"):
        opts["fault.killExecutorBeforeCommit"] = str(get("kill_executor_before_commit"))
    if get("kill_executor_after_commit"):
        opts["fault.killExecutorAfterCommit"] = str(get("kill_executor_after_commit"))
    if get("commit_report"):
        opts["fault.commitReport"] = str(get("commit_report"))
    if opts and get("marker_dir"):
        opts["fault.markerDir"] = str(get("marker_dir"))
    return opts


def counts_query(spark: Any, src: Any, args: argparse.Namespace) -> Any:
    """Update-mode running totals per account into Kafka and the databases, once per batch."""
    from oncelog.demo.fault_sink import FaultHooks, once
    from oncelog.spark.foreach_batch import database_sink, kafka_foreach_batch

    qid = args.query_id or query_id_for(args.checkpoint)
    hooks = FaultHooks.from_options(fault_options(args))
    to_kafka = kafka_foreach_batch(args.bootstrap, args.output, qid, args.guarantee,
                                   {"progress.topic": args.progress_topic}, hooks=hooks)
    to_dbs = [database_sink(url, args.table, qid, key_columns=["account"]) for url in args.database]

    def write(df: Any, batch_id: int) -> None:
        df = df.cache()
        try:
            to_kafka(df.selectExpr(
                "CAST(account AS BINARY) AS key",
                f"CAST(to_json(named_struct('account', account, 'total', total, 'count', count, "
                f"'batch', CAST({int(batch_id)} AS BIGINT))) AS BINARY) AS value"), batch_id)
            for sink in to_dbs:
                sink(df, batch_id)
        finally:
            df.unpersist()
        c = to_kafka.last_commit
        if getattr(args, "commit_report", "") and c is not None:
            with open(args.commit_report, "a") as f:
                f.write(json.dumps({"batch": batch_id, "rows": c.rows, "written": c.written,
                                    "skipped": c.skipped}) + "\n")
        if batch_id == getattr(args, "kill_driver_in_commit", -1) and once(args.marker_dir,
                                                                          f"driver-foreach-{batch_id}"):
            # Every write of the batch is done; Spark has not yet written its commit log entry.
            os.killpg(os.getpgrp(), signal.SIGKILL)

    return (_per_account(src.load()).writeStream.outputMode("update").foreachBatch(write)
            .option("checkpointLocation", args.checkpoint).trigger(availableNow=True).start())


def build_query(spark: Any, args: argparse.Namespace) -> Any:
    src = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", args.bootstrap)
           .option("subscribe", args.input).option("startingOffsets", "earliest"))
    if args.max_offsets:
        src = src.option("maxOffsetsPerTrigger", str(args.max_offsets))
    if args.mode == "counts":
        return counts_query(spark, src, args)
    df = src.load()
    mode = "append"
    if args.mode == "passthrough":
        out = df.selectExpr("key", "value")
    else:
        out = (_per_account(df)
               .selectExpr("CAST(account AS BINARY) AS key",
                           "CAST(to_json(named_struct('account', account, 'total', total, 'count', count)) "
                           "AS BINARY) AS value"))
        mode = "complete"
    faults = fault_options(args)
    writer = (out.writeStream.format("oncelog-faults" if faults else "oncelog").outputMode(mode)
              .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.output)
              .option("processing.guarantee", args.guarantee)
              .option("checkpointLocation", args.checkpoint)
              .option("progress.topic", args.progress_topic))
    for k, v in faults.items():
        writer = writer.option(k, v)
    return writer.trigger(availableNow=True).start()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--guarantee", default="exactly_once")
    p.add_argument("--mode", choices=["passthrough", "totals", "counts"], default="passthrough")
    p.add_argument("--max-offsets", type=int, default=0, help="maxOffsetsPerTrigger (0: no limit)")
    p.add_argument("--delay-ms", type=int, default=0, help="pause between flushing and committing each task")
    p.add_argument("--kill-driver-in-commit", type=int, default=-1, metavar="BATCH",
                   help="SIGKILL the driver after every task of BATCH committed, before Spark's commit log entry")
    p.add_argument("--kill-executor-before-commit", default="", metavar="BATCH:PARTITION",
                   help="SIGKILL the executor writing PARTITION of BATCH just before its transaction commits")
    p.add_argument("--kill-executor-after-commit", default="", metavar="BATCH:PARTITION",
                   help="SIGKILL the executor writing PARTITION of BATCH after it committed, before Spark sees it")
    p.add_argument("--marker-dir", default="", help="where the once-only kill markers go (default: no markers)")
    p.add_argument("--commit-report", default="", help="append one JSON line per committed batch to this file")
    p.add_argument("--master", default="", help="Spark master (default local[2]), e.g. local-cluster[2,1,1024]")
    p.add_argument("--progress-topic", default="oncelog-spark-progress")
    p.add_argument("--database", action="append", default=[],
                   help="counts mode: also upsert totals into this database URL (sqlite:///path, postgresql://…)")
    p.add_argument("--query-id", default="", help="counts mode: stable query id (default: from the checkpoint path)")
    p.add_argument("--table", default="account_totals", help="counts mode: the databases' table")
    p.add_argument("--totals-output", default="",
                   help="passthrough mode: also run the counts query (same input) into this topic, in the same "
                        "Spark application, checkpoint CHECKPOINT-totals")
    args = p.parse_args(argv)

    from oncelog.demo.fault_sink import register
    from oncelog.spark import local_session

    if (args.kill_driver_in_commit >= 0 or args.kill_executor_before_commit or args.kill_executor_after_commit) \
            and not args.marker_dir:
        p.error("kills need --marker-dir (each kill happens once, across restarts)")
    # quick_start: the fault lab's jobs are short and restarted often (C1 only; see local_session).
    spark = local_session("oncelog-job", master=args.master or None, quick_start=True)
    register(spark)
    try:
        queries = [build_query(spark, args)]
        if args.mode == "passthrough" and args.totals_output:
            report = args.commit_report and args.commit_report + "-totals"
            totals_args = argparse.Namespace(**{**vars(args), "mode": "counts", "output": args.totals_output,
                                                "checkpoint": args.checkpoint.rstrip("/") + "-totals",
                                                "commit_report": report})
            queries.append(build_query(spark, totals_args))
        for query in queries:
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

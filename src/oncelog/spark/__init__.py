"""oncelog.spark: a Kafka source and an exactly-once Kafka sink for PySpark, as Python data sources.

Usage::

    from oncelog.spark import register
    register(spark)
    df = (spark.readStream.format("oncelog").option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "payments").load())
    (df.writeStream.format("oncelog").option("kafka.bootstrap.servers", "127.0.0.1:9092")
       .option("topic", "out").option("processing.guarantee", "exactly_once")
       .option("checkpointLocation", "/tmp/ckpt").start())

This package talks to any Kafka-protocol broker through confluent-kafka and imports no broker
module. PySpark is imported only when a Spark entry point is used.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from oncelog.spark.guarantees import Guarantee

__all__ = ["Guarantee", "OncelogDataSource", "local_session", "register"]

try:  # pragma: no cover - exercised only with pyspark installed
    from pyspark.sql.datasource import DataSource
except ImportError:  # pragma: no cover
    DataSource = object  # type: ignore[assignment,misc]


class OncelogDataSource(DataSource):
    """``format("oncelog")``: streaming and batch reads, streaming writes."""

    @classmethod
    def name(cls) -> str:
        return "oncelog"

    def schema(self) -> str:
        from oncelog.spark.options import get_bool
        from oncelog.spark.source import schema_ddl

        return schema_ddl(get_bool(self.options, "includeHeaders", False))

    def streamReader(self, schema: Any) -> Any:
        from oncelog.spark.source import KafkaStreamReader

        return KafkaStreamReader(self.options)

    def reader(self, schema: Any) -> Any:
        from oncelog.spark.source import KafkaBatchReader

        return KafkaBatchReader(self.options)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:
        from oncelog.spark.sink import KafkaStreamWriter

        return KafkaStreamWriter(self.options)


def register(spark: Any) -> None:
    """Register the ``oncelog`` data source on a SparkSession."""
    spark.dataSource.register(OncelogDataSource)


def local_session(app_name: str = "oncelog", cores: int = 2, extra: dict[str, str] | None = None,
                  master: str | None = None) -> Any:
    """A loopback-only SparkSession with small shuffles, ``oncelog`` registered: ``local[cores]``, or
    ``master`` such as ``local-cluster[2,1,1024]`` (two executor JVMs of one core and 1 GB each).

    Sets ``PYSPARK_PYTHON`` to this interpreter so executors import the same oncelog.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    # Without it Spark resolves the hostname and may bind executors' services to a public interface.
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master or f"local[{cores}]").appName(app_name)
               .config("spark.sql.shuffle.partitions", str(cores))
               .config("spark.default.parallelism", str(cores))
               .config("spark.ui.enabled", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.streaming.stopGracefullyOnShutdown", "false")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true"))
    for k, v in (extra or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark

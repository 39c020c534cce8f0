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

import functools
import glob
import os
import sys
import zipfile
from typing import Any

from oncelog.spark.guarantees import Guarantee

__all__ = ["Guarantee", "OncelogDataSource", "local_session", "register"]

#: JVM options of ``local_session(quick_start=True)``: C1 only, no C2 (see there).
QUICK_START_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

#: The Spark setting that names the streaming checkpoint manager, and the FileSystem-based manager's
#: class under the names Spark versions give it (4.3 moved it into ``checkpointing``).
CHECKPOINT_MANAGER_KEY = "spark.sql.streaming.checkpointFileManagerClass"
FS_CHECKPOINT_MANAGERS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
    "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager",
)

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
        """The rows' schema is checked first, when the query starts (``sink.check_output_schema``)."""
        from oncelog.spark.options import get_option
        from oncelog.spark.sink import check_output_schema

        check_output_schema(schema, topic_option=bool(get_option(self.options, "topic")))
        return self._stream_writer()

    def _stream_writer(self) -> Any:
        """The sink's writer; the fault lab's and the bench's data sources return their own."""
        from oncelog.spark.sink import KafkaStreamWriter

        return KafkaStreamWriter(self.options)


def register(spark: Any) -> None:
    """Register the ``oncelog`` data source on a SparkSession."""
    spark.dataSource.register(OncelogDataSource)


@functools.cache
def fs_checkpoint_manager(spark_home: str) -> str | None:
    """The FileSystem-based checkpoint manager's class name in ``spark_home``'s ``spark-sql`` jar,
    or None if that Spark has none of the names this module knows."""
    for jar in sorted(glob.glob(os.path.join(spark_home, "jars", "spark-sql_*.jar"))):
        with zipfile.ZipFile(jar) as z:
            names = set(z.namelist())
        for cls in FS_CHECKPOINT_MANAGERS:
            if cls.replace(".", "/") + ".class" in names:
                return cls
    return None


def local_session(app_name: str = "oncelog", cores: int = 2, extra: dict[str, str] | None = None,
                  master: str | None = None, installed_pyspark_in_workers: bool = True,
                  quick_start: bool = False, local_checkpoints: bool = True) -> Any:
    """A loopback-only SparkSession with small shuffles, ``oncelog`` registered: ``local[cores]``, or
    ``master`` such as ``local-cluster[2,1,1024]`` (two executor JVMs of one core and 1 GB each).

    Sets ``PYSPARK_PYTHON`` to this interpreter so executors import the same oncelog. With
    ``installed_pyspark_in_workers`` (and no ``SPARK_HOME`` of the user's), Spark's Python workers
    import the installed PySpark, whose bytecode is cached, instead of compiling it from
    ``pyspark.zip`` in every worker process (:mod:`oncelog.spark.spark_home`).

    ``quick_start`` is for short jobs (the fault lab's, the tests'): the driver's and executors' JVMs
    compile with C1 only (``-XX:TieredStopAtLevel=1``). A four-batch job's JVM otherwise spends
    about 15 CPU-seconds in the C2 compiler on code it runs a few times; a long pipeline wants C2.

    ``local_checkpoints`` says the queries' checkpoint locations are on this machine's file system
    (the usual case for a local session). Spark's default checkpoint manager then goes through
    Hadoop's ``FileContext``, whose local rename starts ``readlink`` processes (about seven per log
    file here) to look for symbolic links. On the driver's path between batches, ``walCommit`` and
    ``commitOffsets`` took 60-80 ms each per micro-batch that way, and 20-45 ms with the
    FileSystem-based manager, which renames without starting a process. On a local file system
    both managers check that the target is absent and then rename (neither is atomic there), so a
    second writer of the same batch is refused the same way. On HDFS only the default's rename is
    atomic: pass ``local_checkpoints=False`` for checkpoints there. A
    ``spark.sql.streaming.checkpointFileManagerClass`` in ``extra`` wins.

    All of these act only when this call starts Spark: with a session already running in the process,
    ``getOrCreate`` returns it with the JVM options it started with. And ``SPARK_HOME`` set by an
    earlier call stays set: ``installed_pyspark_in_workers=False`` then leaves it as it is.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    if installed_pyspark_in_workers:
        from oncelog.spark.spark_home import worker_friendly_spark_home

        home = worker_friendly_spark_home()
        if home is not None:
            os.environ["SPARK_HOME"] = str(home)
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
    conf = dict(extra or {})
    if local_checkpoints and CHECKPOINT_MANAGER_KEY not in conf:
        import pyspark

        manager = fs_checkpoint_manager(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__))
        if manager is not None:
            conf[CHECKPOINT_MANAGER_KEY] = manager
    if quick_start:
        for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
            conf[key] = " ".join(filter(None, [conf.get(key, ""), QUICK_START_JAVA_OPTIONS]))
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark

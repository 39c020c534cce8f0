"""The sink's progress log: which (query, Spark partition) committed which micro-batch.

A progress record is a Kafka record in a small topic (default ``oncelog-spark-progress``):
key ``"{query_id}/{partition_id}"``, value JSON ``{"batch_id": b, "rows": n}``. The exactly-once sink
writes it inside the same transaction as the partition's output, so the record is visible (under
read_committed) if and only if the output is. Spark partition ``p`` writes to progress partition
``p % progress_partitions``, so with at least as many progress partitions as Spark partitions no
two live transactional ids share a progress partition and no task waits on another's transaction.

Invariant: :meth:`ProgressLog.last_committed` returns the highest batch id whose transaction
committed before the call started, provided that any transaction of the caller's own transactional
id has completed (the producer's ``init_transactions()`` guarantees that). It reads with
read_committed up to the high watermark taken at the start, so it waits until every transaction
open at that moment in the progress partition has committed or aborted.
"""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping
from typing import Any

from oncelog.spark.ranges import consume_range

DEFAULT_TOPIC = "oncelog-spark-progress"
DEFAULT_PARTITIONS = 16

# Per executor process: (bootstrap, topic, partition) -> (next offset, {key: last batch id}). The
# committed prefix of a partition never changes, so reading on from where the last task stopped is
# exact; the cache only saves rereading.
_CACHE: dict[tuple[str, str, int], tuple[int, dict[str, int]]] = {}
_CACHE_LOCK = threading.Lock()


def progress_key(query_id: str, partition_id: int) -> str:
    return f"{query_id}/{partition_id}"


def progress_value(batch_id: int, rows: int) -> bytes:
    return json.dumps({"batch_id": batch_id, "rows": rows}, separators=(",", ":")).encode()


class ProgressLog:
    def __init__(self, conf: Mapping[str, Any], topic: str = DEFAULT_TOPIC,
                 partitions: int = DEFAULT_PARTITIONS, timeout_s: float = 120.0) -> None:
        self.conf = {k: v for k, v in conf.items() if k != "isolation.level"}
        self.topic = topic
        self.partitions = partitions
        self.timeout_s = timeout_s

    def partition_for(self, partition_id: int) -> int:
        return partition_id % self.partitions

    def ensure_topic(self) -> None:
        """Create the progress topic if it is missing (an existing one is used as it is)."""
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({k: v for k, v in self.conf.items()
                             if k in ("bootstrap.servers", "security.protocol", "client.id")
                             or k.startswith(("sasl.", "ssl."))})
        md = admin.list_topics(timeout=self.timeout_s)
        existing = md.topics.get(self.topic)
        if existing is not None and existing.error is None:
            self.partitions = len(existing.partitions)
            return
        try:
            admin.create_topics([NewTopic(self.topic, self.partitions, 1)])[self.topic].result(timeout=self.timeout_s)
        except Exception as exc:  # a concurrent task may have created it
            if "already exists" not in str(exc).lower() and "TOPIC_ALREADY_EXISTS" not in str(exc):
                raise

    def last_committed(self, query_id: str, partition_id: int) -> int:
        """Highest committed batch id for (query, partition), or -1."""
        from confluent_kafka import Consumer, TopicPartition

        part = self.partition_for(partition_id)
        cache_key = (str(self.conf.get("bootstrap.servers")), self.topic, part)
        with _CACHE_LOCK:
            start, seen = _CACHE.get(cache_key, (0, {}))
            seen = dict(seen)
        base = {**self.conf, "group.id": f"oncelog-progress-{uuid.uuid4()}", "enable.auto.commit": False}
        probe = Consumer({**base, "isolation.level": "read_uncommitted"})
        try:
            _low, high_watermark = probe.get_watermark_offsets(TopicPartition(self.topic, part),
                                                               timeout=self.timeout_s, cached=False)
        finally:
            probe.close()
        position = start
        if position < high_watermark:
            reader = Consumer({**base, "isolation.level": "read_committed", "enable.partition.eof": True,
                               "auto.offset.reset": "earliest"})
            try:
                for msgs in consume_range(reader, self.topic, part, start, high_watermark, self.timeout_s, 1000,
                                          poll_timeout_s=0.1, what=f"progress partition {self.topic}-{part}"):
                    for m in msgs:
                        key = (m.key() or b"").decode()
                        batch = int(json.loads(m.value() or b"{}").get("batch_id", -1))
                        if batch > seen.get(key, -1):
                            seen[key] = batch
                position = high_watermark
            finally:
                reader.close()
        with _CACHE_LOCK:
            cached = _CACHE.get(cache_key)
            if cached is None or cached[0] < position:
                _CACHE[cache_key] = (position, seen)
        return seen.get(progress_key(query_id, partition_id), -1)

"""DeleteRecords and DescribeLogDirs: the admin APIs about a partition's stored data.

DeleteRecords moves a partition's log start offset (``PartitionLog.delete_records``, persisted in
``log-start-offset`` before any segment is deleted) and answers the new low watermark. As Kafka:
offset -1 means the high watermark, an offset past the high watermark (or below -1) is
OFFSET_OUT_OF_RANGE, internal topics are INVALID_TOPIC_EXCEPTION, a topic whose cleanup.policy has
no ``delete`` is POLICY_VIOLATION, and it needs DELETE on the topic. The high watermark is the one
clients see (``PartitionLog.readable_end``): where every append must be durable first
(flush_every_append, flush.messages=1) it is what is fsynced, as Kafka's moves only after the flush
inside the append. (Until 2026-11-28 an offset up to the log end was taken: Fetch said high
watermark 3, DeleteRecords(t-0, 4) answered low watermark 4, and a power cut then took offset 3
and left the log start past the log end; probe s37, ``s9_deleterecords_bound.py``.) A single node has no followers
to wait for, so the answer is immediate (the request's timeout is not used).

DescribeLogDirs (DESCRIBE on the cluster) reports the one data directory: each partition's size
in bytes and an offset lag of 0 (nothing is being moved between directories), v4's total and
usable bytes from the file system.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.authz import Op, R, allowed
from oncelog.storage import errors as storage_errors
from oncelog.storage.fileio import StorageOfflineError

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

HIGH_WATERMARK = -1


def _deletes(cleanup_policy: Any) -> bool:
    """Whether a cleanup.policy value (a string or a collection of policies) includes delete."""
    parts = cleanup_policy.split(",") if isinstance(cleanup_policy, str) else list(cleanup_policy)
    return "delete" in [str(p).strip() for p in parts]


def handle_delete_records(broker: Broker, req: Request) -> dict[str, Any]:
    topics_out = []
    for t in req.body.topics:
        info = broker.logs.topics().get(t.name)
        may_delete = allowed(broker, req, Op.DELETE, R.TOPIC, t.name)
        parts = []
        for p in t.partitions:
            entry: dict[str, Any] = {"partition_index": p.partition_index, "low_watermark": -1,
                                     "error_code": ErrorCode.none}
            plog = broker.logs.get_partition(t.name, p.partition_index)
            if not may_delete:
                entry["error_code"] = ErrorCode.topic_authorization_failed
            elif info is None or plog is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
            elif info.is_internal:
                entry["error_code"] = ErrorCode.invalid_topic_exception
            elif not _deletes(plog.config.cleanup_policy):
                entry["error_code"] = ErrorCode.policy_violation
            else:
                high_watermark = plog.readable_end
                offset = high_watermark if p.offset == HIGH_WATERMARK else p.offset
                try:
                    if offset > high_watermark:  # the log end bounds ``delete_records`` itself
                        raise storage_errors.OffsetOutOfRangeError(
                            f"Cannot increment the log start offset to {offset} of partition {t.name}-"
                            f"{p.partition_index} since it is larger than the high watermark {high_watermark}")
                    before = plog.log_start_offset
                    entry["low_watermark"] = plog.delete_records(offset)
                    if entry["low_watermark"] != before:
                        log.info("%s-%d: records before %d deleted (DeleteRecords)", t.name, p.partition_index,
                                 entry["low_watermark"])
                        broker.notify_append((t.name, p.partition_index))  # waiting fetches see it now
                except storage_errors.OffsetOutOfRangeError:
                    entry["error_code"] = ErrorCode.offset_out_of_range
                except StorageOfflineError as exc:
                    broker.storage_failed(exc)
                    entry["error_code"] = ErrorCode.kafka_storage_error
            parts.append(entry)
        topics_out.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics_out}


def handle_describe_log_dirs(broker: Broker, req: Request) -> dict[str, Any]:
    if not allowed(broker, req, Op.DESCRIBE, R.CLUSTER):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed, "results": []}
    logs = broker.logs
    wanted: dict[str, set[int]] | None = None
    if req.body.topics is not None:
        wanted = {}
        for t in req.body.topics:
            wanted.setdefault(t.topic, set()).update(t.partitions)
    log_dir = str(broker.config.data_dir.resolve())
    if logs.dir_state.offline_reason is not None:
        return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [
            {"error_code": ErrorCode.kafka_storage_error, "log_dir": log_dir, "topics": [],
             "total_bytes": -1, "usable_bytes": -1}]}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), plog in sorted(logs.partitions().items()):
        if wanted is not None and partition not in wanted.get(topic, ()):
            continue
        by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_size": plog.size_in_bytes,
                                               "offset_lag": 0, "is_future_key": False})
    try:
        st = os.statvfs(broker.config.data_dir)
        total, usable = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        total = usable = -1
    return {"throttle_time": 0, "error_code": ErrorCode.none, "results": [
        {"error_code": ErrorCode.none, "log_dir": log_dir,
         "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
         "total_bytes": total, "usable_bytes": usable}]}

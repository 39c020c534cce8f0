"""ListOffsets: earliest (-2), latest (-1, the LSO for read_committed), max timestamp (-3, v7+) and
offsets by timestamp. An answer at or past the LSO (read_committed) or high watermark is -1, as in
Kafka's Partition.fetchOffsetForTimestamp. v4+: the request's current leader epoch is checked and
each answer carries the epoch of the offset (the current one for latest)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.authz import Op, R, allowed
from oncelog.server.handlers.leader_epochs import leader_epoch_error

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
READ_COMMITTED = 1


def handle_list_offsets(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    isolation_level = getattr(body, "isolation_level", 0)
    topics_out = []
    asked = Counter((t.name, p.partition_index) for t in body.topics for p in t.partitions)
    for t in body.topics:
        parts = []
        for p in t.partitions:
            plog = broker.logs.get_partition(t.name, p.partition_index)
            entry: dict[str, Any] = {"partition_index": p.partition_index, "error_code": ErrorCode.none,
                                     "timestamp": -1, "offset": -1, "leader_epoch": -1}
            if asked[t.name, p.partition_index] > 1:  # Kafka: every copy of a partition asked twice
                entry["error_code"] = ErrorCode.invalid_request
            elif not allowed(broker, req, Op.DESCRIBE, R.TOPIC, t.name):
                entry["error_code"] = ErrorCode.topic_authorization_failed
            elif plog is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
            elif (epoch_error := leader_epoch_error(plog, getattr(p, "current_leader_epoch", -1))) != 0:
                entry["error_code"] = epoch_error
            elif p.timestamp == LATEST_TIMESTAMP:
                entry["offset"] = plog.visible_end(isolation_level == READ_COMMITTED)
                entry["leader_epoch"] = plog.leader_epoch
            elif p.timestamp == EARLIEST_TIMESTAMP:
                entry["offset"] = plog.log_start_offset
                entry["leader_epoch"] = plog.epochs.epoch_for_offset(plog.log_start_offset)
            elif p.timestamp < 0 and not (p.timestamp == MAX_TIMESTAMP and req.api_version >= 7):
                entry["error_code"] = ErrorCode.unsupported_version
            else:
                found = (plog.offset_for_max_timestamp() if p.timestamp == MAX_TIMESTAMP
                         else plog.offset_for_timestamp(p.timestamp))
                if found is not None:
                    offset, ts = found
                    bound = plog.visible_end(isolation_level == READ_COMMITTED)
                    if offset < bound:
                        entry["offset"], entry["timestamp"] = offset, ts
                        entry["leader_epoch"] = plog.epochs.epoch_for_offset(offset)
            parts.append(entry)
        topics_out.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics_out}

"""OffsetForLeaderEpoch (KIP-101, KIP-279, KIP-320) and the leader-epoch checks Fetch and
ListOffsets share.

The broker is the leader of every partition; its leader epoch is bumped at each start
(``LogManager._take_leadership``) and reported in Metadata v7+. A request that names the leader
epoch it believes current is checked as Kafka's ``Partition.getLocalLog`` does: an older epoch is
FENCED_LEADER_EPOCH (the client must refresh its metadata), a newer one UNKNOWN_LEADER_EPOCH (this
broker has not caught up: it cannot happen here but is answered as Kafka would), -1 is not checked.
OffsetForLeaderEpoch answers, per partition, the largest epoch <= the requested one and the offset
where it ended (``LeaderEpochCache.end_offset_for``): a consumer whose position is past that offset
knows the log lost records it had read (truncation detection).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.authz import Op, R, allowed

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

NO_EPOCH = -1


def leader_epoch_error(plog: Any, current_leader_epoch: int) -> ErrorCode:
    if current_leader_epoch == NO_EPOCH:
        return ErrorCode.none
    if current_leader_epoch < plog.leader_epoch:
        return ErrorCode.fenced_leader_epoch
    if current_leader_epoch > plog.leader_epoch:
        return ErrorCode.unknown_leader_epoch
    return ErrorCode.none


def handle_offset_for_leader_epoch(broker: Broker, req: Request) -> dict[str, Any]:
    topics_out = []
    for t in req.body.topics:
        may_describe = allowed(broker, req, Op.DESCRIBE, R.TOPIC, t.topic)
        parts = []
        for p in t.partitions:
            entry: dict[str, Any] = {"partition": p.partition, "error_code": ErrorCode.none,
                                     "leader_epoch": NO_EPOCH, "end_offset": -1}
            plog = broker.logs.get_partition(t.topic, p.partition)
            if not may_describe:
                entry["error_code"] = ErrorCode.topic_authorization_failed
            elif plog is None:
                entry["error_code"] = ErrorCode.unknown_topic_or_partition
            else:
                entry["error_code"] = leader_epoch_error(plog, p.current_leader_epoch)
                if entry["error_code"] == ErrorCode.none:
                    entry["leader_epoch"], entry["end_offset"] = plog.end_offset_for_epoch(p.leader_epoch)
            parts.append(entry)
        topics_out.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time": 0, "topics": topics_out}

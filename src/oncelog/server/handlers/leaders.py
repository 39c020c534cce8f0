"""ElectLeaders (KIP-183, KIP-460): answered as a one-broker Kafka cluster answers it.

This broker is the only replica, and so the preferred leader, of every partition it has: no election
is ever needed. As Kafka's controller (ControllerApis.handleElectLeaders, then
ReplicationControlManager.electLeaders):

- without ALTER on the cluster: CLUSTER_AUTHORIZATION_FAILED, at the top level and for every
  partition named (none for a request about all partitions);
- an election type other than PREFERRED (0) or UNCLEAN (1): INVALID_REQUEST the same way;
- each partition named: ELECTION_NOT_NEEDED if it exists, else UNKNOWN_TOPIC_OR_PARTITION;
- all partitions (a null list): every topic, with no partition results (the partitions whose
  election was not needed are left out).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.authz import Op, R, allowed
from oncelog.storage.log_manager import MAX_TOPIC_NAME

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

PREFERRED, UNCLEAN = 0, 1
NOT_NEEDED_MESSAGE = "Leader election not needed for topic partition."


def _answer(code: ErrorCode, results: list[dict[str, Any]]) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "replica_election_results": results}


def _every_partition(topics: Any, code: ErrorCode, message: str | None) -> list[dict[str, Any]]:
    return [{"topic": t.topic, "partition_result": [
        {"partition_id": p, "error_code": code, "error_message": message} for p in t.partitions]}
        for t in topics or ()]


def handle_elect_leaders(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    topics = body.topic_partitions
    if not allowed(broker, req, Op.ALTER, R.CLUSTER):
        code = ErrorCode.cluster_authorization_failed
        return _answer(code, _every_partition(topics, code, "Cluster authorization failed."))
    election_type = getattr(body, "election_type", PREFERRED)  # v0 knows only the preferred election
    if election_type not in (PREFERRED, UNCLEAN):
        code = ErrorCode.invalid_request
        return _answer(code, _every_partition(topics, code, f"Unknown election type {election_type}"))
    if topics is None:
        return _answer(ErrorCode.none, [{"topic": name, "partition_result": []}
                                        for name in sorted(broker.logs.topics())])
    results = []
    for t in topics:
        known = t.topic in broker.logs.topics()
        partitions = []
        for p in t.partitions:
            if broker.logs.get_partition(t.topic, p) is not None:
                code, message = ErrorCode.election_not_needed, NOT_NEEDED_MESSAGE
            else:
                # Kafka's messages, naming the topic when it could be one (a request may name a longer
                # one, whose message would not fit a string of the response)
                code = ErrorCode.unknown_topic_or_partition
                name = t.topic if len(t.topic) <= MAX_TOPIC_NAME else "a topic with a name too long"
                message = f"No such partition as {name}-{p}" if known else f"No such topic as {name}"
            partitions.append({"partition_id": p, "error_code": code, "error_message": message})
        results.append({"topic": t.topic, "partition_result": partitions})
    return _answer(ErrorCode.none, results)

"""Consumer groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
TxnOffsetCommit, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.

JoinGroup and SyncGroup wait for the rebalance: the coordinator calls back, which resolves a future
this handler awaits. Records the coordinator returns go through ``Coordination.apply_group_records``
(append to the group's ``__consumer_offsets`` partition, then replay) before the response is sent.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from oncelog.coordinator.group.group_coordinator import JoinResult, SyncResult
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request, td_ms

if TYPE_CHECKING:
    from oncelog.server.broker import Broker


def _join_body(r: JoinResult) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": r.error, "generation_id": r.generation_id,
            "protocol_type": r.protocol_type, "protocol_name": r.protocol_name or "", "leader": r.leader,
            "member_id": r.member_id, "skip_assignment": False,
            "members": [{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in r.members]}


async def handle_join_group(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()

    def respond(result: JoinResult) -> None:
        if not fut.done():
            fut.set_result(result)

    session = td_ms(b.session_timeout)
    rebalance = td_ms(getattr(b, "rebalance_timeout", b.session_timeout))
    c.groups.join_group(b.group_id, b.member_id, getattr(b, "group_instance_id", None), req.client_id or "",
                        "/127.0.0.1", session, rebalance, b.protocol_type,
                        [(p.name, p.metadata) for p in b.protocols], req.api_version >= 4, respond)
    c.flush_group_records()
    result = await fut
    c.flush_group_records()
    if req.api_version < 4 and result.error == ErrorCode.member_id_required:  # cannot happen, kept for clarity
        result.error = ErrorCode.unknown_member_id
    return _join_body(result)


async def handle_sync_group(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    fut: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()

    def respond(result: SyncResult) -> None:
        if not fut.done():
            fut.set_result(result)

    c.groups.sync_group(b.group_id, b.generation_id, b.member_id, getattr(b, "group_instance_id", None),
                        [(a.member_id, a.assignment) for a in b.assignments], respond)
    c.flush_group_records()
    r = await fut
    c.flush_group_records()
    return {"throttle_time": 0, "error_code": r.error, "protocol_type": r.protocol_type,
            "protocol_name": r.protocol_name, "assignment": r.assignment}


def handle_heartbeat(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    code = broker.coordination.groups.heartbeat(b.group_id, b.generation_id, b.member_id,
                                                getattr(b, "group_instance_id", None))
    return {"throttle_time": 0, "error_code": code}


def handle_leave_group(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    members: list[tuple[str, str | None]] = (
        [(m.member_id, m.group_instance_id) for m in b.members] if hasattr(b, "members") else [(b.member_id, None)])
    top, results = c.groups.leave_group(b.group_id, members)
    c.flush_group_records()
    return {"throttle_time": 0, "error_code": top if req.api_version < 3 else ErrorCode.none,
            "members": [{"member_id": m, "group_instance_id": i, "error_code": e} for m, i, e in results]}


def _offsets_in(topics: Any) -> list[tuple[str, int, int, int, str | None]]:
    return [(t.name, p.partition_index, p.committed_offset, getattr(p, "committed_leader_epoch", -1),
             p.committed_metadata) for t in topics for p in t.partitions]


def _by_topic(errors: dict[tuple[str, int], ErrorCode]) -> list[dict[str, Any]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), code in errors.items():
        out.setdefault(topic, []).append({"partition_index": partition, "error_code": code})
    return [{"name": t, "partitions": ps} for t, ps in out.items()]


def _split_unknown(broker: Broker, offsets: list[tuple[str, int, int, int, str | None]]
                   ) -> tuple[list[tuple[str, int, int, int, str | None]], dict[tuple[str, int], ErrorCode]]:
    """Kafka's KafkaApis check before the coordinator: offsets for partitions that do not exist are
    answered UNKNOWN_TOPIC_OR_PARTITION, and only the rest reach the (sans-IO) coordinator."""
    known = [o for o in offsets if broker.logs.get_partition(o[0], o[1]) is not None]
    unknown = {(o[0], o[1]): ErrorCode.unknown_topic_or_partition for o in offsets
               if broker.logs.get_partition(o[0], o[1]) is None}
    return known, unknown


def _in_request_order(offsets: list[tuple[str, int, int, int, str | None]],
                      *results: dict[tuple[str, int], ErrorCode]) -> dict[tuple[str, int], ErrorCode]:
    merged: dict[tuple[str, int], ErrorCode] = {}
    for r in results:
        merged.update(r)
    return {(t, p): merged[(t, p)] for t, p, *_ in offsets}


def handle_offset_commit(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    offsets = _offsets_in(b.topics)
    known, errors = _split_unknown(broker, offsets)
    if known:
        result = c.groups.offset_commit(b.group_id, b.generation_id_or_member_epoch, b.member_id,
                                        getattr(b, "group_instance_id", None), known)
        if result.records:
            c.apply_group_records(b.group_id, result.records)
        errors = _in_request_order(offsets, errors, result.errors)
    return {"throttle_time": 0, "topics": _by_topic(errors)}


def handle_txn_offset_commit(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    offsets = _offsets_in(b.topics)
    known, unknown = _split_unknown(broker, offsets)
    if not known:
        return {"throttle_time": 0, "topics": _by_topic(unknown)}
    tp = c.offsets_partition_for(b.group_id)
    code = c.txn.is_partition_in_transaction(b.producer_id, b.producer_epoch, *tp)
    if code == ErrorCode.invalid_producer_epoch:
        code = ErrorCode.producer_fenced if req.api_version >= 3 else ErrorCode.invalid_producer_epoch
    if code != ErrorCode.none:
        return {"throttle_time": 0, "topics": _by_topic(
            _in_request_order(offsets, unknown, {(t, p): code for t, p, *_ in known}))}
    result = c.groups.txn_offset_commit(b.group_id, b.producer_id, getattr(b, "generation_id", -1),
                                        getattr(b, "member_id", ""), getattr(b, "group_instance_id", None), known)
    if result.records:
        error = c.apply_txn_offset_records(b.group_id, b.producer_id, b.producer_epoch, result.records)
        if error != ErrorCode.none:
            result.errors = dict.fromkeys(result.errors, error)
    return {"throttle_time": 0, "topics": _by_topic(_in_request_order(offsets, unknown, result.errors))}


def _fetch_group(broker: Broker, group_id: str, topics: Any, require_stable: bool) -> list[dict[str, Any]]:
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    found = broker.coordination.groups.offset_fetch(group_id, wanted, require_stable)
    out: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (om, code) in found.items():
        out.setdefault(topic, []).append({
            "partition_index": partition, "committed_offset": om.offset if om else -1,
            "committed_leader_epoch": om.leader_epoch if om else -1, "metadata": om.metadata if om else "",
            "error_code": code})
    return [{"name": t, "partitions": ps} for t, ps in out.items()]


def handle_offset_fetch(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    require_stable = getattr(b, "require_stable", False)
    if hasattr(b, "groups"):
        return {"throttle_time": 0, "groups": [
            {"group_id": g.group_id, "error_code": ErrorCode.none,
             "topics": _fetch_group(broker, g.group_id, g.topics, require_stable)} for g in b.groups]}
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "topics": _fetch_group(broker, b.group_id, b.topics, require_stable)}


def handle_list_groups(broker: Broker, req: Request) -> dict[str, Any]:
    groups = broker.coordination.groups.list_groups(getattr(req.body, "states_filter", ()))
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "groups": [{"group_id": g, "protocol_type": pt, "group_state": st} for g, pt, st in groups]}


def handle_describe_groups(broker: Broker, req: Request) -> dict[str, Any]:
    return {"throttle_time": 0, "groups": [
        {**broker.coordination.groups.describe_group(g), "authorized_operations": -2147483648}
        for g in req.body.groups]}


def handle_delete_groups(broker: Broker, req: Request) -> dict[str, Any]:
    c = broker.coordination
    errors, records = c.groups.delete_groups(req.body.groups_names)
    c.apply_records_by_group(records)
    return {"throttle_time": 0, "results": [{"group_id": g, "error_code": e} for g, e in errors.items()]}


def handle_offset_delete(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    top, errors, records = c.groups.offset_delete(b.group_id, [(t.name, p.partition_index) for t in b.topics
                                                              for p in t.partitions])
    if records:
        c.apply_group_records(b.group_id, records)
    return {"throttle_time": 0, "error_code": top, "topics": _by_topic(errors)}

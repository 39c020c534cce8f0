"""Consumer groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch,
TxnOffsetCommit, ListGroups, DescribeGroups, DeleteGroups, OffsetDelete.

JoinGroup and SyncGroup wait for the rebalance: the coordinator calls back, which resolves a future
this handler awaits. Records the coordinator returns go through ``Coordination.apply_group_records``
(append to the group's ``__consumer_offsets`` partition, then replay) before the response is sent.

The empty group id, as Kafka's GroupCoordinatorService takes it (after the authorization checks):
JoinGroup, SyncGroup, Heartbeat, LeaveGroup, TxnOffsetCommit and OffsetDelete answer INVALID_GROUP_ID;
OffsetCommit, OffsetFetch, DescribeGroups and DeleteGroups take it as any other group id (Kafka keeps
them working on it for backward compatibility: a simple consumer may commit offsets under "").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from oncelog.coordinator.group.group_coordinator import JoinResult, SyncResult
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request, td_ms
from oncelog.server.answers import AnsweredWhenDurable
from oncelog.server.authz import Op, R, allowed, authorized_operations
from oncelog.storage.errors import DiskFullError
from oncelog.storage.refusals import storage_refused

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")


def _join_body(r: JoinResult) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": r.error, "generation_id": r.generation_id,
            "protocol_type": r.protocol_type, "protocol_name": r.protocol_name or "", "leader": r.leader,
            "member_id": r.member_id, "skip_assignment": False,
            "members": [{"member_id": m, "group_instance_id": i, "metadata": md} for m, i, md in r.members]}


async def handle_join_group(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    if not allowed(broker, req, Op.READ, R.GROUP, b.group_id):
        return _join_body(JoinResult(ErrorCode.group_authorization_failed, member_id=b.member_id))
    if not b.group_id:
        return _join_body(JoinResult(ErrorCode.invalid_group_id, member_id=b.member_id))
    host = f"/{req.session.host}" if req.session is not None else "/127.0.0.1"
    # What the member would add to the group's record: ids, client id, host, every protocol's
    # metadata (base64 in our record). Past the disk space kept, no JoinGroup is let in: Kafka
    # answers a storage error of the offsets partition NOT_COORDINATOR (Coordination.group_store_refused).
    size = (256 + 2 * len(b.group_id) + 2 * len(req.client_id or "") + len(host)
            + sum(16 + len(p.name) + len(p.metadata) * 4 // 3 for p in b.protocols))
    if c.group_store_refused(b.group_id, size) is not None:
        return _join_body(JoinResult(ErrorCode.not_coordinator, member_id=b.member_id))
    fut: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()

    def respond(result: JoinResult) -> None:
        if not fut.done():
            fut.set_result(result)

    session = td_ms(b.session_timeout)
    rebalance = td_ms(getattr(b, "rebalance_timeout", b.session_timeout))
    c.groups.join_group(b.group_id, b.member_id, getattr(b, "group_instance_id", None), req.client_id or "",
                        host, session, rebalance, b.protocol_type,
                        [(p.name, p.metadata) for p in b.protocols], req.api_version >= 4, respond)
    await _durable(c.flush_group_records())
    result = await fut
    await _durable(c.flush_group_records())
    if req.api_version < 4 and result.error == ErrorCode.member_id_required:  # cannot happen, kept for clarity
        result.error = ErrorCode.unknown_member_id
    return _join_body(result)


async def handle_sync_group(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    c = broker.coordination
    refused = ErrorCode.group_authorization_failed if not allowed(broker, req, Op.READ, R.GROUP, b.group_id) \
        else ErrorCode.invalid_group_id if not b.group_id else None
    if refused is not None:
        return {"throttle_time": 0, "error_code": refused, "protocol_type": None, "protocol_name": None,
                "assignment": b""}
    fut: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()

    def respond(result: SyncResult) -> None:
        if not fut.done():
            fut.set_result(result)

    c.groups.sync_group(b.group_id, b.generation_id, b.member_id, getattr(b, "group_instance_id", None),
                        [(a.member_id, a.assignment) for a in b.assignments], respond,
                        getattr(b, "protocol_type", None), getattr(b, "protocol_name", None))
    await _durable(c.flush_group_records())
    r = await fut
    await _durable(c.flush_group_records())
    if r.error == ErrorCode.unknown_server_error and b.assignments:  # the only SyncGroup error of its kind
        log.warning("group %s: the leader's assignment would make the group's record larger than "
                    "message.max.bytes (%d); refused with UNKNOWN_SERVER_ERROR, as Kafka does, and the group "
                    "rebalances", b.group_id, broker.config.message_max_bytes)
    return {"throttle_time": 0, "error_code": r.error, "protocol_type": r.protocol_type,
            "protocol_name": r.protocol_name, "assignment": r.assignment}


def handle_heartbeat(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    if not allowed(broker, req, Op.READ, R.GROUP, b.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed}
    if not b.group_id:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id}
    code = broker.coordination.groups.heartbeat(b.group_id, b.generation_id, b.member_id,
                                                getattr(b, "group_instance_id", None))
    return {"throttle_time": 0, "error_code": code}


def handle_leave_group(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    b = req.body
    c = broker.coordination
    if not allowed(broker, req, Op.READ, R.GROUP, b.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "members": []}
    if not b.group_id:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id, "members": []}
    members: list[tuple[str, str | None]] = (
        [(m.member_id, m.group_instance_id) for m in b.members] if hasattr(b, "members") else [(b.member_id, None)])
    top, results = c.groups.leave_group(b.group_id, members)
    return _answer_when_durable(c.flush_group_records(), {
        "throttle_time": 0, "error_code": top if req.api_version < 3 else ErrorCode.none,
        "members": [{"member_id": m, "group_instance_id": i, "error_code": e} for m, i, e in results]})


async def _durable(wait: Awaitable[None] | None) -> None:
    if wait is not None:
        await wait


def _answer_when_durable(wait: AnsweredWhenDurable | None, response: dict[str, Any]
                         ) -> dict[str, Any] | AnsweredWhenDurable:
    """``response`` now, or once ``wait`` (the records' fsync, off the loop) is done: an
    ``AnsweredWhenDurable``, so the connection handles later requests meanwhile, and a client gone
    before it is awaited leaves no coroutine behind."""
    return response if wait is None else wait.answering(response)


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


def _split_denied(broker: Broker, req: Request, offsets: list[tuple[str, int, int, int, str | None]]
                  ) -> tuple[list[tuple[str, int, int, int, str | None]], dict[tuple[str, int], ErrorCode]]:
    """Offsets of topics the principal may not READ are answered TOPIC_AUTHORIZATION_FAILED."""
    may = {t: allowed(broker, req, Op.READ, R.TOPIC, t) for t in {o[0] for o in offsets}}
    return ([o for o in offsets if may[o[0]]],
            {(o[0], o[1]): ErrorCode.topic_authorization_failed for o in offsets if not may[o[0]]})


def _in_request_order(offsets: list[tuple[str, int, int, int, str | None]],
                      *results: dict[tuple[str, int], ErrorCode]) -> dict[tuple[str, int], ErrorCode]:
    merged: dict[tuple[str, int], ErrorCode] = {}
    for r in results:
        merged.update(r)
    return {(t, p): merged[(t, p)] for t, p, *_ in offsets}


def handle_offset_commit(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    b = req.body
    c = broker.coordination
    offsets = _offsets_in(b.topics)
    if not allowed(broker, req, Op.READ, R.GROUP, b.group_id):
        return {"throttle_time": 0, "topics": _by_topic(
            {(t, p): ErrorCode.group_authorization_failed for t, p, *_ in offsets})}
    readable, denied = _split_denied(broker, req, offsets)
    known, errors = _split_unknown(broker, readable)
    errors.update(denied)
    if not known:
        errors = _in_request_order(offsets, errors)
    else:
        result = c.groups.offset_commit(b.group_id, b.generation_id_or_member_epoch, b.member_id,
                                        getattr(b, "group_instance_id", None), known)
        errors = _in_request_order(offsets, errors, result.errors)
        if result.records:
            try:
                wait = c.apply_group_records(b.group_id, result.records, bounded=True)
            except DiskFullError as exc:  # Kafka answers NOT_COORDINATOR to a storage error here; retriable
                storage_refused(exc)
                refused = {tp: ErrorCode.not_coordinator for tp, code in result.errors.items()
                           if code == ErrorCode.none}
                return {"throttle_time": 0, "topics": _by_topic(_in_request_order(offsets, errors, refused))}
            return _answer_when_durable(wait, {"throttle_time": 0, "topics": _by_topic(errors)})
    return {"throttle_time": 0, "topics": _by_topic(errors)}


def handle_txn_offset_commit(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    b = req.body
    c = broker.coordination
    offsets = _offsets_in(b.topics)
    for ok, code in ((allowed(broker, req, Op.WRITE, R.TRANSACTIONAL_ID, b.transactional_id),
                      ErrorCode.transactional_id_authorization_failed),
                     (allowed(broker, req, Op.READ, R.GROUP, b.group_id), ErrorCode.group_authorization_failed)):
        if not ok:
            return {"throttle_time": 0, "topics": _by_topic({(t, p): code for t, p, *_ in offsets})}
    readable, denied = _split_denied(broker, req, offsets)
    known, unknown = _split_unknown(broker, readable)
    unknown.update(denied)
    if not known:
        return {"throttle_time": 0, "topics": _by_topic(_in_request_order(offsets, unknown))}
    if not b.group_id:
        return {"throttle_time": 0, "topics": _by_topic(
            _in_request_order(offsets, unknown, {(t, p): ErrorCode.invalid_group_id for t, p, *_ in known}))}
    tp = c.offsets_partition_for(b.group_id)
    code = c.txn.is_partition_in_transaction(b.transactional_id, b.producer_id, b.producer_epoch, *tp)
    if code == ErrorCode.invalid_producer_epoch:
        code = ErrorCode.producer_fenced if req.api_version >= 3 else ErrorCode.invalid_producer_epoch
    if code != ErrorCode.none:
        return {"throttle_time": 0, "topics": _by_topic(
            _in_request_order(offsets, unknown, {(t, p): code for t, p, *_ in known}))}
    result = c.groups.txn_offset_commit(b.group_id, b.producer_id, getattr(b, "generation_id", -1),
                                        getattr(b, "member_id", ""), getattr(b, "group_instance_id", None), known)
    wait = None
    if result.records:
        error, wait = c.apply_txn_offset_records(b.group_id, b.producer_id, b.producer_epoch, result.records)
        if error != ErrorCode.none:
            result.errors = dict.fromkeys(result.errors, error)
    return _answer_when_durable(wait, {
        "throttle_time": 0, "topics": _by_topic(_in_request_order(offsets, unknown, result.errors))})


def _fetch_group(broker: Broker, req: Request, group_id: str, topics: Any,
                 require_stable: bool) -> list[dict[str, Any]]:
    """Committed offsets; topics the principal may not DESCRIBE are answered
    TOPIC_AUTHORIZATION_FAILED when named and left out of an all-topics answer (Kafka's rule)."""
    wanted = None if topics is None else [(t.name, p) for t in topics for p in t.partition_indexes]
    found = broker.coordination.groups.offset_fetch(group_id, wanted, require_stable)
    out: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), (om, code) in found.items():
        if not allowed(broker, req, Op.DESCRIBE, R.TOPIC, topic):
            if wanted is None:
                continue
            om, code = None, ErrorCode.topic_authorization_failed
        out.setdefault(topic, []).append({
            "partition_index": partition, "committed_offset": om.offset if om else -1,
            "committed_leader_epoch": om.leader_epoch if om else -1, "metadata": om.metadata if om else "",
            "error_code": code})
    return [{"name": t, "partitions": ps} for t, ps in out.items()]


def handle_offset_fetch(broker: Broker, req: Request) -> dict[str, Any]:
    b = req.body
    require_stable = getattr(b, "require_stable", False)

    def one(group_id: str, topics: Any) -> tuple[ErrorCode, list[dict[str, Any]]]:
        if not allowed(broker, req, Op.DESCRIBE, R.GROUP, group_id):
            return ErrorCode.group_authorization_failed, []
        return ErrorCode.none, _fetch_group(broker, req, group_id, topics, require_stable)

    if hasattr(b, "groups"):
        groups = []
        for g in b.groups:
            code, topics = one(g.group_id, g.topics)
            groups.append({"group_id": g.group_id, "error_code": code, "topics": topics})
        return {"throttle_time": 0, "groups": groups}
    code, topics = one(b.group_id, b.topics)
    return {"throttle_time": 0, "error_code": code, "topics": topics}


def handle_list_groups(broker: Broker, req: Request) -> dict[str, Any]:
    groups = broker.coordination.groups.list_groups(getattr(req.body, "states_filter", ()))
    if not allowed(broker, req, Op.DESCRIBE, R.CLUSTER):
        groups = [g for g in groups if allowed(broker, req, Op.DESCRIBE, R.GROUP, g[0])]
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "groups": [{"group_id": g, "protocol_type": pt, "group_state": st} for g, pt, st in groups]}


def handle_describe_groups(broker: Broker, req: Request) -> dict[str, Any]:
    want_ops = bool(getattr(req.body, "include_authorized_operations", False))
    out = []
    for g in req.body.groups:
        if not allowed(broker, req, Op.DESCRIBE, R.GROUP, g):
            out.append({"error_code": ErrorCode.group_authorization_failed, "group_id": g, "group_state": "",
                        "protocol_type": "", "protocol_data": "", "members": [],
                        "authorized_operations": -2147483648})
            continue
        out.append({**broker.coordination.groups.describe_group(g),
                    "authorized_operations": authorized_operations(broker, req, R.GROUP, g, want_ops)})
    return {"throttle_time": 0, "groups": out}


def handle_delete_groups(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    c = broker.coordination
    names = list(req.body.groups_names)
    may = [g for g in names if allowed(broker, req, Op.DELETE, R.GROUP, g)]
    errors, records = c.groups.delete_groups(may)
    wait = c.apply_records_by_group(records)
    errors.update({g: ErrorCode.group_authorization_failed for g in names if g not in may})
    return _answer_when_durable(wait, {"throttle_time": 0, "results": [{"group_id": g, "error_code": errors[g]}
                                                                       for g in names]})


def handle_offset_delete(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """Kafka's handleOffsetDeleteRequest: DELETE on the group, else GROUP_AUTHORIZATION_FAILED; per
    partition TOPIC_AUTHORIZATION_FAILED without READ on its topic, UNKNOWN_TOPIC_OR_PARTITION if it
    does not exist; the rest go to the coordinator. A group-level error (INVALID_GROUP_ID,
    GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP) is the whole answer, with no partitions (Kafka's
    OffsetDeleteResponse.Builder.merge)."""
    b = req.body
    c = broker.coordination
    if not allowed(broker, req, Op.DELETE, R.GROUP, b.group_id):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "topics": []}
    if not b.group_id:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_group_id, "topics": []}
    requested = [(t.name, p.partition_index) for t in b.topics for p in t.partitions]
    may = {t: allowed(broker, req, Op.READ, R.TOPIC, t) for t in {t for t, _ in requested}}
    errors = {(t, p): ErrorCode.topic_authorization_failed if not may[t] else ErrorCode.unknown_topic_or_partition
              for t, p in requested if not may[t] or broker.logs.get_partition(t, p) is None}
    top, deleted, records = c.groups.offset_delete(b.group_id, [tp for tp in requested if tp not in errors])
    if top != ErrorCode.none:
        return {"throttle_time": 0, "error_code": top, "topics": []}
    answer = {"throttle_time": 0, "error_code": ErrorCode.none,
              "topics": _by_topic({tp: errors[tp] if tp in errors else deleted[tp] for tp in requested})}
    return _answer_when_durable(c.apply_group_records(b.group_id, records) if records else None, answer)

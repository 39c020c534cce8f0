"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, and the KIP-664 admin
APIs (DescribeProducers, DescribeTransactions, ListTransactions).

Each handler asks the sans-IO transaction coordinator for a result and hands it to
``Coordination.answer_when_durable``: the answer goes out once the result's records are durable in
``__transaction_state`` and replayed, its markers written and durable, and its completion recorded;
the fsyncs run off the event loop, and the transactional id stays pending (CONCURRENT_TRANSACTIONS
to any other request about it) until the step is whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from oncelog.coordinator.transaction.state import TransactionState
from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request, td_ms
from oncelog.server.authz import Op, R, allowed, idempotent_write_allowed
from oncelog.server.coordination import INTERNAL_TOPICS

if TYPE_CHECKING:
    from oncelog.server.broker import Broker


def _denied(code: ErrorCode, **extra: Any) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, **extra}


#: The first version of each request that knows PRODUCER_FENCED (KIP-588); an older client gets
#: INVALID_PRODUCER_EPOCH instead, the code it handles the same way (Kafka's KafkaApis).
_FENCED_SINCE = {"InitProducerId": 4, "EndTxn": 2, "AddPartitionsToTxn": 2, "AddOffsetsToTxn": 2}


def _for_version(req: Request, api: str, code: ErrorCode) -> ErrorCode:
    if code == ErrorCode.producer_fenced and req.api_version < _FENCED_SINCE[api]:
        return ErrorCode.invalid_producer_epoch
    return code


def handle_init_producer_id(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    body = req.body
    c = broker.coordination
    if body.transactional_id is not None:
        if not allowed(broker, req, Op.WRITE, R.TRANSACTIONAL_ID, body.transactional_id):
            return _denied(ErrorCode.transactional_id_authorization_failed, producer_id=-1, producer_epoch=-1)
    elif not idempotent_write_allowed(broker, req):
        return _denied(ErrorCode.cluster_authorization_failed, producer_id=-1, producer_epoch=-1)
    result = c.txn.init_producer_id(
        body.transactional_id, td_ms(body.transaction_timeout),
        getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
    return c.answer_when_durable(body.transactional_id or "", result,
                                 lambda r: _init_producer_id_answer(req, r), bounded=True)


def _init_producer_id_answer(req: Request, result: Any) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": _for_version(req, "InitProducerId", result.error),
            "producer_id": result.producer_id if result.error == ErrorCode.none else -1,
            "producer_epoch": result.producer_epoch if result.error == ErrorCode.none else -1}


def _error_answer(req: Request, api: str) -> Callable[[Any], dict[str, Any]]:
    return lambda result: {"throttle_time": 0, "error_code": _for_version(req, api, result.error)}


def handle_add_partitions_to_txn(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """Kafka's handleAddPartitionsToTxnRequest (client versions, below 4): WRITE on the transactional
    id, else every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED. Then per partition
    TOPIC_AUTHORIZATION_FAILED without WRITE on its topic (an internal topic is never authorized, not
    even for a super user), else UNKNOWN_TOPIC_OR_PARTITION if it does not exist; if any partition
    failed, the others answer OPERATION_NOT_ATTEMPTED and nothing is added."""
    body = req.body
    c = broker.coordination
    transactional_id = body.v3_and_below_transactional_id
    producer_id, producer_epoch = body.v3_and_below_producer_id, body.v3_and_below_producer_epoch
    requested = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
    if not allowed(broker, req, Op.WRITE, R.TRANSACTIONAL_ID, transactional_id):
        return _add_partitions_answer(req, dict.fromkeys(requested, ErrorCode.transactional_id_authorization_failed))
    authorized_topics = {t for t, _ in requested if t not in INTERNAL_TOPICS
                         and allowed(broker, req, Op.WRITE, R.TOPIC, t)}
    errors: dict[tuple[str, int], ErrorCode] = {}
    for tp in requested:
        if tp[0] not in authorized_topics:
            errors[tp] = ErrorCode.topic_authorization_failed
        elif broker.logs.get_partition(*tp) is None:
            errors[tp] = ErrorCode.unknown_topic_or_partition
    if errors:
        return _add_partitions_answer(req, {tp: errors.get(tp, ErrorCode.operation_not_attempted)
                                            for tp in requested})
    result = c.txn.add_partitions_to_txn(transactional_id, producer_id, producer_epoch, requested)
    return c.answer_when_durable(transactional_id, result,
                                 lambda r: _add_partitions_answer(req, r.partition_errors), bounded=True)


def _add_partitions_answer(req: Request, errors: dict[tuple[str, int], ErrorCode]) -> dict[str, Any]:
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p), code in errors.items():
        by_topic.setdefault(topic, []).append(
            {"partition_index": p, "partition_error_code": _for_version(req, "AddPartitionsToTxn", code)})
    return {"throttle_time": 0,
            "results_by_topic_v3_and_below": [{"name": t, "results_by_partition": rs} for t, rs in by_topic.items()]}


def handle_add_offsets_to_txn(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    body = req.body
    c = broker.coordination
    if not allowed(broker, req, Op.WRITE, R.TRANSACTIONAL_ID, body.transactional_id):
        return _denied(ErrorCode.transactional_id_authorization_failed)
    if not allowed(broker, req, Op.READ, R.GROUP, body.group_id):
        return _denied(ErrorCode.group_authorization_failed)
    result = c.txn.add_offsets_to_txn(body.transactional_id, body.producer_id, body.producer_epoch, body.group_id)
    return c.answer_when_durable(body.transactional_id, result, _error_answer(req, "AddOffsetsToTxn"), bounded=True)


def handle_end_txn(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    body = req.body
    c = broker.coordination
    if not allowed(broker, req, Op.WRITE, R.TRANSACTIONAL_ID, body.transactional_id):
        return _denied(ErrorCode.transactional_id_authorization_failed)
    result = c.txn.end_txn(body.transactional_id, body.producer_id, body.producer_epoch, body.committed)
    return c.answer_when_durable(body.transactional_id, result, _error_answer(req, "EndTxn"))


def handle_describe_producers(broker: Broker, req: Request) -> dict[str, Any]:
    topics = []
    for t in req.body.topics:
        parts = []
        may_read = allowed(broker, req, Op.READ, R.TOPIC, t.name)
        for p in t.partition_indexes:
            plog = broker.logs.get_partition(t.name, p)
            if not may_read or plog is None:
                code = ErrorCode.topic_authorization_failed if not may_read else ErrorCode.unknown_topic_or_partition
                parts.append({"partition_index": p, "error_code": code, "error_message": None,
                              "active_producers": []})
                continue
            ongoing = plog.producer_state.ongoing
            parts.append({"partition_index": p, "error_code": ErrorCode.none, "error_message": None,
                          "active_producers": [
                              {"producer_id": e.producer_id, "producer_epoch": e.producer_epoch,
                               "last_sequence": e.last_seq, "last_timestamp": e.last_timestamp,
                               "coordinator_epoch": e.coordinator_epoch,
                               "current_txn_start_offset": ongoing.get(e.producer_id, -1)}
                              for e in plog.producers()]})
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}


def handle_describe_transactions(broker: Broker, req: Request) -> dict[str, Any]:
    """Kafka's handleDescribeTransactionsRequest: a state for each id the caller may DESCRIBE
    (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED), listing only the topics the caller may DESCRIBE."""
    ids = list(req.body.transactional_ids)
    visible = [t for t in ids if allowed(broker, req, Op.DESCRIBE, R.TRANSACTIONAL_ID, t)]
    states = broker.coordination.txn.describe_transactions(visible)
    states += [{"error_code": ErrorCode.transactional_id_authorization_failed, "transactional_id": t}
               for t in ids if t not in visible]
    for s in states:
        s.setdefault("transaction_state", "")
        s["transaction_timeout"] = s.pop("transaction_timeout_ms", 0)
        # Kafka sends -1 when no transaction is open; kio-based readers (ours included) refuse a
        # negative timestamp, so "none" is sent as 0 (the epoch), which no real transaction has.
        s["transaction_start_time"] = max(s.pop("transaction_start_time_ms", 0), 0)
        s.setdefault("producer_id", -1)
        s.setdefault("producer_epoch", -1)
        s["topics"] = [t for t in s.get("topics", []) if allowed(broker, req, Op.DESCRIBE, R.TOPIC, t["topic"])]
    return {"throttle_time": 0, "transaction_states": states}


def handle_list_transactions(broker: Broker, req: Request) -> dict[str, Any]:
    """Kafka's handleListTransactionsRequest: the coordinator's list, filtered by every name given
    (a name of no state matches nothing, and is echoed in ``unknown_state_filters``), keeping the ids
    the caller may DESCRIBE."""
    body = req.body
    known = {s.value for s in TransactionState}
    unknown = list(dict.fromkeys(s for s in body.state_filters if s not in known))
    listed = broker.coordination.txn.list_transactions(
        body.state_filters, body.producer_id_filters, getattr(body, "duration_filter", -1))
    listed = [t for t in listed if allowed(broker, req, Op.DESCRIBE, R.TRANSACTIONAL_ID, t["transactional_id"])]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "unknown_state_filters": unknown,
            "transaction_states": listed}


def handle_write_txn_markers(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """WriteTxnMarkers from a client (Kafka's inter-broker API; ``oncelog transactions abort`` uses it
    to close a hanging transaction): restricted and validated by ``Coordination.write_marker``.
    The markers are carried out in request order; an abort of a whole transaction answers once its
    steps are durable (awaited here, off the event loop), and the next marker waits for it."""
    may = allowed(broker, req, Op.CLUSTER_ACTION, R.CLUSTER)
    entries = [(m, t, p) for m in req.body.markers for t in m.topics for p in t.partition_indexes]
    codes: list[Any] = []
    for i, (m, t, p) in enumerate(entries):
        if not may:
            codes.append(ErrorCode.cluster_authorization_failed)
            continue
        code = broker.coordination.write_marker(t.name, p, m.producer_id, m.producer_epoch,
                                                m.coordinator_epoch, bool(m.transaction_result))
        if inspect.isawaitable(code):
            return _write_txn_markers_rest(broker, req, entries, [*codes, code], i + 1, may)
        codes.append(code)
    return _markers_response(req, codes)


async def _write_txn_markers_rest(broker: Broker, req: Request, entries: list[Any], codes: list[Any], start: int,
                                  may: bool) -> dict[str, Any]:
    codes[-1] = await codes[-1]
    for m, t, p in entries[start:]:
        if not may:
            codes.append(ErrorCode.cluster_authorization_failed)
            continue
        code = broker.coordination.write_marker(t.name, p, m.producer_id, m.producer_epoch,
                                                m.coordinator_epoch, bool(m.transaction_result))
        codes.append(await code if inspect.isawaitable(code) else code)
    return _markers_response(req, codes)


def _markers_response(req: Request, codes: list[Any]) -> dict[str, Any]:
    """The WriteTxnMarkers response: ``codes`` in the request's (marker, topic, partition) order."""
    it = iter(codes)
    return {"markers": [{"producer_id": m.producer_id, "topics": [
        {"name": t.name, "partitions": [{"partition_index": p, "error_code": next(it)} for p in t.partition_indexes]}
        for t in m.topics]} for m in req.body.markers]}

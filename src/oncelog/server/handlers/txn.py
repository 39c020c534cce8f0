"""InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit, and the KIP-664 admin
APIs (DescribeProducers, DescribeTransactions, ListTransactions).

Each handler asks the sans-IO transaction coordinator for a result and hands it to
``Coordination.apply_txn_result``: append its records to ``__transaction_state``, replay them, write
any markers, and record completion, all without awaiting, so no other request interleaves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request, td_ms

if TYPE_CHECKING:
    from oncelog.server.broker import Broker


def handle_init_producer_id(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    c = broker.coordination
    result = c.txn.init_producer_id(
        body.transactional_id, td_ms(body.transaction_timeout),
        getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
    c.apply_txn_result(result)
    return {"throttle_time": 0, "error_code": result.error,
            "producer_id": result.producer_id if result.error == ErrorCode.none else -1,
            "producer_epoch": result.producer_epoch if result.error == ErrorCode.none else -1}


def handle_add_partitions_to_txn(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    c = broker.coordination
    transactional_id = body.v3_and_below_transactional_id
    producer_id, producer_epoch = body.v3_and_below_producer_id, body.v3_and_below_producer_epoch
    requested = [(t.name, p) for t in body.v3_and_below_topics for p in t.partitions]
    unknown = {tp for tp in requested if broker.logs.get_partition(*tp) is None}
    if unknown:
        errors = {tp: (ErrorCode.unknown_topic_or_partition if tp in unknown else ErrorCode.operation_not_attempted)
                  for tp in requested}
    else:
        result = c.txn.add_partitions_to_txn(transactional_id, producer_id, producer_epoch, requested)
        c.apply_txn_result(result)
        errors = result.partition_errors
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p), code in errors.items():
        by_topic.setdefault(topic, []).append({"partition_index": p, "partition_error_code": code})
    return {"throttle_time": 0,
            "results_by_topic_v3_and_below": [{"name": t, "results_by_partition": rs} for t, rs in by_topic.items()]}


def handle_add_offsets_to_txn(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    c = broker.coordination
    result = c.txn.add_offsets_to_txn(body.transactional_id, body.producer_id, body.producer_epoch, body.group_id)
    c.apply_txn_result(result)
    return {"throttle_time": 0, "error_code": result.error}


def handle_end_txn(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    c = broker.coordination
    result = c.txn.end_txn(body.transactional_id, body.producer_id, body.producer_epoch, body.committed)
    c.apply_txn_result(result)
    return {"throttle_time": 0, "error_code": result.error}

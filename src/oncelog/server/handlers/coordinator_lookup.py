"""FindCoordinator: this single node coordinates every group and every transactional id."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.authz import Op, R, allowed

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1


def handle_find_coordinator(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    host, port = broker.config.advertised
    node = broker.config.node_id
    key_type = getattr(body, "key_type", KEY_TYPE_GROUP)
    if key_type not in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request,
                "error_message": f"unsupported key type {key_type}", "node_id": -1, "host": "", "port": -1}
    key = getattr(body, "key", None) or getattr(body, "group_id", "") or ""
    if key_type == KEY_TYPE_GROUP and not allowed(broker, req, Op.DESCRIBE, R.GROUP, key):
        return {"throttle_time": 0, "error_code": ErrorCode.group_authorization_failed, "error_message": None,
                "node_id": -1, "host": "", "port": -1}
    if key_type == KEY_TYPE_TRANSACTION and not allowed(broker, req, Op.DESCRIBE, R.TRANSACTIONAL_ID, key):
        return {"throttle_time": 0, "error_code": ErrorCode.transactional_id_authorization_failed,
                "error_message": None, "node_id": -1, "host": "", "port": -1}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "node_id": node,
            "host": host, "port": port}

"""Authorization of requests, as Kafka's KafkaApis does it: the checks each handler makes.

Without an authorizer (the default for local use) every check passes and the authorized-operation
fields carry every operation of the resource type, as Kafka reports without an authorizer. With one
(``--sasl`` enables it, or ``authorizer_enabled``), the request's principal (``User:<name>`` after
SASL, else ``User:ANONYMOUS``) and host are checked against the ACLs (oncelog.security.acl).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog.security.acl import CLUSTER_NAME, SUPPORTED_OPERATIONS, Operation, ResourceType

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

ANONYMOUS = "User:ANONYMOUS"
NOT_REQUESTED = -2147483648  # INT32_MIN: "authorized operations were not requested"

Op = Operation
R = ResourceType


def principal_and_host(req: Any) -> tuple[str, str]:
    session = req.session
    if session is None:
        return ANONYMOUS, "127.0.0.1"
    return getattr(session, "principal", ANONYMOUS), getattr(session, "host", "*")


def allowed(broker: Broker, req: Any, op: Operation, rtype: ResourceType, name: str = CLUSTER_NAME) -> bool:
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    principal, host = principal_and_host(req)
    return authorizer.authorize(principal, host, op, rtype, name)


def idempotent_write_allowed(broker: Broker, req: Any) -> bool:
    """IDEMPOTENT_WRITE on the cluster, or WRITE on any topic (KIP-679)."""
    authorizer = broker.authorizer
    if authorizer is None:
        return True
    principal, host = principal_and_host(req)
    return authorizer.authorize(principal, host, Op.IDEMPOTENT_WRITE, R.CLUSTER, CLUSTER_NAME) or \
        authorizer.authorize_any(principal, host, Op.WRITE, R.TOPIC)


def create_topic_allowed(broker: Broker, req: Any, name: str) -> bool:
    """CREATE on the cluster, or on the topic (Kafka accepts either)."""
    return allowed(broker, req, Op.CREATE, R.CLUSTER) or allowed(broker, req, Op.CREATE, R.TOPIC, name)


def authorized_operations(broker: Broker, req: Any, rtype: ResourceType, name: str, requested: bool) -> int:
    """KIP-430: INT32_MIN unless asked for; then the bit field of allowed operations."""
    if not requested:
        return NOT_REQUESTED
    authorizer = broker.authorizer
    if authorizer is None:
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(rtype, ()):
            bits |= 1 << op
        return bits
    principal, host = principal_and_host(req)
    return authorizer.authorized_operations(principal, host, rtype, name)


def cluster_authorized_operations(broker: Broker, req: Any, requested: bool) -> int:
    """Metadata v8-10 and DescribeCluster: INT32_MIN unless asked for; then 0 without DESCRIBE on the
    cluster, else the bit field of what the caller may do on it (KafkaApis, AuthHelper)."""
    if requested and not allowed(broker, req, Op.DESCRIBE, R.CLUSTER):
        return 0
    return authorized_operations(broker, req, R.CLUSTER, CLUSTER_NAME, requested)

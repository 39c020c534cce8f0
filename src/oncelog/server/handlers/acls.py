"""CreateAcls, DescribeAcls and DeleteAcls (KIP-140), so librdkafka's AdminClient and Kafka's tools
manage ACLs. Creating and deleting need ALTER on the cluster, describing DESCRIBE; without an
authorizer these answer SECURITY_DISABLED, as Kafka does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.security.acl import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from oncelog.server.authz import allowed

if TYPE_CHECKING:
    from oncelog.server.broker import Broker


def _enum(cls: Any, value: int) -> Any:
    try:
        return cls(int(value))
    except ValueError:
        return cls.UNKNOWN


def _filter(f: Any, pattern_field: str) -> AclFilter | None:
    """An AclFilter from a request's filter, or None if it uses an unknown code."""
    values = (_enum(ResourceType, f.resource_type_filter), _enum(PatternType, getattr(f, pattern_field, 3)),
              _enum(Operation, f.operation), _enum(Permission, f.permission_type))
    if any(v.value == 0 for v in values):
        return None
    rtype, pattern, op, perm = values
    return AclFilter(rtype, f.resource_name_filter, pattern, f.principal_filter, f.host_filter, op, perm)


def _described(bindings: list[AclBinding]) -> list[dict[str, Any]]:
    by_resource: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for b in bindings:
        by_resource.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(
            {"principal": b.principal, "host": b.host, "operation": int(b.operation),
             "permission_type": int(b.permission)})
    return [{"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
            for (rt, name, pt), acls in by_resource.items()]


def handle_create_acls(broker: Broker, req: Request) -> dict[str, Any]:
    creations = req.body.creations
    if broker.authorizer is None:
        code, message = ErrorCode.security_disabled, "no authorizer is configured"
        return {"throttle_time": 0, "results": [{"error_code": code, "error_message": message} for _ in creations]}
    if not allowed(broker, req, Operation.ALTER, ResourceType.CLUSTER):
        return {"throttle_time": 0, "results": [
            {"error_code": ErrorCode.cluster_authorization_failed, "error_message": None} for _ in creations]}
    bindings: list[AclBinding | None] = []
    for c in creations:
        pattern = getattr(c, "resource_pattern_type", 3)
        bindings.append(AclBinding(_enum(ResourceType, c.resource_type), c.resource_name,
                                   _enum(PatternType, pattern), c.principal, c.host, _enum(Operation, c.operation),
                                   _enum(Permission, c.permission_type)))
    errors = broker.authorizer.create([b for b in bindings if b is not None])
    return {"throttle_time": 0, "results": [
        {"error_code": ErrorCode.none if e is None else ErrorCode.invalid_request, "error_message": e}
        for e in errors]}


def handle_describe_acls(broker: Broker, req: Request) -> dict[str, Any]:
    empty = {"throttle_time": 0, "resources": []}
    if broker.authorizer is None:
        return {**empty, "error_code": ErrorCode.security_disabled, "error_message": "no authorizer is configured"}
    if not allowed(broker, req, Operation.DESCRIBE, ResourceType.CLUSTER):
        return {**empty, "error_code": ErrorCode.cluster_authorization_failed, "error_message": None}
    f = _filter(req.body, "pattern_type_filter")
    if f is None:
        return {**empty, "error_code": ErrorCode.invalid_request, "error_message": "unknown filter code"}
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "resources": _described(broker.authorizer.describe(f))}


def handle_delete_acls(broker: Broker, req: Request) -> dict[str, Any]:
    filters = req.body.filters
    if broker.authorizer is None:
        return {"throttle_time": 0, "filter_results": [
            {"error_code": ErrorCode.security_disabled, "error_message": "no authorizer is configured",
             "matching_acls": []} for _ in filters]}
    if not allowed(broker, req, Operation.ALTER, ResourceType.CLUSTER):
        return {"throttle_time": 0, "filter_results": [
            {"error_code": ErrorCode.cluster_authorization_failed, "error_message": None, "matching_acls": []}
            for _ in filters]}
    parsed = [_filter(f, "pattern_type_filter") for f in filters]
    removed = broker.authorizer.delete([f for f in parsed if f is not None])
    out = []
    it = iter(removed)
    for f in parsed:
        if f is None:
            out.append({"error_code": ErrorCode.invalid_request, "error_message": "unknown filter code",
                        "matching_acls": []})
            continue
        out.append({"error_code": ErrorCode.none, "error_message": None, "matching_acls": [
            {"error_code": ErrorCode.none, "error_message": None, "resource_type": int(b.resource_type),
             "resource_name": b.resource_name, "pattern_type": int(b.pattern_type), "principal": b.principal,
             "host": b.host, "operation": int(b.operation), "permission_type": int(b.permission)}
            for b in next(it)]})
    return {"throttle_time": 0, "filter_results": out}

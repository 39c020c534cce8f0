"""CreateAcls accepts what Kafka accepts (AclControlManager.validateNewAcl, AclApis.handleCreateAcls):
any ``<type>:<name>`` principal and any concrete operation on any concrete resource type. Such an ACL
grants exactly what Kafka's authorizer derives from it (StandardAuthorizerData.findResult): a
principal type other than ``User`` never matches a request, an operation a resource does not
support grants nothing but the DESCRIBE (or DESCRIBE_CONFIGS) it implies. DescribeGroups reports
Kafka's operations for groups (AclEntry.supportedOperations). Driven in process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.security.acl import SUPPORTED_OPERATIONS, Operation, PatternType, Permission, ResourceType
from tests.inproc import InProcessBroker

R, Op = ResourceType, Operation
ADMIN, BOB = "User:admin", "User:bob"
CREATE_ACLS, DESCRIBE_GROUPS, JOIN_GROUP, METADATA = 30, 15, 11, 3


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users=ADMIN)
    broker.create_topic("t")
    yield broker
    broker.close()


def _create(b: InProcessBroker, *acls: tuple[ResourceType, str, str, Operation]) -> list[tuple[int, str | None]]:
    r = b.call(CREATE_ACLS, 3, {"creations": [
        {"resource_type": rt, "resource_name": name, "resource_pattern_type": PatternType.LITERAL,
         "principal": principal, "host": "*", "operation": op, "permission_type": Permission.ALLOW}
        for rt, name, principal, op in acls]}, principal=ADMIN)
    return [(int(x.error_code), x.error_message) for x in r.results]


def _describe_group(b: InProcessBroker, principal: str | None) -> Any:
    [g] = b.call(DESCRIBE_GROUPS, 5, {"groups": ["g"], "include_authorized_operations": True},
                 principal=principal).groups
    return g


def _join(b: InProcessBroker, principal: str) -> int:
    return int(b.call(JOIN_GROUP, 5, {"group_id": "g", "session_timeout": 10_000, "rebalance_timeout": 10_000,
                                      "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                                      "protocols": [{"name": "range", "metadata": b""}]},
                      principal=principal).error_code)


def _bits(*ops: Operation) -> int:
    return sum(1 << op for op in ops)


def test_any_parsable_principal_and_any_operation_are_accepted(b: InProcessBroker) -> None:
    results = _create(b, (R.TOPIC, "t", "Group:ops", Op.READ), (R.GROUP, "g", BOB, Op.WRITE),
                      (R.GROUP, "g", BOB, Op.CREATE), (R.TOPIC, "t", BOB, Op.CLUSTER_ACTION),
                      (R.USER, "bob", BOB, Op.CREATE_TOKENS), (R.DELEGATION_TOKEN, "tok", "User:", Op.DESCRIBE),
                      (R.TOPIC, "t", "bob", Op.READ), (R.TOPIC, "t", "", Op.READ))
    assert [code for code, _ in results] == [0] * 6 + [ErrorCode.invalid_request] * 2
    assert results[-1][1] and "<type>:<name>" in results[-1][1]
    assert b.broker.authorizer is not None and len(b.broker.authorizer.bindings) == 6


def test_such_acls_grant_what_kafka_derives_from_them_and_nothing_more(b: InProcessBroker) -> None:
    assert _create(b, (R.TOPIC, "t", "Group:ops", Op.READ), (R.TOPIC, "t", "Group:*", Op.ALL),
                   (R.GROUP, "g", BOB, Op.CREATE), (R.TOPIC, "t", BOB, Op.CLUSTER_ACTION)) == [(0, None)] * 4
    a = b.broker.authorizer
    assert a is not None
    # the operations the broker ever asks about topics and groups
    for principal in ("User:ops", BOB, "User:ANONYMOUS"):
        assert not any(a.authorize(principal, "127.0.0.1", op, R.TOPIC, "t") for op in SUPPORTED_OPERATIONS[R.TOPIC])
    assert not any(a.authorize(BOB, "127.0.0.1", op, R.GROUP, "g") for op in SUPPORTED_OPERATIONS[R.GROUP])
    assert _join(b, BOB) == ErrorCode.group_authorization_failed
    assert _describe_group(b, BOB).error_code == ErrorCode.group_authorization_failed
    # WRITE on a group: as in Kafka, it implies DESCRIBE (IMPLIES_DESCRIBE) and nothing else
    assert _create(b, (R.GROUP, "g", BOB, Op.WRITE)) == [(0, None)]
    g = _describe_group(b, BOB)
    assert (g.error_code, g.authorized_operations) == (ErrorCode.none, _bits(Op.DESCRIBE))
    assert _join(b, BOB) == ErrorCode.group_authorization_failed


def test_describe_groups_reports_kafkas_group_operations(b: InProcessBroker, tmp_path: Path) -> None:
    assert _describe_group(b, ADMIN).authorized_operations == _bits(
        Op.READ, Op.DELETE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)
    assert _create(b, (R.GROUP, "g", BOB, Op.DESCRIBE), (R.GROUP, "g", BOB, Op.ALTER_CONFIGS)) == [(0, None)] * 2
    assert _describe_group(b, BOB).authorized_operations == _bits(Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)
    plain = InProcessBroker(tmp_path / "plain")  # no authorizer: every supported operation
    try:
        assert _describe_group(plain, None).authorized_operations == _bits(
            Op.READ, Op.DELETE, Op.DESCRIBE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS)
    finally:
        plain.close()

"""Authorization that answers as Apache Kafka does where an adversarial comparison found it did not
(KafkaApis, ControllerApis, AuthHelper and Authorizer.authorizeByResourceType): each test drives the
broker's request path in process as a principal without the ACL in question."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.security.acl import AclBinding, Authorizer, Operation, PatternType, Permission, ResourceType
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

R, Op, P, A = ResourceType, Operation, PatternType, Permission
ALICE, BOB, ADMIN = "User:alice", "User:bob", "User:admin"
E = ErrorCode


def acl(rtype: ResourceType, name: str, principal: str, op: Operation, perm: Permission = A.ALLOW,
        pattern: PatternType = P.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, perm)


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Callable[..., InProcessBroker]]:
    """In-process brokers with an authorizer (``User:admin`` super user, auto-creation on)."""
    made: list[InProcessBroker] = []

    def make_broker(*bindings: AclBinding, **config: Any) -> InProcessBroker:
        b = InProcessBroker(tmp_path / f"d{len(made)}", authorizer_enabled=True, super_users=ADMIN,
                            auto_create_topics_enable=True, **config)
        made.append(b)
        assert b.broker.authorizer is not None
        b.broker.authorizer.create(list(bindings))
        return b

    yield make_broker
    for b in made:
        b.close()


def _init_pid(b: InProcessBroker, transactional_id: str | None, principal: str) -> Any:
    return b.call(22, 4, {"transactional_id": transactional_id, "transaction_timeout": 60_000,
                          "producer_id": -1, "producer_epoch": -1}, principal=principal)


def _add_partitions(b: InProcessBroker, transactional_id: str, r: Any, topics: list[str], principal: str) -> Any:
    return b.call(24, 3, {"v3_and_below_transactional_id": transactional_id, "v3_and_below_producer_id": r.producer_id,
                          "v3_and_below_producer_epoch": r.producer_epoch,
                          "v3_and_below_topics": [{"name": t, "partitions": [0]} for t in topics]}, principal=principal)


def _codes(r: Any) -> dict[str, int]:
    return {t.name: int(p.partition_error_code)
            for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}


# --- transactions --------------------------------------------------------------------------------------
def test_describe_transactions_lists_only_describable_topics(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.TOPIC, "secret", ALICE, Op.ALL), acl(R.TOPIC, "public", ALICE, Op.ALL),
             acl(R.TRANSACTIONAL_ID, "tx-A", ALICE, Op.WRITE), acl(R.TRANSACTIONAL_ID, "tx-A", BOB, Op.DESCRIBE),
             acl(R.TOPIC, "public", BOB, Op.DESCRIBE))
    b.create_topic("secret")
    b.create_topic("public")
    r = _init_pid(b, "tx-A", ALICE)
    assert set(_codes(_add_partitions(b, "tx-A", r, ["secret", "public"], ALICE)).values()) == {0}
    seen = b.call(65, 0, {"transactional_ids": ["tx-A"]}, principal=BOB).transaction_states[0]
    assert int(seen.error_code) == 0
    assert [t.topic for t in seen.topics] == ["public"]
    seen = b.call(65, 0, {"transactional_ids": ["tx-A"]}, principal=ALICE).transaction_states[0]
    assert sorted(t.topic for t in seen.topics) == ["public", "secret"]


def test_add_partitions_merges_unauthorized_and_unknown(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.TRANSACTIONAL_ID, "tx", BOB, Op.WRITE), acl(R.TOPIC, "w", BOB, Op.WRITE),
             acl(R.TOPIC, "missing", BOB, Op.WRITE))
    b.create_topic("w")
    r = _init_pid(b, "tx", BOB)
    assert _codes(_add_partitions(b, "tx", r, ["w", "missing", "nope"], BOB)) == {
        "w": E.operation_not_attempted, "missing": E.unknown_topic_or_partition, "nope": E.topic_authorization_failed}
    assert _codes(_add_partitions(b, "tx", r, ["w", "missing"], BOB)) == {
        "w": E.operation_not_attempted, "missing": E.unknown_topic_or_partition}


def test_internal_topics_are_never_added_to_a_transaction(make: Callable[..., InProcessBroker]) -> None:
    b = make()
    r = _init_pid(b, "tx", ADMIN)
    assert _codes(_add_partitions(b, "tx", r, ["__consumer_offsets", "__transaction_state"], ADMIN)) == {
        "__consumer_offsets": E.topic_authorization_failed, "__transaction_state": E.topic_authorization_failed}


# --- produce -------------------------------------------------------------------------------------------
def _produce(b: InProcessBroker, topic: str, records: bytes, principal: str,
             transactional_id: str | None = None) -> int:
    r = b.call(0, 9, {"transactional_id": transactional_id, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": records}]}]}, principal=principal)
    return int(r.responses[0].partition_responses[0].error_code)


def test_transactional_batch_without_transactional_id_is_unauthorized(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.TOPIC, "w", BOB, Op.WRITE))
    b.create_topic("w")
    assert _produce(b, "w", batch(pid=5, epoch=0, seq=0, txn=True), BOB) == E.transactional_id_authorization_failed
    assert _produce(b, "w", batch(pid=5, epoch=0, seq=0, txn=True), ADMIN) == E.transactional_id_authorization_failed


def test_idempotent_produce_needs_only_write_on_the_topic(make: Callable[..., InProcessBroker]) -> None:
    """Kafka checks IDEMPOTENT_WRITE at InitProducerId, not per produced batch: bob may not get a
    producer id (a cluster ACL exists, his WRITE on the hard-coded topic name is denied), yet
    WRITE on ``w`` (no ACL on it: allowed to everyone) lets him produce an idempotent batch."""
    b = make(acl(R.CLUSTER, "kafka-cluster", ALICE, Op.ALTER), acl(R.TOPIC, "h", BOB, Op.WRITE, A.DENY, P.PREFIXED),
             allow_everyone_if_no_acl_found=True)
    b.create_topic("w")
    assert int(_init_pid(b, None, BOB).error_code) == E.cluster_authorization_failed
    r = _init_pid(b, None, ADMIN)
    assert _produce(b, "w", batch(pid=r.producer_id, epoch=r.producer_epoch, seq=0), BOB) == 0


# --- authorize by resource type (KIP-679) ----------------------------------------------------------------
def test_authorize_any_follows_kafkas_algorithm(tmp_path: Path) -> None:
    a = Authorizer(None)
    a.create([acl(R.TOPIC, "*", "User:p", Op.WRITE), acl(R.TOPIC, "any", "User:p", Op.WRITE, A.DENY, P.PREFIXED)])
    assert a.authorize_any("User:p", "h", Op.WRITE, R.TOPIC)  # a wildcard ALLOW is not undone by a prefixed DENY
    a.create([acl(R.TOPIC, "pay-eu", "User:q", Op.WRITE), acl(R.TOPIC, "pay", "User:q", Op.WRITE, A.DENY, P.PREFIXED)])
    assert not a.authorize_any("User:q", "h", Op.WRITE, R.TOPIC)  # the only ALLOW is dominated by a DENY
    a.create([acl(R.TOPIC, "x", "User:q", Op.ALL, pattern=P.PREFIXED)])
    assert a.authorize_any("User:q", "h", Op.WRITE, R.TOPIC)
    a.create([acl(R.TOPIC, "*", "User:q", Op.WRITE, A.DENY)])
    assert not a.authorize_any("User:q", "h", Op.WRITE, R.TOPIC)  # a wildcard DENY denies
    a.create([acl(R.TOPIC, "r", "User:s", Op.READ)])
    assert not a.authorize_any("User:s", "h", Op.WRITE, R.TOPIC)  # READ is not WRITE


def test_allow_everyone_authorizes_idempotence_despite_a_cluster_acl(make: Callable[..., InProcessBroker]) -> None:
    """With no topic ACL, WRITE on the hard-coded topic name is allowed to everyone, so KIP-679's
    WRITE on some topic grants idempotence although a cluster ACL denies IDEMPOTENT_WRITE."""
    b = make(acl(R.CLUSTER, "kafka-cluster", ALICE, Op.ALTER), allow_everyone_if_no_acl_found=True)
    assert int(_init_pid(b, None, BOB).error_code) == 0
    assert int(_init_pid(make(acl(R.CLUSTER, "kafka-cluster", ALICE, Op.ALTER)), None, BOB).error_code) == \
        E.cluster_authorization_failed


# --- metadata and cluster ------------------------------------------------------------------------------
def test_describe_cluster_is_answered_for_everyone(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.CLUSTER, "kafka-cluster", ALICE, Op.DESCRIBE))
    r = b.call(60, 0, {"include_cluster_authorized_operations": True}, principal=BOB)
    assert (int(r.error_code), r.cluster_authorized_operations, len(r.brokers)) == (0, 0, 1)
    r = b.call(60, 0, {"include_cluster_authorized_operations": False}, principal=BOB)
    assert r.cluster_authorized_operations == -2147483648
    r = b.call(60, 0, {"include_cluster_authorized_operations": True}, principal=ALICE)
    assert r.cluster_authorized_operations == 1 << Op.DESCRIBE


def test_metadata_cluster_operations_need_describe(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.CLUSTER, "kafka-cluster", BOB, Op.CREATE), acl(R.CLUSTER, "kafka-cluster", ALICE, Op.CREATE),
             acl(R.CLUSTER, "kafka-cluster", ALICE, Op.DESCRIBE))
    fields = {"topics": None, "allow_auto_topic_creation": False, "include_cluster_authorized_operations": True,
              "include_topic_authorized_operations": False}
    assert b.call(3, 10, fields, principal=BOB).cluster_authorized_operations == 0
    assert b.call(3, 10, fields, principal=ALICE).cluster_authorized_operations == \
        (1 << Op.CREATE) | (1 << Op.DESCRIBE)


def test_metadata_auto_create_without_create_is_unauthorized(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.TOPIC, "bob-", BOB, Op.DESCRIBE, pattern=P.PREFIXED))
    fields = {"topics": [{"name": "bob-new", "topic_id": None}], "allow_auto_topic_creation": True,
              "include_topic_authorized_operations": False}
    assert int(b.call(3, 12, fields, principal=BOB).topics[0].error_code) == E.topic_authorization_failed
    assert "bob-new" not in b.broker.logs.topics()
    fields["allow_auto_topic_creation"] = False
    assert int(b.call(3, 12, fields, principal=BOB).topics[0].error_code) == E.unknown_topic_or_partition
    assert _produce(b, "bob-new", batch(), BOB) == E.topic_authorization_failed  # Produce: no WRITE


# --- CreateTopics and DeleteTopics -----------------------------------------------------------------------
def _create(b: InProcessBroker, name: str, principal: str) -> Any:
    return b.call(19, 7, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
                                      "configs": []}], "timeout": 5000, "validate_only": False},
                  principal=principal).topics[0]


def test_create_topics_returns_configs_only_with_describe_configs(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.TOPIC, "bob-", BOB, Op.CREATE, pattern=P.PREFIXED),
             acl(R.TOPIC, "bob-seen", BOB, Op.DESCRIBE_CONFIGS))
    t = _create(b, "bob-x", BOB)
    assert (int(t.error_code), int(t.topic_config_error_code), len(t.configs or [])) == \
        (0, E.topic_authorization_failed, 0)
    assert "bob-x" in b.broker.logs.topics()
    t = _create(b, "bob-seen", BOB)
    assert (int(t.error_code), int(t.topic_config_error_code), t.num_partitions) == (0, 0, 1)
    assert t.configs


def _delete(b: InProcessBroker, principal: str, name: str | None = None, topic_id: Any = None) -> Any:
    return b.call(20, 6, {"topics": [{"name": name, "topic_id": topic_id}], "timeout": 5000},
                  principal=principal).responses[0]


def test_delete_topic_by_id_hides_an_undescribable_name(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.TOPIC, "seen", BOB, Op.DESCRIBE))
    b.create_topic("secret")
    b.create_topic("seen")
    topics = b.broker.logs.topics()
    e = _delete(b, BOB, topic_id=topics["secret"].topic_id)
    assert (e.name, int(e.error_code)) == (None, E.topic_authorization_failed)
    e = _delete(b, BOB, topic_id=topics["seen"].topic_id)
    assert (e.name, int(e.error_code)) == ("seen", E.topic_authorization_failed)
    assert int(_delete(b, BOB, name="seen-not").error_code) == E.topic_authorization_failed
    assert "secret" in b.broker.logs.topics()


def test_delete_on_the_cluster_authorizes_deleting_any_topic(make: Callable[..., InProcessBroker]) -> None:
    b = make(acl(R.CLUSTER, "kafka-cluster", BOB, Op.ALL))
    b.create_topic("t")
    b.create_topic("u")
    assert int(_delete(b, BOB, name="t").error_code) == 0
    assert int(_delete(b, BOB, topic_id=b.broker.logs.topics()["u"].topic_id).error_code) == 0
    assert not {"t", "u"} & set(b.broker.logs.topics())
    assert int(_delete(b, BOB, name="gone").error_code) == E.unknown_topic_or_partition


# --- configs -------------------------------------------------------------------------------------------
def test_describe_broker_logger_needs_describe_configs_on_the_cluster(make: Callable[..., InProcessBroker]) -> None:
    b = make()
    r = b.call(32, 4, {"resources": [{"resource_type": 8, "resource_name": "0", "configuration_keys": None}],
                       "include_synonyms": False, "include_documentation": False}, principal=BOB)
    assert int(r.results[0].error_code) == E.cluster_authorization_failed

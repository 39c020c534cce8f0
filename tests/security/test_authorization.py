"""ACLs and authorization: the authorizer's decisions (sans IO), then every API's checks through the
broker's request path as different principals (in process), then the ACL APIs with librdkafka's
AdminClient against a real broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from oncelog.security.acl import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

R, Op, P, A = ResourceType, Operation, PatternType, Permission


def acl(rtype: ResourceType, name: str, principal: str, op: Operation, perm: Permission = A.ALLOW,
        pattern: PatternType = P.LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


# --- the authorizer ----------------------------------------------------------------------------------
def test_literal_prefixed_and_wildcard_patterns(tmp_path: Path) -> None:
    a = Authorizer(tmp_path / "acls.json")
    assert a.create([acl(R.TOPIC, "orders", "User:alice", Op.READ),
                     acl(R.TOPIC, "pay-", "User:alice", Op.WRITE, pattern=P.PREFIXED),
                     acl(R.TOPIC, "*", "User:carol", Op.DESCRIBE)]) == [None, None, None]
    assert a.authorize("User:alice", "h", Op.READ, R.TOPIC, "orders")
    assert not a.authorize("User:alice", "h", Op.READ, R.TOPIC, "orders2")
    assert a.authorize("User:alice", "h", Op.WRITE, R.TOPIC, "pay-eu")
    assert not a.authorize("User:alice", "h", Op.WRITE, R.TOPIC, "pa")
    assert a.authorize("User:carol", "h", Op.DESCRIBE, R.TOPIC, "anything")
    assert not a.authorize("User:bob", "h", Op.READ, R.TOPIC, "orders")
    assert not a.authorize("User:alice", "h", Op.READ, R.GROUP, "orders")  # another resource type


def test_deny_wins_and_describe_is_implied(tmp_path: Path) -> None:
    a = Authorizer(tmp_path / "acls.json")
    a.create([acl(R.TOPIC, "pay-", "User:alice", Op.ALL, pattern=P.PREFIXED),
              acl(R.TOPIC, "pay-secret", "User:alice", Op.READ, A.DENY),
              acl(R.TOPIC, "t", "User:bob", Op.WRITE),
              acl(R.TOPIC, "t", "User:*", Op.DELETE, A.DENY, host="10.0.0.9")])
    assert a.authorize("User:alice", "h", Op.READ, R.TOPIC, "pay-eu")
    assert not a.authorize("User:alice", "h", Op.READ, R.TOPIC, "pay-secret")
    assert a.authorize("User:alice", "h", Op.WRITE, R.TOPIC, "pay-secret")  # the deny names READ only
    assert a.authorize("User:bob", "h", Op.DESCRIBE, R.TOPIC, "t")  # WRITE implies DESCRIBE
    assert not a.authorize("User:bob", "h", Op.READ, R.TOPIC, "t")
    assert not a.authorize("User:bob", "10.0.0.9", Op.DELETE, R.TOPIC, "t")
    bits = a.authorized_operations("User:bob", "h", R.TOPIC, "t")
    assert bits == (1 << Op.WRITE) | (1 << Op.DESCRIBE)


def test_super_users_allow_everyone_and_idempotent_write(tmp_path: Path) -> None:
    a = Authorizer(tmp_path / "acls.json", super_users={"User:admin"})
    assert a.authorize("User:admin", "h", Op.ALTER, R.CLUSTER, CLUSTER_NAME)
    assert not a.authorize("User:x", "h", Op.READ, R.TOPIC, "t")
    lenient = Authorizer(None, allow_everyone_if_no_acl_found=True)
    lenient.create([acl(R.TOPIC, "guarded", "User:alice", Op.READ)])
    assert lenient.authorize("User:x", "h", Op.READ, R.TOPIC, "open")
    assert not lenient.authorize("User:x", "h", Op.READ, R.TOPIC, "guarded")
    a.create([acl(R.TOPIC, "w", "User:p", Op.WRITE)])
    assert a.authorize_any("User:p", "h", Op.WRITE, R.TOPIC)
    assert not a.authorize_any("User:q", "h", Op.WRITE, R.TOPIC)


def test_invalid_bindings_are_refused_and_filters_match(tmp_path: Path) -> None:
    a = Authorizer(tmp_path / "acls.json")
    errors = a.create([acl(R.ANY, "x", "User:a", Op.READ), acl(R.TOPIC, "x", "alice", Op.READ),
                       acl(R.GROUP, "", "User:a", Op.READ), acl(R.CLUSTER, "c", "User:a", Op.ALTER),
                       acl(R.TOPIC, "x", "User:a", Op.ANY)])
    assert all(e is not None for e in errors) and a.bindings == []
    a.create([acl(R.TOPIC, "pay-", "User:a", Op.READ, pattern=P.PREFIXED), acl(R.TOPIC, "pay-eu", "User:b", Op.READ),
              acl(R.GROUP, "g", "User:a", Op.READ)])
    assert len(a.describe(AclFilter())) == 3
    assert len(a.describe(AclFilter(R.TOPIC, "pay-eu", P.MATCH))) == 2
    assert len(a.describe(AclFilter(R.TOPIC, "pay-eu", P.LITERAL))) == 1
    assert len(a.describe(AclFilter(principal="User:a"))) == 2
    removed = a.delete([AclFilter(R.TOPIC, pattern_type=P.PREFIXED)])
    assert [len(r) for r in removed] == [1]
    again = Authorizer(tmp_path / "acls.json")  # persisted
    assert sorted(b.resource_name for b in again.bindings) == ["g", "pay-eu"]


# --- every API, as different principals ------------------------------------------------------------
ALICE, BOB, ADMIN = "User:alice", "User:bob", "User:admin"


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users=ADMIN,
                             auto_create_topics_enable=True)
    broker.create_topic("alpha", 1)
    broker.create_topic("beta", 1)
    assert broker.broker.authorizer is not None
    broker.broker.authorizer.create([
        acl(R.TOPIC, "alpha", ALICE, Op.ALL), acl(R.GROUP, "g1", ALICE, Op.READ),
        acl(R.TRANSACTIONAL_ID, "t1", ALICE, Op.WRITE), acl(R.TOPIC, "beta", ALICE, Op.DESCRIBE),
    ])
    yield broker
    broker.close()


def _produce(b: InProcessBroker, topic: str, who: str, data: bytes, tid: str | None = None) -> int:
    r = b.call(0, 9, {"transactional_id": tid, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": data}]}]}, principal=who)
    return int(r.responses[0].partition_responses[0].error_code)


def _fetch(b: InProcessBroker, topic: str, who: str) -> int:
    r = b.call(1, 11, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                       "session_id": 0, "session_epoch": -1, "topics": [{"topic": topic, "partitions": [{
                           "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                           "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
                       "forgotten_topics_data": [], "rack_id": ""}, principal=who)
    return int(r.responses[0].partitions[0].error_code)


def _metadata(b: InProcessBroker, who: str, topics: list[str] | None) -> dict[str, int]:
    r = b.call(3, 12, {"topics": None if topics is None else [{"name": t, "topic_id": None} for t in topics],
                       "allow_auto_topic_creation": True, "include_topic_authorized_operations": True},
               principal=who)
    return {t.name: int(t.error_code) for t in r.topics}


def test_produce_fetch_and_metadata_follow_the_acls(b: InProcessBroker) -> None:
    assert _produce(b, "alpha", ALICE, batch(value=b"a")) == 0
    assert _produce(b, "beta", ALICE, batch(value=b"b")) == ErrorCode.topic_authorization_failed
    assert _produce(b, "alpha", BOB, batch(value=b"x")) == ErrorCode.topic_authorization_failed
    assert _fetch(b, "alpha", ALICE) == 0
    assert _fetch(b, "alpha", BOB) == ErrorCode.topic_authorization_failed
    assert _fetch(b, "beta", ALICE) == ErrorCode.topic_authorization_failed  # DESCRIBE is not READ
    assert _metadata(b, BOB, None) == {}  # hidden: not even the names
    assert set(_metadata(b, ALICE, None)) == {"alpha", "beta"}
    assert _metadata(b, BOB, ["alpha"]) == {"alpha": ErrorCode.topic_authorization_failed}
    # auto-creation needs CREATE: alice may not create "gamma", the super user may
    assert _metadata(b, ALICE, ["gamma"]) == {"gamma": ErrorCode.topic_authorization_failed}
    assert _metadata(b, ADMIN, ["gamma"]) == {"gamma": 0}
    r = b.call(3, 12, {"topics": [{"name": "beta", "topic_id": None}], "allow_auto_topic_creation": False,
                       "include_topic_authorized_operations": True}, principal=ALICE)
    assert r.topics[0].topic_authorized_operations == 1 << Op.DESCRIBE


def test_create_is_asked_only_for_a_topic_that_would_be_created(b: InProcessBroker) -> None:
    """Kafka checks CREATE only when it would create the topic: a produce or a metadata request about
    an existing topic costs no CREATE decision (each one walks every ACL binding), and a principal
    without CREATE leaves no denial behind it."""
    authorizer = b.broker.authorizer
    assert authorizer is not None
    asked: list[tuple[str, Operation, str]] = []
    decide = authorizer.authorize

    def counting(principal: str, host: str, op: Operation, rtype: ResourceType, name: str) -> bool:
        asked.append((principal, op, name))
        return decide(principal, host, op, rtype, name)

    authorizer.authorize = counting  # type: ignore[method-assign]
    assert _produce(b, "alpha", ALICE, batch(value=b"a")) == 0
    r = b.call(3, 12, {"topics": [{"name": "alpha", "topic_id": None}], "allow_auto_topic_creation": True,
                       "include_topic_authorized_operations": False}, principal=ALICE)  # KIP-430 would ask all
    assert r.topics[0].error_code == 0
    assert [a for a in asked if a[1] is Op.CREATE] == []
    # a missing topic with auto-creation on: CREATE is asked (cluster, then topic), and refused
    b.broker.authorizer.create([acl(R.TOPIC, "delta", ALICE, Op.WRITE)])
    assert _produce(b, "delta", ALICE, batch(value=b"d")) == ErrorCode.unknown_topic_or_partition
    assert [(a[1], a[2]) for a in asked if a[1] is Op.CREATE] == [(Op.CREATE, "kafka-cluster"), (Op.CREATE, "delta")]
    assert "delta" not in b.broker.logs.topics()


def test_idempotent_and_transactional_producers_need_their_acls(b: InProcessBroker) -> None:
    def init(who: str, tid: str | None) -> int:
        r = b.call(22, 4, {"transactional_id": tid, "transaction_timeout": 60_000, "producer_id": -1,
                           "producer_epoch": -1}, principal=who)
        return int(r.error_code)

    assert init(ALICE, None) == 0  # WRITE on a topic grants idempotence (KIP-679)
    assert init(BOB, None) == ErrorCode.cluster_authorization_failed
    assert init(ALICE, "t1") == 0
    assert init(ALICE, "t2") == ErrorCode.transactional_id_authorization_failed
    assert init(BOB, "t1") == ErrorCode.transactional_id_authorization_failed
    meta = b.broker.coordination.txn.state_of("t1")
    assert meta is not None
    pid, epoch = meta.producer_id, meta.producer_epoch
    r = b.call(24, 3, {"v3_and_below_transactional_id": "t1", "v3_and_below_producer_id": pid,
                       "v3_and_below_producer_epoch": epoch, "v3_and_below_topics": [
                           {"name": "alpha", "partitions": [0]}, {"name": "beta", "partitions": [0]}]},
               principal=ALICE)
    codes = {t.name: t.results_by_partition[0].partition_error_code for t in r.results_by_topic_v3_and_below}
    assert codes == {"alpha": ErrorCode.operation_not_attempted, "beta": ErrorCode.topic_authorization_failed}
    data = batch(pid=pid, epoch=epoch, seq=0, txn=True)
    assert _produce(b, "alpha", BOB, data, tid="t1") == ErrorCode.transactional_id_authorization_failed
    r = b.call(26, 3, {"transactional_id": "t1", "producer_id": pid, "producer_epoch": epoch, "committed": True},
               principal=BOB)
    assert r.error_code == ErrorCode.transactional_id_authorization_failed


def test_write_on_ones_own_transactional_id_does_not_reach_anothers_transaction(b: InProcessBroker) -> None:
    """Bob may write to (and read) "alpha", read the group "g1" and write to his own transactional id. With Alice's
    producer id, epoch and next sequence guessed, naming his id, he lands nothing in her transaction."""
    assert b.broker.authorizer is not None
    b.broker.authorizer.create([acl(R.TOPIC, "alpha", BOB, Op.WRITE), acl(R.TOPIC, "alpha", BOB, Op.READ),
                                acl(R.TRANSACTIONAL_ID, "bob-tx", BOB, Op.WRITE),
                                acl(R.GROUP, "g1", BOB, Op.READ)])
    r = b.call(22, 4, {"transactional_id": "t1", "transaction_timeout": 60_000, "producer_id": -1,
                       "producer_epoch": -1}, principal=ALICE)
    pid, epoch = r.producer_id, r.producer_epoch
    r = b.call(24, 3, {"v3_and_below_transactional_id": "t1", "v3_and_below_producer_id": pid,
                       "v3_and_below_producer_epoch": epoch,
                       "v3_and_below_topics": [{"name": "alpha", "partitions": [0]}]},
               principal=ALICE)
    assert r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code == 0
    assert b.call(25, 3, {"transactional_id": "t1", "producer_id": pid, "producer_epoch": epoch, "group_id": "g1"},
                  principal=ALICE).error_code == 0
    assert _produce(b, "alpha", ALICE, batch(pid=pid, epoch=epoch, seq=0, txn=True, value=b"alice"), tid="t1") == 0
    assert _produce(b, "alpha", BOB, batch(pid=pid, epoch=epoch, seq=1, txn=True, value=b"bob"), tid="bob-tx") == \
        ErrorCode.invalid_producer_id_mapping
    r = b.call(28, 3, {"transactional_id": "bob-tx", "group_id": "g1", "producer_id": pid, "producer_epoch": epoch,
                       "generation_id": -1, "member_id": "", "topics": [{"name": "alpha", "partitions": [
                           {"partition_index": 0, "committed_offset": 999, "committed_leader_epoch": -1,
                            "committed_metadata": None}]}]}, principal=BOB)
    assert r.topics[0].partitions[0].error_code == ErrorCode.invalid_producer_id_mapping
    assert b.call(26, 3, {"transactional_id": "t1", "producer_id": pid, "producer_epoch": epoch, "committed": True},
                  principal=ALICE).error_code == 0
    plog = b.broker.logs.get_partition("alpha", 0)
    assert plog is not None and plog.high_watermark == 2  # Alice's record and her commit marker, nothing of Bob's
    r = b.call(9, 8, {"groups": [{"group_id": "g1", "topics": None}], "require_stable": True}, principal=ADMIN)
    assert [t.partitions for t in r.groups[0].topics] == []


def test_groups_coordinators_and_cluster_actions_need_their_acls(b: InProcessBroker) -> None:
    def find(who: str, key: str, key_type: int) -> int:
        return int(b.call(10, 3, {"key": key, "key_type": key_type}, principal=who).error_code)

    assert find(ALICE, "g1", 0) == 0
    assert find(BOB, "g1", 0) == ErrorCode.group_authorization_failed
    assert find(BOB, "t1", 1) == ErrorCode.transactional_id_authorization_failed

    def commit(who: str, group: str, topic: str) -> int:
        r = b.call(8, 8, {"group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
                          "group_instance_id": None, "retention_time_ms": -1, "topics": [
                              {"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 1,
                                                              "committed_leader_epoch": -1,
                                                              "committed_metadata": None}]}]}, principal=who)
        return int(r.topics[0].partitions[0].error_code)

    assert commit(ALICE, "g1", "alpha") == 0
    assert commit(ALICE, "g2", "alpha") == ErrorCode.group_authorization_failed
    assert commit(ALICE, "g1", "beta") == ErrorCode.topic_authorization_failed
    r = b.call(16, 4, {"states_filter": []}, principal=BOB)
    assert [g.group_id for g in r.groups] == []
    r = b.call(16, 4, {"states_filter": []}, principal=ALICE)
    assert [g.group_id for g in r.groups] == ["g1"]
    r = b.call(27, 1, {"markers": [{"producer_id": 1, "producer_epoch": 0, "transaction_result": False,
                                    "coordinator_epoch": 0, "topics": [{"name": "alpha", "partition_indexes": [0]}]}]},
               principal=ALICE)
    assert r.markers[0].topics[0].partitions[0].error_code == ErrorCode.cluster_authorization_failed
    r = b.call(42, 2, {"groups_names": ["g1"]}, principal=ALICE)
    assert r.results[0].error_code == ErrorCode.group_authorization_failed
    r = b.call(19, 7, {"topics": [{"name": "new", "num_partitions": 1, "replication_factor": 1, "assignments": [],
                                   "configs": []}], "timeout": 5000, "validate_only": False}, principal=ALICE)
    assert r.topics[0].error_code == ErrorCode.topic_authorization_failed


def test_acl_apis_need_cluster_alter_and_survive_a_restart(b: InProcessBroker) -> None:
    creation = {"creations": [{"resource_type": int(R.TOPIC), "resource_name": "beta",
                               "resource_pattern_type": int(P.LITERAL), "principal": BOB, "host": "*",
                               "operation": int(Op.READ), "permission_type": int(A.ALLOW)}]}
    assert b.call(30, 3, creation, principal=ALICE).results[0].error_code == ErrorCode.cluster_authorization_failed
    assert b.call(30, 3, creation, principal=ADMIN).results[0].error_code == 0
    assert _fetch(b, "beta", BOB) == 0
    b.restart(clean=True)
    assert _fetch(b, "beta", BOB) == 0
    describe = {"resource_type_filter": int(R.TOPIC), "resource_name_filter": "beta",
                "pattern_type_filter": int(P.MATCH), "principal_filter": None, "host_filter": None,
                "operation": int(Op.ANY), "permission_type": int(A.ANY)}
    r = b.call(29, 3, describe, principal=ADMIN)
    assert sorted((a.principal, a.operation) for res in r.resources for a in res.acls) == \
        [(ALICE, Op.DESCRIBE), (BOB, Op.READ)]
    r = b.call(31, 3, {"filters": [{**describe, "principal_filter": BOB}]}, principal=ADMIN)
    assert len(r.filter_results[0].matching_acls) == 1
    assert _fetch(b, "beta", BOB) == ErrorCode.topic_authorization_failed


def test_without_an_authorizer_everything_is_allowed_and_acl_apis_say_so(tmp_path: Path) -> None:
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic("alpha", 1)
    assert _produce(broker, "alpha", BOB, batch()) == 0
    r = broker.call(3, 12, {"topics": None, "allow_auto_topic_creation": False,
                            "include_topic_authorized_operations": True}, principal=BOB)
    ops = r.topics[0].topic_authorized_operations
    assert ops & (1 << Op.READ) and ops & (1 << Op.ALTER_CONFIGS)  # the full set, as Kafka without an authorizer
    r = broker.call(30, 3, {"creations": []}, principal=BOB)
    describe = broker.call(29, 3, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                                   "principal_filter": None, "host_filter": None, "operation": 1,
                                   "permission_type": 1}, principal=BOB)
    assert describe.error_code == ErrorCode.security_disabled
    broker.close()


# --- the ACL APIs with librdkafka's AdminClient --------------------------------------------------------
def test_librdkafka_admin_creates_describes_and_deletes_acls(tmp_path: Path) -> None:
    from confluent_kafka.admin import (
        AclBinding as KAclBinding,
    )
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
    )
    from confluent_kafka.admin import (
        ResourceType as KResourceType,
    )

    from oncelog.testing.broker_process import oncelog_broker

    cfg = tmp_path / "broker.toml"
    # no SASL here: every client is User:ANONYMOUS, made a super user so it may manage ACLs
    cfg.write_text('authorizer_enabled = true\nsuper_users = "User:ANONYMOUS"\n')
    broker = oncelog_broker(tmp_path / "d", "--config", str(cfg), log_path=tmp_path / "broker.log").start()
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        bindings = [
            KAclBinding(KResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", "*",
                        AclOperation.READ, AclPermissionType.ALLOW),
            KAclBinding(KResourceType.GROUP, "etl-", ResourcePatternType.PREFIXED, "User:alice", "*",
                        AclOperation.READ, AclPermissionType.ALLOW),
            KAclBinding(KResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:mallory", "*",
                        AclOperation.ALL, AclPermissionType.DENY),
        ]
        for f in admin.create_acls(bindings, request_timeout=10).values():
            assert f.result(10) is None
        match_all = AclBindingFilter(KResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                     AclOperation.ANY, AclPermissionType.ANY)
        described = admin.describe_acls(match_all, request_timeout=10).result(10)
        assert {(b.name, b.principal, b.operation) for b in described} == {
            ("orders", "User:alice", AclOperation.READ), ("etl-", "User:alice", AclOperation.READ),
            ("orders", "User:mallory", AclOperation.ALL)}
        deny_filter = AclBindingFilter(KResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:mallory",
                                       None, AclOperation.ANY, AclPermissionType.DENY)
        deleted = admin.delete_acls([deny_filter], request_timeout=10)[deny_filter].result(10)
        assert [(b.name, b.principal) for b in deleted] == [("orders", "User:mallory")]
        assert len(admin.describe_acls(match_all, request_timeout=10).result(10)) == 2
    finally:
        broker.kill()

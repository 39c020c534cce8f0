"""With SASL on, a user sees and uses only what ACLs grant — topics, groups and transactional ids —
with the users and ACLs made through librdkafka's AdminClient by a super user, and checked with
confluent-kafka, kafka-python and kcat as the granted user and as one granted nothing."""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from oncelog.testing.broker_process import BrokerProcess
from tests.security.conftest import SUPER, rdkafka_conf

BOB = ("bob", "bob-pw-77")
EVE = ("eve", "eve-pw-13")


def _allow(rtype: ResourceType, name: str, op: AclOperation, pattern: ResourcePatternType = ResourcePatternType.LITERAL,
           principal: str = "User:bob") -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


@pytest.fixture
def granted(start_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    """alice (super user, made offline) creates bob and eve and grants bob: topics orders* (read,
    write), groups bob-* (read), transactional id bob-tx (write). eve is granted nothing."""
    b = start_broker("--sasl", *SUPER)
    admin = AdminClient(rdkafka_conf(b))
    for name, pw in (BOB, EVE):
        upsert = UserScramCredentialUpsertion(name, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                              pw.encode())
        for f in admin.alter_user_scram_credentials([upsert]).values():
            assert f.result(timeout=30) is None
    acls = [_allow(ResourceType.TOPIC, "orders", AclOperation.READ, ResourcePatternType.PREFIXED),
            _allow(ResourceType.TOPIC, "orders", AclOperation.WRITE, ResourcePatternType.PREFIXED),
            _allow(ResourceType.GROUP, "bob-", AclOperation.READ, ResourcePatternType.PREFIXED),
            _allow(ResourceType.TRANSACTIONAL_ID, "bob-tx", AclOperation.WRITE)]
    for f in admin.create_acls(acls, request_timeout=30).values():
        assert f.result(timeout=30) is None
    p = Producer(rdkafka_conf(b))
    for topic in ("orders-eu", "secret"):
        p.produce(topic, b"seed-" + topic.encode())
    assert p.flush(30) == 0
    return b


def _consume(conf: dict[str, Any], topic: str, group: str, seconds: float) -> tuple[list[bytes], list[str]]:
    errors: list[str] = []
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "error_cb": lambda e: errors.append(e.name()), "log_level": 0})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not got:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error() is not None:
            errors.append(m.error().name())
        else:
            got.append(m.value())
    try:
        c.commit(asynchronous=False)
    except KafkaException as exc:
        errors.append(exc.args[0].name())
    c.close()
    return got, errors


def test_librdkafka_user_reads_writes_and_transacts_only_as_granted(granted: BrokerProcess) -> None:
    bob = rdkafka_conf(granted, user=BOB)
    got, errors = _consume(bob, "orders-eu", "bob-readers", 20)
    assert got == [b"seed-orders-eu"], errors
    _got, errors = _consume(bob, "orders-eu", "not-bobs-group", 8)
    assert "GROUP_AUTHORIZATION_FAILED" in errors
    got, errors = _consume(bob, "secret", "bob-snoop", 8)
    assert got == [] and "TOPIC_AUTHORIZATION_FAILED" in errors
    # transactions with his own transactional id, not with another's
    p = Producer({**bob, "transactional.id": "bob-tx"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("orders-eu", b"in-bobs-txn")
    p.commit_transaction(30)
    with pytest.raises(KafkaException) as exc:
        Producer({**bob, "transactional.id": "alice-tx"}).init_transactions(20)
    assert "TRANSACTIONAL_ID_AUTHORIZATION_FAILED" in str(exc.value)
    # metadata: bob sees only the topics he may describe
    names = set(AdminClient(bob).list_topics(timeout=20).topics)
    assert names == {"orders-eu"}, names
    eve = rdkafka_conf(granted, user=EVE)
    assert set(AdminClient(eve).list_topics(timeout=20).topics) == set()
    errors: list[Any] = []
    pe = Producer({**eve, "message.timeout.ms": 5000})
    pe.produce("orders-eu", b"eve", on_delivery=lambda err, msg: errors.append(err))
    pe.flush(20)
    assert errors and errors[0] is not None and errors[0].name() == "TOPIC_AUTHORIZATION_FAILED"


def test_kafka_python_user_is_held_to_the_acls(granted: BrokerProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError

    conf = {"bootstrap_servers": granted.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": BOB[0], "sasl_plain_password": BOB[1]}
    p = KafkaProducer(**conf)
    p.send("orders-eu", b"from-kafka-python").get(timeout=30)
    with pytest.raises(TopicAuthorizationFailedError):
        p.send("secret", b"no").get(timeout=30)
    p.close()
    c = KafkaConsumer("orders-eu", group_id=f"bob-{uuid.uuid4().hex[:6]}", auto_offset_reset="earliest",
                      consumer_timeout_ms=15000, **conf)
    values = {m.value for m in c}
    c.close()
    assert {b"seed-orders-eu", b"from-kafka-python"} <= values


def test_kcat_user_lists_and_writes_only_as_granted(granted: BrokerProcess) -> None:
    assert shutil.which("kcat"), "kcat is missing: make setup installs Debian's package"
    base = ["kcat", "-b", granted.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
            "-X", "sasl.mechanisms=SCRAM-SHA-256",
            "-X", f"sasl.username={BOB[0]}", "-X", f"sasl.password={BOB[1]}"]
    listed = subprocess.run([*base, "-L", "-J"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert '"orders-eu"' in listed.stdout and '"secret"' not in listed.stdout
    ok = subprocess.run([*base, "-P", "-t", "orders-eu"], input="via-kcat\n", capture_output=True, text=True,
                        timeout=60)
    assert ok.returncode == 0, ok.stderr
    denied = subprocess.run([*base, "-P", "-t", "secret"], input="no\n", capture_output=True, text=True, timeout=60)
    assert denied.returncode != 0 or "Authorization" in denied.stderr or "authorization" in denied.stderr, \
        denied.stderr

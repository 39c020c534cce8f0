"""SASL with clients nobody here wrote: librdkafka (confluent-kafka), kafka-python and kcat, each
against its own broker started with --sasl and users made offline by `oncelog users add`."""

from __future__ import annotations

import logging
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from oncelog.testing.broker_process import BrokerProcess
from tests.security.conftest import ALICE, rdkafka_conf

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
GENERIC = "Authentication failed during authentication due to invalid credentials with SASL mechanism "


def produce(conf: dict[str, Any], topic: str, values: list[bytes]) -> None:
    p = Producer(conf)
    results: list[Any] = []
    for v in values:
        p.produce(topic, v, on_delivery=lambda err, msg: results.append(err))
    assert p.flush(30) == 0
    assert results == [None] * len(values)


def consume(conf: dict[str, Any], topic: str, n: int, timeout_s: float = 30,
            extra: dict[str, Any] | None = None) -> list[bytes]:
    c = Consumer({**conf, "group.id": f"g-{uuid.uuid4().hex}", "enable.auto.commit": False, **(extra or {})})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    return got


def errors_of(conf: dict[str, Any], seconds: float, topic: str = "secret") -> tuple[list[bytes], list[str]]:
    """Try to read a topic for ``seconds``; what arrived and the errors librdkafka reported."""
    errors: list[str] = []
    c = Consumer({**conf, "group.id": "intruder", "error_cb": lambda e: errors.append(str(e)), "log_level": 0})
    c.assign([TopicPartition(topic, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value())
    c.close()
    return got, errors


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_produces_and_consumes(sasl_broker: BrokerProcess, mechanism: str) -> None:
    conf = rdkafka_conf(sasl_broker, mechanism)
    produce(conf, "payments", [f"{mechanism}-{i}".encode() for i in range(50)])
    assert consume(conf, "payments", 50) == [f"{mechanism}-{i}".encode() for i in range(50)]


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_transactions(sasl_broker: BrokerProcess, mechanism: str) -> None:
    conf = rdkafka_conf(sasl_broker, mechanism)
    p = Producer({**conf, "transactional.id": f"tx-{mechanism}"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("ledger", b"committed-1")
    p.produce("ledger", b"committed-2")
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce("ledger", b"aborted")
    p.abort_transaction(30)
    p.begin_transaction()
    p.produce("ledger", b"committed-3")
    p.commit_transaction(30)
    assert consume(conf, "ledger", 3, extra={"isolation.level": "read_committed"}) == \
        [b"committed-1", b"committed-2", b"committed-3"]


def test_a_client_without_credentials_gets_no_data(sasl_broker: BrokerProcess) -> None:
    produce(rdkafka_conf(sasl_broker), "secret", [b"classified"])
    got, errors = errors_of(rdkafka_conf(sasl_broker, None), 6)
    assert got == []
    assert errors, "librdkafka should report that the broker closed its connections"
    admin = AdminClient(rdkafka_conf(sasl_broker, None, log_level=0))
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    # kcat without credentials: nothing on stdout, a failure exit
    r = subprocess.run(["kcat", "-b", sasl_broker.bootstrap, "-C", "-t", "secret", "-o", "beginning", "-e",
                        "-m", "5"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "classified" not in r.stdout


@pytest.mark.parametrize(("mechanism", "user", "message"), [
    ("SCRAM-SHA-256", ("alice", "wrong"), GENERIC + "SCRAM-SHA-256"),
    ("SCRAM-SHA-512", ("nobody", "x"), GENERIC + "SCRAM-SHA-512"),
    ("PLAIN", ("alice", "wrong"), "Authentication failed: Invalid username or password"),
    ("PLAIN", ("nobody", "x"), "Authentication failed: Invalid username or password"),
])
def test_a_wrong_password_is_refused_with_a_clear_error(sasl_broker: BrokerProcess, mechanism: str,
                                                        user: tuple[str, str], message: str) -> None:
    produce(rdkafka_conf(sasl_broker), "secret", [b"classified"])
    got, errors = errors_of(rdkafka_conf(sasl_broker, mechanism, user), 4)
    assert got == []
    assert any("_AUTHENTICATION" in e and message in e for e in errors), errors


def test_kcat_wrong_password_says_why(sasl_broker: BrokerProcess) -> None:
    r = subprocess.run(["kcat", "-b", sasl_broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                        "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=alice", "-X", "sasl.password=no",
                        "-L"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert GENERIC + "SCRAM-SHA-256" in r.stderr


def _kafka_python_kwargs(b: BrokerProcess, mechanism: str, user: tuple[str, str] = ALICE) -> dict[str, Any]:
    return {"bootstrap_servers": b.bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
            "sasl_plain_username": user[0], "sasl_plain_password": user[1]}


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_produces_and_consumes(sasl_broker: BrokerProcess, mechanism: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    p = KafkaProducer(**_kafka_python_kwargs(sasl_broker, mechanism))
    for i in range(20):
        p.send("kp", f"kp-{mechanism}-{i}".encode())
    p.flush(30)
    p.close()
    c = KafkaConsumer(**_kafka_python_kwargs(sasl_broker, mechanism), consumer_timeout_ms=5000,
                      auto_offset_reset="earliest", enable_auto_commit=False)
    c.assign([KTopicPartition("kp", 0)])
    assert [m.value for m in c] == [f"kp-{mechanism}-{i}".encode() for i in range(20)]
    c.close()


def test_kafka_python_wrong_password_is_refused(sasl_broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaTimeoutError

    caplog.set_level(logging.WARNING, logger="kafka")
    with pytest.raises(KafkaTimeoutError):
        KafkaProducer(**_kafka_python_kwargs(sasl_broker, "SCRAM-SHA-512", ("alice", "nope")),
                      bootstrap_timeout_ms=4000)
    assert GENERIC + "SCRAM-SHA-512" in caplog.text


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_produces_and_consumes(sasl_broker: BrokerProcess, mechanism: str) -> None:
    sasl = ["-X", "security.protocol=SASL_PLAINTEXT", "-X", f"sasl.mechanisms={mechanism}",
            "-X", f"sasl.username={ALICE[0]}", "-X", f"sasl.password={ALICE[1]}"]
    lines = "\n".join(f"kcat-{mechanism}-{i}" for i in range(10)) + "\n"
    r = subprocess.run(["kcat", "-b", sasl_broker.bootstrap, *sasl, "-P", "-t", "kc"], input=lines,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["kcat", "-b", sasl_broker.bootstrap, *sasl, "-C", "-t", "kc", "-o", "beginning", "-e"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == lines.splitlines()


def _alter(admin: AdminClient, alterations: list[Any]) -> dict[str, Any]:
    futures = admin.alter_user_scram_credentials(alterations)
    return {user: f.exception(timeout=30) for user, f in futures.items()}


def produce_error(conf: dict[str, Any], topic: str) -> str:
    """Produce one record that must be refused; the delivery error's name."""
    p = Producer({**conf, "message.timeout.ms": 5000})
    results: list[Any] = []
    p.produce(topic, b"refused", on_delivery=lambda err, msg: results.append(err))
    p.flush(15)
    assert len(results) == 1 and results[0] is not None
    return str(results[0].name())


def test_users_and_acls_made_with_admin_client_survive_restarts(start_broker: Callable[..., BrokerProcess]) -> None:
    """The whole flow an operator follows: a super user made offline creates users and grants them
    topics with librdkafka's AdminClient; each user writes only what it was granted."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    b = start_broker("--sasl", "--super-users", "User:alice")
    admin = AdminClient(rdkafka_conf(b))
    assert _alter(admin, [UserScramCredentialUpsertion(
        "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"bob-pw", b"bob-salt")]) == {"bob": None}
    assert _alter(admin, [UserScramCredentialUpsertion(
        "bob", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"bob-pw")]) == {"bob": None}
    assert _alter(admin, [UserScramCredentialUpsertion(
        "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"carol-pw")]) == {"carol": None}
    produce(rdkafka_conf(b), "bobs", [b"made-by-alice"])
    produce(rdkafka_conf(b), "alices", [b"made-by-alice"])
    grant = AclBinding(ResourceType.TOPIC, "bobs", ResourcePatternType.LITERAL, "User:bob", "*",
                       AclOperation.WRITE, AclPermissionType.ALLOW)
    for f in admin.create_acls([grant], request_timeout=15).values():
        assert f.result() is None
    bob = ("bob", "bob-pw")
    for mechanism in MECHANISMS:
        produce(rdkafka_conf(b, mechanism, bob), "bobs", [mechanism.encode()])
    assert produce_error(rdkafka_conf(b, "SCRAM-SHA-256", bob), "alices") == "TOPIC_AUTHORIZATION_FAILED"
    bobs_admin = AdminClient(rdkafka_conf(b, "PLAIN", bob))
    refused = _alter(bobs_admin, [UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"stolen")])
    assert "CLUSTER_AUTHORIZATION_FAILED" in str(refused["alice"])  # bob cannot take over alice
    described = {u: f.result(timeout=30) for u, f in admin.describe_user_scram_credentials(["bob", "alice"]).items()}
    assert sorted((i.mechanism, i.iterations) for i in described["bob"].scram_credential_infos) == \
        [(ScramMechanism.SCRAM_SHA_256, 8192), (ScramMechanism.SCRAM_SHA_512, 4096)]
    assert len(described["alice"].scram_credential_infos) == 2  # made offline: both mechanisms
    # carol only had SCRAM-SHA-512: deleting it deletes her
    assert _alter(admin, [UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_512)]) == {"carol": None}

    b.restart()  # kill -9 and start again on the same data directory
    admin = AdminClient(rdkafka_conf(b, "SCRAM-SHA-512"))
    everyone = admin.describe_user_scram_credentials().result(timeout=30)
    assert set(everyone) == {"alice", "bob"}
    for mechanism in MECHANISMS:
        produce(rdkafka_conf(b, mechanism, bob), "bobs", [b"after-restart"])
        produce(rdkafka_conf(b, mechanism), "alices", [b"after-restart"])
    assert produce_error(rdkafka_conf(b, "SCRAM-SHA-512", bob), "alices") == "TOPIC_AUTHORIZATION_FAILED"
    got, errors = errors_of(rdkafka_conf(b, "SCRAM-SHA-512", ("carol", "carol-pw")), 3)
    assert got == [] and any(GENERIC in e for e in errors)


def test_admin_client_errors_as_kafka_answers_them(sasl_broker: BrokerProcess) -> None:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient(rdkafka_conf(sasl_broker))
    errors = _alter(admin, [UserScramCredentialDeletion("ghost", ScramMechanism.SCRAM_SHA_256)])
    assert "Attempt to delete a user credential that does not exist" in str(errors["ghost"])
    errors = _alter(admin, [UserScramCredentialUpsertion(
        "weak", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 1000), b"pw")])
    assert "Too few iterations" in str(errors["weak"])
    errors = _alter(admin, [UserScramCredentialUpsertion(
        "slow", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 20000), b"pw")])
    assert "Too many iterations" in str(errors["slow"])
    futures = admin.describe_user_scram_credentials(["ghost"])
    with pytest.raises(KafkaException, match="Attempt to describe a user credential that does not exist: ghost"):
        futures["ghost"].result(timeout=30)


def test_a_deleted_user_is_disconnected_and_cannot_come_back(start_broker: Callable[..., BrokerProcess]) -> None:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    sasl_broker = start_broker("--sasl", "--super-users", "User:alice,User:dave")
    admin = AdminClient(rdkafka_conf(sasl_broker))
    assert _alter(admin, [UserScramCredentialUpsertion(
        "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"dave-pw")]) == {"dave": None}
    dave = ("dave", "dave-pw")
    errors: list[str] = []
    p = Producer(rdkafka_conf(sasl_broker, "SCRAM-SHA-256", dave, error_cb=lambda e: errors.append(str(e)),
                              log_level=0, **{"message.timeout.ms": 4000}))
    delivered: list[Any] = []
    p.produce("daves", b"before", on_delivery=lambda err, msg: delivered.append(err))
    assert p.flush(30) == 0 and delivered == [None], [str(e) for e in delivered]
    assert _alter(admin, [UserScramCredentialDeletion("dave", ScramMechanism.SCRAM_SHA_256)]) == {"dave": None}
    p.produce("daves", b"after", on_delivery=lambda err, msg: delivered.append(err))
    p.flush(10)
    assert len(delivered) == 2 and delivered[1] is not None  # not written: dave is gone
    assert any(GENERIC + "SCRAM-SHA-256" in e for e in errors), errors
    assert consume(rdkafka_conf(sasl_broker), "daves", 2, timeout_s=5) == [b"before"]
    log = sasl_broker.log_path.read_text()  # type: ignore[union-attr]
    assert "its user User:dave was deleted" in log


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_produces_and_consumes(sasl_broker: BrokerProcess, mechanism: str) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.structs import TopicPartition as ATopicPartition

    sasl = {"bootstrap_servers": sasl_broker.bootstrap, "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism, "sasl_plain_username": ALICE[0], "sasl_plain_password": ALICE[1]}

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(**sasl)
        await p.start()
        try:
            for i in range(5):
                await p.send_and_wait("aio", f"aio-{i}".encode())
        finally:
            await p.stop()
        c = AIOKafkaConsumer(**sasl, auto_offset_reset="earliest", enable_auto_commit=False)
        await c.start()
        try:
            c.assign([ATopicPartition("aio", 0)])
            got: list[bytes] = []
            while len(got) < 5:
                batch = await asyncio.wait_for(c.getmany(timeout_ms=1000), 30)
                got += [m.value for msgs in batch.values() for m in msgs]
            return got
        finally:
            await c.stop()

    assert asyncio.run(run()) == [f"aio-{i}".encode() for i in range(5)]

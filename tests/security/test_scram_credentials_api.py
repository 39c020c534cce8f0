"""AlterUserScramCredentials and DescribeUserScramCredentials in process: Kafka's rules, per user."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.protocol.errors import ErrorCode
from oncelog.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, salted_password
from oncelog.server.handlers import scram_credentials
from tests.inproc import InProcessBroker

ALTER, DESCRIBE = 51, 50


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    yield broker
    broker.close()


def upsert(name: str, mechanism: int = 1, iterations: int = 4096, password: str = "pw", salt: bytes = b"salt",
           salted: bytes | None = None) -> dict[str, Any]:
    mech = {1: SCRAM_SHA_256, 2: SCRAM_SHA_512}.get(mechanism, SCRAM_SHA_256)
    return {"name": name, "mechanism": mechanism, "iterations": iterations, "salt": salt,
            "salted_password": salted if salted is not None else salted_password(mech, password, salt, iterations)}


def alter(b: InProcessBroker, upsertions: list[dict[str, Any]] = [],  # noqa: B006
          deletions: list[dict[str, Any]] = []) -> dict[str, tuple[int, str | None]]:  # noqa: B006
    r = b.call(ALTER, 0, {"deletions": deletions, "upsertions": upsertions})
    return {x.user: (int(x.error_code), x.error_message) for x in r.results}


def describe(b: InProcessBroker, names: list[str] | None) -> Any:
    return b.call(DESCRIBE, 0, {"users": None if names is None else [{"name": n} for n in names]})


def test_upsert_derives_the_keys_from_the_salted_password(b: InProcessBroker) -> None:
    assert alter(b, [upsert("alice", 2, 8192, "s3cret", b"NaCl")]) == {"alice": (0, None)}
    c = b.broker.security.credentials.get("alice", SCRAM_SHA_512)
    assert c is not None and c.salt == b"NaCl" and c.iterations == 8192
    assert c.matches_password(SCRAM_SHA_512, "s3cret") and not c.matches_password(SCRAM_SHA_512, "s3cre")
    b.restart(clean=False)  # a crash: the change was durable when answered
    assert b.broker.security.credentials.get("alice", SCRAM_SHA_512) == c


def test_kafkas_validation_messages(b: InProcessBroker) -> None:
    assert alter(b, [upsert("few", iterations=4095), upsert("many", iterations=16385),
                     upsert("", 1), upsert("mech", 3, salted=b"x" * 32), upsert("nosalt", salt=b""),
                     upsert("short", salted=b"x" * 31), upsert("nul\0name")],
                 [{"name": "ghost", "mechanism": 1}]) == {
        "few": (ErrorCode.unacceptable_credential, "Too few iterations"),
        "many": (ErrorCode.unacceptable_credential, "Too many iterations"),
        "": (ErrorCode.unacceptable_credential, "Username must not be empty"),
        "mech": (ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"),
        "nosalt": (ErrorCode.unacceptable_credential, "Salt must not be empty"),
        "short": (ErrorCode.unacceptable_credential, "The salted password must be 32 bytes for SCRAM-SHA-256"),
        "nul\0name": (ErrorCode.unacceptable_credential, "Username must not contain NUL"),
        "ghost": (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist"),
    }
    assert dict(b.broker.security.credentials.users()) == {}


def test_a_user_may_appear_once_per_request(b: InProcessBroker) -> None:
    alter(b, [upsert("carol")])
    dup = (ErrorCode.duplicate_resource, "A user credential cannot be altered twice in the same request")
    assert alter(b, [upsert("alice", 1), upsert("alice", 2), upsert("bob")],
                 [{"name": "carol", "mechanism": 1}, {"name": "carol", "mechanism": 1}]) == {
        "alice": dup, "carol": dup, "bob": (0, None)}
    assert alter(b, [upsert("carol", 2)], [{"name": "carol", "mechanism": 1}]) == {"carol": dup}
    assert set(b.broker.security.credentials.users()) == {"bob", "carol"}
    assert set(b.broker.security.credentials.users()["carol"]) == {"SCRAM-SHA-256"}  # untouched


def test_describe_one_some_all(b: InProcessBroker) -> None:
    alter(b, [upsert("alice", 1, 4096)])
    alter(b, [upsert("alice", 2, 5000)])
    alter(b, [upsert("bob", 2)])
    r = describe(b, ["alice", "ghost", "bob", "bob"])
    got = {x.user: (int(x.error_code), x.error_message, [(int(i.mechanism), i.iterations) for i in x.credential_infos])
           for x in r.results}
    assert got == {
        "alice": (0, None, [(1, 4096), (2, 5000)]),
        "ghost": (ErrorCode.resource_not_found, "Attempt to describe a user credential that does not exist: ghost", []),
        "bob": (ErrorCode.duplicate_resource,
                "Cannot describe SCRAM credentials for the same user twice in a single request: bob", []),
    }
    assert [x.user for x in describe(b, None).results] == ["alice", "bob"]
    assert [x.user for x in describe(b, []).results] == ["alice", "bob"]


def test_the_authorization_seam_answers_as_kafka(b: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def deny(broker: Any, req: Any, operation: str) -> bool:
        asked.append(operation)
        return False

    monkeypatch.setattr(scram_credentials, "authorize_cluster_operation", deny)
    assert alter(b, [upsert("alice")], [{"name": "bob", "mechanism": 1}]) == {
        "bob": (ErrorCode.cluster_authorization_failed, None), "alice": (ErrorCode.cluster_authorization_failed, None)}
    r = describe(b, None)
    assert r.error_code == ErrorCode.cluster_authorization_failed and r.results == ()
    assert asked == ["ALTER", "DESCRIBE"]
    assert dict(b.broker.security.credentials.users()) == {}


def test_sasl_apis_in_process_have_no_connection_and_answer_illegal_state(b: InProcessBroker) -> None:
    assert b.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.illegal_sasl_state
    assert b.call(36, 2, {"auth_bytes": b"\0a\0b"}).error_code == ErrorCode.illegal_sasl_state


def test_a_failed_write_is_an_error_and_changes_nothing(b: InProcessBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    from oncelog.storage import fileio

    alter(b, [upsert("alice")])

    def broken(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.fs, "write_atomic", broken)
    got = alter(b, [upsert("bob")], [{"name": "alice", "mechanism": 1}])
    assert {u: code for u, (code, _m) in got.items()} == {"alice": ErrorCode.unknown_server_error,
                                                         "bob": ErrorCode.unknown_server_error}
    assert "No space left on device" in str(got["bob"][1])
    assert set(b.broker.security.credentials.users()) == {"alice"}


def test_with_the_authorizer_users_need_alter_or_describe_on_the_cluster(tmp_path: Path) -> None:
    from oncelog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType

    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin")
    try:
        call = {"deletions": [], "upsertions": [upsert("eve")]}
        r = b.call(ALTER, 0, call, principal="User:bob")
        assert [(x.user, x.error_code) for x in r.results] == [("eve", ErrorCode.cluster_authorization_failed)]
        assert b.call(DESCRIBE, 0, {"users": None}, principal="User:bob").error_code == \
            ErrorCode.cluster_authorization_failed
        assert b.call(ALTER, 0, call, principal="User:admin").results[0].error_code == 0
        assert b.broker.authorizer is not None
        b.broker.authorizer.create([AclBinding(ResourceType.CLUSTER, "kafka-cluster", PatternType.LITERAL,
                                               "User:bob", "*", Operation.DESCRIBE, Permission.ALLOW)])
        assert [x.user for x in b.call(DESCRIBE, 0, {"users": None}, principal="User:bob").results] == ["eve"]
        r = b.call(ALTER, 0, {"deletions": [{"name": "eve", "mechanism": 1}], "upsertions": []}, principal="User:bob")
        assert r.results[0].error_code == ErrorCode.cluster_authorization_failed
        assert "eve" in b.broker.security.credentials.users()
    finally:
        b.close()


def test_new_credentials_past_the_free_space_kept_are_refused_and_deletions_still_go_through(
        b: InProcessBroker) -> None:
    """users.json is written whole at each change: past log_dir_min_free_bytes an upsertion gets
    KAFKA_STORAGE_ERROR (a client adding users in a loop would fill the disk), while a deletion in
    the same request, which gives room back, is carried out."""
    assert alter(b, [upsert("alice"), upsert("bob")]) == {"alice": (0, None), "bob": (0, None)}
    b.broker.logs.dir_state.min_free_bytes = 1 << 62
    out = alter(b, [upsert("carol")], [{"name": "bob", "mechanism": 1}])
    assert out["bob"] == (0, None)
    code, message = out["carol"]
    assert code == ErrorCode.kafka_storage_error and "log_dir_min_free_bytes" in (message or "")
    assert [u.user for u in describe(b, None).results] == ["alice"]
    b.broker.logs.dir_state.min_free_bytes = 0
    assert alter(b, [upsert("carol")]) == {"carol": (0, None)}

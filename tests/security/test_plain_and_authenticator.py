"""SASL/PLAIN against SCRAM credentials, and the per-connection SASL state machine, sans IO."""

from __future__ import annotations

import pytest

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.versions import (
    API_API_VERSIONS,
    API_METADATA,
    API_PRODUCE,
    API_SASL_AUTHENTICATE,
    API_SASL_HANDSHAKE,
)
from oncelog.security.errors import SaslAuthenticationError, SaslError, generic_failure_message
from oncelog.security.plain_sasl_server import INVALID_CREDENTIALS, PlainSaslServer
from oncelog.security.sasl_server_authenticator import IllegalSaslStateError, SaslServerAuthenticator, SaslState
from oncelog.security.scram import SCRAM_SHA_256, SCRAM_SHA_512
from tests.security.scram_client import ScramClient
from tests.security.test_scram_server import SECRET, Users


def plain(users: Users) -> PlainSaslServer:
    return PlainSaslServer(users.get, SECRET)


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512], ids=lambda m: m.name)
def test_plain_is_checked_against_either_scram_credential(mechanism) -> None:  # type: ignore[no-untyped-def]
    users = Users()
    users.add("alice", "pässword", mechanism)
    s = plain(users)
    assert s.evaluate_response("\0alice\0pässword".encode()) == b""
    assert s.complete and s.username == "alice"


@pytest.mark.parametrize("token", [b"\0alice\0wrong", b"\0nobody\0pw", b"\0alice\0pw-but-longer"])
def test_a_wrong_password_and_an_unknown_user_get_the_same_kafka_message(token: bytes) -> None:
    users = Users()
    users.add("alice", "pw")
    s = plain(users)
    with pytest.raises(SaslAuthenticationError) as exc:
        s.evaluate_response(token)
    assert str(exc.value) == INVALID_CREDENTIALS == "Authentication failed: Invalid username or password"
    assert not s.complete and s.username is None


@pytest.mark.parametrize("token", [b"", b"alice", b"\0alice", b"\0\0pw", b"\0alice\0", b"\0alice\0pw\0extra",
                                   b"\0\xffalice\0pw"], ids=repr)
def test_malformed_plain_tokens_get_the_generic_message(token: bytes) -> None:
    users = Users()
    users.add("alice", "pw")
    with pytest.raises(SaslError) as exc:
        plain(users).evaluate_response(token)
    assert not isinstance(exc.value, SaslAuthenticationError)


def test_plain_authzid_must_be_the_user() -> None:
    users = Users()
    users.add("alice", "pw")
    assert plain(users).evaluate_response(b"alice\0alice\0pw") == b""
    with pytest.raises(SaslAuthenticationError, match="different from username"):
        plain(users).evaluate_response(b"admin\0alice\0pw")


def test_plain_takes_one_token_only() -> None:
    users = Users()
    users.add("alice", "pw")
    s = plain(users)
    s.evaluate_response(b"\0alice\0pw")
    with pytest.raises(SaslError):
        s.evaluate_response(b"\0alice\0pw")


# --- the connection's state machine -------------------------------------------------------------------

def auth(users: Users, mechanisms: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")) \
        -> SaslServerAuthenticator:
    return SaslServerAuthenticator(list(mechanisms), users.get, SECRET, nonce=lambda: "SNONCE")


def test_only_kafkas_order_of_requests_is_allowed() -> None:
    users = Users()
    users.add("alice", "pw")
    a = auth(users)
    assert a.state is SaslState.HANDSHAKE_OR_VERSIONS_REQUEST
    assert a.allows(API_API_VERSIONS) and a.allows(API_SASL_HANDSHAKE)
    assert not a.allows(API_SASL_AUTHENTICATE) and not a.allows(API_METADATA) and not a.allows(API_PRODUCE)
    a.api_versions_answered()
    assert a.state is SaslState.HANDSHAKE_REQUEST
    assert a.allows(API_SASL_HANDSHAKE) and not a.allows(API_API_VERSIONS) and not a.allows(API_SASL_AUTHENTICATE)
    assert a.handshake("SCRAM-SHA-256")
    assert a.state is SaslState.AUTHENTICATE
    assert a.allows(API_SASL_AUTHENTICATE) and not a.allows(API_SASL_HANDSHAKE) and not a.allows(API_METADATA)
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    r1 = a.authenticate(client.client_first())
    assert r1.error_code == ErrorCode.none and not a.complete and a.username is None
    r2 = a.authenticate(client.client_final(r1.auth_bytes))
    assert r2.error_code == ErrorCode.none and client.verify_server_final(r2.auth_bytes)
    assert a.complete and a.username == "alice" and a.state is SaslState.COMPLETE
    assert a.allows(API_METADATA) and a.allows(API_PRODUCE)
    with pytest.raises(IllegalSaslStateError):
        a.authenticate(b"more")


def test_handshake_without_api_versions_is_fine() -> None:
    a = auth(Users())
    assert a.handshake("PLAIN") and a.state is SaslState.AUTHENTICATE


def test_an_unknown_or_disabled_mechanism_fails_the_connection() -> None:
    a = auth(Users(), ("SCRAM-SHA-512",))
    assert not a.handshake("PLAIN")
    assert a.state is SaslState.FAILED
    assert not any(a.allows(k) for k in (API_API_VERSIONS, API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE, API_METADATA))
    assert not auth(Users()).handshake("GSSAPI")


def test_authenticate_before_handshake_is_illegal() -> None:
    a = auth(Users())
    with pytest.raises(IllegalSaslStateError):
        a.authenticate(b"\0alice\0pw")


def test_a_failed_login_answers_kafkas_messages_and_is_final() -> None:
    users = Users()
    users.add("alice", "pw")
    a = auth(users)
    a.handshake("SCRAM-SHA-512")
    client = ScramClient("SCRAM-SHA-512", "alice", "pw")
    r = a.authenticate(client.client_first())
    r = a.authenticate(client.client_final(r.auth_bytes))
    assert r.error_code == ErrorCode.sasl_authentication_failed  # no SHA-512 credential for alice
    assert r.error_message == generic_failure_message("SCRAM-SHA-512") == \
        "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
    assert r.log_reason is not None and "alice" in r.log_reason and r.auth_bytes == b""
    assert a.state is SaslState.FAILED and not a.complete
    a = auth(users)
    a.handshake("PLAIN")
    r = a.authenticate(b"\0alice\0nope")
    assert (r.error_code, r.error_message) == (ErrorCode.sasl_authentication_failed, INVALID_CREDENTIALS)
    a = auth(users)
    a.handshake("PLAIN")
    r = a.authenticate(b"garbage")
    assert r.error_message == generic_failure_message("PLAIN")


def test_plain_login_through_the_state_machine() -> None:
    users = Users()
    users.add("alice", "pw", SCRAM_SHA_512)
    a = auth(users)
    a.handshake("PLAIN")
    assert a.slow
    r = a.authenticate(b"\0alice\0pw")
    assert r.error_code == ErrorCode.none and r.auth_bytes == b"" and a.complete and a.username == "alice"


def test_unsupported_mechanisms_cannot_be_enabled() -> None:
    with pytest.raises(ValueError, match="GSSAPI"):
        SaslServerAuthenticator(["GSSAPI"], Users().get, SECRET)
    with pytest.raises(ValueError):
        SaslServerAuthenticator([], Users().get, SECRET)

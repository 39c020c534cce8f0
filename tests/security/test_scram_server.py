"""The SCRAM server state machine, sans IO: RFC 7677's SCRAM-SHA-256 example byte for byte, a client
written from the RFC (tests/security/scram_client.py) for both mechanisms, and every way a client
can get it wrong or try to cheat."""

from __future__ import annotations

import base64

import pytest

from oncelog.security import scram
from oncelog.security.errors import SaslAuthenticationError, SaslError
from oncelog.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramCredential, ScramMechanism
from oncelog.security.scram_sasl_server import ScramSaslServer, State
from tests.security.scram_client import ScramClient

# RFC 7677 section 3: user "user", password "pencil".
RFC_CLIENT_FIRST = b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
RFC_SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
RFC_SERVER_FIRST = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
RFC_CLIENT_FINAL = (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                    b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
RFC_SERVER_FINAL = b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
RFC_SALT = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
SECRET = b"decoy-secret-for-tests"


class Users:
    def __init__(self) -> None:
        self.creds: dict[tuple[str, str], ScramCredential] = {}

    def add(self, name: str, password: str, mechanism: ScramMechanism = SCRAM_SHA_256, iterations: int = 4096,
            salt: bytes | None = None) -> ScramCredential:
        c = ScramCredential.from_password(mechanism, password, iterations, salt)
        self.creds[(name, mechanism.name)] = c
        return c

    def get(self, name: str, mechanism: ScramMechanism) -> ScramCredential | None:
        return self.creds.get((name, mechanism.name))


def server(users: Users, mechanism: ScramMechanism = SCRAM_SHA_256, nonce: str = "SERVERNONCE") -> ScramSaslServer:
    return ScramSaslServer(mechanism, users.get, SECRET, nonce=lambda: nonce)


def test_rfc7677_example_byte_for_byte() -> None:
    users = Users()
    users.add("user", "pencil", salt=RFC_SALT)
    s = server(users, nonce=RFC_SERVER_NONCE)
    assert s.evaluate_response(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    assert s.state is State.RECEIVE_CLIENT_FINAL and not s.complete
    assert s.evaluate_response(RFC_CLIENT_FINAL) == RFC_SERVER_FINAL
    assert s.complete and s.username == "user"


def test_rfc7677_stored_credential_is_not_the_password() -> None:
    c = ScramCredential.from_password(SCRAM_SHA_256, "pencil", 4096, RFC_SALT)
    assert b"pencil" not in c.salt + c.stored_key + c.server_key
    assert c.matches_password(SCRAM_SHA_256, "pencil") and not c.matches_password(SCRAM_SHA_256, "pencil2")


def test_rfc7677_example_with_the_wrong_password_fails() -> None:
    users = Users()
    users.add("user", "pencil2", salt=RFC_SALT)
    s = server(users, nonce=RFC_SERVER_NONCE)
    assert s.evaluate_response(RFC_CLIENT_FIRST) == RFC_SERVER_FIRST
    with pytest.raises(SaslError, match="invalid client proof"):
        s.evaluate_response(RFC_CLIENT_FINAL)
    assert s.state is State.FAILED and s.username is None


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512], ids=lambda m: m.name)
@pytest.mark.parametrize("name", ["alice", "a,b=c", "ünïcødé", "x" * 300])
def test_rfc_client_logs_in_and_verifies_the_server(mechanism: ScramMechanism, name: str) -> None:
    users = Users()
    users.add(name, "s3cret ☃", mechanism, iterations=4100)
    client = ScramClient(mechanism.name, name, "s3cret ☃", nonce="client-nonce-123")
    s = server(users, mechanism)
    final = s.evaluate_response(client.client_first())
    assert final.startswith(b"r=client-nonce-123SERVERNONCE,") and final.endswith(b",i=4100")
    assert client.verify_server_final(s.evaluate_response(client.client_final(final)))
    assert s.complete and s.username == name


def test_the_wrong_mechanisms_credential_does_not_log_in() -> None:
    users = Users()
    users.add("alice", "pw", SCRAM_SHA_512)
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    s = server(users, SCRAM_SHA_256)
    first = s.evaluate_response(client.client_first())
    with pytest.raises(SaslError, match="unknown user"):
        s.evaluate_response(client.client_final(first))


def test_an_unknown_user_gets_a_stable_decoy_salt_and_fails_only_at_the_proof() -> None:
    users = Users()
    users.add("alice", "pw")
    a1 = server(users).evaluate_response(ScramClient("SCRAM-SHA-256", "mallory", "pw").client_first())
    a2 = server(users).evaluate_response(ScramClient("SCRAM-SHA-256", "mallory", "pw").client_first())
    b = server(users).evaluate_response(ScramClient("SCRAM-SHA-256", "eve", "pw").client_first())
    salt = [dict(kv.split("=", 1) for kv in m.decode().split(","))["s"] for m in (a1, a2, b)]
    assert salt[0] == salt[1] != salt[2]  # the same answer every time, as a real user's would be
    assert a1.endswith(b",i=4096")
    s = server(users)
    client = ScramClient("SCRAM-SHA-256", "mallory", "pw")
    first = s.evaluate_response(client.client_first())
    with pytest.raises(SaslError, match="unknown user") as exc:
        s.evaluate_response(client.client_final(first))
    assert not isinstance(exc.value, SaslAuthenticationError)  # the client sees only the generic message


def _exchange_until_final(users: Users, mechanism: str = "SCRAM-SHA-256") -> tuple[ScramSaslServer, ScramClient, bytes]:
    s = server(users)
    client = ScramClient(mechanism, "alice", "pw")
    return s, client, s.evaluate_response(client.client_first())


def test_a_client_final_with_another_nonce_is_refused() -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    with pytest.raises(SaslError, match="Invalid client nonce"):
        s.evaluate_response(client.client_final(first, nonce="fyko+d2lbbFgONRv9qkxdawLOTHERNONCE"))
    assert s.state is State.FAILED


def test_the_doubled_client_nonce_of_old_librdkafka_is_tolerated_and_nothing_else() -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    doubled = "fyko+d2lbbFgONRv9qkxdawL" + "fyko+d2lbbFgONRv9qkxdawLSERVERNONCE"
    assert client.verify_server_final(s.evaluate_response(client.client_final(first, nonce=doubled)))
    for other in ("Xfyko+d2lbbFgONRv9qkxdawLSERVERNONCE", "fyko+d2lbbFgONRv9qkxdawL" * 3 + "SERVERNONCE",
                  "fyko+d2lbbFgONRv9qkxdawL"):
        s, client, first = _exchange_until_final(users)
        with pytest.raises(SaslError, match="Invalid client nonce"):
            s.evaluate_response(client.client_final(first, nonce=other))


def test_a_replayed_client_final_from_an_earlier_exchange_is_refused() -> None:
    users = Users()
    users.add("alice", "pw")
    s1 = ScramSaslServer(SCRAM_SHA_256, users.get, SECRET, nonce=lambda: "NONCE-ONE")
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    recorded_final = client.client_final(s1.evaluate_response(client.client_first()))
    s1.evaluate_response(recorded_final)
    assert s1.complete
    # an eavesdropper replays both messages against a new exchange: the server nonce differs
    s2 = ScramSaslServer(SCRAM_SHA_256, users.get, SECRET, nonce=lambda: "NONCE-TWO")
    s2.evaluate_response(client.client_first())
    with pytest.raises(SaslError, match="Invalid client nonce"):
        s2.evaluate_response(recorded_final)


def test_the_real_nonce_generator_differs_every_exchange() -> None:
    users = Users()
    users.add("alice", "pw")
    firsts = {ScramSaslServer(SCRAM_SHA_256, users.get, SECRET).evaluate_response(
        ScramClient("SCRAM-SHA-256", "alice", "pw").client_first()) for _ in range(50)}
    assert len(firsts) == 50


@pytest.mark.parametrize("binding", ["eSws", "cD10bHMtdW5pcXVlLCw=", "bixhPWFsaWNlLA=="],
                         ids=["y,,", "p=tls-unique", "other-authzid"])
def test_the_channel_binding_must_repeat_the_gs2_header(binding: str) -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    with pytest.raises(SaslError, match="channel binding"):
        s.evaluate_response(client.client_final(first, binding=binding))


def test_a_tampered_proof_fails() -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    final = client.client_final(first)
    head, _, proof = final.rpartition(b",p=")
    raw = bytearray(base64.b64decode(proof))
    raw[0] ^= 1
    with pytest.raises(SaslError, match="invalid client proof"):
        s.evaluate_response(head + b",p=" + base64.b64encode(bytes(raw)))


def test_a_short_proof_fails() -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    head, _, _ = client.client_final(first).rpartition(b",p=")
    with pytest.raises(SaslError, match="client proof of 3 bytes"):
        s.evaluate_response(head + b",p=" + base64.b64encode(b"abc"))


def test_a_user_deleted_or_rekeyed_between_the_two_messages_fails() -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    del users.creds[("alice", "SCRAM-SHA-256")]
    with pytest.raises(SaslError):
        s.evaluate_response(client.client_final(first))
    users.add("bob", "pw", salt=b"same-salt")
    s = server(users)
    client = ScramClient("SCRAM-SHA-256", "bob", "pw")
    first = s.evaluate_response(client.client_first())
    users.add("bob", "pw", salt=b"same-salt", iterations=4097)  # re-keyed meanwhile
    with pytest.raises(SaslError, match="changed during the exchange"):
        s.evaluate_response(client.client_final(first))


def test_an_authzid_other_than_the_user_is_refused_with_kafkas_message() -> None:
    users = Users()
    users.add("alice", "pw")
    with pytest.raises(SaslAuthenticationError,
                       match=r"^Authentication failed: Client requested an authorization id that is different"):
        server(users).evaluate_response(ScramClient("SCRAM-SHA-256", "alice", "pw", authzid="admin").client_first())
    s = server(users)
    client = ScramClient("SCRAM-SHA-256", "alice", "pw", authzid="alice")  # the same name is fine
    assert client.verify_server_final(s.evaluate_response(client.client_final(s.evaluate_response(
        client.client_first()))))


@pytest.mark.parametrize("token", [
    b"",
    b"n,,",
    b"n,,n=alice",
    b"n,,r=abc,n=alice",
    b"x,,n=alice,r=abc",
    b"p=tls-unique,,n=alice,r=abc",
    b"n,,n=,r=abc",
    b"n,,n=al=2Xice,r=abc",
    b"n,,n=al=ice,r=abc",
    b"n,,n=alice,r=",
    b"n,,n=alice,r=ab c",
    b"n,,m=ext,n=alice,r=abc",
    b"n,,n=alice,r=abc,tokenauth=true",
    b"n,,n=alice,r=abc,=novalue",
    b"n,,n=\xff\xfealice,r=abc",
    b"n,,n=al\x00ice,r=abc",
    b"n,b=x,n=alice,r=abc",
], ids=lambda t: repr(t)[:40])
def test_malformed_client_first_messages_fail_cleanly(token: bytes) -> None:
    users = Users()
    users.add("alice", "pw")
    s = server(users)
    with pytest.raises(SaslError):
        s.evaluate_response(token)
    assert s.state is State.FAILED
    with pytest.raises(SaslError):  # and stays failed
        s.evaluate_response(ScramClient("SCRAM-SHA-256", "alice", "pw").client_first())


@pytest.mark.parametrize("tail", [b"", b"c=biws", b"c=biws,p=AAAA", b"c=bi!s,r=N,p=AAAA", b"c=biws,r=N,p=not base64",
                                  b"\xff"])
def test_malformed_client_final_messages_fail_cleanly(tail: bytes) -> None:
    users = Users()
    users.add("alice", "pw")
    s, _client, _first = _exchange_until_final(users)
    with pytest.raises(SaslError):
        s.evaluate_response(tail)
    assert s.state is State.FAILED


def test_unknown_extensions_are_ignored_as_kafka_ignores_them() -> None:
    users = Users()
    users.add("alice", "pw")
    s = server(users)
    client = ScramClient("SCRAM-SHA-256", "alice", "pw")
    client.first_bare += ",x=ignored"
    assert client.verify_server_final(s.evaluate_response(client.client_final(s.evaluate_response(
        client.client_first()))))


def test_no_message_is_accepted_after_completion() -> None:
    users = Users()
    users.add("alice", "pw")
    s, client, first = _exchange_until_final(users)
    s.evaluate_response(client.client_final(first))
    with pytest.raises(SaslError, match="unexpected SCRAM message"):
        s.evaluate_response(client.client_first())


def test_sasl_names_escape_and_unescape() -> None:
    assert scram.sasl_name("a,b=c") == "a=2Cb=3Dc"
    assert scram.username_of("a=2Cb=3Dc") == "a,b=c"
    with pytest.raises(SaslError):
        scram.username_of("a=2")


def test_salted_password_is_rfc_hi() -> None:
    # RFC 7677's SaltedPassword is not printed, but its keys are checked by the example above; here Hi
    # agrees with a by-hand iteration for SHA-512 too.
    client = ScramClient("SCRAM-SHA-512", "u", "pw")
    client.client_final(b"r=fyko+d2lbbFgONRv9qkxdawLx,s=" + base64.b64encode(b"salt") + b",i=4096")
    assert scram.salted_password(SCRAM_SHA_512, "pw", b"salt", 4096) == client.salted

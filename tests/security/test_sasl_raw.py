"""What a client that does not follow the SASL protocol gets: the broker answers what Kafka answers,
or closes the connection, and never lets an unauthenticated connection reach any other API."""

from __future__ import annotations

import struct
import time

import pytest
from kio.schema.metadata.v12.request import MetadataRequest

from oncelog.protocol.messages import encode_request
from oncelog.testing.broker_process import BrokerProcess
from tests.security.conftest import ALICE, SUPER, rdkafka_conf
from tests.security.scram_client import RawKafka, ScramClient
from tests.security.test_sasl_clients import GENERIC, produce

API_METADATA = 3
METADATA_ALL = {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}


def connect(b: BrokerProcess) -> RawKafka:
    return RawKafka(b.host, b.port)


def scram_login(c: RawKafka, mechanism: str = "SCRAM-SHA-256", user: tuple[str, str] = ALICE) -> ScramClient:
    assert c.handshake(mechanism).error_code == 0
    client = ScramClient(mechanism, *user)
    first = c.authenticate(client.client_first())
    assert first.error_code == 0, first.error_message
    final = c.authenticate(client.client_final(first.auth_bytes))
    assert final.error_code == 0, final.error_message
    assert client.verify_server_final(final.auth_bytes)
    assert final.session_lifetime.total_seconds() == 0  # no reauthentication (KIP-368)
    return client


def metadata_works(c: RawKafka, b: BrokerProcess) -> bool:
    return c.call(API_METADATA, 12, METADATA_ALL).brokers[0].port == b.port


def test_a_raw_scram_login_then_requests_work(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)
    versions = c.api_versions()
    keys = {k.api_key: (k.min_version, k.max_version) for k in versions.api_keys}
    assert keys[17] == (0, 1) and keys[36] == (0, 2) and keys[50] == (0, 0) and keys[51] == (0, 0)
    scram_login(c, "SCRAM-SHA-512")
    assert metadata_works(c, sasl_broker)
    # SASL again after success: ILLEGAL_SASL_STATE, as KafkaApis answers it; the connection stays usable
    assert c.handshake("PLAIN").error_code == 34
    again = c.authenticate(b"\0alice\0x")
    assert (again.error_code, again.error_message) == (34, "SaslAuthenticate request received after successful "
                                                           "authentication")
    assert metadata_works(c, sasl_broker)


@pytest.mark.parametrize("first_request", ["metadata", "produce", "find-coordinator", "alter-users"])
def test_a_client_that_skips_authentication_is_closed_without_an_answer(sasl_broker: BrokerProcess,
                                                                       first_request: str) -> None:
    c = connect(sasl_broker)
    if first_request == "metadata":
        c.send_raw(encode_request(3, 12, 1, MetadataRequest(topics=None, allow_auto_topic_creation=True,
                                                            include_topic_authorized_operations=False)))
    elif first_request == "produce":
        c.send(0, 9, {"transactional_id": None, "acks": -1, "timeout": 1000, "topic_data": []})
    elif first_request == "find-coordinator":
        c.send(10, 3, {"key": "g", "key_type": 0})
    else:
        c.send(51, 0, {"deletions": [], "upsertions": [{"name": "mallory", "mechanism": 1, "iterations": 4096,
                                                        "salt": b"s", "salted_password": b"x" * 32}]})
    assert c.closed()
    # and nothing happened: mallory does not exist
    admin = connect(sasl_broker)
    scram_login(admin)
    assert admin.call(50, 0, {"users": [{"name": "mallory"}]}).results[0].error_code == 91


def test_authenticate_before_handshake_is_closed(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)
    c.send(36, 2, {"auth_bytes": b"\0alice\0" + ALICE[1].encode()})
    assert c.closed()


def test_requests_out_of_kafkas_order_are_closed(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)  # ApiVersions twice
    c.api_versions()
    c.corr += 1
    from kio.schema.api_versions.v0.request import ApiVersionsRequest
    c.send_raw(encode_request(18, 0, c.corr, ApiVersionsRequest()))
    assert c.closed()
    c = connect(sasl_broker)  # ApiVersions during the exchange
    c.api_versions()
    assert c.handshake("PLAIN").error_code == 0
    c.corr += 1
    c.send_raw(encode_request(18, 0, c.corr, ApiVersionsRequest()))
    assert c.closed()
    c = connect(sasl_broker)  # Metadata between the two SCRAM messages
    assert c.handshake("SCRAM-SHA-256").error_code == 0
    assert c.authenticate(ScramClient("SCRAM-SHA-256", *ALICE).client_first()).error_code == 0
    c.send(API_METADATA, 12, METADATA_ALL)
    assert c.closed()
    c = connect(sasl_broker)  # a second handshake
    assert c.handshake("SCRAM-SHA-256").error_code == 0
    c.send(17, 1, {"mechanism": "PLAIN"})
    assert c.closed()


def test_an_unknown_mechanism_gets_the_enabled_list_then_the_connection_closes(
        start_broker) -> None:  # type: ignore[no-untyped-def]
    b = start_broker("--sasl", "--sasl-enabled-mechanisms", "SCRAM-SHA-512,PLAIN", *SUPER)
    c = connect(b)
    r = c.handshake("GSSAPI")
    assert r.error_code == 33 and list(r.mechanisms) == ["SCRAM-SHA-512", "PLAIN"]
    assert c.closed()
    c = connect(b)
    assert c.handshake("SCRAM-SHA-256").error_code == 33  # supported here, not enabled on this broker
    assert c.closed()


def test_a_wrong_proof_is_refused_after_the_delay_then_closed(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)
    assert c.handshake("SCRAM-SHA-256").error_code == 0
    client = ScramClient("SCRAM-SHA-256", "alice", "not-the-password")
    first = c.authenticate(client.client_first())
    started = time.monotonic()
    r = c.authenticate(client.client_final(first.auth_bytes))
    assert time.monotonic() - started >= 0.09  # connection.failed.authentication.delay.ms (100)
    assert (r.error_code, r.error_message, r.auth_bytes) == (58, GENERIC + "SCRAM-SHA-256", b"")
    assert c.closed()


def test_a_replayed_client_final_with_a_wrong_nonce_is_refused(sasl_broker: BrokerProcess) -> None:
    # record a good exchange, then replay its client-final on a new connection (new server nonce)
    c = connect(sasl_broker)
    assert c.handshake("SCRAM-SHA-256").error_code == 0
    client = ScramClient("SCRAM-SHA-256", *ALICE)
    recorded_final = client.client_final(c.authenticate(client.client_first()).auth_bytes)
    assert c.authenticate(recorded_final).error_code == 0
    c = connect(sasl_broker)
    assert c.handshake("SCRAM-SHA-256").error_code == 0
    assert c.authenticate(client.client_first()).error_code == 0
    r = c.authenticate(recorded_final)
    assert (r.error_code, r.error_message) == (58, GENERIC + "SCRAM-SHA-256")
    assert c.closed()
    assert "Invalid client nonce" in sasl_broker.log_path.read_text()  # type: ignore[union-attr]


@pytest.mark.parametrize(("mechanism", "token"), [
    ("SCRAM-SHA-256", b"n,,n=\xff\xfe\xfd,r=abcdef"),
    ("PLAIN", b"\0\xff\xfe\0pw"),
    ("SCRAM-SHA-512", b"\x00" * 100),
    ("SCRAM-SHA-512", b""),
    ("PLAIN", b""),
], ids=["scram-non-utf8-user", "plain-non-utf8-user", "scram-zeros", "scram-empty", "plain-empty"])
def test_garbage_tokens_get_the_generic_message(sasl_broker: BrokerProcess, mechanism: str, token: bytes) -> None:
    c = connect(sasl_broker)
    assert c.handshake(mechanism).error_code == 0
    r = c.authenticate(token)
    assert (r.error_code, r.error_message) == (58, GENERIC + mechanism)
    assert c.closed()


def test_a_huge_auth_payload_is_refused_before_it_is_buffered(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)
    assert c.handshake("PLAIN").error_code == 0
    # a SaslAuthenticate frame claiming 8 MiB: above sasl.server.max.receive.size (512 KiB)
    header = struct.pack(">hhi", 36, 2, 99) + b"\x00\x00\x00"
    c.send_raw(struct.pack(">i", 8 << 20) + header)
    try:
        c.send_raw(b"\0" * (1 << 20))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert c.closed()
    # a frame just under the limit is read and refused as a bad token, not as a framing error
    c = connect(sasl_broker)
    assert c.handshake("PLAIN").error_code == 0
    r = c.authenticate(b"\0alice\0" + b"x" * 400_000)
    assert (r.error_code, r.error_message) == (58, "Authentication failed: Invalid username or password")
    produce(rdkafka_conf(sasl_broker), "alive", [b"x"])  # the broker keeps serving


def test_a_short_frame_before_authentication_closes(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)
    c.send_raw(struct.pack(">i", 3) + b"\x00\x11\x00")
    assert c.closed()


def test_sasl_handshake_v0_then_raw_tokens(sasl_broker: BrokerProcess) -> None:
    """Pre-KIP-152 clients: after SaslHandshake v0 the tokens are bare frames."""
    c = connect(sasl_broker)
    assert c.call(17, 0, {"mechanism": "SCRAM-SHA-256"}).error_code == 0
    client = ScramClient("SCRAM-SHA-256", *ALICE)

    def exchange(token: bytes) -> bytes:
        c.send_raw(struct.pack(">i", len(token)) + token)
        size = struct.unpack(">i", c._exact(4))[0]
        return c._exact(size)

    server_first = exchange(client.client_first())
    assert client.verify_server_final(exchange(client.client_final(server_first)))
    assert metadata_works(c, sasl_broker)
    c = connect(sasl_broker)  # a wrong password in v0 framing: closed, no answer
    assert c.call(17, 0, {"mechanism": "PLAIN"}).error_code == 0
    c.send_raw(struct.pack(">i", 11) + b"\0alice\0bad!")
    assert c.closed()


def test_plaintext_listener_answers_sasl_with_illegal_state(broker: BrokerProcess) -> None:
    c = connect(broker)
    assert c.handshake("PLAIN").error_code == 34
    assert c.authenticate(b"\0alice\0pw").error_code == 34
    assert metadata_works(c, broker)


def test_a_plain_login_is_user_alice(sasl_broker: BrokerProcess) -> None:
    c = connect(sasl_broker)
    c.api_versions()
    assert c.handshake("PLAIN").error_code == 0
    r = c.authenticate(f"\0{ALICE[0]}\0{ALICE[1]}".encode(), version=0)
    assert r.error_code == 0 and r.auth_bytes == b""
    assert metadata_works(c, sasl_broker)
    assert "authenticated as User:alice with PLAIN" in sasl_broker.log_path.read_text()  # type: ignore[union-attr]

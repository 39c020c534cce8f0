"""The server side of one SCRAM exchange (RFC 5802 §5), sans IO, as Kafka's ScramSaslServer.

    client-first  n,,n=<user>,r=<cnonce>               ->  server-first  r=<cnonce><snonce>,s=<salt>,i=<n>
    client-final  c=biws,r=<cnonce><snonce>,p=<proof>  ->  server-final  v=<ServerSignature>

``evaluate_response`` takes one client token and returns the next server token, or raises
``SaslError`` (the client is told only the generic message) / ``SaslAuthenticationError`` (the
client sees the message). Any failure is final. States: RECEIVE_CLIENT_FIRST -> RECEIVE_CLIENT_FINAL
-> COMPLETE, or FAILED from either.

Where this is stricter than Kafka (each closes a hole, none changes what a correct client sees):
- an unknown user gets a server-first message with a decoy salt (derived from a per-broker secret,
  stable for the broker's lifetime) and fails at the proof, so the exchange does not reveal which
  users exist; Kafka fails at the first message;
- the client-final nonce must be exactly the server-first one (RFC 5802 §5.1), with one tolerated
  exception: librdkafka before 2.6.1 (Debian's kcat links 2.0.2) sends the client nonce twice,
  ``<cnonce><cnonce><snonce>``; Kafka 3.8.1+ accepts any string ending in the server-first nonce for
  its sake, this accepts that one form only. Either way the fresh server nonce must be there, so a
  recorded exchange cannot be replayed, and the proof covers the nonce as sent;
- the channel binding must be the gs2 header the client sent (RFC 5802 §5.1: ``c=biws`` for ``n,,``);
- the credential is looked up again at client-final: a user deleted or re-keyed in between fails;
- ``m=`` (a mandatory extension) and ``tokenauth=true`` (delegation tokens, not supported here) fail.
"""

from __future__ import annotations

import base64
import enum
import hmac
from collections.abc import Callable

from oncelog.security import scram
from oncelog.security.errors import SaslAuthenticationError, SaslError
from oncelog.security.scram import ClientFinalMessage, ClientFirstMessage, ScramCredential, ScramMechanism

CredentialLookup = Callable[[str, ScramMechanism], ScramCredential | None]

AUTHZID_MISMATCH = "Authentication failed: Client requested an authorization id that is different from username"


class State(enum.Enum):
    RECEIVE_CLIENT_FIRST = "RECEIVE_CLIENT_FIRST"
    RECEIVE_CLIENT_FINAL = "RECEIVE_CLIENT_FINAL"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


def decoy_credential(mechanism: ScramMechanism, username: str, secret: bytes) -> ScramCredential:
    """A credential no password matches, with a salt that is stable per (secret, user, mechanism)."""
    salt = hmac.new(secret, f"{mechanism.name}\0{username}".encode(), "sha256").digest()
    return ScramCredential(salt, b"\0" * mechanism.digest_size, b"\0" * mechanism.digest_size,
                           scram.DEFAULT_ITERATIONS)


class ScramSaslServer:
    def __init__(self, mechanism: ScramMechanism, lookup: CredentialLookup, decoy_secret: bytes,
                 nonce: Callable[[], str] = scram.new_nonce) -> None:
        self.mechanism = mechanism
        self._lookup = lookup
        self._decoy_secret = decoy_secret
        self._nonce = nonce
        self.state = State.RECEIVE_CLIENT_FIRST
        self.username: str | None = None  # the authenticated user, once COMPLETE
        self._first: ClientFirstMessage | None = None
        self._server_first = ""
        self._server_nonce = ""
        self._credential: ScramCredential | None = None
        self._known_user = False

    @property
    def complete(self) -> bool:
        return self.state is State.COMPLETE

    def evaluate_response(self, token: bytes) -> bytes:
        try:
            if self.state is State.RECEIVE_CLIENT_FIRST:
                return self._client_first(token)
            if self.state is State.RECEIVE_CLIENT_FINAL:
                return self._client_final(token)
            raise SaslError(f"unexpected SCRAM message in state {self.state.value}")
        except SaslError:
            self.state = State.FAILED
            self._credential = None
            raise

    def _client_first(self, token: bytes) -> bytes:
        first = scram.ClientFirstMessage.parse(token)
        if first.authzid and first.authzid != first.username:
            raise SaslAuthenticationError(AUTHZID_MISMATCH)
        credential = self._lookup(first.username, self.mechanism)
        self._known_user = credential is not None
        if credential is None:
            credential = decoy_credential(self.mechanism, first.username, self._decoy_secret)
        if credential.iterations < self.mechanism.min_iterations:
            raise SaslError(f"iterations {credential.iterations} below the minimum {self.mechanism.min_iterations}")
        self._first = first
        self._credential = credential
        self._server_nonce = self._nonce()
        self._server_first = scram.server_first_message(first.nonce, self._server_nonce, credential.salt,
                                                        credential.iterations)
        self.state = State.RECEIVE_CLIENT_FINAL
        return self._server_first.encode()

    def _client_final(self, token: bytes) -> bytes:
        first, credential = self._first, self._credential
        assert first is not None and credential is not None
        final = ClientFinalMessage.parse(token)
        expected = first.nonce + self._server_nonce
        if final.nonce != expected and final.nonce != first.nonce + expected:
            raise SaslError("Invalid client nonce in the final client message.")
        if final.channel_binding != first.gs2_header.encode():
            raise SaslError("the channel binding does not repeat the gs2 header")
        if len(final.proof) != self.mechanism.digest_size:
            raise SaslError(f"client proof of {len(final.proof)} bytes for {self.mechanism.name}")
        message = scram.auth_message(first, self._server_first, final)
        client_signature = scram.hmac_digest(self.mechanism, credential.stored_key, message)
        recovered_key = scram.xor(final.proof, client_signature)
        proof_ok = hmac.compare_digest(scram.stored_key(self.mechanism, recovered_key), credential.stored_key)
        if not self._known_user:
            raise SaslError(f"unknown user {first.username!r}")
        if not proof_ok:
            raise SaslError(f"invalid client proof for user {first.username!r}")
        if self._lookup(first.username, self.mechanism) != credential:
            raise SaslError(f"the credential of {first.username!r} changed during the exchange")
        signature = scram.hmac_digest(self.mechanism, credential.server_key, message)
        self.username = first.username
        self._credential = None
        self.state = State.COMPLETE
        return b"v=" + base64.b64encode(signature)

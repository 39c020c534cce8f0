"""What one connection may do before and during SASL authentication, sans IO (Kafka's
SaslServerAuthenticator, KIP-43 and KIP-152).

    HANDSHAKE_OR_VERSIONS_REQUEST --ApiVersions--> HANDSHAKE_REQUEST
    HANDSHAKE_OR_VERSIONS_REQUEST / HANDSHAKE_REQUEST --SaslHandshake(enabled mechanism)--> AUTHENTICATE
    AUTHENTICATE --SaslAuthenticate (one or more tokens)--> COMPLETE
    any state before COMPLETE --anything else, an unknown mechanism, a refused token--> FAILED

Only the request each state names may be handled; the server closes the connection on any other
(Kafka closes it too: an unauthenticated peer never reaches another API's parser). FAILED is final:
the server sends the failure response and closes. A second ApiVersions before the handshake is
refused as Kafka refuses it. After SaslHandshake v1 tokens travel inside SaslAuthenticate requests
(KIP-152); after v0 (clients older than Kafka 1.0) each token is a bare size-prefixed frame with no
request header, and a failure simply closes the connection.

Not thread-safe; one per connection. ``authenticate`` may run on a worker thread (PLAIN's PBKDF2)
while the connection waits for it: the connection handles nothing else meanwhile.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.versions import API_API_VERSIONS, API_SASL_AUTHENTICATE, API_SASL_HANDSHAKE
from oncelog.security import scram
from oncelog.security.errors import SaslAuthenticationError, SaslError, generic_failure_message
from oncelog.security.plain_sasl_server import PlainSaslServer
from oncelog.security.scram_sasl_server import CredentialLookup, ScramSaslServer

PLAIN = "PLAIN"
SUPPORTED_MECHANISMS: tuple[str, ...] = (PLAIN, *scram.MECHANISMS)


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS_REQUEST = "HANDSHAKE_OR_VERSIONS_REQUEST"
    HANDSHAKE_REQUEST = "HANDSHAKE_REQUEST"
    AUTHENTICATE = "AUTHENTICATE"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


VALID_PREVIOUS: dict[SaslState, frozenset[SaslState]] = {
    SaslState.HANDSHAKE_OR_VERSIONS_REQUEST: frozenset(),
    SaslState.HANDSHAKE_REQUEST: frozenset({SaslState.HANDSHAKE_OR_VERSIONS_REQUEST}),
    SaslState.AUTHENTICATE: frozenset({SaslState.HANDSHAKE_OR_VERSIONS_REQUEST, SaslState.HANDSHAKE_REQUEST}),
    SaslState.COMPLETE: frozenset({SaslState.AUTHENTICATE}),
    SaslState.FAILED: frozenset({SaslState.HANDSHAKE_OR_VERSIONS_REQUEST, SaslState.HANDSHAKE_REQUEST,
                                 SaslState.AUTHENTICATE}),
}

ALLOWED_REQUESTS: dict[SaslState, frozenset[int]] = {
    SaslState.HANDSHAKE_OR_VERSIONS_REQUEST: frozenset({API_API_VERSIONS, API_SASL_HANDSHAKE}),
    SaslState.HANDSHAKE_REQUEST: frozenset({API_SASL_HANDSHAKE}),
    SaslState.AUTHENTICATE: frozenset({API_SASL_AUTHENTICATE}),
    SaslState.FAILED: frozenset(),
}


class IllegalSaslStateError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class AuthenticateResult:
    error_code: ErrorCode
    error_message: str | None
    auth_bytes: bytes
    log_reason: str | None = None  # why it failed, for the broker's log (never sent)


class SaslServerAuthenticator:
    def __init__(self, enabled_mechanisms: Sequence[str], lookup: CredentialLookup, decoy_secret: bytes,
                 nonce: Callable[[], str] = scram.new_nonce) -> None:
        unknown = [m for m in enabled_mechanisms if m not in SUPPORTED_MECHANISMS]
        if unknown or not enabled_mechanisms:
            raise ValueError(f"unsupported SASL mechanisms {unknown} (supported: {list(SUPPORTED_MECHANISMS)})")
        self.enabled_mechanisms = list(enabled_mechanisms)
        self._lookup = lookup
        self._decoy_secret = decoy_secret
        self._nonce = nonce
        self.state = SaslState.HANDSHAKE_OR_VERSIONS_REQUEST
        self.mechanism: str | None = None
        self.username: str | None = None
        self.raw_tokens = False  # SaslHandshake v0: tokens are bare frames, not SaslAuthenticate requests
        self._server: ScramSaslServer | PlainSaslServer | None = None

    @property
    def complete(self) -> bool:
        return self.state is SaslState.COMPLETE

    @property
    def slow(self) -> bool:
        """The next token costs a PBKDF2 (PLAIN): run it off the event loop."""
        return self.mechanism == PLAIN

    def _transition_to(self, state: SaslState) -> None:
        if self.state not in VALID_PREVIOUS[state]:
            raise IllegalSaslStateError(f"SASL state {self.state.value} cannot go to {state.value}")
        self.state = state

    @property
    def expects_raw_token(self) -> bool:
        """The next frame is a bare SASL token (after SaslHandshake v0), not a Kafka request."""
        return self.raw_tokens and self.state is SaslState.AUTHENTICATE

    def allows(self, api_key: int) -> bool:
        """May a request with this key be handled now? Everything, once authenticated."""
        if self.state is SaslState.COMPLETE:
            return True
        return api_key in ALLOWED_REQUESTS[self.state]

    def api_versions_answered(self) -> None:
        """ApiVersions got its (non-error) answer: the next request must be SaslHandshake."""
        if self.state is SaslState.HANDSHAKE_OR_VERSIONS_REQUEST:
            self._transition_to(SaslState.HANDSHAKE_REQUEST)

    def handshake(self, mechanism: str, version: int = 1) -> bool:
        """SaslHandshake: True if the mechanism is enabled (then tokens follow); False fails the connection."""
        if mechanism not in self.enabled_mechanisms:
            self._transition_to(SaslState.FAILED)
            return False
        self._transition_to(SaslState.AUTHENTICATE)
        self.mechanism = mechanism
        self.raw_tokens = version == 0
        if mechanism == PLAIN:
            self._server = PlainSaslServer(self._lookup, self._decoy_secret)
        else:
            self._server = ScramSaslServer(scram.MECHANISMS[mechanism], self._lookup, self._decoy_secret,
                                           self._nonce)
        return True

    def authenticate(self, token: bytes) -> AuthenticateResult:
        """One SaslAuthenticate token; on success the answer token, COMPLETE once the exchange ends."""
        server, mechanism = self._server, self.mechanism
        if self.state is not SaslState.AUTHENTICATE or server is None or mechanism is None:
            raise IllegalSaslStateError(f"SaslAuthenticate in SASL state {self.state.value}")
        try:
            answer = server.evaluate_response(token)
        except SaslAuthenticationError as exc:
            self._transition_to(SaslState.FAILED)
            return AuthenticateResult(ErrorCode.sasl_authentication_failed, str(exc), b"", str(exc))
        except SaslError as exc:
            self._transition_to(SaslState.FAILED)
            return AuthenticateResult(ErrorCode.sasl_authentication_failed, generic_failure_message(mechanism),
                                      b"", str(exc))
        if server.complete:
            self.username = server.username
            self._transition_to(SaslState.COMPLETE)
        return AuthenticateResult(ErrorCode.none, None, answer)

"""SaslHandshake (v0-1) and SaslAuthenticate (v0-2): the connection's SASL exchange (KIP-43, KIP-152).

The connection only lets these through in the order its ``SaslServerAuthenticator`` expects (see
``oncelog.server.connection``); here each one advances it. A refused mechanism or login is answered
(UNSUPPORTED_SASL_MECHANISM with the enabled list, or SASL_AUTHENTICATION_FAILED with Kafka's
message) and the connection is closed after that response; a failed login is answered only after
``connection_failed_authentication_delay_ms`` (Kafka's brake on password guessing). On a listener
without SASL, or after success, both answer ILLEGAL_SASL_STATE as Kafka's KafkaApis does.
Reauthentication (KIP-368) is not offered: ``session_lifetime_ms`` is 0.

After SaslHandshake v0 the tokens arrive as bare frames; the connection hands each to
``handle_raw_token`` (Kafka's pre-1.0 framing: a failure closes the connection without an answer).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.frames import frame
from oncelog.protocol.messages import Request
from oncelog.security.errors import generic_failure_message
from oncelog.security.sasl_server_authenticator import AuthenticateResult, SaslServerAuthenticator

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

AFTER_AUTHENTICATION = "SaslAuthenticate request received after successful authentication"


def handle_sasl_handshake(broker: Broker, req: Request) -> dict[str, Any]:
    session = req.session
    auth = getattr(session, "authenticator", None)
    if auth is None or auth.complete:
        return {"error_code": ErrorCode.illegal_sasl_state, "mechanisms": []}
    if auth.handshake(req.body.mechanism, req.api_version):
        return {"error_code": ErrorCode.none, "mechanisms": auth.enabled_mechanisms}
    log.warning("closing connection from %s: SASL mechanism %r is not enabled", session.peer, req.body.mechanism)
    session.close_after_response = True
    return {"error_code": ErrorCode.unsupported_sasl_mechanism, "mechanisms": auth.enabled_mechanisms}


async def evaluate_token(broker: Broker, session: Any, auth: SaslServerAuthenticator,
                         token: bytes) -> AuthenticateResult:
    """One client token through the authenticator: the principal on success; on failure the
    connection is marked to close after the answer, which is delayed as Kafka delays it."""
    if auth.slow:  # PLAIN: one PBKDF2, on a worker thread; this connection handles nothing meanwhile
        result = await asyncio.get_running_loop().run_in_executor(None, auth.authenticate, token)
    else:
        result = auth.authenticate(token)
    if result.error_code == ErrorCode.none and auth.complete and \
            auth.username not in broker.security.credentials.users():
        # Deleted while PLAIN's PBKDF2 ran off the loop: the deletion closed the user's connections
        # before this one had a principal, so refuse it here.
        result = AuthenticateResult(ErrorCode.sasl_authentication_failed,
                                    generic_failure_message(str(auth.mechanism)), b"",
                                    f"user {auth.username!r} was deleted during authentication")
    if result.error_code != ErrorCode.none:
        log.warning("authentication failed for %s with %s: %s", session.peer, auth.mechanism, result.log_reason)
        session.close_after_response = True
        delay_ms = broker.config.connection_failed_authentication_delay_ms
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
    elif auth.complete:
        session.principal = f"User:{auth.username}"
        log.info("%s authenticated as %s with %s", session.peer, session.principal, auth.mechanism)
    return result


def _response(error_code: ErrorCode, message: str | None, auth_bytes: bytes = b"") -> dict[str, Any]:
    return {"error_code": error_code, "error_message": message, "auth_bytes": auth_bytes, "session_lifetime": 0}


async def handle_sasl_authenticate(broker: Broker, req: Request) -> dict[str, Any]:
    session = req.session
    auth = getattr(session, "authenticator", None)
    if auth is None or auth.complete:
        return _response(ErrorCode.illegal_sasl_state, AFTER_AUTHENTICATION)
    result = await evaluate_token(broker, session, auth, bytes(req.body.auth_bytes))
    return _response(result.error_code, result.error_message, result.auth_bytes)


async def handle_raw_token(broker: Broker, session: Any, auth: SaslServerAuthenticator, token: bytes) -> bytes | None:
    """A bare token after SaslHandshake v0: the bare (size-prefixed) answer, or None on failure."""
    result = await evaluate_token(broker, session, auth, token)
    return frame(result.auth_bytes) if result.error_code == ErrorCode.none else None

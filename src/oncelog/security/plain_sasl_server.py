"""SASL/PLAIN (RFC 4616) checked against the user's SCRAM credential, as Kafka's PlainSaslServer.

The token is ``[authzid] NUL authcid NUL passwd``. There is no plain-text password on the broker:
the password is run through Hi with the stored salt and iterations and the resulting StoredKey
compared with the stored one (SCRAM-SHA-256 first, else SCRAM-SHA-512). An unknown user costs the
same PBKDF2 work as a known one, so the time of the answer does not tell whether the user exists.

Messages are Kafka's: a wrong password or unknown user gets "Authentication failed: Invalid username
or password"; a token that is not three NUL-separated parts, or has an empty user or password, gets
the generic message (``SaslError``). This is the expensive step of a login (one PBKDF2); the server
runs it off the event loop.
"""

from __future__ import annotations

import hmac

from oncelog.security import scram
from oncelog.security.errors import SaslAuthenticationError, SaslError
from oncelog.security.scram_sasl_server import AUTHZID_MISMATCH, CredentialLookup, decoy_credential

INVALID_CREDENTIALS = "Authentication failed: Invalid username or password"


class PlainSaslServer:
    def __init__(self, lookup: CredentialLookup, decoy_secret: bytes) -> None:
        self._lookup = lookup
        self._decoy_secret = decoy_secret
        self.complete = False
        self.failed = False
        self.username: str | None = None

    def evaluate_response(self, token: bytes) -> bytes:
        try:
            return self._evaluate(token)
        except SaslError:
            self.failed = True
            raise

    def _evaluate(self, token: bytes) -> bytes:
        if self.complete or self.failed:
            raise SaslError("unexpected SASL/PLAIN token after the exchange ended")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslError(f"Invalid SASL/PLAIN response: expected 3 tokens, got {len(parts)}")
        try:
            authzid, username, password = (p.decode("utf-8") for p in parts)
        except UnicodeDecodeError as exc:
            raise SaslError("SASL/PLAIN response is not UTF-8") from exc
        if not username:
            raise SaslError("Authentication failed: username not specified")
        if not password:
            raise SaslError("Authentication failed: password not specified")
        for mechanism in (scram.SCRAM_SHA_256, scram.SCRAM_SHA_512):
            credential = self._lookup(username, mechanism)
            if credential is not None:
                break
        known = credential is not None
        if credential is None:
            mechanism = scram.SCRAM_SHA_256
            credential = decoy_credential(mechanism, username, self._decoy_secret)
        matches = credential.matches_password(mechanism, password)
        if not (known and matches):
            raise SaslAuthenticationError(INVALID_CREDENTIALS)
        if authzid and not hmac.compare_digest(authzid.encode(), username.encode()):
            raise SaslAuthenticationError(AUTHZID_MISMATCH)
        self.username = username
        self.complete = True
        return b""

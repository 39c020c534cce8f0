"""SCRAM primitives (RFC 5802, RFC 7677): mechanisms, the key derivation, credentials, and the
client-first / client-final messages as the server parses them. Pure functions, no I/O.

Key derivation (RFC 5802 §3), for a mechanism with hash H:

    SaltedPassword = Hi(password, salt, i)        Hi is PBKDF2 with HMAC-H, one hash length long
    ClientKey      = HMAC(SaltedPassword, "Client Key")
    StoredKey      = H(ClientKey)
    ServerKey      = HMAC(SaltedPassword, "Server Key")

The broker keeps (salt, i, StoredKey, ServerKey) per user and mechanism: enough to check a proof and
to sign the server-final message, not enough to log in as the user. The password is normalised as
Kafka does it, by its UTF-8 bytes (no SASLprep), so credentials made here and by Kafka's tools agree.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

from oncelog.security.errors import SaslError


@dataclass(frozen=True, slots=True)
class ScramMechanism:
    name: str  # as on the wire: SCRAM-SHA-256
    hash_name: str  # hashlib's name
    type_id: int  # Kafka's ScramMechanism type byte (Describe/AlterUserScramCredentials)
    digest_size: int
    min_iterations: int = 4096  # Kafka's minimum, RFC 7677's recommendation
    max_iterations: int = 16384  # Kafka's ScramControlManager.MAX_ITERATIONS


SCRAM_SHA_256 = ScramMechanism("SCRAM-SHA-256", "sha256", 1, 32)
SCRAM_SHA_512 = ScramMechanism("SCRAM-SHA-512", "sha512", 2, 64)
MECHANISMS: dict[str, ScramMechanism] = {m.name: m for m in (SCRAM_SHA_256, SCRAM_SHA_512)}
BY_TYPE: dict[int, ScramMechanism] = {m.type_id: m for m in MECHANISMS.values()}
DEFAULT_ITERATIONS = 4096  # Kafka's kafka-configs.sh default


# --- key derivation -----------------------------------------------------------------------------

def salted_password(mechanism: ScramMechanism, password: str | bytes, salt: bytes, iterations: int) -> bytes:
    """Hi(password, salt, i): PBKDF2-HMAC is exactly RFC 5802's Hi with dkLen = the hash length."""
    pw = password.encode() if isinstance(password, str) else password
    return hashlib.pbkdf2_hmac(mechanism.hash_name, pw, salt, iterations, mechanism.digest_size)


def hmac_digest(mechanism: ScramMechanism, key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, mechanism.hash_name).digest()


def client_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return hmac_digest(mechanism, salted, b"Client Key")


def server_key(mechanism: ScramMechanism, salted: bytes) -> bytes:
    return hmac_digest(mechanism, salted, b"Server Key")


def stored_key(mechanism: ScramMechanism, key: bytes) -> bytes:
    return hashlib.new(mechanism.hash_name, key).digest()


def xor(a: bytes, b: bytes) -> bytes:
    if len(a) != len(b):
        raise ValueError("xor of byte strings of different lengths")
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the broker stores for one user and mechanism (never the password)."""

    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int

    @classmethod
    def from_salted_password(cls, mechanism: ScramMechanism, salt: bytes, salted: bytes,
                             iterations: int) -> ScramCredential:
        """AlterUserScramCredentials carries the salted password (the client ran Hi), not the password."""
        return cls(salt, stored_key(mechanism, client_key(mechanism, salted)), server_key(mechanism, salted),
                   iterations)

    @classmethod
    def from_password(cls, mechanism: ScramMechanism, password: str, iterations: int = DEFAULT_ITERATIONS,
                      salt: bytes | None = None) -> ScramCredential:
        salt = secrets.token_bytes(32) if salt is None else salt
        return cls.from_salted_password(mechanism, salt, salted_password(mechanism, password, salt, iterations),
                                        iterations)

    def matches_password(self, mechanism: ScramMechanism, password: str | bytes) -> bool:
        """Recompute StoredKey from a password (SASL/PLAIN against a SCRAM credential); constant time."""
        salted = salted_password(mechanism, password, self.salt, self.iterations)
        return hmac.compare_digest(stored_key(mechanism, client_key(mechanism, salted)), self.stored_key)


# --- names and nonces -----------------------------------------------------------------------------

def sasl_name(username: str) -> str:
    """RFC 5802 §5.1: ',' and '=' in a user name travel as '=2C' and '=3D'."""
    return username.replace("=", "=3D").replace(",", "=2C")


_SASLNAME_ESCAPE = re.compile(r"=(2C|3D)")


def username_of(saslname: str) -> str:
    if _SASLNAME_ESCAPE.sub("", saslname).find("=") >= 0:
        raise SaslError(f"invalid escape in SCRAM user name {saslname!r}")
    return saslname.replace("=2C", ",").replace("=3D", "=")


def new_nonce() -> str:
    """A server nonce: 192 random bits in base64url (printable, never ',')."""
    return secrets.token_urlsafe(24)


def _printable(value: str) -> bool:
    """RFC 5802's 'printable': %x21-2B / %x2D-7E (visible ASCII except ',')."""
    return bool(value) and all(0x21 <= ord(ch) <= 0x7E and ch != "," for ch in value)


def _b64decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
        raise SaslError(f"{what} is not base64") from exc


def _text(token: bytes, what: str) -> str:
    try:
        text = token.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SaslError(f"SCRAM {what} message is not UTF-8") from exc
    if "\0" in text:
        raise SaslError(f"SCRAM {what} message contains NUL")
    return text


# --- messages ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ClientFirstMessage:
    gs2_header: str  # "n,," or "n,a=<authzid>,"
    authzid: str
    username: str
    nonce: str
    bare: str  # client-first-message-bare, exactly as received (part of AuthMessage)
    extensions: dict[str, str]

    @classmethod
    def parse(cls, token: bytes) -> ClientFirstMessage:
        """gs2-header [reserved-mext ","] username "," nonce ["," extensions] (RFC 5802 §7)."""
        text = _text(token, "client-first")
        flag, sep1, rest = text.partition(",")
        authz, sep2, bare = rest.partition(",")
        if not (sep1 and sep2):
            raise SaslError("SCRAM client-first message has no gs2 header")
        if flag.startswith("p="):
            raise SaslError("the client requires channel binding, which this listener does not offer")
        if flag not in ("n", "y"):
            raise SaslError(f"invalid gs2 channel-binding flag {flag!r}")
        authzid = ""
        if authz:
            if not authz.startswith("a="):
                raise SaslError("invalid authzid in the gs2 header")
            authzid = username_of(authz[2:])
        fields = bare.split(",")
        if fields[0].startswith("m="):
            raise SaslError("SCRAM mandatory extension (m=) is not supported")
        if len(fields) < 2 or not fields[0].startswith("n=") or not fields[1].startswith("r="):
            raise SaslError("SCRAM client-first message must start with n=<user>,r=<nonce>")
        username = username_of(fields[0][2:])
        nonce = fields[1][2:]
        if not username:
            raise SaslError("empty SCRAM user name")
        if not _printable(nonce):
            raise SaslError("invalid SCRAM client nonce")
        extensions: dict[str, str] = {}
        for ext in fields[2:]:
            key, eq, value = ext.partition("=")
            if not eq or not key.isascii() or not key.isalpha():
                raise SaslError(f"invalid SCRAM extension {ext!r}")
            extensions[key] = value
        if extensions.get("tokenauth", "").lower() == "true":
            raise SaslError("delegation token authentication is not supported")
        return cls(f"{flag},{authz},", authzid, username, nonce, bare, extensions)


@dataclass(frozen=True, slots=True)
class ClientFinalMessage:
    channel_binding: bytes
    nonce: str
    proof: bytes
    without_proof: str  # client-final-message-without-proof, exactly as received

    @classmethod
    def parse(cls, token: bytes) -> ClientFinalMessage:
        """channel-binding "," nonce ["," extensions] "," proof (RFC 5802 §7)."""
        text = _text(token, "client-final")
        head, sep, proof_b64 = text.rpartition(",p=")
        fields = head.split(",")
        if not sep or len(fields) < 2 or not fields[0].startswith("c=") or not fields[1].startswith("r="):
            raise SaslError("SCRAM client-final message must be c=<binding>,r=<nonce>[,ext],p=<proof>")
        return cls(_b64decode(fields[0][2:], "channel binding"), fields[1][2:], _b64decode(proof_b64, "proof"),
                   head)


def server_first_message(client_nonce: str, server_nonce: str, salt: bytes, iterations: int) -> str:
    return f"r={client_nonce}{server_nonce},s={base64.b64encode(salt).decode()},i={iterations}"


def auth_message(first: ClientFirstMessage, server_first: str, final: ClientFinalMessage) -> bytes:
    return f"{first.bare},{server_first},{final.without_proof}".encode()

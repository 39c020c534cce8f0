"""The two ways a SASL exchange fails, as Kafka distinguishes them.

``SaslError`` (Kafka's ``javax.security.sasl.SaslException``): the reason is logged, never sent; the
client gets one generic message naming only the mechanism, so a failure does not tell an
unauthenticated peer whether a user exists. ``SaslAuthenticationError`` (Kafka's
``SaslAuthenticationException``): the message is safe to send as it is.
"""

from __future__ import annotations


class SaslError(Exception):
    """Authentication failed; the message is for the broker's log only."""


class SaslAuthenticationError(SaslError):
    """Authentication failed with a message the client may see."""


def generic_failure_message(mechanism: str) -> str:
    """What Kafka's SaslServerAuthenticator answers for a ``SaslException``."""
    return f"Authentication failed during authentication due to invalid credentials with SASL mechanism {mechanism}"

"""The listener's TLS context (Python's ``ssl`` on the asyncio server): a PEM certificate chain and
its private key, TLS 1.2 or newer (Kafka's default ``ssl.enabled.protocols``). No client
certificates are requested: clients authenticate with SASL (SASL_SSL) or not at all (SSL)."""

from __future__ import annotations

import ssl
from pathlib import Path


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """Load ``cert`` (PEM, the chain) and ``key`` (PEM, unencrypted); ValueError saying what is wrong."""
    for what, path in (("certificate", cert), ("private key", key)):
        if not path.is_file():
            raise ValueError(f"TLS {what} file {path} does not exist")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ValueError(f"cannot load the TLS certificate {cert} with the key {key}: {exc}") from exc
    return ctx

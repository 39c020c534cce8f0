"""Everything the listener needs to authenticate its connections, built once per broker: the
credential store, the TLS context (or None), and a fresh SASL authenticator per connection (or None
when SASL is off, the default for local use)."""

from __future__ import annotations

import logging
import secrets
from collections.abc import Sequence
from pathlib import Path
from ssl import SSLContext

from oncelog.security.credentials import CredentialStore
from oncelog.security.sasl_server_authenticator import SaslServerAuthenticator
from oncelog.security.tls import server_context

log = logging.getLogger("oncelog.security")


class ListenerSecurity:
    def __init__(self, data_dir: Path, *, sasl_mechanisms: Sequence[str] | None, tls_cert: Path | None = None,
                 tls_key: Path | None = None) -> None:
        self.credentials = CredentialStore(data_dir)
        self.sasl_mechanisms = list(sasl_mechanisms) if sasl_mechanisms is not None else None
        self.ssl_context: SSLContext | None = None
        if tls_cert is not None and tls_key is not None:
            self.ssl_context = server_context(tls_cert, tls_key)
        # Decoy salts for unknown users are derived from this: stable while the broker runs, never stored.
        self._decoy_secret = secrets.token_bytes(32)
        if self.sasl_mechanisms is not None and not self.credentials.users():
            log.warning("SASL is on and no user exists yet: nobody can connect. Create one with "
                        "`oncelog users add NAME --password-stdin --data-dir %s` before starting the broker",
                        data_dir)

    @property
    def protocol(self) -> str:
        tls = self.ssl_context is not None
        if self.sasl_mechanisms is not None:
            return "SASL_SSL" if tls else "SASL_PLAINTEXT"
        return "SSL" if tls else "PLAINTEXT"

    def new_authenticator(self) -> SaslServerAuthenticator | None:
        if self.sasl_mechanisms is None:
            return None
        return SaslServerAuthenticator(self.sasl_mechanisms, self.credentials.get, self._decoy_secret)

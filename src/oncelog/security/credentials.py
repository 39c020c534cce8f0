"""SCRAM credentials of the broker's users, persisted in ``<data_dir>/__meta/users.json``.

On disk (JSON, binary values in base64; never a password)::

    {"version": 1,
     "users": {"alice": {"SCRAM-SHA-256": {"salt": "...", "iterations": 4096,
                                           "stored_key": "...", "server_key": "..."},
                         "SCRAM-SHA-512": {...}}}}

Guarantees:
- A change is written first (``fileio.fs.write_atomic``: the old or the new file survives a crash)
  and only then becomes visible; a failed write changes nothing.
- Readers get immutable snapshots: the map is replaced, never mutated, so a lookup from a worker
  thread (PLAIN's PBKDF2) never sees half a change.
- Writers: the broker's event-loop thread, or ``oncelog users`` while it holds the data directory's
  lock (so never both at once). The file is readable by its owner only (mode 0600).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from oncelog.security.scram import MECHANISMS, ScramCredential, ScramMechanism
from oncelog.storage import fileio

META_DIR = "__meta"
USERS_FILE = "users.json"
FORMAT_VERSION = 1

UserCredentials = Mapping[str, ScramCredential]  # mechanism name -> credential


def users_path(data_dir: Path) -> Path:
    return data_dir / META_DIR / USERS_FILE


def validate_username(name: str) -> str | None:
    """Why a user name is unusable, or None. Empty names and NUL (PLAIN's separator) are refused."""
    if not name:
        return "Username must not be empty"
    if "\0" in name:
        return "Username must not contain NUL"
    return None


class CredentialStore:
    def __init__(self, data_dir: Path) -> None:
        self.path = users_path(data_dir)
        self._users: Mapping[str, UserCredentials] = MappingProxyType({})
        self._load()

    # --- reading ---------------------------------------------------------------------------------
    def get(self, username: str, mechanism: ScramMechanism) -> ScramCredential | None:
        user = self._users.get(username)
        return None if user is None else user.get(mechanism.name)

    def users(self) -> Mapping[str, UserCredentials]:
        """An immutable snapshot: user -> mechanism name -> credential."""
        return self._users

    # --- changing --------------------------------------------------------------------------------
    def alter(self, upsertions: Iterable[tuple[str, ScramMechanism, ScramCredential]] = (),
              deletions: Iterable[tuple[str, ScramMechanism]] = ()) -> None:
        """Apply deletions then upsertions in one durable write; a user left without credentials is gone."""
        users = {name: dict(creds) for name, creds in self._users.items()}
        for name, mechanism in deletions:
            creds = users.get(name)
            if creds is not None:
                creds.pop(mechanism.name, None)
                if not creds:
                    del users[name]
        for name, mechanism, credential in upsertions:
            problem = validate_username(name)
            if problem is not None:
                raise ValueError(problem)
            users.setdefault(name, {})[mechanism.name] = credential
        self._save(users)
        self._users = MappingProxyType({name: MappingProxyType(creds) for name, creds in users.items()})

    # --- persistence -----------------------------------------------------------------------------
    def _load(self) -> None:
        raw = fileio.read_file(self.path)
        if raw is None:
            return
        try:
            doc = json.loads(raw)
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"unknown format version {doc.get('version')!r}")
            users: dict[str, Mapping[str, ScramCredential]] = {}
            for name, creds in doc["users"].items():
                parsed = {}
                for mech_name, c in creds.items():
                    if mech_name not in MECHANISMS:
                        raise ValueError(f"unknown mechanism {mech_name!r} for user {name!r}")
                    parsed[mech_name] = ScramCredential(
                        base64.b64decode(c["salt"]), base64.b64decode(c["stored_key"]),
                        base64.b64decode(c["server_key"]), int(c["iterations"]))
                users[str(name)] = MappingProxyType(parsed)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Refuse to start rather than run with no users (or some): an operator must look at it.
            raise ValueError(f"cannot read the user credentials in {self.path}: {exc}") from exc
        self._users = MappingProxyType(users)

    def _save(self, users: Mapping[str, Mapping[str, ScramCredential]]) -> None:
        doc: dict[str, Any] = {"version": FORMAT_VERSION, "users": {
            name: {mech: {"salt": _b64(c.salt), "iterations": c.iterations, "stored_key": _b64(c.stored_key),
                          "server_key": _b64(c.server_key)} for mech, c in sorted(creds.items())}
            for name, creds in sorted(users.items())}}
        fileio.fs.mkdir(self.path.parent)
        # write_atomic opens "<name>.tmp" with O_TRUNC, which keeps an existing file's mode: creating
        # it 0600 first means the hashes are never readable by others, not even between write and rename.
        tmp = self.path.with_name(self.path.name + ".tmp")
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(tmp, 0o600)
        fileio.fs.write_atomic(self.path, json.dumps(doc, indent=1).encode())
        if self.path.exists():
            os.chmod(self.path, 0o600)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()

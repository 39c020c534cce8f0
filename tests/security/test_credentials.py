"""The credential store: durable, salted and hashed, owner-only, refusing a corrupt file."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from oncelog.security.credentials import CredentialStore, users_path
from oncelog.security.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramCredential


def test_credentials_survive_a_reload_and_hold_no_password(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path)
    assert dict(store.users()) == {}
    c256 = ScramCredential.from_password(SCRAM_SHA_256, "hunter2-password", 4096)
    c512 = ScramCredential.from_password(SCRAM_SHA_512, "hunter2-password", 8192)
    store.alter(upsertions=[("alice", SCRAM_SHA_256, c256), ("alice", SCRAM_SHA_512, c512),
                            ("bob,=x", SCRAM_SHA_256, c256)])
    raw = users_path(tmp_path).read_bytes()
    assert b"hunter2" not in raw
    again = CredentialStore(tmp_path)
    assert again.get("alice", SCRAM_SHA_256) == c256 and again.get("alice", SCRAM_SHA_512) == c512
    assert again.get("bob,=x", SCRAM_SHA_256) == c256 and again.get("bob,=x", SCRAM_SHA_512) is None
    assert stat.S_IMODE(users_path(tmp_path).stat().st_mode) == 0o600
    doc = json.loads(raw)
    assert doc["users"]["alice"]["SCRAM-SHA-512"]["iterations"] == 8192


def test_deleting_the_last_credential_removes_the_user(tmp_path: Path) -> None:
    store = CredentialStore(tmp_path)
    c = ScramCredential.from_password(SCRAM_SHA_256, "pw", 4096)
    store.alter(upsertions=[("alice", SCRAM_SHA_256, c), ("alice", SCRAM_SHA_512, c)])
    snapshot = store.users()
    store.alter(deletions=[("alice", SCRAM_SHA_256)])
    assert set(store.users()["alice"]) == {"SCRAM-SHA-512"}
    assert set(snapshot["alice"]) == {"SCRAM-SHA-256", "SCRAM-SHA-512"}  # snapshots never change
    store.alter(deletions=[("alice", SCRAM_SHA_512)])
    assert "alice" not in store.users() and "alice" not in CredentialStore(tmp_path).users()


def test_a_failed_write_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from oncelog.storage import fileio

    store = CredentialStore(tmp_path)
    c = ScramCredential.from_password(SCRAM_SHA_256, "pw", 4096)
    store.alter(upsertions=[("alice", SCRAM_SHA_256, c)])

    def broken(path: Path, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.fs, "write_atomic", broken)
    with pytest.raises(OSError):
        store.alter(upsertions=[("bob", SCRAM_SHA_256, c)], deletions=[("alice", SCRAM_SHA_256)])
    assert set(store.users()) == {"alice"}


@pytest.mark.parametrize("content", [b"{not json", b'{"version": 2, "users": {}}', b'{"version": 1}',
                                     b'{"version": 1, "users": {"a": {"SCRAM-SHA-1": {}}}}',
                                     b'{"version": 1, "users": {"a": {"SCRAM-SHA-256": {"salt": "x"}}}}'])
def test_a_corrupt_file_is_refused_not_ignored(tmp_path: Path, content: bytes) -> None:
    users_path(tmp_path).parent.mkdir(parents=True)
    users_path(tmp_path).write_bytes(content)
    with pytest.raises(ValueError, match="cannot read the user credentials"):
        CredentialStore(tmp_path)


@pytest.mark.parametrize("name", ["", "a\0b"])
def test_unusable_names_are_refused(tmp_path: Path, name: str) -> None:
    c = ScramCredential.from_password(SCRAM_SHA_256, "pw", 4096)
    with pytest.raises(ValueError):
        CredentialStore(tmp_path).alter(upsertions=[(name, SCRAM_SHA_256, c)])

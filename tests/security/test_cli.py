"""`oncelog users` and the broker's security flags, as a user types them: exit codes and messages."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from oncelog.security.credentials import CredentialStore, users_path
from oncelog.security.scram import SCRAM_SHA_256, SCRAM_SHA_512
from oncelog.server.cli import add_arguments, config_from_args
from oncelog.testing.broker_process import BrokerProcess, free_port
from tests.security.conftest import SUPER, add_user, rdkafka_conf
from tests.security.test_sasl_clients import produce


def users(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", "users", *args], input=stdin, capture_output=True,
                          text=True, timeout=60)


def test_add_list_update_delete(tmp_path: Path) -> None:
    d = tmp_path / "data"
    r = add_user(d, "alice", " spaced pässword ")
    assert r.returncode == 0 and "created user alice (SCRAM-SHA-256, SCRAM-SHA-512, 4096 iterations)" in r.stdout
    store = CredentialStore(d)
    for m in (SCRAM_SHA_256, SCRAM_SHA_512):
        c = store.get("alice", m)
        assert c is not None and c.matches_password(m, " spaced pässword ")  # only the newline is stripped
    assert b"spaced" not in users_path(d).read_bytes()
    r = add_user(d, "bob", "pw", "--mechanism", "SCRAM-SHA-512", "--iterations", "16384")
    assert r.returncode == 0 and "created user bob (SCRAM-SHA-512, 16384 iterations)" in r.stdout
    r = users("list", "--data-dir", str(d))
    assert r.returncode == 0
    assert r.stdout.splitlines() == ["alice\tSCRAM-SHA-256 (4096 iterations), SCRAM-SHA-512 (4096 iterations)",
                                     "bob\tSCRAM-SHA-512 (16384 iterations)"]
    assert "pw" not in r.stdout and "salt" not in r.stdout
    r = add_user(d, "alice", "new-password", "--mechanism", "SCRAM-SHA-256")
    assert r.returncode == 0 and "updated user alice" in r.stdout
    c = CredentialStore(d).get("alice", SCRAM_SHA_256)
    assert c is not None and c.matches_password(SCRAM_SHA_256, "new-password")
    r = users("delete", "alice", "--mechanism", "SCRAM-SHA-512", "--data-dir", str(d))
    assert r.returncode == 0 and "deleted SCRAM-SHA-512 of user alice" in r.stdout
    r = users("delete", "alice", "--data-dir", str(d))
    assert r.returncode == 0 and "deleted SCRAM-SHA-256 of user alice" in r.stdout
    r = users("delete", "alice", "--data-dir", str(d))
    assert r.returncode == 1 and "user alice has no SCRAM-SHA-256 or SCRAM-SHA-512 credential" in r.stderr
    assert set(json.loads(users_path(d).read_text())["users"]) == {"bob"}


@pytest.mark.parametrize(("args", "stdin", "message"), [
    (["add", "alice", "--password-stdin"], "\n", "the password must not be empty"),
    (["add", "alice"], "pw\n", "give the password on stdin with --password-stdin"),
    (["add", "alice", "--password-stdin", "--iterations", "1000"], "pw\n", "--iterations must be between 4096"),
    (["add", "alice", "--password-stdin", "--iterations", "20000"], "pw\n", "--iterations must be between 4096"),
    (["add", "", "--password-stdin"], "pw\n", "Username must not be empty"),
], ids=["empty-password", "no-stdin-flag", "too-few-iterations", "too-many-iterations", "empty-name"])
def test_bad_input_exits_2_and_writes_nothing(tmp_path: Path, args: list[str], stdin: str, message: str) -> None:
    r = users(*args, "--data-dir", str(tmp_path / "d"), stdin=stdin)
    assert r.returncode == 2 and message in r.stderr
    assert not users_path(tmp_path / "d").exists()


def test_offline_changes_are_refused_while_a_broker_runs(start_broker: Callable[..., BrokerProcess],
                                                         tmp_path: Path) -> None:
    b = start_broker("--sasl", *SUPER, data_dir=tmp_path / "live")
    before = users_path(tmp_path / "live").read_bytes()
    r = add_user(tmp_path / "live", "mallory", "pw")
    assert r.returncode == 1
    assert "in use by another broker" in r.stderr and f"pid {b.proc.pid}" in r.stderr  # type: ignore[union-attr]
    assert "AlterUserScramCredentials" in r.stderr
    r = users("delete", "alice", "--data-dir", str(tmp_path / "live"))
    assert r.returncode == 1 and "in use by another broker" in r.stderr
    assert users_path(tmp_path / "live").read_bytes() == before
    assert users("list", "--data-dir", str(tmp_path / "live")).stdout.startswith("alice\t")  # reading is fine
    produce(rdkafka_conf(b), "still-alice", [b"x"])


def _config(*flags: str) -> object:
    p = argparse.ArgumentParser()
    add_arguments(p)
    return config_from_args(p.parse_args(list(flags)))


def test_flags_and_toml_give_kafkas_settings(tmp_path: Path) -> None:
    cfg = _config("--sasl", "--super-users", "User:alice,User:bob", "--sasl-enabled-mechanisms", "SCRAM-SHA-512")
    assert cfg.sasl_enabled and cfg.super_user_set == {"User:alice", "User:bob"}  # type: ignore[attr-defined]
    assert cfg.sasl_enabled_mechanisms == ["SCRAM-SHA-512"]  # type: ignore[attr-defined]
    assert cfg.security_protocol == "SASL_PLAINTEXT"  # type: ignore[attr-defined]
    assert cfg.authorizer_enabled  # type: ignore[attr-defined]  # --sasl turns the authorizer on
    toml = tmp_path / "b.toml"
    toml.write_text('sasl_enabled = true\n"super.users" = ["User:dave", "User:carol"]\n'
                    '"sasl.enabled.mechanisms" = ["PLAIN", "SCRAM-SHA-256"]\nauthorizer_enabled = false\n')
    cfg = _config("--config", str(toml))
    assert cfg.super_user_set == {"User:dave", "User:carol"}  # type: ignore[attr-defined]
    assert cfg.sasl_enabled_mechanisms == ["PLAIN", "SCRAM-SHA-256"]  # type: ignore[attr-defined]
    assert not cfg.authorizer_enabled  # type: ignore[attr-defined]  # set explicitly: authentication only
    assert _config("--config", str(toml), "--authorizer").authorizer_enabled  # type: ignore[attr-defined]
    assert not _config("--sasl", "--no-authorizer").authorizer_enabled  # type: ignore[attr-defined]
    toml.write_text('super_users = "User:a;User:b"\n')
    assert _config("--config", str(toml)).super_user_set == {"User:a", "User:b"}  # type: ignore[attr-defined]
    cfg = _config()
    assert not cfg.sasl_enabled and cfg.security_protocol == "PLAINTEXT"  # type: ignore[attr-defined]
    assert not cfg.authorizer_enabled  # type: ignore[attr-defined]
    assert cfg.sasl_enabled_mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("flags", "message"), [
    (["--tls-cert", "{cert}"], "--tls-cert and --tls-key (tls_cert, tls_key) must be given together"),
    (["--tls-key", "{key}"], "--tls-cert and --tls-key (tls_cert, tls_key) must be given together"),
    (["--sasl", "--sasl-enabled-mechanisms", "PLAIN,GSSAPI"], "unsupported SASL mechanism(s) GSSAPI"),
    (["--sasl", "--sasl-enabled-mechanisms", ","], "SASL is enabled but sasl_enabled_mechanisms is empty"),
    (["--super-users", "alice"], "super user 'alice' must be a principal of the form User:NAME"),
    (["--super-users", "Group:ops"], "must be a principal of the form User:NAME"),
    (["--tls-cert", "/nonexistent.pem", "--tls-key", "{key}"], "TLS certificate file /nonexistent.pem does not exist"),
    (["--tls-cert", "{key}", "--tls-key", "{key}"], "cannot load the TLS certificate"),
    (["--tls-cert", "{cert}", "--tls-key", "{other_key}"], "cannot load the TLS certificate"),
], ids=["cert-without-key", "key-without-cert", "unknown-mechanism", "no-mechanism", "bare-super-user",
        "group-super-user", "missing-cert", "key-as-cert", "mismatched-key"])
def test_bad_security_flags_exit_2_with_a_message(tmp_path: Path, tls_files: dict[str, Path], flags: list[str],
                                                  message: str) -> None:
    paths = {"cert": tls_files["cert"], "key": tls_files["key"], "other_key": tls_files["cert"].parent / "other.key"}
    args = [f.format(**paths) for f in flags]
    r = subprocess.run([sys.executable, "-m", "oncelog", "broker", "--data-dir", str(tmp_path / "d"),
                        "--listen", f"127.0.0.1:{free_port()}", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr

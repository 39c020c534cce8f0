"""Brokers with SASL (and TLS) for the security tests: users are created offline with the real
`oncelog users add` before the broker starts, as an operator would."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oncelog.testing.broker_process import BrokerProcess, oncelog_broker

ALICE = ("alice", "alice-pw-3f9a")  # created offline, the super user of these tests


def add_user(data_dir: Path, name: str, password: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", "users", "add", name, "--password-stdin",
                           "--data-dir", str(data_dir), *extra], input=password + "\n", capture_output=True,
                          text=True, timeout=60)


def rdkafka_conf(b: BrokerProcess, mechanism: str | None = "SCRAM-SHA-256", user: tuple[str, str] = ALICE,
                 tls_ca: Path | None = None, **extra: Any) -> dict[str, Any]:
    """librdkafka settings for ``b``: SASL with ``mechanism`` (None: no SASL), TLS if ``tls_ca``."""
    conf: dict[str, Any] = {"bootstrap.servers": b.bootstrap}
    if mechanism is None:
        conf["security.protocol"] = "SSL" if tls_ca else "PLAINTEXT"
    else:
        conf.update({"security.protocol": "SASL_SSL" if tls_ca else "SASL_PLAINTEXT", "sasl.mechanisms": mechanism,
                     "sasl.username": user[0], "sasl.password": user[1]})
    if tls_ca is not None:
        conf["ssl.ca.location"] = str(tls_ca)
    conf.update(extra)
    return conf


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """start_broker(*flags, users={name: password}) -> a running broker with those users made offline."""
    started: list[BrokerProcess] = []

    def start(*flags: str, users: dict[str, str] | None = None, data_dir: Path | None = None) -> BrokerProcess:
        data = data_dir or tmp_path / f"data{len(started)}"
        for name, password in (dict([ALICE]) if users is None else users).items():
            r = add_user(data, name, password)
            assert r.returncode == 0, r.stderr
        b = oncelog_broker(data, "--auto-create-topics", *flags, log_path=tmp_path / f"broker{len(started)}.log")
        started.append(b)
        return b.start()

    yield start
    for b in started:
        b.kill()


SUPER = ("--super-users", "User:alice")  # --sasl turns the authorizer on: alice may do everything


@pytest.fixture
def sasl_broker(start_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    return start_broker("--sasl", *SUPER)


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1/localhost signed by it, an unrelated CA, and a
    self-signed server certificate (its own CA)."""
    d = tmp_path_factory.mktemp("tls")

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=oncelog test CA",
            "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost", "-keyout", "server.key",
            "-out", "server.csr")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=someone else",
            "-keyout", "other.key", "-out", "other-ca.pem")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", "self.key", "-out", "self.pem")
    return {"ca": d / "ca.pem", "cert": d / "server.pem", "key": d / "server.key", "other_ca": d / "other-ca.pem",
            "self_cert": d / "self.pem", "self_key": d / "self.key"}

"""TLS on the listener (SSL alone, and SASL_SSL), with a CA and server certificate made by openssl in
the test; clients verify the certificate against ssl.ca.location, host name included."""

from __future__ import annotations

import socket
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

from oncelog.testing.broker_process import BrokerProcess
from tests.security.conftest import ALICE, SUPER, rdkafka_conf
from tests.security.scram_client import RawKafka
from tests.security.test_sasl_clients import GENERIC, consume, errors_of, produce
from tests.security.test_sasl_raw import metadata_works, scram_login


def tls_flags(tls: dict[str, Path]) -> tuple[str, ...]:
    return ("--tls-cert", str(tls["cert"]), "--tls-key", str(tls["key"]))


def test_ssl_alone_with_librdkafka_kafka_python_and_kcat(start_broker: Callable[..., BrokerProcess],
                                                         tls_files: dict[str, Path]) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KTopicPartition

    b = start_broker(*tls_flags(tls_files), users={})
    conf = rdkafka_conf(b, None, tls_ca=tls_files["ca"])
    produce(conf, "tls", [b"librdkafka"])
    p = KafkaProducer(bootstrap_servers=b.bootstrap, security_protocol="SSL", ssl_cafile=str(tls_files["ca"]))
    p.send("tls", b"kafka-python").get(timeout=30)
    p.close()
    r = subprocess.run(["kcat", "-b", b.bootstrap, "-X", "security.protocol=SSL", "-X",
                        f"ssl.ca.location={tls_files['ca']}", "-P", "-t", "tls"], input="kcat\n",
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert consume(conf, "tls", 3) == [b"librdkafka", b"kafka-python", b"kcat"]
    c = KafkaConsumer(bootstrap_servers=b.bootstrap, security_protocol="SSL", ssl_cafile=str(tls_files["ca"]),
                      consumer_timeout_ms=5000, auto_offset_reset="earliest")
    c.assign([KTopicPartition("tls", 0)])
    assert [m.value for m in c] == [b"librdkafka", b"kafka-python", b"kcat"]
    c.close()


def test_sasl_ssl_with_every_client(start_broker: Callable[..., BrokerProcess], tls_files: dict[str, Path]) -> None:
    """A self-signed certificate: the clients' ssl.ca.location is the certificate itself."""
    from kafka import KafkaProducer

    tls_files = {**tls_files, "cert": tls_files["self_cert"], "key": tls_files["self_key"],
                 "ca": tls_files["self_cert"]}
    b = start_broker("--sasl", *SUPER, *tls_flags(tls_files))
    produce(rdkafka_conf(b, "SCRAM-SHA-512", tls_ca=tls_files["ca"]), "sec", [b"librdkafka"])
    p = KafkaProducer(bootstrap_servers=b.bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(tls_files["ca"]),
                      sasl_mechanism="PLAIN", sasl_plain_username=ALICE[0], sasl_plain_password=ALICE[1])
    p.send("sec", b"kafka-python").get(timeout=30)
    p.close()
    kcat = ["kcat", "-b", b.bootstrap, "-X", "security.protocol=SASL_SSL", "-X", f"ssl.ca.location={tls_files['ca']}",
            "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", f"sasl.username={ALICE[0]}",
            "-X", f"sasl.password={ALICE[1]}"]
    r = subprocess.run([*kcat, "-P", "-t", "sec"], input="kcat\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([*kcat, "-C", "-t", "sec", "-o", "beginning", "-e"], capture_output=True, text=True,
                       timeout=60)
    assert r.stdout.splitlines() == ["librdkafka", "kafka-python", "kcat"], r.stderr
    # a wrong password over TLS is still refused with Kafka's message
    bad = subprocess.run([*kcat[:-2], "-X", "sasl.password=wrong", "-L"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and GENERIC + "SCRAM-SHA-256" in bad.stderr
    # the raw client, SCRAM over TLS
    ctx = ssl.create_default_context(cafile=str(tls_files["ca"]))
    c = RawKafka(b.host, b.port, tls=ctx)
    scram_login(c, "SCRAM-SHA-256")
    assert metadata_works(c, b)


def test_clients_that_do_not_trust_the_certificate_or_skip_tls_get_nothing(
        start_broker: Callable[..., BrokerProcess], tls_files: dict[str, Path]) -> None:
    b = start_broker("--sasl", *SUPER, *tls_flags(tls_files))
    produce(rdkafka_conf(b, tls_ca=tls_files["ca"]), "sec", [b"classified"])
    got, errors = errors_of(rdkafka_conf(b, tls_ca=tls_files["other_ca"]), 4, "sec")
    assert got == [] and any("certificate verify failed" in e for e in errors), errors
    got, errors = errors_of(rdkafka_conf(b), 4, "sec")  # SASL_PLAINTEXT to a TLS listener
    assert got == [] and errors
    s = socket.create_connection((b.host, b.port), timeout=5)  # Kafka bytes where TLS is expected
    s.sendall(b"\x00\x00\x00\x0a\x00\x12\x00\x00\x00\x00\x00\x01\x00\x00")
    try:
        data = s.recv(100)
    except ConnectionResetError:
        data = b""
    assert not data.startswith(b"\x00\x00")  # no Kafka response: at most a TLS alert, then EOF

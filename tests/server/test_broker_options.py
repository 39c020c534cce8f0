"""Broker options as a user meets them: TOML config, flags, auto-creation off by default, bad input."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from oncelog.testing.broker_process import BrokerProcess, free_port, oncelog_broker


def test_auto_create_is_off_by_default(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d").start()
    try:
        md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics("nope", timeout=10)
        assert md.topics["nope"].error is not None
        assert md.topics["nope"].error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        b.kill()


def test_toml_config_and_flag_precedence(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f'listen = "127.0.0.1:{port}"\nauto_create_topics_enable = true\nnum_partitions = 3\n'
                   f'data_dir = "{tmp_path / "from-toml"}"\n')
    proc = subprocess.Popen([sys.executable, "-m", "oncelog", "broker", "--config", str(cfg), "--num-partitions", "2"],
                            stderr=subprocess.PIPE, text=True)
    b = BrokerProcess("127.0.0.1", port, None, [])
    try:
        from oncelog.testing.broker_process import wait_for_port

        wait_for_port("127.0.0.1", port, 30, proc)
        p = Producer({"bootstrap.servers": b.bootstrap})
        p.produce("auto", b"x")
        assert p.flush(15) == 0
        md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics("auto", timeout=10)
        assert len(md.topics["auto"].partitions) == 2  # the flag beats the file
        assert (tmp_path / "from-toml" / "auto-0").is_dir()
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0


def test_bad_options_exit_with_a_message(tmp_path: Path) -> None:
    def broker(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "oncelog", "broker", "--data-dir", str(tmp_path / "d"), *args],
                              capture_output=True, text=True, timeout=30)

    r = broker("--listen", "nonsense")
    assert r.returncode == 2 and "HOST:PORT" in r.stderr
    bad = tmp_path / "bad.toml"
    bad.write_text("no_such_setting = 1\n")
    r = broker("--config", str(bad))
    assert r.returncode == 2 and "no_such_setting" in r.stderr
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        r = broker("--listen", f"127.0.0.1:{s.getsockname()[1]}")
        assert r.returncode == 1 and "cannot start" in r.stderr


@pytest.mark.parametrize(("toml", "says"), [
    ("log_segment_bytes = -5", "log_segment_bytes: Value must be at least 14"),  # segment.bytes's rule
    ("log_retention_ms = -2", "log_retention_ms: Value must be at least -1"),
    ("log_cleaner_min_cleanable_ratio = 2.0", "no more than 1"),
    ("log_cleaner_min_cleanable_ratio = 'x'", "must be a number"),
    ("num_partitions = 0", "num_partitions: Value must be at least 1"),
    ("max_connections = -1", "max_connections: Value must be at least 0"),
    ("fetch_max_bytes = 10", "fetch_max_bytes: Value must be at least 1024"),
    ("group_min_session_timeout_ms = 9000000", "must not be above group_max_session_timeout_ms"),
    ("log_level = 'loud'", "log_level must be one of"),
    ("log_level = 5", "'log_level' must be a string"),
    ("data_dir = 5", "'data_dir' must be a directory path"),
    ("listen = 5", "'listen' must be a string HOST:PORT"),
])
def test_configs_out_of_range_stop_the_broker_at_start(tmp_path: Path, toml: str, says: str) -> None:
    """Each of these used to start a broker (a negative segment size, auto-created topics of no
    partition, any log level) or die with a traceback (data_dir = 5)."""
    (tmp_path / "b.toml").write_text(toml + "\n")
    r = subprocess.run([sys.executable, "-m", "oncelog", "broker", "--data-dir", str(tmp_path / "d"), "--listen",
                        "127.0.0.1:0", "--config", str(tmp_path / "b.toml")], capture_output=True, text=True,
                       timeout=30)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, (toml, r.stderr[-800:])


def test_every_default_is_within_the_limits() -> None:
    from oncelog.server.config import AT_LEAST, BrokerConfig

    BrokerConfig().validate_limits()
    fields = {f for f in BrokerConfig.__dataclass_fields__}
    assert set(AT_LEAST) <= fields, "a limit for a config that does not exist"


def test_delayed_fetch_is_woken_by_an_append(broker: BrokerProcess) -> None:
    from oncelog.testing.broker_process import create_topic

    create_topic(broker.bootstrap, "wake")
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w", "fetch.wait.max.ms": 5000,
                  "fetch.min.bytes": 1, "log_level": 3})
    c.assign([TopicPartition("wake", 0, 0)])
    c.poll(1.0)  # the consumer is now parked in a long-poll Fetch
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    start = time.monotonic()
    p.produce("wake", b"now")
    p.flush(10)
    m = None
    while m is None and time.monotonic() - start < 10:
        m = c.poll(0.05)
    latency = time.monotonic() - start
    c.close()
    assert m is not None and m.value() == b"now"
    assert latency < 2.5, f"fetch was not woken by the append ({latency:.2f}s, max wait 5 s)"

from __future__ import annotations

import subprocess
import sys

from oncelog.testing.broker_process import BrokerProcess


def oncelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", *args], capture_output=True, text=True, timeout=60)


def test_topics_create_list_describe_delete(broker: BrokerProcess) -> None:
    bs = ["--bootstrap", broker.bootstrap]
    r = oncelog("topics", "create", "orders", "--partitions", "3", "--config", "retention.ms=3600000", *bs)
    assert r.returncode == 0, r.stderr
    r = oncelog("topics", "create", "orders", *bs)
    assert r.returncode == 1 and "already exists" in r.stderr
    r = oncelog("topics", "create", "bad name!", *bs)
    assert r.returncode == 1 and "characters" in r.stderr
    r = oncelog("topics", "create", "x", "--config", "segment.bytes=abc", *bs)
    assert r.returncode == 1 and "Not a number of type INT" in r.stderr
    r = oncelog("topics", "create", "x", "--config", "novalue", *bs)
    assert r.returncode == 2
    r = oncelog("topics", "list", *bs)
    assert r.stdout.split() == ["orders"]
    r = oncelog("topics", "describe", "orders", *bs)
    assert r.returncode == 0 and "PartitionCount: 3" in r.stdout and "retention.ms=3600000" in r.stdout
    r = oncelog("topics", "delete", "orders", *bs)
    assert r.returncode == 0
    assert oncelog("topics", "list", *bs).stdout.strip() == ""
    r = oncelog("topics", "describe", "orders", *bs)
    assert r.returncode == 1


def test_unreachable_broker_is_a_clear_error() -> None:
    r = oncelog("topics", "list", "--bootstrap", "127.0.0.1:1", "--timeout", "2")
    assert r.returncode == 1 and "cannot reach" in r.stderr

from __future__ import annotations

import time

from confluent_kafka import Consumer, Producer

from oncelog.testing.broker_process import BrokerProcess, create_topic
from tests.admin.test_transactions_cli import oncelog


def test_groups_list_and_describe_show_members_offsets_and_lag(broker: BrokerProcess) -> None:
    bs = ["--bootstrap", broker.bootstrap]
    create_topic(broker.bootstrap, "lagged", 2)
    p = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        p.produce("lagged", b"x", partition=i % 2)
    p.flush(10)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "watchers", "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "client.id": "watcher-1", "log_level": 3})
    c.subscribe(["lagged"])
    got = 0
    deadline = time.monotonic() + 20
    while got < 6 and time.monotonic() < deadline:
        m = c.poll(0.1)
        if m is not None and not m.error() and m.partition() == 0:
            got += 1
            if got == 3:
                c.commit(message=m, asynchronous=False)
    try:
        r = oncelog("groups", "list", *bs)
        assert r.returncode == 0 and "watchers" in r.stdout and "STABLE" in r.stdout
        r = oncelog("groups", "describe", "watchers", *bs)
        assert r.returncode == 0, r.stderr
        assert "watcher-1" in r.stdout and "lagged-0" in r.stdout
        row = next(line for line in r.stdout.splitlines() if "lagged" in line and "│ 0 " in line)
        cells = [x.strip() for x in row.strip("│ ").split("│")]
        assert cells[2:] == ["3", "5", "2"]  # committed 3, log end 5, lag 2
    finally:
        c.close()


def test_an_unreachable_broker_is_an_error_not_an_empty_list() -> None:
    """``groups list`` used to print an empty table and exit 0 when no broker answered (librdkafka's
    ListConsumerGroups reports no group when it knows no broker); ``records delete`` said only
    "Failed to query partition leaders: Local: Timed out"."""
    for args in (["groups", "list"], ["groups", "describe", "g"],
                 ["records", "delete", "--topic", "t", "--partition", "0", "--before", "1"]):
        for where in ("127.0.0.1:1", "nonsense"):
            r = oncelog(*args, "--bootstrap", where, "--timeout", "2")
            assert r.returncode == 1 and f"cannot reach a broker at {where}" in r.stderr, (args, where, r)

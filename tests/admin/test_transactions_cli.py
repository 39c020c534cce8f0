from __future__ import annotations

import os
import subprocess
import sys

from confluent_kafka import Producer

from oncelog.testing.broker_process import BrokerProcess, create_topic
from tests.transactions.test_transactions_librdkafka import read_all


def oncelog(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "oncelog", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "250"})


def test_list_describe_find_hanging_and_abort(broker: BrokerProcess) -> None:
    bs = ["--bootstrap", broker.bootstrap]
    create_topic(broker.bootstrap, "hang")
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "stuck"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("hang", b"stuck-record")
    p.flush(10)
    r = oncelog("transactions", "list", "--state", "Ongoing", *bs)
    assert r.returncode == 0 and "stuck" in r.stdout and "Ongoing" in r.stdout
    r = oncelog("transactions", "describe", "--transactional-id", "stuck", *bs)
    assert r.returncode == 0 and "hang-0" in r.stdout
    r = oncelog("transactions", "describe", "--transactional-id", "nope", *bs)
    assert r.returncode == 1 and "transactional_id_not_found" in r.stderr
    # not hanging while the coordinator knows it and it is young
    assert "hang" not in oncelog("transactions", "find-hanging", *bs).stdout
    r = oncelog("transactions", "find-hanging", "--max-transaction-timeout-ms", "0", *bs)
    row = next(line for line in r.stdout.splitlines() if "hang" in line)
    cells = [c.strip() for c in row.strip("│ ").split("│")]
    topic, partition, pid, epoch = cells[0], cells[1], cells[2], cells[3]
    assert (topic, partition) == ("hang", "0")
    assert read_all(broker.bootstrap, "hang", 1, "read_committed", settle_s=0.5) == []
    r = oncelog("transactions", "abort", "--topic", "hang", "--partition", "0", "--producer-id", pid,
                "--producer-epoch", epoch, *bs)
    assert r.returncode == 0, r.stderr
    p2 = Producer({"bootstrap.servers": broker.bootstrap})
    p2.produce("hang", b"after")
    p2.flush(10)
    # the LSO moved past the aborted data: read_committed sees the later record, not the aborted one
    assert [v for _, _, v in read_all(broker.bootstrap, "hang", 1, "read_committed")] == [b"after"]
    r = oncelog("transactions", "abort", "--topic", "hang", "--partition", "0", "--producer-id", pid,
                "--producer-epoch", str(int(epoch) - 1 if int(epoch) > 0 else -5), *bs)
    assert r.returncode == 1


def test_transactions_cli_unreachable_broker() -> None:
    r = oncelog("transactions", "list", "--bootstrap", "127.0.0.1:1", "--timeout", "2")
    assert r.returncode == 1 and "cannot reach" in r.stderr
    r = oncelog("transactions", "list", "--bootstrap", "nonsense", "--timeout", "2")
    assert r.returncode == 1 and "cannot reach a broker at nonsense: expected HOST:PORT" in r.stderr, r.stderr

"""The compatibility matrix: idempotence and transactions with every client, beyond produce/consume
(tests/compat/test_clients.py) and groups (tests/groups/)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time

import pytest

from oncelog.testing.broker_process import BrokerProcess, create_topic
from tests.transactions.test_transactions_librdkafka import read_all


def test_kafka_python_idempotent_and_transactional_producers(broker: BrokerProcess) -> None:
    from kafka import KafkaProducer

    create_topic(broker.bootstrap, "kpx")
    idem = KafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True, acks="all")
    for i in range(5):
        idem.send("kpx", b"idem-%d" % i)
    idem.flush()
    idem.close()
    tx = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-tx")
    tx.init_transactions()
    tx.begin_transaction()
    tx.send("kpx", b"committed")
    tx.commit_transaction()
    tx.begin_transaction()
    tx.send("kpx", b"aborted")
    tx.flush()
    tx.abort_transaction()
    tx.close()
    values = [v for _, _, v in read_all(broker.bootstrap, "kpx", 1, "read_committed")]
    assert values == [b"idem-%d" % i for i in range(5)] + [b"committed"]


def test_aiokafka_idempotent_and_transactional_producers(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaProducer

    create_topic(broker.bootstrap, "aix")

    async def main() -> None:
        idem = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, enable_idempotence=True)
        await idem.start()
        try:
            for i in range(5):
                await idem.send_and_wait("aix", b"idem-%d" % i)
        finally:
            await idem.stop()
        tx = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-tx")
        await tx.start()
        try:
            async with tx.transaction():
                await tx.send_and_wait("aix", b"committed")
            await tx.begin_transaction()
            await tx.send_and_wait("aix", b"aborted")
            await tx.abort_transaction()
        finally:
            await tx.stop()

    asyncio.run(main())
    values = [v for _, _, v in read_all(broker.bootstrap, "aix", 1, "read_committed")]
    assert values == [b"idem-%d" % i for i in range(5)] + [b"committed"]


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian package) is not installed")
def test_kcat_produces_and_reads_committed_only(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "kcx")
    subprocess.run(["kcat", "-b", broker.bootstrap, "-P", "-t", "kcx", "-p", "0"], input="one\ntwo\n", text=True,
                   timeout=30, check=True)
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "kc-tx"})
    p.init_transactions(10)
    p.begin_transaction()
    p.produce("kcx", b"aborted", partition=0)
    p.flush(10)
    p.abort_transaction(10)
    time.sleep(0.2)
    out = subprocess.run(["kcat", "-b", broker.bootstrap, "-C", "-t", "kcx", "-o", "beginning", "-e",
                          "-X", "isolation.level=read_committed"], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    assert out.split() == ["one", "two"]

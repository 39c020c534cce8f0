"""Transactions end to end with librdkafka against a broker the test starts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker


def read_all(bootstrap: str, topic: str, partitions: int, isolation: str, settle_s: float = 1.5) -> list:
    """Everything readable now: poll until the end of each partition (per isolation level)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader", "enable.auto.commit": False,
                  "isolation.level": isolation, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    eof: set[int] = set()
    deadline = time.monotonic() + 20
    quiet_until = time.monotonic() + settle_s
    while time.monotonic() < deadline and (len(eof) < partitions or time.monotonic() < quiet_until):
        m = c.poll(0.1)
        if m is None:
            continue
        if m.error():
            if m.error().code() == -191:  # _PARTITION_EOF
                eof.add(m.partition())
            continue
        got.append((m.partition(), m.offset(), m.value()))
    c.close()
    return got


def txn_producer(bootstrap: str, tid: str, **extra: object) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, **extra})
    p.init_transactions(15)
    return p


def test_commit_and_abort_visibility_and_markers_take_offsets(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "vis", 2)
    p = txn_producer(broker.bootstrap, "vis-1")
    p.begin_transaction()
    for i in range(6):
        p.produce("vis", b"committed-%d" % i, partition=i % 2)
    p.commit_transaction(15)
    p.begin_transaction()
    for i in range(6):
        p.produce("vis", b"aborted-%d" % i, partition=i % 2)
    p.flush(15)
    p.abort_transaction(15)
    committed = read_all(broker.bootstrap, "vis", 2, "read_committed")
    uncommitted = read_all(broker.bootstrap, "vis", 2, "read_uncommitted")
    assert sorted(v for _, _, v in committed) == sorted(b"committed-%d" % i for i in range(6))
    assert sorted(v for _, _, v in uncommitted) == sorted([b"committed-%d" % i for i in range(6)] +
                                                          [b"aborted-%d" % i for i in range(6)])
    # markers occupy offsets and are never delivered: 3 committed, COMMIT marker, 3 aborted, ABORT marker
    assert sorted(o for p_, o, _ in uncommitted if p_ == 0) == [0, 1, 2, 4, 5, 6]
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w", "isolation.level": "read_committed"})
    assert c.get_watermark_offsets(TopicPartition("vis", 0), timeout=10) == (0, 8)
    c.close()


def test_open_transaction_holds_back_read_committed_until_it_commits(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "lso")
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    p = txn_producer(broker.bootstrap, "lso-1")
    p.begin_transaction()
    p.produce("lso", b"in-txn")
    p.flush(10)
    plain.produce("lso", b"after-txn-start")
    plain.flush(10)
    assert read_all(broker.bootstrap, "lso", 1, "read_committed", settle_s=1.0) == []
    assert len(read_all(broker.bootstrap, "lso", 1, "read_uncommitted")) == 2
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "w", "isolation.level": "read_committed"})
    assert c.get_watermark_offsets(TopicPartition("lso", 0), timeout=10) == (0, 0)  # LSO
    p.commit_transaction(10)
    assert [v for _, _, v in read_all(broker.bootstrap, "lso", 1, "read_committed")] == [b"in-txn",
                                                                                        b"after-txn-start"]
    c.close()


def test_zombie_is_fenced_and_none_of_its_writes_become_visible(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "zombie")
    zombie = txn_producer(broker.bootstrap, "same-id")
    zombie.begin_transaction()
    zombie.produce("zombie", b"zombie-1")
    zombie.flush(10)
    successor = txn_producer(broker.bootstrap, "same-id")  # fences the zombie, aborts its transaction
    successor.begin_transaction()
    successor.produce("zombie", b"successor")
    successor.commit_transaction(10)
    fenced = []
    try:
        zombie.produce("zombie", b"zombie-2")
        zombie.flush(10)
        zombie.commit_transaction(10)
    except KafkaException as exc:
        fenced.append(exc.args[0])
    except SystemError:  # confluent-kafka surfaces the fatal error from inside flush()
        fenced.append("fatal")
    assert fenced, "the zombie's commit must fail"
    values = [v for _, _, v in read_all(broker.bootstrap, "zombie", 1, "read_committed")]
    assert values == [b"successor"]


def test_hung_transaction_is_aborted_after_its_timeout(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", "--transaction-abort-interval-ms", "200",
                       log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "hung")
        p = txn_producer(b.bootstrap, "hung-1", **{"transaction.timeout.ms": 1500})
        p.begin_transaction()
        p.produce("hung", b"never-committed")
        p.flush(10)
        plain = Producer({"bootstrap.servers": b.bootstrap})
        plain.produce("hung", b"plain")
        plain.flush(10)
        assert read_all(b.bootstrap, "hung", 1, "read_committed", settle_s=0.5) == []
        time.sleep(2.5)  # the coordinator aborts it; the LSO moves on
        assert [v for _, _, v in read_all(b.bootstrap, "hung", 1, "read_committed")] == [b"plain"]
        with pytest.raises(KafkaException):
            p.commit_transaction(10)
    finally:
        b.kill()


def test_kill_9_in_the_middle_of_a_commit_finishes_it_after_restart(tmp_path: Path) -> None:
    import sys

    fault = oncelog_broker(tmp_path / "d", log_path=tmp_path / "broker.log")
    fault.args = [sys.executable, str(Path(__file__).parents[1] / "faults" / "fault_broker.py"), "after_prepare",
                  *fault.args[4:]]
    b = fault.start()
    try:
        create_topic(b.bootstrap, "mid", 2)
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "mid-1", "message.timeout.ms": 5000})
        p.init_transactions(15)
        p.begin_transaction()
        for i in range(4):
            p.produce("mid", b"m-%d" % i, partition=i % 2)
        p.flush(10)
        with pytest.raises(KafkaException):
            p.commit_transaction(5)  # the broker dies after writing PrepareCommit
        assert b.proc is not None and b.proc.wait(10) == 17
        b = oncelog_broker(tmp_path / "d", port=b.port, log_path=tmp_path / "broker.log").start()
        got = read_all(b.bootstrap, "mid", 2, "read_committed")  # the restart wrote the COMMIT markers
        assert sorted(v for _, _, v in got) == [b"m-0", b"m-1", b"m-2", b"m-3"]
        assert "1 transaction(s) to complete" in (tmp_path / "broker.log").read_text()
    finally:
        b.kill()


def test_transactions_survive_a_broker_restart(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "rs")
        p = txn_producer(b.bootstrap, "rs-1")
        p.begin_transaction()
        p.produce("rs", b"a")
        p.commit_transaction(10)
        p.begin_transaction()
        p.produce("rs", b"open-at-crash")
        p.flush(10)
        b.restart()  # kill -9 with a transaction open
        assert read_all(b.bootstrap, "rs", 1, "read_committed", settle_s=0.5) == [(0, 0, b"a")]
        p2 = txn_producer(b.bootstrap, "rs-1")  # fences and aborts the open one
        p2.begin_transaction()
        p2.produce("rs", b"b")
        p2.commit_transaction(10)
        assert [v for _, _, v in read_all(b.bootstrap, "rs", 1, "read_committed")] == [b"a", b"b"]
    finally:
        b.kill()


def test_after_an_unclean_restart_an_open_transaction_is_aborted_and_its_producer_fenced(tmp_path: Path) -> None:
    """Background fsync: some of the open transaction's acknowledged records could have been lost in
    one partition and kept in another, so the restart aborts it; the producer's commit then fails
    (fenced) instead of committing what survived."""
    b = oncelog_broker(tmp_path / "d", log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "uncl", 2)
        p = txn_producer(b.bootstrap, "uncl-1")
        p.begin_transaction()
        for i in range(4):
            p.produce("uncl", b"open-%d" % i, partition=i % 2)
        p.flush(10)
        b.restart()  # kill -9
        with pytest.raises(KafkaException) as exc:
            p.commit_transaction(15)
        assert exc.value.args[0].fatal() or exc.value.args[0].txn_requires_abort()
        assert read_all(b.bootstrap, "uncl", 2, "read_committed", settle_s=0.5) == []
        assert "it was open when the broker stopped uncleanly" in (tmp_path / "broker.log").read_text()
        p2 = txn_producer(b.bootstrap, "uncl-1")
        p2.begin_transaction()
        p2.produce("uncl", b"after", partition=0)
        p2.commit_transaction(15)
        assert [v for _, _, v in read_all(b.bootstrap, "uncl", 2, "read_committed")] == [b"after"]
    finally:
        b.kill()

"""``producer_state_max_entries`` seen from real clients, against a broker process: a stranger asking
for producer id after producer id, each writing to every partition, evicts an idle librdkafka
producer's state; that producer's next batch gets UNKNOWN_PRODUCER_ID, librdkafka bumps its epoch and
sends again, and every value arrives once, in order. The broker's entries stay within the bound
throughout, it stops cleanly and starts again. And ``transactional_id_max_entries``: an idle
transactional id pushed out by a stranger's costs its librdkafka owner one aborted transaction."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import create_topic, oncelog_broker
from tests.compat.test_clients import consume_all
from tests.storage.helpers import batch

MAX_ENTRIES = 20
PARTITIONS = 4
STRANGER = b"stranger"


def produce_one_batch_from_each_new_producer(bootstrap: str, producers: int) -> None:
    """The stranger: InitProducerId (no transactional id), then one batch of that id to every partition."""
    with RawClient(bootstrap) as c:
        for _ in range(producers):
            init = c.request(22, (0, 4), {"transactional_id": None, "transaction_timeout": 60_000,
                                          "producer_id": -1, "producer_epoch": -1})
            assert init.error_code == 0
            data = batch(1, pid=int(init.producer_id), epoch=int(init.producer_epoch), seq=0,
                         ts=int(time.time() * 1000), value=STRANGER)
            resp = c.request(0, (3, 9), {"transactional_id": None, "acks": -1, "timeout": 10_000, "topic_data": [
                {"name": "t", "partition_data": [{"index": p, "records": data} for p in range(PARTITIONS)]}]})
            assert [pr.error_code for pr in resp.responses[0].partition_responses] == [0] * PARTITIONS


def producer_entries(bootstrap: str) -> dict[int, list[tuple[int, int]]]:
    """DescribeProducers (KIP-664): the (producer id, epoch) the broker holds state for, per partition."""
    with RawClient(bootstrap) as c:
        resp = c.request(61, (0, 0), {"topics": [{"name": "t", "partition_indexes": list(range(PARTITIONS))}]})
    return {p.partition_index: [(s.producer_id, s.producer_epoch) for s in p.active_producers]
            for p in resp.topics[0].partitions}


def test_an_idle_idempotent_producer_evicted_by_a_stranger_bumps_its_epoch_and_loses_or_doubles_nothing(
        tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    cfg.write_text(f"producer_state_max_entries = {MAX_ENTRIES}\n")
    with oncelog_broker(tmp_path / "d", "--config", str(cfg), log_path=tmp_path / "broker.log") as broker:
        broker.start()
        create_topic(broker.bootstrap, "t", PARTITIONS)
        errors: list[str] = []
        p = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                      "error_cb": lambda e: errors.append(str(e))})
        delivered: list[tuple[object, int]] = []

        def send(values: range) -> None:
            for i in values:
                p.produce("t", value=b"v%d" % i, partition=0,
                          on_delivery=lambda err, msg: delivered.append((err, msg.offset())))
            assert p.flush(30) == 0

        send(range(0, 20))
        (victim,) = producer_entries(broker.bootstrap)[0]
        produce_one_batch_from_each_new_producer(broker.bootstrap, 3 * MAX_ENTRIES)
        held = producer_entries(broker.bootstrap)
        assert sum(len(pids) for pids in held.values()) <= MAX_ENTRIES
        assert victim not in held[0]  # its state is gone
        send(range(20, 40))  # UNKNOWN_PRODUCER_ID, an epoch bump, the batch again
        assert (victim[0], victim[1] + 1) in producer_entries(broker.bootstrap)[0]  # (librdkafka bumps it locally)
        send(range(40, 50))
        assert [err for err, _ in delivered if err is not None] == []
        assert not any("fatal" in e.lower() for e in errors), errors
        p.flush(5)
        values = [m.value() for m in consume_all(broker.bootstrap, "t", 1, 50 + 3 * MAX_ENTRIES)]
        assert [v for v in values if v != STRANGER] == [b"v%d" % i for i in range(50)]
        assert sum(len(pids) for pids in producer_entries(broker.bootstrap).values()) <= MAX_ENTRIES
        assert broker.stop() == 0
        broker.start()
        assert sum(len(pids) for pids in producer_entries(broker.bootstrap).values()) <= MAX_ENTRIES
        assert [m.value() for m in consume_all(broker.bootstrap, "t", 1, len(values))] == values


def test_an_idle_transactional_id_expired_early_by_a_stranger_costs_its_owner_one_aborted_transaction(
        tmp_path: Path) -> None:
    """``transactional_id_max_entries``: a stranger's new transactional ids push an idle one out at the
    timeout scan. Its owner's next AddPartitionsToTxn gets INVALID_PRODUCER_ID_MAPPING, which
    librdkafka takes as abortable: after the abort the same producer commits again, and
    read_committed shows what was committed, once."""
    from confluent_kafka import KafkaException

    cfg = tmp_path / "broker.toml"
    cfg.write_text("transactional_id_max_entries = 20\n"
                   "transaction_abort_timed_out_transaction_cleanup_interval_ms = 200\n")
    with oncelog_broker(tmp_path / "d", "--config", str(cfg), log_path=tmp_path / "broker.log") as broker:
        broker.start()
        create_topic(broker.bootstrap, "t", 1)
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "victim"})
        p.init_transactions(10)
        p.begin_transaction()
        p.produce("t", b"one")
        p.commit_transaction(10)
        with RawClient(broker.bootstrap) as c:
            for i in range(60):
                init = c.request(22, (0, 4), {"transactional_id": f"stranger-{i}", "transaction_timeout": 60_000,
                                              "producer_id": -1, "producer_epoch": -1})
                assert init.error_code == 0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                listed = c.request(66, (0, 0), {"state_filters": [], "producer_id_filters": []})
                if len(listed.transaction_states) <= 20:
                    break
                time.sleep(0.1)
            assert len(listed.transaction_states) <= 20
            assert "victim" not in {t.transactional_id for t in listed.transaction_states}
        p.begin_transaction()
        p.produce("t", b"two")
        try:
            p.commit_transaction(10)
            raise AssertionError("the expired id's producer id was still taken")
        except KafkaException as exc:
            err = exc.args[0]
            assert err.txn_requires_abort() and not err.fatal(), err
        p.abort_transaction(10)
        p.begin_transaction()
        p.produce("t", b"three")
        p.commit_transaction(10)
        values = [m.value() for m in consume_all(broker.bootstrap, "t", 1, 2, **{"isolation.level": "read_committed"})]
        assert values == [b"one", b"three"]


def test_past_group_max_count_a_new_consumer_group_waits_and_a_known_one_carries_on(tmp_path: Path) -> None:
    """``group_max_count``: a stranger's offset commits to new groups fill the bound, and are refused
    past it (COORDINATOR_NOT_AVAILABLE). A consumer group known before keeps committing; a new
    librdkafka consumer group waits (it retries, reporting nothing) until a deletion makes room,
    then joins and reads everything."""
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    cfg = tmp_path / "broker.toml"
    cfg.write_text("group_max_count = 5\n")
    with oncelog_broker(tmp_path / "d", "--config", str(cfg), log_path=tmp_path / "broker.log") as broker:
        broker.start()
        create_topic(broker.bootstrap, "t", 1)
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(10):
            p.produce("t", value=b"v%d" % i)
        assert p.flush(10) == 0

        def consumer(group: str) -> Consumer:
            c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                          "enable.auto.commit": False, "session.timeout.ms": 6000})
            c.subscribe(["t"])
            return c

        def read(c: Consumer, n: int, seconds: float) -> list[bytes]:
            got: list[bytes] = []
            deadline = time.monotonic() + seconds
            while len(got) < n and time.monotonic() < deadline:
                m = c.poll(0.2)
                if m is not None and not m.error():
                    got.append(m.value())
            return got

        known = consumer("known")
        assert len(read(known, 5, 20)) == 5
        known.commit(asynchronous=False)
        codes = []
        with RawClient(broker.bootstrap) as c:
            for i in range(8):
                resp = c.request(8, (2, 8), {"group_id": f"stranger-{i}", "generation_id_or_member_epoch": -1,
                                             "member_id": "", "group_instance_id": None, "retention_time_ms": -1,
                                             "topics": [{"name": "t", "partitions": [
                                                 {"partition_index": 0, "committed_offset": 0,
                                                  "committed_leader_epoch": -1, "committed_metadata": ""}]}]})
                codes.append(resp.topics[0].partitions[0].error_code)
        assert codes == [0, 0, 0, 0] + [15] * 4  # 'known' and four strangers: five groups
        assert len(read(known, 5, 20)) == 5  # a known group carries on
        known.commit(asynchronous=False)
        newcomer = consumer("newcomer")
        assert read(newcomer, 1, 4) == []  # no room for its group: it waits
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.delete_consumer_groups(["stranger-0"])["stranger-0"].result(10)
        assert read(newcomer, 10, 30) == [b"v%d" % i for i in range(10)]
        newcomer.close()
        known.close()

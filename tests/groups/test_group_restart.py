"""Offsets, pending transactional offsets and group state come back after a kill -9 of the broker."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import create_topic, oncelog_broker

OFFSET_FETCH = (9, (7, 8))
UNSTABLE_OFFSET_COMMIT = 88


def _fetch(bootstrap: str, group: str, require_stable: bool) -> tuple[int, int]:
    with RawClient(bootstrap) as client:
        resp = client.request(*OFFSET_FETCH, {"groups": [{"group_id": group, "topics": [
            {"name": "rt", "partition_indexes": [0]}]}], "require_stable": require_stable}) \
            if client.version_for(9, (7, 8)) >= 8 else None
    assert resp is not None
    part = resp.groups[0].topics[0].partitions[0]
    return int(part.committed_offset), int(part.error_code)


def test_offsets_pending_txn_offsets_and_groups_survive_kill_9(tmp_path: Path) -> None:
    # --flush-every-append: an open transaction survives a kill -9 (with background fsync the restart
    # aborts it, since some of its records may be lost: tests/storage/test_power_cut.py)
    b = oncelog_broker(tmp_path / "d", "--group-initial-rebalance-delay-ms", "0", "--flush-every-append",
                       log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "rt")
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "plain", "enable.auto.commit": False,
                      "log_level": 3})
        c.commit(offsets=[TopicPartition("rt", 0, 42)], asynchronous=False)
        c.close()
        # a transaction with offsets, left open at the crash
        p = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "rt-tx", "log_level": 3})
        p.init_transactions(10)
        p.begin_transaction()
        p.produce("rt", b"x")
        meta = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "txg", "log_level": 3})
        p.send_offsets_to_transaction([TopicPartition("rt", 0, 7)], meta.consumer_group_metadata(), 10)
        assert _fetch(b.bootstrap, "txg", True) == (-1, UNSTABLE_OFFSET_COMMIT)  # while pending
        # and one committed transaction with offsets
        p2 = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "rt-tx2", "log_level": 3})
        p2.init_transactions(10)
        p2.begin_transaction()
        p2.send_offsets_to_transaction([TopicPartition("rt", 0, 5)], meta.consumer_group_metadata(), 10)
        p2.commit_transaction(10)
        b.restart()  # SIGKILL + start on the same data dir
        assert _fetch(b.bootstrap, "plain", False) == (42, 0)
        assert _fetch(b.bootstrap, "txg", False) == (5, 0)  # rt-tx2's committed offsets
        assert _fetch(b.bootstrap, "txg", True)[1] == UNSTABLE_OFFSET_COMMIT  # rt-tx's are still pending
        # the successor of rt-tx aborts it: the pending offsets are dropped, the committed ones stay
        p3 = Producer({"bootstrap.servers": b.bootstrap, "transactional.id": "rt-tx", "log_level": 3})
        p3.init_transactions(10)
        assert _fetch(b.bootstrap, "txg", True) == (5, 0)
        meta.close()
    finally:
        b.kill()


def test_group_generation_survives_restart(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", "--group-initial-rebalance-delay-ms", "0",
                       log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "gen", 2)
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "keep", "session.timeout.ms": 10000,
                      "enable.auto.commit": False, "log_level": 3})
        c.subscribe(["gen"])
        import time

        deadline = time.monotonic() + 20
        while not c.assignment() and time.monotonic() < deadline:
            c.poll(0.1)
        assert c.assignment()
        b.restart()
        with RawClient(b.bootstrap) as client:
            desc = client.request(15, (0, 5), {"groups": ["keep"], "include_authorized_operations": False})
        g = desc.groups[0]
        assert g.group_state == "Stable" and len(g.members) == 1 and g.protocol_data == "range"
        # the member keeps working with its generation: commits are accepted after the restart
        c.commit(offsets=[TopicPartition("gen", 0, 1)], asynchronous=False)
        c.close()
    finally:
        b.kill()


def test_deleted_group_stays_deleted_after_restart(tmp_path: Path) -> None:
    from confluent_kafka.admin import AdminClient

    b = oncelog_broker(tmp_path / "d", log_path=tmp_path / "broker.log").start()
    try:
        create_topic(b.bootstrap, "rt")
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "gone", "enable.auto.commit": False,
                      "log_level": 3})
        c.commit(offsets=[TopicPartition("rt", 0, 9)], asynchronous=False)
        c.close()
        assert _fetch(b.bootstrap, "gone", False) == (9, 0)
        admin = AdminClient({"bootstrap.servers": b.bootstrap})
        admin.delete_consumer_groups(["gone"], request_timeout=10)["gone"].result()
        assert _fetch(b.bootstrap, "gone", False) == (-1, 0)
        b.restart()
        assert _fetch(b.bootstrap, "gone", False) == (-1, 0)
        with RawClient(b.bootstrap) as client:
            listed = client.request(16, (0, 4), {"states_filter": []})
        assert "gone" not in [g.group_id for g in listed.groups]
    finally:
        b.kill()

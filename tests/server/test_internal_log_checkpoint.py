"""Internal topics stay bounded: the broker rewrites each one's live state and drops the prefix
(its stand-in for Kafka's compaction of __consumer_offsets and __transaction_state). After many
transactions and commits, the logs are small, and a kill -9 + restart loads the same offsets,
pending transactional offsets and transaction states as before."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import create_topic, oncelog_broker

OFFSET_FETCH = (9, (7, 8))
UNSTABLE_OFFSET_COMMIT = 88
ROUNDS = 120


def _fetch(bootstrap: str, group: str, require_stable: bool = False) -> tuple[int, int]:
    with RawClient(bootstrap) as client:
        resp = client.request(*OFFSET_FETCH, {"groups": [{"group_id": group, "topics": [
            {"name": "ck", "partition_indexes": [0]}]}], "require_stable": require_stable})
    part = resp.groups[0].topics[0].partitions[0]
    return int(part.committed_offset), int(part.error_code)


def _log_bytes(data: Path, partition_dir: str) -> int:
    return sum(p.stat().st_size for p in (data / partition_dir).glob("*.log"))


def _wait_for(predicate, timeout_s: float = 30) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_internal_logs_are_checkpointed_and_reload_the_same_state(tmp_path: Path) -> None:
    cfg = tmp_path / "broker.toml"
    # flush_every_append: an open transaction survives a kill -9 (with background fsync the restart
    # aborts it, tests/storage/test_power_cut.py), so the pending offsets' checkpointing is visible.
    cfg.write_text("internal_log_checkpoint_bytes = 8192\ninternal_log_checkpoint_interval_ms = 100\n"
                   "group_initial_rebalance_delay_ms = 0\nflush_every_append = true\n")
    data = tmp_path / "d"
    log_path = tmp_path / "broker.log"
    b = oncelog_broker(data, "--config", str(cfg), log_path=log_path).start()
    try:
        bs = b.bootstrap
        create_topic(bs, "ck")
        member = Consumer({"bootstrap.servers": bs, "group.id": "members", "session.timeout.ms": 10000,
                           "enable.auto.commit": False, "log_level": 3})
        member.subscribe(["ck"])
        assert _wait_for(lambda: bool(member.poll(0.1) or member.assignment()))
        meta = Consumer({"bootstrap.servers": bs, "group.id": "ckg", "log_level": 3})
        plain = Consumer({"bootstrap.servers": bs, "group.id": "plain", "enable.auto.commit": False,
                          "log_level": 3})
        p = Producer({"bootstrap.servers": bs, "transactional.id": "ck-tx", "log_level": 3})
        p.init_transactions(10)
        for i in range(ROUNDS):
            p.begin_transaction()
            p.produce("ck", b"v%d" % i, partition=0)
            p.send_offsets_to_transaction([TopicPartition("ck", 0, i + 1)], meta.consumer_group_metadata(), 10)
            p.commit_transaction(10)
            plain.commit(offsets=[TopicPartition("ck", 0, 1000 + i)], asynchronous=False)
        plain.close()
        assert _wait_for(lambda: log_path.read_text().count("checkpointed") >= 2), log_path.read_text()[-3000:]
        # one transaction left open, with offsets pending in __consumer_offsets
        open_meta = Consumer({"bootstrap.servers": bs, "group.id": "ckg2", "log_level": 3})
        po = Producer({"bootstrap.servers": bs, "transactional.id": "ck-open", "log_level": 3})
        po.init_transactions(10)
        po.begin_transaction()
        po.produce("ck", b"undecided", partition=0)
        po.send_offsets_to_transaction([TopicPartition("ck", 0, 77)], open_meta.consumer_group_metadata(), 10)
        po.flush(10)
        assert _fetch(bs, "ckg2", True) == (-1, UNSTABLE_OFFSET_COMMIT)
        time.sleep(0.5)  # let the timer run with the transaction open: the pending offsets must not be cut

        txn_bytes = _log_bytes(data, "__transaction_state-0")
        offsets_bytes = _log_bytes(data, "__consumer_offsets-0")
        # ROUNDS transactions wrote ~4 records each to each log: far more than what is left
        assert txn_bytes < 16_384 and offsets_bytes < 24_576, (txn_bytes, offsets_bytes)
        assert int((data / "__transaction_state-0" / "log-start-offset").read_text()) > 0

        b.restart()  # SIGKILL, then start on the same data dir
        bs = b.bootstrap
        assert _fetch(bs, "plain") == (1000 + ROUNDS - 1, 0)
        with RawClient(bs) as client:  # the group's logged membership came back from the checkpoint
            g = client.request(15, (0, 5), {"groups": ["members"], "include_authorized_operations": False}).groups[0]
        assert g.group_state == "Stable" and len(g.members) == 1, g
        assert _fetch(bs, "ckg") == (ROUNDS, 0)
        assert _fetch(bs, "ckg2", True) == (-1, UNSTABLE_OFFSET_COMMIT), "the open transaction's offsets survive"
        # ck-tx's state survived: its producer id is reused with a bumped epoch, and it still works
        p2 = Producer({"bootstrap.servers": bs, "transactional.id": "ck-tx", "log_level": 3})
        p2.init_transactions(10)
        p2.begin_transaction()
        p2.produce("ck", b"after", partition=0)
        p2.commit_transaction(10)
        # the successor of ck-open aborts the open transaction: its pending offsets are dropped
        po2 = Producer({"bootstrap.servers": bs, "transactional.id": "ck-open", "log_level": 3})
        po2.init_transactions(10)
        assert _fetch(bs, "ckg2", True) == (-1, 0)
        c = Consumer({"bootstrap.servers": bs, "group.id": f"r-{uuid.uuid4()}", "isolation.level": "read_committed",
                      "auto.offset.reset": "earliest", "enable.partition.eof": True, "log_level": 3})
        c.assign([TopicPartition("ck", 0, 0)])
        values: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                break  # partition EOF
            values.append(m.value())
        c.close()
        assert values == [b"v%d" % i for i in range(ROUNDS)] + [b"after"]
        meta.close()
        open_meta.close()
        member.close()
    finally:
        b.kill()

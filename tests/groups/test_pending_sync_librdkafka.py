"""A leader that joins and heartbeats but never sends SyncGroup does not hold a librdkafka follower
out of its partitions: at the group's rebalance timeout the broker removes it (Kafka's pending-sync
expiry) and the follower, told REBALANCE_IN_PROGRESS in its waiting SyncGroup, rejoins, leads alone
and takes every partition. Before, the follower's SyncGroup stayed parked for good. The in-process
tests of the rule are tests/coordinator/test_group_pending_sync.py; this is one real client."""

from __future__ import annotations

import struct
import time
from pathlib import Path

from confluent_kafka import Consumer

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import create_topic, oncelog_broker

FAST = ["--auto-create-topics", "--group-initial-rebalance-delay-ms", "0"]
TOPIC, GROUP = "pending-sync", "pending-sync-grp"
REBALANCE_MS = 6000
REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID, MEMBER_ID_REQUIRED = 27, 25, 79


def _subscription(topic: str) -> bytes:
    """ConsumerProtocolSubscription v0: version, one topic, no user data."""
    name = topic.encode()
    return struct.pack(">hih", 0, 1, len(name)) + name + struct.pack(">i", -1)


class StuckLeader:
    """A raw JoinGroup / Heartbeat client that never sends SyncGroup."""

    def __init__(self, bootstrap: str) -> None:
        self.client = RawClient(bootstrap)
        self.member_id = ""
        self.generation = -1

    def join(self) -> object:
        resp = self.client.request(11, (5, 5), {
            "group_id": GROUP, "session_timeout": 6000, "rebalance_timeout": REBALANCE_MS,
            "member_id": self.member_id, "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": _subscription(TOPIC)}]})
        if int(resp.error_code) == MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
            return self.join()
        assert int(resp.error_code) == 0, resp
        self.member_id, self.generation = resp.member_id, int(resp.generation_id)
        return resp

    def heartbeat(self) -> int:
        return int(self.client.request(12, (3, 3), {"group_id": GROUP, "generation_id": self.generation,
                                                    "member_id": self.member_id,
                                                    "group_instance_id": None}).error_code)


def test_a_leader_that_never_syncs_is_removed_and_a_librdkafka_follower_takes_over(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", *FAST, log_path=tmp_path / "broker.log").start()
    c: Consumer | None = None
    leader: StuckLeader | None = None
    try:
        create_topic(b.bootstrap, TOPIC, 2)
        leader = StuckLeader(b.bootstrap)
        leader.join()  # generation 1, alone
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": GROUP, "client.id": "follower",
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 300,
                      "max.poll.interval.ms": REBALANCE_MS, "partition.assignment.strategy": "range",
                      "log_level": 3})
        c.subscribe([TOPIC])
        deadline = time.monotonic() + 20
        while leader.heartbeat() != REBALANCE_IN_PROGRESS:  # the follower's JoinGroup is waiting
            assert time.monotonic() < deadline, "the follower never joined"
            c.poll(0.1)
        resp = leader.join()  # completes the join phase at once: the leader of both, generation 2
        completed = time.monotonic()
        assert len(resp.members) == 2, resp  # type: ignore[attr-defined]
        last_heartbeat = 0.0
        while sorted(tp.partition for tp in c.assignment()) != [0, 1]:
            assert time.monotonic() < completed + 20, "the follower never got the partitions"
            c.poll(0.1)
            if time.monotonic() - last_heartbeat > 1 and leader.member_id:
                last_heartbeat = time.monotonic()
                code = leader.heartbeat()
                if code == UNKNOWN_MEMBER_ID:
                    leader.member_id = ""  # removed: a stuck client stops here
                else:
                    assert code == 0, code  # until then its heartbeats are fine, as in Kafka
        took = time.monotonic() - completed
        assert took >= REBALANCE_MS / 1000 - 0.5, f"the follower took over after {took:.1f} s, before the deadline"
        assert not leader.member_id or leader.heartbeat() == UNKNOWN_MEMBER_ID, "the stuck leader is still a member"
    finally:
        if c is not None:
            c.close()
        if leader is not None:
            leader.client.close()
        b.kill()

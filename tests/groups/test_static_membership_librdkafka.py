"""KIP-345 with a real client: librdkafka's test 0102 (do_test_fenced_member_classic), reproduced.

Two consumers with static ids consumer1 and consumer2 share a 3-partition topic; a second process
(here: a second client) starts with group.instance.id consumer2. The broker must hand consumer2's
membership to the newcomer and fence the old instance: librdkafka raises a fatal FENCED_INSTANCE_ID
error on it, and it stops consuming. At no time may two live (not yet fenced) consumers own the
same partition; the only overlap allowed is the old instance's zombie window (it owns what the
newcomer took over until its next heartbeat is answered FENCED_INSTANCE_ID; Kafka has the same window,
which is why offset commits, not fetches, are what the fencing protects). After the fencing the
survivors own every partition and consume every new record; the fenced instance consumes nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from oncelog.admin.raw_client import RawClient
from oncelog.testing.broker_process import create_topic, oncelog_broker

FAST = ["--group-initial-rebalance-delay-ms", "0"]
TOPIC = "static3"


def _consumer(bootstrap: str, instance: str, client: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap, "group.id": "static-grp", "group.instance.id": instance,
                     "client.id": client, "auto.offset.reset": "earliest", "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 300, "enable.auto.commit": False, "log_level": 0})


class Tracked:
    """A consumer, whether it has been fenced (fatal error seen), and the values it consumed."""

    def __init__(self, c: Consumer, name: str) -> None:
        self.c, self.name = c, name
        self.fatal: KafkaError | None = None
        self.values: list[bytes] = []
        self.values_after_fatal: list[bytes] = []
        self.history: list[tuple[float, frozenset[int]]] = []  # (when, partitions owned) at each change

    def poll(self, timeout: float) -> None:
        m = self.c.poll(timeout)
        owned = frozenset(self.owned())
        if not self.history or self.history[-1][1] != owned:
            self.history.append((time.monotonic(), owned))
        if m is None:
            return
        err = m.error()
        if err is not None:
            if err.fatal() or err.code() == KafkaError._FATAL:
                self.fatal = self.fatal or err
            return
        (self.values_after_fatal if self.fatal else self.values).append(m.value())

    def owned(self) -> set[int]:
        if self.fatal is not None:
            return set()
        try:
            return {tp.partition for tp in self.c.assignment()}
        except KafkaException:
            return set()


def _describe(bootstrap: str) -> object:
    with RawClient(bootstrap) as client:
        return client.request(15, (0, 5), {"groups": ["static-grp"], "include_authorized_operations": False}).groups[0]


def _member_ids(bootstrap: str) -> dict[str, str]:
    return {m.group_instance_id: m.member_id for m in _describe(bootstrap).members}  # type: ignore[attr-defined]


def _run(consumers: list[Tracked], until, timeout_s: float, overlaps: list[tuple[float, str, str]]) -> bool:  # type: ignore[no-untyped-def]
    """Poll every consumer round-robin until ``until()``; record (when, a, b) whenever two live
    (not fenced) consumers own a common partition."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for t in consumers:
            t.poll(0.05)
            live = [(x.name, x.owned()) for x in consumers if x.fatal is None]
            for i, (name_i, own_i) in enumerate(live):
                for name_j, own_j in live[i + 1:]:
                    if own_i & own_j:
                        overlaps.append((time.monotonic(), name_i, name_j))
        if until():
            return True
    return False


def test_a_second_instance_with_the_same_group_instance_id_fences_the_first(tmp_path: Path) -> None:
    b = oncelog_broker(tmp_path / "d", *FAST, log_path=tmp_path / "broker.log").start()
    closers: list[Consumer] = []
    try:
        create_topic(b.bootstrap, TOPIC, 3)
        c1 = Tracked(_consumer(b.bootstrap, "consumer1", "consumer1"), "consumer1")
        c2a = Tracked(_consumer(b.bootstrap, "consumer2", "consumer2a"), "consumer2a")
        closers += [c1.c, c2a.c]
        for t in (c1, c2a):
            t.c.subscribe([TOPIC])
        overlaps: list[tuple[float, str, str]] = []
        assert _run([c1, c2a], lambda: bool(c1.owned()) and bool(c2a.owned()), 30, overlaps), \
            "initial assignments"

        old_member = _member_ids(b.bootstrap)["consumer2"]
        c2b = Tracked(_consumer(b.bootstrap, "consumer2", "consumer2b"), "consumer2b")
        closers.append(c2b.c)
        c2b.c.subscribe([TOPIC])
        everyone = [c1, c2a, c2b]
        assert _run(everyone, lambda: bool(c2b.owned()) or c2a.fatal is not None, 15, overlaps), \
            "the new instance got no assignment"
        took_over = time.monotonic()
        assert _run(everyone, lambda: c2a.fatal is not None, 15, overlaps), \
            "the replaced instance consumer2a was never fenced (no fatal error)"
        fenced_after_s = time.monotonic() - took_over
        assert fenced_after_s < 5, f"consumer2a kept its partitions {fenced_after_s:.1f} s after it was replaced"
        assert "FENCED_INSTANCE_ID" in str(c2a.fatal) or "fenced" in str(c2a.fatal).lower(), str(c2a.fatal)
        assert c1.fatal is None and c2b.fatal is None

        # the survivors end up owning every partition between them
        assert _run(everyone, lambda: bool(c1.owned()) and bool(c2b.owned())
                    and c1.owned() | c2b.owned() == {0, 1, 2}, 30, overlaps), \
            (c1.owned(), c2b.owned())

        p = Producer({"bootstrap.servers": b.bootstrap, "log_level": 3})
        sent = [b"after-%d" % i for i in range(30)]
        for i, v in enumerate(sent):
            p.produce(TOPIC, v, partition=i % 3)
        p.flush(10)
        assert _run(everyone, lambda: set(sent) <= set(c1.values) | set(c2b.values), 30, overlaps), \
            "the survivors did not consume every new record"
        assert not c2a.values_after_fatal, "the fenced instance kept consuming"
        assert not set(sent) & set(c2a.values), "the fenced instance consumed records produced after it was fenced"
        # c1 never shares a partition with anyone; consumer2a and consumer2b only in the zombie window
        bad = [o for o in overlaps if {o[1], o[2]} != {"consumer2a", "consumer2b"} or o[0] < took_over - 0.1]
        assert not bad, bad[:5]
        # the fenced instance can commit nothing any more
        try:
            c2a.c.commit(offsets=[TopicPartition(TOPIC, 0, 1)], asynchronous=False)
        except KafkaException as exc:
            assert exc.args[0].fatal() or exc.args[0].code() == KafkaError._FATAL, exc
        else:
            raise AssertionError("a fenced consumer committed offsets")
        with RawClient(b.bootstrap) as client:
            desc = client.request(15, (0, 5), {"groups": ["static-grp"], "include_authorized_operations": False})
        members = desc.groups[0].members
        assert sorted(m.group_instance_id for m in members) == ["consumer1", "consumer2"]
        assert {m.client_id for m in members} == {"consumer1", "consumer2b"}
        # kill -9 of the broker: the replacement was persisted, the old member id stays fenced (the
        # instance is checked before the generation, so any generation will do)
        b.restart()
        with RawClient(b.bootstrap) as client:
            hb = client.request(12, (3, 4), {"group_id": "static-grp", "generation_id": 1,
                                             "member_id": old_member, "group_instance_id": "consumer2"})
        assert int(hb.error_code) == 82, hb  # FENCED_INSTANCE_ID
        more = [b"restarted-%d" % i for i in range(9)]
        p = Producer({"bootstrap.servers": b.bootstrap, "log_level": 3})
        for i, v in enumerate(more):
            p.produce(TOPIC, v, partition=i % 3)
        p.flush(10)
        assert _run(everyone, lambda: set(more) <= set(c1.values) | set(c2b.values), 30, overlaps), \
            "the survivors did not resume after the broker restart"
        assert not set(more) & set(c2a.values + c2a.values_after_fatal)
    finally:
        for c in closers:
            try:
                c.close()
            except KafkaException:
                pass
        b.kill()


def test_a_restarted_static_member_gets_its_partitions_back_without_a_rebalance(tmp_path: Path) -> None:
    """0102's "consumer restart": a static member closes (librdkafka sends no LeaveGroup for it) and
    a new process with the same instance id comes back within the session timeout; it gets the same
    partitions in the same generation, and the other member is never revoked."""
    b = oncelog_broker(tmp_path / "d", *FAST, log_path=tmp_path / "broker.log").start()
    c1 = Tracked(_consumer(b.bootstrap, "consumer1", "consumer1"), "consumer1")
    first = Tracked(_consumer(b.bootstrap, "consumer2", "consumer2a"), "consumer2a")
    second: Tracked | None = None
    try:
        create_topic(b.bootstrap, TOPIC, 3)
        for t in (c1, first):
            t.c.subscribe([TOPIC])
        overlaps: list[tuple[float, str, str]] = []
        assert _run([c1, first], lambda: bool(c1.owned()) and bool(first.owned()), 30, overlaps)
        assert _run([c1, first], lambda: len(c1.owned() | first.owned()) == 3, 30, overlaps)
        mine, theirs = first.owned(), c1.owned()
        before = {m.group_instance_id: m.member_id for m in _describe(b.bootstrap).members}  # type: ignore[attr-defined]
        first.c.close()
        started = time.monotonic()
        second = Tracked(_consumer(b.bootstrap, "consumer2", "consumer2b"), "consumer2b")
        second.c.subscribe([TOPIC])
        assert _run([c1, second], lambda: second.owned() == mine, 15, overlaps), (second.owned(), mine)
        assert time.monotonic() - started < 6, "took the session timeout: the broker rebalanced instead"
        assert c1.fatal is None
        assert [owned for when, owned in c1.history if when >= started] in ([], [theirs]), c1.history
        assert c1.owned() == theirs
        after = {m.group_instance_id: m.member_id for m in _describe(b.bootstrap).members}  # type: ignore[attr-defined]
        assert after["consumer1"] == before["consumer1"] and after["consumer2"] != before["consumer2"]
        assert not overlaps, overlaps[:5]
    finally:
        for t in (c1, second):
            if t is not None:
                try:
                    t.c.close()
                except KafkaException:
                    pass
        b.kill()

"""The admin and config requests checked as Kafka checks them (in process, through the broker's
request path):

- a broker config that may hold a secret (type PASSWORD or unknown) is never described nor logged
  in clear (Kafka's maybeSensitive / loggableValue);
- a dynamic broker config changed while CreateTopics builds a topic reaches that topic;
- Kafka's non-dynamic broker log configs (log.retention.hours, ...) are refused, not kept unused;
- CreateTopics / CreatePartitions: duplicate names, manual assignments, ``__cluster_metadata``;
- DescribeConfigs: an empty key list is every key; invalid topic names are INVALID_TOPIC_EXCEPTION;
- values are stored as Kafka parses them;
- cleanup.policy is Kafka's ValidList: an empty list (a log that keeps everything) and a repeated
  policy are valid.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.fsync_gate import FsyncGate
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
DYNAMIC_BROKER = 2
SECRET = "hunter2-s3cret"


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    yield broker
    broker.close()


def incremental(b: InProcessBroker, rtype: int, name: str, ops: list[tuple[str, int, str | None]]
                ) -> tuple[ErrorCode, str | None]:
    r = b.call(44, 1, {"resources": [{"resource_type": rtype, "resource_name": name, "configs": [
        {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}], "validate_only": False})
    return r.responses[0].error_code, r.responses[0].error_message


def legacy(b: InProcessBroker, rtype: int, name: str, configs: dict[str, str]) -> ErrorCode:
    r = b.call(33, 2, {"resources": [{"resource_type": rtype, "resource_name": name, "configs": [
        {"name": n, "value": v} for n, v in configs.items()]}], "validate_only": False})
    return r.responses[0].error_code


def describe(b: InProcessBroker, rtype: int, name: str, keys: list[str] | None = None, version: int = 4) -> Any:
    r = b.call(32, version, {"resources": [{"resource_type": rtype, "resource_name": name,
                                            "configuration_keys": keys}],
                             "include_synonyms": True, "include_documentation": False})
    return r.results[0]


def topic(name: str, n: int = 1, rf: int = 1, assignments: list[tuple[int, list[int]]] | None = None,
          configs: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "num_partitions": n, "replication_factor": rf,
            "assignments": [{"partition_index": i, "broker_ids": ids} for i, ids in assignments or []],
            "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()]}


def create_topics(b: InProcessBroker, *topics: dict[str, Any], validate_only: bool = False) -> list[Any]:
    return list(b.call(19, 7, {"topics": list(topics), "timeout": 5000, "validate_only": validate_only}).topics)


def create_partitions(b: InProcessBroker, *topics: tuple[str, int, list[list[int]] | None],
                      validate_only: bool = False) -> list[tuple[str, ErrorCode, str | None]]:
    r = b.call(37, 3, {"topics": [{"name": n, "count": c, "assignments": None if a is None else
                                   [{"broker_ids": ids} for ids in a]} for n, c, a in topics],
                       "timeout": 5000, "validate_only": validate_only})
    return [(x.name, x.error_code, x.error_message) for x in r.results]


# --- secrets ----------------------------------------------------------------------------------------
def test_broker_configs_that_may_hold_secrets_are_described_and_logged_hidden(
        b: InProcessBroker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="oncelog.server")
    password = "listener.name.external.ssl.keystore.password"
    jaas = "listener.name.external.plain.sasl.jaas.config"
    jaas_value = f'org.apache.kafka.common.security.plain.PlainLoginModule required username="a" password="{SECRET}";'
    assert incremental(b, BROKER, "1", [(password, SET, SECRET), (jaas, SET, jaas_value)])[0] == 0
    assert incremental(b, BROKER, "", [(password, SET, SECRET)])[0] == 0
    assert legacy(b, BROKER, "1", {password: SECRET, jaas: jaas_value, "log.retention.ms": "5000"}) == 0
    for name in ("1", ""):
        res = describe(b, BROKER, name)
        assert res.error_code == 0
        got = {c.name: c for c in res.configs}
        assert got[password].is_sensitive and got[password].value is None
        assert got[password].synonyms and all(s.value is None for s in got[password].synonyms)
        if name == "1":
            assert got[password].config_source == DYNAMIC_BROKER
            assert got[jaas].is_sensitive and got[jaas].value is None
            # a config whose type is known is still shown
            assert not got["log.retention.ms"].is_sensitive and got["log.retention.ms"].value == "5000"
        assert SECRET not in repr(res)
    assert SECRET not in caplog.text
    assert "[hidden]" in caplog.text and "5000" in caplog.text


# --- a broker config changed while a topic is built ------------------------------------------------------
BIG = "big_t"


@pytest.fixture
def gate() -> Iterator[FsyncGate]:
    g = FsyncGate()
    yield g
    g.close()


def test_a_broker_config_changed_while_a_topic_is_built_reaches_it(b: InProcessBroker, gate: FsyncGate) -> None:
    gate.hold(f"/{BIG}-")
    started = b.start(19, 7, {"topics": [topic(BIG, 4)], "timeout": 30_000, "validate_only": False})
    b.run_until(gate.reached.is_set)  # the partitions are being built on a worker thread
    assert incremental(b, BROKER, "", [("message.max.bytes", SET, "200")])[0] == 0
    gate.release()
    assert b.finish(started).topics[0].error_code == 0
    for p in range(4):
        plog = b.broker.logs.get_partition(BIG, p)
        assert plog is not None and plog.config.max_message_bytes == 200
    assert b.produce(BIG, 0, batch(size=1000)) == ErrorCode.message_too_large.value


def test_a_topic_whose_overrides_a_change_made_meanwhile_invalidates_is_not_made(
        b: InProcessBroker, gate: FsyncGate) -> None:
    gate.hold(f"/{BIG}-")
    started = b.start(19, 7, {"topics": [topic(BIG, 2, configs={"min.compaction.lag.ms": "1000"})],
                              "timeout": 30_000, "validate_only": False})
    b.run_until(gate.reached.is_set)
    assert incremental(b, BROKER, "", [("log.cleaner.max.compaction.lag.ms", SET, "500")])[0] == 0
    gate.release()
    t = b.finish(started).topics[0]
    assert t.error_code == ErrorCode.invalid_config and "min.compaction.lag.ms" in (t.error_message or "")
    assert BIG not in b.broker.logs.topics() and not b.broker.logs.is_being_created(BIG)
    assert not any(d.name.startswith(f"{BIG}-") for d in b.data_dir.iterdir())
    assert create_topics(b, topic(BIG, 2))[0].error_code == 0  # the name is free


# --- non-dynamic broker configs -----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["log.retention.hours", "log.retention.minutes", "log.roll.hours",
                                  "log.roll.jitter.hours", "log.flush.scheduler.interval.ms",
                                  "log.message.format.version"])
def test_kafkas_non_dynamic_log_configs_are_refused(b: InProcessBroker, name: str) -> None:
    value = "3.0" if name == "log.message.format.version" else "1"
    for resource in ("", "1"):
        code, msg = incremental(b, BROKER, resource, [(name, SET, value)])
        assert code == ErrorCode.invalid_request and "Cannot update these configs dynamically" in (msg or "")
    assert legacy(b, BROKER, "", {name: value}) == ErrorCode.invalid_request
    assert b.broker.logs.broker_configs.cluster == {} and b.broker.logs.broker_configs.node == {}


def test_the_dynamic_synonyms_still_apply(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert incremental(b, BROKER, "", [("log.retention.ms", SET, "3600000"), ("log.roll.ms", SET, "60000")])[0] == 0
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and (plog.config.retention_ms, plog.config.segment_ms) == (3600000, 60000)
    got = {c.name: c for c in describe(b, BROKER, "1").configs}
    assert got["log.message.format.version"].read_only and not got["log.retention.ms"].read_only


def test_a_non_dynamic_config_stored_by_an_older_version_can_be_left_or_deleted(b: InProcessBroker) -> None:
    b.broker.close()
    (b.data_dir / "__meta" / "broker-configs.json").write_text(
        json.dumps({"node": {}, "cluster": {"log.retention.hours": "1"}}))
    b.broker = b._open()
    assert incremental(b, BROKER, "", [("log.retention.bytes", SET, "1000")])[0] == 0  # left as it is
    assert incremental(b, BROKER, "", [("log.retention.hours", SET, "2")])[0] == ErrorCode.invalid_request
    assert incremental(b, BROKER, "", [("log.retention.hours", DELETE, None)])[0] == 0
    assert dict(b.broker.logs.broker_configs.cluster) == {"log.retention.bytes": "1000"}


# --- CreateTopics / CreatePartitions --------------------------------------------------------------------
def test_create_topics_duplicate_names_are_refused_and_nothing_is_made(b: InProcessBroker) -> None:
    got = create_topics(b, topic("h"), topic("ok"), topic("h", 2))
    assert [(t.name, t.error_code, t.error_message) for t in got] == [
        ("h", ErrorCode.invalid_request, "Duplicate topic name."), ("ok", ErrorCode.none, None)]
    assert "h" not in b.broker.logs.topics() and "ok" in b.broker.logs.topics()


def test_create_topics_refuses_the_cluster_metadata_topic(b: InProcessBroker) -> None:
    for validate_only in (True, False):
        t = create_topics(b, topic("__cluster_metadata"), validate_only=validate_only)[0]
        assert t.error_code == ErrorCode.invalid_request and "prohibited" in (t.error_message or "")
    assert "__cluster_metadata" not in b.broker.logs.topics()
    # nor does a Metadata request or a produce auto-create it
    r = b.call(3, 12, {"topics": [{"name": "__cluster_metadata", "topic_id": None}],
                       "allow_auto_topic_creation": True, "include_topic_authorized_operations": False})
    assert r.topics[0].error_code == ErrorCode.unknown_topic_or_partition
    assert b.produce("__cluster_metadata", 0, batch()) == ErrorCode.unknown_topic_or_partition.value
    assert "__cluster_metadata" not in b.broker.logs.topics()


@pytest.mark.parametrize(("n", "rf", "assignments", "code", "words"), [
    (3, -1, [(0, [1])], ErrorCode.invalid_request, "numPartitions was not set to -1"),
    (-1, 1, [(0, [1])], ErrorCode.invalid_request, "replication factor was not set to -1"),
    (-1, -1, [(0, [1]), (5, [1])], ErrorCode.invalid_replica_assignment, "consecutive 0-based"),
    (-1, -1, [(1, [1])], ErrorCode.invalid_replica_assignment, "consecutive 0-based"),
    (-1, -1, [(0, [1]), (0, [1])], ErrorCode.invalid_replica_assignment, "multiple manual partition assignments"),
    (-1, -1, [(0, [2])], ErrorCode.invalid_replica_assignment, "broker 2, but no such broker"),
    (-1, -1, [(0, [1, 1])], ErrorCode.invalid_replica_assignment, "more than once"),
    (-1, -1, [(0, [])], ErrorCode.invalid_replica_assignment, "empty replica list"),
])
def test_create_topics_manual_assignments_are_checked(
        b: InProcessBroker, n: int, rf: int, assignments: list[tuple[int, list[int]]], code: ErrorCode,
        words: str) -> None:
    for validate_only in (True, False):
        t = create_topics(b, topic("a", n, rf, assignments), validate_only=validate_only)[0]
        assert t.error_code == code and words in (t.error_message or ""), t.error_message
    assert "a" not in b.broker.logs.topics()


def test_create_topics_with_a_good_manual_assignment(b: InProcessBroker) -> None:
    t = create_topics(b, topic("a", -1, -1, [(1, [1]), (0, [1]), (2, [1])]))[0]
    assert t.error_code == 0 and t.num_partitions == 3
    assert b.broker.logs.topics()["a"].num_partitions == 3


def test_create_partitions_checks_duplicates_and_assignments(b: InProcessBroker) -> None:
    b.create_topic("a", 2)
    b.create_topic("c", 1)
    assert create_partitions(b, ("a", 4, None), ("c", 2, None), ("a", 5, None)) == [
        ("a", ErrorCode.invalid_request, "Duplicate topic name."), ("c", ErrorCode.none, None)]
    assert b.broker.logs.topics()["a"].num_partitions == 2
    (_, code, msg), = create_partitions(b, ("a", 3, [[2]]))
    assert code == ErrorCode.invalid_replica_assignment and "broker 2" in (msg or "")
    (_, code, msg), = create_partitions(b, ("a", 5, [[1]]))
    assert code == ErrorCode.invalid_replica_assignment and "add 3 additional partition(s), but only 1" in (msg or "")
    (_, code, msg), = create_partitions(b, ("a", 3, [[1, 1]]), validate_only=True)
    assert code == ErrorCode.invalid_replica_assignment and "more than once" in (msg or "")
    (_, code, msg), = create_partitions(b, ("a", 2, None))
    assert code == ErrorCode.invalid_partitions and "already has 2" in (msg or "")
    assert b.broker.logs.topics()["a"].num_partitions == 2
    assert create_partitions(b, ("a", 4, [[1], [1]])) == [("a", ErrorCode.none, None)]
    assert b.broker.logs.topics()["a"].num_partitions == 4


# --- DescribeConfigs / AlterConfigs ---------------------------------------------------------------------
def test_describe_configs_with_an_empty_key_list_describes_every_config(b: InProcessBroker) -> None:
    b.create_topic("t")
    every = describe(b, TOPIC, "t", None).configs
    assert len(every) > 30
    assert len(describe(b, TOPIC, "t", []).configs) == len(every)
    assert len(describe(b, BROKER, "1", []).configs) == len(describe(b, BROKER, "1", None).configs)
    assert [c.name for c in describe(b, TOPIC, "t", ["retention.ms"]).configs] == ["retention.ms"]


@pytest.mark.parametrize("name", ["a/b", "..", "x" * 250, "x y"])
def test_invalid_topic_names_are_invalid_topic_exception(b: InProcessBroker, name: str) -> None:
    assert describe(b, TOPIC, name).error_code == ErrorCode.invalid_topic_exception
    assert incremental(b, TOPIC, name, [("retention.ms", SET, "1")])[0] == ErrorCode.invalid_topic_exception
    assert legacy(b, TOPIC, name, {"retention.ms": "1"}) == ErrorCode.invalid_topic_exception
    r = b.call(3, 12, {"topics": [{"name": name, "topic_id": None}], "allow_auto_topic_creation": False,
                       "include_topic_authorized_operations": False})
    assert r.topics[0].error_code == ErrorCode.invalid_topic_exception


def test_the_empty_topic_name(b: InProcessBroker) -> None:
    assert describe(b, TOPIC, "").error_code == ErrorCode.invalid_topic_exception
    code, msg = incremental(b, TOPIC, "", [("retention.ms", SET, "1")])
    assert code == ErrorCode.invalid_request and "Default topic resources" in (msg or "")
    # a missing topic whose name is valid is still unknown
    assert describe(b, TOPIC, "missing").error_code == ErrorCode.unknown_topic_or_partition


def test_values_are_stored_as_kafka_parses_them(b: InProcessBroker) -> None:
    t = create_topics(b, topic("ws", configs={"retention.ms": " 1000 ", "compression.type": " gzip ",
                                              "preallocate": "TRUE", "cleanup.policy": "compact , delete"}))[0]
    assert t.error_code == 0
    created = {c.name: c.value for c in t.configs}
    got = {c.name: c.value for c in describe(b, TOPIC, "ws").configs}
    for shown in (created, got):
        assert (shown["retention.ms"], shown["compression.type"], shown["preallocate"], shown["cleanup.policy"]) \
            == ("1000", "gzip", "true", "compact,delete")
    assert incremental(b, TOPIC, "ws", [("segment.ms", SET, " +60000")])[0] == 0
    assert b.broker.logs.topics()["ws"].configs["segment.ms"] == "60000"
    assert incremental(b, BROKER, "1", [("log.retention.bytes", SET, " 5000 ")])[0] == 0
    assert b.broker.logs.broker_configs.node["log.retention.bytes"] == "5000"


# --- cleanup.policy ------------------------------------------------------------------------------------
def test_cleanup_policy_is_kafkas_valid_list(b: InProcessBroker) -> None:
    got = create_topics(b, topic("empty", configs={"cleanup.policy": ""}),
                        topic("twice", configs={"cleanup.policy": "compact,compact"}))
    assert [t.error_code for t in got] == [0, 0]
    twice = b.broker.logs.get_partition("twice", 0)
    assert twice is not None and twice.config.compact and not twice.config.delete
    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("cleanup.policy", SUBTRACT, "delete")])[0] == 0
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and not plog.config.compact and not plog.config.delete
    assert {c.name: c.value for c in describe(b, TOPIC, "t").configs}["cleanup.policy"] == ""
    code, msg = incremental(b, TOPIC, "t", [("cleanup.policy", SET, "compact,")])
    assert code == ErrorCode.invalid_config and "compact, delete" in (msg or "")


def test_a_log_with_no_cleanup_policy_keeps_everything(b: InProcessBroker) -> None:
    assert create_topics(b, topic("keep", configs={"cleanup.policy": "", "retention.ms": "1000",
                                                   "retention.bytes": "100", "segment.bytes": "1000"}))[0] \
        .error_code == 0
    now = b.clock.now_ms()
    for i in range(6):
        assert b.produce("keep", 0, batch(1, ts=now, value=b"v%d" % i, size=600)) == 0
    plog = b.broker.logs.get_partition("keep", 0)
    assert plog is not None and len(plog.segments) == 6
    b.clock.advance(3_600_000)
    b.broker._retention()
    assert len(plog.segments) == 6 and plog.log_start_offset == 0  # no retention by time or size
    assert plog not in b.broker.logs.compacted_logs()  # and no compaction
    r = b.call(21, 2, {"topics": [{"name": "keep", "partitions": [{"partition_index": 0, "offset": 3}]}],
                       "timeout_ms": 5000})
    assert r.topics[0].partitions[0].error_code == ErrorCode.policy_violation  # as Kafka: delete is not a policy
    assert len(b.visible_values("keep", 0)) == 6

"""CreateTopics configs, DescribeConfigs, AlterConfigs and IncrementalAlterConfigs through the
broker's request path (in process): Kafka's validation rules and error codes, persistence across a
restart, and every honoured config taking effect on a running partition without a restart."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.protocol import records as rb
from oncelog.security.acl import AclBinding, Operation, PatternType, Permission, ResourceType
from oncelog.storage.config import INT64_MAX, TOPIC_CONFIG_SPECS, LogConfig, field_default
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
DYNAMIC_TOPIC, DYNAMIC_BROKER, DYNAMIC_DEFAULT, STATIC, DEFAULT = 1, 2, 3, 4, 5

# Kafka's topic configs (LogConfig, 3.x and 4.x), each with a valid value that is not its default.
VALID = {
    "cleanup.policy": "compact,delete", "delete.retention.ms": "1000", "min.cleanable.dirty.ratio": "0.25",
    "min.compaction.lag.ms": "10", "max.compaction.lag.ms": "100000", "compression.type": "lz4",
    "compression.gzip.level": "5",
    "compression.lz4.level": "12", "compression.zstd.level": "-5", "file.delete.delay.ms": "1000",
    "flush.messages": "100000", "flush.ms": "5000", "follower.replication.throttled.replicas": "0:1,1:1",
    "index.interval.bytes": "1024", "leader.replication.throttled.replicas": "*", "local.retention.bytes": "-2",
    "local.retention.ms": "1000", "max.message.bytes": "2000000", "message.downconversion.enable": "false",
    "message.format.version": "2.8", "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "86400000", "message.timestamp.difference.max.ms": "1000",
    "message.timestamp.type": "LogAppendTime", "min.insync.replicas": "1", "preallocate": "true",
    "remote.log.copy.disable": "true", "remote.log.delete.on.disable": "true", "remote.storage.enable": "false",
    "retention.bytes": "1000000", "retention.ms": "-1", "segment.bytes": "1048576", "segment.index.bytes": "4096",
    "segment.jitter.ms": "10", "segment.ms": "3600000", "unclean.leader.election.enable": "true",
}

INVALID = [  # (name, value, words of the message)
    ("segment.bytes", "abc", "Not a number of type INT"),
    ("segment.bytes", "13", "at least 14"),
    ("segment.bytes", "3000000000", "Not a number of type INT"),
    ("segment.ms", "0", "at least 1"),
    ("retention.ms", "-2", "at least -1"),
    ("max.message.bytes", "-1", "at least 0"),
    ("flush.messages", "1.5", "Not a number of type LONG"),
    ("preallocate", "yes", "true or false"),
    ("message.timestamp.type", "createtime", "CreateTime, LogAppendTime"),
    ("compression.type", "brotli", "String must be one of"),
    ("compression.gzip.level", "10", "between 1 and 9"),
    ("compression.zstd.level", "23", "no more than 22"),
    ("min.insync.replicas", "0", "at least 1"),
    ("local.retention.ms", "-3", "at least -2"),
    ("leader.replication.throttled.replicas", "0:1,*", "literal '*'"),
    ("message.format.version", "banana", "not a valid version"),
    ("remote.storage.enable", "true", "Tiered Storage"),
    ("cleanup.policy", "compact,shred", "String must be one of: compact, delete"),
    ("cleanup.policy", "compact,", "String must be one of: compact, delete"),
    ("min.cleanable.dirty.ratio", "1.5", "no more than 1"),
    ("delete.retention.ms", "-1", "at least 0"),
    ("max.compaction.lag.ms", "0", "at least 1"),
    ("dummy.doesntexist", "x", "Unknown topic config name"),
]


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    yield broker
    broker.close()


def create(b: InProcessBroker, name: str, configs: dict[str, Any], validate_only: bool = False,
           version: int = 7) -> Any:
    r = b.call(19, version, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1,
                                         "assignments": [], "configs": [{"name": k, "value": v}
                                                                        for k, v in configs.items()]}],
                             "timeout": 5000, "validate_only": validate_only})
    return r.topics[0]


def describe(b: InProcessBroker, rtype: int, name: str, keys: list[str] | None = None, *, synonyms: bool = True,
             docs: bool = False, principal: str | None = None) -> Any:
    r = b.call(32, 4, {"resources": [{"resource_type": rtype, "resource_name": name, "configuration_keys": keys}],
                       "include_synonyms": synonyms, "include_documentation": docs}, principal=principal)
    return r.results[0]


def configs_of(b: InProcessBroker, name: str, rtype: int = TOPIC) -> dict[str, Any]:
    res = describe(b, rtype, name)
    assert res.error_code == ErrorCode.none, res.error_message
    return {c.name: c for c in res.configs}


def incremental(b: InProcessBroker, rtype: int, name: str, ops: list[tuple[str, int, str | None]],
                validate_only: bool = False, principal: str | None = None) -> tuple[ErrorCode, str | None]:
    r = b.call(44, 1, {"resources": [{"resource_type": rtype, "resource_name": name, "configs": [
        {"name": n, "config_operation": op, "value": v} for n, op, v in ops]}], "validate_only": validate_only},
        principal=principal)
    return r.responses[0].error_code, r.responses[0].error_message


def legacy(b: InProcessBroker, rtype: int, name: str, configs: dict[str, str | None],
           validate_only: bool = False) -> tuple[ErrorCode, str | None]:
    r = b.call(33, 2, {"resources": [{"resource_type": rtype, "resource_name": name, "configs": [
        {"name": n, "value": v} for n, v in configs.items()]}], "validate_only": validate_only})
    return r.responses[0].error_code, r.responses[0].error_message


def plog(b: InProcessBroker, topic: str) -> Any:
    p = b.broker.logs.get_partition(topic, 0)
    assert p is not None
    return p


# --- the table ------------------------------------------------------------------------------------------
def test_the_table_knows_every_kafka_topic_config_and_defaults_match_the_fields() -> None:
    assert set(TOPIC_CONFIG_SPECS) == set(VALID)
    for spec in TOPIC_CONFIG_SPECS.values():
        if spec.field is not None:
            assert spec.field_value(spec.default) == field_default(spec), spec.name
            assert hasattr(LogConfig(), spec.field)


# --- CreateTopics -----------------------------------------------------------------------------------------
def test_create_topics_accepts_every_config_and_describes_it_as_an_override(b: InProcessBroker) -> None:
    t = create(b, "all", VALID)
    assert t.error_code == ErrorCode.none, t.error_message
    # CreateTopics v5+ answers with the new topic's configs.
    assert {c.name: c.value for c in t.configs}["compression.type"] == "lz4"
    got = configs_of(b, "all")
    for name, value in VALID.items():
        assert got[name].value == value, name
        assert got[name].config_source == DYNAMIC_TOPIC, name
    cfg = plog(b, "all").config
    assert (cfg.segment_bytes, cfg.compression_type, cfg.message_timestamp_type) == (1048576, "lz4", "LogAppendTime")


@pytest.mark.parametrize(("name", "value", "words"), INVALID)
def test_create_topics_refuses_bad_names_and_values_with_kafkas_message(
        b: InProcessBroker, name: str, value: str, words: str) -> None:
    for validate_only in (True, False):
        t = create(b, "bad", {name: value}, validate_only=validate_only)
        assert t.error_code == ErrorCode.invalid_config
        assert words in (t.error_message or ""), t.error_message
    assert "bad" not in b.broker.logs.topics()


def test_create_topics_null_value_is_refused(b: InProcessBroker) -> None:
    t = create(b, "n", {"retention.ms": None})
    assert t.error_code == ErrorCode.invalid_config and "Null value" in (t.error_message or "")


# --- DescribeConfigs ------------------------------------------------------------------------------------
def test_describe_shows_defaults_static_and_synonyms(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", log_retention_ms=3_600_000)
    try:
        b.create_topic("t")
        got = configs_of(b, "t")
        assert got["retention.ms"].value == "3600000" and got["retention.ms"].config_source == STATIC
        assert [(s.name, s.source) for s in got["retention.ms"].synonyms] == [
            ("log.retention.ms", STATIC), ("log.retention.ms", DEFAULT)]
        assert got["segment.jitter.ms"].config_source == DEFAULT and got["segment.jitter.ms"].value == "0"
        assert got["remote.storage.enable"].synonyms[0].source == DEFAULT
        res = describe(b, TOPIC, "t", ["retention.ms", "nope"], synonyms=False, docs=True)
        assert [c.name for c in res.configs] == ["retention.ms"]
        assert res.configs[0].synonyms == () and res.configs[0].documentation
        assert res.configs[0].config_type == 5  # LONG
        assert describe(b, TOPIC, "missing").error_code == ErrorCode.unknown_topic_or_partition
        assert describe(b, BROKER, "7").error_code == ErrorCode.invalid_request
        assert describe(b, BROKER, "x").error_code == ErrorCode.invalid_request
        broker_cfgs = configs_of(b, "1", BROKER)
        assert broker_cfgs["log.retention.ms"].config_source == STATIC
        assert broker_cfgs["broker.id"].read_only and not broker_cfgs["log.retention.ms"].read_only
    finally:
        b.close()


# --- IncrementalAlterConfigs / AlterConfigs on topics -----------------------------------------------
def test_incremental_set_delete_append_subtract(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("retention.ms", SET, "1000"), ("segment.bytes", SET, "100000")])[0] == 0
    assert plog(b, "t").config.retention_ms == 1000
    assert incremental(b, TOPIC, "t", [("retention.ms", DELETE, None)])[0] == 0
    got = configs_of(b, "t")
    assert got["retention.ms"].config_source == DEFAULT and got["segment.bytes"].value == "100000"
    assert plog(b, "t").config.retention_ms == LogConfig().retention_ms
    # DELETE of a name that is not set, even an unknown one, is a no-op (Kafka).
    assert incremental(b, TOPIC, "t", [("no.such.config", DELETE, None)])[0] == 0
    # APPEND/SUBTRACT: only LIST configs; APPEND skips duplicates; both start from the default.
    code, msg = incremental(b, TOPIC, "t", [("retention.ms", APPEND, "5")])
    assert code == ErrorCode.invalid_config and "not LIST" in (msg or "")
    assert incremental(b, TOPIC, "t", [("leader.replication.throttled.replicas", APPEND, "0:1,1:1")])[0] == 0
    assert incremental(b, TOPIC, "t", [("leader.replication.throttled.replicas", APPEND, "1:1,2:1")])[0] == 0
    assert configs_of(b, "t")["leader.replication.throttled.replicas"].value == "0:1,1:1,2:1"
    assert incremental(b, TOPIC, "t", [("leader.replication.throttled.replicas", SUBTRACT, "1:1")])[0] == 0
    assert configs_of(b, "t")["leader.replication.throttled.replicas"].value == "0:1,2:1"
    code, msg = incremental(b, TOPIC, "t", [("leader.replication.throttled.replicas", APPEND, "*")])
    assert code == ErrorCode.invalid_config
    # cleanup.policy is a LIST: APPEND compact makes it compact,delete (the log cleaner takes it up
    # live); APPEND of a policy that does not exist is validated by its rule.
    assert incremental(b, TOPIC, "t", [("cleanup.policy", APPEND, "compact")])[0] == 0
    assert configs_of(b, "t")["cleanup.policy"].value == "delete,compact"
    assert plog(b, "t").config.compact and plog(b, "t").config.delete
    code, msg = incremental(b, TOPIC, "t", [("cleanup.policy", APPEND, "shred")])
    assert code == ErrorCode.invalid_config and "compact, delete" in (msg or "")
    code, msg = incremental(b, TOPIC, "t", [("min.compaction.lag.ms", SET, "10"), ("max.compaction.lag.ms", SET, "5")])
    assert code == ErrorCode.invalid_config and "min.compaction.lag.ms" in (msg or "")
    code, msg = incremental(b, TOPIC, "t", [("nope", APPEND, "x")])
    assert code == ErrorCode.invalid_config and "Unknown topic config name" in (msg or "")


def test_bad_requests_and_validation_order(b: InProcessBroker) -> None:
    b.create_topic("t")
    code, msg = incremental(b, TOPIC, "t", [("retention.ms", SET, "1"), ("retention.ms", SET, "2")])
    assert code == ErrorCode.invalid_request and "duplicate" in (msg or "")
    code, msg = incremental(b, TOPIC, "t", [("retention.ms", SET, None)])
    assert code == ErrorCode.invalid_request and "Null value" in (msg or "")
    code, _ = incremental(b, TOPIC, "t", [("retention.ms", 7, "1")])
    assert code == ErrorCode.invalid_request
    assert incremental(b, TOPIC, "missing", [("retention.ms", SET, "1")])[0] == ErrorCode.unknown_topic_or_partition
    assert incremental(b, 99, "t", [("retention.ms", SET, "1")])[0] == ErrorCode.invalid_request
    code, msg = incremental(b, TOPIC, "t", [("segment.bytes", SET, "-100")])
    assert code == ErrorCode.invalid_config and "at least 14" in (msg or "")
    r = b.call(44, 1, {"resources": [
        {"resource_type": TOPIC, "resource_name": "t", "configs": [{"name": "retention.ms", "config_operation": 0,
                                                                     "value": "1"}]}] * 2, "validate_only": False})
    assert [x.error_code for x in r.responses] == [ErrorCode.invalid_request] * 2
    assert plog(b, "t").config.retention_ms == LogConfig().retention_ms  # nothing applied


def test_validate_only_changes_nothing(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("retention.ms", SET, "1000")], validate_only=True)[0] == 0
    assert legacy(b, TOPIC, "t", {"retention.ms": "1000"}, validate_only=True)[0] == 0
    assert configs_of(b, "t")["retention.ms"].config_source == DEFAULT
    assert plog(b, "t").config.retention_ms == LogConfig().retention_ms
    assert incremental(b, TOPIC, "t", [("retention.ms", SET, "x")], validate_only=True)[0] == ErrorCode.invalid_config


def test_legacy_alter_configs_replaces_the_whole_set(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert legacy(b, TOPIC, "t", {"retention.ms": "1000", "flush.ms": "12345678"})[0] == 0
    assert legacy(b, TOPIC, "t", {"compression.type": "gzip"})[0] == 0
    got = configs_of(b, "t")
    assert got["compression.type"].value == "gzip"
    assert got["retention.ms"].config_source == DEFAULT and got["flush.ms"].config_source == DEFAULT
    assert legacy(b, TOPIC, "t", {"compression.type": None})[0] == ErrorCode.invalid_request
    assert legacy(b, TOPIC, "t", {"bogus": "1"})[0] == ErrorCode.invalid_config


def test_overrides_and_dynamic_broker_configs_survive_a_restart(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("retention.ms", SET, "1000")])[0] == 0
    assert incremental(b, BROKER, "1", [("log.segment.bytes", SET, "200000")])[0] == 0
    assert incremental(b, BROKER, "", [("log.retention.bytes", SET, "300000")])[0] == 0
    for clean in (False, True):
        b.restart(clean=clean)
        cfg = plog(b, "t").config
        assert (cfg.retention_ms, cfg.segment_bytes, cfg.retention_bytes) == (1000, 200000, 300000)
        got = configs_of(b, "t")
        assert got["segment.bytes"].config_source == DYNAMIC_BROKER
        assert got["retention.bytes"].config_source == DYNAMIC_DEFAULT


def test_internal_topics_may_be_altered(b: InProcessBroker) -> None:
    assert incremental(b, TOPIC, "__consumer_offsets", [("segment.bytes", SET, "1048576")])[0] == 0
    assert plog(b, "__consumer_offsets").config.segment_bytes == 1048576


# --- dynamic broker configs -------------------------------------------------------------------------------
def test_dynamic_broker_configs_default_every_topic_without_an_override(b: InProcessBroker) -> None:
    b.create_topic("plain")
    b.create_topic("own")
    assert incremental(b, TOPIC, "own", [("retention.ms", SET, "5000")])[0] == 0
    assert incremental(b, BROKER, "", [("log.retention.ms", SET, "7000")])[0] == 0
    assert plog(b, "plain").config.retention_ms == 7000 and plog(b, "own").config.retention_ms == 5000
    assert incremental(b, BROKER, "1", [("log.retention.ms", SET, "9000")])[0] == 0
    assert plog(b, "plain").config.retention_ms == 9000
    got = configs_of(b, "plain")["retention.ms"]
    assert (got.value, got.config_source) == ("9000", DYNAMIC_BROKER)
    assert [(s.name, s.value, s.source) for s in got.synonyms] == [
        ("log.retention.ms", "9000", DYNAMIC_BROKER), ("log.retention.ms", "7000", DYNAMIC_DEFAULT),
        ("log.retention.ms", "604800000", DEFAULT)]
    own = configs_of(b, "own")["retention.ms"]
    assert own.config_source == DYNAMIC_TOPIC and own.synonyms[0].source == DYNAMIC_TOPIC
    # the cluster-default resource shows only its dynamic values
    assert {c.name: c.config_source for c in describe(b, BROKER, "").configs} == {"log.retention.ms": DYNAMIC_DEFAULT}
    assert incremental(b, BROKER, "1", [("log.retention.ms", DELETE, None)])[0] == 0
    assert plog(b, "plain").config.retention_ms == 7000
    # a new topic takes the dynamic default too
    b.create_topic("later")
    assert plog(b, "later").config.retention_ms == 7000


def test_broker_config_rules(b: InProcessBroker) -> None:
    code, msg = incremental(b, BROKER, "1", [("auto.create.topics.enable", SET, "false")])
    assert code == ErrorCode.invalid_request and "dynamically" in (msg or "")
    code, msg = incremental(b, BROKER, "1", [("log.retention.ms", SET, "soon")])
    assert code == ErrorCode.invalid_request and "Not a number" in (msg or "")
    assert incremental(b, BROKER, "2", [("log.retention.ms", SET, "1")])[0] == ErrorCode.invalid_request
    assert incremental(b, BROKER, "one", [("log.retention.ms", SET, "1")])[0] == ErrorCode.invalid_request
    # a broker config Kafka knows and we do not act on is kept and described (librdkafka's 0081 sets one)
    assert legacy(b, BROKER, "1", {"sasl.kerberos.min.time.before.relogin": "58000"})[0] == 0
    assert configs_of(b, "1", BROKER)["sasl.kerberos.min.time.before.relogin"].config_source == DYNAMIC_BROKER
    code, msg = incremental(b, BROKER, "1", [("some.list", APPEND, "x")])
    assert code == ErrorCode.invalid_config


def test_alter_configs_needs_alter_configs_permission(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d", authorizer_enabled=True, super_users="User:admin")
    try:
        b.create_topic("t")
        assert b.broker.authorizer is not None
        b.broker.authorizer.create([AclBinding(ResourceType.TOPIC, "t", PatternType.LITERAL, "User:alice", "*",
                                               Operation.ALTER_CONFIGS, Permission.ALLOW)])
        ops = [("retention.ms", SET, "1000")]
        assert incremental(b, TOPIC, "t", ops, principal="User:alice")[0] == 0
        assert incremental(b, TOPIC, "t", ops, principal="User:bob")[0] == ErrorCode.topic_authorization_failed
        assert incremental(b, BROKER, "1", [("log.retention.ms", SET, "1")],
                           principal="User:alice")[0] == ErrorCode.cluster_authorization_failed
        assert incremental(b, BROKER, "1", [("log.retention.ms", SET, "1")], principal="User:admin")[0] == 0
        assert describe(b, TOPIC, "t", principal="User:bob").error_code == ErrorCode.topic_authorization_failed
    finally:
        b.close()


# --- applied live ----------------------------------------------------------------------------------------
def produce(b: InProcessBroker, topic: str, data: bytes, acks: int = -1) -> Any:
    r = b.call(0, 9, {"transactional_id": None, "acks": acks, "timeout": 5000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": data}]}]})
    return r.responses[0].partition_responses[0]


def test_segment_bytes_and_retention_apply_to_a_running_partition(b: InProcessBroker) -> None:
    b.create_topic("t")
    now = b.clock.now_ms()
    for _ in range(5):
        assert produce(b, "t", batch(1, ts=now, size=2000)).error_code == 0
    assert len(plog(b, "t").segments) == 1
    assert incremental(b, TOPIC, "t", [("segment.bytes", SET, "3000")])[0] == 0
    for _ in range(4):
        assert produce(b, "t", batch(1, ts=now, size=2000)).error_code == 0
    assert len(plog(b, "t").segments) == 5  # each new batch rolled
    b.clock.advance(10_000)
    plog(b, "t").apply_retention(b.clock.now_ms())
    assert len(plog(b, "t").segments) == 5  # 7 days
    assert incremental(b, TOPIC, "t", [("retention.ms", SET, "5000")])[0] == 0
    b.broker._retention()  # every segment, the active one too (rolled first), as Kafka's retention
    assert len(plog(b, "t").segments) == 1 and plog(b, "t").log_start_offset == plog(b, "t").log_end_offset == 9


def test_segment_ms_and_index_bytes_roll(b: InProcessBroker) -> None:
    """segment.ms as Kafka's: from the segment's first batch's timestamp to the incoming one's."""
    b.create_topic("t")
    assert produce(b, "t", batch(1, ts=b.clock.now_ms())).error_code == 0
    assert incremental(b, TOPIC, "t", [("segment.ms", SET, "1000")])[0] == 0
    b.clock.advance(999)
    assert produce(b, "t", batch(1, ts=b.clock.now_ms())).error_code == 0
    assert len(plog(b, "t").segments) == 1
    b.clock.advance(1)
    assert produce(b, "t", batch(1, ts=b.clock.now_ms())).error_code == 0
    assert len(plog(b, "t").segments) == 2
    assert incremental(b, TOPIC, "t", [("segment.ms", DELETE, None), ("segment.index.bytes", SET, "4")])[0] == 0
    assert produce(b, "t", batch(1, ts=b.clock.now_ms())).error_code == 0  # an index of 4 bytes: full at once
    assert len(plog(b, "t").segments) == 3


def test_max_message_bytes_lowered_live_refuses_large_batches(b: InProcessBroker) -> None:
    b.create_topic("t")
    big = batch(1, size=5000)
    assert produce(b, "t", big).error_code == 0
    assert incremental(b, TOPIC, "t", [("max.message.bytes", SET, "4000")])[0] == 0
    r = produce(b, "t", big)
    assert r.error_code == ErrorCode.message_too_large
    assert produce(b, "t", batch(1, size=100)).error_code == 0
    assert incremental(b, BROKER, "1", [("message.max.bytes", SET, "100")])[0] == 0
    assert produce(b, "t", batch(1, size=1000)).error_code == 0  # the topic override (4000) wins
    b.create_topic("u")
    assert produce(b, "u", batch(1, size=1000)).error_code == ErrorCode.message_too_large  # broker default


def test_timestamp_type_switched_live(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert produce(b, "t", batch(1, ts=1000)).log_append_time is None  # -1: CreateTime
    assert incremental(b, TOPIC, "t", [("message.timestamp.type", SET, "LogAppendTime")])[0] == 0
    r = produce(b, "t", batch(1, ts=1000))
    assert r.log_append_time is not None and int(r.log_append_time.timestamp() * 1000) == b.clock.now_ms()
    data = b.fetch("t", 0, 1, read_committed=False).records
    header = next(h for _, h in rb.iter_headers(data) if h.base_offset == 1)
    assert header.max_timestamp == b.clock.now_ms() and header.attributes & rb.ATTR_TIMESTAMP_TYPE


def test_flush_messages_and_flush_ms(b: InProcessBroker) -> None:
    b.create_topic("t")
    p = plog(b, "t")
    assert produce(b, "t", batch(3)).error_code == 0
    assert p.synced_end == 0
    assert incremental(b, TOPIC, "t", [("flush.messages", SET, "5")])[0] == 0
    assert produce(b, "t", batch(1)).error_code == 0
    assert p.synced_end == 0
    assert produce(b, "t", batch(1)).error_code == 0
    # 5 unsynced records: fsynced before the answer (the recovery point follows in the background)
    assert p.synced_end == 5 and p.recovery_point == 0
    assert incremental(b, TOPIC, "t", [("flush.ms", SET, "50")])[0] == 0
    assert b.broker._flush_tick_ms() == 50
    assert p.config.flush_interval_ms == 50 and p.config.flush_messages == 5


def test_min_insync_replicas_above_one_refuses_acks_all(b: InProcessBroker) -> None:
    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("min.insync.replicas", SET, "2")])[0] == 0
    assert produce(b, "t", batch(1)).error_code == ErrorCode.not_enough_replicas
    assert produce(b, "t", batch(1), acks=1).error_code == 0


def test_timestamp_limits_refuse_records_out_of_range(b: InProcessBroker) -> None:
    b.create_topic("t")
    now = b.clock.now_ms()
    assert incremental(b, TOPIC, "t", [("message.timestamp.before.max.ms", SET, "60000"),
                                       ("message.timestamp.after.max.ms", SET, "1000")])[0] == 0
    assert produce(b, "t", batch(2, ts=now - 60_000)).error_code == 0
    assert produce(b, "t", batch(2, ts=now - 60_001)).error_code == ErrorCode.invalid_timestamp
    assert produce(b, "t", batch(1, ts=now + 1000)).error_code == 0
    # the second record of this batch is 1 ms too new
    assert produce(b, "t", batch(2, ts=now + 1000)).error_code == ErrorCode.invalid_timestamp
    assert incremental(b, TOPIC, "t", [("message.timestamp.type", SET, "LogAppendTime")])[0] == 0
    assert produce(b, "t", batch(1, ts=0)).error_code == 0  # LogAppendTime: not checked
    # the deprecated difference limit applies while before/after are at their default
    b.create_topic("d")
    assert incremental(b, TOPIC, "d", [("message.timestamp.difference.max.ms", SET, "10")])[0] == 0
    assert plog(b, "d").config.timestamp_before_max_ms == 10
    assert plog(b, "d").config.timestamp_after_max_ms == 10
    assert produce(b, "d", batch(1, ts=now - 11)).error_code == ErrorCode.invalid_timestamp
    assert LogConfig().timestamp_before_max_ms == INT64_MAX


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd", "uncompressed"])
def test_compression_type_recompresses_and_keeps_everything_else(b: InProcessBroker, codec: str) -> None:
    from oncelog.protocol import compression

    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("compression.type", SET, codec)])[0] == 0
    _, pid, epoch = b.init_producer_id(None)
    sent = batch(3, pid=pid, epoch=epoch, seq=0, size=3000)
    if codec == "uncompressed":  # a compressed batch is decompressed
        sent = compression.recompress_batch(sent, rb.read_header(sent), compression.GZIP, None)
    assert produce(b, "t", sent).error_code == 0
    assert produce(b, "t", sent).error_code == 0  # a retry is still recognised as the duplicate
    data = b.fetch("t", 0, 0, read_committed=False).records
    (pos, h), = list(rb.iter_headers(data))
    assert h.attributes & rb.ATTR_COMPRESSION_MASK == compression.BY_NAME[codec]
    rb.validate_batch(data, pos)  # a correct CRC
    orig = rb.read_header(batch(3, pid=pid, epoch=epoch, seq=0, size=3000))
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.records_count, h.max_timestamp) == \
        (orig.producer_id, orig.producer_epoch, orig.base_sequence, orig.records_count, orig.max_timestamp)
    plain = compression.decompress(compression.codec_of(h), memoryview(data)[rb.HEADER_SIZE : h.size])
    assert plain == batch(3, pid=pid, epoch=epoch, seq=0, size=3000)[rb.HEADER_SIZE:]
    if codec != "uncompressed":
        assert h.size < 3000  # it did compress
    else:
        assert b.visible_values("t", 0, read_committed=False) == [b"v" + b"x" * 2999] * 3


def test_recompressed_batch_larger_than_max_message_bytes_is_refused(b: InProcessBroker) -> None:
    from oncelog.protocol import compression

    b.create_topic("t")
    sent = compression.recompress_batch(batch(1, size=20000), rb.read_header(batch(1, size=20000)), compression.ZSTD, 3)
    assert incremental(b, TOPIC, "t", [("compression.type", SET, "uncompressed"),
                                       ("max.message.bytes", SET, "10000")])[0] == 0
    assert len(sent) < 10000
    r = produce(b, "t", sent)
    assert r.error_code == ErrorCode.message_too_large and "recompression" in (r.error_message or "")


def test_stored_configs_this_version_refuses_do_not_stop_the_broker(b: InProcessBroker) -> None:
    import json

    b.create_topic("t")
    assert incremental(b, TOPIC, "t", [("retention.ms", SET, "1000")])[0] == 0
    b.broker.close()
    meta = b.data_dir / "__meta"
    doc = json.loads((meta / "topics.json").read_text())
    for t in doc["topics"]:
        if t["name"] == "t":
            t["configs"]["cleanup.policy"] = "shred"  # e.g. written by a version with another policy
    (meta / "topics.json").write_text(json.dumps(doc))
    node = {"log.retention.ms": "x", "log.segment.bytes": "2000"}
    (meta / "broker-configs.json").write_text(json.dumps({"node": node, "cluster": {}}))
    b.broker = b._open()
    cfg = plog(b, "t").config
    assert (cfg.retention_ms, cfg.cleanup_policy, cfg.segment_bytes) == (1000, "delete", 2000)

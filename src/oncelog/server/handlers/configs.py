"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics and the broker (KIP-226,
KIP-339), validated as Kafka validates them and applied live.

Topic configs: any name of ``storage.config.TOPIC_CONFIG_SPECS``; an unknown name or a bad value is
INVALID_CONFIG with Kafka's message. Broker configs (resource name = this node's id for per-broker
values, "" for the cluster-wide default): the broker synonyms of topic configs (``log.retention.ms``,
``message.max.bytes``, ...) are dynamic and validated like the topic config they default; the
broker's own static settings are refused (INVALID_REQUEST "Cannot update these configs
dynamically", as Kafka), and so are Kafka's broker log configs that only a restart changes
(``KAFKA_STATIC_LOG_CONFIGS``: ``log.retention.hours``, ``log.roll.hours``, ...), which would
otherwise be kept without effect; any other name is kept and described (as a secret, below), as
Kafka keeps broker configs it does not act on. Broker validation errors are INVALID_REQUEST, as in
Kafka (KAFKA-13609).

Secrets: a config whose type is PASSWORD or unknown (every broker config that is neither a topic
config's synonym nor one of the broker's own settings) is described with a null value and
``is_sensitive`` (its synonyms too) and logged as ``[hidden]``, as Kafka's
``KafkaConfig.maybeSensitive`` and ``loggableValue``: such a name may hold a password
(``listener.name.x.ssl.keystore.password``, ``sasl.jaas.config``).

Values are stored as Kafka describes them once parsed (``" 1000 "`` becomes ``"1000"``).

The order of checks follows Kafka's: duplicate resources and keys, null values and unknown
operations (INVALID_REQUEST), authorization, the topic's name (Kafka's Topic.validate:
INVALID_TOPIC_EXCEPTION; the empty name INVALID_REQUEST) and existence (as ZooKeeper-mode Kafka),
then the values. Legacy AlterConfigs replaces the resource's whole set of overrides.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.authz import Op, R, allowed
from oncelog.server.handlers.admin import short_message
from oncelog.storage.config import (
    BROKER_SYNONYMS,
    TOPIC_CONFIG_SPECS,
    ConfigSource,
    ConfigType,
    DescribedConfig,
    Synonym,
    broker_spec,
    normalized_broker_config,
    normalized_topic_config,
)
from oncelog.storage.errors import DiskFullError, InvalidConfigError, InvalidTopicError
from oncelog.storage.log_manager import validate_topic_name

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
RESOURCE_BROKER_LOGGER = 8  # not supported; only its authorization (DESCRIBE_CONFIGS on the cluster) is Kafka's

OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
_OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

# Kafka's broker log configs (ServerLogConfigs) that are not dynamic (DynamicConfig.Broker.nonDynamicProps):
# a topic config's lower-precedence synonyms (DynamicLogConfig.ReconfigurableConfigs holds only the
# first synonym of each), the log format version (DynamicLogConfig.NonReconfigrableLogConfigs), and
# the log manager's own settings. Kafka answers "Cannot update these configs dynamically"; kept
# here, they would be accepted and never take effect (log.retention.hours=1 left retention.ms alone).
KAFKA_STATIC_LOG_CONFIGS = frozenset({
    "log.roll.hours", "log.roll.jitter.hours", "log.retention.minutes", "log.retention.hours",
    "log.flush.scheduler.interval.ms", "log.message.format.version",
    "log.flush.offset.checkpoint.interval.ms", "log.flush.start.offset.checkpoint.interval.ms",
    "num.recovery.threads.per.data.dir", "log.initial.task.delay.ms", "log.dir.failure.timeout.ms",
    "create.topic.policy.class.name", "alter.config.policy.class.name",
})

HIDDEN = "[hidden]"  # Kafka's Password.HIDDEN


class ConfigRequestError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


# --- broker configs ---------------------------------------------------------------------------------
def static_broker_configs(broker: Broker) -> dict[str, tuple[str, ConfigType]]:
    """The broker's own settings that cannot change while it runs (read-only in DescribeConfigs)."""
    c = broker.config
    return {
        "broker.id": (str(c.node_id), ConfigType.INT),
        "node.id": (str(c.node_id), ConfigType.INT),
        "log.dirs": (str(c.data_dir), ConfigType.STRING),
        "auto.create.topics.enable": (str(c.auto_create_topics_enable).lower(), ConfigType.BOOLEAN),
        "num.partitions": (str(c.num_partitions), ConfigType.INT),
        "transaction.max.timeout.ms": (str(c.transaction_max_timeout_ms), ConfigType.INT),
        "socket.request.max.bytes": (str(c.socket_request_max_bytes), ConfigType.INT),
        "log.retention.check.interval.ms": (str(c.log_retention_check_interval_ms), ConfigType.LONG),
        "max.connections": (str(c.max_connections), ConfigType.INT),
        "max.connections.per.ip": (str(c.max_connections_per_ip), ConfigType.INT),
        "fetch.max.bytes": (str(c.fetch_max_bytes), ConfigType.INT),
    }


def _non_dynamic_names(broker: Broker) -> set[str]:
    names = set(static_broker_configs(broker))
    names |= {f.name.replace("_", ".") for f in dataclasses.fields(broker.config)}
    names |= {"listeners", "advertised.listeners", "log.dir", "process.roles", "controller.quorum.voters"}
    return (names - set(BROKER_SYNONYMS)) | KAFKA_STATIC_LOG_CONFIGS


def is_sensitive(ctype: ConfigType) -> bool:
    """Kafka's KafkaConfig.maybeSensitive: a PASSWORD, or a config whose type is not known."""
    return ctype in (ConfigType.UNKNOWN, ConfigType.PASSWORD)


def loggable(resource_type: int, configs: dict[str, str]) -> dict[str, str]:
    """Configs as they may be logged (Kafka's loggableValue): sensitive values are ``[hidden]``."""
    if resource_type == RESOURCE_TOPIC:
        types = {n: s.type if (s := TOPIC_CONFIG_SPECS.get(n)) else ConfigType.UNKNOWN for n in configs}
    else:
        types = {n: s.type if (s := broker_spec(n)) else ConfigType.UNKNOWN for n in configs}
    return {n: HIDDEN if is_sensitive(types[n]) else v for n, v in configs.items()}


def _describe_broker(broker: Broker, per_broker: bool) -> list[DescribedConfig]:
    layers = broker.logs.broker_configs
    out: list[DescribedConfig] = []
    if not per_broker:  # the cluster-wide default resource shows only its dynamic values (Kafka)
        for name, value in sorted(layers.cluster.items()):
            spec = broker_spec(name)
            syn = Synonym(name, value, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
            out.append(DescribedConfig(name, value, syn.source, (syn,),
                                       spec.type if spec else ConfigType.UNKNOWN, spec.doc if spec else ""))
        return out
    for name, (value, ctype) in static_broker_configs(broker).items():
        syn = Synonym(name, value, ConfigSource.STATIC_BROKER_CONFIG)
        out.append(DescribedConfig(name, value, syn.source, (syn,), ctype, "", read_only=True))
    for broker_name, topic_name in BROKER_SYNONYMS.items():
        spec = TOPIC_CONFIG_SPECS[topic_name]
        chain = layers.synonym_chain(spec)
        out.append(DescribedConfig(broker_name, chain[0].value, chain[0].source, tuple(chain), spec.type, spec.doc,
                                   read_only=broker_name in KAFKA_STATIC_LOG_CONFIGS))
    known = set(BROKER_SYNONYMS) | set(static_broker_configs(broker))
    for scope, source in ((layers.node, ConfigSource.DYNAMIC_BROKER_CONFIG),
                          (layers.cluster, ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)):
        for name, value in scope.items():
            if name not in known:
                known.add(name)
                chain = [Synonym(name, value, source)]
                if source == ConfigSource.DYNAMIC_BROKER_CONFIG and name in layers.cluster:
                    chain.append(Synonym(name, layers.cluster[name], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG))
                out.append(DescribedConfig(name, value, source, tuple(chain), ConfigType.UNKNOWN, ""))
    return sorted(out, key=lambda d: d.name)


def _broker_scope(broker: Broker, name: str) -> str:
    """'node' for this broker's id, 'cluster' for ""; INVALID_REQUEST otherwise (Kafka's messages)."""
    if name == "":
        return "cluster"
    try:
        node = int(name)
    except ValueError:
        raise ConfigRequestError(ErrorCode.invalid_request,
                                 f"Node id must be an integer, but it is: {name}") from None
    if node != broker.config.node_id:
        raise ConfigRequestError(ErrorCode.invalid_request,
                                 f"Unexpected broker id, expected {broker.config.node_id}, but received {name}")
    return "node"


# --- DescribeConfigs --------------------------------------------------------------------------------
def _entry(d: DescribedConfig, synonyms: bool, documentation: bool) -> dict[str, Any]:
    """One described config; a sensitive one (``is_sensitive``) shows no value, nor do its synonyms
    (Kafka's ConfigHelper.createBrokerConfigEntry)."""
    secret = is_sensitive(d.type)
    return {"name": d.name, "value": None if secret else d.value, "read_only": d.read_only,
            "is_default": d.source == ConfigSource.DEFAULT_CONFIG, "config_source": int(d.source),
            "is_sensitive": secret,
            "synonyms": [{"name": s.name, "value": None if secret else s.value, "source": int(s.source)}
                         for s in d.synonyms] if synonyms else [],
            "config_type": int(d.type), "documentation": (d.doc or None) if documentation else None}


def handle_describe_configs(broker: Broker, req: Request) -> dict[str, Any]:
    body = req.body
    synonyms = bool(getattr(body, "include_synonyms", False))
    documentation = bool(getattr(body, "include_documentation", False))
    results = []
    for r in body.resources:
        keys = set(r.configuration_keys) if r.configuration_keys else None  # null or empty: all (Kafka)
        entry: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                 "resource_type": r.resource_type, "resource_name": r.resource_name,
                                 "configs": []}
        described: list[DescribedConfig] = []
        if r.resource_type == RESOURCE_TOPIC:
            if not allowed(broker, req, Op.DESCRIBE_CONFIGS, R.TOPIC, r.resource_name):
                entry["error_code"] = ErrorCode.topic_authorization_failed
            elif (invalid := _invalid_topic_name(r.resource_name)) is not None:
                entry.update(error_code=ErrorCode.invalid_topic_exception, error_message=short_message(invalid))
            elif r.resource_name not in broker.logs.topics():
                entry.update(error_code=ErrorCode.unknown_topic_or_partition,
                             error_message=short_message(f"Topic {r.resource_name} does not exist"))
            else:
                described = broker.logs.describe_topic_configs(r.resource_name)
        elif r.resource_type == RESOURCE_BROKER:
            if not allowed(broker, req, Op.DESCRIBE_CONFIGS, R.CLUSTER):
                entry["error_code"] = ErrorCode.cluster_authorization_failed
            else:
                try:
                    described = _describe_broker(broker, _broker_scope(broker, r.resource_name) == "node")
                except ConfigRequestError as exc:
                    entry.update(error_code=exc.code, error_message=short_message(str(exc)))
        elif r.resource_type == RESOURCE_BROKER_LOGGER and not allowed(broker, req, Op.DESCRIBE_CONFIGS, R.CLUSTER):
            entry["error_code"] = ErrorCode.cluster_authorization_failed
        else:
            entry.update(error_code=ErrorCode.invalid_request,
                         error_message=f"Unsupported resource type {r.resource_type}")
        entry["configs"] = [_entry(d, synonyms, documentation) for d in described if keys is None or d.name in keys]
        results.append(entry)
    return {"throttle_time": 0, "results": results}


def _invalid_topic_name(name: str) -> str | None:
    """Why ``name`` cannot be a topic's (Kafka's Topic.validate), or None."""
    try:
        validate_topic_name(name)
    except InvalidTopicError as exc:
        return str(exc)
    return None


# --- AlterConfigs / IncrementalAlterConfigs ------------------------------------------------------------
def _list_type(resource_type: int, name: str) -> bool:
    spec = TOPIC_CONFIG_SPECS.get(name) if resource_type == RESOURCE_TOPIC else broker_spec(name)
    if spec is None:
        kind = "topic config" if resource_type == RESOURCE_TOPIC else "config"
        raise ConfigRequestError(ErrorCode.invalid_config, f"Unknown {kind} name: {name}")
    return spec.type == ConfigType.LIST


def _default_list(resource_type: int, name: str) -> list[str]:
    spec = TOPIC_CONFIG_SPECS.get(name) if resource_type == RESOURCE_TOPIC else broker_spec(name)
    assert spec is not None
    return list(spec.default)


def apply_incremental(resource_type: int, current: dict[str, str], ops: list[tuple[str, int, str | None]]
                      ) -> dict[str, str]:
    """The overrides after SET/DELETE/APPEND/SUBTRACT (Kafka's semantics: APPEND and SUBTRACT only
    on LIST configs, starting from the default when there is no override; APPEND skips values
    already present; DELETE of an absent name is a no-op)."""
    props = dict(current)
    for name, op, value in ops:
        if op == OP_SET:
            assert value is not None
            props[name] = value
        elif op == OP_DELETE:
            props.pop(name, None)
        else:
            if not _list_type(resource_type, name):
                raise ConfigRequestError(ErrorCode.invalid_config,
                                         f"Can't {_OP_NAMES[op]} to key {name} because its type is not LIST.")
            assert value is not None
            old = props[name].split(",") if name in props else _default_list(resource_type, name)
            old = [v for v in old if v]
            if op == OP_APPEND:
                new = old + [v for v in dict.fromkeys(value.split(",")) if v not in old]
            else:
                removed = set(value.split(","))
                new = [v for v in old if v not in removed]
            props[name] = ",".join(new)
    return props


def _alter_one(broker: Broker, req: Request, resource_type: int, name: str, incremental: bool,
               configs: list[Any], validate_only: bool) -> None:
    """Validate and apply one resource's change; raises ConfigRequestError."""
    if resource_type == RESOURCE_TOPIC:
        if not allowed(broker, req, Op.ALTER_CONFIGS, R.TOPIC, name):
            raise ConfigRequestError(ErrorCode.topic_authorization_failed, "Topic authorization failed.")
    elif resource_type == RESOURCE_BROKER:
        if not allowed(broker, req, Op.ALTER_CONFIGS, R.CLUSTER):
            raise ConfigRequestError(ErrorCode.cluster_authorization_failed, "Cluster authorization failed.")
    else:
        raise ConfigRequestError(ErrorCode.invalid_request, f"Unknown resource type {resource_type}")
    counts = Counter(c.name for c in configs)
    if any(n > 1 for n in counts.values()):
        raise ConfigRequestError(ErrorCode.invalid_request, "Error due to duplicate config keys")
    ops: list[tuple[str, int, str | None]] = []
    for c in configs:
        op = getattr(c, "config_operation", OP_SET)
        if op not in _OP_NAMES:
            raise ConfigRequestError(ErrorCode.invalid_request, f"Unknown operations type {op}")
        ops.append((c.name, op, c.value))
    nulls = [n for n, op, v in ops if v is None and op != OP_DELETE]
    if nulls:
        raise ConfigRequestError(ErrorCode.invalid_request, "Null value not supported for : " + ", ".join(nulls))
    if resource_type == RESOURCE_TOPIC:
        if name == "":  # Kafka's ControllerConfigurationValidator
            raise ConfigRequestError(ErrorCode.invalid_request, "Default topic resources are not allowed.")
        if (invalid := _invalid_topic_name(name)) is not None:
            raise ConfigRequestError(ErrorCode.invalid_topic_exception, invalid)
        info = broker.logs.topics().get(name)
        if info is None:
            raise ConfigRequestError(ErrorCode.unknown_topic_or_partition, f"Topic {name} does not exist")
        current = info.configs if incremental else {}
        new = apply_incremental(RESOURCE_TOPIC, current, ops)
        new = {k: normalized_topic_config(k, v) for k, v in new.items()}
        try:
            broker.logs.alter_topic_configs(name, new, validate_only=validate_only)
        except InvalidConfigError as exc:
            raise ConfigRequestError(ErrorCode.invalid_config, str(exc)) from None
        except DiskFullError as exc:  # topics.json not rewritten: the overrides stay as they were
            raise ConfigRequestError(ErrorCode.kafka_storage_error, str(exc)) from None
        if not validate_only:
            log.info("topic %s: config overrides now %s", name, loggable(RESOURCE_TOPIC, new))
        return
    scope = _broker_scope(broker, name)
    layers = broker.logs.broker_configs
    current = dict(layers.node if scope == "node" else layers.cluster) if incremental else {}
    new = apply_incremental(RESOURCE_BROKER, current, ops)
    new = {k: normalized_broker_config(k, v) for k, v in new.items()}
    # A non-dynamic name stored before it was refused (log.retention.hours, kept by older versions)
    # stays until it is deleted: only setting one, or changing its value, is refused.
    stored = layers.node if scope == "node" else layers.cluster
    frozen = sorted(n for n in set(new) & _non_dynamic_names(broker) if stored.get(n) != new[n])
    if frozen:
        raise ConfigRequestError(ErrorCode.invalid_request,
                                 f"Cannot update these configs dynamically: {{{', '.join(frozen)}}}")
    try:
        broker.logs.alter_broker_configs(scope, new, validate_only=validate_only)
    except InvalidConfigError as exc:
        raise ConfigRequestError(ErrorCode.invalid_request, str(exc)) from None
    if not validate_only:
        log.info("dynamic broker configs (%s) now %s", "cluster default" if scope == "cluster" else "this broker",
                 loggable(RESOURCE_BROKER, new))


def _handle_alter(broker: Broker, req: Request, incremental: bool) -> dict[str, Any]:
    body = req.body
    seen = Counter((r.resource_type, r.resource_name) for r in body.resources)
    out = []
    for r in body.resources:
        entry: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None,
                                 "resource_type": r.resource_type, "resource_name": r.resource_name}
        try:
            if seen[(r.resource_type, r.resource_name)] > 1:
                raise ConfigRequestError(ErrorCode.invalid_request, "Each resource must appear at most once.")
            _alter_one(broker, req, r.resource_type, r.resource_name, incremental, list(r.configs),
                       bool(body.validate_only))
        except ConfigRequestError as exc:
            entry.update(error_code=exc.code, error_message=short_message(str(exc)))
        out.append(entry)
    return {"throttle_time": 0, "responses": out}


def handle_alter_configs(broker: Broker, req: Request) -> dict[str, Any]:
    return _handle_alter(broker, req, incremental=False)


def handle_incremental_alter_configs(broker: Broker, req: Request) -> dict[str, Any]:
    return _handle_alter(broker, req, incremental=True)

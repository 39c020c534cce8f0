"""Topic configuration: Kafka's topic config names, their types, defaults and validation rules, and
the ``LogConfig`` a partition log runs with.

``TOPIC_CONFIG_SPECS`` is the one table of every topic config Kafka knows (its ``LogConfig``
definitions, 3.x names included). Each entry says how to parse and validate a value, which
``LogConfig`` field it sets (``field``; None: the config is stored, validated and described but
changes nothing here) and which broker config supplies its default (``synonym``, Kafka's
``ServerTopicConfigSynonyms``). Adding a config is adding an entry (and a field when it is honoured);
nothing else here names a config.

Values resolve as Kafka resolves them, first found wins: the topic's override, the broker's dynamic
per-broker config of the synonym, the dynamic cluster-wide default, the static broker config, the
default (``describe_topic_configs``). Validation errors raise ``InvalidConfigError`` with Kafka's
wording ("Invalid value X for configuration Y: ...").

Pure data and functions: no I/O (the log manager persists overrides, see ``log_manager``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from oncelog.storage.errors import InvalidConfigError

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class ConfigType(IntEnum):
    """DescribeConfigs v3+ ``config_type`` (Kafka's DescribeConfigsResponse.ConfigType)."""

    UNKNOWN = 0
    BOOLEAN = 1
    STRING = 2
    INT = 3
    SHORT = 4
    LONG = 5
    DOUBLE = 6
    LIST = 7
    CLASS = 8
    PASSWORD = 9


class ConfigSource(IntEnum):
    """DescribeConfigs v1+ ``config_source``."""

    UNKNOWN = 0
    DYNAMIC_TOPIC_CONFIG = 1
    DYNAMIC_BROKER_CONFIG = 2
    DYNAMIC_DEFAULT_BROKER_CONFIG = 3
    STATIC_BROKER_CONFIG = 4
    DEFAULT_CONFIG = 5


# A validator returns why a parsed value is invalid (Kafka's wording), or None.
Validator = Callable[[Any], "str | None"]


def at_least(n: float) -> Validator:
    return lambda v: None if v >= n else f"Value must be at least {n}"


def between(lo: float, hi: float) -> Validator:
    def check(v: Any) -> str | None:
        if v < lo:
            return f"Value must be at least {lo}"
        if v > hi:
            return f"Value must be no more than {hi}"
        return None
    return check


def one_of(*allowed: str) -> Validator:
    return lambda v: None if v in allowed else f"String must be one of: {', '.join(allowed)}"


def each_one_of(*allowed: str) -> Validator:
    def check(values: Any) -> str | None:
        bad = [v for v in values if v not in allowed]
        return f"String must be one of: {', '.join(allowed)}" if bad else None
    return check


def _throttled_replicas(values: Any) -> str | None:
    if list(values) == ["*"] or all(re.fullmatch(r"\d+:\d+", v) for v in values):
        return None
    return ("must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


_VERSION = re.compile(r"(0\.(8\.[0-2]|9\.0|10\.[0-2]|11\.0)|[1-9]\d*\.\d+)(\.\d+)?(-IV\d+)?")


def _message_format_version(v: Any) -> str | None:
    return None if _VERSION.fullmatch(v) else f"Version `{v}` is not a valid version"


def _gzip_level(v: Any) -> str | None:
    return None if v == -1 or 1 <= v <= 9 else "Value must be between 1 and 9, or -1 (the codec's default)"


def _remote_storage(v: Any) -> str | None:
    if v:
        return ("Tiered Storage functionality is disabled in the broker. "
                "Topic cannot be configured with remote log storage.")
    return None


@dataclass(frozen=True)
class ConfigSpec:
    """One config: how to parse, validate, store and describe it."""

    name: str
    type: ConfigType
    default: Any                      # parsed (a list config's default is a tuple)
    validator: Validator | None = None
    field: str | None = None          # the LogConfig field it sets; None: stored and described only
    synonym: str | None = None        # the broker config that supplies the default
    to_field: Callable[[Any], Any] | None = None  # parsed value -> field value (default: as is)
    doc: str = ""
    #: a valid parsed value -> the same setting in the form to store (default: as is)
    canonical: Callable[[Any], Any] | None = None

    def parse(self, raw: str | None) -> Any:
        """Kafka's ConfigDef.parseType then the validator; InvalidConfigError with Kafka's message."""
        if raw is None:
            raise InvalidConfigError(f"Null value not supported for topic configs: {self.name}")
        value = parse_typed(self.type, raw)
        if value is None:
            why = ("Expected value to be either true or false" if self.type == ConfigType.BOOLEAN
                   else f"Not a number of type {self.type.name}")
            raise InvalidConfigError(f"Invalid value {raw} for configuration {self.name}: {why}")
        problem = self.validator(value) if self.validator is not None else None
        if problem is not None:
            shown = ",".join(value) if isinstance(value, tuple) else raw.strip()
            raise InvalidConfigError(f"Invalid value {shown} for configuration {self.name}: {problem}")
        return self.canonical(value) if self.canonical is not None else value

    def format(self, value: Any) -> str:
        return format_typed(self.type, value)

    def field_value(self, value: Any) -> Any:
        return self.to_field(value) if self.to_field is not None else value


_INT = re.compile(r"[+-]?\d+")


def parse_typed(ctype: ConfigType, raw: str) -> Any:
    """A string as Kafka's ConfigDef parses it; None when it is not of the type."""
    text = raw.strip()
    if ctype == ConfigType.BOOLEAN:
        return {"true": True, "false": False}.get(text.lower())
    if ctype in (ConfigType.INT, ConfigType.LONG, ConfigType.SHORT):
        if not _INT.fullmatch(text):
            return None
        value = int(text)
        limit = {ConfigType.INT: 2**31, ConfigType.LONG: 2**63, ConfigType.SHORT: 2**15}[ctype]
        return value if -limit <= value < limit else None
    if ctype == ConfigType.DOUBLE:
        if "_" in text:
            return None
        try:
            number = float(text)
        except ValueError:
            return None
        return None if math.isnan(number) else number
    if ctype == ConfigType.LIST:
        return tuple(re.split(r"\s*,\s*", text)) if text else ()
    return text


def format_typed(ctype: ConfigType, value: Any) -> str:
    if ctype == ConfigType.BOOLEAN:
        return "true" if value else "false"
    if ctype == ConfigType.LIST:
        return ",".join(value)
    return str(value)


_T = ConfigType
_SPECS: list[ConfigSpec] = [
    ConfigSpec("segment.bytes", _T.INT, 1024**3, at_least(14), "segment_bytes", "log.segment.bytes",
               doc="Size of a segment file; a new segment is rolled when the active one would grow past it."),
    ConfigSpec("segment.ms", _T.LONG, 7 * 24 * 3600 * 1000, at_least(1), "segment_ms", "log.roll.ms",
               doc="Roll a new segment after this long even if the active one is not full."),
    ConfigSpec("segment.jitter.ms", _T.LONG, 0, at_least(0), "segment_jitter_ms", "log.roll.jitter.ms",
               doc="Up to this much is taken at random off segment.ms for each segment."),
    ConfigSpec("segment.index.bytes", _T.INT, 10 * 1024 * 1024, at_least(4), "segment_index_bytes",
               "log.index.size.max.bytes", doc="Maximum size of a segment's offset index; a full index rolls."),
    ConfigSpec("flush.messages", _T.LONG, INT64_MAX, at_least(1), "flush_messages",
               "log.flush.interval.messages", doc="fsync after this many unflushed records."),
    ConfigSpec("flush.ms", _T.LONG, 1000, at_least(0), "flush_interval_ms", "log.flush.interval.ms",
               doc="fsync the log at least this often (oncelog's default 1000; Kafka's Long.MAX_VALUE)."),
    ConfigSpec("retention.bytes", _T.LONG, -1, None, "retention_bytes", "log.retention.bytes",
               doc="Delete old segments while the log is larger than this (-1: no limit)."),
    ConfigSpec("retention.ms", _T.LONG, 7 * 24 * 3600 * 1000, at_least(-1), "retention_ms", "log.retention.ms",
               doc="Delete segments whose newest record is older than this (-1: no limit)."),
    ConfigSpec("max.message.bytes", _T.INT, 1024 * 1024 + 12, at_least(0), "max_message_bytes",
               "message.max.bytes", doc="Largest record batch accepted (after recompression)."),
    ConfigSpec("index.interval.bytes", _T.INT, 4096, at_least(0), "index_interval_bytes",
               "log.index.interval.bytes", doc="Bytes between two offset index entries."),
    ConfigSpec("file.delete.delay.ms", _T.LONG, 60000, at_least(0), None, "log.segment.delete.delay.ms",
               doc="Stored and described; oncelog deletes segment files at once."),
    ConfigSpec("unclean.leader.election.enable", _T.BOOLEAN, False, None, None, "unclean.leader.election.enable",
               doc="Stored and described; a single node has no other replica to elect."),
    ConfigSpec("min.insync.replicas", _T.INT, 1, at_least(1), "min_insync_replicas", "min.insync.replicas",
               doc="acks=all produce needs this many in-sync replicas (one here): above 1, NOT_ENOUGH_REPLICAS."),
    ConfigSpec("compression.type", _T.STRING, "producer",
               one_of("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"), "compression_type",
               "compression.type", doc="Batches are stored as produced ('producer'), else recompressed to this."),
    ConfigSpec("compression.gzip.level", _T.INT, -1, _gzip_level, "compression_gzip_level",
               "compression.gzip.level", doc="gzip level when recompressing to gzip."),
    ConfigSpec("compression.lz4.level", _T.INT, 9, between(1, 17), "compression_lz4_level",
               "compression.lz4.level", doc="lz4 level when recompressing to lz4."),
    ConfigSpec("compression.zstd.level", _T.INT, 3, between(-131072, 22), "compression_zstd_level",
               "compression.zstd.level", doc="zstd level when recompressing to zstd."),
    ConfigSpec("preallocate", _T.BOOLEAN, False, None, None, "log.preallocate",
               doc="Stored and described; segment files are not preallocated."),
    ConfigSpec("message.format.version", _T.STRING, "3.0-IV1", _message_format_version, None,
               "log.message.format.version", doc="Stored and described; only RecordBatch v2 is written."),
    ConfigSpec("message.timestamp.type", _T.STRING, "CreateTime", one_of("CreateTime", "LogAppendTime"),
               "message_timestamp_type", "log.message.timestamp.type",
               doc="CreateTime keeps the producer's timestamps; LogAppendTime stamps batches on append."),
    ConfigSpec("message.timestamp.difference.max.ms", _T.LONG, INT64_MAX, at_least(0),
               "message_timestamp_difference_max_ms", "log.message.timestamp.difference.max.ms",
               doc="Deprecated: before/after limit used when those two are at their default."),
    ConfigSpec("message.timestamp.before.max.ms", _T.LONG, INT64_MAX, at_least(0),
               "message_timestamp_before_max_ms", "log.message.timestamp.before.max.ms",
               doc="CreateTime records older than now minus this are refused (INVALID_TIMESTAMP)."),
    ConfigSpec("message.timestamp.after.max.ms", _T.LONG, INT64_MAX, at_least(0),
               "message_timestamp_after_max_ms", "log.message.timestamp.after.max.ms",
               doc="CreateTime records newer than now plus this are refused (INVALID_TIMESTAMP)."),
    ConfigSpec("leader.replication.throttled.replicas", _T.LIST, (), _throttled_replicas,
               doc="Stored and described; nothing replicates on a single node."),
    ConfigSpec("follower.replication.throttled.replicas", _T.LIST, (), _throttled_replicas,
               doc="Stored and described; nothing replicates on a single node."),
    ConfigSpec("message.downconversion.enable", _T.BOOLEAN, True, None, None, "log.message.downconversion.enable",
               doc="Stored and described; fetches below RecordBatch v2 are not served."),
    ConfigSpec("remote.storage.enable", _T.BOOLEAN, False, _remote_storage,
               doc="Tiered storage is not available: true is refused."),
    ConfigSpec("local.retention.ms", _T.LONG, -2, at_least(-2), None, "log.local.retention.ms",
               doc="Stored and described (tiered storage only)."),
    ConfigSpec("local.retention.bytes", _T.LONG, -2, at_least(-2), None, "log.local.retention.bytes",
               doc="Stored and described (tiered storage only)."),
    ConfigSpec("remote.log.copy.disable", _T.BOOLEAN, False, doc="Stored and described (tiered storage only)."),
    ConfigSpec("remote.log.delete.on.disable", _T.BOOLEAN, False,
               doc="Stored and described (tiered storage only)."),
]

# ---- log compaction configs: owned by the log-compaction work --------------------------------------
# (cleanup.policy, delete.retention.ms, min.cleanable.dirty.ratio, min.compaction.lag.ms,
# max.compaction.lag.ms). Each is one ConfigSpec here and, if honoured, one LogConfig field in the
# block of the same name; cross-field rules go to CROSS_CHECKS. Nothing else needs to change.
# Kafka's ValidList checks each element only: an empty list is valid (neither policy: the log keeps
# everything, no retention and no compaction) and so is a policy named twice.
_cleanup_policy = each_one_of("compact", "delete")


def _cleanup_policy_canonical(policies: tuple[str, ...]) -> tuple[str, ...]:
    """Each policy once, in the order given (``compact,compact`` is ``compact``; ``delete,compact``
    stays, as Kafka prints it): the stored form, which versions before 269d961 accept too (they
    refused a repeated policy and ran such a topic as ``delete``). ``()`` has no such form (storage.md)."""
    return tuple(dict.fromkeys(policies))


_COMPACTION_SPECS: list[ConfigSpec] = [
    ConfigSpec("cleanup.policy", _T.LIST, ("delete",), _cleanup_policy, "cleanup_policy", "log.cleanup.policy",
               to_field=",".join, doc="delete: old segments are deleted by retention.ms/bytes; compact: the "
               "log cleaner keeps the newest record per key; compact,delete: both.",
               canonical=_cleanup_policy_canonical),
    ConfigSpec("delete.retention.ms", _T.LONG, 24 * 3600 * 1000, at_least(0), "delete_retention_ms",
               "log.cleaner.delete.retention.ms",
               doc="How long a tombstone (and a marker of a vanished transaction) stays after the cleaner "
               "first kept it."),
    ConfigSpec("min.cleanable.dirty.ratio", _T.DOUBLE, 0.5, between(0, 1), "min_cleanable_dirty_ratio",
               "log.cleaner.min.cleanable.ratio",
               doc="A compacted log is cleaned once its dirty part is more than this share of it."),
    ConfigSpec("min.compaction.lag.ms", _T.LONG, 0, at_least(0), "min_compaction_lag_ms",
               "log.cleaner.min.compaction.lag.ms", doc="A record stays uncompacted at least this long."),
    ConfigSpec("max.compaction.lag.ms", _T.LONG, INT64_MAX, at_least(1), "max_compaction_lag_ms",
               "log.cleaner.max.compaction.lag.ms",
               doc="A record is compacted at most this long after it was written, whatever the dirty ratio."),
]


def _compaction_lags(values: Mapping[str, Any]) -> str | None:
    lo, hi = values["min.compaction.lag.ms"], values["max.compaction.lag.ms"]
    if lo > hi:
        return f"conflict topic config setting min.compaction.lag.ms ({lo}) > max.compaction.lag.ms ({hi})"
    return None
# ---- end of log compaction configs ------------------------------------------------------------------

TOPIC_CONFIG_SPECS: dict[str, ConfigSpec] = {s.name: s for s in _SPECS + _COMPACTION_SPECS}

# Rules over several configs (Kafka's LogConfig.validateValues): each gets every effective value by
# name and returns why the combination is invalid, or None.
CROSS_CHECKS: list[Callable[[Mapping[str, Any]], str | None]] = [_compaction_lags]

# Broker config name -> topic config name, for configs a dynamic broker config may default.
BROKER_SYNONYMS: dict[str, str] = {s.synonym: s.name for s in TOPIC_CONFIG_SPECS.values() if s.synonym}


def broker_spec(broker_name: str) -> ConfigSpec | None:
    """The spec of a broker config that is a topic config's synonym (same type and rules)."""
    topic = BROKER_SYNONYMS.get(broker_name)
    if topic is None:
        return None
    return dataclasses.replace(TOPIC_CONFIG_SPECS[topic], name=broker_name)


def parse_topic_configs(raw: Mapping[str, str | None]) -> dict[str, Any]:
    """Kafka name -> parsed value; unknown names and bad values raise InvalidConfigError."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        spec = TOPIC_CONFIG_SPECS.get(name)
        if spec is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
        out[name] = spec.parse(value)
    return out


def normalized_topic_config(name: str, value: str) -> str:
    """A topic override as Kafka describes it once parsed (``" 1000 "`` is ``"1000"``, ``"a , b"``
    is ``"a,b"``, ``"TRUE"`` is ``"true"``): the form to store. An unknown name, or a value that does
    not parse, is returned as given (validation reports it)."""
    return _normalized(TOPIC_CONFIG_SPECS.get(name), value)


def normalized_broker_config(name: str, value: str) -> str:
    """A dynamic broker config in the form to store: a topic config's synonym as Kafka formats its
    parsed value; any other name as given."""
    return _normalized(broker_spec(name), value)


def _normalized(spec: ConfigSpec | None, value: str) -> str:
    if spec is None:
        return value
    try:
        return spec.format(spec.parse(value))
    except InvalidConfigError:
        return value


def parse_broker_configs(raw: Mapping[str, str]) -> dict[str, Any]:
    """Broker name -> parsed value for the broker configs that default topic configs; others are
    returned as given (Kafka keeps broker configs it does not know)."""
    out: dict[str, Any] = {}
    for name, value in raw.items():
        spec = broker_spec(name)
        out[name] = spec.parse(value) if spec is not None else value
    return out


@dataclass(frozen=True)
class LogConfig:
    """What a partition log runs with. Replaced as a whole (``PartitionLog.set_config``) when a
    config changes, so readers never see half an update."""

    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10 * 1024 * 1024
    retention_bytes: int = -1
    retention_ms: int = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    flush_interval_ms: int = 1000
    flush_messages: int = INT64_MAX
    flush_every_append: bool = False  # broker-wide (--flush-every-append), not a topic config
    message_timestamp_type: str = "CreateTime"
    message_timestamp_difference_max_ms: int = INT64_MAX
    message_timestamp_before_max_ms: int = INT64_MAX
    message_timestamp_after_max_ms: int = INT64_MAX
    max_message_bytes: int = 1024 * 1024 + 12
    min_insync_replicas: int = 1
    compression_type: str = "producer"
    compression_gzip_level: int = -1
    compression_lz4_level: int = 9
    compression_zstd_level: int = 3
    # ---- log compaction fields: owned by the log-compaction work ----
    cleanup_policy: str = "delete"  # policies joined by ","; "" (neither) keeps every segment
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = INT64_MAX

    # Cached: a LogConfig is immutable (a config change makes a new one), and appends read these.
    @functools.cached_property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @functools.cached_property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy.split(",")

    @functools.cached_property
    def max_segment_ms(self) -> int:
        """Kafka's maxSegmentMs: a compacted log also rolls when max.compaction.lag.ms has passed,
        so a record never waits in the (never cleaned) active segment longer than that."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms
    # ---- end of log compaction fields ----

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    @property
    def timestamp_before_max_ms(self) -> int:
        """Kafka 3.6+: the deprecated difference limit applies while before.max.ms is at its default."""
        v = self.message_timestamp_before_max_ms
        return v if v != INT64_MAX else self.message_timestamp_difference_max_ms

    @property
    def timestamp_after_max_ms(self) -> int:
        v = self.message_timestamp_after_max_ms
        return v if v != INT64_MAX else self.message_timestamp_difference_max_ms

    def with_values(self, parsed: Mapping[str, Any]) -> LogConfig:
        """This config with parsed values (Kafka topic or broker synonym names) applied."""
        changes: dict[str, Any] = {}
        for name, value in parsed.items():
            spec = TOPIC_CONFIG_SPECS.get(name) or broker_spec(name)
            if spec is not None and spec.field is not None:
                changes[spec.field] = spec.field_value(value)
        return dataclasses.replace(self, **changes) if changes else self

    def with_topic_configs(self, configs: Mapping[str, str | None]) -> LogConfig:
        """This config overridden by Kafka-named topic configs; InvalidConfigError on bad input."""
        return self.with_values(parse_topic_configs(configs))


def field_default(spec: ConfigSpec) -> Any:
    """The value a field-backed spec has in a default LogConfig (equal to ``spec.default``)."""
    assert spec.field is not None
    return getattr(LogConfig(), spec.field)


@dataclass(frozen=True)
class Synonym:
    name: str
    value: str | None
    source: ConfigSource


@dataclass(frozen=True)
class DescribedConfig:
    name: str
    value: str | None
    source: ConfigSource
    synonyms: tuple[Synonym, ...]
    type: ConfigType
    doc: str
    read_only: bool = False


@dataclass(frozen=True)
class BrokerLayers:
    """Where a broker config's value may come from, highest precedence first."""

    node: Mapping[str, str]             # dynamic per-broker (DYNAMIC_BROKER_CONFIG)
    cluster: Mapping[str, str]          # dynamic cluster-wide default (DYNAMIC_DEFAULT_BROKER_CONFIG)
    static: LogConfig                   # from the broker's command line / TOML (STATIC_BROKER_CONFIG)

    def synonym_chain(self, spec: ConfigSpec) -> list[Synonym]:
        """The broker synonyms of a topic config, highest precedence first (Kafka's order)."""
        out: list[Synonym] = []
        if spec.synonym is None:
            return [Synonym(spec.name, spec.format(spec.default), ConfigSource.DEFAULT_CONFIG)]
        name = spec.synonym
        if name in self.node:
            out.append(Synonym(name, self.node[name], ConfigSource.DYNAMIC_BROKER_CONFIG))
        if name in self.cluster:
            out.append(Synonym(name, self.cluster[name], ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG))
        default = spec.default
        if spec.field is not None:
            static = getattr(self.static, spec.field)
            if static != field_default(spec):
                out.append(Synonym(name, format_typed(spec.type, static) if spec.to_field is None else str(static),
                                   ConfigSource.STATIC_BROKER_CONFIG))
        out.append(Synonym(name, spec.format(default), ConfigSource.DEFAULT_CONFIG))
        return out

    def effective_defaults(self) -> LogConfig:
        """The LogConfig of a topic without overrides: static, then cluster default, then per-broker."""
        return self.static.with_values(parse_broker_configs(self.cluster)).with_values(
            parse_broker_configs(self.node))


def describe_topic_configs(overrides: Mapping[str, str], layers: BrokerLayers) -> list[DescribedConfig]:
    """Every topic config with its effective value, source and synonyms (Kafka's order)."""
    out = []
    for name, spec in sorted(TOPIC_CONFIG_SPECS.items()):
        chain = layers.synonym_chain(spec)
        if name in overrides:
            chain.insert(0, Synonym(name, overrides[name], ConfigSource.DYNAMIC_TOPIC_CONFIG))
        top = chain[0]
        out.append(DescribedConfig(name, top.value, top.source, tuple(chain), spec.type, spec.doc))
    return out


def check_combination(effective: LogConfig, parsed: Mapping[str, Any]) -> None:
    """Run CROSS_CHECKS over the effective values by Kafka name (overrides win)."""
    if not CROSS_CHECKS:
        return
    values: dict[str, Any] = {}
    for name, spec in TOPIC_CONFIG_SPECS.items():
        values[name] = getattr(effective, spec.field) if spec.field is not None else spec.default
    values.update(parsed)
    for check in CROSS_CHECKS:
        why = check(values)
        if why is not None:
            raise InvalidConfigError(why)

"""Option parsing shared by the `oncelog` Spark source and sink.

Option names and meanings follow Spark's Kafka connector (``kafka.bootstrap.servers``, ``subscribe``,
``subscribePattern``, ``assign``, ``startingOffsets``, ``startingTimestamp``, ``maxOffsetsPerTrigger``,
``minPartitions``, ``groupIdPrefix``, ...); every other ``kafka.*`` option is handed to librdkafka
without the prefix. Spark passes options case-insensitively (lower-cased keys), so lookups here are too.

Every option is checked when the query starts: an unknown name, a malformed JSON or number, or a
value out of range raises ``ValueError`` naming the option, instead of being ignored or failing
later inside a task.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

#: Offsets inside ``startingOffsets`` / ``endingOffsets`` JSON, as in Spark's Kafka connector.
EARLIEST = -2
LATEST = -1

#: librdkafka settings owned by the source or sink: a ``kafka.*`` option may not override them.
#: (``kafka.group.id`` is allowed: clusters with group ACLs need a fixed, permitted group id.)
_RESERVED = frozenset({"enable.auto.commit", "transactional.id", "enable.partition.eof"})

#: Keys Spark itself adds to a data source's options (``load(path)``, ``start(path)``, the
#: writer's checkpoint location); never an error.
SPARK_ADDED = frozenset({"path", "checkpointlocation", "queryname"})

#: The source's options besides ``kafka.*`` (Spark's Kafka source names, plus ours at the end).
SOURCE_OPTIONS = (
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "failOnDataLoss", "kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "minPartitions", "maxRecordsPerPartition",
    "groupIdPrefix", "includeHeaders",
    "commitOffsetsToGroup", "connectTimeoutMs",
)

#: Options only a batch read may use (Spark rejects them on a stream as well).
BATCH_ONLY_OPTIONS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")

#: The sink's options besides ``kafka.*``.
SINK_OPTIONS = (
    "topic", "includeHeaders",
    "processing.guarantee", "progress.topic", "progress.partitions", "progress.replicationFactor",
    "transactional.id.prefix", "transaction.timeout.ms", "timeout.ms", "failOnHigherCommittedBatch",
    "failOnChangedReplay", "connectTimeoutMs", "reuseTransactionalProducers",
)

DEFAULT_CONNECT_TIMEOUT_MS = 30_000


def get_option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Case-insensitive lookup (Spark lower-cases some option maps, not all)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return default


def has_option(options: Mapping[str, str], name: str) -> bool:
    return get_option(options, name) is not None


def require_option(options: Mapping[str, str], name: str) -> str:
    value = get_option(options, name)
    if value is None or value == "":
        raise ValueError(f"option {name!r} is required")
    return value


def get_bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    value = get_option(options, name)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name!r} must be true or false, not {value!r}")


def get_int(options: Mapping[str, str], name: str, default: int | None, minimum: int | None = None) -> int | None:
    """An integer option; a non-numeric value, or one below ``minimum``, raises naming the option."""
    value = get_option(options, name)
    if value is None or value.strip() == "":
        return default
    try:
        number = int(value.strip())
    except ValueError:
        raise ValueError(f"option {name!r} must be an integer, not {value!r}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"option {name!r} must be at least {minimum}, not {number}")
    return number


_DURATION = re.compile(r"^\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def get_duration_ms(options: Mapping[str, str], name: str, default_ms: int) -> int:
    """A duration like Spark's ``timeStringAsMs``: ``15m``, ``30s``, ``500ms``, ``1h``; a bare number is ms."""
    value = get_option(options, name)
    if value is None or value.strip() == "":
        return default_ms
    m = _DURATION.match(value)
    if m is None:
        raise ValueError(f"option {name!r} must be a duration such as 15m, 30s or 500ms, not {value!r}")
    return int(int(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()])


def check_known(options: Mapping[str, str], known: Iterable[str], role: str) -> None:
    """Raise ``ValueError`` naming every option that is neither ``kafka.*``, known, nor added by Spark."""
    allowed = {k.lower() for k in known} | SPARK_ADDED
    unknown = sorted(k for k in options if not k.lower().startswith("kafka.") and k.lower() not in allowed)
    if unknown:
        raise ValueError(f"unknown {role} option(s) {unknown}; the {role} takes kafka.* and "
                         f"{', '.join(sorted(known, key=str.lower))}")


def client_config(options: Mapping[str, str]) -> dict[str, Any]:
    """The librdkafka configuration carried by ``kafka.*`` options (prefix removed).

    ``kafka.bootstrap.servers`` is required. Settings the source or sink must own (transactional
    id, auto commit, partition EOF events) are rejected rather than silently overridden.
    """
    conf: dict[str, Any] = {}
    for key, value in options.items():
        if key.lower().startswith("kafka."):
            name = key[len("kafka."):]
            if name.lower() in _RESERVED:
                raise ValueError(f"option kafka.{name} is managed by oncelog and cannot be set")
            conf[name] = value
    if not conf.get("bootstrap.servers"):
        raise ValueError("option 'kafka.bootstrap.servers' is required")
    return conf


def check_client_config(conf: Mapping[str, Any], producer: bool) -> None:
    """Let librdkafka validate ``kafka.*`` settings now (names and values), naming the bad option."""
    from confluent_kafka import Consumer, KafkaException, Producer

    try:
        if producer:
            client: Any = Producer({k: v for k, v in conf.items() if k != "group.id"})
            client.flush(0)
        else:
            client = Consumer({"group.id": "oncelog-config-check", **conf})
            client.close()
    except (KafkaException, ValueError, TypeError) as exc:
        text = str(exc)
        named = re.search(r'property:? "?([\w.]+)"?', text)
        what = f"option kafka.{named.group(1)}" if named else "a kafka.* option"
        raise ValueError(f"{what} is not accepted by librdkafka: {text}") from None


def parse_offsets_spec(spec: str, name: str) -> str | dict[str, dict[int, int]]:
    """``earliest`` / ``latest`` or Spark's JSON form ``{"topic": {"0": 23, "1": -2}}``."""
    stripped = spec.strip()
    if stripped.lower() in ("earliest", "latest"):
        return stripped.lower()
    return parse_partition_json(stripped, name, "offset")


def parse_partition_json(spec: str, name: str, what: str) -> dict[str, dict[int, int]]:
    """Spark's per-partition JSON ``{"topic": {"0": n, ...}}`` with integer values."""
    try:
        raw = json.loads(spec)
    except json.JSONDecodeError as exc:
        hint = "earliest, latest or " if what == "offset" else ""
        raise ValueError(f"option {name!r}: expected {hint}JSON like {{\"topic\": {{\"0\": 23}}}}, got {spec!r}") \
            from exc
    if not isinstance(raw, dict) or not all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"option {name!r}: JSON must map topic -> {{partition: {what}}}, got {spec!r}")
    out: dict[str, dict[int, int]] = {}
    for topic, parts in raw.items():
        for p, v in parts.items():
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"option {name!r}: {what} of {topic}-{p} must be an integer, not {v!r}")
            try:
                out.setdefault(str(topic), {})[int(p)] = v
            except ValueError:
                raise ValueError(f"option {name!r}: partition {p!r} of {topic} is not a number") from None
    return out


def parse_assign(spec: str) -> dict[str, list[int]]:
    """Spark's ``assign`` JSON: ``{"topicA": [0, 1], "topicB": [2]}``."""
    try:
        raw = json.loads(spec)
    except json.JSONDecodeError:
        raw = None
    if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
        raise ValueError(f"option 'assign' must be JSON like {{\"topic\": [0, 1]}}, not {spec!r}")
    try:
        return {str(t): sorted(int(p) for p in parts) for t, parts in raw.items()}
    except (TypeError, ValueError):
        raise ValueError(f"option 'assign': partitions must be numbers, not {spec!r}") from None

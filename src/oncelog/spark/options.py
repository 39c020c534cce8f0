"""Option parsing shared by the `oncelog` Spark source and sink.

Option names follow Spark's Kafka connector: ``kafka.bootstrap.servers``, ``subscribe``,
``subscribePattern``, ``assign``, ``startingOffsets``, ``endingOffsets``, ``maxOffsetsPerTrigger``,
``failOnDataLoss``, ``includeHeaders``, ``topic``; every other ``kafka.*`` option is handed to
librdkafka without the prefix. Spark passes options case-insensitively, so lookups here are too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

#: Offsets inside ``startingOffsets`` / ``endingOffsets`` JSON, as in Spark's Kafka connector.
EARLIEST = -2
LATEST = -1

#: librdkafka settings owned by the source or sink: a ``kafka.*`` option may not override them.
_RESERVED = frozenset({"enable.auto.commit", "group.id", "transactional.id", "enable.partition.eof"})


def get_option(options: Mapping[str, str], name: str, default: str | None = None) -> str | None:
    """Case-insensitive lookup (Spark lower-cases some option maps, not all)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return default


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


def get_int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = get_option(options, name)
    return default if value is None or value == "" else int(value)


def client_config(options: Mapping[str, str]) -> dict[str, Any]:
    """The librdkafka configuration carried by ``kafka.*`` options (prefix removed).

    ``kafka.bootstrap.servers`` is required. Settings the source or sink must own (group id,
    transactional id, auto commit) are rejected rather than silently overridden.
    """
    conf: dict[str, Any] = {}
    for key, value in options.items():
        if key.lower().startswith("kafka."):
            name = key[len("kafka."):]
            if name in _RESERVED:
                raise ValueError(f"option kafka.{name} is managed by oncelog and cannot be set")
            conf[name] = value
    if not conf.get("bootstrap.servers"):
        raise ValueError("option 'kafka.bootstrap.servers' is required")
    return conf


def parse_offsets_spec(spec: str, name: str) -> str | dict[str, dict[int, int]]:
    """``earliest`` / ``latest`` or Spark's JSON form ``{"topic": {"0": 23, "1": -2}}``."""
    stripped = spec.strip()
    if stripped.lower() in ("earliest", "latest"):
        return stripped.lower()
    try:
        raw = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise ValueError(f"option {name!r}: expected earliest, latest or JSON, got {spec!r}") from exc
    if not isinstance(raw, dict):
        raise ValueError(f"option {name!r}: JSON must map topic -> {{partition: offset}}")
    return {str(t): {int(p): int(o) for p, o in parts.items()} for t, parts in raw.items()}


def parse_assign(spec: str) -> dict[str, list[int]]:
    """Spark's ``assign`` JSON: ``{"topicA": [0, 1], "topicB": [2]}``."""
    raw = json.loads(spec)
    if not isinstance(raw, dict):
        raise ValueError("option 'assign' must be JSON like {\"topic\": [0, 1]}")
    return {str(t): sorted(int(p) for p in parts) for t, parts in raw.items()}

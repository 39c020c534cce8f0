"""Per-log configuration, with Kafka's topic config names for CreateTopics and DescribeConfigs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from oncelog.storage.errors import InvalidConfigError

_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")

# Kafka topic config name -> (LogConfig field, parser)
TOPIC_CONFIGS: dict[str, str] = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.bytes": "retention_bytes",
    "retention.ms": "retention_ms",
    "segment.index.bytes": "segment_index_bytes",
    "index.interval.bytes": "index_interval_bytes",
    "flush.ms": "flush_interval_ms",
    "message.timestamp.type": "message_timestamp_type",
    "max.message.bytes": "max_message_bytes",
    "cleanup.policy": "cleanup_policy",
    "min.insync.replicas": "min_insync_replicas",
}


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024
    segment_ms: int = 7 * 24 * 3600 * 1000
    retention_bytes: int = -1
    retention_ms: int = 7 * 24 * 3600 * 1000
    segment_index_bytes: int = 10 * 1024 * 1024
    index_interval_bytes: int = 4096
    flush_interval_ms: int = 1000
    flush_every_append: bool = False
    message_timestamp_type: str = "CreateTime"
    max_message_bytes: int = 1024 * 1024 + 12
    cleanup_policy: str = "delete"
    min_insync_replicas: int = 1

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    def with_topic_configs(self, configs: dict[str, str | None]) -> LogConfig:
        """This config overridden by Kafka-named topic configs; InvalidConfigError on bad input."""
        changes: dict[str, object] = {}
        for name, raw in configs.items():
            if name not in TOPIC_CONFIGS:
                raise InvalidConfigError(f"unknown topic config {name!r}")
            if raw is None:
                continue
            field = TOPIC_CONFIGS[name]
            current = getattr(self, field)
            if isinstance(current, int) and not isinstance(current, bool):
                try:
                    value: object = int(raw)
                except ValueError:
                    raise InvalidConfigError(f"{name} must be an integer, got {raw!r}") from None
                if field in ("retention_bytes", "retention_ms"):
                    if int(raw) < -1:
                        raise InvalidConfigError(f"{name} must be >= -1")
                elif int(raw) < (14 if field == "segment_bytes" else 1 if field != "index_interval_bytes" else 0):
                    raise InvalidConfigError(f"{name} out of range: {raw}")
            elif field == "message_timestamp_type":
                if raw not in _TIMESTAMP_TYPES:
                    raise InvalidConfigError(f"{name} must be one of {_TIMESTAMP_TYPES}")
                value = raw
            elif field == "cleanup_policy":
                if raw != "delete":
                    raise InvalidConfigError("only cleanup.policy=delete is supported")
                value = raw
            else:
                value = raw
            changes[field] = value
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    def to_topic_configs(self, overrides: dict[str, str]) -> dict[str, tuple[str, bool]]:
        """Kafka name -> (value, is_default) for DescribeConfigs."""
        out: dict[str, tuple[str, bool]] = {}
        for name, field in TOPIC_CONFIGS.items():
            value = getattr(self, field)
            out[name] = (str(value).lower() if isinstance(value, bool) else str(value), name not in overrides)
        return out

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
    "min.insync.replicas": "min_insync_replicas",
}

# --- log compaction (the log cleaner) ---------------------------------------------------------------
_CLEANER_TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "cleanup_policy",
    "delete.retention.ms": "delete_retention_ms",
    "min.cleanable.dirty.ratio": "min_cleanable_dirty_ratio",
    "min.compaction.lag.ms": "min_compaction_lag_ms",
    "max.compaction.lag.ms": "max_compaction_lag_ms",
}
TOPIC_CONFIGS.update(_CLEANER_TOPIC_CONFIGS)
_LONG_MAX = 2**63 - 1


def _parse_cleaner_config(name: str, raw: str) -> object:
    """The value of one of the cleaner's topic configs, validated as Kafka validates it."""
    if name == "cleanup.policy":
        parts = [p.strip() for p in raw.split(",")]
        if not parts or any(p not in ("delete", "compact") for p in parts) or len(set(parts)) != len(parts):
            raise InvalidConfigError(f"cleanup.policy must be delete, compact or compact,delete; got {raw!r}")
        return ",".join(parts)
    if name == "min.cleanable.dirty.ratio":
        try:
            ratio = float(raw)
        except ValueError:
            raise InvalidConfigError(f"{name} must be a number, got {raw!r}") from None
        if not 0.0 <= ratio <= 1.0:
            raise InvalidConfigError(f"{name} must be between 0 and 1, got {raw!r}")
        return ratio
    try:
        value = int(raw)
    except ValueError:
        raise InvalidConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < (1 if name == "max.compaction.lag.ms" else 0) or value > _LONG_MAX:
        raise InvalidConfigError(f"{name} out of range: {raw}")
    return value
# --- end of log compaction ------------------------------------------------------------------------


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
    min_insync_replicas: int = 1
    # --- log compaction (Kafka's topic configs; the broker's log.cleaner.* give the defaults) -----
    cleanup_policy: str = "delete"  # "delete", "compact" or "compact,delete" (either order)
    delete_retention_ms: int = 24 * 3600 * 1000
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = _LONG_MAX

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy.split(",")

    @property
    def max_segment_ms(self) -> int:
        """Kafka's maxSegmentMs: a compacted log also rolls when max.compaction.lag.ms has passed,
        so a record never waits in the (never cleaned) active segment longer than that."""
        return min(self.segment_ms, self.max_compaction_lag_ms) if self.compact else self.segment_ms
    # --- end of log compaction --------------------------------------------------------------------

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
            if name in _CLEANER_TOPIC_CONFIGS:
                changes[field] = _parse_cleaner_config(name, raw)
                continue
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
            else:
                value = raw
            changes[field] = value
        result = dataclasses.replace(self, **changes)  # type: ignore[arg-type]
        if result.min_compaction_lag_ms > result.max_compaction_lag_ms:  # Kafka refuses this pair too
            raise InvalidConfigError("min.compaction.lag.ms must not exceed max.compaction.lag.ms")
        return result

    def to_topic_configs(self, overrides: dict[str, str]) -> dict[str, tuple[str, bool]]:
        """Kafka name -> (value, is_default) for DescribeConfigs."""
        out: dict[str, tuple[str, bool]] = {}
        for name, field in TOPIC_CONFIGS.items():
            value = getattr(self, field)
            out[name] = (str(value).lower() if isinstance(value, bool) else str(value), name not in overrides)
        return out

"""Topic lookup with optional auto-creation (Kafka's auto.create.topics.enable, off by default)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.storage import errors as storage_errors

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")


def ensure_topic(broker: Broker, name: str, *, auto_create: bool = True) -> tuple[Any, ErrorCode]:
    """(TopicInfo, NONE) if the topic exists or was auto-created, else (None, error)."""
    info = broker.logs.topics().get(name)
    if info is not None:
        return info, ErrorCode.none
    if broker.logs.is_being_created(name):
        return None, ErrorCode.leader_not_available  # a CreateTopics is building it: retriable
    if not (auto_create and broker.config.auto_create_topics_enable):
        return None, ErrorCode.unknown_topic_or_partition
    try:
        info = broker.logs.create_topic(name, broker.config.num_partitions, {})
    except storage_errors.InvalidTopicError:
        return None, ErrorCode.invalid_topic_exception
    except storage_errors.TopicExistsError:
        info = broker.logs.topics()[name]
    log.info("auto-created topic %s with %d partition(s)", name, info.num_partitions)
    return info, ErrorCode.none


def topic_error(name: str, error: ErrorCode) -> dict[str, Any]:
    return {"error_code": error, "name": name, "is_internal": False, "partitions": []}

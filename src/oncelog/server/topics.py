"""Topic lookup with optional auto-creation (Kafka's auto.create.topics.enable, off by default)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.storage import errors as storage_errors
from oncelog.storage.log_manager import validate_topic_name

if TYPE_CHECKING:
    from collections.abc import Callable

    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

CLUSTER_METADATA_TOPIC = "__cluster_metadata"  # Kafka's metadata log (Topic.CLUSTER_METADATA_TOPIC_NAME): never made


def ensure_topic(broker: Broker, name: str, *, may_create: Callable[[], bool] | None) -> tuple[Any, ErrorCode]:
    """(TopicInfo, NONE) if the topic exists or was auto-created, else (None, error).

    ``may_create`` (the authorizer's CREATE check; None: this request may never create) is asked only
    when the topic is missing and auto-creation is on, as Kafka checks CREATE only for a topic it
    would create, so a produce to an existing topic costs no CREATE decisions.

    A missing topic that this request may never create (Metadata without auto-creation) is
    INVALID_TOPIC_EXCEPTION if its name is not a legal one, as Kafka's getTopicMetadata validates it;
    ``__cluster_metadata`` is never auto-created (Kafka's controller refuses to create it)."""
    info = broker.logs.topics().get(name)
    if info is not None:
        return info, ErrorCode.none
    if broker.logs.is_being_created(name):
        return None, ErrorCode.leader_not_available  # a CreateTopics is building it: retriable
    if may_create is None:
        try:
            validate_topic_name(name)
        except storage_errors.InvalidTopicError:
            return None, ErrorCode.invalid_topic_exception
        return None, ErrorCode.unknown_topic_or_partition
    if not broker.config.auto_create_topics_enable or name == CLUSTER_METADATA_TOPIC or not may_create():
        return None, ErrorCode.unknown_topic_or_partition
    try:
        info = broker.logs.create_topic(name, broker.config.num_partitions, {})
    except storage_errors.InvalidTopicError:
        return None, ErrorCode.invalid_topic_exception
    except storage_errors.InvalidPartitionsError as exc:
        log.warning("not auto-creating topic %s: %s", name, exc)
        return None, ErrorCode.invalid_partitions
    except storage_errors.PartitionsNotBuiltError as exc:
        log.warning("could not auto-create topic %s: %s", name, exc)
        return None, ErrorCode.kafka_storage_error
    except storage_errors.TopicExistsError:
        info = broker.logs.topics()[name]
    log.info("auto-created topic %s with %d partition(s)", name, info.num_partitions)
    return info, ErrorCode.none


def topic_error(name: str, error: ErrorCode) -> dict[str, Any]:
    return {"error_code": error, "name": name, "is_internal": False, "partitions": []}

"""CreateTopics, DeleteTopics and CreatePartitions (DescribeConfigs and the AlterConfigs are in
``configs``, DeleteRecords and DescribeLogDirs in ``records``).

A single node: replication factor must be -1 or 1, manual replica assignments may only name this
broker. Internal topics (``__transaction_state``, ``__consumer_offsets``) cannot be deleted.

Request checks are Kafka's (ControllerApis, ReplicationControlManager): a topic named twice in one
CreateTopics or CreatePartitions is answered once, INVALID_REQUEST "Duplicate topic name.", and
nothing is done for it; ``__cluster_metadata`` (Kafka's metadata log) is INVALID_REQUEST; a manual
assignment goes with num_partitions and replication_factor -1 (else INVALID_REQUEST), names each
partition 0..n-1 once, and each partition's replicas are this broker once
(INVALID_REPLICA_ASSIGNMENT); CreatePartitions' assignments are one per new partition, checked alike.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request
from oncelog.server.answers import AnsweredWhenDurable
from oncelog.server.authz import Op, R, allowed, create_topic_allowed
from oncelog.server.topics import CLUSTER_METADATA_TOPIC
from oncelog.storage import errors as storage_errors
from oncelog.storage.config import describe_topic_configs, normalized_topic_config
from oncelog.storage.log_manager import DetachedTopic

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

DUPLICATE_TOPIC = "Duplicate topic name."


def short_message(text: str) -> str:
    """An error message that always encodes: messages may quote a client's string (a config or topic
    name of 32,767 characters), and a legacy (non-flexible) string holds at most 32,767 bytes."""
    return text if len(text) <= 1000 else text[:1000] + "..."


def _message(exc: Exception) -> str:
    return short_message(str(exc))


def _storage_error(exc: Exception) -> ErrorCode:
    if isinstance(exc, storage_errors.TopicExistsError):
        return ErrorCode.topic_already_exists
    if isinstance(exc, storage_errors.InvalidTopicError):
        return ErrorCode.invalid_topic_exception
    if isinstance(exc, storage_errors.InvalidPartitionsError):
        return ErrorCode.invalid_partitions
    if isinstance(exc, storage_errors.InvalidConfigError):
        return ErrorCode.invalid_config
    if isinstance(exc, storage_errors.PartitionsNotBuiltError | storage_errors.DiskFullError):
        return ErrorCode.kafka_storage_error
    return ErrorCode.unknown_server_error


def _created_configs(broker: Broker, overrides: dict[str, str]) -> list[dict[str, Any]]:
    """CreateTopics v5+: the new topic's configs as DescribeConfigs would show them."""
    return [{"name": d.name, "value": d.value, "read_only": False, "config_source": int(d.source),
             "is_sensitive": False}
            for d in describe_topic_configs(overrides, broker.logs.broker_configs)]


async def handle_create_topics(broker: Broker, req: Request) -> dict[str, Any]:
    """Topics in request order; each one's directories and files are made off the event loop
    (``create_topic_off_loop``), so a topic of 1,000 partitions does not stall other clients.

    A topic is created with CREATE on the cluster or on it; its configs, partition count and
    replication factor are returned only with DESCRIBE_CONFIGS on it, else ``topic_config_error_code``
    is TOPIC_AUTHORIZATION_FAILED (Kafka's ReplicationControlManager.createTopic)."""
    body = req.body
    validate_only = getattr(body, "validate_only", False)
    out = []
    counts = Counter(t.name for t in body.topics)
    seen: set[str] = set()
    for t in body.topics:
        entry: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None,
                                 "num_partitions": -1, "replication_factor": -1, "configs": None}
        n = t.num_partitions if t.num_partitions != -1 else broker.config.num_partitions
        # a null value stays null: validation refuses it with Kafka's message
        configs: dict[str, Any] = {c.name: c.value if c.value is None else normalized_topic_config(c.name, c.value)
                                   for c in t.configs}
        if counts[t.name] > 1:
            if t.name in seen:
                continue  # answered once, where it first appears
            entry.update(error_code=ErrorCode.invalid_request, error_message=DUPLICATE_TOPIC)
        elif t.name == CLUSTER_METADATA_TOPIC:
            entry.update(error_code=ErrorCode.invalid_request,
                         error_message=f"Creation of internal topic {CLUSTER_METADATA_TOPIC} is prohibited.")
        elif not create_topic_allowed(broker, req, t.name):
            entry.update(error_code=ErrorCode.topic_authorization_failed)
        elif t.assignments:
            code, message, n = _check_create_assignments(broker, t)
            entry.update(error_code=code, error_message=message)
        elif t.replication_factor not in (-1, 1):
            entry.update(error_code=ErrorCode.invalid_replication_factor,
                         error_message="replication factor must be 1 on a single-node cluster")
        if entry["error_code"] == ErrorCode.none and n <= 0:
            entry.update(error_code=ErrorCode.invalid_partitions, error_message="partitions must be >= 1")
        seen.add(t.name)
        if entry["error_code"] == ErrorCode.none:
            try:
                if validate_only:
                    broker.logs.validate_new_topic(t.name, n, configs)
                    entry.update(num_partitions=n, replication_factor=1)
                else:
                    info = await create_topic_off_loop(broker, t.name, n, configs)
                    entry.update(topic_id=info.topic_id, num_partitions=info.num_partitions,
                                 replication_factor=1)
                    log.info("created topic %s with %d partition(s)", t.name, n)
                if allowed(broker, req, Op.DESCRIBE_CONFIGS, R.TOPIC, t.name):
                    entry["configs"] = _created_configs(broker, configs)
                else:
                    entry.update(num_partitions=-1, replication_factor=-1, configs=[],
                                 topic_config_error_code=ErrorCode.topic_authorization_failed)
            except storage_errors.StorageError as exc:
                entry.update(error_code=_storage_error(exc), error_message=_message(exc))
        out.append(entry)
    return {"throttle_time": 0, "topics": out}


def _check_create_assignments(broker: Broker, t: Any) -> tuple[ErrorCode, str | None, int]:
    """(error, message, partition count) of a CreateTopics entry with a manual assignment (Kafka's
    ReplicationControlManager.createTopic)."""
    if t.replication_factor != -1:
        return (ErrorCode.invalid_request,
                "A manual partition assignment was specified, but replication factor was not set to -1.", 0)
    if t.num_partitions != -1:
        return (ErrorCode.invalid_request,
                "A manual partition assignment was specified, but numPartitions was not set to -1.", 0)
    indexes: set[int] = set()
    for a in t.assignments:
        if a.partition_index in indexes:
            return (ErrorCode.invalid_replica_assignment,
                    f"Found multiple manual partition assignments for partition {a.partition_index}", 0)
        indexes.add(a.partition_index)
        if (why := _replicas_error(broker, list(a.broker_ids))) is not None:
            return ErrorCode.invalid_replica_assignment, why, 0
    if indexes != set(range(len(indexes))):
        return ErrorCode.invalid_replica_assignment, "partitions should be a consecutive 0-based integer sequence", 0
    return ErrorCode.none, None, len(indexes)


def _replicas_error(broker: Broker, replicas: list[int]) -> str | None:
    """Why one partition's manual replica list is refused (Kafka's validateManualPartitionAssignment,
    on a cluster of this one broker, so the replication factor is 1 throughout), or None."""
    if not replicas:
        return "The manual partition assignment includes an empty replica list."
    for b in sorted(replicas):
        if b != broker.config.node_id:
            return f"The manual partition assignment includes broker {b}, but no such broker is registered."
    if len(replicas) > 1:
        return f"The manual partition assignment includes the broker {replicas[0]} more than once."
    return None


async def create_topic_off_loop(broker: Broker, name: str, num_partitions: int, configs: dict[str, str]) -> Any:
    """Reserve the name (validation errors raise here, on the loop), build the partitions on a
    worker thread, then register the topic on the loop. The build and registration run as a task
    of their own: a client that hangs up does not leave a half-made topic behind (Kafka, too,
    finishes a creation whose requester went away); the name is released if the build fails."""
    logs = broker.logs
    cfg = logs.reserve_topic(name, num_partitions, configs)

    async def build_and_register() -> Any:
        try:
            parts = await asyncio.get_running_loop().run_in_executor(
                None, logs.build_partitions, name, num_partitions, cfg)
        except BaseException:
            logs.release_topic(name)
            raise
        return logs.register_topic(name, configs, parts)

    return await asyncio.shield(asyncio.ensure_future(build_and_register()))


_NO_TOPIC_ID = uuid.UUID(int=0)


def _topics_to_delete(broker: Broker, body: Any) -> list[tuple[str | None, uuid.UUID | None, str | None]]:
    """The request's topics as (name, id, why it is refused), Kafka's checks of ControllerApis'
    deleteTopics: an entry (v6+) names a topic or gives its id, never both, never neither; a name or
    id given twice is refused once, as "Duplicate". Ids are resolved to the names they stand for
    now (an unknown id: name None). Answered in request order, a duplicate where it first appears."""
    if hasattr(body, "topics"):  # kio reads the zero id (no id) as None
        by_id = {info.topic_id: name for name, info in broker.logs.topics().items()}
        given = [(t.name, t.topic_id or _NO_TOPIC_ID) for t in body.topics]
    else:
        by_id, given = {}, [(n, _NO_TOPIC_ID) for n in body.topic_names]
    counts = Counter(name if name is not None else topic_id for name, topic_id in given)
    out: list[tuple[str | None, uuid.UUID | None, str | None]] = []
    seen: set[object] = set()
    for name, topic_id in given:
        key = name if name is not None else topic_id
        if name is None and topic_id == _NO_TOPIC_ID:
            out.append((None, topic_id, "Neither topic name nor id were specified."))
        elif name is not None and topic_id != _NO_TOPIC_ID:
            out.append((name, topic_id, "You may not specify both topic name and topic id."))
        elif counts[key] > 1:
            if key not in seen:
                seen.add(key)
                out.append((name, topic_id if name is None else _NO_TOPIC_ID,
                             f"Duplicate topic {'name' if name is not None else 'id'}."))
        else:
            out.append((name if name is not None else by_id.get(topic_id), topic_id, None))
    return out


def handle_delete_topics(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """DeleteTopics. A deleted topic's committed offsets go with it, in every group (Kafka's
    onPartitionsDeleted): the answer waits until their tombstones are durable, so that a topic made
    again under the same name never starts its consumers at the old topic's offsets. Its files are
    removed off the event loop, before the answer (``_remove_topics``).

    Authorization is ControllerApis.deleteTopics': DELETE on the cluster authorizes every topic;
    otherwise a topic the caller may not DESCRIBE answers TOPIC_AUTHORIZATION_FAILED before its
    existence is looked at, and its name is left out when it was given by id; a topic it may
    DESCRIBE but not DELETE answers TOPIC_AUTHORIZATION_FAILED once known to exist."""
    may_delete_any = allowed(broker, req, Op.DELETE, R.CLUSTER)
    out = []
    waits: list[AnsweredWhenDurable] = []
    detached: list[DetachedTopic] = []
    for name, topic_id, invalid in _topics_to_delete(broker, req.body):
        entry: dict[str, Any] = {"name": name, "topic_id": topic_id, "error_code": ErrorCode.none,
                                 "error_message": None}
        info = broker.logs.topics().get(name) if name else None
        if invalid is not None:
            entry.update(error_code=ErrorCode.invalid_request, error_message=invalid)
        elif name is None:
            entry["error_code"] = ErrorCode.unknown_topic_id
        elif not (may_delete_any or allowed(broker, req, Op.DESCRIBE, R.TOPIC, name)):
            entry.update(name=None if topic_id != _NO_TOPIC_ID else name,
                         error_code=ErrorCode.topic_authorization_failed)
        elif info is None:
            entry["error_code"] = ErrorCode.unknown_topic_or_partition
        elif not (may_delete_any or allowed(broker, req, Op.DELETE, R.TOPIC, name)):
            entry["error_code"] = ErrorCode.topic_authorization_failed
        elif info.is_internal:
            entry.update(error_code=ErrorCode.invalid_topic_exception,
                         error_message="internal topics cannot be deleted")
        else:
            entry["topic_id"] = info.topic_id
            try:
                detached.append(broker.logs.detach_topic(name))
            except storage_errors.DiskFullError as exc:  # topics.json not rewritten: the topic stays
                entry.update(error_code=ErrorCode.kafka_storage_error, error_message=str(exc))
                out.append(entry)
                continue
            for p in range(info.num_partitions):
                broker.notify_append((name, p))
            if (wait := broker.coordination.on_topic_deleted(name)) is not None:
                waits.append(wait)
            log.info("deleted topic %s", name)
        out.append(entry)
    response = {"throttle_time": 0, "responses": out}
    if not detached:
        return response
    removal = asyncio.ensure_future(_remove_topics(broker, detached, waits))
    removal.add_done_callback(_log_removal_failure)
    return _answer_after(removal, response)


async def _remove_topics(broker: Broker, detached: list[DetachedTopic], waits: list[AnsweredWhenDurable]) -> None:
    """The deleted topics' files removed on a worker thread, their names then released, and the
    offsets' tombstones durable. Started by the handler as a task of its own, so it runs to its end
    whether or not the answer is ever awaited: a client that hangs up (its answer dropped unawaited,
    or cancelled while waiting) leaves no name taken and no file behind."""
    logs = broker.logs
    loop = asyncio.get_running_loop()
    for topic in detached:
        try:
            await loop.run_in_executor(None, logs.remove_topic_files, topic)
        finally:
            logs.release_topic(topic.name)
    for wait in waits:
        await wait


def _log_removal_failure(removal: asyncio.Future[None]) -> None:
    if not removal.cancelled() and (exc := removal.exception()) is not None:
        log.error("removing the files of deleted topics failed", exc_info=exc)


async def _answer_after(removal: asyncio.Future[None], response: dict[str, Any]) -> dict[str, Any]:
    """DeleteTopics' answer, once ``removal`` is done (a cancelled wait leaves it running)."""
    await asyncio.shield(removal)
    return response


def handle_create_partitions(broker: Broker, req: Request) -> dict[str, Any]:
    """CreatePartitions, checked in Kafka's order: a duplicate name, authorization, the topic, the
    new count, then the manual assignments (one per new partition, each this broker once)."""
    body = req.body
    out = []
    counts = Counter(t.name for t in body.topics)
    seen: set[str] = set()
    for t in body.topics:
        entry: dict[str, Any] = {"name": t.name, "error_code": ErrorCode.none, "error_message": None}
        info = broker.logs.topics().get(t.name)
        if counts[t.name] > 1:
            if t.name in seen:
                continue  # answered once, where it first appears
            seen.add(t.name)
            entry.update(error_code=ErrorCode.invalid_request, error_message=DUPLICATE_TOPIC)
        elif not allowed(broker, req, Op.ALTER, R.TOPIC, t.name):
            entry["error_code"] = ErrorCode.topic_authorization_failed
        elif info is None:
            entry["error_code"] = ErrorCode.unknown_topic_or_partition
        elif info.is_internal:
            entry.update(error_code=ErrorCode.invalid_topic_exception, error_message="internal topic")
        elif t.count == info.num_partitions:
            entry.update(error_code=ErrorCode.invalid_partitions,
                         error_message=f"Topic already has {info.num_partitions} partition(s).")
        elif t.count < info.num_partitions:
            entry.update(error_code=ErrorCode.invalid_partitions,
                         error_message=f"The topic {t.name} currently has {info.num_partitions} partition(s); "
                                       f"{t.count} would not be an increase.")
        elif t.assignments is not None and len(t.assignments) != t.count - info.num_partitions:
            entry.update(error_code=ErrorCode.invalid_replica_assignment,
                         error_message=f"Attempted to add {t.count - info.num_partitions} additional partition(s), "
                                       f"but only {len(t.assignments)} assignment(s) were specified.")
        elif t.assignments is not None and (why := next(
                (w for a in t.assignments if (w := _replicas_error(broker, list(a.broker_ids))) is not None),
                None)) is not None:
            entry.update(error_code=ErrorCode.invalid_replica_assignment, error_message=why)
        else:
            try:
                if body.validate_only:
                    broker.logs.validate_new_partitions(t.name, t.count)
                else:
                    broker.logs.create_partitions(t.name, t.count)
            except storage_errors.StorageError as exc:
                entry.update(error_code=_storage_error(exc), error_message=_message(exc))
        out.append(entry)
    return {"throttle_time": 0, "results": out}

"""ApiVersions, Metadata and DescribeCluster: how clients discover the broker and its topics.

The broker reports itself as the only node, leader of every partition, with its leader epoch
(bumped at each start, see ``leader_epochs``): clients use it to detect a log that lost its tail.

Metadata answers are cached encoded (``MetadataCache``): a 1,000-partition topic takes about 18 ms
to build and encode, and librdkafka asks again for every partition whose records time out, so under
overload uncached answers ate the broker (a 100-producer run spent 95% of its CPU on them).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import EncodedResponse, Request, build_response, encode_response
from oncelog.protocol.versions import API_API_VERSIONS, API_METADATA
from oncelog.server.authz import (
    Op,
    R,
    allowed,
    authorized_operations,
    cluster_authorized_operations,
    create_topic_allowed,
    principal_and_host,
)
from oncelog.server.topics import ensure_topic, topic_error

if TYPE_CHECKING:
    from oncelog.server.broker import Broker


def handle_api_versions(broker: Broker, req: Request) -> EncodedResponse:
    """The answer depends only on the request's version and the broker's supported versions (fixed
    at start), so each version's frame is encoded once: kio's generic writer took 0.5 ms of broker
    CPU for the 60-odd entries, and every client connection asks first."""
    cached = broker.api_versions_answers.get(req.api_version)
    if cached is None:
        body = build_response(API_API_VERSIONS, req.api_version, {
            "error_code": ErrorCode.none, "api_keys": broker.api_version_entries(), "throttle_time": 0})
        cached = EncodedResponse(encode_response(API_API_VERSIONS, req.api_version, 0, body))
        broker.api_versions_answers[req.api_version] = cached
    return cached


def _broker_entry(broker: Broker) -> dict[str, Any]:
    host, port = broker.config.advertised
    return {"node_id": broker.config.node_id, "host": host, "port": port, "rack": None,
            "broker_id": broker.config.node_id}


def topic_metadata(broker: Broker, req: Request, name: str, info: Any) -> dict[str, Any]:
    node = broker.config.node_id
    want_ops = bool(getattr(req.body, "include_topic_authorized_operations", False))
    return {
        "error_code": ErrorCode.none, "name": name, "topic_id": info.topic_id, "is_internal": info.is_internal,
        "partitions": [{"error_code": ErrorCode.none, "partition_index": p, "leader_id": node,
                        "leader_epoch": broker.logs.leader_epoch,
                        "replica_nodes": [node], "isr_nodes": [node], "offline_replicas": []}
                       for p in range(info.num_partitions)],
        "topic_authorized_operations": authorized_operations(broker, req, R.TOPIC, name, want_ops),
    }


class MetadataCache:
    """Encoded Metadata answers keyed by everything an answer is computed from: the request's
    version, topics and flags; the principal and host and the ACLs' generation when an authorizer is
    on; the leader epoch; and, for each topic in the answer, its name, id, partition count and
    internal flag. A key therefore changes whenever the answer would, and a stale entry is never
    served. Only answers about existing topics are cached (no auto-creation, no error path).
    Bounded: cleared before it would hold more than ``MAX_ENTRIES`` answers or ``MAX_BYTES``."""

    MAX_ENTRIES = 256
    MAX_BYTES = 32 * 1024 * 1024

    def __init__(self) -> None:
        self.entries: dict[tuple[Any, ...], EncodedResponse] = {}
        self.bytes = 0

    def key(self, broker: Broker, req: Request) -> tuple[Any, ...] | None:
        body = req.body
        all_topics = broker.logs.topics()
        requested = body.topics
        if requested is None or (req.api_version == 0 and len(requested) == 0):
            infos: Any = sorted(all_topics.items())
            names: Any = None
        else:
            names = []
            for t in requested:
                if t.name is None or t.name not in all_topics:
                    return None
                names.append(t.name)
            infos = [(n, all_topics[n]) for n in names]
        authorizer = broker.authorizer
        who = None if authorizer is None else (*principal_and_host(req), authorizer.generation)
        return (req.api_version, None if names is None else tuple(names),
                getattr(body, "allow_auto_topic_creation", True),
                bool(getattr(body, "include_topic_authorized_operations", False)),
                bool(getattr(body, "include_cluster_authorized_operations", False)),
                who, broker.logs.leader_epoch,
                tuple((n, info.topic_id, info.num_partitions, info.is_internal) for n, info in infos))

    def get(self, key: tuple[Any, ...] | None) -> EncodedResponse | None:
        return None if key is None else self.entries.get(key)

    def put(self, key: tuple[Any, ...], response: EncodedResponse) -> None:
        size = len(response)
        if size > self.MAX_BYTES:
            return
        if len(self.entries) >= self.MAX_ENTRIES or self.bytes + size > self.MAX_BYTES:
            self.entries.clear()
            self.bytes = 0
        self.entries[key] = response
        self.bytes += size


def handle_metadata(broker: Broker, req: Request) -> dict[str, Any] | EncodedResponse:
    """Served from ``broker.metadata_cache`` when the same answer was computed before; otherwise
    computed, and cached when it has a key. A key exists only when every named topic exists, so
    computing such an answer creates nothing and changes nothing the key holds."""
    cache: MetadataCache = broker.metadata_cache
    key = cache.key(broker, req)
    hit = cache.get(key)
    if hit is not None:
        return hit
    data = compute_metadata(broker, req)
    if key is None:
        return data
    encoded = EncodedResponse(encode_response(API_METADATA, req.api_version, 0,
                                              build_response(API_METADATA, req.api_version, data)))
    cache.put(key, encoded)
    return encoded


def compute_metadata(broker: Broker, req: Request) -> dict[str, Any]:
    """Kafka's handleTopicMetadataRequest: topics the principal may not DESCRIBE are left out of an
    all-topics answer and answered TOPIC_AUTHORIZATION_FAILED when named; a named topic that is
    missing and would be auto-created answers TOPIC_AUTHORIZATION_FAILED without CREATE on the
    cluster or the topic; ``cluster_authorized_operations`` (v8-10) is 0 without DESCRIBE on the
    cluster."""
    body = req.body
    requested = body.topics
    topics_out: list[dict[str, Any]] = []
    all_topics = broker.logs.topics()
    if requested is None or (req.api_version == 0 and len(requested) == 0):
        for name, info in sorted(all_topics.items()):
            if allowed(broker, req, Op.DESCRIBE, R.TOPIC, name):
                topics_out.append(topic_metadata(broker, req, name, info))
    else:
        allow_auto = getattr(body, "allow_auto_topic_creation", True)
        for t in requested:
            name = t.name
            if name is None and req.api_version < 12:
                # Only v12 responses may carry a null name; Kafka refuses null names below v12.
                topics_out.append({"error_code": ErrorCode.invalid_request, "name": "",
                                   "topic_id": t.topic_id, "partitions": []})
                continue
            if name is None:  # v12 lookup by topic id
                by_id = {info.topic_id: (n, info) for n, info in all_topics.items()}
                found = by_id.get(t.topic_id)
                if found is None:
                    topics_out.append({"error_code": ErrorCode.unknown_topic_id, "name": None,
                                       "topic_id": t.topic_id, "partitions": []})
                elif not allowed(broker, req, Op.DESCRIBE, R.TOPIC, found[0]):
                    topics_out.append({"error_code": ErrorCode.topic_authorization_failed, "name": None,
                                       "topic_id": t.topic_id, "partitions": []})
                else:
                    topics_out.append(topic_metadata(broker, req, *found))
                continue
            if not allowed(broker, req, Op.DESCRIBE, R.TOPIC, name):
                topics_out.append(topic_error(name, ErrorCode.topic_authorization_failed))
                continue
            may_auto_create = allow_auto and broker.config.auto_create_topics_enable
            if may_auto_create and name not in all_topics and not create_topic_allowed(broker, req, name):
                topics_out.append(topic_error(name, ErrorCode.topic_authorization_failed))
                continue
            info, err = ensure_topic(broker, name, may_create=partial(create_topic_allowed, broker, req, name)
                                     if may_auto_create else None)
            if info is None:
                topics_out.append(topic_error(name, err))
            else:
                topics_out.append(topic_metadata(broker, req, name, info))
    want_cluster_ops = bool(getattr(body, "include_cluster_authorized_operations", False))
    return {
        "throttle_time": 0,
        "brokers": [_broker_entry(broker)],
        "cluster_id": broker.config.cluster_id,
        "controller_id": broker.config.node_id,
        "topics": topics_out,
        "cluster_authorized_operations": cluster_authorized_operations(broker, req, want_cluster_ops),
    }


def handle_describe_cluster(broker: Broker, req: Request) -> dict[str, Any]:
    """Answered for every principal (Kafka's AuthHelper.computeDescribeClusterResponse checks
    nothing); only ``cluster_authorized_operations`` depends on the caller's ACLs."""
    want_ops = bool(getattr(req.body, "include_cluster_authorized_operations", False))
    return {
        "throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
        "endpoint_type": 1, "cluster_id": broker.config.cluster_id,
        "controller_id": broker.config.node_id, "brokers": [_broker_entry(broker)],
        "cluster_authorized_operations": cluster_authorized_operations(broker, req, want_ops),
    }

"""Cached Metadata answers (handlers/metadata.MetadataCache) against answers computed afresh.

A random sequence of what changes an answer (topics created, grown, deleted and re-created under
the same name, ACLs added and removed) interleaved with Metadata requests of every version, from
different principals, for all topics or named ones (some unknown, auto-created or not): every
answer the broker gives must be byte for byte the one computed without the cache right after.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.messages import build, decode_request, encode_request, encode_result, request_type
from oncelog.protocol.versions import API_METADATA
from oncelog.security.acl import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from oncelog.server.handlers.metadata import compute_metadata, handle_metadata
from tests.inproc import InProcessBroker, Session

NAMES = ["a", "b", "c"]
PRINCIPALS = ["User:admin", "User:alice", "User:bob"]
# every request is asked after every change, so each cached answer is checked once its inputs moved
REQUESTS = [(version, principal, names, auto) for version in (0, 1, 9, 12) for principal in PRINCIPALS
            for names in (None, ["a"], ["a", "c"]) for auto in (False, True)]
change = st.one_of(
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.integers(1, 4)),
    st.tuples(st.just("grow"), st.sampled_from(NAMES), st.integers(1, 3)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    st.tuples(st.just("allow"), st.sampled_from(PRINCIPALS[1:]), st.sampled_from(NAMES)),
    st.tuples(st.just("revoke"), st.sampled_from(PRINCIPALS[1:])),
)


def _metadata_request(b: InProcessBroker, version: int, principal: str, names: list[str] | None,
                      auto: bool, ops: bool = True) -> object:
    fields: dict[str, object] = {"topics": None if names is None else [{"name": n, "topic_id": None} for n in names]}
    if version == 0 and names is None:
        fields["topics"] = []  # v0: an empty list means every topic
    if version >= 4:
        fields["allow_auto_topic_creation"] = auto
    if version >= 8:
        fields["include_topic_authorized_operations"] = ops
    if 8 <= version <= 10:
        fields["include_cluster_authorized_operations"] = ops
    frame = encode_request(API_METADATA, version, 1, build(request_type(API_METADATA, version), fields))
    return dataclasses.replace(decode_request(frame[4:], b.broker.supported_versions), session=Session(principal))


def _check_every_request(b: InProcessBroker, after: object) -> None:
    for corr, (version, principal, names, auto) in enumerate(REQUESTS):
        req = _metadata_request(b, version, principal, names, auto)
        got = encode_result(API_METADATA, version, corr, handle_metadata(b.broker, req))  # type: ignore[arg-type]
        fresh = encode_result(API_METADATA, version, corr, compute_metadata(b.broker, req))  # type: ignore[arg-type]
        assert got == fresh, (after, version, principal, names, auto)


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(change, min_size=1, max_size=12))
def test_cached_answers_are_the_answers(tmp_path_factory: object, steps: list[tuple]) -> None:
    tmp: Path = tmp_path_factory.mktemp("d")  # type: ignore[attr-defined]
    b = InProcessBroker(tmp / "d", authorizer_enabled=True, super_users="User:admin")
    logs, authorizer = b.broker.logs, b.broker.authorizer
    assert authorizer is not None
    logs.create_topic("a", 2, {})
    try:
        _check_every_request(b, "start")
        for step in steps:
            kind = step[0]
            if kind == "create" and step[1] not in logs.topics():
                logs.create_topic(step[1], step[2], {})
            elif kind == "grow" and step[1] in logs.topics():
                logs.create_partitions(step[1], logs.topics()[step[1]].num_partitions + step[2])
            elif kind == "delete" and step[1] in logs.topics():
                logs.delete_topic(step[1])
            elif kind == "allow":
                authorizer.create([AclBinding(ResourceType.TOPIC, step[2], PatternType.LITERAL, step[1], "*",
                                              Operation.DESCRIBE, Permission.ALLOW)])
            elif kind == "revoke":
                authorizer.delete([AclFilter(principal=step[1])])
            _check_every_request(b, step)
    finally:
        b.close()


def test_a_repeated_request_is_served_from_the_cache(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d")
    b.broker.logs.create_topic("wide", 1000, {})
    try:
        req = _metadata_request(b, 12, "User:ANONYMOUS", ["wide"], False, False)
        first = handle_metadata(b.broker, req)  # type: ignore[arg-type]
        assert handle_metadata(b.broker, req) is first  # type: ignore[arg-type]
        b.broker.logs.create_partitions("wide", 1001)
        grown = b.call(API_METADATA, 12, {"topics": [{"name": "wide", "topic_id": None}],
                                          "allow_auto_topic_creation": False})
        assert len(grown.topics[0].partitions) == 1001
    finally:
        b.close()


def test_the_cache_is_bounded_in_answers_and_bytes(tmp_path: Path) -> None:
    from oncelog.server.handlers.metadata import MetadataCache

    b = InProcessBroker(tmp_path / "d")
    try:
        for i in range(40):
            b.broker.logs.create_topic(f"t{i}", 8, {})
        cache: MetadataCache = b.broker.metadata_cache
        cache.MAX_BYTES = 4 * 1024  # type: ignore[misc]
        for i in range(40):
            handle_metadata(b.broker, _metadata_request(b, 12, "User:x", [f"t{i}", f"t{(i + 1) % 40}"], False))  # type: ignore[arg-type]
            assert cache.bytes <= cache.MAX_BYTES
            assert cache.bytes == sum(len(r) for r in cache.entries.values())
        cache.MAX_BYTES = MetadataCache.MAX_BYTES  # type: ignore[misc]
        for i in range(MetadataCache.MAX_ENTRIES + 10):  # distinct keys: the entry bound clears it
            names = [f"t{i % 40}", f"t{(i // 40) % 40}"]
            handle_metadata(b.broker, _metadata_request(b, 1 + i % 12, "User:x", names, False))  # type: ignore[arg-type]
            assert 0 < len(cache.entries) <= MetadataCache.MAX_ENTRIES
    finally:
        b.close()

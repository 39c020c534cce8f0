"""Lengths are checked before kio parses a request: one small frame declaring a huge array used to make
kio's native reader allocate ~147 GB and abort the broker."""

from __future__ import annotations

import dataclasses
import datetime
import random
import subprocess
import sys
import types
import typing
import uuid

import pytest

from oncelog.protocol.bounds import check_lengths
from oncelog.protocol.errors import MalformedRequestError
from oncelog.protocol.messages import build, decode_request, decode_with_kio, encode_request, request_type
from oncelog.protocol.versions import SUPPORTED_VERSIONS

# Frames the random-body fuzz test found (DescribeTransactions v0, ListTransactions v1): each aborted
# the process inside kio before the check existed.
KILLERS = [
    "00410000000001de000466757a7a0086d8a7d944040f50c223ba2557c250d2eca2dafbec75a14607e02830778e1cad48"
    "1510aa57be73bf18ee2b16",
    "00420001000001e4000466757a7a00ddb6a6e85496a7310f205100de0df5adaf680bf2f50e7630442e79",
]

ALL_VERSIONS = [(k, v) for k, (lo, hi) in sorted(SUPPORTED_VERSIONS.items()) for v in range(lo, hi + 1)]


def test_the_frames_that_killed_the_broker_are_refused_in_a_child_process() -> None:
    code = ("import sys\nfrom oncelog.protocol.messages import decode_request\n"
            "from oncelog.protocol.errors import MalformedRequestError\n"
            "for h in sys.argv[1:]:\n"
            "    try:\n        decode_request(bytes.fromhex(h))\n    except MalformedRequestError as e:\n"
            "        print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code, *KILLERS], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("refused:") == 2 and r.stdout.count("varint above 32 bits") == 2


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS, ids=[f"{k}v{v}" for k, v in ALL_VERSIONS])
def test_every_request_kio_writes_passes_and_every_truncation_is_refused(api_key: int, version: int) -> None:
    frame = encode_request(api_key, version, 7, build(request_type(api_key, version), _sample(api_key)))[4:]
    decode_request(frame)  # the check accepts what a client sends
    rng = random.Random(api_key * 100 + version)
    for cut in sorted({rng.randrange(8, len(frame)) for _ in range(10)} if len(frame) > 8 else set()):
        try:
            decode_request(frame[:cut])
        except MalformedRequestError:
            pass


def _full(entity_type: type, depth: int = 0) -> dict[str, object]:
    """Every field of the entity given a value, tagged fields included, arrays of two."""
    hints = typing.get_type_hints(entity_type)
    out: dict[str, object] = {}
    for f in dataclasses.fields(entity_type):
        out[f.name] = _value(hints[f.name], f.metadata.get("kafka_type"), depth)
    return out


def _value(tp: object, kafka_type: object, depth: int) -> object:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        return [] if depth > 3 else [_value(item, kafka_type, depth + 1) for _ in range(2)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _full(tp, depth + 1)
    if isinstance(tp, type):
        if issubclass(tp, bool):
            return True
        if issubclass(tp, (datetime.timedelta,)) or kafka_type in ("timedelta_i32", "timedelta_i64"):
            return 5
        if issubclass(tp, int):
            return 1
        if issubclass(tp, float):
            return 1.5
        if issubclass(tp, str):
            return "ab"
        if issubclass(tp, bytes):
            return b"\x00" * 3
        if issubclass(tp, uuid.UUID):
            return uuid.UUID(int=7)
    return 5


@pytest.mark.parametrize(("api_key", "version"), ALL_VERSIONS, ids=[f"{k}v{v}" for k, v in ALL_VERSIONS])
def test_requests_with_every_field_set_pass(api_key: int, version: int) -> None:
    t = request_type(api_key, version)
    entity = build(t, _full(t))
    frame = encode_request(api_key, version, 7, entity)[4:]
    assert decode_with_kio(frame, api_key, version)[1] == entity  # Produce: test_produce_request.py too
    decode_request(frame)


def _sample(api_key: int) -> dict[str, object]:
    """Requests with arrays in them, so the walk goes through nested entities."""
    if api_key == 0:
        return {"transactional_id": None, "acks": -1, "timeout": 1000, "topic_data": [
            {"name": "t", "partition_data": [{"index": 0, "records": b"\x00" * 70}, {"index": 1, "records": None}]}]}
    if api_key == 1:
        return {"replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1000, "isolation_level": 1,
                "session_id": 0, "session_epoch": -1, "rack_id": "r", "cluster_id": "c",
                "topics": [{"topic": "t", "partitions": [{"partition": p, "fetch_offset": 5, "partition_max_bytes": 9}
                                                         for p in range(3)]}],
                "forgotten_topics_data": [{"topic": "f", "partitions": [1, 2, 3]}]}
    if api_key == 3:
        return {"topics": [{"name": "a"}, {"name": "b"}], "allow_auto_topic_creation": True}
    if api_key == 51:
        return {"deletions": [{"name": "x", "mechanism": 1}],
                "upsertions": [{"name": "y", "mechanism": 2, "iterations": 4096, "salt": b"s",
                                "salted_password": b"p"}]}
    if api_key == 65:
        return {"transactional_ids": ["a", "bb", "ccc"]}
    return {}


@pytest.mark.parametrize("flexible", [False, True])
def test_huge_counts_and_lengths_are_refused(flexible: bool) -> None:
    version = 12 if flexible else 4
    t = request_type(3, version)
    good = encode_request(3, version, 1, build(t, {"topics": [{"name": "abc"}]}))[4:]
    # header: api key, version, correlation id, client id "oncelog" (+ tagged fields when flexible)
    body_at = 8 + 2 + len("oncelog") + (1 if flexible else 0)
    check_lengths(t, good, body_at)
    body = bytearray(good[body_at:])
    if flexible:
        huge_array = b"\xff\xff\xff\xff\x0f" + bytes(body[1:])  # compact count 2^32-2
        huge_string = bytes(body[:1]) + (b"\x00" * 16 if version >= 10 else b"") + b"\xf0\xff\xff\x7f" + b"abc"
        long_varint = b"\xff\xff\xff\xff\xff\x01" + bytes(body[1:])
        cases = [huge_array, long_varint, huge_string]
    else:
        cases = [b"\x7f\xff\xff\xff" + bytes(body[4:]), b"\xff\xff\xff\xfe" + bytes(body[4:]),
                 bytes(body[:4]) + b"\x7f\xff" + b"abc"]
    for bad in cases:
        with pytest.raises(ValueError):
            check_lengths(t, good[:body_at] + bad, body_at)
        with pytest.raises(MalformedRequestError):
            decode_request(good[:body_at] + bad)

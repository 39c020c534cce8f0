"""Produce responses encoded by hand: the hot path of every acks != 0 produce request.

librdkafka sends one partition per ProduceRequest (its issue #1700), so with many partitions the
broker answers one small request per record batch, and kio's generic writer (type checks and a
dataclass per entity, about 40 µs for a one-partition answer) was a quarter of the broker's CPU
at 1,000 partitions. This writer takes the handler's plain data directly.

Invariant (tests/protocol/test_produce_response.py checks it on random responses of every
supported version): ``encode_produce_response(v, c, data) == encode_response(0, v, c,
build_response(0, v, data))`` for Produce v3 to v9, the versions the broker serves. v10+ would add
tagged fields (current_leader, node_endpoints) that this writer does not know: it refuses them.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from oncelog.protocol.records import encode_uvarint

MIN_VERSION, MAX_VERSION = 3, 9
FLEXIBLE_FROM = 9

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_PART_V3 = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time
_PART_V5 = struct.Struct(">ihqqq")  # + log_start_offset


def _string(s: str, flexible: bool) -> bytes:
    b = s.encode()
    return encode_uvarint(len(b) + 1) + b if flexible else _I16.pack(len(b)) + b


def _nullable_string(s: str | None, flexible: bool) -> bytes:
    if s is None:
        return b"\x00" if flexible else b"\xff\xff"
    return _string(s, flexible)


def _array_length(n: int, flexible: bool) -> bytes:
    return encode_uvarint(n + 1) if flexible else _I32.pack(n)


def encode_produce_response(api_version: int, correlation_id: int, data: Mapping[str, Any]) -> bytes:
    """The full length-prefixed frame of a Produce response built from the handler's data:
    ``{"responses": [{"name", "partition_responses": [{"index", "error_code", "base_offset",
    "log_append_time", "log_start_offset", "error_message", "record_errors"}]}], "throttle_time"}``
    (missing keys take kio's defaults: -1 times and offsets, no errors)."""
    if not MIN_VERSION <= api_version <= MAX_VERSION:
        raise ValueError(f"Produce v{api_version} responses are not encoded here")
    flexible = api_version >= FLEXIBLE_FROM
    v5 = api_version >= 5
    v8 = api_version >= 8
    out = [b"\0\0\0\0", _I32.pack(correlation_id)]
    if flexible:
        out.append(b"\x00")  # response header v1: no tagged fields
    topics = data["responses"]
    out.append(_array_length(len(topics), flexible))
    for topic in topics:
        out.append(_string(topic["name"], flexible))
        parts = topic["partition_responses"]
        out.append(_array_length(len(parts), flexible))
        for p in parts:
            append_time = p.get("log_append_time", -1)
            if append_time is None:
                append_time = -1
            if v5:
                out.append(_PART_V5.pack(p["index"], int(p["error_code"]), p["base_offset"], append_time,
                                         p.get("log_start_offset", -1)))
            else:
                out.append(_PART_V3.pack(p["index"], int(p["error_code"]), p["base_offset"], append_time))
            if v8:
                errors = p.get("record_errors") or ()
                out.append(_array_length(len(errors), flexible))
                for e in errors:
                    out.append(_I32.pack(e["batch_index"]))
                    out.append(_nullable_string(e.get("batch_index_error_message"), flexible))
                    if flexible:
                        out.append(b"\x00")
                out.append(_nullable_string(p.get("error_message"), flexible))
            if flexible:
                out.append(b"\x00")
        if flexible:
            out.append(b"\x00")
    out.append(_I32.pack(int(data.get("throttle_time", 0))))
    if flexible:
        out.append(b"\x00")
    frame = bytearray(b"".join(out))
    _I32.pack_into(frame, 0, len(frame) - 4)
    return bytes(frame)

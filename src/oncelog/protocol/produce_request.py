"""Produce requests decoded by hand: the other half of the produce hot path (see produce_response).

librdkafka puts one partition in each ProduceRequest, so at many partitions the broker decodes one
small request per record batch. The generic path (the bounds walk of protocol/bounds.py, kio's
reader building four frozen dataclasses, the null-array check) took about 14 µs a request here, a
fifth of the broker's whole cost per request at 1,000 partitions. This reader does the same checks in
one pass over the bytes and builds named tuples with kio's field names, which is all the produce
handler reads.

Invariant (tests/protocol/test_produce_request.py checks it on random requests of every supported
version, and on truncated and mutated frames): for Produce v3 to v9, ``decode_produce(frame, v)``
raises ``ValueError`` exactly when the generic path (``check_lengths``, kio, ``_null_array``) refuses
the frame, and otherwise returns the same header fields and a body equal field by field to kio's.
Like the generic path it ignores bytes after the body.
"""

from __future__ import annotations

import datetime
import struct
from typing import NamedTuple

MIN_VERSION, MAX_VERSION = 3, 9
FLEXIBLE_FROM = 9

_HEADER = struct.Struct(">hhih")  # api_key, api_version, correlation_id, client_id length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")


class PartitionProduceData(NamedTuple):
    index: int  # type: ignore[assignment]  # kio's name; it hides tuple.index, which nothing here calls
    records: bytes | None


class TopicProduceData(NamedTuple):
    name: str
    partition_data: tuple[PartitionProduceData, ...]


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topic_data: tuple[TopicProduceData, ...]

    @property
    def timeout(self) -> datetime.timedelta:
        """kio's name and type for the field (a timedelta is built only when asked for)."""
        return datetime.timedelta(milliseconds=self.timeout_ms)


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint of at most 5 bytes and 32 bits (bounds.py's limits)."""
    value = shift = 0
    for i in range(5):
        if pos >= len(buf):
            raise ValueError("varint runs past the end of the frame")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if value >= 1 << 32:
                raise ValueError("varint above 32 bits")
            return value, pos
        shift += 7
        if i == 4:
            break
    raise ValueError("varint longer than 5 bytes")


def _empty_tagged(buf: bytes, pos: int) -> int:
    """Past an empty tagged-field section. Produce v9 and request header v2 define no tagged field,
    and kio refuses a tag it does not know, so any tag is refused here too (Kafka's readers would
    keep it as unknown; no client sends one)."""
    count, pos = _uvarint(buf, pos)
    if count:
        raise ValueError("unknown tagged field")
    return pos


def _length(buf: bytes, pos: int, flexible: bool, wide: bool) -> tuple[int, int]:
    """A string's (int16), bytes' or array's (int32) length, or a compact one (varint minus one);
    -1 is null, anything below it is refused."""
    if flexible:
        n, pos = _uvarint(buf, pos)
        return n - 1, pos
    fmt = _I32 if wide else _I16
    if pos + fmt.size > len(buf):
        raise ValueError("length runs past the end of the frame")
    (n,) = fmt.unpack_from(buf, pos)
    if n < -1:
        raise ValueError(f"negative length {n}")
    return n, pos + fmt.size


def _string(buf: bytes, pos: int, flexible: bool, nullable: bool) -> tuple[str | None, int]:
    if flexible and pos < len(buf) and buf[pos] < 0x80:  # a one-byte compact length, read inline
        n = buf[pos] - 1
        pos += 1
    else:
        n, pos = _length(buf, pos, flexible, False)
    if n == -1:
        if not nullable:
            raise ValueError("non-nullable string was serialized as null")
        return None, pos
    if n > len(buf) - pos:
        raise ValueError("string longer than the frame")
    return buf[pos:pos + n].decode(), pos + n


def decode_produce(frame: bytes, api_version: int) -> tuple[str | None, ProduceRequest]:
    """(client_id, body) of a Produce request frame (without its size prefix; the caller has read
    the api key, version and correlation id with ``messages.peek_header``);
    ``ValueError`` for a frame the generic path would refuse.

    One-byte varints and empty tagged-field sections, what every client sends, are read inline;
    anything else goes through ``_uvarint`` and ``_empty_tagged``."""
    if not MIN_VERSION <= api_version <= MAX_VERSION:
        raise ValueError(f"Produce v{api_version} requests are not decoded here")
    flexible = api_version >= FLEXIBLE_FROM
    size = len(frame)
    if size < _HEADER.size:
        raise ValueError("frame shorter than a request header")
    (n,) = _I16.unpack_from(frame, 8)  # the client id's length, after what peek_header read
    pos = _HEADER.size
    client_id: str | None = None
    if n < -1:
        raise ValueError(f"negative length {n}")
    if n >= 0:
        if n > size - pos:
            raise ValueError("client id longer than the frame")
        client_id = frame[pos:pos + n].decode()
        pos += n
    if flexible:
        pos = pos + 1 if pos < size and frame[pos] == 0 else _empty_tagged(frame, pos)  # request header v2
    transactional_id, pos = _string(frame, pos, flexible, True)
    if pos + 6 > size:
        raise ValueError("acks and timeout run past the end of the frame")
    acks, timeout_ms = _ACKS_TIMEOUT.unpack_from(frame, pos)
    pos += 6
    n_topics, pos = _length(frame, pos, flexible, True)
    if n_topics == -1:
        raise ValueError("non-nullable field topic_data was serialized as null")
    topics = []
    i32 = _I32.unpack_from
    for _ in range(n_topics):
        name, pos = _string(frame, pos, flexible, False)
        n_parts, pos = _length(frame, pos, flexible, True)
        if n_parts == -1:
            raise ValueError("non-nullable field topic_data.partition_data was serialized as null")
        parts = []
        for _ in range(n_parts):
            if pos + 5 > size:  # the index and at least one byte of length
                raise ValueError("partition data runs past the end of the frame")
            (index,) = i32(frame, pos)
            pos += 4
            if flexible:
                n = frame[pos]
                if n < 0x80:
                    n -= 1
                    pos += 1
                elif pos + 1 < size and frame[pos + 1] < 0x80:  # two bytes: a batch of 127 B to 16 KiB
                    n = (n & 0x7F | frame[pos + 1] << 7) - 1
                    pos += 2
                else:
                    n, pos = _uvarint(frame, pos)
                    n -= 1
            else:
                if pos + 4 > size:
                    raise ValueError("records length runs past the end of the frame")
                (n,) = i32(frame, pos)
                pos += 4
                if n < -1:
                    raise ValueError(f"negative length {n}")
            records: bytes | None = None
            if n >= 0:
                if n > size - pos:
                    raise ValueError("records longer than the frame")
                records = frame[pos:pos + n]
                pos += n
            if flexible:
                pos = pos + 1 if pos < size and frame[pos] == 0 else _empty_tagged(frame, pos)
            parts.append(PartitionProduceData(index, records))
        if flexible:
            pos = pos + 1 if pos < size and frame[pos] == 0 else _empty_tagged(frame, pos)
        topics.append(TopicProduceData(name, tuple(parts)))  # type: ignore[arg-type]
    if flexible:
        pos = pos + 1 if pos < size and frame[pos] == 0 else _empty_tagged(frame, pos)
    return client_id, ProduceRequest(transactional_id, acks, timeout_ms, tuple(topics))

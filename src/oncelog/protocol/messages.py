"""Request decoding and response encoding on top of kio's generated message classes.

``decode_request`` turns a frame into a ``Request`` (header fields + kio body; Produce's body is
read by hand, protocol/produce_request.py, into named tuples with kio's field names); ``encode_response``
turns a response body into a length-prefixed frame with the right response header version (kio's
schemas already carry the ApiVersions quirk: response header v0 even at v3). ``build`` constructs a
kio response from plain nested dicts so handlers can be written once for every version: fields a
version lacks are ignored, fields it has but the dict omits get Kafka's implicit default.

Readers, writers and build plans are cached per (type): kio's native readers are objects that are
expensive to create and cheap to call.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import os
import struct
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32Timedelta, i64Timedelta

from oncelog.protocol.bounds import check_lengths
from oncelog.protocol.errors import MalformedRequestError, UnknownApiKeyError, UnsupportedVersionError
from oncelog.protocol.produce_request import MAX_VERSION as PRODUCE_MAX
from oncelog.protocol.produce_request import MIN_VERSION as PRODUCE_MIN
from oncelog.protocol.produce_request import decode_produce
from oncelog.protocol.produce_response import encode_produce_response
from oncelog.protocol.records import encode_uvarint
from oncelog.protocol.versions import API_FETCH, API_PRODUCE, SUPPORTED_VERSIONS

_PEEK = struct.Struct(">hhi")


@dataclass(frozen=True, slots=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any
    # Who sent it (the server's connection: principal, host, throttling); None outside a server.
    session: Any = None


@cache
def request_type(api_key: int, api_version: int) -> type:
    from kio.index import load_request_schema

    return load_request_schema(api_key, api_version)


@cache
def response_type(api_key: int, api_version: int) -> type:
    from kio.index import load_response_schema

    return load_response_schema(api_key, api_version)


@cache
def _reader(entity_type: type) -> Callable[[bytes, int], tuple[Any, int]]:
    return entity_reader(entity_type)


@cache
def _writer(entity_type: type) -> Callable[[Any, Any], None]:
    return entity_writer(entity_type)


def peek_header(frame: bytes) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) from the first 8 bytes, common to all header versions."""
    if len(frame) < 8:
        raise MalformedRequestError(f"request frame of {len(frame)} bytes is shorter than a header")
    return _PEEK.unpack_from(frame, 0)


def decode_request(frame: bytes, supported: Mapping[int, tuple[int, int]] = SUPPORTED_VERSIONS,
                   session: Any = None) -> Request:
    """The frame (without its size prefix) as a ``Request`` from ``session``; Produce by the hand-written
    reader of protocol/produce_request.py (the same answers, a named-tuple body), the rest by kio."""
    api_key, api_version, correlation_id = peek_header(frame)
    if api_key not in supported:
        raise UnknownApiKeyError(api_key, api_version, correlation_id)
    lo, hi = supported[api_key]
    if not lo <= api_version <= hi:
        raise UnsupportedVersionError(api_key, api_version, correlation_id)
    if api_key == API_PRODUCE and PRODUCE_MIN <= api_version <= PRODUCE_MAX:
        try:
            client_id, produce = decode_produce(frame, api_version)
        except Exception as exc:
            raise MalformedRequestError(f"cannot parse Produce v{api_version}: {exc}") from exc
        return Request(api_key, api_version, correlation_id, client_id, produce, session)
    client_id, body = decode_with_kio(frame, api_key, api_version)
    return Request(api_key, api_version, correlation_id, client_id, body, session)


def decode_with_kio(frame: bytes, api_key: int, api_version: int) -> tuple[str | None, Any]:
    """(client_id, kio body) of a request frame of a supported version: the bounds walk, kio's reader
    and the null-array check (``MalformedRequestError`` for what any of them refuses)."""
    req_t = request_type(api_key, api_version)
    try:
        header, pos = _reader(req_t.__header_schema__)(frame, 0)  # type: ignore[attr-defined]
        check_lengths(req_t, frame, pos)  # kio would allocate a declared array size first (protocol/bounds.py)
        body, pos = _reader(req_t)(frame, pos)
    except Exception as exc:  # kio raises assorted errors on garbage
        raise MalformedRequestError(f"cannot parse {api_key_map.get(api_key)} v{api_version}: {exc}") from exc
    null = _null_array(body, req_t)
    if null is not None:
        raise MalformedRequestError(
            f"cannot parse {api_key_map.get(api_key)} v{api_version}: non-nullable field {null} was serialized as null")
    return getattr(header, "client_id", None), body


@cache
def _array_fields(entity_type: type) -> tuple[tuple[str, bool, Any], ...]:
    """(name, nullable, entity type of the items or of the field) of the fields that hold arrays or
    nested entities, the only ones kio's reader may hand out as None where the schema forbids it."""
    hints = typing.get_type_hints(entity_type)
    out: list[tuple[str, bool, Any]] = []
    for f in dataclasses.fields(entity_type):
        tp = hints[f.name]
        nullable = typing.get_origin(tp) in (typing.Union, types.UnionType)
        if nullable:
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            out.append((f.name, nullable, item if dataclasses.is_dataclass(item) else None))
        elif isinstance(tp, type) and dataclasses.is_dataclass(tp):
            out.append((f.name, True, tp))
    return tuple(out)


def _null_array(entity: Any, entity_type: type) -> str | None:
    """The first non-nullable array that came as null (length -1, or compact length 0), else None.

    kio's readers accept a null array whatever the schema says; Kafka's generated readers refuse it
    ("non-nullable field ... was serialized as null"), and every handler may iterate its arrays.
    """
    for name, nullable, item_t in _array_fields(entity_type):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return name
            continue
        if item_t is None:
            continue
        if isinstance(value, tuple):
            for item in value:
                found = _null_array(item, item_t)
                if found is not None:
                    return f"{name}.{found}"
        else:
            found = _null_array(value, item_t)
            if found is not None:
                return f"{name}.{found}"
    return None


class EncodedResponse:
    """A response frame encoded once and served again (a cached Metadata answer): only its
    correlation id (bytes 4 to 8 of the frame, right after the size) changes between requests."""

    __slots__ = ("_frame",)

    def __init__(self, frame: bytes) -> None:
        self._frame = frame

    def __len__(self) -> int:
        return len(self._frame)

    def frame(self, correlation_id: int) -> bytes:
        return self._frame[:4] + struct.pack(">i", correlation_id) + self._frame[8:]


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """The full length-prefixed response frame."""
    resp_t = response_type(api_key, api_version)
    header_t = resp_t.__header_schema__  # type: ignore[attr-defined]
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    _writer(header_t)(buf, header_t(correlation_id=correlation_id))
    _writer(resp_t)(buf, body)
    data = buf.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def encode_request(api_key: int, api_version: int, correlation_id: int, body: Any,
                   client_id: str = "oncelog") -> bytes:
    """A full request frame (used by tests and internal tools that speak raw protocol)."""
    req_t = request_type(api_key, api_version)
    header_t = req_t.__header_schema__  # type: ignore[attr-defined]
    fields = {f.name for f in dataclasses.fields(header_t)}
    kwargs: dict[str, Any] = {"request_api_key": api_key, "request_api_version": api_version,
                              "correlation_id": correlation_id}
    if "client_id" in fields:
        kwargs["client_id"] = client_id
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    _writer(header_t)(buf, header_t(**kwargs))
    _writer(req_t)(buf, body)
    data = buf.getbuffer()
    struct.pack_into(">i", data, 0, len(data) - 4)
    return bytes(data)


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Any]:
    """(correlation_id, body) of a response frame without its size prefix."""
    resp_t = response_type(api_key, api_version)
    header, pos = _reader(resp_t.__header_schema__)(frame, 0)  # type: ignore[attr-defined]
    body, _ = _reader(resp_t)(frame, pos)
    return header.correlation_id, body


# --- building kio entities from plain data ---------------------------------------------------------

_Converter = Callable[[Any], Any]


def _ms_to_td(v: Any) -> Any:
    return datetime.timedelta(milliseconds=v) if isinstance(v, int) else v


def _ms_to_datetime(v: Any) -> Any:
    """Milliseconds -> the aware datetime kio writes back as the same int64 (-1 stays -1)."""
    if isinstance(v, int):
        return datetime.datetime.fromtimestamp(v / 1000, tz=datetime.UTC)
    return v


def _converter(tp: Any) -> tuple[_Converter | None, Any]:
    """(converter for a provided value, implicit default) for a field type."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        inner, _ = _converter(args[0])
        if inner is None:
            return None, None
        return (lambda v: None if v is None else inner(v)), None
    if origin is tuple:
        (item_t, *_rest) = typing.get_args(tp)
        if dataclasses.is_dataclass(item_t):
            return (lambda v: tuple(build(item_t, x) for x in v)), ()  # type: ignore[arg-type]
        return tuple, ()
    if isinstance(tp, type):
        if dataclasses.is_dataclass(tp):
            return (lambda v: build(tp, v)), None  # default resolved lazily
        if issubclass(tp, (i32Timedelta, i64Timedelta, datetime.timedelta)):
            return _ms_to_td, datetime.timedelta(0)
        if issubclass(tp, datetime.datetime):
            return _ms_to_datetime, None
        if issubclass(tp, ErrorCode):
            return ErrorCode, ErrorCode.none
        if issubclass(tp, bool):
            return None, False
        if issubclass(tp, int):
            return None, 0
        if issubclass(tp, float):
            return None, 0.0
        if issubclass(tp, str):
            return None, ""
        if issubclass(tp, bytes):
            return None, b""
        if issubclass(tp, uuid.UUID):
            return None, uuid.UUID(int=0)
    return None, None


@cache
def _plan(entity_type: type) -> tuple[tuple[str, _Converter | None, bool, Any, type | None], ...]:
    hints = typing.get_type_hints(entity_type)
    plan = []
    for f in dataclasses.fields(entity_type):
        tp = hints[f.name]
        conv, implicit = _converter(tp)
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        nested = tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None
        plan.append((f.name, conv, has_default, implicit, nested))
    return tuple(plan)


def build(entity_type: type, data: Mapping[str, Any] | Any) -> Any:
    """Construct ``entity_type`` from a mapping, ignoring keys the type lacks.

    An object that already is an instance of ``entity_type`` is returned as is.
    """
    if isinstance(data, entity_type):
        return data
    kwargs: dict[str, Any] = {}
    for name, conv, has_default, implicit, nested in _plan(entity_type):
        if name in data:
            value = data[name]
            kwargs[name] = conv(value) if conv is not None else value
        elif not has_default:
            kwargs[name] = build(nested, {}) if nested is not None else implicit
    return entity_type(**kwargs)


def build_response(api_key: int, api_version: int, data: Mapping[str, Any]) -> Any:
    return build(response_type(api_key, api_version), data)


def td_ms(value: Any) -> int:
    """Milliseconds of a kio timedelta field (or an int)."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)


# --- Fetch responses without copying record sets ------------------------------------------------
FETCH_FLEXIBLE_FROM = 12
SPLICE_MIN_BYTES = 64 * 1024
_MARKER_PREFIX = b"\xfe\x00oncelog"  # + 7 random bytes: 16 bytes that no encoded field can equal


def encode_fetch_response(api_version: int, correlation_id: int, data: Mapping[str, Any]) -> list[Any]:
    """A Fetch response frame as a list of buffers for ``writelines``.

    Invariant: ``b"".join(parts) == encode_response(1, v, c, build_response(1, v, data))``. Record sets
    of at least ``SPLICE_MIN_BYTES`` are not copied into the frame: kio encodes a 16-byte marker in
    their place, and the frame is split around each marker with the marker's length prefix (int32
    up to v11, unsigned varint of length + 1 from v12) rewritten for the real record set, which
    becomes a part of its own (a memoryview of the segment read, sent as is).
    """
    payloads: list[tuple[bytes, Any]] = []
    responses = []
    for topic in data["responses"]:
        parts = []
        for p in topic["partitions"]:
            rec = p.get("records")
            if rec is not None and len(rec) >= SPLICE_MIN_BYTES:
                marker = _MARKER_PREFIX + os.urandom(16 - len(_MARKER_PREFIX))
                payloads.append((marker, rec))
                p = {**p, "records": marker}
            elif isinstance(rec, (memoryview, bytearray)):
                p = {**p, "records": bytes(rec)}
            parts.append(p)
        responses.append({**topic, "partitions": parts})
    frame = encode_response(API_FETCH, api_version, correlation_id,
                            build_response(API_FETCH, api_version, {**data, "responses": responses}))
    if not payloads:
        return [frame]
    flexible = api_version >= FETCH_FLEXIBLE_FROM
    out: list[Any] = []
    pos = 0
    for marker, rec in payloads:
        i = frame.index(marker, pos)
        if flexible:
            if frame[i - 1] != len(marker) + 1:
                raise AssertionError("unexpected encoding of a spliced record set")
            out += [frame[pos:i - 1] + encode_uvarint(len(rec) + 1), rec]
        else:
            if frame[i - 4:i] != struct.pack(">i", len(marker)):
                raise AssertionError("unexpected encoding of a spliced record set")
            out += [frame[pos:i - 4] + struct.pack(">i", len(rec)), rec]
        pos = i + len(marker)
    out.append(frame[pos:])
    size = sum(len(b) for b in out) - 4
    out[0] = struct.pack(">i", size) + out[0][4:]
    return out


def encode_result(api_key: int, api_version: int, correlation_id: int, result: Any) -> bytes | list[Any]:
    """A handler's result as the response frame the connection writes: an ``EncodedResponse``
    with this correlation id; Produce and Fetch data by their own writers (Fetch as a list of
    buffers for ``writelines``); other data or a kio entity through kio."""
    if isinstance(result, EncodedResponse):
        return result.frame(correlation_id)
    if isinstance(result, Mapping):
        if api_key == API_PRODUCE:
            return encode_produce_response(api_version, correlation_id, result)
        if api_key == API_FETCH:
            return encode_fetch_response(api_version, correlation_id, result)
        result = build_response(api_key, api_version, result)
    return encode_response(api_key, api_version, correlation_id, result)

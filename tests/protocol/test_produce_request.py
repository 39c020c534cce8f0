"""The hand-written Produce request reader against the generic one (kio, the bounds walk, the
null-array check): the same verdict on every frame and the same fields on every accepted one."""

from __future__ import annotations

import datetime
import struct
import typing
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from oncelog.protocol.errors import MalformedRequestError
from oncelog.protocol.messages import decode_request, decode_with_kio, encode_request, request_type
from oncelog.protocol.produce_request import MAX_VERSION, MIN_VERSION, decode_produce
from oncelog.protocol.versions import API_PRODUCE, SUPPORTED_VERSIONS

VERSIONS = range(MIN_VERSION, MAX_VERSION + 1)


def test_every_served_produce_version_is_read_by_hand() -> None:
    assert SUPPORTED_VERSIONS[API_PRODUCE] == (MIN_VERSION, MAX_VERSION)


def _types(version: int) -> tuple[type, type, type]:
    req_t = request_type(API_PRODUCE, version)
    topic_t = typing.get_args(typing.get_type_hints(req_t)["topic_data"])[0]
    part_t = typing.get_args(typing.get_type_hints(topic_t)["partition_data"])[0]
    return req_t, topic_t, part_t


names = st.text(max_size=12)  # any code point but surrogates: what UTF-8 can carry
records = st.none() | st.binary(max_size=40) | st.binary(min_size=120, max_size=300)  # one- and two-byte lengths


@st.composite
def produce_frames(draw: st.DrawFn) -> tuple[int, bytes]:
    version = draw(st.sampled_from(VERSIONS))
    req_t, topic_t, part_t = _types(version)
    topics = tuple(
        topic_t(name=draw(names), partition_data=tuple(
            part_t(index=draw(st.integers(-2**31, 2**31 - 1)), records=draw(records))
            for _ in range(draw(st.integers(0, 3)))))
        for _ in range(draw(st.integers(0, 3))))
    body = req_t(transactional_id=draw(st.none() | names), acks=draw(st.integers(-2**15, 2**15 - 1)),
                 timeout=datetime.timedelta(milliseconds=draw(st.integers(-2**31, 2**31 - 1))), topic_data=topics)
    frame = encode_request(API_PRODUCE, version, draw(st.integers(-2**31, 2**31 - 1)), body,
                           client_id=draw(names))[4:]
    return version, frame


def _same(ours: Any, theirs: Any) -> None:
    assert ours.transactional_id == theirs.transactional_id
    assert ours.acks == theirs.acks
    assert ours.timeout == theirs.timeout
    assert len(ours.topic_data) == len(theirs.topic_data)
    for a, b in zip(ours.topic_data, theirs.topic_data, strict=True):
        assert a.name == b.name
        assert [(p.index, p.records) for p in a.partition_data] == \
            [(p.index, None if p.records is None else bytes(p.records)) for p in b.partition_data]


def _verdicts(version: int, frame: bytes) -> str:
    try:
        client_id, theirs = decode_with_kio(frame, API_PRODUCE, version)
    except MalformedRequestError:
        theirs = None
    try:
        our_client_id, ours = decode_produce(frame, version)
    except ValueError:
        ours = None
    assert (ours is None) == (theirs is None), (frame, ours, theirs)
    if ours is not None:
        assert our_client_id == client_id
        _same(ours, theirs)
    return "refused" if ours is None else "accepted"


@given(produce_frames())
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_well_formed_requests_read_the_same(case: tuple[int, bytes]) -> None:
    version, frame = case
    _verdicts(version, frame)
    request = decode_request(frame)  # the server's entry point takes the hand-written path
    assert type(request.body).__module__ == "oncelog.protocol.produce_request"
    _same(request.body, decode_with_kio(frame, API_PRODUCE, version)[1])


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, bytes]:
    version, frame = draw(produce_frames())
    data = bytearray(frame)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["truncate", "flip", "insert", "length"]))
        at = draw(st.integers(8, max(8, len(data))))  # the first 8 bytes were peeked before either reader
        if kind == "truncate":
            del data[at:]
        elif kind == "flip" and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=4))
        elif kind == "length" and at + 4 <= len(data):
            # a length field's favourite lies: null, below null, huge, a long or oversized varint
            data[at:at + 4] = draw(st.sampled_from([
                struct.pack(">i", -1), struct.pack(">i", -2), struct.pack(">h", -1) + data[at + 2:at + 4],
                struct.pack(">h", -7) + data[at + 2:at + 4], struct.pack(">i", 2**31 - 1), b"\x00\x00\x00\x00",
                b"\xff\xff\xff\xff", b"\x80\x80\x80\x80", b"\x00" + data[at + 1:at + 4]]))
    return version, bytes(data)


@given(mutated())
@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_damaged_requests_get_the_same_verdict(case: tuple[int, bytes]) -> None:
    event(_verdicts(*case))  # about 5% of the damaged frames are still accepted (--hypothesis-show-statistics)


@pytest.mark.parametrize("version", VERSIONS)
def test_tagged_fields_and_long_varints_are_read_as_kio_reads_them(version: int) -> None:
    """What no client sends today but the format allows: varints of several bytes for small values;
    and what it forbids: varints past 5 bytes or 32 bits, and (kio's rule, kept) tagged fields,
    which Produce v9 does not define."""
    req_t, topic_t, part_t = _types(version)
    body = req_t(transactional_id="t", acks=-1, timeout=datetime.timedelta(seconds=30), topic_data=(
        topic_t(name="topic", partition_data=(part_t(index=1, records=b"abc"),)),))
    frame = encode_request(API_PRODUCE, version, 5, body, client_id="c")[4:]
    _verdicts(version, frame)
    if version < 9:
        return
    cid_end = 8 + 2 + 1
    tag = b"\x01\x03\x02xy"  # one tag (3) of two bytes
    for tagged in (frame[:cid_end] + tag + frame[cid_end + 1:],  # in the header
                   frame[:-3] + tag + frame[-2:], frame[:-2] + tag + frame[-1:], frame[:-1] + tag):
        _verdicts(version, tagged)
        with pytest.raises(ValueError, match="tagged"):
            decode_produce(tagged, version)
    empty_long = frame[:-1] + b"\x80\x00"  # an empty section, its count in two bytes
    _verdicts(version, empty_long)
    assert decode_produce(empty_long, version)[1].topic_data[0].partition_data[0].records == b"abc"
    at = cid_end + 1  # "t" as a compact string whose length (2) is written in two bytes
    long_len = frame[:at] + b"\x82\x00" + frame[at + 1:]
    _verdicts(version, long_len)
    assert decode_produce(long_len, version)[1].transactional_id == "t"
    for bad in (b"\x80\x80\x80\x80\x80\x01", b"\xff\xff\xff\xff\x1f"):
        _verdicts(version, frame[:at] + bad + frame[at + 1:])
        with pytest.raises(ValueError):
            decode_produce(frame[:at] + bad + frame[at + 1:], version)

from __future__ import annotations

import struct

import pytest
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from oncelog.protocol.errors import MalformedRequestError, UnknownApiKeyError, UnsupportedVersionError
from oncelog.protocol.messages import (
    build_response,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)


def test_request_round_trip_with_flexible_header() -> None:
    frame = encode_request(3, 12, 42, MetadataRequest(topics=None, allow_auto_topic_creation=False,
                                                      include_topic_authorized_operations=False))
    req = decode_request(frame[4:])
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (3, 12, 42, "oncelog")
    assert req.body.topics is None


def test_api_versions_v3_response_uses_header_v0() -> None:
    # One stray tagged-fields byte after the correlation id makes librdkafka misread the frame.
    body = build_response(18, 3, {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0,
                                                                  "max_version": 3}]})
    out = encode_response(18, 3, 7, body)
    size, corr, error_code = struct.unpack_from(">iih", out)
    assert size == len(out) - 4 and corr == 7 and error_code == 0


def test_build_ignores_fields_a_version_lacks_and_defaults_the_rest() -> None:
    data = {"throttle_time": 5, "topics": [{"name": "t", "partitions": [], "topic_id": None}],
            "brokers": [], "not_a_field": 1}
    old = build_response(3, 0, data)
    new = build_response(3, 12, data)
    assert old.topics[0].name == new.topics[0].name == "t"
    assert new.throttle_time.total_seconds() == 0.005
    corr, decoded = decode_response(3, 12, encode_response(3, 12, 9, new)[4:])
    assert corr == 9 and decoded.topics[0].name == "t"


def test_unknown_and_unsupported_requests_keep_their_correlation_id() -> None:
    with pytest.raises(UnknownApiKeyError) as e1:
        decode_request(struct.pack(">hhi", 999, 0, 77) + b"\0\0")
    assert e1.value.correlation_id == 77
    frame = encode_request(18, 3, 5, ApiVersionsRequest(client_software_name="x",
                                                        client_software_version="1"))[4:]
    with pytest.raises(UnsupportedVersionError) as e2:
        decode_request(frame, {18: (0, 2)})
    assert e2.value.correlation_id == 5


def test_garbage_body_is_malformed_not_a_crash() -> None:
    with pytest.raises(MalformedRequestError):
        decode_request(struct.pack(">hhi", 3, 12, 1) + b"\xff\xff\xff")
    with pytest.raises(MalformedRequestError):
        decode_request(b"\x00\x03")


@pytest.mark.parametrize("version", [4, 7, 11, 12])
def test_fetch_response_parts_join_to_the_plain_encoding(version: int) -> None:
    """Large record sets are spliced in unjoined (sent with writelines), small ones encoded by kio;
    either way the bytes on the wire equal kio's encoding of the same response."""
    from oncelog.protocol.messages import SPLICE_MIN_BYTES, build_response, encode_fetch_response, encode_response

    big = bytes(range(256)) * (SPLICE_MIN_BYTES // 256 + 7)
    view = memoryview(b"\x01" * 200_000 + b"tail")[:200_000]

    def part(index: int, records: object) -> dict[str, object]:
        return {"partition_index": index, "error_code": 0, "high_watermark": 10, "last_stable_offset": 9,
                "log_start_offset": 0, "aborted_transactions": [{"producer_id": 3, "first_offset": 1}],
                "preferred_read_replica": -1, "records": records}

    data = {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "a", "partitions": [part(0, big), part(1, b"small"), part(2, b"")]},
        {"topic": "b", "partitions": [part(0, view), part(1, None)]}]}
    parts = encode_fetch_response(version, 77, data)
    assert len(parts) == 5 and parts[1] is big and parts[3] is view, "the large record sets are not copied"
    plain = {**data, "responses": [data["responses"][0], {"topic": "b", "partitions": [
        part(0, view.tobytes()), part(1, None)]}]}
    expected = encode_response(1, version, 77, build_response(1, version, plain))
    assert b"".join(bytes(p) for p in parts) == expected
    assert encode_fetch_response(version, 78, {**data, "responses": []}) == [
        encode_response(1, version, 78, build_response(1, version, {**data, "responses": []}))]

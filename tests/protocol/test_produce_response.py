"""The hand-written Produce response writer against kio's, byte for byte, on random responses."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import build_response, encode_response
from oncelog.protocol.produce_response import MAX_VERSION, MIN_VERSION, encode_produce_response
from oncelog.protocol.versions import API_PRODUCE, SUPPORTED_VERSIONS

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
text = st.text(max_size=300)
record_error = st.fixed_dictionaries({"batch_index": i32, "batch_index_error_message": st.none() | text})
partition = st.fixed_dictionaries(
    {"index": i32, "error_code": st.sampled_from(list(ErrorCode)), "base_offset": i64},
    optional={"log_append_time": st.none() | st.integers(-1, 2**45), "log_start_offset": i64,
              "error_message": st.none() | text, "record_errors": st.lists(record_error, max_size=3)})
topic = st.fixed_dictionaries({"name": text, "partition_responses": st.lists(partition, max_size=200)})
response = st.fixed_dictionaries({"responses": st.lists(topic, max_size=4)},
                                 optional={"throttle_time": st.integers(0, 2**31 - 1)})


def test_covers_every_served_version() -> None:
    assert SUPPORTED_VERSIONS[API_PRODUCE] == (MIN_VERSION, MAX_VERSION)


@settings(max_examples=300, deadline=None)
@given(version=st.integers(MIN_VERSION, MAX_VERSION), correlation_id=i32, data=response)
def test_same_bytes_as_kio(version: int, correlation_id: int, data: dict) -> None:
    expected = encode_response(API_PRODUCE, version, correlation_id, build_response(API_PRODUCE, version, data))
    assert encode_produce_response(version, correlation_id, data) == expected


def test_refuses_versions_it_does_not_know() -> None:
    with pytest.raises(ValueError):
        encode_produce_response(10, 1, {"responses": []})

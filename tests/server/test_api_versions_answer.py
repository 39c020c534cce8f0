"""ApiVersions is answered from a frame encoded once per version: every version's answer lists every
API the broker handles with its version range, under each request's own correlation id, exactly as
the generic encoder would write it."""

from __future__ import annotations

from pathlib import Path

from oncelog.protocol.messages import build_response, encode_response
from oncelog.protocol.versions import API_API_VERSIONS
from tests.inproc import InProcessBroker


def test_every_version_answers_the_same_as_a_fresh_encoding(tmp_path: Path) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        expected_keys = sorted(b.broker.supported_versions.items())
        for version in range(4):
            fields = {"client_software_name": "t", "client_software_version": "1"} if version >= 3 else {}
            for _ in range(2):  # the second answer comes from the cache
                resp = b.call(API_API_VERSIONS, version, fields)
                assert resp.error_code == 0
                assert [(k.api_key, (k.min_version, k.max_version)) for k in resp.api_keys] == expected_keys
            answer = b.broker.api_versions_answers[version]
            fresh = encode_response(API_API_VERSIONS, version, 77, build_response(API_API_VERSIONS, version, {
                "error_code": 0, "api_keys": b.broker.api_version_entries(), "throttle_time": 0}))
            assert answer.frame(77) == fresh
            assert answer.frame(78) != fresh and answer.frame(78)[8:] == fresh[8:]
    finally:
        b.close()

"""``__consumer_offsets`` records (JSON values, versioned keys; readable with kcat).

Keys: ``\\x00\\x01`` + JSON [group, topic, partition] for an offset commit; ``\\x00\\x02`` + group id for
the group's metadata. A None value is a tombstone.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

OFFSET_KEY = b"\x00\x01"
GROUP_KEY = b"\x00\x02"


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int
    metadata: str | None
    commit_timestamp_ms: int


def offset_key(group_id: str, topic: str, partition: int) -> bytes:
    return OFFSET_KEY + json.dumps([group_id, topic, partition], separators=(",", ":")).encode()


def offset_value(o: OffsetAndMetadata) -> bytes:
    return json.dumps({"v": 1, "offset": o.offset, "leader_epoch": o.leader_epoch, "metadata": o.metadata,
                       "ts": o.commit_timestamp_ms}, separators=(",", ":")).encode()


def group_key(group_id: str) -> bytes:
    return GROUP_KEY + group_id.encode()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def decode(key: bytes, value: bytes | None) -> tuple[str, Any, Any]:
    """("offset", (group, topic, partition), OffsetAndMetadata | None) or ("group", group_id, dict | None)."""
    kind, body = key[:2], key[2:]
    if kind == OFFSET_KEY:
        group, topic, partition = json.loads(body)
        if value is None:
            return "offset", (group, topic, partition), None
        d = json.loads(value)
        return "offset", (group, topic, partition), OffsetAndMetadata(d["offset"], d["leader_epoch"], d["metadata"],
                                                                       d["ts"])
    if kind == GROUP_KEY:
        return "group", body.decode(), None if value is None else json.loads(value)
    raise ValueError(f"unknown __consumer_offsets key type {kind!r}")

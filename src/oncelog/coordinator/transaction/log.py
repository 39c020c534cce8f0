"""``__transaction_state`` records: key = version i16 (1) + transactional id (UTF-8); value = JSON of
the metadata after the transition (with ``"v": 1``), or None (tombstone) when the id expires.

JSON keeps the internal log readable with kcat; the records are small and rare (a few per
transaction), so the encoding cost does not matter.
"""

from __future__ import annotations

import json
import struct

from oncelog.coordinator.transaction.state import TransactionMetadata, TransactionState

KEY_VERSION = 1
VALUE_VERSION = 1


def encode_key(transactional_id: str) -> bytes:
    return struct.pack(">h", KEY_VERSION) + transactional_id.encode()


def decode_key(key: bytes) -> str:
    (version,) = struct.unpack_from(">h", key)
    if version != KEY_VERSION:
        raise ValueError(f"unknown transaction log key version {version}")
    return key[2:].decode()


def encode_value(meta: TransactionMetadata) -> bytes:
    return json.dumps({
        "v": VALUE_VERSION, "pid": meta.producer_id, "prev_pid": meta.previous_producer_id,
        "epoch": meta.producer_epoch, "last_epoch": meta.last_producer_epoch, "timeout_ms": meta.txn_timeout_ms,
        "state": meta.state.value, "partitions": sorted([t, p] for t, p in meta.topic_partitions),
        "start_ms": meta.txn_start_timestamp_ms, "update_ms": meta.txn_last_update_timestamp_ms,
    }, separators=(",", ":")).encode()


def decode_value(transactional_id: str, value: bytes) -> TransactionMetadata:
    d = json.loads(value)
    if d.get("v") != VALUE_VERSION:
        raise ValueError(f"unknown transaction log value version {d.get('v')}")
    return TransactionMetadata(
        transactional_id=transactional_id, producer_id=d["pid"], previous_producer_id=d["prev_pid"],
        producer_epoch=d["epoch"], last_producer_epoch=d["last_epoch"], txn_timeout_ms=d["timeout_ms"],
        state=TransactionState(d["state"]), topic_partitions=frozenset((t, p) for t, p in d["partitions"]),
        txn_start_timestamp_ms=d["start_ms"], txn_last_update_timestamp_ms=d["update_ms"],
    )

"""Records inside a RecordBatch v2: decode (decompressing), rebuild with fewer records, empty headers.

The append and fetch paths never decode records into objects (``protocol.records`` walks them in
place, and reports the keyless records a compacted topic refuses). The log cleaner must: it keeps the
newest record per key and so rewrites batches with the surviving records.

Record layout (varints are zig-zag)::

    length varint | attributes i8 | timestamp_delta varlong | offset_delta varint
    | key_length varint, key | value_length varint, value | header_count varint, headers...

Rebuilt batches keep what Kafka's ``MemoryRecords.filterTo`` keeps: the base offset and
``last_offset_delta`` (so offsets never change and a producer's sequence range stays whole), the
producer id, epoch and base sequence, the partition leader epoch, the compression codec and the
timestamp type. The base timestamp becomes the first surviving record's timestamp, or the delete
horizon when one is set (attribute bit 6, KIP-534: the base timestamp field then *is* the horizon
and record timestamps stay right because their deltas are recomputed against it).

Codecs are ``protocol.compression``'s (gzip, snappy, lz4, zstd, as Kafka frames them).

Pure functions: safe to call from the cleaner's threads.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c

from oncelog.protocol import compression
from oncelog.protocol import records as rb

ATTR_DELETE_HORIZON = 0x40  # Kafka's DELETE_HORIZON_FLAG_MASK
NO_TIMESTAMP = -1

_AFTER_CRC = struct.Struct(">hiqqqhii")  # attributes .. records_count


@dataclass(frozen=True, slots=True)
class Record:
    """One record; ``offset`` and ``timestamp`` are absolute. ``tail`` is the raw header section."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    tail: bytes
    attributes: int = 0


def delete_horizon_ms(header: rb.BatchHeader) -> int | None:
    """The batch's delete horizon (KIP-534), or None if the cleaner has not set one."""
    return header.base_timestamp if header.attributes & ATTR_DELETE_HORIZON else None


# --- decoding --------------------------------------------------------------------------------------
def decode_records(batch: bytes | memoryview, header: rb.BatchHeader) -> list[Record]:
    """Every record of the batch at the start of ``batch`` (``header`` is its header)."""
    payload = memoryview(batch)[rb.HEADER_SIZE:header.size]
    data = compression.decompress(compression.codec_of(header), payload)
    out: list[Record] = []
    p = 0
    try:
        for _ in range(header.records_count):
            length, p = rb.read_varint(data, p)
            end = p + length
            if length < 0 or end > len(data):
                raise rb.InvalidRecordError("record runs past the end of its batch")
            attributes = data[p]
            ts_delta, q = rb.read_varint(data, p + 1)
            offset_delta, q = rb.read_varint(data, q)
            key_len, q = rb.read_varint(data, q)
            key = None
            if key_len >= 0:
                key = bytes(data[q:q + key_len])
                q += key_len
            value_len, q = rb.read_varint(data, q)
            value = None
            if value_len >= 0:
                value = bytes(data[q:q + value_len])
                q += value_len
            if q > end:
                raise rb.InvalidRecordError("record fields run past the record")
            out.append(Record(header.base_offset + offset_delta, header.base_timestamp + ts_delta, key, value,
                              bytes(data[q:end]), attributes))
            p = end
    except IndexError:
        raise rb.InvalidRecordError("truncated record") from None
    return out


# --- encoding --------------------------------------------------------------------------------------
def _encode_record(r: Record, base_offset: int, base_timestamp: int) -> bytes:
    body = bytearray()
    body.append(r.attributes & 0xFF)
    body += rb.encode_varint(r.timestamp - base_timestamp)
    body += rb.encode_varint(r.offset - base_offset)
    for part in (r.key, r.value):
        if part is None:
            body += rb.encode_varint(-1)
        else:
            body += rb.encode_varint(len(part))
            body += part
    body += r.tail
    return rb.encode_varint(len(body)) + bytes(body)


def rebuild_batch(header: rb.BatchHeader, records: list[Record], *, delete_horizon: int | None) -> bytes:
    """The batch ``header`` described, holding only ``records`` (a non-empty subset, in order).

    Base offset, last offset delta, producer fields, base sequence, leader epoch, codec and
    timestamp type are kept; ``delete_horizon`` (or None) sets attribute bit 6 and the base timestamp.
    """
    if not records:
        raise ValueError("rebuild_batch needs at least one record; use empty_batch")
    attributes = header.attributes & ~ATTR_DELETE_HORIZON
    # LogAppendTime: every record has the batch's append time, its max timestamp.
    max_ts = header.max_timestamp if header.attributes & rb.ATTR_TIMESTAMP_TYPE else max(r.timestamp for r in records)
    if delete_horizon is not None:
        attributes |= ATTR_DELETE_HORIZON
        base_ts = delete_horizon
    else:
        base_ts = records[0].timestamp
    payload = b"".join(_encode_record(r, header.base_offset, base_ts) for r in records)
    payload = compression.compress(compression.codec_of(header), payload)
    after_crc = _AFTER_CRC.pack(attributes, header.last_offset_delta, base_ts, max_ts, header.producer_id,
                                header.producer_epoch, header.base_sequence, len(records)) + payload
    return _header_prefix(header, after_crc) + after_crc


def empty_batch(header: rb.BatchHeader) -> bytes:
    """A batch with no records that keeps ``header``'s offsets, producer fields and sequence range
    (Kafka's ``writeEmptyHeader``: no compression, no base timestamp, the original max timestamp)."""
    attributes = header.attributes & (rb.ATTR_TIMESTAMP_TYPE | rb.ATTR_TRANSACTIONAL | rb.ATTR_CONTROL)
    after_crc = _AFTER_CRC.pack(attributes, header.last_offset_delta, NO_TIMESTAMP, header.max_timestamp,
                                header.producer_id, header.producer_epoch, header.base_sequence, 0)
    return _header_prefix(header, after_crc) + after_crc


def _header_prefix(header: rb.BatchHeader, after_crc: bytes) -> bytes:
    batch_length = 4 + 1 + 4 + len(after_crc)  # leader epoch, magic, crc, then the rest
    return struct.pack(">qiibI", header.base_offset, batch_length, header.partition_leader_epoch, rb.MAGIC_V2,
                       crc32c.crc32c(after_crc))

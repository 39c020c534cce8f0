"""Record-batch compression codecs, for the two places the broker must look inside a batch:
recompressing to a topic's ``compression.type`` and checking record timestamps of a compressed
batch (``message.timestamp.*.max.ms``). Neither is on the default path (``compression.type=producer``
and unlimited timestamps keep batches opaque).

Formats are Kafka's: gzip, snappy in xerial's framing (what the Java client and Kafka write; raw
snappy, which librdkafka writes, is read too), the LZ4 frame format, zstd frames. The codecs come
from ``cramjam`` (one wheel for all four).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import replace

import cramjam
import crc32c

from oncelog.protocol import records as rb

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
BY_NAME = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024


class CompressionError(rb.InvalidRecordError):
    """Compressed records that cannot be decompressed (CORRUPT_MESSAGE)."""


def decompress(codec: int, data: bytes | memoryview) -> bytes:
    try:
        if codec == NONE:
            return bytes(data)
        if codec == GZIP:
            return bytes(cramjam.gzip.decompress(bytes(data)))
        if codec == SNAPPY:
            raw = bytes(data)
            if raw.startswith(_XERIAL_MAGIC):
                out = bytearray()
                pos = len(_XERIAL_HEADER)
                while pos < len(raw):
                    (n,) = struct.unpack_from(">i", raw, pos)
                    out += bytes(cramjam.snappy.decompress_raw(raw[pos + 4 : pos + 4 + n]))
                    pos += 4 + n
                return bytes(out)
            return bytes(cramjam.snappy.decompress_raw(raw))
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(bytes(data)))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(bytes(data)))
    except (cramjam.DecompressionError, ValueError, struct.error) as exc:
        raise CompressionError(f"cannot decompress records (codec {codec}): {exc}") from exc
    raise CompressionError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes, level: int | None = None) -> bytes:
    if codec == NONE:
        return data
    if codec == GZIP:
        return bytes(cramjam.gzip.compress(data, level=level))
    if codec == SNAPPY:
        out = bytearray(_XERIAL_HEADER)
        for i in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + _XERIAL_BLOCK]))
            out += struct.pack(">i", len(block)) + block
        return bytes(out)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data, level=level))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise ValueError(f"unknown compression codec {codec}")


def codec_of(header: rb.BatchHeader) -> int:
    return header.attributes & rb.ATTR_COMPRESSION_MASK


def recompress_batch(batch: bytes | memoryview, header: rb.BatchHeader, codec: int, level: int | None) -> bytes:
    """The same batch (offsets, timestamps, producer id, epoch and sequence kept) with its records
    compressed by ``codec``; a new CRC covers the new attributes and records."""
    records = compress(codec, decompress(codec_of(header), memoryview(batch)[rb.HEADER_SIZE : header.size]), level)
    attributes = (header.attributes & ~rb.ATTR_COMPRESSION_MASK) | codec
    after_crc = struct.pack(">h", attributes) + bytes(batch[rb.CRC_START + 2 : rb.HEADER_SIZE]) + records
    batch_length = 4 + 1 + 4 + len(after_crc)
    return struct.pack(">qiibI", header.base_offset, batch_length, header.partition_leader_epoch, header.magic,
                       crc32c.crc32c(after_crc)) + after_crc


def record_timestamps(batch: bytes | memoryview, header: rb.BatchHeader) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record, decompressing the batch if needed."""
    if codec_of(header) == NONE:
        yield from rb.record_timestamps(batch, 0, header)
        return
    plain = bytes(rb.HEADER_SIZE) + decompress(codec_of(header), memoryview(batch)[rb.HEADER_SIZE : header.size])
    plain_header = replace(header, attributes=header.attributes & ~rb.ATTR_COMPRESSION_MASK,
                           batch_length=len(plain) - rb.LOG_OVERHEAD)
    yield from rb.record_timestamps(plain, 0, plain_header)

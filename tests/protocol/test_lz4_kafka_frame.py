"""LZ4 frames the broker writes (recompression to ``compression.type=lz4``, the log cleaner's rebuilt
batches) must be readable by Kafka's Java client. ``kafka_lz4_read`` is Kafka's Lz4BlockInputStream
rule for rule (Java cannot run in the test suite): the frame descriptor's FLG.validate and
BD.validate, the header checksum, and each block decompressed on its own into a buffer of the
frame's maximum block size."""

from __future__ import annotations

import os
import struct

import crc32c
import lz4.block
import lz4.frame
import pytest

from oncelog.protocol import compression
from oncelog.protocol import records as r

MAGIC = 0x184D2204


class KafkaRefuses(Exception):
    """What Kafka's Lz4BlockInputStream (or FLG/BD) would throw."""


def xxh32(data: bytes, seed: int = 0) -> int:
    """XXH32, as lz4-java's XXHash32 (the frame descriptor's checksum)."""
    p1, p2, p3, p4, p5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
    m = 0xFFFFFFFF

    def rotl(x: int, n: int) -> int:
        return ((x << n) | (x >> (32 - n))) & m

    n = len(data)
    i = 0
    if n >= 16:
        v = [(seed + p1 + p2) & m, (seed + p2) & m, seed & m, (seed - p1) & m]
        while i + 16 <= n:
            for k in range(4):
                (lane,) = struct.unpack_from("<I", data, i + 4 * k)
                v[k] = (rotl((v[k] + lane * p2) & m, 13) * p1) & m
            i += 16
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & m
    else:
        h = (seed + p5) & m
    h = (h + n) & m
    while i + 4 <= n:
        (lane,) = struct.unpack_from("<I", data, i)
        h = (rotl((h + lane * p3) & m, 17) * p4) & m
        i += 4
    while i < n:
        h = (rotl((h + data[i] * p5) & m, 11) * p1) & m
        i += 1
    h ^= h >> 15
    h = (h * p2) & m
    h ^= h >> 13
    h = (h * p3) & m
    return h ^ (h >> 16)


def kafka_flg_bd_refusal(flg: int, bd: int) -> str | None:
    """Kafka's Lz4BlockOutputStream.FLG.validate and BD.validate (FLG.fromByte, BD.fromByte)."""
    if flg & 0x03:
        return "Reserved bits must be 0"
    if not flg >> 5 & 1:
        return "Dependent block stream is unsupported"
    if flg >> 6 != 1:
        return f"Version {flg >> 6} is unsupported"
    if bd & 0x0F:
        return "Reserved2 field must be 0"
    if not 4 <= (bd >> 4) & 7 <= 7:
        return "Block size value must be between 4 and 7"
    if bd & 0x80:
        return "Reserved3 field must be 0"
    return None


def kafka_lz4_read(frame: bytes) -> bytes:
    """Kafka's Lz4BlockInputStream over ``frame``: the inflated bytes, or KafkaRefuses."""
    if len(frame) < 6:
        raise KafkaRefuses("Stream ended prematurely")
    if struct.unpack_from("<I", frame, 0)[0] != MAGIC:
        raise KafkaRefuses("Stream unsupported (invalid magic bytes)")
    flg, bd = frame[4], frame[5]
    if (why := kafka_flg_bd_refusal(flg, bd)) is not None:
        raise KafkaRefuses(why)
    max_block = 1 << (2 * ((bd >> 4) & 7) + 8)
    p = 6 + (8 if flg & 0x08 else 0)
    if p >= len(frame) or frame[p] != (xxh32(frame[4:p]) >> 8) & 0xFF:
        raise KafkaRefuses("Stream frame descriptor corrupted")
    p += 1
    out = bytearray()
    while True:
        if p + 4 > len(frame):
            raise KafkaRefuses("Stream ended prematurely")
        (size,) = struct.unpack_from("<I", frame, p)
        p += 4
        stored = bool(size & 0x80000000)
        size &= 0x7FFFFFFF
        if size == 0:
            return bytes(out)  # content checksum, if any, is not checked
        if size > max_block:
            raise KafkaRefuses(f"Block size {size} exceeded max: {max_block}")
        if p + size > len(frame):
            raise KafkaRefuses("Stream ended prematurely")
        block = frame[p:p + size]
        if stored:
            out += block
        else:
            try:  # each block alone: an independent block may not refer to the one before
                out += lz4.block.decompress(block, uncompressed_size=max_block)
            except lz4.block.LZ4BlockError as exc:
                raise KafkaRefuses(f"LZ4Exception: {exc}") from None
        p += size + (4 if flg & 0x10 else 0)


def assert_kafka_frame(frame: bytes, data: bytes) -> None:
    """What Kafka's Lz4BlockOutputStream writes, and Kafka's reader gets ``data`` back."""
    assert frame[4] == compression.LZ4_KAFKA_FLG == 0x60, hex(frame[4])  # v1, independent, no checksums, no size
    assert frame[5] == compression.LZ4_KAFKA_BD == 0x40, hex(frame[5])  # 64 KiB blocks
    assert kafka_lz4_read(frame) == data


def test_the_reader_here_is_kafkas_it_refuses_linked_blocks() -> None:
    data = b"".join(b"record %d of many " % (i % 50) for i in range(20_000))  # several 64 KiB blocks
    assert kafka_lz4_read(lz4.frame.compress(data, block_linked=False)) == data  # librdkafka's framing
    with pytest.raises(KafkaRefuses, match="Dependent block stream"):
        kafka_lz4_read(lz4.frame.compress(data, block_linked=True))
    with pytest.raises(KafkaRefuses, match="Block size value"):
        kafka_lz4_read(b"\x04\x22\x4d\x18\x60\x30\x00")
    with pytest.raises(KafkaRefuses, match="descriptor corrupted"):
        kafka_lz4_read(b"\x04\x22\x4d\x18\x60\x40\x00\x00\x00\x00\x00")


@pytest.mark.parametrize("level", [None, 1, 9, 12, 17])
@pytest.mark.parametrize("size", [0, 5, 65_536, 300_000])
def test_compress_writes_kafkas_lz4_frame(level: int | None, size: int) -> None:
    for data in (os.urandom(size), bytes(range(256)) * (size // 256) + b"x" * (size % 256)):
        assert_kafka_frame(compression.compress(compression.LZ4, data, level), data)
        assert compression.decompress(compression.LZ4, compression.compress(compression.LZ4, data, level)) == data


def test_a_batch_recompressed_to_lz4_is_readable_by_kafka() -> None:
    recs = [r.encode_record(i, i, b"k%d" % i, b"value %d " % i * 400) for i in range(60)]  # > 64 KiB
    plain = r.build_batch(recs, base_timestamp=1_000)
    header = r.read_header(plain)
    lz4_batch = compression.recompress_batch(plain, header, compression.LZ4, 9)
    new = r.validate_batch(lz4_batch)
    assert_kafka_frame(bytes(lz4_batch[r.HEADER_SIZE:new.size]), b"".join(recs))


# --- produce validation refuses the frames Kafka's reader refuses --------------------------------------

def lz4_frame(data: bytes, flg: int, bd: int) -> bytes:
    """``data`` in one stored block of a frame with this FLG and BD, every optional field FLG asks for
    present and right (content size, dictionary id, block and content checksums), the header
    checksum right: only the descriptor's flags can make a reader refuse it."""
    desc = bytes([flg, bd])
    if flg & 0x08:
        desc += struct.pack("<Q", len(data))
    if flg & 0x01:
        desc += struct.pack("<I", 7)  # a dictionary id
    out = struct.pack("<I", MAGIC) + desc + bytes([(xxh32(desc) >> 8) & 0xFF])
    out += struct.pack("<I", len(data) | 0x80000000) + data
    if flg & 0x10:
        out += struct.pack("<I", xxh32(data))
    out += b"\x00\x00\x00\x00"
    if flg & 0x04:
        out += struct.pack("<I", xxh32(data))
    return out


def lz4_batch(frame: bytes, count: int) -> bytes:
    head = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, compression.LZ4, count - 1, 0, 0, -1, -1, -1, count)
    buf = bytearray(head + frame)
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


RECORDS = b"".join(r.encode_record(i, i, b"k", b"v" * 30) for i in range(5))


@pytest.mark.parametrize(("flg", "bd", "why"), [
    (0x40, 0x40, "Dependent block stream is unsupported"),  # linked blocks: python-lz4's, cramjam's default
    (0x54, 0x40, "Dependent block stream is unsupported"),
    (0x61, 0x40, "Reserved bits must be 0"),  # the dictionary id flag
    (0x62, 0x40, "Reserved bits must be 0"),
    (0x20, 0x40, "Version 0 is unsupported"),
    (0xA0, 0x40, "Version 2 is unsupported"),
    (0x60, 0x41, "Reserved2 field must be 0"),
    (0x60, 0x48, "Reserved2 field must be 0"),
    (0x60, 0xC0, "Reserved3 field must be 0"),
    (0x60, 0x30, "Block size value must be between 4 and 7"),
    (0x60, 0x00, "Block size value must be between 4 and 7"),
], ids=lambda v: hex(v) if isinstance(v, int) else None)
def test_produce_refuses_an_lz4_frame_kafkas_reader_refuses(flg: int, bd: int, why: str) -> None:
    frame = lz4_frame(RECORDS, flg, bd)
    with pytest.raises(KafkaRefuses, match=why):
        kafka_lz4_read(frame)
    with pytest.raises(r.RecordValidationError, match=f"lz4 records do not decompress: lz4: {why}") as info:
        r.split_batches(lz4_batch(frame, 5), from_client=True)
    assert info.value.error_code == 87  # INVALID_RECORD


def test_produce_and_kafkas_reader_agree_on_every_descriptor() -> None:
    """All 256 FLG bytes against block sizes 64 KiB-4 MiB and bad BDs: a batch passes produce
    validation exactly when Kafka's reader reads its frame."""
    for bd in (0x40, 0x50, 0x60, 0x70, 0x00, 0x30, 0x44, 0xC0):
        for flg in range(256):
            frame = lz4_frame(RECORDS, flg, bd)
            try:
                kafka_lz4_read(frame)
                kafka_reads = True
            except KafkaRefuses:
                kafka_reads = False
            try:
                r.split_batches(lz4_batch(frame, 5), from_client=True)
                accepted = True
            except r.RecordValidationError:
                accepted = False
            assert accepted == kafka_reads, (hex(flg), hex(bd))
            assert accepted == (compression.lz4_frame_refusal(frame) is None), (hex(flg), hex(bd))

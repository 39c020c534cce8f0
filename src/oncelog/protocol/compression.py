"""Record-batch compression codecs, for the two places the broker must look inside a batch:
recompressing to a topic's ``compression.type`` and checking record timestamps of a compressed
batch (``message.timestamp.*.max.ms``). Neither is on the default path (``compression.type=producer``
and unlimited timestamps keep batches opaque).

Formats are Kafka's: gzip, snappy in xerial's framing (what the Java client and Kafka write; raw
snappy, which librdkafka writes, is read too), the LZ4 frame format, zstd frames. The codecs come
from ``cramjam`` (one wheel for all four), except lz4 output: it is written by python-lz4 with
Kafka's own frame descriptor (independent 64 KiB blocks), the only kind Kafka's Java reader accepts.
Produce validation inflates every compressed batch a piece at a time with an output bound
(``inflate_chunks``), which cramjam cannot give for lz4 and zstd, and walks each piece's records
before it asks for the next (``records.validate_records``).
"""

from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from types import ModuleType

import cramjam
import crc32c

from oncelog.protocol import records as rb

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
BY_NAME = {"uncompressed": NONE, "gzip": GZIP, "snappy": SNAPPY, "lz4": LZ4, "zstd": ZSTD}

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK = 32 * 1024
_I32 = struct.Struct(">i")


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
        return _lz4_kafka_frame(data, level)
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data, level=level))
    raise ValueError(f"unknown compression codec {codec}")


#: The frame descriptor Kafka's Lz4BlockOutputStream writes: FLG 0x60 (version 1, independent blocks,
#: no block or content checksum, no content size) and BD 0x40 (64 KiB blocks). Its reader
#: (Lz4BlockInputStream) refuses dependent blocks ("Dependent block stream is unsupported"), which is
#: what cramjam's and python-lz4's defaults write (FLG 0x54 / 0x64).
LZ4_KAFKA_FLG = 0x60
LZ4_KAFKA_BD = 0x40


def _lz4_kafka_frame(data: bytes, level: int | None) -> bytes:
    """An LZ4 frame as Kafka's Java client writes one (see ``LZ4_KAFKA_FLG``). Kafka's default
    ``compression.lz4.level`` (9) uses lz4-java's fast compressor, any other level its HC one; python-lz4
    does the same with level 0 and 3-16."""
    import lz4.frame

    hc = 0 if level is None or level == 9 else max(3, min(level, 16))
    return bytes(lz4.frame.compress(data, compression_level=hc, block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                                    block_linked=False, content_checksum=False, block_checksum=False,
                                    store_size=False))


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
    plain_header = header._replace(attributes=header.attributes & ~rb.ATTR_COMPRESSION_MASK,
                           batch_length=len(plain) - rb.LOG_OVERHEAD)
    yield from rb.record_timestamps(plain, 0, plain_header)


# --- streaming decompression, for produce validation ----------------------------------------------

CODEC_NAMES = {GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}


class DecompressionError(ValueError):
    """The payload is not a valid stream of its codec (truncated, corrupt, trailing bytes)."""


class InflatedTooLargeError(DecompressionError):
    """The payload inflates past the bound."""


#: At most this many inflated bytes come out of one codec call (Kafka's reader inflates 16 KiB at a
#: time). Produce validation walks the records of each piece before it asks for the next one.
STREAM_CHUNK = 64 << 10

#: Compressed input given to zlib per call: what it cannot consume yet it copies into
#: ``unconsumed_tail``, so a whole payload given at each call would be copied once per piece.
_GZIP_INPUT = 64 << 10


def inflate_chunks(codec: int, data: bytes | memoryview, limit: int) -> Iterator[bytes]:
    """The uncompressed bytes of ``data`` (codec 1-4), in order, as they are inflated: pieces of at
    most ``STREAM_CHUNK`` bytes (snappy: a xerial chunk, or a raw block, whole), never empty.

    Raises :class:`InflatedTooLargeError` as soon as more than ``limit`` bytes came out, and
    :class:`DecompressionError` where the stream is not valid; the end of the stream is checked
    after its last piece (a truncated stream, bytes after it), so a caller that stops early never
    pays for the rest. gzip: zlib; snappy: cramjam's raw format, which states each block's length
    before anything is allocated (a length its input cannot reach is refused first); lz4: python-lz4's
    frame decompressor, after Kafka's frame rules (``lz4_frame_refusal``); zstd: the standard
    library's (backported before 3.14). Concatenated gzip members and zstd frames are read, as
    Java's streams do. The codec calls hold memory of a piece, not of the payload: refusing a bomb
    at its first bad record costs one piece.
    """
    if codec == SNAPPY:
        return _unsnappy(data, limit)
    inflate = _INFLATE.get(codec)
    if inflate is None:
        raise DecompressionError(f"unknown compression codec {codec}")
    return inflate(data, limit)


def _ask(limit: int, total: int) -> int:
    """How much the next call may inflate: a piece, or one byte past the bound (to detect it)."""
    return min(STREAM_CHUNK, limit - total + 1)


def _too_large(limit: int) -> InflatedTooLargeError:
    return InflatedTooLargeError(f"compressed records inflate past {limit} bytes")


def _gunzip(data: bytes | memoryview, limit: int) -> Iterator[bytes]:
    data = memoryview(data)
    total = 0
    fed = 0  # input given to zlib so far
    try:
        while True:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip header and trailer required
            pending: bytes | memoryview = b""
            while not d.eof:
                if not pending and fed < len(data):
                    pending = data[fed:fed + _GZIP_INPUT]
                    fed += len(pending)
                ask = _ask(limit, total)
                chunk = d.decompress(pending, ask)
                pending = d.unconsumed_tail
                total += len(chunk)
                if total > limit:
                    raise _too_large(limit)
                if chunk:
                    yield chunk
                if len(chunk) < ask and not d.eof and not pending and fed == len(data):
                    # zlib stops short of what was asked only for want of input.
                    raise DecompressionError("gzip stream ends before its end of member")
            # At a member's end zlib leaves the input it did not read in unused_data: the next member.
            fed -= len(d.unused_data)
            if fed == len(data):
                return
    except zlib.error as exc:
        raise DecompressionError(f"gzip: {exc}") from None


def _unsnappy(data: bytes | memoryview, limit: int) -> Iterator[bytes]:
    if bytes(data[:8]) != _XERIAL_MAGIC:
        if out := _snappy_raw(data, limit, limit):
            yield out
        return
    if len(data) < len(_XERIAL_HEADER):
        raise DecompressionError("snappy: truncated xerial header")
    total = 0
    p = len(_XERIAL_HEADER)
    n = len(data)
    while p < n:
        if p + 4 > n:
            raise DecompressionError("snappy: truncated xerial chunk length")
        (size,) = _I32.unpack_from(data, p)
        p += 4
        if size < 0 or p + size > n:
            raise DecompressionError(f"snappy: xerial chunk of {size} bytes runs past the payload")
        chunk = _snappy_raw(memoryview(data)[p:p + size], limit - total, limit)
        total += len(chunk)
        if chunk:
            yield chunk
        p += size


#: Snappy's densest element, a 3-byte copy, yields 64 bytes: a block cannot inflate past this
#: many times its size (so a length its input cannot reach is refused before it is allocated).
_SNAPPY_MAX_RATIO = 22


def _snappy_raw(data: bytes | memoryview, room: int, limit: int) -> bytes:
    """One raw snappy block, refused if it would take more than ``room`` of the ``limit``."""
    try:
        size = cramjam.snappy.decompress_raw_len(data)
        if size > room:
            raise _too_large(limit)
        if size > _SNAPPY_MAX_RATIO * len(data):
            raise DecompressionError(f"snappy: {len(data)} bytes cannot hold the {size} they declare")
        out = bytes(cramjam.snappy.decompress_raw(data))
    except DecompressionError:
        raise
    except Exception as exc:  # cramjam.DecompressionError and friends
        raise DecompressionError(f"snappy: {exc}") from None
    if len(out) != size:
        raise DecompressionError(f"snappy: {len(out)} bytes inflated, {size} declared")
    return out


_LZ4_MAGIC = b"\x04\x22\x4d\x18"


def lz4_frame_refusal(data: bytes | memoryview) -> str | None:
    """Why Kafka's Java client cannot read this lz4 frame, from its descriptor; None if it can.

    Kafka's Lz4BlockInputStream reads only the LZ4 frame magic and a descriptor that passes
    Lz4BlockOutputStream's ``FLG.validate`` and ``BD.validate``: FLG's two low bits (the dictionary
    id flag and a reserved bit) clear, blocks independent, version 1; BD's reserved bits clear and
    a block size code of 4-7 (64 KiB-4 MiB). liblz4 reads linked blocks and dictionary ids too,
    so these are checked here before anything is inflated: a frame Kafka's reader refuses would
    break every Java consumer of the partition. (Kafka's broker answers such a batch with the
    KafkaException its reader throws, UNKNOWN_SERVER_ERROR; we answer INVALID_RECORD, as for every
    payload that does not decompress.)"""
    if len(data) < 6:
        return "Stream ended prematurely"
    if bytes(data[:4]) != _LZ4_MAGIC:
        return "Stream unsupported (invalid magic bytes)"
    flg, bd = data[4], data[5]
    if flg & 0x03:
        return "Reserved bits must be 0"
    if not flg & 0x20:
        return "Dependent block stream is unsupported"
    if flg >> 6 != 1:
        return f"Version {flg >> 6} is unsupported"
    if bd & 0x0F:
        return "Reserved2 field must be 0"
    if (bd >> 4) & 0x07 < 4:
        return "Block size value must be between 4 and 7"
    if bd & 0x80:
        return "Reserved3 field must be 0"
    return None


def _unlz4(data: bytes | memoryview, limit: int) -> Iterator[bytes]:
    import lz4.frame

    if (refusal := lz4_frame_refusal(data)) is not None:
        raise DecompressionError(f"lz4: {refusal} (Kafka's lz4 reader refuses this frame)")
    d = lz4.frame.LZ4FrameDecompressor()
    total = 0
    try:
        chunk = d.decompress(data, max_length=_ask(limit, 0))
        while True:
            total += len(chunk)
            if total > limit:
                raise _too_large(limit)
            if chunk:
                yield chunk
            if d.eof or d.needs_input:
                break
            chunk = d.decompress(b"", max_length=_ask(limit, total))
    except RuntimeError as exc:  # LZ4F_decompress failed ...
        raise DecompressionError(f"lz4: {exc}") from None
    if not d.eof:
        raise DecompressionError("lz4: the frame ends before its end mark")
    if d.unused_data:
        raise DecompressionError(f"lz4: {len(d.unused_data)} bytes after the frame")


def _zstd_module() -> ModuleType:
    if sys.version_info >= (3, 14):
        from compression import zstd
    else:
        from backports import zstd
    return zstd


def _unzstd(data: bytes | memoryview, limit: int) -> Iterator[bytes]:
    zstd = _zstd_module()
    total = 0
    rest: bytes | memoryview = data
    try:
        while True:
            d = zstd.ZstdDecompressor()
            chunk = d.decompress(rest, max_length=_ask(limit, total))
            while True:
                total += len(chunk)
                if total > limit:
                    raise _too_large(limit)
                if chunk:
                    yield chunk
                if d.eof or d.needs_input:
                    break
                chunk = d.decompress(b"", max_length=_ask(limit, total))
            if not d.eof:
                raise DecompressionError("zstd: the frame ends early")
            rest = d.unused_data
            if not rest:
                return
    except zstd.ZstdError as exc:
        raise DecompressionError(f"zstd: {exc}") from None


_INFLATE: dict[int, Callable[[bytes | memoryview, int], Iterator[bytes]]] = {1: _gunzip, 3: _unlz4, 4: _unzstd}

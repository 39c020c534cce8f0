"""RecordBatch v2 as opaque bytes: header access, validation, offset rewrite, control batches.

The broker stores batches as they came. On produce it reads the fixed 61-byte header, checks magic,
length and CRC-32C (which covers ``attributes`` to the end of the batch, so ``base_offset`` and
``partition_leader_epoch`` may be rewritten without recomputing it), then walks the records inside
as Kafka's LogValidator does (``validate_records``: every length and count inside the batch, offset
deltas 0..n-1, compressed payloads walked as they inflate) without building an object per record.

Header layout (big endian)::

    0  base_offset i64          8  batch_length i32       12 partition_leader_epoch i32
    16 magic i8                 17 crc u32                21 attributes i16
    23 last_offset_delta i32    27 base_timestamp i64     35 max_timestamp i64
    43 producer_id i64          51 producer_epoch i16     53 base_sequence i32
    57 records_count i32        61 records...

``batch_length`` counts the bytes after the length field, so a batch occupies ``12 + batch_length``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import NamedTuple

import crc32c

from oncelog.protocol.errors import ErrorCode

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # base_offset + batch_length
MAGIC_V2 = 2
CRC_START = 21

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08  # 1 = LogAppendTime
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
NO_TIMESTAMP = -1  # a record or batch without a timestamp (Kafka's RecordBatch.NO_TIMESTAMP)

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1

CONTROL_ABORT = 0
CONTROL_COMMIT = 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_BASE_OFFSET = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


# A compressed batch may inflate to at most this many bytes (Kafka has no such bound; without one a
# few KiB of zstd holding one valid record of gigabytes would keep the broker inflating, a piece at a
# time, for seconds). 128 times the default max.message.bytes.
MAX_UNCOMPRESSED_BYTES = 128 << 20


class InvalidRecordError(ValueError):
    """A batch that must be rejected; ``error_code`` is what the client sees (default CORRUPT_MESSAGE,
    Kafka's CorruptRecordException: a bad CRC, a length past the data)."""

    error_code: int = ErrorCode.corrupt_message


class RecordValidationError(InvalidRecordError):
    """INVALID_RECORD, Kafka's InvalidRecordException: the CRC is right but the content is not a
    well-formed batch (record count, lengths, offset deltas, an undecompressible payload)."""

    error_code = ErrorCode.invalid_record


class RecordsTooLargeError(InvalidRecordError):
    """MESSAGE_TOO_LARGE: a compressed batch inflating past ``MAX_UNCOMPRESSED_BYTES``."""

    error_code = ErrorCode.message_too_large


class BatchHeader(NamedTuple):
    """The decoded 61-byte header of one RecordBatch v2 (a named tuple: built in C, since every
    produced batch's header is read two or three times on the broker's hot path)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Bytes this batch occupies in a log or a Fetch response."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id >= 0

    @property
    def last_sequence(self) -> int:
        """Sequence of the last record, wrapping after INT32_MAX as Kafka does."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def read_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at ``pos`` without validating anything but its presence."""
    if len(buf) - pos < HEADER_SIZE:
        raise InvalidRecordError("truncated record batch header")
    return BatchHeader(*_HEADER.unpack_from(buf, pos))


#: The smallest batch length Kafka's ByteBufferLogInputStream lets through (LegacyRecord.RECORD_OVERHEAD_V0).
MIN_BATCH_LENGTH = 14
_MAGIC_AT = 16


def complete_batch_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> int | None:
    """Kafka's ByteBufferLogInputStream.nextBatch: the size (``12 + batch_length``) of the batch at
    ``pos`` when all of it is there; None when it is not (fewer than 12 bytes, than 17, or than its
    size), which Kafka reads as "no batch". Raises InvalidRecordError (CORRUPT_MESSAGE) as its
    nextBatchSize does, in its order: a length below ``MIN_BATCH_LENGTH`` once 12 bytes are there,
    then a magic outside 0-2 once 17 are (whether or not the rest is)."""
    remaining = len(buf) - pos
    if remaining < LOG_OVERHEAD:
        return None
    (length,) = _I32.unpack_from(buf, pos + 8)
    if length < MIN_BATCH_LENGTH:
        raise InvalidRecordError(f"Record size {length} is less than the minimum record overhead ({MIN_BATCH_LENGTH})")
    if remaining < _MAGIC_AT + 1:
        return None
    magic = struct.unpack_from(">b", buf, pos + _MAGIC_AT)[0]
    if magic < 0 or magic > MAGIC_V2:
        raise InvalidRecordError(f"Invalid magic found in record: {magic}")
    size = LOG_OVERHEAD + length
    return size if remaining >= size else None


def validate_batch(buf: bytes | bytearray | memoryview, pos: int = 0, header: BatchHeader | None = None) -> BatchHeader:
    """Check magic, length and CRC of the batch at ``pos``; return its header (``header``, when the
    caller already read the one at ``pos``, is not decoded again).

    Raises InvalidRecordError: CORRUPT_MESSAGE, or INVALID_RECORD for a negative count or offset
    delta (Kafka's "invalid offset range").
    """
    if header is None:
        header = read_header(buf, pos)
    if header.magic != MAGIC_V2:
        raise InvalidRecordError(f"unsupported record batch magic {header.magic}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordError(f"record batch length {header.batch_length} too small")
    end = pos + header.size
    if end > len(buf):
        raise InvalidRecordError("record batch length exceeds the data")
    if header.last_offset_delta < 0 or header.records_count < 0:
        raise RecordValidationError("negative record count or offset delta")
    computed = crc32c.crc32c(memoryview(buf)[pos + CRC_START : end])
    if computed != header.crc:
        raise InvalidRecordError(f"record batch CRC mismatch ({computed:#x} != {header.crc:#x})")
    return header


def split_batches(buf: bytes | bytearray | memoryview, *, from_client: bool = False,
                  check_records: bool = True,
                  max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES,
                  null_keys: list[list[int]] | None = None) -> list[tuple[int, BatchHeader]]:
    """Validate every batch of an append; return (position, header) pairs.

    The whole buffer must be made of complete, valid batches (no trailing partial batch), as
    Kafka requires of produced data. ``check_records`` walks the records of each batch
    (``validate_records``); ``from_client`` adds Kafka's checks on batches a producer sent (no
    control batch, a producer id comes with a sequence number). With ``null_keys`` (and
    ``check_records``), the walk appends to it, for each batch in order, the indexes of its records
    whose key is null (a compacted topic refuses those).
    """
    out: list[tuple[int, BatchHeader]] = []
    pos = 0
    n = len(buf)
    if n == 0:
        raise InvalidRecordError("empty records")
    while pos < n:
        header = validate_batch(buf, pos)
        if header.records_count <= 0 or header.last_offset_delta != header.records_count - 1:
            # A produced batch holds consecutive offset deltas 0..count-1; anything else would let a
            # client reserve arbitrary offset ranges.
            raise RecordValidationError(
                f"batch claims {header.records_count} records but last offset delta {header.last_offset_delta}")
        if from_client:
            if header.attributes & ATTR_CONTROL:
                raise RecordValidationError("clients may not write control batches")
            if header.producer_id >= 0 and header.base_sequence < 0:
                raise RecordValidationError(
                    f"invalid sequence number {header.base_sequence} in a batch of producer {header.producer_id}")
        if check_records:
            keys: list[int] | None = None if null_keys is None else []
            validate_records(buf, pos, header, max_uncompressed_bytes, keys)
            if null_keys is not None and keys is not None:
                null_keys.append(keys)
        out.append((pos, header))
        pos += header.size
    return out


def validate_records(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader,
                     max_uncompressed_bytes: int = MAX_UNCOMPRESSED_BYTES, null_keys: list[int] | None = None) -> None:
    """Check the records of the (CRC-checked) batch at ``pos`` as Kafka's LogValidator reads them.

    Exactly ``records_count`` records fill the records section (compressed: its decompression),
    each a length varint and a body that its fields fill exactly: attributes, timestamp delta
    (varlong), offset delta (equal to the record's index), key and value (length -1 for null, never
    another negative length), a header count and its headers (key never null). Varints are at most
    5 bytes and fit an int32; varlongs at most 10. Raises RecordValidationError (INVALID_RECORD),
    or RecordsTooLargeError when a compressed payload inflates past ``max_uncompressed_bytes``.
    The index of every record whose key is null is appended to ``null_keys`` when given (the walk
    reads each key length anyway; no object is built per record).

    A compressed payload is walked as it inflates, a piece (``compression.STREAM_CHUNK``) at a time,
    as Kafka's StreamRecordIterator reads it: the walk stops at the first bad record, and once
    ``records_count`` records are read any byte still coming out is refused ("records still
    remaining"), so a bomb costs the pieces before its first fault, not its inflated size.
    """
    start = pos + HEADER_SIZE
    end = pos + header.size
    codec = header.attributes & ATTR_COMPRESSION_MASK
    if codec == 0:
        _walk_records(buf, start, end, header.records_count, null_keys=null_keys)
        return
    from oncelog.protocol import compression  # it imports this module

    if codec not in compression.CODEC_NAMES:
        raise RecordValidationError(f"unknown compression type {codec} in record batch attributes")
    try:
        _walk_stream(compression.inflate_chunks(codec, memoryview(buf)[start:end], max_uncompressed_bytes),
                     header.records_count, null_keys)
    except compression.InflatedTooLargeError as exc:
        raise RecordsTooLargeError(str(exc)) from None
    except compression.DecompressionError as exc:
        raise RecordValidationError(f"{compression.CODEC_NAMES[codec]} records do not decompress: {exc}") from None


_MIN_RECORD = 7  # length varint, attributes, timestamp delta, offset delta, key, value, header count


def _walk_records(buf: bytes | bytearray | memoryview, p: int, end: int, count: int, first: int = 0,
                  final: bool = True, null_keys: list[int] | None = None) -> tuple[int, int]:
    """See ``validate_records``; returns (position after the last record walked, records walked so
    far). This is the produce hot path: one- and two-byte varints are decoded inline (small deltas,
    null keys, values under 8 KiB, no headers), longer ones by ``_uvarint``; zig-zag values are
    compared raw where possible (offset delta i is raw 2*i; a length is even).

    ``final``: ``buf[p:end]`` is all there is (an uncompressed batch): exactly the records from
    index ``first`` to ``count`` must fill it. Otherwise it is the start of what remains of an
    inflating payload (``_walk_stream``): the walk stops before a record that is not all there and
    when ``count`` records are read, and leaves what follows to the caller."""
    if final and count - first > (end - p) // _MIN_RECORD:
        raise RecordValidationError(f"a batch of {end - p} bytes cannot hold {count} records")
    uvarint = _uvarint
    collect = null_keys is not None
    expected_delta = 2 * first  # zig-zag of the record's index
    s = p  # where the record being read starts
    try:
        while expected_delta < 2 * count:
            s = p
            # record length
            raw = buf[p]
            if raw < 0x80:
                p += 1
            else:
                b = buf[p + 1]
                if b < 0x80:
                    raw = (raw & 0x7F) | (b << 7)
                    p += 2
                else:
                    raw, p = uvarint(buf, p, 5)
            if raw & 1 or raw < 12:  # negative, or less than the six one-byte fields
                raise _bad_record(expected_delta, f"invalid record length {(raw >> 1) ^ -(raw & 1)}")
            rec_end = p + (raw >> 1)
            if rec_end > end:
                if not final:
                    return s, expected_delta >> 1
                raise _bad_record(expected_delta, f"its {raw >> 1} bytes run past the end of the batch")
            # attributes (unused in v2), then the timestamp delta (varlong)
            if buf[p + 1] < 0x80:
                q = p + 2
            elif buf[p + 2] < 0x80:
                q = p + 3
            else:
                q = uvarint(buf, p + 1, 10)[1]
            # offset delta
            raw = buf[q]
            if raw < 0x80:
                q += 1
            else:
                b = buf[q + 1]
                if b < 0x80:
                    raw = (raw & 0x7F) | (b << 7)
                    q += 2
                else:
                    raw, q = uvarint(buf, q, 5)
            if raw != expected_delta:
                raise _bad_record(expected_delta,
                                  f"invalid offset delta {(raw >> 1) ^ -(raw & 1)}, expected {expected_delta >> 1}")
            # key
            raw = buf[q]
            if raw < 0x80:
                q += 1
            else:
                raw, q = uvarint(buf, q, 5)
            if raw & 1:
                if raw != 1:
                    raise _bad_record(expected_delta, f"invalid key length {-((raw + 1) >> 1)}")
                if collect:
                    null_keys.append(expected_delta >> 1)  # type: ignore[union-attr]
            else:
                q += raw >> 1
            # value
            raw = buf[q]
            if raw < 0x80:
                q += 1
            else:
                b = buf[q + 1]
                if b < 0x80:
                    raw = (raw & 0x7F) | (b << 7)
                    q += 2
                else:
                    raw, q = uvarint(buf, q, 5)
            if raw & 1:
                if raw != 1:
                    raise _bad_record(expected_delta, f"invalid value length {-((raw + 1) >> 1)}")
            else:
                q += raw >> 1
            # headers
            if buf[q]:
                q = _walk_headers(buf, q, rec_end, expected_delta >> 1)
            else:
                q += 1
            if q != rec_end:
                raise _bad_record(expected_delta,
                                  f"invalid record size: its fields take {q - p} bytes, its length says {rec_end - p}")
            p = rec_end
            expected_delta += 2
    except IndexError:
        if not final and _runs_past(buf, s, end):
            return s, expected_delta >> 1
        raise _bad_record(expected_delta, "premature end of the records") from None
    if final and p != end:
        raise RecordValidationError(
            f"incorrect declared batch size: {end - p} bytes remain after {count} records")
    return p, count


def _runs_past(buf: bytes | bytearray | memoryview, s: int, end: int) -> bool:
    """Whether the record starting at ``s`` runs past ``end`` (its length varint included), that
    is, whether a walk that stopped inside it saw only part of it. Its fields never read past its
    own end unless it is bad, so a record all there that stopped a walk is a bad record."""
    raw = 0
    for k in range(5):
        if s + k >= end:
            return True
        b = buf[s + k]
        raw |= (b & 0x7F) << (7 * k)
        if b < 0x80:
            return s + k + 1 + (raw >> 1) > end
    return False


def _walk_stream(chunks: Iterator[bytes], count: int, null_keys: list[int] | None = None) -> None:
    """``_walk_records`` over a payload arriving in pieces (``compression.inflate_chunks``).

    The records all there in what has arrived are walked by ``_walk_records``; a record that
    straddles the end of what arrived (or does not fit a piece) is read field by field as more
    arrives (``_walk_one``), skipping keys and values without keeping them, so at most about two
    pieces are held at a time. When ``count`` records are read, anything more is refused without
    inflating further; otherwise the rest of the stream is drained (nothing should come out) so
    that its end is checked (a truncated stream, bytes after it)."""
    inflow = _Inflow(chunks)
    index = 0
    while index < count:
        if inflow.p == len(inflow.buf) and not inflow.more():
            raise _bad_record(2 * index, "premature end of the records")
        inflow.p, index = _walk_records(inflow.buf, inflow.p, len(inflow.buf), count, index, False, null_keys)
        if index < count and inflow.p < len(inflow.buf):
            _walk_one(inflow, index, null_keys)
            index += 1
    if inflow.p < len(inflow.buf) or inflow.more():
        raise RecordValidationError(
            f"incorrect declared batch size: records still remaining after {count} records")


class _Inflow:
    """Inflated bytes read forward: ``buf[p:]`` has arrived and is unread; ``more`` appends the next
    piece, dropping what was read."""

    __slots__ = ("at", "buf", "chunks", "p")

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self.chunks = chunks
        self.buf = bytearray()
        self.p = 0
        self.at = 0  # position in the stream of buf[0]

    def more(self) -> bool:
        """Append the next piece; False at the end of the stream."""
        chunk = next(self.chunks, None)
        if chunk is None:
            return False
        del self.buf[:self.p]
        self.at += self.p
        self.p = 0
        self.buf += chunk
        return True

    def pos(self) -> int:
        return self.at + self.p

    def byte(self) -> int:
        while self.p == len(self.buf):
            if not self.more():
                raise EOFError
        b = self.buf[self.p]
        self.p += 1
        return b

    def uvarint(self, max_bytes: int) -> int:
        """As ``_uvarint``: the raw varint, at most ``max_bytes`` bytes and ``8 * max_bytes - 8`` bits."""
        raw = 0
        for k in range(max_bytes):
            b = self.byte()
            raw |= (b & 0x7F) << (7 * k)
            if not b & 0x80:
                bits = 32 if max_bytes == 5 else 64
                if raw >> bits:
                    raise RecordValidationError(f"varint {raw} does not fit {bits} bits")
                return raw
        raise RecordValidationError(f"varint longer than {max_bytes} bytes")

    def skip(self, n: int, rec_end: int, i: int) -> None:
        """Pass ``n`` bytes of the record ending at ``rec_end`` (refused at once if they run past it)."""
        if self.pos() + n > rec_end:
            raise RecordValidationError(f"record {i}: a field of {n} bytes runs past the record's end")
        while n > len(self.buf) - self.p:
            n -= len(self.buf) - self.p
            self.p = len(self.buf)
            if not self.more():
                raise EOFError
        self.p += n


def _walk_one(inflow: _Inflow, i: int, null_keys: list[int] | None) -> None:
    """Record ``i``, at the reader's position, field by field (the checks of ``_walk_records``)."""
    try:
        raw = inflow.uvarint(5)
        if raw & 1 or raw < 12:
            raise _bad_record(2 * i, f"invalid record length {(raw >> 1) ^ -(raw & 1)}")
        rec_end = inflow.pos() + (raw >> 1)
        inflow.byte()  # attributes
        inflow.uvarint(10)  # timestamp delta
        raw = inflow.uvarint(5)
        if raw != 2 * i:
            raise _bad_record(2 * i, f"invalid offset delta {(raw >> 1) ^ -(raw & 1)}, expected {i}")
        for what in ("key", "value"):
            raw = inflow.uvarint(5)
            if raw & 1:
                if raw != 1:
                    raise _bad_record(2 * i, f"invalid {what} length {-((raw + 1) >> 1)}")
                if what == "key" and null_keys is not None:
                    null_keys.append(i)
            else:
                inflow.skip(raw >> 1, rec_end, i)
        raw = inflow.uvarint(5)
        if raw & 1:
            raise _bad_record(2 * i, f"invalid number of record headers {-((raw + 1) >> 1)}")
        if raw >> 1 > rec_end - inflow.pos():
            raise _bad_record(2 * i, f"{raw >> 1} record headers cannot fit in the record")
        for _ in range(raw >> 1):
            raw = inflow.uvarint(5)
            if raw & 1:
                raise _bad_record(2 * i, f"invalid negative header key size {-((raw + 1) >> 1)}")
            inflow.skip(raw >> 1, rec_end, i)
            raw = inflow.uvarint(5)
            if raw & 1:
                if raw != 1:
                    raise _bad_record(2 * i, f"invalid header value length {-((raw + 1) >> 1)}")
            else:
                inflow.skip(raw >> 1, rec_end, i)
            if inflow.pos() > rec_end:
                raise _bad_record(2 * i, "a record header runs past the record")
        if inflow.pos() != rec_end:
            raise _bad_record(2 * i, f"invalid record size: its fields end {inflow.pos() - rec_end} bytes past it"
                              if inflow.pos() > rec_end else "invalid record size: its fields do not fill it")
    except EOFError:
        raise _bad_record(2 * i, "premature end of the records") from None


def _bad_record(expected_delta: int, why: str) -> RecordValidationError:
    return RecordValidationError(f"record {expected_delta >> 1}: {why}")


def _walk_headers(buf: bytes | bytearray | memoryview, q: int, rec_end: int, i: int) -> int:
    raw, q = _uvarint(buf, q, 5)
    if raw & 1:
        raise RecordValidationError(f"record {i}: invalid number of record headers {-((raw + 1) >> 1)}")
    n = raw >> 1
    if n > rec_end - q:
        raise RecordValidationError(f"record {i}: {n} record headers cannot fit in the record")
    for _ in range(n):
        raw, q = _uvarint(buf, q, 5)
        if raw & 1:
            raise RecordValidationError(f"record {i}: invalid negative header key size {-((raw + 1) >> 1)}")
        q += raw >> 1
        raw, q = _uvarint(buf, q, 5)
        if raw & 1:
            if raw != 1:
                raise RecordValidationError(f"record {i}: invalid header value length {-((raw + 1) >> 1)}")
        else:
            q += raw >> 1
        if q > rec_end:
            raise RecordValidationError(f"record {i}: a record header runs past the record")
    return q


def _uvarint(buf: bytes | bytearray | memoryview, p: int, max_bytes: int) -> tuple[int, int]:
    """Raw (still zig-zag encoded) varint at ``p`` -> (value, next position); at most ``max_bytes``
    bytes (5: an int32, 10: an int64) and a value that fits that width."""
    raw = 0
    shift = 0
    limit = p + max_bytes
    bits = 32 if max_bytes == 5 else 64
    while p < limit:
        b = buf[p]
        p += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            if raw >> bits:
                raise RecordValidationError(f"varint {raw} does not fit {bits} bits")
            return raw, p
        shift += 7
    raise RecordValidationError(f"varint longer than {max_bytes} bytes")


def iter_headers(buf: bytes | bytearray | memoryview, pos: int = 0) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each complete batch; stops silently at a partial tail.

    Used on data the broker itself wrote (segments, fetch responses), so the CRC is not checked.
    """
    n = len(buf)
    while n - pos >= HEADER_SIZE:
        header = read_header(buf, pos)
        if header.batch_length < HEADER_SIZE - LOG_OVERHEAD or pos + header.size > n:
            return
        yield pos, header
        pos += header.size


def set_base_offset(buf: bytearray, pos: int, base_offset: int) -> None:
    """Rewrite a batch's base offset in place (outside the CRC)."""
    _BASE_OFFSET.pack_into(buf, pos, base_offset)


def set_partition_leader_epoch(buf: bytearray, pos: int, epoch: int) -> None:
    """Stamp a batch with the leader epoch it was appended in (outside the CRC, like the offset)."""
    _I32.pack_into(buf, pos + 12, epoch)


def set_log_append_time(buf: bytearray, pos: int, timestamp_ms: int) -> None:
    """Mark a batch LogAppendTime and set its max timestamp; recomputes the CRC (it changes)."""
    header = read_header(buf, pos)
    attrs = header.attributes | ATTR_TIMESTAMP_TYPE
    struct.pack_into(">h", buf, pos + 21, attrs)
    _I64.pack_into(buf, pos + 35, timestamp_ms)
    crc = crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + header.size])
    struct.pack_into(">I", buf, pos + 17, crc)


def set_create_time(buf: bytearray, pos: int, max_timestamp_ms: int) -> None:
    """Mark a batch CreateTime with ``max_timestamp_ms`` as its max timestamp; recomputes the CRC."""
    header = read_header(buf, pos)
    struct.pack_into(">h", buf, pos + 21, header.attributes & ~ATTR_TIMESTAMP_TYPE)
    _I64.pack_into(buf, pos + 35, max_timestamp_ms)
    crc = crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + header.size])
    struct.pack_into(">I", buf, pos + 17, crc)


def encode_uvarint(n: int) -> bytes:
    """Unsigned varint (7 bits a byte, low first): compact lengths of the flexible protocol
    versions, and the body of ``encode_varint``. ``n`` must not be negative."""
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zig-zag varint as RecordBatch v2 records use."""
    return encode_uvarint((value << 1) ^ (value >> 63))


def encode_record(offset_delta: int, timestamp_delta: int, key: bytes | None, value: bytes | None,
                  headers: tuple[tuple[str, bytes | None], ...] = ()) -> bytes:
    """Encode one record of a v2 batch (attributes 0)."""
    body = bytearray(b"\x00")
    body += encode_varint(timestamp_delta)
    body += encode_varint(offset_delta)
    for part in (key, value):
        if part is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(part))
            body += part
    body += encode_varint(len(headers))
    for hkey, hval in headers:
        kb = hkey.encode()
        body += encode_varint(len(kb)) + kb
        if hval is None:
            body += encode_varint(-1)
        else:
            body += encode_varint(len(hval)) + hval
    return encode_varint(len(body)) + bytes(body)


def build_batch(records: list[bytes], *, base_offset: int = 0, base_timestamp: int, max_timestamp: int | None = None,
                attributes: int = 0, producer_id: int = NO_PRODUCER_ID,
                producer_epoch: int = NO_PRODUCER_EPOCH, base_sequence: int = NO_SEQUENCE,
                partition_leader_epoch: int = 0) -> bytes:
    """Assemble a batch from already-encoded records (see encode_record) with a valid CRC."""
    payload = b"".join(records)
    count = len(records)
    body_after_crc = struct.pack(
        ">hiqqqhii", attributes, max(count - 1, 0), base_timestamp,
        base_timestamp if max_timestamp is None else max_timestamp,
        producer_id, producer_epoch, base_sequence, count,
    ) + payload
    crc = crc32c.crc32c(body_after_crc)
    batch_length = 4 + 1 + 4 + len(body_after_crc)
    return struct.pack(">qiibI", base_offset, batch_length, partition_leader_epoch, MAGIC_V2, crc) + body_after_crc


def build_control_batch(control_type: int, *, producer_id: int, producer_epoch: int,
                        coordinator_epoch: int, timestamp_ms: int, base_offset: int = 0) -> bytes:
    """A transaction marker: one control record, key (version 0, type), value (version 0, epoch).

    librdkafka skips a control record only if its key is exactly these four bytes.
    """
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    record = encode_record(0, 0, key, value)
    return build_batch([record], base_offset=base_offset, base_timestamp=timestamp_ms,
                       attributes=ATTR_TRANSACTIONAL | ATTR_CONTROL, producer_id=producer_id,
                       producer_epoch=producer_epoch, base_sequence=NO_SEQUENCE)


class ControlMarker(NamedTuple):
    """A transaction marker: CONTROL_ABORT or CONTROL_COMMIT, and the coordinator epoch in its value."""

    type: int
    coordinator_epoch: int


def read_control_marker(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> ControlMarker:
    """Type and coordinator epoch of the control batch at ``pos`` (value: version i16, epoch i32)."""
    ctype, p = _control_key(buf, pos, header)
    end = pos + header.size
    try:
        value_len, p = read_varint(buf, p)
    except IndexError:
        raise InvalidRecordError("malformed control record value") from None
    if value_len < 6 or p + 6 > end:
        raise InvalidRecordError("malformed control record value")
    _version, coordinator_epoch = struct.unpack_from(">hi", buf, p)
    return ControlMarker(ctype, int(coordinator_epoch))


def control_type_of(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> int:
    """Return CONTROL_ABORT or CONTROL_COMMIT for a control batch written by build_control_batch."""
    return _control_key(buf, pos, header)[0]


def _control_key(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> tuple[int, int]:
    """(control type, position after the key) of the control batch at ``pos``.

    The first record starts right after the header: length varint, attributes, ts delta varint,
    offset delta varint, key length varint (4 -> zig-zag 8), then the key's 4 bytes.
    """
    p = pos + HEADER_SIZE
    end = pos + header.size
    # skip record length varint
    while p < end and buf[p] & 0x80:
        p += 1
    p += 1
    p += 1  # record attributes
    for _ in range(2):  # timestamp delta, offset delta
        while p < end and buf[p] & 0x80:
            p += 1
        p += 1
    key_len_zz = buf[p]
    p += 1
    if key_len_zz != 8 or p + 4 > end:
        raise InvalidRecordError("malformed control record key")
    _version, ctype = struct.unpack_from(">hh", buf, p)
    if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
        raise InvalidRecordError(f"unknown control record type {ctype}")
    return int(ctype), p + 4


def read_varint(buf: bytes | bytearray | memoryview, p: int) -> tuple[int, int]:
    """Zig-zag varint at ``p`` -> (value, next position)."""
    shift = 0
    raw = 0
    while True:
        b = buf[p]
        p += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), p
        shift += 7
        if shift > 63:
            raise InvalidRecordError("varint too long")


def record_timestamps(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of an uncompressed batch, decoding only record prefixes."""
    if header.attributes & ATTR_COMPRESSION_MASK:
        raise InvalidRecordError("compressed batch")
    p = pos + HEADER_SIZE
    end = pos + header.size
    for _ in range(header.records_count):
        length, p = read_varint(buf, p)
        body = p
        ts_delta, q = read_varint(buf, p + 1)  # skip the record's attributes byte
        offset_delta, _ = read_varint(buf, q)
        yield header.base_offset + offset_delta, header.base_timestamp + ts_delta
        p = body + length
        if p > end:
            raise InvalidRecordError("record runs past the end of its batch")

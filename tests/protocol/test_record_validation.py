"""Record validation on produce (Kafka's LogValidator): golden bad batches with a valid CRC, every
codec, bounded decompression, and a differential property test against a plain reference reader."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable

import cramjam
import crc32c
import lz4.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.protocol import compression
from oncelog.protocol import records as r
from oncelog.protocol.errors import ErrorCode

try:
    from compression import zstd  # type: ignore[import-not-found]
except ImportError:
    from backports import zstd

INVALID_RECORD = ErrorCode.invalid_record
CORRUPT_MESSAGE = ErrorCode.corrupt_message
MESSAGE_TOO_LARGE = ErrorCode.message_too_large


# --- building batches, good and bad ----------------------------------------------------------------

def zz(v: int) -> bytes:
    """Zig-zag varint of a signed value (any width)."""
    return r.encode_uvarint((v << 1) ^ (v >> 63) if v >= 0 else ((-v) << 1) - 1)


def raw_record(body: bytes) -> bytes:
    return zz(len(body)) + body


def body(offset_delta: int, *, ts_delta: int = 0, key: bytes | None = None, value: bytes | None = b"v",
         headers: list[tuple[bytes, bytes | None]] | None = None, attributes: int = 0) -> bytes:
    out = bytes([attributes]) + zz(ts_delta) + zz(offset_delta)
    for part in (key, value):
        out += zz(-1) if part is None else zz(len(part)) + part
    hs = headers or []
    out += zz(len(hs))
    for hk, hv in hs:
        out += zz(len(hk)) + hk
        out += zz(-1) if hv is None else zz(len(hv)) + hv
    return out


def with_crc(header_and_payload: bytes | bytearray) -> bytes:
    data = bytearray(header_and_payload)
    struct.pack_into(">i", data, 8, len(data) - 12)
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    return bytes(data)


def batch_of(payload: bytes, count: int, *, last_offset_delta: int | None = None, attributes: int = 0,
             producer_id: int = -1, base_sequence: int = -1) -> bytes:
    """A batch with a valid CRC around any payload (the records section, compressed or not)."""
    head = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, attributes,
                       count - 1 if last_offset_delta is None else last_offset_delta,
                       1_700_000_000_000, 1_700_000_000_000, producer_id, 0, base_sequence, count)
    return with_crc(head + payload)


def records_of(bodies: list[bytes]) -> bytes:
    return b"".join(raw_record(b) for b in bodies)


def good(n: int = 3, **kw: object) -> bytes:
    return batch_of(records_of([body(i, **kw) for i in range(n)]), n)  # type: ignore[arg-type]


def compress(codec: int, data: bytes) -> bytes:
    if codec == 1:
        return gzip.compress(data)
    if codec == 2:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == 3:  # independent blocks, as every Kafka client writes (Kafka's reader refuses linked ones)
        return bytes(lz4.frame.compress(data, block_linked=False))
    return bytes(zstd.compress(data))


def xerial(data: bytes, chunk: int = 100) -> bytes:
    out = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
    for i in range(0, len(data), chunk):
        c = bytes(cramjam.snappy.compress_raw(data[i:i + chunk]))
        out += struct.pack(">i", len(c)) + c
    return out


def rejects(data: bytes, code: int, match: str, **kw: object) -> None:
    with pytest.raises(r.InvalidRecordError, match=match) as info:
        r.split_batches(data, **kw)  # type: ignore[arg-type]
    assert info.value.error_code == code, (info.value, info.value.error_code)


# --- valid batches pass ----------------------------------------------------------------------------

def test_valid_batches_of_every_shape_pass() -> None:
    r.split_batches(good(1))
    r.split_batches(good(300, ts_delta=70_000, key=b"k" * 200, value=b"v" * 9000))  # multi-byte varints
    r.split_batches(good(5, key=None, value=None))
    r.split_batches(good(2, headers=[(b"h", b"x"), (b"", None), (b"long" * 40, b"y" * 300)]))
    r.split_batches(good(2, ts_delta=-5, attributes=0x7F))  # attributes of a record are unused in v2
    recs = [r.encode_record(i, i, b"key", b"value", (("h", b"1"),)) for i in range(20_000)]  # 3-byte deltas
    r.split_batches(r.build_batch(recs, base_timestamp=0))
    r.split_batches(r.build_control_batch(r.CONTROL_COMMIT, producer_id=1, producer_epoch=0,
                                          coordinator_epoch=0, timestamp_ms=0))


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_compressed_batches_of_every_codec_pass(codec: int) -> None:
    payload = records_of([body(i, key=b"k%d" % i, value=b"value" * 50) for i in range(100)])
    r.split_batches(batch_of(compress(codec, payload), 100, attributes=codec))
    # plus the transactional and timestamp-type bits beside the codec
    r.split_batches(batch_of(compress(codec, payload), 100, attributes=codec | 0x10, producer_id=5,
                             base_sequence=0), from_client=True)


def test_java_framings_pass_too() -> None:
    payload = records_of([body(i, value=b"x" * 77) for i in range(50)])
    r.split_batches(batch_of(xerial(payload), 50, attributes=2))  # the Java client's snappy
    two_members = gzip.compress(payload[:100]) + gzip.compress(payload[100:])
    r.split_batches(batch_of(two_members, 50, attributes=1))
    two_frames = zstd.compress(payload[:333]) + zstd.compress(payload[333:])
    r.split_batches(batch_of(two_frames, 50, attributes=4))


# --- golden bad batches: the CRC is right, the records are not ---------------------------------------

GOLDEN: list[tuple[str, Callable[[], bytes], int, str]] = [
    ("count larger than the records",
     lambda: batch_of(records_of([body(0, value=b"x" * 40), body(1, value=b"x" * 40)]), 3), INVALID_RECORD,
     "record 2: premature end"),
    ("count smaller than the records", lambda: batch_of(records_of([body(0), body(1)]), 1), INVALID_RECORD,
     "2 records|remain"),
    ("count vs last offset delta", lambda: batch_of(records_of([body(0), body(1)]), 2, last_offset_delta=5),
     INVALID_RECORD, "last offset delta"),
    ("zero count", lambda: batch_of(b"", 0, last_offset_delta=0), INVALID_RECORD, "claims 0 records"),
    ("count far beyond the bytes", lambda: batch_of(records_of([body(0)]), 2**31 - 1), INVALID_RECORD,
     "cannot hold"),
    ("trailing garbage after the records", lambda: batch_of(records_of([body(0)]) + b"\x00\x00", 1),
     INVALID_RECORD, "remain"),
    ("record length past the batch", lambda: batch_of(zz(200) + body(0), 1), INVALID_RECORD, "past the end"),
    ("negative record length", lambda: batch_of(zz(-6) + body(0), 1), INVALID_RECORD, "invalid record length"),
    ("zero record length", lambda: batch_of(zz(0) + b"\x00" * 8, 1), INVALID_RECORD, "invalid record length"),
    ("record length longer than its fields", lambda: batch_of(zz(len(body(0)) + 2) + body(0) + b"\x00\x00", 1),
     INVALID_RECORD, "invalid record size"),
    ("record length shorter than its fields",
     lambda: batch_of(zz(len(body(0, value=b"abc")) - 2) + body(0, value=b"abc"), 1), INVALID_RECORD,
     "invalid record size|remain"),
    ("offset deltas out of order", lambda: batch_of(records_of([body(1), body(0)]), 2), INVALID_RECORD,
     "invalid offset delta 1, expected 0"),
    ("offset delta gap", lambda: batch_of(records_of([body(0), body(2)]), 2), INVALID_RECORD,
     "invalid offset delta 2, expected 1"),
    ("negative offset delta", lambda: batch_of(records_of([body(-1)]), 1), INVALID_RECORD,
     "invalid offset delta -1"),
    ("key length past the record",
     lambda: batch_of(raw_record(b"\x00\x00\x00" + zz(50) + b"k" * 10 + b"\x01\x00"), 1),
     INVALID_RECORD, "invalid record size|premature"),
    ("key length -2", lambda: batch_of(raw_record(b"\x00\x00\x00" + zz(-2) + zz(-1) + b"\x00"), 1),
     INVALID_RECORD, "invalid key length -2"),
    ("value length -7", lambda: batch_of(raw_record(b"\x00\x00\x00" + zz(-1) + zz(-7) + b"\x00"), 1),
     INVALID_RECORD, "invalid value length -7"),
    ("negative header count", lambda: batch_of(raw_record(b"\x00\x00\x00\x01\x01" + zz(-1)), 1),
     INVALID_RECORD, "number of record headers -1"),
    ("header count beyond the record", lambda: batch_of(raw_record(b"\x00\x00\x00\x01\x01" + zz(1_000_000)), 1),
     INVALID_RECORD, "cannot fit"),
    ("negative header key length",
     lambda: batch_of(raw_record(b"\x00\x00\x00\x01\x01" + zz(1) + zz(-1) + zz(-1)), 1), INVALID_RECORD,
     "negative header key size"),
    ("header value past the record",
     lambda: batch_of(raw_record(b"\x00\x00\x00\x01\x01" + zz(1) + zz(1) + b"h" + zz(90)), 1),
     INVALID_RECORD, "header runs past|invalid record size"),
    ("six-byte varint", lambda: batch_of(raw_record(b"\x00" + b"\x00\x80\x80\x80\x80\x80\x00" + b"\x01\x01\x00"), 1),
     INVALID_RECORD, "varint longer than 5 bytes"),
    ("varint past int32", lambda: batch_of(raw_record(b"\x00\x00" + b"\xff\xff\xff\xff\x7f" + b"\x01\x01\x00"), 1),
     INVALID_RECORD, "does not fit 32 bits"),
    ("eleven-byte varlong timestamp", lambda: batch_of(raw_record(b"\x00" + b"\x80" * 10 + b"\x00\x00\x01\x01\x00"),
                                                        1), INVALID_RECORD, "varint longer than 10 bytes"),
    ("records cut inside a varint", lambda: batch_of(b"\x0e\x00" + b"\x80" * 6, 1), INVALID_RECORD,
     "record 0: premature end"),
    ("unknown codec 5", lambda: batch_of(records_of([body(0)]), 1, attributes=5), INVALID_RECORD,
     "unknown compression type 5"),
    ("unknown codec 7", lambda: batch_of(records_of([body(0)]), 1, attributes=7), INVALID_RECORD,
     "unknown compression type 7"),
    ("gzip garbage", lambda: batch_of(b"\x1f\x8b\x08\x00garbage-garbage", 1, attributes=1), INVALID_RECORD,
     "gzip records do not decompress"),
    ("gzip truncated", lambda: batch_of(gzip.compress(records_of([body(0)]))[:-6], 1, attributes=1),
     INVALID_RECORD, "gzip records do not decompress"),
    ("gzip with trailing bytes", lambda: batch_of(gzip.compress(records_of([body(0)])) + b"xyz", 1, attributes=1),
     INVALID_RECORD, "gzip records do not decompress"),
    ("snappy garbage", lambda: batch_of(b"\x10\xff\xfe\xfd\xfc\xfb\xfa", 1, attributes=2), INVALID_RECORD,
     "snappy records do not decompress"),
    ("snappy claiming 4 GiB", lambda: batch_of(r.encode_uvarint(0xFFFFFFFF) + b"\x00" * 10, 1, attributes=2),
     MESSAGE_TOO_LARGE, "inflate past"),
    ("xerial chunk past the payload", lambda: batch_of(xerial(records_of([body(0)]))[:-2], 1, attributes=2),
     INVALID_RECORD, "snappy records do not decompress"),
    ("lz4 garbage", lambda: batch_of(b"\x04\x22\x4d\x18garbage", 1, attributes=3), INVALID_RECORD,
     "lz4 records do not decompress"),
    ("lz4 truncated", lambda: batch_of(lz4.frame.compress(records_of([body(0)] * 1))[:-5], 1, attributes=3),
     INVALID_RECORD, "lz4 records do not decompress"),
    ("lz4 with trailing bytes", lambda: batch_of(lz4.frame.compress(records_of([body(0)])) + b"!", 1, attributes=3),
     INVALID_RECORD, "after the frame"),
    ("zstd garbage", lambda: batch_of(b"\x28\xb5\x2f\xfdgarbage", 1, attributes=4), INVALID_RECORD,
     "zstd records do not decompress"),
    ("zstd truncated", lambda: batch_of(zstd.compress(records_of([body(0)]))[:-3], 1, attributes=4),
     INVALID_RECORD, "zstd records do not decompress"),
    ("empty compressed payload", lambda: batch_of(b"", 1, attributes=4), INVALID_RECORD, "do not decompress"),
    ("compressed, garbage records inside", lambda: batch_of(compress(3, b"\x05garbage!"), 1, attributes=3),
     INVALID_RECORD, "record 0"),
    ("compressed, count larger than inside",
     lambda: batch_of(compress(4, records_of([body(0), body(1)])), 3, attributes=4), INVALID_RECORD,
     "premature end|run past|cannot hold"),
    ("compressed, records remaining",
     lambda: batch_of(compress(1, records_of([body(0), body(1)])), 1, attributes=1), INVALID_RECORD, "remain"),
    ("compressed, offset deltas wrong",
     lambda: batch_of(compress(2, records_of([body(0), body(0)])), 2, attributes=2), INVALID_RECORD,
     "invalid offset delta 0, expected 1"),
]


@pytest.mark.parametrize(("name", "make", "code", "match"), GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_bad_batches_are_refused_with_kafkas_code(name: str, make: Callable[[], bytes], code: int,
                                                        match: str) -> None:
    data = make()
    r.validate_batch(data)  # header and CRC are fine: only the record walk can find the fault
    rejects(data, code, match)


def test_client_only_rules() -> None:
    marker = r.build_control_batch(r.CONTROL_ABORT, producer_id=3, producer_epoch=0, coordinator_epoch=0,
                                   timestamp_ms=0)
    r.split_batches(marker)  # the coordinator's own markers pass
    rejects(marker, INVALID_RECORD, "control batches", from_client=True)
    seqless = batch_of(records_of([body(0)]), 1, producer_id=7, base_sequence=-1)
    r.split_batches(seqless)
    rejects(seqless, INVALID_RECORD, "invalid sequence number -1", from_client=True)


def test_a_negative_offset_range_is_invalid_record() -> None:
    rejects(batch_of(records_of([body(0)]), 1, last_offset_delta=-1), INVALID_RECORD, "negative record count")
    rejects(batch_of(records_of([body(0)]), -1, last_offset_delta=0), INVALID_RECORD, "negative record count")


def test_the_crc_still_comes_first() -> None:
    data = bytearray(good(2))
    data[-1] ^= 1
    rejects(bytes(data), CORRUPT_MESSAGE, "CRC")


# --- bounded decompression -------------------------------------------------------------------------

@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_a_bomb_inflates_only_to_the_bound(codec: int) -> None:
    zeros = b"\x00" * (8 << 20)
    packed = compress(codec, zeros)
    assert len(packed) < 1 << 20
    with pytest.raises(compression.InflatedTooLargeError):
        b"".join(compression.inflate_chunks(codec, packed, 1 << 20))
    assert b"".join(compression.inflate_chunks(codec, packed, 8 << 20)) == zeros  # exactly at the bound is fine
    # a valid record whose value inflates past the bound
    huge = compress(codec, raw_record(body(0, value=zeros)))
    rejects(batch_of(huge, 1, attributes=codec), MESSAGE_TOO_LARGE, "inflate past", max_uncompressed_bytes=1 << 20)
    r.split_batches(batch_of(huge, 1, attributes=codec), max_uncompressed_bytes=9 << 20)


def test_a_zstd_frame_claiming_a_huge_content_size_allocates_nothing_big() -> None:
    import resource

    # A single-segment frame declaring 2**40 bytes of content, then one last RLE block of 100000 zeros.
    block = (1 | 1 << 1 | 100_000 << 3).to_bytes(3, "little") + b"\x00"
    frame = b"\x28\xb5\x2f\xfd" + bytes([0xE0]) + (1 << 40).to_bytes(8, "little") + block
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(compression.DecompressionError):
        b"".join(compression.inflate_chunks(4, frame, 1 << 20))
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 64 << 10  # KiB: < 64 MiB


# --- the walker against a plain reference reader -----------------------------------------------------

class Bad(Exception):
    pass


def ref_varint(buf: bytes, p: int, nbytes: int) -> tuple[int, int]:
    raw = 0
    for k in range(nbytes):
        if p >= len(buf):
            raise Bad("eof")
        b = buf[p]
        p += 1
        raw |= (b & 0x7F) << (7 * k)
        if b < 0x80:
            if raw >> (32 if nbytes == 5 else 64):
                raise Bad("wide")
            return (raw >> 1) ^ -(raw & 1), p
    raise Bad("long")


def ref_validate(payload: bytes, count: int) -> None:
    """Kafka's DefaultRecord.readFrom, field by field, over an uncompressed records section."""
    p = 0
    for i in range(count):
        length, p = ref_varint(payload, p, 5)
        if length <= 0 or p + length > len(payload):
            raise Bad("length")
        end = p + length
        q = p + 1
        _, q = ref_varint(payload, q, 10)
        delta, q = ref_varint(payload, q, 5)
        if delta != i:
            raise Bad("delta")
        for _ in range(2):
            n, q = ref_varint(payload, q, 5)
            if n < -1:
                raise Bad("negative")
            q += max(n, 0)
        nh, q = ref_varint(payload, q, 5)
        if nh < 0 or nh > end - q:
            raise Bad("headers")
        for _ in range(nh):
            n, q = ref_varint(payload, q, 5)
            if n < 0:
                raise Bad("header key")
            q += n
            n, q = ref_varint(payload, q, 5)
            if n < -1:
                raise Bad("header value")
            q += max(n, 0)
            if q > end:
                raise Bad("header past")
        if q != end:
            raise Bad("size")
        p = end
    if p != len(payload):
        raise Bad("remaining")


record_bodies = st.lists(
    st.builds(lambda ts, k, v, hs: (ts, k, v, hs),
              st.integers(-(2**40), 2**40), st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=300),
              st.lists(st.tuples(st.binary(max_size=20), st.none() | st.binary(max_size=20)), max_size=3)),
    min_size=1, max_size=40)


def mutated_records(recs: list, data: st.DataObject) -> tuple[bytes, int]:
    """The records payload of ``recs`` (``record_bodies``) and its declared count, with up to three
    mutations drawn from ``data``: a bit flipped, a byte set, the payload cut, bytes inserted, the
    count changed."""
    payload = bytearray(records_of([body(i, ts_delta=ts, key=k, value=v, headers=hs)
                                    for i, (ts, k, v, hs) in enumerate(recs)]))
    count = len(recs)
    for _ in range(data.draw(st.integers(0, 3), label="mutations")):
        kind = data.draw(st.sampled_from(["flip", "set", "cut", "insert", "count"]))
        if kind == "count":
            count = data.draw(st.integers(1, 50))
            continue
        if not payload:
            break
        at = data.draw(st.integers(0, len(payload) - 1))
        if kind == "flip":
            payload[at] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "set":
            payload[at] = data.draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF]))
        elif kind == "cut":
            del payload[at:]
        else:
            payload[at:at] = data.draw(st.binary(min_size=1, max_size=4))
    return bytes(payload), count


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_bodies, st.data())
def test_walker_agrees_with_the_reference_on_mutated_batches(recs: list, data: st.DataObject) -> None:
    payload, count = mutated_records(recs, data)
    batch = batch_of(payload, count)
    try:
        ref_validate(payload, count)
        expected_ok = True
    except Bad:
        expected_ok = False
    for codec in (0, data.draw(st.sampled_from([1, 2, 3, 4]))):
        b = batch if codec == 0 else batch_of(compress(codec, payload), count, attributes=codec)
        try:
            r.split_batches(b)
            ok = True
        except r.RecordValidationError:
            ok = False
        assert ok == expected_ok, (codec, payload.hex(), count)


def test_kio_reads_whatever_the_walker_accepts() -> None:
    """The batches clients fetch back must parse: kio's reader agrees on a spread of valid shapes."""
    from kio.records.readers import read_batch

    data = good(50, ts_delta=-3, key=b"k", value=None, headers=[(b"h", None)])
    r.split_batches(data)
    batch, _ = read_batch(data, 0)
    assert [rec.offset for rec in batch.records] == list(range(50))


def test_gzip_of_zlib_format_is_refused() -> None:
    """Kafka's gzip is the gzip container; a bare zlib stream is not a valid gzip payload."""
    payload = records_of([body(0)])
    rejects(batch_of(zlib.compress(payload), 1, attributes=1), INVALID_RECORD, "gzip")

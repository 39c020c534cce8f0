"""Produce validation walks a compressed payload as it inflates (Kafka's StreamRecordIterator): a bomb
is refused at its first bad record, or as soon as bytes follow the declared count, having inflated a
piece or two, not its whole size; records split across pieces anywhere are read as the whole-buffer
walker reads them; memory stays at a few pieces, also for a valid record of 100 MiB."""

from __future__ import annotations

import gzip
import struct
import subprocess
import sys
import zlib
from collections.abc import Iterator

import cramjam
import lz4.frame
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oncelog.protocol import compression
from oncelog.protocol import records as r
from oncelog.protocol.errors import ErrorCode
from tests.protocol.test_record_validation import (
    Bad,
    batch_of,
    body,
    compress,
    mutated_records,
    raw_record,
    record_bodies,
    records_of,
    ref_validate,
    rejects,
    xerial,
    zstd,
)

CODECS = [compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]
BOMB = 130 << 20  # past the 128 MiB bound


def packed(codec: int, data: bytes, zeros: int = 0, tail: bytes = b"") -> bytes:
    """``data``, then ``zeros`` zero bytes, then ``tail``, compressed piece by piece (a bomb is built
    without holding it); snappy in the Java client's 32 KiB xerial chunks."""
    pieces = [data, *([b"\x00" * (1 << 20)] * (zeros >> 20)), b"\x00" * (zeros & ((1 << 20) - 1)), tail]
    if codec == compression.GZIP:
        z = zlib.compressobj(1, wbits=31)
        return b"".join(z.compress(x) for x in pieces) + z.flush()
    if codec == compression.SNAPPY:
        out = [xerial(b"", 1)]
        rest = b""
        for x in [*pieces, None]:
            rest += x or b""
            while len(rest) >= 32 << 10 or (x is None and rest):
                block, rest = rest[:32 << 10], rest[32 << 10:]
                c = bytes(cramjam.snappy.compress_raw(block))
                out.append(struct.pack(">i", len(c)) + c)
        return b"".join(out)
    if codec == compression.LZ4:
        c4 = lz4.frame.LZ4FrameCompressor(block_linked=False)
        return c4.begin() + b"".join(c4.compress(x) for x in pieces) + c4.flush()
    cz = zstd.ZstdCompressor()
    return b"".join(cz.compress(x) for x in pieces) + cz.flush()


class Counted:
    """Wraps ``compression.inflate_chunks``, counting the bytes that came out."""

    def __init__(self) -> None:
        self.inflated = 0
        self.real = compression.inflate_chunks

    def __call__(self, codec: int, data: bytes | memoryview, limit: int) -> Iterator[bytes]:
        for chunk in self.real(codec, data, limit):
            self.inflated += len(chunk)
            yield chunk


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counted:
    c = Counted()
    monkeypatch.setattr(compression, "inflate_chunks", c)
    return c


@pytest.fixture(scope="module")
def zero_bombs() -> dict[int, bytes]:
    return {codec: packed(codec, b"", BOMB) for codec in CODECS}


@pytest.fixture(scope="module")
def tailed_bombs() -> dict[int, bytes]:
    """One valid record, then 130 MiB of zeros."""
    return {codec: packed(codec, raw_record(body(0)), BOMB) for codec in CODECS}


@pytest.mark.parametrize("codec", CODECS)
def test_a_bomb_is_refused_at_its_first_record_having_inflated_a_piece(counted: Counted, zero_bombs: dict[int, bytes],
                                                                       codec: int) -> None:
    """Count 1, 130 MiB of zeros: record 0's length is 0. Kafka fails after reading ~16 KiB; we after
    one piece (it inflated the whole 128 MiB bound first, for every such batch of a request)."""
    rejects(batch_of(zero_bombs[codec], 1, attributes=codec), ErrorCode.invalid_record,
            "record 0: invalid record length 0")
    assert 0 < counted.inflated <= 2 * compression.STREAM_CHUNK, counted.inflated


@pytest.mark.parametrize("codec", CODECS)
def test_bytes_after_the_declared_count_are_refused_without_inflating_them(
        counted: Counted, tailed_bombs: dict[int, bytes], codec: int) -> None:
    rejects(batch_of(tailed_bombs[codec], 1, attributes=codec), ErrorCode.invalid_record, "records still remaining")
    assert counted.inflated <= 2 * compression.STREAM_CHUNK, counted.inflated


@pytest.mark.parametrize("codec", CODECS)
def test_a_bad_record_deep_in_a_payload_stops_the_walk_there(counted: Counted, codec: int) -> None:
    good = [body(i, key=b"k%d" % i, value=b"v" * 100) for i in range(1000)]
    bad = packed(codec, records_of(good) + raw_record(body(7)), 20 << 20)
    rejects(batch_of(bad, 1002, attributes=codec), ErrorCode.invalid_record,
            "record 1000: invalid offset delta 7, expected 1000")
    assert counted.inflated <= len(records_of(good)) + 2 * compression.STREAM_CHUNK


def test_a_snappy_block_declaring_more_than_its_bytes_can_hold_is_refused_before_allocating() -> None:
    claims = r.encode_uvarint(100 << 20) + b"\x00" * 100  # 100 MiB from 100 bytes: at most 22 times
    rejects(batch_of(claims, 1, attributes=2), ErrorCode.invalid_record, "cannot hold")


# --- the streaming walk reads what the whole-buffer walk reads ----------------------------------------

def split_at(data: bytes, cuts: list[int]) -> Iterator[bytes]:
    prev = 0
    for c in sorted(set(cuts)):
        if prev < c < len(data):
            yield data[prev:c]
            prev = c
    if prev < len(data):
        yield data[prev:]


def stream_ok(data: bytes, count: int, cuts: list[int]) -> bool:
    try:
        r._walk_stream(split_at(data, cuts), count)
        return True
    except r.RecordValidationError:
        return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(record_bodies, st.data())
def test_the_stream_walk_agrees_with_the_reference_wherever_the_pieces_end(recs: list, data: st.DataObject) -> None:
    plain, count = mutated_records(recs, data)
    try:
        ref_validate(plain, count)
        expected = True
    except Bad:
        expected = False
    cuts = data.draw(st.lists(st.integers(0, max(len(plain), 1)), max_size=30), label="cuts")
    assert stream_ok(plain, count, cuts) == expected, (plain.hex(), count, cuts)
    assert stream_ok(plain, count, list(range(len(plain)))) == expected  # one byte at a time


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("chunk", "scale"), [(1, 1), (7, 3), (4096, 100)])
def test_big_records_split_across_pieces_pass(monkeypatch: pytest.MonkeyPatch, codec: int, chunk: int,
                                              scale: int) -> None:
    """Keys, values and headers longer than a piece, records straddling pieces, varints cut."""
    recs = [body(i, ts_delta=-i * 70_000, key=b"k" * (i * 30 * scale),
                 value=None if i % 4 == 3 else b"v" * (i * 50 * scale),
                 headers=[(b"h" * 200, b"x" * (i * 9 * scale)), (b"n", None)]) for i in range(12)]
    data = records_of(recs)
    monkeypatch.setattr(compression, "STREAM_CHUNK", chunk)
    payload = xerial(data, max(chunk, 64)) if codec == compression.SNAPPY else compress(codec, data)
    r.split_batches(batch_of(payload, len(recs), attributes=codec))
    rejects(batch_of(payload, len(recs) + 1, attributes=codec), ErrorCode.invalid_record,
            "record 12: premature end")
    rejects(batch_of(payload, len(recs) - 1, attributes=codec), ErrorCode.invalid_record, "still remaining")


def test_a_gzip_payload_of_many_members_and_big_input_passes() -> None:
    data = records_of([body(i, value=bytes(range(256)) * 40) for i in range(3000)])  # 30 MiB, several members
    members = b"".join(gzip.compress(data[i:i + (3 << 20)], 1) for i in range(0, len(data), 3 << 20))
    r.split_batches(batch_of(members, 3000, attributes=1))
    rejects(batch_of(members + gzip.compress(b"\x00"), 3000, attributes=1), ErrorCode.invalid_record,
            "still remaining")
    rejects(batch_of(members[:-4], 3000, attributes=1), ErrorCode.invalid_record, "do not decompress")


def test_a_raw_snappy_block_is_walked_whole() -> None:
    data = records_of([body(i, value=b"s" * 1000) for i in range(500)])
    r.split_batches(batch_of(bytes(cramjam.snappy.compress_raw(data)), 500, attributes=2))


# --- memory ---------------------------------------------------------------------------------------

def one_record_of_zeros(value: int) -> tuple[bytes, bytes]:
    """(what comes before, after) a value of ``value`` zero bytes in record 0 (no key, no header)."""
    head = b"\x00" + b"\x00" + b"\x00" + b"\x01" + r.encode_varint(value)
    body_len = len(head) + value + 1
    return r.encode_varint(body_len) + head, b"\x00"


def peak_growth_kib(codec: int, value: int, tmp_path: object) -> tuple[int, str]:
    """(growth of a fresh process's peak RSS, outcome) while ``split_batches`` checks a batch of one
    record whose value is ``value`` zero bytes (VmHWM starts anew at exec, unlike ru_maxrss)."""
    path = f"{tmp_path}/batch"
    head, tail = one_record_of_zeros(value)
    with open(path, "wb") as f:
        f.write(batch_of(packed(codec, head, value, tail), 1, attributes=codec))
    probe = (
        "import re\n"
        "from oncelog.protocol import records as r\n"
        "def hwm(): return int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        f"data = open({path!r}, 'rb').read()\n"
        "before = hwm()\n"
        "try:\n"
        "    r.split_batches(data)\n"
        "    outcome = 'accepted'\n"
        "except r.InvalidRecordError as exc:\n"
        "    outcome = f'{exc.error_code} {exc}'\n"
        "print(hwm() - before, outcome)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    grown, outcome = out.stdout.split(" ", 1)
    return int(grown), outcome.strip()


@pytest.mark.parametrize("codec", CODECS)
def test_a_valid_100_mib_record_is_checked_in_pieces(tmp_path: object, codec: int) -> None:
    """Accepted: the walk skips the value as it inflates (the payload was kept whole before)."""
    grown, outcome = peak_growth_kib(codec, 100 << 20, tmp_path)
    assert outcome == "accepted"
    assert grown < 24 << 10, f"checking it grew the peak RSS by {grown >> 10} MiB"


@pytest.mark.parametrize("codec", CODECS)
def test_a_record_past_the_bound_is_refused_in_pieces(tmp_path: object, codec: int) -> None:
    grown, outcome = peak_growth_kib(codec, 200 << 20, tmp_path)
    assert outcome.startswith(f"{int(ErrorCode.message_too_large)} compressed records inflate past")
    assert grown < 24 << 10, f"refusing it grew the peak RSS by {grown >> 10} MiB"

from __future__ import annotations

import pytest

from oncelog.protocol import records as r


def _batch(n: int = 3, **kw: int) -> bytes:
    recs = [r.encode_record(i, i, b"k%d" % i, b"v%d" % i) for i in range(n)]
    return r.build_batch(recs, base_timestamp=1000, **kw)


def test_built_batch_validates_and_reports_its_header() -> None:
    data = _batch(3, producer_id=7, producer_epoch=1, base_sequence=10)
    h = r.validate_batch(data)
    assert (h.records_count, h.last_offset_delta, h.producer_id, h.producer_epoch) == (3, 2, 7, 1)
    assert h.base_sequence == 10 and h.last_sequence == 12
    assert h.size == len(data)


def test_base_offset_rewrite_keeps_crc_valid() -> None:
    data = bytearray(_batch())
    r.set_base_offset(data, 0, 123456)
    assert r.validate_batch(data).base_offset == 123456


def test_corruption_is_detected() -> None:
    data = bytearray(_batch())
    data[-1] ^= 0xFF
    with pytest.raises(r.InvalidRecordError, match="CRC"):
        r.validate_batch(data)


def test_wrong_magic_and_truncation_are_rejected() -> None:
    data = bytearray(_batch())
    with pytest.raises(r.InvalidRecordError):
        r.split_batches(bytes(data[:-1]))
    data[16] = 1
    with pytest.raises(r.InvalidRecordError, match="magic"):
        r.validate_batch(data)


def test_split_batches_walks_consecutive_batches() -> None:
    a, b = _batch(2), _batch(5)
    got = r.split_batches(a + b)
    assert [pos for pos, _ in got] == [0, len(a)]
    assert [h.records_count for _, h in got] == [2, 5]


def test_control_batch_round_trip() -> None:
    for kind in (r.CONTROL_ABORT, r.CONTROL_COMMIT):
        data = r.build_control_batch(kind, producer_id=5, producer_epoch=2, coordinator_epoch=0,
                                     timestamp_ms=99)
        h = r.validate_batch(data)
        assert h.is_control and h.is_transactional
        assert r.control_type_of(data, 0, h) == kind


def test_sequence_wraps_after_int32_max() -> None:
    data = _batch(3, producer_id=1, producer_epoch=0, base_sequence=2**31 - 2)
    assert r.validate_batch(data).last_sequence == 0


def test_kio_decodes_our_batches() -> None:
    from kio.records.readers import read_batch

    batch, _ = read_batch(_batch(2), 0)
    assert [rec.value for rec in batch.records] == [b"v0", b"v1"]
    assert [rec.offset for rec in batch.records] == [0, 1]


def test_offset_delta_must_match_the_record_count() -> None:
    import struct

    import crc32c

    data = bytearray(_batch(2))
    struct.pack_into(">i", data, 23, 1000)  # last_offset_delta
    struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
    r.validate_batch(data)  # the CRC is right...
    with pytest.raises(r.InvalidRecordError, match="last offset delta"):
        r.split_batches(bytes(data))  # ...but the batch lies about its offsets

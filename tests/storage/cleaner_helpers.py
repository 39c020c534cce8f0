"""Helpers for the log cleaner's tests: keyed batches, and what consumers see of a partition log."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c

from oncelog.clock import ManualClock
from oncelog.protocol import compression
from oncelog.protocol import records as rb
from oncelog.storage import record_codec
from oncelog.storage.config import LogConfig
from oncelog.storage.partition_log import PartitionLog

Rec = tuple[int, bytes | None, bytes | None]  # offset, key, value


def kv(pairs: list[tuple[bytes | None, bytes | None]], *, ts: int = 1_000, pid: int = -1, epoch: int = -1,
       seq: int = -1, txn: bool = False, codec: int = 0) -> bytes:
    """A batch of keyed records (value None: a tombstone), optionally compressed."""
    recs = [rb.encode_record(i, i, k, v) for i, (k, v) in enumerate(pairs)]
    payload = compression.compress(codec, b"".join(recs))
    raw = rb.build_batch([payload], base_timestamp=ts, max_timestamp=ts + len(pairs) - 1,
                         attributes=(rb.ATTR_TRANSACTIONAL if txn else 0) | codec, producer_id=pid,
                         producer_epoch=epoch, base_sequence=seq)
    # build_batch counted one record (the payload); fix count and delta, then the CRC
    buf = bytearray(raw)
    struct.pack_into(">i", buf, 23, len(pairs) - 1)
    struct.pack_into(">i", buf, 57, len(pairs))
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def compact_log(path: Path, clock: ManualClock | None = None, **cfg: object) -> PartitionLog:
    config = LogConfig(cleanup_policy="compact", **cfg)  # type: ignore[arg-type]
    return PartitionLog(path, "t", 0, config, clock or ManualClock())


def batches(plog: PartitionLog) -> list[rb.BatchHeader]:
    out: list[rb.BatchHeader] = []
    for seg in plog.segments:
        out += [h for _pos, h, _v in seg.iter_batches(0)]
    return out


def view(plog: PartitionLog, *, read_committed: bool = True, start: int | None = None) -> list[Rec]:
    """Every data record a consumer reading from ``start`` (the log start) gets, as librdkafka
    filters them: control records dropped, and with read_committed, records of aborted
    transactions (the fetch's aborted list) dropped and nothing at or past the LSO."""
    out: list[Rec] = []
    offset = plog.log_start_offset if start is None else start
    limit = plog.last_stable_offset if read_committed else plog.high_watermark
    aborting: set[int] = set()
    while offset < limit:
        data = plog.read(offset, 1 << 24, max_offset=limit).records
        if not data:
            break
        aborted: dict[int, list[int]] = {}
        for pid, first in sorted(plog.aborted_transactions(offset, limit), key=lambda a: a[1]):
            aborted.setdefault(pid, []).append(first)
        for pos, h in rb.iter_headers(data):
            if h.last_offset < offset:
                continue
            starts = aborted.get(h.producer_id)
            while starts and starts[0] <= h.base_offset:
                starts.pop(0)
                aborting.add(h.producer_id)
            if h.is_control:
                aborting.discard(h.producer_id)
            elif not (read_committed and h.is_transactional and h.producer_id in aborting):
                for r in record_codec.decode_records(memoryview(data)[pos:pos + h.size], h):
                    if r.offset >= offset:
                        out.append((r.offset, r.key, r.value))
            offset = h.last_offset + 1
    return out


def newest_per_key(records: list[Rec]) -> dict[bytes | None, Rec]:
    out: dict[bytes | None, Rec] = {}
    for r in records:
        out[r[1]] = r
    return out


def assert_compacted(before: list[Rec], after: list[Rec], *, tombstones_gone: bool = False) -> None:
    """``after`` is ``before`` minus superseded records: a subsequence (same offsets, same data),
    holding the newest record of every key (tombstones unless ``tombstones_gone``), each key once."""
    offsets = [r[0] for r in after]
    assert offsets == sorted(set(offsets)), "offsets must increase"
    assert set(after) <= set(before), f"records appeared: {sorted(set(after) - set(before))[:5]}"
    newest = newest_per_key(before)
    for key, rec in newest.items():
        if rec[2] is None and tombstones_gone:
            assert rec not in after, f"expired tombstone of {key!r} kept"
        else:
            assert rec in after, f"newest record of {key!r} lost: {rec}"
    keys = [r[1] for r in after]
    assert len(keys) == len(set(keys)), "a key is kept twice"

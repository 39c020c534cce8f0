from __future__ import annotations

from oncelog.protocol import records as rb


def batch(n: int = 1, *, ts: int = 1_000, pid: int = -1, epoch: int = -1, seq: int = -1,
          txn: bool = False, value: bytes = b"v", size: int = 0) -> bytes:
    payload = value + b"x" * max(0, size - len(value))
    recs = [rb.encode_record(i, i, b"k%d" % i, payload) for i in range(n)]
    return rb.build_batch(recs, base_timestamp=ts, max_timestamp=ts + n - 1,
                          attributes=rb.ATTR_TRANSACTIONAL if txn else 0,
                          producer_id=pid, producer_epoch=epoch, base_sequence=seq)


def marker(commit: bool, pid: int, epoch: int, ts: int = 5_000) -> bytes:
    return rb.build_control_batch(rb.CONTROL_COMMIT if commit else rb.CONTROL_ABORT, producer_id=pid,
                                  producer_epoch=epoch, coordinator_epoch=0, timestamp_ms=ts)


def offsets_in(data: bytes) -> list[int]:
    return [h.base_offset for _, h in rb.iter_headers(data)]

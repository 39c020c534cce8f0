"""Internal topics (``__transaction_state``, ``__consumer_offsets``) as ordinary partition logs.

Coordinators emit (key, value) records; this module writes them as one RecordBatch per call and
reads every record back at load time, so that loading after a restart feeds the coordinators the
very records that normal operation fed them (records, then replay).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kio.records.readers import read_batch

from oncelog.protocol import records as rb


@dataclass(frozen=True, slots=True)
class LoggedRecord:
    """A record of an internal log, or a transaction marker (control is not None)."""

    offset: int
    key: bytes | None
    value: bytes | None
    producer_id: int
    transactional: bool
    control: int | None = None  # CONTROL_COMMIT / CONTROL_ABORT for markers


def encoded_bytes(kvs: list[tuple[bytes, bytes | None]], per_batch: int | None = None) -> int:
    """At most how many bytes :func:`encode_batch` makes of ``kvs``, in batches of ``per_batch``
    records (one batch if None): what an append of them asks of the disk."""
    batches = 1 if per_batch is None else len(kvs) // per_batch + 1
    return rb.HEADER_SIZE * batches + sum(20 + len(k) + len(v or b"") for k, v in kvs)


def encode_batch(kvs: list[tuple[bytes, bytes | None]], now_ms: int, *, producer_id: int = -1,
                 producer_epoch: int = -1, base_sequence: int = -1, transactional: bool = False) -> bytes:
    recs = [rb.encode_record(i, 0, k, v) for i, (k, v) in enumerate(kvs)]
    return rb.build_batch(recs, base_timestamp=now_ms,
                          attributes=rb.ATTR_TRANSACTIONAL if transactional else 0,
                          producer_id=producer_id, producer_epoch=producer_epoch, base_sequence=base_sequence)


def read_all(plog: Any, chunk_bytes: int = 8 * 1024 * 1024) -> Iterator[LoggedRecord]:
    """Every record from the log start to the log end, in offset order."""
    offset = plog.log_start_offset
    end = plog.log_end_offset
    while offset < end:
        data = plog.read(offset, chunk_bytes, min_one_message=True).records
        if not data:
            break
        for pos, header in rb.iter_headers(data):
            if header.last_offset < offset:
                continue
            if header.is_control:
                yield LoggedRecord(header.last_offset, None, None, header.producer_id, True,
                                   rb.control_type_of(data, pos, header))
            else:
                batch, _ = read_batch(data, pos)
                for rec in batch.records:
                    if rec.offset >= offset:
                        yield LoggedRecord(rec.offset, rec.key, rec.value, header.producer_id,
                                           header.is_transactional)
            offset = header.last_offset + 1

"""The error a partition's records get before anything else looks at them, as Apache Kafka 4.0 answers
(ProduceRequest.validateRecords, reading them through ByteBufferLogInputStream.nextBatch/nextBatchSize,
then UnifiedLog's batch.isValid): which check comes first decides the code, so each case names the
one that answers it. Driven through the broker's request path, in process."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.server.handlers.produce import records_refusal
from tests.inproc import API_PRODUCE, InProcessBroker
from tests.protocol.test_record_validation import batch_of, body, compress, records_of, with_crc

INVALID_RECORD, CORRUPT_MESSAGE = ErrorCode.invalid_record, ErrorCode.corrupt_message
GOOD = batch_of(records_of([body(0)]), 1)


def with_length(data: bytes, length: int) -> bytes:
    return data[:8] + struct.pack(">i", length) + data[12:]


def with_magic(data: bytes, magic: int) -> bytes:
    return data[:16] + struct.pack(">b", magic) + data[17:]


CASES: list[tuple[str, bytes | None, int, str]] = [
    # no batch at all: ProduceRequest.validateRecords' "at least one record batch"
    ("null records", None, INVALID_RECORD, "at least one record batch"),
    ("empty records", b"", INVALID_RECORD, "at least one record batch"),
    ("11 bytes", GOOD[:11], INVALID_RECORD, "at least one record batch"),
    ("16 bytes, no magic yet", GOOD[:16], INVALID_RECORD, "at least one record batch"),
    ("only 20 bytes", GOOD[:20], INVALID_RECORD, "at least one record batch"),
    ("length past the data", with_length(GOOD, len(GOOD)), INVALID_RECORD, "at least one record batch"),
    ("magic 0, length past the data", with_length(with_magic(GOOD, 0), 500), INVALID_RECORD, "at least one"),
    # nextBatchSize: the length once 12 bytes are there, then the magic once 17 are
    ("length 0", with_length(GOOD, 0), CORRUPT_MESSAGE, "Record size 0 is less than the minimum record overhead"),
    ("length 13", with_length(GOOD, 13), CORRUPT_MESSAGE, "Record size 13"),
    ("length -1", with_length(GOOD, -1), CORRUPT_MESSAGE, "Record size -1"),
    ("length 0 in 12 bytes", with_length(GOOD, 0)[:12], CORRUPT_MESSAGE, "Record size 0"),
    ("length 0, magic 7", with_length(with_magic(GOOD, 7), 0), CORRUPT_MESSAGE, "Record size 0"),
    ("magic 3", with_magic(GOOD, 3), CORRUPT_MESSAGE, "Invalid magic found in record: 3"),
    ("magic -1", with_magic(GOOD, -1), CORRUPT_MESSAGE, "Invalid magic found in record: -1"),
    ("magic 3, length past the data", with_length(with_magic(GOOD, 3), 500), CORRUPT_MESSAGE, "Invalid magic"),
    ("magic 3 in 17 bytes", with_magic(GOOD, 3)[:17], CORRUPT_MESSAGE, "Invalid magic"),
    # a whole batch of another magic
    ("magic 0", with_magic(GOOD, 0), INVALID_RECORD, "record batches with magic version 2"),
    ("magic 1", with_magic(GOOD, 1), INVALID_RECORD, "record batches with magic version 2"),
    ("magic 1, zstd, v6", with_magic(batch_of(compress(4, records_of([body(0)])), 1, attributes=4), 1),
     INVALID_RECORD, "magic version 2"),
    # then the second batch, read the same way
    ("two batches", GOOD + GOOD, INVALID_RECORD, "exactly one record batch"),
    ("a second batch of length 0", GOOD + with_length(GOOD, 0), CORRUPT_MESSAGE, "Record size 0"),
    ("a second batch of magic 5", GOOD + with_magic(GOOD, 5), CORRUPT_MESSAGE, "Invalid magic found in record: 5"),
    ("zstd in v6 before a second batch", batch_of(compress(4, records_of([body(0)])), 1, attributes=4) + GOOD,
     ErrorCode.unsupported_compression_type, "ZStandard"),
    # a whole batch shorter than its header: UnifiedLog's isValid (the CRC check) refuses it
    ("a 26-byte batch", with_length(GOOD, 14)[:26], CORRUPT_MESSAGE, "smaller than the minimum allowed overhead 61"),
    ("a 60-byte batch", with_length(GOOD, 48)[:60], CORRUPT_MESSAGE, "the size 60"),
    # ours: bytes after the batch that are not one (Kafka drops them and appends the batch)
    ("5 bytes after the batch", GOOD + b"\x00" * 5, INVALID_RECORD, "5 bytes after the record batch"),
    # and a whole batch with the CRC wrong still gets CORRUPT_MESSAGE from the log
    ("CRC wrong", GOOD[:-1] + bytes([GOOD[-1] ^ 1]), CORRUPT_MESSAGE, "CRC"),
]


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(Path(tmp_path_factory.mktemp("refusal")) / "d")
    broker.create_topic("t", 1)
    yield broker
    broker.close()


def produce(b: InProcessBroker, records: bytes | None, version: int) -> Any:
    resp = b.call(API_PRODUCE, version, {
        "transactional_id": None, "acks": -1, "timeout": 30_000,
        "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": records}]}]})
    return resp.responses[0].partition_responses[0]


@pytest.mark.parametrize(("name", "records", "code", "message"), CASES, ids=[c[0] for c in CASES])
def test_records_get_kafkas_code_in_kafkas_order(b: InProcessBroker, name: str, records: bytes | None, code: int,
                                                 message: str) -> None:
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    end = plog.log_end_offset
    if "v6" in name:  # Produce v6 answers no message: the handler's own gives it
        assert produce(b, records, 6).error_code == code
        refused = records_refusal(records or b"", 6)
        assert refused is not None and message in refused[1]
    else:
        part = produce(b, records, 9)
        assert (part.error_code, message in (part.error_message or "")) == (code, True), part.error_message
    assert plog.log_end_offset == end
    assert produce(b, GOOD, 9).error_code == ErrorCode.none  # the partition still takes a good batch


def test_a_good_batch_passes_the_checks() -> None:
    assert records_refusal(GOOD, 9) is None
    assert records_refusal(batch_of(compress(4, records_of([body(0)])), 1, attributes=4), 7) is None
    assert records_refusal(with_crc(GOOD), 3) is None

"""The log cleaner rewrites an lz4 batch (dropping superseded keys) in Kafka's own lz4 framing: a
batch librdkafka wrote (independent blocks) must stay readable by Kafka's Java client after it is
cleaned (it was rewritten with linked blocks, which Kafka's Lz4BlockInputStream refuses)."""

from __future__ import annotations

import struct
from pathlib import Path

import crc32c
import lz4.frame

from oncelog.protocol import compression
from oncelog.protocol import records as rb
from oncelog.storage.log_cleaner import CleanerConfig, LogCleanerManager
from tests.protocol.test_lz4_kafka_frame import assert_kafka_frame, kafka_lz4_read
from tests.storage.cleaner_helpers import assert_compacted, batches, compact_log, view


def librdkafka_lz4_batch(pairs: list[tuple[bytes, bytes]], ts: int = 1_000) -> bytes:
    """A batch as librdkafka writes it with compression.codec=lz4: independent blocks."""
    recs = b"".join(rb.encode_record(i, i, k, v) for i, (k, v) in enumerate(pairs))
    head = struct.pack(">qiibIhiqqqhii", 0, 0, 0, 2, 0, compression.LZ4, len(pairs) - 1, ts, ts + len(pairs) - 1,
                       -1, -1, -1, len(pairs))
    buf = bytearray(head + lz4.frame.compress(recs, block_linked=False))
    struct.pack_into(">i", buf, 8, len(buf) - 12)
    struct.pack_into(">I", buf, 17, crc32c.crc32c(bytes(buf[21:])))
    return bytes(buf)


def test_a_cleaned_lz4_batch_is_written_in_kafkas_framing(tmp_path: Path) -> None:
    plog = compact_log(tmp_path)
    for i in range(4):
        # values big enough for several 64 KiB blocks per batch
        plog.append(librdkafka_lz4_batch([(b"k%d" % j, b"round %d key %d " % (i, j) * 900) for j in range(6)]))
        plog.roll()
    plog.append(librdkafka_lz4_batch([(b"k0", b"last")]))
    plog.roll()
    plog.flush()
    before = view(plog)
    assert LogCleanerManager(CleanerConfig()).clean_now([plog], 0) == 1
    assert_compacted(before, view(plog))
    rewritten = 0
    for h in batches(plog):
        data = plog.read(h.base_offset, 1 << 22).records
        header = rb.validate_batch(data)
        payload = bytes(data[rb.HEADER_SIZE:header.size])
        assert header.attributes & rb.ATTR_COMPRESSION_MASK == compression.LZ4
        if header.records_count < header.last_offset_delta + 1:  # a batch the cleaner rebuilt
            rewritten += 1
            plain = compression.decompress(compression.LZ4, payload)
            assert_kafka_frame(payload, plain)
        else:
            kafka_lz4_read(payload)
    assert rewritten >= 1

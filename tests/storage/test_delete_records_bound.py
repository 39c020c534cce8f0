"""DeleteRecords is bounded by the high watermark clients see (``PartitionLog.readable_end``, checked
in ``handlers/records.py``): where every append must be durable before it is acknowledged
(flush_every_append, flush.messages=1) that is what is fsynced, as Kafka's high watermark moves only
after the flush inside the append (probe s37 s9: Fetch said high watermark 3, DeleteRecords(t-0, 4)
answered (0, 4), and a power cut then left a log start past the log end). Kafka answers
OFFSET_OUT_OF_RANGE."""

from __future__ import annotations

from pathlib import Path

import pytest

from oncelog.protocol.errors import ErrorCode
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch


def _delete(b: InProcessBroker, offset: int) -> tuple[int, int]:
    r = b.call(21, 2, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": offset}]}],
                       "timeout": 5000})
    p = r.topics[0].partitions[0]
    return int(p.error_code), int(p.low_watermark)


@pytest.mark.parametrize("every_append", [True, False], ids=["flush-every-append", "flush.messages=1"])
def test_delete_records_past_what_is_fsynced_is_out_of_range(tmp_path: Path, every_append: bool) -> None:
    b = InProcessBroker(tmp_path / "d", flush_every_append=every_append)
    b.create_topic("t", 1)
    if not every_append:
        b.broker.logs.alter_topic_configs("t", {"flush.messages": "1"})
    for i in range(3):
        assert b.produce("t", 0, batch(1, value=b"v%d" % i)) == 0
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None and plog.reads_wait_for_fsync
    plog.append(batch(1, value=b"v3"), defer_sync=True)  # appended, its fsync not yet made
    assert (plog.readable_end, plog.log_end_offset) == (3, 4)
    assert _delete(b, 4) == (ErrorCode.offset_out_of_range, -1)
    assert _delete(b, -1) == (ErrorCode.none, 3)  # -1: the high watermark clients see
    assert plog.log_start_offset == 3
    plog.sync()
    assert _delete(b, 4) == (ErrorCode.none, 4)
    b.close()

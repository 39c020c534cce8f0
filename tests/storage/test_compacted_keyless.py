"""A compacted topic refuses a client's records without a key, naming each one (Kafka's LogValidator:
one RecordError per keyless record, batch index and message). The indexes come from the validating
walk, which reads every key length anyway: no object is built per record (decoding a 1 MB zstd
batch of 1.2 M tiny records into objects took 20 s and 204 MiB)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.protocol import compression
from oncelog.storage.config import LogConfig
from oncelog.storage.errors import KeylessRecordError
from oncelog.storage.partition_log import AppendOrigin, PartitionLog
from tests.storage.cleaner_helpers import compact_log, kv

EACH = "Compacted topic cannot accept message without key in topic partition t-0"
CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]


def pairs(n: int, keyless: set[int], value: bytes = b"v") -> list[tuple[bytes | None, bytes | None]]:
    return [(None if i in keyless else b"k%d" % i, value) for i in range(n)]


@pytest.mark.parametrize("codec", CODECS)
def test_each_keyless_record_is_named_with_kafkas_answer(tmp_path: Path, codec: int) -> None:
    plog = compact_log(tmp_path)
    with pytest.raises(KeylessRecordError) as info:
        plog.append(kv(pairs(6, {1, 3, 4, 5}), codec=codec))
    assert info.value.error_code == 87  # INVALID_RECORD
    assert info.value.record_errors == [(1, EACH), (3, EACH), (4, EACH), (5, EACH)]
    assert str(info.value) == (
        "One or more records have been rejected due to 4 record errors in total, and only showing the first "
        f"three errors at most: [RecordError(batchIndex=1, message='{EACH}'), RecordError(batchIndex=3, "
        f"message='{EACH}'), RecordError(batchIndex=4, message='{EACH}')]")
    assert plog.log_end_offset == 0
    plog.append(kv([(b"k", None), (b"j", b"x")], codec=codec))  # keys, a tombstone among them: fine
    assert plog.log_end_offset == 2


@pytest.mark.parametrize("codec", [compression.GZIP, compression.LZ4, compression.ZSTD])
def test_keyless_records_split_across_inflated_pieces_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               codec: int) -> None:
    monkeypatch.setattr(compression, "STREAM_CHUNK", 5)  # most records straddle two pieces or more
    keyless = {0, 7, 8, 29}
    with pytest.raises(KeylessRecordError) as info:
        compact_log(tmp_path).append(kv(pairs(30, keyless, b"value" * 3), codec=codec))
    assert [i for i, _ in info.value.record_errors] == sorted(keyless)


def test_only_a_clients_append_to_a_compacted_topic_is_checked(tmp_path: Path) -> None:
    plain = PartitionLog(tmp_path / "a", "t", 0, LogConfig(cleanup_policy="delete"), ManualClock())
    plain.append(kv(pairs(3, {0, 1, 2})))
    compacted = compact_log(tmp_path / "b")
    compacted.append(kv(pairs(3, {1})), origin=AppendOrigin.COORDINATOR)  # not a producer's append
    assert plain.log_end_offset == compacted.log_end_offset == 3


def test_a_batch_of_many_tiny_records_is_checked_without_an_object_each(tmp_path: Path) -> None:
    """200,000 keyed records in one zstd batch: a fresh process's peak RSS (VmHWM) while it appends
    the batch to a compacted log. An object per record (decode_records) grew it by about 35 MiB."""
    n = 200_000
    (tmp_path / "batch").write_bytes(kv([(b"k", None)] * n, codec=compression.ZSTD))
    probe = (
        "import re, sys\n"
        "from pathlib import Path\n"
        "from tests.storage.cleaner_helpers import compact_log\n"
        "def hwm(): return int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1))\n"
        f"batch = Path({str(tmp_path / 'batch')!r}).read_bytes()\n"
        f"plog = compact_log(Path({str(tmp_path / 'log')!r}))\n"
        "before = hwm()\n"
        "plog.append(batch)\n"
        "print(hwm() - before, plog.log_end_offset)\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True,
                         cwd=Path(__file__).parents[2])
    grown_kib, end = map(int, out.stdout.split())
    assert end == n
    assert grown_kib < 8 << 10, f"appending it grew the peak RSS by {grown_kib >> 10} MiB"

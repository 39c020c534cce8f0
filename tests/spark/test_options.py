"""Options fail at start naming the option (unknown, malformed, non-numeric, batch-only on a stream),
Spark's minPartitions split, and the sizes and timeouts of large batches (no broker, no Spark)."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest

from oncelog.spark.guarantees import BROKER_MAX_TRANSACTION_TIMEOUT_MS, transaction_timeout_ms
from oncelog.spark.options import get_duration_ms, get_int, parse_assign, parse_offsets_spec
from oncelog.spark.sink import SinkSettings, Spool, flush
from oncelog.spark.source import OffsetRange, OffsetSpec, split_ranges

BS = {"kafka.bootstrap.servers": "127.0.0.1:1"}


@pytest.mark.parametrize("options,message", [
    ({"subscribe": "t", "startingOffset": "earliest"}, r"unknown source option\(s\) \['startingOffset'\]"),
    ({"subscribe": "t", "topic": "x"}, r"unknown source option\(s\) \['topic'\]"),
    ({"subscribe": "t", "maxOffsetsPerTrigger": "lots"}, "option 'maxOffsetsPerTrigger' must be an integer"),
    ({"subscribe": "t", "minPartitions": "0"}, "option 'minPartitions' must be at least 1"),
    ({"subscribe": "t", "maxTriggerDelay": "soon"}, "option 'maxTriggerDelay' must be a duration"),
    ({"subscribe": "t", "failOnDataLoss": "maybe"}, "option 'failOnDataLoss' must be true or false"),
    ({"subscribe": "t", "startingOffsets": "{\"t\": "}, "option 'startingOffsets': expected earliest"),
    ({"subscribe": "t", "startingTimestamp": "yesterday"}, "option 'startingTimestamp' must be an integer"),
    ({"subscribe": "t", "startingOffsetsByTimestamp": '{"t": {"0": "x"}}'}, "timestamp of t-0 must be an integer"),
    ({"subscribe": "t", "startingOffsetsByTimestampStrategy": "guess"}, "must be error or latest"),
    ({"subscribe": "t", "endingOffsets": "latest"}, "'endingOffsets' is not supported in streaming"),
    ({"subscribe": "t", "endingTimestamp": "5"}, "'endingTimestamp' is not supported in streaming"),
    ({"subscribe": "t", "endingOffsetsByTimestamp": "{}"}, "'endingOffsetsByTimestamp' is not supported"),
    ({"assign": "[0]"}, "option 'assign' must be JSON like"),
    ({"subscribePattern": "("}, "option 'subscribePattern': not a regular expression"),
    ({"subscribe": "t", "kafka.enable.auto.commit": "true"}, "kafka.enable.auto.commit is managed by oncelog"),
])
def test_a_bad_source_option_fails_at_start_naming_it(options: dict[str, str], message: str) -> None:
    pytest.importorskip("pyspark")
    from oncelog.spark.source import KafkaStreamReader

    with pytest.raises(ValueError, match=message):
        KafkaStreamReader({**BS, **options})


@pytest.mark.parametrize("options,message", [
    ({"topic": "t", "progress.partitons": "4"}, r"unknown sink option\(s\) \['progress.partitons'\]"),
    ({"topic": "t", "subscribe": "x"}, r"unknown sink option\(s\) \['subscribe'\]"),
    ({"topic": "t", "progress.partitions": "four"}, "option 'progress.partitions' must be an integer"),
    ({"topic": "t", "transaction.timeout.ms": "10"}, "option 'transaction.timeout.ms' must be at least 1000"),
    ({"topic": "t", "progress.replicationFactor": "0"}, "'progress.replicationFactor' must be -1"),
    ({"topic": "t", "processing.guarantee": "twice"}, "'processing.guarantee' must be one of"),
    ({"topic": "t", "failOnHigherCommittedBatch": "sometimes"}, "must be true or false"),
    ({"topic": "t", "kafka.transactional.id": "mine"}, "kafka.transactional.id is managed by oncelog"),
])
def test_a_bad_sink_option_fails_at_start_naming_it(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SinkSettings.from_options({**BS, **options})


def test_spark_added_options_and_kafka_settings_are_accepted() -> None:
    s = SinkSettings.from_options({**BS, "topic": "t", "checkpointlocation": "/tmp/x", "path": "p",
                                   "kafka.linger.ms": "5", "PROGRESS.PARTITIONS": "3"})
    assert s.client == {"bootstrap.servers": "127.0.0.1:1", "linger.ms": "5"} and s.progress_partitions == 3


def test_a_kafka_option_librdkafka_rejects_is_named() -> None:
    from oncelog.spark.options import check_client_config

    with pytest.raises(ValueError, match=r"option kafka\.no\.such\.setting is not accepted by librdkafka"):
        check_client_config({"bootstrap.servers": "127.0.0.1:1", "no.such.setting": "1"}, producer=True)


def test_durations_and_numbers() -> None:
    assert get_duration_ms({"d": "15m"}, "d", 0) == 900_000
    assert get_duration_ms({"d": "500"}, "d", 0) == 500
    assert get_duration_ms({"d": "2h"}, "d", 0) == 7_200_000
    assert get_duration_ms({}, "d", 7) == 7
    assert get_int({"N": " 12 "}, "n", None) == 12
    assert parse_offsets_spec('{"t": {"0": 5}}', "x") == {"t": {0: 5}}
    with pytest.raises(ValueError, match="partition 'a' of t is not a number"):
        parse_offsets_spec('{"t": {"a": 5}}', "startingOffsets")
    with pytest.raises(ValueError, match="partitions must be numbers"):
        parse_assign('{"t": ["x"]}')


def test_offset_spec_precedence_is_sparks() -> None:
    opts = {"startingOffsets": "earliest", "startingOffsetsByTimestamp": '{"t": {"0": 5}}', "startingTimestamp": "9"}
    assert OffsetSpec.parse(opts, "starting", "latest").kind == "timestamp"
    del opts["startingTimestamp"]
    assert OffsetSpec.parse(opts, "starting", "latest").offsets == {"t": {0: 5}}
    del opts["startingOffsetsByTimestamp"]
    assert OffsetSpec.parse(opts, "starting", "latest").kind == "earliest"
    assert OffsetSpec.parse({}, "ending", "latest").kind == "latest"


def _spans(ranges: list[OffsetRange]) -> list[tuple[int, int, int]]:
    return [(r.partition, r.start, r.end) for r in ranges]


def test_min_partitions_splits_like_sparks_range_calculator() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 50, 60), OffsetRange("t", 2, 7, 7)]
    assert split_ranges(ranges, None) == ranges[:2]
    assert split_ranges(ranges, 2) == ranges[:2], "enough ranges already"
    split = split_ranges(ranges, 5)
    # 10 / 110 * 5 rounds to 0: partition 1 stays whole; the 4 parts left go to partition 0 alone.
    assert split == [OffsetRange("t", 0, i * 25, i * 25 + 25) for i in range(4)] + [OffsetRange("t", 1, 50, 60)]
    assert split_ranges(ranges, 5) == split, "a pure function of the offsets: a replay splits the same way"
    uneven = split_ranges([OffsetRange("t", 0, 0, 10)], 3)
    assert [(r.start, r.end) for r in uneven] == [(0, 3), (3, 6), (6, 10)]


def test_small_ranges_are_left_out_of_the_share_of_the_split_ones() -> None:
    """SPARK-36576's cases: a range whose share would be one part stays whole, and the other ranges
    divide what is left of minPartitions among themselves."""
    got = split_ranges([OffsetRange("t", 0, 0, 500), OffsetRange("t", 1, 0, 12000), OffsetRange("t", 2, 0, 15001)], 6)
    assert _spans(got) == [(0, 0, 500), (1, 0, 6000), (1, 6000, 12000), (2, 0, 5000), (2, 5000, 10000),
                           (2, 10000, 15001)]
    got = split_ranges([OffsetRange("t", 0, 0, 1), OffsetRange("t", 1, 0, 1), OffsetRange("t", 2, 0, 10000)], 6)
    assert _spans(got) == [(0, 0, 1), (1, 0, 1), (2, 0, 2500), (2, 2500, 5000), (2, 5000, 7500), (2, 7500, 10000)]
    got = split_ranges([OffsetRange("t", 0, 1, 2), OffsetRange("t", 1, 1, 1001)], 4)
    assert _spans(got) == [(0, 1, 2), (1, 1, 334), (1, 334, 667), (1, 667, 1001)]
    got = split_ranges([OffsetRange("t", 0, 0, 10), OffsetRange("t", 1, 0, 10), OffsetRange("t", 2, 0, 1)], 6)
    assert _spans(got) == [(0, 0, 3), (0, 3, 6), (0, 6, 10), (1, 0, 3), (1, 3, 6), (1, 6, 10), (2, 0, 1)], \
        "no offset dropped (SPARK-28489)"


def test_max_records_per_partition_divides_long_ranges_as_spark_does() -> None:
    """SPARK-49259's cases: ceil(size / max) nearly equal parts, alone or before minPartitions."""
    assert _spans(split_ranges([OffsetRange("t", 0, 1, 5)], None, 4)) == [(0, 1, 5)]
    assert _spans(split_ranges([OffsetRange("t", 0, 1, 6)], None, 4)) == [(0, 1, 3), (0, 3, 6)]
    got = split_ranges([OffsetRange("t", 0, 1, 40), OffsetRange("t", 1, 1, 50), OffsetRange("t", 2, 1, 60)], None, 20)
    assert _spans(got) == [(0, 1, 20), (0, 20, 40), (1, 1, 17), (1, 17, 33), (1, 33, 50), (2, 1, 20), (2, 20, 40),
                           (2, 40, 60)]
    assert _spans(split_ranges([OffsetRange("t", 0, 1, 40)], 1, 20)) == [(0, 1, 20), (0, 20, 40)]
    assert _spans(split_ranges([OffsetRange("t", 0, 1, 40)], 4, 20)) == [(0, 1, 10), (0, 10, 20), (0, 20, 30),
                                                                        (0, 30, 40)]
    for n in range(1, 200, 7):  # never more than max_records a part, never an offset lost or repeated
        parts = split_ranges([OffsetRange("t", 0, 3, 3 + n), OffsetRange("t", 1, 0, 2 * n)], 3, 9)
        for p in (0, 1):
            mine = [r for r in parts if r.partition == p]
            assert all(r.end - r.start <= 9 for r in mine)
            assert [o for r in mine for o in range(r.start, r.end)] == list(range(3, 3 + n) if p == 0 else range(2 * n))


def test_transaction_timeout_grows_with_the_batch() -> None:
    small = transaction_timeout_ms(100, 1_000)
    big = transaction_timeout_ms(2_000_000, 200_000_000)
    assert 60_000 <= small < 60_100 < big <= BROKER_MAX_TRANSACTION_TIMEOUT_MS
    assert transaction_timeout_ms(10**9, 10**12) == BROKER_MAX_TRANSACTION_TIMEOUT_MS
    assert transaction_timeout_ms(10**9, 10**12, explicit_ms=5000) == 5000


def test_the_spool_keeps_order_across_memory_and_disk() -> None:
    recs = [(None, b"v%05d" % i, None, None, None) for i in range(10_000)]
    with Spool(memory_bytes=50_000) as spool:
        spool.extend(iter(recs))
        assert spool._file is not None, "spilled to disk"
        assert spool.rows == 10_000 and list(spool) == recs


class _StuckProducer:
    def __init__(self, stuck_at: int) -> None:
        self.left = stuck_at + 5
        self.stuck_at = stuck_at

    def __len__(self) -> int:
        return self.left

    def flush(self, timeout: float) -> int:
        time.sleep(0.01)
        self.left = max(self.stuck_at, self.left - 1)
        return self.left


def test_a_flush_timeout_names_the_undelivered_count() -> None:
    clock = [0.0]

    def tick() -> float:
        clock[0] += 0.3
        return clock[0]

    with pytest.raises(TimeoutError, match="transaction x: 3 records still undelivered after 1s"):
        flush(_StuckProducer(3), 1.0, "transaction x", clock=tick)
    flush(_StuckProducer(0), 1.0, "fine", clock=tick)


def test_the_sinks_check_the_rows_schema_as_sparks_kafka_sink_does() -> None:
    """A value of another type than string or binary used to be sent as its str() (an int as its
    digits, a struct as "Row(...)"); now the query fails at start naming the column."""
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    from oncelog.spark.sink import check_output_schema

    def schema(**cols: Any) -> StructType:
        return StructType([StructField(n, t) for n, t in cols.items()])

    headers = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))
    fine = schema(key=StringType(), value=BinaryType(), topic=StringType(), partition=IntegerType(), headers=headers,
                  extra=LongType())
    check_output_schema(fine, topic_option=False)
    check_output_schema(schema(value=StringType()), topic_option=True)
    check_output_schema(schema(value=StringType(), topic=LongType()), topic_option=True)  # the option wins
    for cols, topic_option, says in [
        ({"key": StringType()}, True, "needs a 'value' column"),
        ({"value": StringType()}, False, "needs the 'topic' option or a 'topic' column"),
        ({"value": IntegerType()}, True, "'value' column must be string or binary, not int"),
        ({"value": StructType([StructField("a", IntegerType())])}, True, "'value' column must be string or binary"),
        ({"value": BinaryType(), "key": LongType()}, True, "'key' column must be string or binary, not bigint"),
        ({"value": BinaryType(), "topic": BinaryType()}, False, "'topic' column must be string, not binary"),
        ({"value": BinaryType(), "partition": LongType()}, True, "'partition' column must be int, not bigint"),
        ({"value": BinaryType(), "headers": ArrayType(StringType())}, True, "'headers' column must be array<struct"),
    ]:
        with pytest.raises(ValueError, match=re.escape(says)):
            check_output_schema(schema(**cols), topic_option=topic_option)

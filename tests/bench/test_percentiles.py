"""Nearest-rank percentiles, one function for the bench's rows and curves (charts.percentile) and the
pipeline's latency (pipeline_bench._percentile), in exact arithmetic."""

from __future__ import annotations

from decimal import Decimal

from oncelog.charts import TABLE_QUANTILES, nearest_rank, percentile, quantile_table
from oncelog.demo.pipeline_bench import _percentile


def rank_by_integers(n: int, q: float) -> int:
    """The smallest r with r / n >= q / 100, q read as the decimal it is written as."""
    num, exp = Decimal(repr(q)).as_integer_ratio()
    return min(max(-(-num * n // (exp * 100)), 1), n)


def test_the_nearest_rank_is_exact() -> None:
    for q in TABLE_QUANTILES:
        for n in (*range(1, 3_000), 10_000, 99_000, 100_000, 1_000_000):
            assert nearest_rank(n, q) == rank_by_integers(n, q), (n, q)
    assert nearest_rank(2_000, 99.9) == 1_998  # ceil(99.9 / 100 * 2000) in floats: 1999
    assert nearest_rank(1_000, 99.9) == 999 and nearest_rank(100, 99) == 99 and nearest_rank(2, 50) == 1


def test_two_outliers_in_2000_samples_are_above_p99_9() -> None:
    samples = [1.0] * 1_998 + [500.0] * 2
    assert percentile(samples, 99.9) == 1.0
    assert dict(quantile_table(samples))[99.9] == 1.0


def test_p99_9_is_in_the_table_from_1000_samples_on() -> None:
    assert 99.9 in dict(quantile_table([1.0] * 1_000)) and 99.9 not in dict(quantile_table([1.0] * 999))
    assert 99.99 in dict(quantile_table([1.0] * 10_000)) and 99.99 not in dict(quantile_table([1.0] * 9_999))
    assert 99.0 in dict(quantile_table([1.0] * 100)) and 99.0 not in dict(quantile_table([1.0] * 99))


def test_the_pipelines_percentile_is_the_same_nearest_rank() -> None:
    ms = [float(x) for x in range(1, 101)]
    assert _percentile(ms, 0.99) == 99.0  # int(0.99 * 100) = 99 was the 100th value, the max
    assert _percentile([2.0, 1.0], 0.50) == 1.0
    assert _percentile(ms[::-1], 0.5) == 50.0
    assert str(_percentile([], 0.5)) == "nan"

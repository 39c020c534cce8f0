"""Pure planning helpers of the oncelog source and sink options (no broker, no Spark)."""

from __future__ import annotations

import pytest

from oncelog.spark.guarantees import Guarantee, producer_config
from oncelog.spark.options import client_config, parse_assign, parse_offsets_spec
from oncelog.spark.source import OffsetRange, apply_max_rows, min_offsets, plan_ranges


def test_plan_ranges_skips_empty_and_unknown_partitions() -> None:
    start = {"a": {"0": 5, "1": 7}}
    end = {"a": {"0": 9, "1": 7, "2": 4}, "b": {"0": 3}}
    assert plan_ranges(start, end) == [OffsetRange("a", 0, 5, 9)]


def test_max_rows_caps_total_and_moves_every_lagging_partition() -> None:
    start = {"t": {"0": 0, "1": 100}}
    latest = {"t": {"0": 1000, "1": 101}}
    capped = apply_max_rows(start, latest, 100)
    span = sum(capped["t"][p] - start["t"][p] for p in capped["t"])
    assert span <= 101 and capped["t"]["1"] == 101 and capped["t"]["0"] > 0
    assert apply_max_rows(start, latest, 5000) == latest


def test_min_offsets_is_per_partition() -> None:
    assert min_offsets({"t": {"0": 5, "1": 9}}, {"t": {"0": 7, "1": 3}}) == {"t": {"0": 5, "1": 3}}


def test_offset_specs_and_assign() -> None:
    assert parse_offsets_spec("Earliest", "x") == "earliest"
    assert parse_offsets_spec('{"t": {"0": 23, "1": -2}}', "x") == {"t": {0: 23, 1: -2}}
    with pytest.raises(ValueError):
        parse_offsets_spec("soon", "x")
    assert parse_assign('{"t": [1, 0]}') == {"t": [0, 1]}


def test_client_config_strips_prefix_and_refuses_owned_settings() -> None:
    assert client_config({"kafka.bootstrap.servers": "h:1", "subscribe": "t"}) == {"bootstrap.servers": "h:1"}
    with pytest.raises(ValueError):
        client_config({"subscribe": "t"})
    with pytest.raises(ValueError):
        client_config({"kafka.bootstrap.servers": "h:1", "kafka.transactional.id": "x"})


def test_guarantees_map_to_producer_settings() -> None:
    assert Guarantee.parse(None) is Guarantee.exactly_once
    assert Guarantee.parse("at-least-once") is Guarantee.at_least_once
    with pytest.raises(ValueError):
        Guarantee.parse("maybe_once")
    eo = producer_config(Guarantee.exactly_once, {"bootstrap.servers": "h:1"}, "tid", 1000)
    assert eo["transactional.id"] == "tid" and eo["enable.idempotence"] is True
    amo = producer_config(Guarantee.at_most_once, {"bootstrap.servers": "h:1"}, None, 0)
    assert amo["acks"] == 0 and amo["retries"] == 0 and "transactional.id" not in amo
    with pytest.raises(ValueError):
        producer_config(Guarantee.exactly_once, {}, None, 1000)

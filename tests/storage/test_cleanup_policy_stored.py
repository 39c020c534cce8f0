"""cleanup.policy is stored with each policy once, in the order given, so versions before 269d961
read it after a downgrade.

Since 269d961 the policy is Kafka's ValidList (``compact,compact`` and ``''`` accepted), but older
versions refuse a repeated policy, ignore the refused override and run the topic as ``delete``:
retention deleted a compacted topic's records after a downgrade (upgrade probe,
repro_downgrade_policy.py). ``''`` has no form they accept (storage.md, the downgrade note).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.storage.config import normalized_broker_config, normalized_topic_config, parse_topic_configs
from tests.inproc import InProcessBroker

API_CREATE_TOPICS, API_INCREMENTAL_ALTER_CONFIGS = 19, 44
TOPIC, BROKER = 2, 4
SET = 0


def accepted_before_269d961(stored: str) -> bool:
    """The rule of the versions before 269d961 (their ``_cleanup_policy`` on the LIST parse)."""
    values = tuple(re.split(r"\s*,\s*", stored.strip())) if stored.strip() else ()
    return bool(values) and len(set(values)) == len(values) and all(v in ("compact", "delete") for v in values)


@pytest.mark.parametrize("given, stored", [
    ("compact,compact", "compact"), ("delete,delete", "delete"), ("delete,compact", "delete,compact"),
    (" compact , delete ", "compact,delete"), ("compact,delete,compact", "compact,delete"),
    ("delete,delete,compact,compact", "delete,compact"), ("compact", "compact")])
def test_each_policy_is_stored_once_in_the_order_given(given: str, stored: str) -> None:
    assert normalized_topic_config("cleanup.policy", given) == stored
    assert normalized_broker_config("log.cleanup.policy", given) == stored
    assert accepted_before_269d961(stored)
    assert parse_topic_configs({"cleanup.policy": given})["cleanup.policy"] == tuple(stored.split(","))


def test_no_policy_and_invalid_values_are_left_as_they_are() -> None:
    assert normalized_topic_config("cleanup.policy", "") == ""
    assert normalized_topic_config("cleanup.policy", "compact,nope,compact") == "compact,nope,compact"


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    yield broker
    broker.close()


def _stored(b: InProcessBroker, name: str) -> str:
    topics = json.loads((b.data_dir / "__meta" / "topics.json").read_text())["topics"]
    return next(t for t in topics if t["name"] == name)["configs"]["cleanup.policy"]


def test_the_broker_stores_the_form_older_versions_accept(b: InProcessBroker) -> None:
    r = b.call(API_CREATE_TOPICS, 7, {"topics": [
        {"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
         "configs": [{"name": "cleanup.policy", "value": policy}]}
        for name, policy in [("cc", "compact,compact"), ("dc", "delete, compact,delete")]],
        "timeout": 5000, "validate_only": False})
    assert [t.error_code for t in r.topics] == [0, 0]
    assert (_stored(b, "cc"), _stored(b, "dc")) == ("compact", "delete,compact")
    plog = b.broker.logs.get_partition("cc", 0)
    assert plog is not None and plog.config.compact and not plog.config.delete
    r = b.call(API_INCREMENTAL_ALTER_CONFIGS, 1, {"resources": [
        {"resource_type": TOPIC, "resource_name": "dc", "configs": [
            {"name": "cleanup.policy", "config_operation": SET, "value": "compact,compact,delete"}]},
        {"resource_type": BROKER, "resource_name": "", "configs": [
            {"name": "log.cleanup.policy", "config_operation": SET, "value": "compact,compact"}]}],
        "validate_only": False})
    assert [x.error_code for x in r.responses] == [0, 0]
    assert _stored(b, "dc") == "compact,delete"
    assert b.broker.logs.broker_configs.cluster["log.cleanup.policy"] == "compact"
    b.restart(clean=True)
    assert (_stored(b, "cc"), _stored(b, "dc")) == ("compact", "compact,delete")
    assert all(accepted_before_269d961(_stored(b, name)) for name in ("cc", "dc"))

"""The sink's per-task protocol against a real broker, without Spark: replay skip and zombie fencing.

These need broker transactions (ours, via the ``broker`` fixture).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest

from oncelog.demo.faults import read_topic
from oncelog.spark.guarantees import Guarantee
from oncelog.spark.sink import SinkHooks, SinkSettings, TaskIdentity, write_partition
from oncelog.testing.broker_process import BrokerProcess, create_topic


def _settings(bootstrap: str, guarantee: Guarantee) -> SinkSettings:
    s = SinkSettings(client={"bootstrap.servers": bootstrap}, guarantee=guarantee, topic="out",
                     progress_topic="progress", progress_partitions=4, timeout_s=30)
    s.progress().ensure_topic()
    return s


class _Stall(SinkHooks):
    """The zombie: output flushed, transaction open, then a pause before committing."""

    def before_commit(self, ident: TaskIdentity, guarantee: Guarantee) -> None:
        time.sleep(3)


def _records(tag: str, n: int):
    return [(None, f"{tag}-{i}".encode(), None, None, None) for i in range(n)]


@pytest.mark.parametrize("guarantee,copies", [(Guarantee.exactly_once, 1), (Guarantee.at_least_once, 2),
                                              (Guarantee.at_most_once, 1)])
def test_replayed_batch_is_skipped_or_repeated_per_guarantee(broker: BrokerProcess, guarantee: Guarantee,
                                                             copies: int) -> None:
    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, guarantee)
    ident = TaskIdentity("q1", 0, 0)
    first = write_partition(_records("b0", 20), ident, s)
    again = write_partition(_records("b0", 20), ident, s)
    nxt = write_partition(_records("b1", 5), TaskIdentity("q1", 1, 0), s)
    assert not first.skipped and not nxt.skipped
    assert again.skipped == (copies == 1)
    counts = Counter(v for _k, v in read_topic(broker.bootstrap, "out"))
    assert {c for v, c in counts.items() if v.startswith(b"b0")} == {copies}
    assert sum(1 for v in counts if v.startswith(b"b1")) == 5


def test_zombie_attempt_is_fenced_and_output_appears_once(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, Guarantee.exactly_once)
    ident = TaskIdentity("q2", 7, 1)
    outcome: dict[str, object] = {}

    def zombie() -> None:
        try:
            outcome["zombie"] = write_partition(_records("z", 30), ident, s, _Stall())
        except Exception as exc:
            outcome["zombie"] = exc

    t = threading.Thread(target=zombie)
    t.start()
    deadline = time.monotonic() + 20
    while not read_topic(broker.bootstrap, "out", isolation="read_uncommitted") and time.monotonic() < deadline:
        time.sleep(0.05)  # the zombie's records are in the log, its transaction still open
    retry = write_partition(_records("z", 30), ident, s)
    t.join(30)
    assert not retry.skipped and retry.rows == 30
    assert isinstance(outcome["zombie"], Exception), "the old attempt must not commit after being fenced"
    counts = Counter(v for _k, v in read_topic(broker.bootstrap, "out"))
    assert len(counts) == 30 and set(counts.values()) == {1}


def test_the_topic_option_overrides_a_topic_column_as_in_spark(broker: BrokerProcess) -> None:
    """Rows read from a Kafka source carry its ``topic`` column; with the ``topic`` option set they
    must go to that topic, not back into the source topic."""
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    create_topic(bs, "source", 1)
    s = _settings(bs, Guarantee.exactly_once)
    rows = [(None, b"r%d" % i, "source", None, None) for i in range(5)]
    assert write_partition(rows, TaskIdentity("q-topic", 0, 0), s).rows == 5
    assert sorted(v for _k, v in read_topic(bs, "out")) == [b"r%d" % i for i in range(5)]
    assert read_topic(bs, "source") == []
    by_column = SinkSettings(client={"bootstrap.servers": bs}, guarantee=Guarantee.at_least_once, topic=None)
    write_partition(rows, TaskIdentity("q-topic", 0, 0), by_column)
    assert len(read_topic(bs, "source")) == 5

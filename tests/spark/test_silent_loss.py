"""Ways the sinks used to lose data silently, each against a real broker (no Spark).

Every test here failed before the fix it names (see the commit that added it): a second sink of one
query skipped every batch; a rewound checkpoint's batches were dropped; a replay with other rows was
skipped unchecked; two concurrent at_most_once attempts both wrote; the progress topic aged out
after the broker's default retention; a slow upstream ate the transaction timeout.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.demo.faults import read_topic
from oncelog.spark.guarantees import Guarantee
from oncelog.spark.sink import SinkSettings, TaskIdentity, write_partition
from oncelog.testing.broker_process import BrokerProcess, create_topic, oncelog_broker

EO = Guarantee.exactly_once


def _settings(bootstrap: str, guarantee: Guarantee, topic: str, progress_topic: str = "progress",
              **extra: object) -> SinkSettings:
    s = SinkSettings(client={"bootstrap.servers": bootstrap}, guarantee=guarantee, topic=topic,
                     progress_topic=progress_topic, progress_partitions=4, timeout_s=30, **extra)  # type: ignore[arg-type]
    s.progress().ensure_topic()
    return s


def _records(tag: str, n: int) -> list[tuple[None, bytes, None, None, None]]:
    return [(None, f"{tag}-{i}".encode(), None, None, None) for i in range(n)]


def _values(bootstrap: str, topic: str) -> Counter[bytes]:
    return Counter(v or b"" for _k, v in read_topic(bootstrap, topic))


# (1) sink identity --------------------------------------------------------------------------------

def test_two_kafka_sinks_of_one_query_id_both_write(broker: BrokerProcess) -> None:
    """foreachBatch writing each batch to two topics under one query id: the second is not skipped."""
    bs = broker.bootstrap
    create_topic(bs, "out-a", 1)
    create_topic(bs, "out-b", 1)
    a = _settings(bs, EO, "out-a")
    b = _settings(bs, EO, "out-b")
    for batch in range(2):
        ident = TaskIdentity("q", batch, 0)
        assert not write_partition(_records(f"b{batch}", 10), ident, a).skipped
        assert not write_partition(_records(f"b{batch}", 10), ident, b).skipped, "second sink skipped"
    assert _values(bs, "out-a") == _values(bs, "out-b") == Counter(
        {f"b{n}-{i}".encode(): 1 for n in range(2) for i in range(10)})


# (2) a higher committed batch is a rewound checkpoint or a reused query id: fail, unless accepted ---

def test_higher_committed_batch_fails_the_task(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, EO, "out")
    write_partition(_records("b5", 3), TaskIdentity("q", 5, 0), s)
    with pytest.raises(RuntimeError, match=r"batch 5 .*already committed.*batch 3|rewound|reused"):
        write_partition(_records("b3", 3), TaskIdentity("q", 3, 0), s)
    assert b"b3-0" not in _values(bs, "out")


# (3) a replay is checked against the stored row count ---------------------------------------------

def test_replay_with_a_different_row_count_fails(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, EO, "out")
    ident = TaskIdentity("q", 0, 0)
    write_partition(_records("b0", 20), ident, s)
    assert write_partition(_records("b0", 20), ident, s).skipped, "an identical replay is skipped"
    with pytest.raises(RuntimeError, match=r"20 rows.*19|19.*20 rows"):
        write_partition(_records("b0", 19), ident, s)


# (4) at_most_once is fenced: concurrent attempts of one task write its output once at most ------

# The fenced attempts' producers warn as they close; the sink silences that with catch_warnings,
# which is not thread-safe (a Python worker runs one task at a time; only this test closes producers
# from several threads at once), so the filter is also set here, before the threads start.
@pytest.mark.filterwarnings("ignore:Producer abort_transaction failed during close")
def test_at_most_once_concurrent_attempts_write_at_most_once(broker: BrokerProcess) -> None:
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, Guarantee.at_most_once, "out")
    attempts = 4
    for batch in range(3):
        barrier = threading.Barrier(attempts)
        ident = TaskIdentity("q", batch, 0)

        def attempt(ident: TaskIdentity = ident, barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            try:
                write_partition(_records(f"b{ident.batch_id}", 50), ident, s)
            except Exception:
                pass  # a fenced attempt fails, as a Spark task would

        threads = [threading.Thread(target=attempt) for _ in range(attempts)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    counts = _values(bs, "out")
    assert max(counts.values()) == 1, f"{sum(counts.values()) - len(counts)} duplicates from concurrent attempts"
    # Fencing leaves one attempt able to mark each batch, and it writes (nothing was lost here).
    assert set(counts) == {f"b{n}-{i}".encode() for n in range(3) for i in range(50)}


# (5) the progress topic outlives the broker's retention ------------------------------------------

def test_progress_topic_is_compacted_or_kept_forever(broker: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    bs = broker.bootstrap
    _settings(bs, EO, "out", progress_topic="progress-retention")
    admin = AdminClient({"bootstrap.servers": bs})
    res = ConfigResource(ConfigResource.Type.TOPIC, "progress-retention")
    configs = admin.describe_configs([res])[res].result(timeout=15)
    policy = configs["cleanup.policy"].value
    assert policy == "compact" or configs["retention.ms"].value == "-1", (
        f"progress records would be deleted after retention.ms={configs['retention.ms'].value}")


# (6) a slow upstream does not eat the transaction timeout -----------------------------------------

@pytest.fixture
def fast_abort_broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with oncelog_broker(tmp_path / "data", "--auto-create-topics", "--transaction-abort-interval-ms", "200",
                        log_path=tmp_path / "broker.log").start() as b:
        yield b


def test_slow_input_does_not_time_out_the_transaction(fast_abort_broker: BrokerProcess) -> None:
    """A task whose input (the upstream computation) takes longer than transaction.timeout.ms."""
    import time

    bs = fast_abort_broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, EO, "out", transaction_timeout_ms=1500)

    def slow() -> Iterator[tuple[None, bytes, None, None, None]]:
        for i in range(6):
            time.sleep(0.5)
            yield (None, b"slow-%d" % i, None, None, None)

    msg = write_partition(slow(), TaskIdentity("q", 0, 0), s)
    assert msg.rows == 6 and not msg.skipped
    assert _values(bs, "out") == Counter({b"slow-%d" % i: 1 for i in range(6)})

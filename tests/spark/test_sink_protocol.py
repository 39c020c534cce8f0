"""The sink's per-task protocol against a real broker, without Spark: replay skip and zombie fencing.

These need broker transactions (ours, via the ``broker`` fixture).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from typing import Any

import pytest

from oncelog.demo.faults import read_topic
from oncelog.spark.clients import config_key
from oncelog.spark.guarantees import Guarantee
from oncelog.spark.progress import Committed, progress_key
from oncelog.spark.sink import TXN_PRODUCERS, ArrowRecords, SinkHooks, SinkSettings, TaskIdentity, write_partition
from oncelog.testing.broker_process import BrokerProcess, create_topic


def _settings(bootstrap: str, guarantee: Guarantee, reuse: bool = False) -> SinkSettings:
    s = SinkSettings(client={"bootstrap.servers": bootstrap}, guarantee=guarantee, topic="out",
                     progress_topic="progress", progress_partitions=4, timeout_s=30,
                     reuse_transactional_producers=reuse)
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


class _SeeMark(SinkHooks):
    """at_most_once's before_commit runs between the mark and the output: it notes what a
    read_committed reader sees then in the progress log and in the output topic."""

    def __init__(self, settings: SinkSettings, bootstrap: str) -> None:
        self.settings, self.bootstrap = settings, bootstrap
        self.seen: list[tuple[object, int]] = []

    def before_commit(self, ident: TaskIdentity, guarantee: Guarantee) -> None:
        mark = self.settings.progress().read(ident.partition_id).latest.get(
            progress_key(self.settings.sink_id(ident.query_id), ident.partition_id))
        self.seen.append((mark, len(read_topic(self.bootstrap, "out", isolation="read_uncommitted"))))


@pytest.mark.parametrize("reuse", [False, True], ids=["new-producer", "pooled-producer"])
def test_at_most_once_marks_the_batch_before_it_sends_anything(broker: BrokerProcess, reuse: bool) -> None:
    """at_most_once commits its progress record (row count unknown: nothing is spooled) before it
    sends a record; a replay is skipped whatever its data and reads no input. An upstream that
    fails half way loses the batch if the mark was made, and otherwise leaves it to the retry:
    either way no record of the batch is written twice."""
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, Guarantee.at_most_once, reuse=reuse)
    hooks = _SeeMark(s, bs)
    pulled: list[str] = []

    def records(tag: str, n: int, fail_at: int | None = None):
        pulled.append(tag)
        for i, r in enumerate(_records(tag, n)):
            if i == fail_at:
                raise RuntimeError("upstream failed")
            yield r

    ok = write_partition(records("a0", 20), TaskIdentity("q-amo", 0, 0), s, hooks)
    assert hooks.seen == [(Committed(0, -1), 0)] and ok.rows == 20 and not ok.skipped
    with pytest.raises(RuntimeError, match="upstream failed"):
        write_partition(records("a1", 20, fail_at=7), TaskIdentity("q-amo", 1, 0), s, hooks)
    marked = len(hooks.seen) == 2
    if marked:
        assert hooks.seen[-1] == (Committed(1, -1), 20)
    retry = write_partition(records("a1", 25), TaskIdentity("q-amo", 1, 0), s, hooks)
    assert retry.skipped == marked and retry.rows == (0 if marked else 25)
    assert pulled.count("a1") == (1 if marked else 2), "a skipped replay reads no input"
    nxt = write_partition(records("a2", 5), TaskIdentity("q-amo", 2, 0), s, hooks)
    assert nxt.rows == 5 and hooks.seen[-1][0] == Committed(2, -1)
    counts = Counter(v for _k, v in read_topic(bs, "out"))
    a1 = sum(c for v, c in counts.items() if v.startswith(b"a1-"))
    assert a1 <= 7 if marked else a1 == 25
    assert set(counts.values()) == {1} and sum(counts.values()) == 25 + a1


@pytest.mark.parametrize("pooled_zombie", [False, True], ids=["new-producer", "pooled-producer"])
def test_zombie_attempt_is_fenced_and_output_appears_once(broker: BrokerProcess, pooled_zombie: bool) -> None:
    """The zombie stalls with its transaction open; the retry fences it. With ``pooled_zombie`` the
    zombie runs on a producer an earlier batch left in the worker's pool (no init_transactions, no
    progress read): it is fenced all the same, and fails instead of starting over."""
    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, Guarantee.exactly_once, reuse=pooled_zombie)
    ident = TaskIdentity("q2", 7, 1)
    if pooled_zombie:
        assert not write_partition(_records("z6", 4), TaskIdentity("q2", 6, 1), s).skipped
        assert len(TXN_PRODUCERS.idle(config_key(s.client, s.transactional_id(ident)))) == 1
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
    counts = Counter(v for _k, v in read_topic(broker.bootstrap, "out") if v.startswith(b"z-"))
    assert len(counts) == 30 and set(counts.values()) == {1}


@pytest.mark.parametrize("guarantee", [Guarantee.exactly_once, Guarantee.at_most_once])
def test_a_pooled_producer_is_reused_and_discarded_once_fenced(broker: BrokerProcess, guarantee: Guarantee) -> None:
    """Batches of one sink partition in one Python worker share a transactional producer (no
    init_transactions, no progress read). When an attempt elsewhere (another worker: here the
    pooled producer is hidden from it) takes the transactional id over and commits a batch, the
    idle pooled producer is fenced: the next task that picks it up finds that out before producing
    anything, discards it, and goes on with a new producer, which reads the progress and skips the
    batch the other attempt committed."""
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, guarantee, reuse=True)
    key = config_key(s.client, s.transactional_id(TaskIdentity("q-reuse", 0, 0)))
    first = write_partition(_records("b0", 10), TaskIdentity("q-reuse", 0, 0), s)
    second = write_partition(_records("b1", 10), TaskIdentity("q-reuse", 1, 0), s)
    def did(msg: object, phase: str) -> bool:  # init and progress of a new producer overlap the spool
        return any(k.startswith(phase) for k in getattr(msg, "phases", {}))

    assert not first.reused_producer and did(first, "init") and did(first, "progress")
    assert second.reused_producer and not did(second, "init") and not did(second, "progress")
    [ours] = TXN_PRODUCERS.idle(key)

    stale = TXN_PRODUCERS.take(key)  # as if it sat idle in another worker process
    elsewhere = write_partition(_records("b2", 10), TaskIdentity("q-reuse", 2, 0), s)
    assert not elsewhere.reused_producer and not elsewhere.skipped
    TXN_PRODUCERS.discard(TXN_PRODUCERS.take(key))
    TXN_PRODUCERS.give(key, stale)  # back in this worker, fenced and still believing batch 1 is the last

    replay = write_partition(_records("b2", 10), TaskIdentity("q-reuse", 2, 0), s)
    assert replay.skipped and replay.reason == "replay" and not replay.reused_producer
    assert ours not in TXN_PRODUCERS.idle(key), "a fenced producer must be discarded, not pooled again"
    after = write_partition(_records("b3", 10), TaskIdentity("q-reuse", 3, 0), s)
    assert after.reused_producer and not after.skipped

    counts = Counter(v for _k, v in read_topic(bs, "out"))
    for tag in (b"b0", b"b1", b"b2", b"b3"):
        assert sorted(c for v, c in counts.items() if v.startswith(tag + b"-")) == [1] * 10, tag


def test_transactional_producers_are_not_pooled_by_default(broker: BrokerProcess) -> None:
    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, Guarantee.exactly_once)
    for b in range(2):
        assert not write_partition(_records(f"n{b}", 3), TaskIdentity("q-new", b, 0), s).reused_producer
    assert TXN_PRODUCERS.idle() == []


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


@pytest.fixture
def small_max_timeout_broker(tmp_path):  # type: ignore[no-untyped-def]
    from oncelog.testing.broker_process import oncelog_broker

    with oncelog_broker(tmp_path / "data", "--auto-create-topics", "--transaction-max-timeout-ms", "100000",
                        log_path=tmp_path / "broker.log").start() as b:
        yield b


def test_a_new_producer_made_on_a_guess_is_replaced_when_refused_or_too_small(
        small_max_timeout_broker: BrokerProcess) -> None:
    """init_transactions runs beside the spool, on a transaction timeout guessed before the input is
    known (2 minutes, then twice the largest batch seen). A guess the broker refuses (above its
    transaction.max.timeout.ms, here 100 s), or one smaller than the batch turns out to need, is
    replaced by a producer sized exactly, whose init fences the first: output once either way."""
    bs = small_max_timeout_broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, Guarantee.exactly_once)
    msgs = [write_partition(_records(f"g{b}", n), TaskIdentity("q-guess", b, 0), s)
            for b, n in enumerate([10, 10, 100])]
    # batch 0: the 2-minute guess is refused; batch 1: the guess (sized for 20 rows) fits and its init
    # overlapped the spool; batch 2: 100 rows need more than the guess
    assert ["init" in m.phases for m in msgs] == [True, False, True]
    assert "init_overlapped" in msgs[1].phases and not any(m.skipped for m in msgs)
    counts = Counter(v for _k, v in read_topic(bs, "out"))
    for b, n in enumerate([10, 10, 100]):
        assert sorted(c for v, c in counts.items() if v.startswith(f"g{b}-".encode())) == [1] * n, b


def test_the_drivers_preparation_is_kept_and_does_not_recreate_a_deleted_progress_topic(
        broker: BrokerProcess) -> None:
    """Spark makes a writer per micro-batch; the checks run for the first. A progress topic deleted
    meanwhile is not created again empty (which would forget every committed batch)."""
    from confluent_kafka.admin import AdminClient

    s = SinkSettings(client={"bootstrap.servers": broker.bootstrap}, guarantee=Guarantee.exactly_once, topic="out",
                     progress_topic="progress-kept", progress_partitions=2, timeout_s=30)
    first = s.prepare()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    assert "progress-kept" in admin.list_topics(timeout=10).topics
    admin.delete_topics(["progress-kept"])["progress-kept"].result(15)
    assert s.prepare() is first
    assert "progress-kept" not in admin.list_topics(timeout=10).topics


@pytest.mark.parametrize("guarantee", [Guarantee.exactly_once, Guarantee.at_most_once])
def test_a_task_does_not_recreate_a_deleted_progress_topic(broker: BrokerProcess, guarantee: Guarantee) -> None:
    """A task's new transactional producer connects with metadata requests before
    init_transactions (sink._connect_first). On a broker that creates topics on demand (this
    fixture's), a request naming the progress topic would bring a deleted one back empty, and with
    it every committed batch forgotten: the task must fail instead, and the topic stay deleted."""
    from confluent_kafka.admin import AdminClient

    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, guarantee)
    write_partition(_records("b0", 3), TaskIdentity("q-del", 0, 0), s)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.delete_topics(["progress"])["progress"].result(15)
    with pytest.raises(Exception, match="progress"):
        write_partition(_records("b1", 3), TaskIdentity("q-del", 1, 0), dataclasses.replace(s, timeout_s=5))
    assert "progress" not in admin.list_topics(timeout=10).topics


def test_a_plain_producer_that_failed_is_not_pooled(broker: BrokerProcess) -> None:
    from oncelog.spark.sink import PRODUCERS

    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, Guarantee.at_least_once)
    assert write_partition(_records("ok", 3), TaskIdentity("q-plain", 0, 0), s).rows == 3
    assert len(PRODUCERS.idle()) == 1
    with pytest.raises(Exception, match=r"(?i)too large|size"):
        write_partition([(None, b"x" * (3 << 20), None, None, None)], TaskIdentity("q-plain", 1, 0), s)
    assert PRODUCERS.idle() == [], "a producer that saw an error is closed, not lent again"
    again = write_partition(_records("ok2", 3), TaskIdentity("q-plain", 2, 0), s)
    assert again.rows == 3 and not again.reused_producer


@pytest.mark.parametrize("guarantee", list(Guarantee))
def test_new_producers_hold_back_their_second_connection_briefly(broker: BrokerProcess, guarantee: Guarantee,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every producer the sink makes (a transactional one per exactly_once and at_most_once task,
    the pooled plain ones) sets reconnect.backoff.ms=20 unless the user's options set it: with
    librdkafka's 100 ms, its first requests after the bootstrap connection waited 50 ms for the
    next connection (sink.PRODUCER_DEFAULTS), in every exactly_once task. A user's value wins."""
    import confluent_kafka

    from oncelog.spark.sink import PRODUCERS

    made: list[dict[str, object]] = []
    real = confluent_kafka.Producer

    def recording(conf: dict[str, object]) -> object:
        made.append(dict(conf))
        return real(conf)

    monkeypatch.setattr(confluent_kafka, "Producer", recording)
    create_topic(broker.bootstrap, "out", 1)
    for b, (user, expected) in enumerate([({}, 20), ({"reconnect.backoff.ms": "100"}, "100")]):
        PRODUCERS.clear()
        TXN_PRODUCERS.clear()
        made.clear()
        s = dataclasses.replace(_settings(broker.bootstrap, guarantee),
                                client={"bootstrap.servers": broker.bootstrap, **user})
        assert write_partition(_records(f"r{b}", 3), TaskIdentity("q-backoff", b, 0), s).rows == 3
        assert made, "the task made no producer"
        assert {conf.get("reconnect.backoff.ms") for conf in made} == {expected}


@pytest.mark.parametrize("guarantee", list(Guarantee))
def test_every_new_producer_is_connected_before_its_first_record(broker: BrokerProcess, guarantee: Guarantee,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Every new producer of a task (at_least_once's idempotent output producer, at_most_once's
    acks=0 one, the transactional ones) makes its two topic-less metadata requests before its
    first record (sink._connect_first): a new idempotent producer's first flush otherwise stalled
    100 ms to 1 s now and then, waiting for its producer id."""
    import confluent_kafka

    from oncelog.spark.sink import PRODUCERS

    made: list[list[str]] = []
    real = confluent_kafka.Producer

    class Recording:
        def __init__(self, conf: dict[str, object]) -> None:
            self._p: Any = real(conf)
            self.calls: list[str] = []
            made.append(self.calls)

        def list_topics(self, *args: object, **kwargs: object) -> object:
            self.calls.append("metadata" if args or kwargs.get("topic") else "topic-less metadata")
            return self._p.list_topics(*args, **kwargs)

        def produce(self, *args: object, **kwargs: object) -> object:
            self.calls.append("produce")
            return self._p.produce(*args, **kwargs)

        def __len__(self) -> int:
            return len(self._p)

        def __getattr__(self, name: str) -> object:
            return getattr(self._p, name)

    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, guarantee)
    PRODUCERS.clear()
    monkeypatch.setattr(confluent_kafka, "Producer", Recording)
    assert write_partition(_records("c0", 3), TaskIdentity("q-connect", 0, 0), s).rows == 3
    producing = [calls for calls in made if "produce" in calls]
    assert len(producing) == (2 if guarantee is Guarantee.at_most_once else 1)
    for calls in producing:
        assert calls[:calls.index("produce")].count("topic-less metadata") == 2, calls


def test_a_pooled_producer_whose_state_the_broker_dropped_starts_over_with_a_new_one(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The broker drops the pooled producer's state in its output partitions after the task's
    progress record went into the transaction, before its output (here a stranger's new idempotent
    producers push it out of a small ``producer_state_max_entries``; in Kafka the same happens to an
    output partition left idle for ``producer.id.expiration.ms`` while the progress partition is
    written every batch). The output then gets UNKNOWN_PRODUCER_ID, which librdkafka makes an
    abortable error (KIP-360: the epoch must be bumped). The task aborts and starts over with a new
    producer (init_transactions, progress read), as Spark's retry of the task would, instead of
    failing: under a local master there is no retry, and the query stopped. Each batch's output
    appears once."""
    from confluent_kafka import Producer

    from oncelog.spark import sink
    from oncelog.testing.broker_process import oncelog_broker

    (tmp_path / "broker.toml").write_text("producer_state_max_entries = 6\n")
    with oncelog_broker(tmp_path / "data", "--config", str(tmp_path / "broker.toml"),
                        log_path=tmp_path / "broker.log").start() as b:
        bs = b.bootstrap
        create_topic(bs, "out", 2)
        create_topic(bs, "elsewhere", 8)
        s = _settings(bs, Guarantee.exactly_once, reuse=True)
        def records(tag: str) -> list[Any]:  # all to partition 0: the partition whose state is dropped
            return [(None, f"{tag}-{i}".encode(), None, 0, None) for i in range(20)]

        first = write_partition(records("b0"), TaskIdentity("q-evict", 0, 0), s)
        assert not first.reused_producer
        real_produce = sink.Spool.produce
        churned: list[bool] = []

        def churn_then_produce(self: Any, producer: Any, default_topic: str | None) -> int:
            if not churned:  # once: 24 new entries, more than the bound, while the transaction is open
                churned.append(True)
                for _ in range(3):
                    stranger = Producer({"bootstrap.servers": bs, "enable.idempotence": True})
                    for p in range(8):
                        stranger.produce("elsewhere", b"x", partition=p)
                    assert stranger.flush(10) == 0
            return real_produce(self, producer, default_topic)

        monkeypatch.setattr(sink.Spool, "produce", churn_then_produce)
        second = write_partition(records("b1"), TaskIdentity("q-evict", 1, 0), s)
        assert churned and not second.skipped and second.rows == 20
        assert not second.reused_producer  # it started over with a new one
        third = write_partition(records("b2"), TaskIdentity("q-evict", 2, 0), s)
        assert third.reused_producer and not third.skipped  # the new producer went back to the pool
        counts = Counter(v for _k, v in read_topic(bs, "out"))
        for tag in (b"b0", b"b1", b"b2"):
            assert sorted(c for v, c in counts.items() if v.startswith(tag + b"-")) == [1] * 20, tag


@pytest.mark.parametrize("guarantee", [Guarantee.exactly_once, Guarantee.at_most_once])
def test_a_new_producer_whose_transactional_id_expired_before_its_first_record_starts_over(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, guarantee: Guarantee) -> None:
    """Between a new producer's init_transactions and its first record, the coordinator expires
    its transactional id early: a stranger's new transactional ids pushed it past a small
    ``transactional_id_max_entries`` (the same happens after ``transactional.id.expiration.ms``).
    Its AddPartitionsToTxn then gets INVALID_PRODUCER_ID_MAPPING. The task starts over with another
    new producer instead of failing (the query stopped under a local master; found by a pipeline
    beside such a stranger), and the batch appears once. If the STALE_RESTARTS producers after the
    first fail too, the task fails with the broker's error (Spark's retry then takes over)."""
    from confluent_kafka import Producer

    from oncelog.spark import sink
    from oncelog.testing.broker_process import oncelog_broker

    (tmp_path / "broker.toml").write_text("transactional_id_max_entries = 2\n")
    with oncelog_broker(tmp_path / "data", "--config", str(tmp_path / "broker.toml"),
                        "--transaction-abort-interval-ms", "100", log_path=tmp_path / "broker.log").start() as b:
        bs = b.bootstrap
        create_topic(bs, "out", 1)
        s = _settings(bs, guarantee)
        real_check = sink._check_replay
        churns = [0]

        def churn_then_check(*args: Any, **kwargs: Any) -> Any:
            if churns[0] < churns_wanted:
                churns[0] += 1
                for i in range(4):  # newer ids than the task's: the scan expires the task's
                    Producer({"bootstrap.servers": bs, "transactional.id": f"stranger-{churns[0]}-{i}"}
                             ).init_transactions(10)
                time.sleep(0.5)  # a timeout scan runs
            return real_check(*args, **kwargs)

        monkeypatch.setattr(sink, "_check_replay", churn_then_check)
        churns_wanted = 1
        msg = write_partition(_records("b0", 10), TaskIdentity("q-txnid", 0, 0), s)
        assert churns[0] == 1 and not msg.skipped and msg.rows == 10
        assert "stale" in msg.phases  # it did start over
        churns[0], churns_wanted = 0, 1 + sink.STALE_RESTARTS
        with pytest.raises(Exception, match=r"INVALID_PRODUCER_ID_MAPPING|_STATE"):
            write_partition(_records("b1", 10), TaskIdentity("q-txnid", 1, 0), s)
        assert churns[0] == 1 + sink.STALE_RESTARTS
        churns_wanted = 0
        again = write_partition(_records("b1", 10), TaskIdentity("q-txnid", 1, 0), s)  # Spark's retry
        assert not again.skipped
        counts = Counter(v for _k, v in read_topic(bs, "out"))
        for tag in (b"b0", b"b1"):
            assert sorted(c for v, c in counts.items() if v.startswith(tag + b"-")) == [1] * 10, tag


def test_only_a_producer_the_broker_forgot_or_a_passing_error_starts_over() -> None:
    from confluent_kafka import KafkaError, KafkaException

    from oncelog.spark.sink import _restartable

    def exc(code: int, **flags: bool) -> KafkaException:
        return KafkaException(KafkaError(code, "x", **flags))

    for code in (KafkaError.UNKNOWN_PRODUCER_ID, KafkaError.INVALID_PRODUCER_ID_MAPPING,
                 KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER):
        assert _restartable(exc(code, txn_requires_abort=True)), code
    assert _restartable(exc(KafkaError._TIMED_OUT, retriable=True))
    assert not _restartable(exc(KafkaError.UNKNOWN_PRODUCER_ID, fatal=True)), "fenced: a newer attempt has it"
    for code in (KafkaError._INCONSISTENT, KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.UNKNOWN_TOPIC_OR_PART,
                 KafkaError.TOPIC_AUTHORIZATION_FAILED):
        assert not _restartable(exc(code, txn_requires_abort=True)), code
    assert not _restartable(ValueError("not librdkafka's"))


def test_records_the_broker_refuses_fail_the_task_with_its_first_producer(broker: BrokerProcess,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Records larger than the topic's max.message.bytes: every producer would meet the refusal
    again, so the task fails at once (it used to try 1 + STALE_RESTARTS new producers first), and
    nothing of the batch is visible. A batch that fits is written afterwards."""
    from confluent_kafka import KafkaException

    from oncelog.spark import sink

    bs = broker.bootstrap
    create_topic(bs, "small", 1, {"max.message.bytes": "2000"})
    s = dataclasses.replace(_settings(bs, Guarantee.exactly_once), topic="small")
    made: list[str] = []
    real = sink._new_txn_producer

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(sink, "_new_txn_producer", counted)
    with pytest.raises(KafkaException, match="MSG_SIZE_TOO_LARGE"):
        write_partition([(None, b"x" * 5000, None, None, None)], TaskIdentity("q-big", 0, 0), s)
    assert len(made) == 1
    assert read_topic(bs, "small") == []
    assert write_partition(_records("fits", 3), TaskIdentity("q-big", 0, 0), s).rows == 3
    assert len(read_topic(bs, "small")) == 3


@pytest.mark.parametrize("guarantee", list(Guarantee))
def test_an_output_topic_that_cannot_be_made_fails_the_query_at_its_start(tmp_path: Any, guarantee: Guarantee
                                                                           ) -> None:
    """A typo in the topic option, against a cluster that does not create topics on use: the
    driver's preparation names the topic (the tasks used to wait 30 s per producer for their
    records to time out; under exactly_once four producers, then "5 message(s) failed
    delivery"). Against one that does, the preparation's request creates it, as a first produce
    would."""
    from oncelog.testing.broker_process import oncelog_broker

    def prepare(bs: str, topic: str) -> SinkSettings:
        return SinkSettings.from_options({"kafka.bootstrap.servers": bs, "topic": topic,
                                          "processing.guarantee": guarantee.value}).prepare()

    with oncelog_broker(tmp_path / "a", log_path=tmp_path / "a.log").start() as b:
        with pytest.raises(ValueError, match="output topic 'typo' does not exist"):
            prepare(b.bootstrap, "typo")
        create_topic(b.bootstrap, "typo", 1)
        assert prepare(b.bootstrap, "typo").topic == "typo"
    with oncelog_broker(tmp_path / "b", "--auto-create-topics", log_path=tmp_path / "b.log").start() as b:
        prepare(b.bootstrap, "made-on-use")
        from confluent_kafka.admin import AdminClient

        assert "made-on-use" in AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=10).topics


@pytest.mark.parametrize("reuse", [False, True], ids=["reuse-off", "reuse-on"])
def test_a_speculative_copy_does_not_fence_the_first_attempt_while_it_reads(broker: BrokerProcess,
                                                                           reuse: bool) -> None:
    """Spark's speculation runs a second attempt of a slow partition beside the first; the first to
    finish wins and the other is killed, at no cost. Both attempts share the partition's
    transactional id, so the copy's init_transactions fences the first attempt. Made at the copy's
    start (as it was), it fenced a first attempt still reading its slow input, which then could only
    fail: a counted task failure, and with a skewed partition each new copy fenced the last until
    the query failed (found with speculation on a standalone cluster). Now a later attempt inits
    once its input is in: the first attempt, done reading first, commits, and the copy skips."""
    create_topic(broker.bootstrap, "out", 1)
    s = _settings(broker.bootstrap, Guarantee.exactly_once, reuse=reuse)
    outcome: dict[str, object] = {}

    def attempt(number: int, delay_s: float) -> None:
        def slow_input() -> Any:
            time.sleep(delay_s)  # the upstream computation of a skewed partition
            yield from _records("s", 50)

        try:
            outcome[f"attempt {number}"] = write_partition(slow_input(), TaskIdentity("q-spec", 0, 0, number), s)
        except Exception as exc:
            outcome[f"attempt {number}"] = exc

    first = threading.Thread(target=attempt, args=(0, 1.5))
    first.start()
    time.sleep(0.5)  # the copy starts while the first attempt reads
    copy = threading.Thread(target=attempt, args=(1, 1.5))
    copy.start()
    first.join(30)
    copy.join(30)
    won, skipped = outcome["attempt 0"], outcome["attempt 1"]
    assert not isinstance(won, Exception), won
    assert not isinstance(skipped, Exception), skipped
    assert (won.skipped, won.rows) == (False, 50)  # type: ignore[union-attr]
    assert (skipped.skipped, skipped.reason) == (True, "replay")  # type: ignore[union-attr]
    counts = Counter(v for _k, v in read_topic(broker.bootstrap, "out"))
    assert len(counts) == 50 and set(counts.values()) == {1}


def _arrow(values: list[bytes]) -> Any:
    import pyarrow as pa

    return ArrowRecords([pa.RecordBatch.from_pydict({"value": pa.array(values, pa.binary())})])


def test_a_replay_with_as_many_rows_but_other_records_fails(broker: BrokerProcess) -> None:
    """Batch 0 (a-0..99) is committed but not in Spark's commit log; the input lost its tail and
    was refilled, so the replay reads a-0..49 and c-0..49: the committed row count, other records.
    Skipping it lost c-0..49 (probe s37 s4, even under failOnDataLoss=true); now the progress record
    holds a digest of the rows and the replay fails, naming the batch, counts and digests. A replay
    of the same rows in another order (a shuffle's) is a replay, whichever form the rows come in."""
    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, Guarantee.exactly_once)
    first = [b"a-%d" % i for i in range(100)]
    assert not write_partition(_arrow(first), TaskIdentity("q-tail", 0, 0), s).skipped
    shuffled = [(None, v, None, None, None) for v in reversed(first)]
    again = write_partition(shuffled, TaskIdentity("q-tail", 0, 0), s)
    assert again.skipped and again.reason == "replay"
    refilled = first[:50] + [b"c-%d" % i for i in range(50)]
    with pytest.raises(RuntimeError, match=r"batch 0 was committed with 100 rows \(digest [0-9a-f]{16}\) but its "
                                           r"replay has 100 rows \(digest [0-9a-f]{16}\): as many rows, other"):
        write_partition(_arrow(refilled), TaskIdentity("q-tail", 0, 0), s)
    assert sorted(v for _k, v in read_topic(bs, "out")) == sorted(first)


def test_a_replay_checked_against_a_record_without_a_digest_compares_row_counts(broker: BrokerProcess) -> None:
    """A progress record written before digests existed (``{"batch_id", "rows", "parts"}``) is read
    as before: a replay with its row count is skipped, one with another count fails."""
    from confluent_kafka import Producer

    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, Guarantee.exactly_once)
    key = progress_key(s.sink_id("q-old"), 0)
    p = Producer({"bootstrap.servers": bs})
    p.produce("progress", key=key.encode(), value=b'{"batch_id":0,"rows":3,"parts":4}', partition=0)
    assert p.flush(10) == 0
    assert write_partition(_records("other", 3), TaskIdentity("q-old", 0, 0), s).skipped
    with pytest.raises(RuntimeError, match="committed with 3 rows but its replay has 2 rows"):
        write_partition(_records("other", 2), TaskIdentity("q-old", 0, 0), s)
    assert read_topic(bs, "out") == []


def test_a_replay_with_fewer_rows_is_skipped_only_when_an_input_topic_is_compacted(
        broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    """The cleaner removed records of a committed batch's range before its replay (probe s37 s6:
    300 rows committed, 40 left): Spark treats that as normal. With an input topic known compacted
    the replay is skipped with a warning and the committed output stands; without, fewer rows may
    be records lost and replaced by others, and the replay fails as before. More rows always fail."""
    import logging

    bs = broker.bootstrap
    create_topic(bs, "out", 1)
    s = _settings(bs, Guarantee.exactly_once)
    first = [b"v-%d" % i for i in range(300)]
    assert not write_partition(_arrow(first), TaskIdentity("q-compact", 1, 0), s).skipped
    survivors = first[-40:]
    with pytest.raises(RuntimeError, match=r"committed with 300 rows .* replay has 40 rows .*: fewer rows"):
        write_partition(_arrow(survivors), TaskIdentity("q-compact", 1, 0), s)
    compacted = dataclasses.replace(s, compacted_inputs=("A6",))
    with caplog.at_level(logging.WARNING, logger="oncelog.spark"):
        skipped = write_partition(_arrow(survivors), TaskIdentity("q-compact", 1, 0), compacted)
    assert skipped.skipped and skipped.reason == "replay"
    assert "input topic(s) A6 are compacted" in caplog.text
    with pytest.raises(RuntimeError, match=r"replay has 301 rows .*: more rows"):
        write_partition(_arrow([*first, b"extra"]), TaskIdentity("q-compact", 1, 0), compacted)
    assert not write_partition(_arrow([b"next"]), TaskIdentity("q-compact", 2, 0), compacted).skipped
    assert Counter(v for _k, v in read_topic(bs, "out")) == Counter([*first, b"next"])


def _offset_log(checkpoint: Any, batch: int, *sources: str) -> None:
    offsets = checkpoint / "offsets"
    offsets.mkdir(parents=True, exist_ok=True)
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{"spark.sql.shuffle.partitions":"2"}}'
    (offsets / str(batch)).write_text("\n".join(["v1", meta, *sources]))


def test_the_driver_finds_the_compacted_input_topics_in_the_checkpoints_offset_log(
        broker: BrokerProcess, tmp_path: Any) -> None:
    """compacted_inputs reads the topics of the offset log's newest entry (or a given batch's) in a
    local checkpoint and asks the sink's cluster for their cleanup.policy; a checkpoint it cannot
    read, or topics it cannot find, give no evidence. The format sink's writer ships the answer to
    its tasks."""
    from oncelog.spark import sink
    from oncelog.spark.foreach_batch import kafka_foreach_batch
    from oncelog.spark.sink import KafkaStreamWriter, compacted_inputs

    bs = broker.bootstrap
    client = {"bootstrap.servers": bs}
    create_topic(bs, "in-compact", 2, {"cleanup.policy": "compact"})
    create_topic(bs, "in-both", 1, {"cleanup.policy": "compact,delete"})
    create_topic(bs, "in-plain", 1)
    ck = tmp_path / "ck"
    _offset_log(ck, 0, '{"in-plain":{"0":5}}')
    _offset_log(ck, 1, '{"in-plain":{"0":9},"in-compact":{"0":3,"1":4}}', "17", '{"logOffset":2}',
                '{"in-both":{"0":1},"absent":{"0":2}}')
    sink._COMPACTED.clear()
    assert compacted_inputs(str(ck), client, 10) == ("in-both", "in-compact")
    assert compacted_inputs(f"file://{ck}", client, 10, batch_id=1) == ("in-both", "in-compact")
    assert compacted_inputs(str(ck), client, 10, batch_id=0) == ()
    assert compacted_inputs(f"hdfs://namenode{ck}", client, 10) == ()
    assert compacted_inputs(str(tmp_path / "none"), client, 10) == ()
    assert compacted_inputs(None, client, 10) == ()
    options = {"kafka.bootstrap.servers": bs, "topic": "out", "progress.topic": "progress-ck",
               "checkpointLocation": str(ck)}
    assert KafkaStreamWriter(options).settings.compacted_inputs == ("in-both", "in-compact")
    assert KafkaStreamWriter({**options, "processing.guarantee": "at_least_once"}).settings.compacted_inputs == ()
    fn = kafka_foreach_batch(bs, "out", "q-fb",
                             options={"progress.topic": "progress-ck", "checkpointLocation": str(ck)})
    assert fn.batch_settings(1).compacted_inputs == ("in-both", "in-compact")
    assert fn.batch_settings(0).compacted_inputs == ()
    sink._COMPACTED.clear()


def test_the_spools_digest_does_not_depend_on_the_rows_form_or_order() -> None:
    """The digest a replay is compared by: the same for rows and Arrow batches (binary or string
    columns, however split into batches), for any order of the rows; null counts as empty. Rows
    that trade equal-length pieces (whose CRCs have equal XORs) still differ."""
    import pyarrow as pa

    from oncelog.spark.sink import Spool

    def digest(*parts: Any) -> int:
        spool = Spool()
        for part in parts:
            spool.add(part)
        return spool.digest

    rows = [(b"k1", b"v1", None, None, None), (None, b"v2", None, None, None), (b"k3", None, None, None, None)]
    arrow = ArrowRecords([
        pa.RecordBatch.from_pydict({"key": pa.array([b"k1", None]), "value": pa.array([b"v1", b"v2"])}),
        pa.RecordBatch.from_pydict({"key": pa.array([b"k3"]), "value": pa.array([None], pa.binary())})])
    strings = ArrowRecords([pa.RecordBatch.from_pydict({"key": pa.array(["k3", "k1", None], pa.large_string()),
                                                        "value": pa.array([None, "v1", "v2"])})])
    assert digest(rows) == digest(list(reversed(rows))) == digest(arrow) == digest(strings)
    assert digest(rows[:1], rows[1:]) == digest(rows)
    assert digest(_arrow([b"x"])) == digest([(None, b"x", None, None, None)])
    assert digest(_records("a", 2)) != digest(_records("a", 3)) and digest([]) == 0
    swapped = [(None, b"a-2", None, None, None), (None, b"b-1", None, None, None)]
    assert digest([(None, b"a-1", None, None, None), (None, b"b-2", None, None, None)]) != digest(swapped)
    assert digest([(b"k", b"v", None, None, None)]) != digest([(b"v", b"k", None, None, None)])


def test_records_that_fail_delivery_are_named_in_the_tasks_error(tmp_path: Any) -> None:
    """librdkafka fails the transaction with "N message(s) failed delivery (see individual delivery
    reports)"; the sink kept no report, so the task's error named neither topic nor cause (probe
    s37 s5a: the output topic deleted under the query). Now the transactional producer collects
    them and the error says which topic and why, with the same KafkaError code."""
    from confluent_kafka import KafkaException

    from oncelog.testing.broker_process import oncelog_broker

    with oncelog_broker(tmp_path / "data", log_path=tmp_path / "broker.log").start() as b:  # no auto-create
        s = SinkSettings(client={"bootstrap.servers": b.bootstrap, "message.timeout.ms": 5000,
                                 "topic.metadata.propagation.max.ms": 500},
                         guarantee=Guarantee.exactly_once, topic=None, progress_topic="progress",
                         progress_partitions=1, timeout_s=30)
        s.progress().ensure_topic()
        rows = [(None, b"x%d" % i, "gone", None, None) for i in range(5)]
        with pytest.raises(KafkaException, match=r"5 message\(s\) failed delivery .*; delivery reports: gone: Broker: "
                                                 r"Unknown topic or partition \(5 records\)"):
            write_partition(rows, TaskIdentity("q-gone", 0, 0), s)
        create_topic(b.bootstrap, "gone", 1)
        assert write_partition(rows, TaskIdentity("q-gone", 0, 0), s).rows == 5  # nothing of the first attempt
        assert sorted(v for _k, v in read_topic(b.bootstrap, "gone")) == [r[1] for r in rows]


@pytest.mark.parametrize(("rows", "digest"), [(100, 2), (60, 1), (140, 1)], ids=["same-count", "fewer", "more"])
def test_fail_on_changed_replay_false_skips_a_replay_that_is_not_the_same_data(
        rows: int, digest: int, caplog: pytest.LogCaptureFixture) -> None:
    """A query that is not deterministic (uuid()) replays other rows for a committed batch: by default
    the task fails, and it failed at every restart; failOnChangedReplay=false skips such a replay with
    a warning, the batch's committed output standing."""
    from oncelog.spark import sink

    last = Committed(7, 100, 1)
    ident = TaskIdentity("q-nd", 7, 0)
    strict = SinkSettings.from_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "out"})
    with pytest.raises(RuntimeError, match="failOnChangedReplay=false"):
        sink._check_replay(last, ident, rows, strict, digest)
    lenient = SinkSettings.from_options({"kafka.bootstrap.servers": "127.0.0.1:1", "topic": "out",
                                         "failOnChangedReplay": "false"})
    with caplog.at_level("WARNING", logger=sink.log.name):
        assert sink._check_replay(last, ident, rows, lenient, digest) == "replay"
    assert "failOnChangedReplay=false" in caplog.text
    assert sink._check_replay(last, ident, 100, strict, 1) == "replay"  # the same data: a replay either way

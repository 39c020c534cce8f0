"""The outcome a role records for a transaction whose commit or abort failed, with fake clients.

A transaction whose client never asked to commit is aborted, whatever became of its abort: recorded
as "unknown", the checker inferred it committed as soon as one of its values was read, so a broker
that made such a transaction visible passed (probe s36, repro_abort_unknown.py)."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from oncelog.verify.checker import check
from oncelog.verify.history import History, Poll, Send, Txn
from oncelog.verify.roles import Controls, Recorder, RoleSpec, RunSpec, Stuck, _Copier, _finish

FENCED = KafkaException(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
ABORTABLE = KafkaException(KafkaError(KafkaError._STATE, "must abort", txn_requires_abort=True))
OTHER = KafkaException(KafkaError(KafkaError._INVALID_ARG, "no"))


class FakeProducer:
    def __init__(self, commit: BaseException | None = None, abort: BaseException | None = None,
                 send_offsets: BaseException | None = None) -> None:
        self.commit, self.abort, self.send_offsets = commit, abort, send_offsets
        self.calls: list[str] = []

    def _call(self, name: str, error: BaseException | None) -> None:
        self.calls.append(name)
        if error is not None:
            raise error

    def commit_transaction(self, _timeout: float) -> None:
        self._call("commit", self.commit)

    def abort_transaction(self, _timeout: float) -> None:
        self._call("abort", self.abort)

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, *_args: Any, **_kwargs: Any) -> None:
        self.calls.append("produce")

    def flush(self, _timeout: float) -> int:
        return 0

    def send_offsets_to_transaction(self, *_args: Any) -> None:
        self._call("send_offsets", self.send_offsets)


@pytest.mark.parametrize(("producer", "abort", "expected"), [
    (FakeProducer(), False, ("committed", True)),
    (FakeProducer(), True, ("aborted", True)),
    (FakeProducer(abort=FENCED), True, ("aborted", False)),  # was "unknown"
    (FakeProducer(abort=OTHER), True, ("aborted", False)),  # was "unknown"
    (FakeProducer(abort=Stuck("no answer")), True, ("aborted", False)),  # was "unknown"
    (FakeProducer(commit=FENCED), False, ("unknown", False)),  # the EndTxn may have arrived
    (FakeProducer(commit=Stuck("no answer")), False, ("unknown", False)),
    (FakeProducer(commit=ABORTABLE), False, ("aborted", True)),
    (FakeProducer(commit=ABORTABLE, abort=FENCED), False, ("unknown", False)),  # a commit was requested
])
def test_finish_records_aborted_when_no_commit_was_requested(producer: FakeProducer, abort: bool,
                                                             expected: tuple[str, bool]) -> None:
    assert _finish(producer, abort) == expected  # type: ignore[arg-type]


class Counters(list[int]):
    def get_lock(self) -> threading.Lock:
        return threading.Lock()


class FakeMessage:
    def __init__(self, partition: int, offset: int, value: str) -> None:
        self._p, self._o, self._v = partition, offset, value

    def error(self) -> None:
        return None

    def value(self) -> bytes:
        return self._v.encode()

    def partition(self) -> int:
        return self._p

    def offset(self) -> int:
        return self._o


class FakeConsumer:
    def consume(self, _n: int, _timeout: float) -> list[FakeMessage]:
        return [FakeMessage(0, 0, "p0-1-0")]

    def position(self, tps: list[Any]) -> list[Any]:
        for tp in tps:
            tp.offset = 1
        return tps

    def consumer_group_metadata(self) -> object:
        return object()

    def seek(self, tp: Any) -> None:
        self.sought = (tp.partition, tp.offset)

    def committed(self, tps: list[Any], _timeout: float) -> list[Any]:
        return self.position(tps)


def copier_with(producer: FakeProducer, tmp_path: Path) -> tuple[_Copier, list[int]]:
    spec = RunSpec("127.0.0.1:1", "t", 1, True, 0.0, str(tmp_path), "v", 3)
    ctl = Controls(stop_writes=threading.Event(), stop_all=threading.Event(), commands={}, done={},
                   counters=Counters([0] * 5))
    copier = _Copier.__new__(_Copier)
    copier.spec, copier.role, copier.ctl, copier.name = spec, RoleSpec("copier", 0), ctl, "x0"
    copier.rec = Recorder(tmp_path / "x0.jsonl", 0.0, ctl.counters)
    copier.rng, copier.session, copier.pending_assign, copier.expected = random.Random(1), 0, set(), {}
    copier.consumer = FakeConsumer()  # type: ignore[assignment]
    copier.producer = producer  # type: ignore[assignment]
    restarts: list[int] = []
    copier.restart = lambda: restarts.append(1)  # type: ignore[method-assign]
    return copier, restarts


def recorded_txns(copier: _Copier, tmp_path: Path) -> list[dict[str, Any]]:
    copier.rec.close()
    lines = (tmp_path / "x0.jsonl").read_text().splitlines()
    return [d for d in map(json.loads, lines) if d["type"] == "txn"]


def test_a_copier_whose_send_offsets_hangs_records_its_transaction_aborted(tmp_path: Path) -> None:
    """send_offsets_to_transaction got no answer (the watchdog gave up): no commit was requested, so
    the transaction is aborted (the replacement's InitProducerId aborts it); it was recorded unknown."""
    copier, restarts = copier_with(FakeProducer(send_offsets=Stuck("no answer")), tmp_path)
    assert copier.step(1)
    txns = recorded_txns(copier, tmp_path)
    assert [t["outcome"] for t in txns] == ["aborted"] and restarts == [1]
    assert txns[0]["rewound"] == {} and txns[0]["rewind_session"] == ""  # restarted, not sought back


def test_a_copier_that_aborts_records_where_it_sought_its_consumer_back(tmp_path: Path) -> None:
    copier, restarts = copier_with(FakeProducer(commit=ABORTABLE), tmp_path)
    assert copier.step(1)
    txns = recorded_txns(copier, tmp_path)
    assert [t["outcome"] for t in txns] == ["aborted"] and restarts == []
    assert txns[0]["rewound"] == {"0": 0} and txns[0]["rewind_session"] == "x0.1" == copier.session_key
    assert copier.consumer.sought == (0, 0)  # type: ignore[attr-defined]


def test_an_aborted_transaction_made_visible_is_an_aborted_read() -> None:
    """What the recorded outcome buys: the same broker behaviour (the transaction whose abort was
    fenced is visible) is an aborted read when recorded aborted, and passed when recorded unknown."""
    def history(outcome: str) -> History:
        h = History()
        h.sends = [Send("p0", 1, "p0-1-0", 0, 0, True, 1), Send("p0", 1, "p0-1-1", 1, 0, True, 2)]
        h.txns = [Txn("p0", 1, outcome, 5, 9, ["p0-1-0", "p0-1-1"])]
        h.polls = [Poll("c0", 20, [(0, 0, "p0-1-0"), (1, 0, "p0-1-1")]),
                   Poll("final", 30, [(0, 0, "p0-1-0"), (1, 0, "p0-1-1")], final=True)]
        return h

    assert check(history("unknown")).ok
    assert check(history("aborted")).counts()["aborted-read"] == 4


def test_a_copier_whose_position_went_back_by_itself_copies_nothing_and_seeks_again(tmp_path: Path) -> None:
    """librdkafka 2.16 can undo a seek (an out-of-date offset lookup arms a timer that moves an
    active partition back to auto.offset.reset's offset, 500 ms later): the copier read from 0 after
    seeking to 304 and copied its input twice (probe s36, a verify run under broker kills). A read
    that starts below where the copier knows the partition stands is dropped and sought again."""
    copier, restarts = copier_with(FakeProducer(), tmp_path)
    copier.expected = {0: 5}
    assert not copier.step(1)  # FakeConsumer reads offset 0
    assert copier.consumer.sought == (0, 5)  # type: ignore[attr-defined]
    copier.rec.close()
    assert (tmp_path / "x0.jsonl").read_text() == ""  # no poll, no transaction
    copier.rec = Recorder(tmp_path / "x1.jsonl", 0.0, copier.ctl.counters)
    copier.expected = {0: 0}  # where it stands: the read goes on, and a commit moves it on
    assert copier.step(2) and copier.expected == {0: 1} and restarts == []

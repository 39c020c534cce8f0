"""CreateTopics builds a topic's directories and files off the event loop (``create_topic_off_loop``).

Invariants, on an in-process broker whose fsyncs can be held:
- while a topic's partitions are being built, the loop serves other clients and never fsyncs
  for the new topic itself;
- the name is taken meanwhile (a second CreateTopics: TOPIC_ALREADY_EXISTS) but not visible: a
  produce that would auto-create it gets the retriable LEADER_NOT_AVAILABLE and creates nothing;
- a requester that hangs up does not stop the creation halfway; the topic is whole afterwards
  and after a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from oncelog.storage import fileio
from tests.fsync_gate import FsyncGate, path_of
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

API_CREATE_TOPICS = 19
BIG = "big_t"
PARTITIONS = 12


@pytest.fixture
def fs(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FsyncGate, list[str]]]:
    gate = FsyncGate()
    on_loop: list[str] = []
    held = fileio.fs.fsync

    def watched(fd: int) -> None:
        if asyncio._get_running_loop() is not None and f"/{BIG}-" in path_of(fd):
            on_loop.append(path_of(fd))
        held(fd)

    monkeypatch.setattr(fileio.fs, "fsync", watched)
    yield gate, on_loop
    gate.release()
    monkeypatch.undo()
    gate.close()


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "data")
    broker.create_topic("other", 1)
    yield broker
    broker.close()


def _create(name: str, partitions: int) -> dict[str, Any]:
    return {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1, "assignments": [],
                        "configs": []}], "timeout": 30_000, "validate_only": False}


def test_a_topic_is_built_off_the_loop_its_name_taken_but_not_visible(
        b: InProcessBroker, fs: tuple[FsyncGate, list[str]]) -> None:
    gate, on_loop = fs
    gate.hold(f"/{BIG}-")
    started = b.start(API_CREATE_TOPICS, 7, _create(BIG, PARTITIONS))
    b.run_until(gate.reached.is_set)  # a partition directory's fsync, on the worker thread
    assert not started.task.done()
    assert b.produce("other", 0, batch(value=b"meanwhile")) == 0  # the loop serves others
    assert b.visible_values("other", 0) == [b"meanwhile"]
    again = b.call(API_CREATE_TOPICS, 7, _create(BIG, 3))
    assert again.topics[0].error_code == ErrorCode.topic_already_exists
    clash = b.call(API_CREATE_TOPICS, 7, _create("big.t", 1))  # collides with it ('.' vs '_')
    assert clash.topics[0].error_code == ErrorCode.invalid_topic_exception
    # a produce that would auto-create it: retriable, and it creates nothing
    assert b.produce(BIG, 0, batch(value=b"early")) == ErrorCode.leader_not_available.value
    assert BIG not in b.broker.logs.topics()
    gate.release()
    r = b.finish(started)
    assert r.topics[0].error_code == 0 and r.topics[0].num_partitions == PARTITIONS
    assert on_loop == [], "the loop's thread fsynced for the new topic"
    for p in range(PARTITIONS):
        assert b.produce(BIG, p, batch(value=b"v%d" % p)) == 0
    b.restart()
    assert b.broker.logs.topics()[BIG].num_partitions == PARTITIONS
    assert b.visible_values(BIG, PARTITIONS - 1) == [b"v%d" % (PARTITIONS - 1)]


def test_a_requester_hanging_up_does_not_stop_the_creation(b: InProcessBroker,
                                                          fs: tuple[FsyncGate, list[str]]) -> None:
    gate, _ = fs
    gate.hold(f"/{BIG}-")
    started = b.start(API_CREATE_TOPICS, 7, _create(BIG, PARTITIONS))
    b.run_until(gate.reached.is_set)
    started.task.cancel()  # what the connection does when its client disconnects
    gate.release()
    b.run_until(lambda: BIG in b.broker.logs.topics())
    assert not b.broker.logs.is_being_created(BIG)
    assert b.broker.logs.topics()[BIG].num_partitions == PARTITIONS
    assert b.produce(BIG, PARTITIONS - 1, batch(value=b"x")) == 0
    b.restart(clean=True)
    assert b.broker.logs.topics()[BIG].num_partitions == PARTITIONS

"""DeleteTopics removes a topic's files off the event loop (``handlers.admin._remove_topics``). On the loop,
a 1,000-partition topic's deletion held every client for 1.3 s (an rmtree and a data-directory fsync
per partition; found by an adversarial probe pinging the broker during a deletion).

Invariants, on an in-process broker whose file removal can be held:
- while the files go, the loop serves other clients and removes nothing itself;
- the name is taken meanwhile: a CreateTopics answers TOPIC_ALREADY_EXISTS and a produce the
  retriable LEADER_NOT_AVAILABLE, so a topic made again under the name never loses files to the
  deletion; once answered, the name is free and a new topic of that name starts empty;
- a requester that hangs up does not leave the name taken, nor files behind.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from kio.schema.errors import ErrorCode

from oncelog.storage import fileio
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

API_CREATE_TOPICS, API_DELETE_TOPICS = 19, 20
BIG = "big_t"
PARTITIONS = 8


class _HeldRemoval:
    def __init__(self) -> None:
        self.reached = threading.Event()
        self.go = threading.Event()
        self.on_loop: list[str] = []


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[_HeldRemoval]:
    h = _HeldRemoval()
    rmtree = fileio.fs.rmtree

    def watched(path: Path) -> None:
        if f"/{BIG}-" in str(path):
            if asyncio._get_running_loop() is not None:
                h.on_loop.append(str(path))
            h.reached.set()
            h.go.wait(5)  # a removal on the loop (the fault this guards against) waits out, then fails
        rmtree(path)

    monkeypatch.setattr(fileio.fs, "rmtree", watched)
    yield h
    h.go.set()


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "data")
    broker.create_topic("other", 1)
    broker.create_topic(BIG, PARTITIONS)
    for p in range(PARTITIONS):
        assert broker.produce(BIG, p, batch(value=b"old%d" % p)) == 0
    yield broker
    broker.close()


def _create(name: str) -> dict:
    return {"topics": [{"name": name, "num_partitions": 2, "replication_factor": 1, "assignments": [],
                        "configs": []}], "timeout": 30_000, "validate_only": False}


def test_a_topics_files_are_removed_off_the_loop_its_name_taken_meanwhile(
        b: InProcessBroker, held: _HeldRemoval, tmp_path: Path) -> None:
    started = b.start(API_DELETE_TOPICS, 5, {"topic_names": [BIG], "timeout_ms": 30_000})
    b.run_until(held.reached.is_set)  # a partition directory's removal, on a worker thread
    assert not started.task.done()
    assert BIG not in b.broker.logs.topics()
    assert b.produce("other", 0, batch(value=b"meanwhile")) == 0  # the loop serves others
    assert b.visible_values("other", 0) == [b"meanwhile"]
    again = b.call(API_CREATE_TOPICS, 7, _create(BIG))
    assert again.topics[0].error_code == ErrorCode.topic_already_exists
    assert b.produce(BIG, 0, batch(value=b"early")) == ErrorCode.leader_not_available.value
    held.go.set()
    r = b.finish(started)
    assert [e.error_code for e in r.responses] == [ErrorCode.none]
    assert held.on_loop == [], "the loop's thread removed the topic's files"
    assert not any(d.name.startswith(f"{BIG}-") for d in (tmp_path / "data").iterdir())
    created = b.call(API_CREATE_TOPICS, 7, _create(BIG))  # the name is free again, and the topic new
    assert created.topics[0].error_code == ErrorCode.none
    assert b.visible_values(BIG, 0) == []
    b.restart()
    assert b.broker.logs.topics()[BIG].num_partitions == 2 and b.visible_values(BIG, 1) == []


def test_a_requester_hanging_up_does_not_stop_the_removal(b: InProcessBroker, held: _HeldRemoval,
                                                         tmp_path: Path) -> None:
    started = b.start(API_DELETE_TOPICS, 5, {"topic_names": [BIG], "timeout_ms": 30_000})
    b.run_until(held.reached.is_set)
    started.task.cancel()  # what the connection does when its client disconnects
    held.go.set()
    b.run_until(lambda: not b.broker.logs.is_being_created(BIG))
    assert BIG not in b.broker.logs.topics()
    assert not any(d.name.startswith(f"{BIG}-") for d in (tmp_path / "data").iterdir())


def test_an_answer_dropped_unawaited_does_not_stop_the_removal(b: InProcessBroker, tmp_path: Path) -> None:
    """The connection of a client gone closes an answer it never awaited (``_Pending.discard``). The
    topic was detached by then, so the removal must not live in that answer: it used to, and the
    name stayed taken (every CreateTopics of it TOPIC_ALREADY_EXISTS) until a restart."""
    from oncelog.protocol.messages import build, decode_request, encode_request, request_type

    frame = encode_request(API_DELETE_TOPICS, 5, 1, build(request_type(API_DELETE_TOPICS, 5),
                                                            {"topic_names": [BIG], "timeout_ms": 30_000}))
    request = decode_request(frame[4:], b.broker.supported_versions)

    async def dropped() -> None:
        answer = b.broker.handlers[API_DELETE_TOPICS](b.broker, request)
        answer.close()

    b.loop.run_until_complete(dropped())
    b.run_until(lambda: not b.broker.logs.is_being_created(BIG))
    assert BIG not in b.broker.logs.topics()
    assert not any(d.name.startswith(f"{BIG}-") for d in (tmp_path / "data").iterdir())
    assert b.call(API_CREATE_TOPICS, 7, _create(BIG)).topics[0].error_code == ErrorCode.none


def test_a_flush_not_started_is_cancelled_and_a_running_one_is_waited_for_before_the_removal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deletion never fsyncs for a log about to go (a flush planned and not started never
    runs), and never removes files a running flush still writes (its snapshot could land in a new
    topic's directory of the same name): it waits for that flush, off the loop. Waiting on the loop,
    partition after partition, chased the flush thread through its pass: a 1,000-partition deletion
    held every client 1.8-2.1 s (0.02-0.04 s now)."""
    from oncelog.clock import ManualClock
    from oncelog.storage.config import LogConfig
    from oncelog.storage.log_manager import LogManager

    logs = LogManager(tmp_path, LogConfig(), ManualClock())
    logs.create_topic(BIG, 2, {})
    jobs = []
    for p in range(2):
        plog = logs.get_partition(BIG, p)
        assert plog is not None
        plog.append(batch(value=b"v"))
        job = plog.begin_flush(force=True)
        assert job is not None
        jobs.append(job)
    running, idle = jobs
    in_fsync, go = threading.Event(), threading.Event()
    fsync = fileio.fs.fsync

    def held_fsync(fd: int) -> None:
        if threading.current_thread().name == "flush":
            in_fsync.set()
            go.wait(10)
        fsync(fd)

    monkeypatch.setattr(fileio.fs, "fsync", held_fsync)
    flusher = threading.Thread(target=running.run, name="flush")
    flusher.start()
    assert in_fsync.wait(10)
    detached = logs.detach_topic(BIG)
    assert idle.done.is_set() and not running.done.is_set()
    assert detached.flushes == [running]
    idle.run()  # a flush thread reaching the cancelled job later: it does nothing
    remover = threading.Thread(target=logs.remove_topic_files, args=(detached,))
    remover.start()
    remover.join(0.3)
    assert remover.is_alive() and all(d.exists() for d in detached.directories)  # waits for the running flush
    go.set()
    remover.join(10)
    flusher.join(10)
    assert not any(d.exists() for d in detached.directories)
    logs.release_topic(BIG)
    logs.close()

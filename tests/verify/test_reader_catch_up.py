"""A verify reader asked to stop reads on to the end of its partitions first: a reader that joined its
group late (under faults, on a loaded machine) must not stop having checked nothing. The CI run of
2026-11-26 saw the group reader ``c1`` of a 12 s run leave no poll at all."""

from __future__ import annotations

import json
import multiprocessing as mp
import threading
from pathlib import Path

from oncelog.demo.faults import produce_transactions
from oncelog.testing.broker_process import BrokerProcess, create_topic
from oncelog.verify.history import parse_line
from oncelog.verify.roles import Controls, Recorder, RoleSpec, RunSpec, reader_loop

PARTITIONS = 3


def _read_after_stop(broker: BrokerProcess, tmp_path: Path, index: int) -> list[tuple[int, int, str]]:
    topic = f"catch-up-{index}"
    create_topic(broker.bootstrap, topic, PARTITIONS)
    # in transactions, every third one aborted first: the end a reader must reach is the last
    # stable offset, past commit and abort markers, and no aborted value may be read
    produce_transactions(broker.bootstrap, topic, [(b"k", b"v%d" % i) for i in range(60)], per_txn=10,
                         abort_every=3, partitions=PARTITIONS)
    ctx = mp.get_context("spawn")
    ctl = Controls(stop_writes=ctx.Event(), stop_all=ctx.Event(), commands={}, done={},
                   counters=ctx.Array("q", 3))
    ctl.stop_all.set()  # asked to stop before it has read anything: it must still read to the end
    spec = RunSpec(broker.bootstrap, topic, 1, True, 0.0, str(tmp_path), f"cu{index}", PARTITIONS)
    rec = Recorder(tmp_path / "reader.jsonl", 0.0, ctl.counters)
    done = threading.Event()
    t = threading.Thread(target=lambda: (reader_loop(spec, RoleSpec("reader", index), ctl, rec), done.set()))
    t.start()
    t.join(60)
    rec.close()
    assert done.is_set(), "the reader did not stop within 60 s"
    lines = [parse_line(json.loads(line)) for line in (tmp_path / "reader.jsonl").read_text().splitlines()]
    assert {kind for kind, _item in lines} <= {"poll"}
    return sorted(r for _kind, poll in lines for r in poll.records)


def test_a_manually_assigned_reader_reads_everything_after_stop(broker: BrokerProcess, tmp_path: Path) -> None:
    records = _read_after_stop(broker, tmp_path, 0)
    assert sorted(v for _p, _o, v in records) == sorted(f"v{i}" for i in range(60))


def test_a_group_reader_joins_and_reads_everything_after_stop(broker: BrokerProcess, tmp_path: Path) -> None:
    records = _read_after_stop(broker, tmp_path, 1)
    assert sorted(v for _p, _o, v in records) == sorted(f"v{i}" for i in range(60))

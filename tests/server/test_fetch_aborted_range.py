"""A read_committed Fetch lists the aborted transactions its returned batches can belong to, and no
others: those whose range [first offset, marker] overlaps [fetch offset, last offset returned]
(Kafka's addAbortedTransactions bounds the lookup by the end of the data read). Listing every
aborted transaction up to the LSO made each small fetch near the start of a long log carry (and
look up) all of them. Consumers reading with small partition_max_bytes still see exactly the
committed records."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from oncelog.protocol import records as rb
from oncelog.storage.producer_state import AppendOrigin
from tests.inproc import API_FETCH, InProcessBroker, iter_batches
from tests.storage.helpers import batch, marker

PIDS = (11, 12, 13, 14)


def _build(b: InProcessBroker, seed: int) -> tuple[list[tuple[int, int, int]], list[bytes]]:
    """A random mix of transactions (committed, aborted, some spanning many others and segments)
    and plain records; returns the aborted ones as (producer id, first offset, marker offset) and
    the committed values in offset order."""
    rng = random.Random(seed)
    b.broker.logs.create_topic("t", 1, {"segment.bytes": "2000"})
    plog = b.broker.logs.get_partition("t", 0)
    assert plog is not None
    seq = dict.fromkeys(PIDS, 0)
    open_txn: dict[int, tuple[int, list[tuple[int, bytes]]]] = {}  # pid -> (first offset, its values)
    aborted: list[tuple[int, int, int]] = []
    committed: list[tuple[int, bytes]] = []
    for step in range(400):
        pid = rng.choice(PIDS)
        offset = plog.log_end_offset
        if pid in open_txn and rng.random() < (0.05 if pid == PIDS[0] else 0.3):
            first, values = open_txn.pop(pid)
            commit = rng.random() < 0.5
            plog.append(marker(commit, pid, 0), origin=AppendOrigin.COORDINATOR)
            if commit:
                committed.extend(values)
            else:
                aborted.append((pid, first, offset))
        elif rng.random() < 0.15:
            value = b"plain-%d" % step
            plog.append(batch(1, value=value))
            committed.append((offset, value))
        else:
            value = b"txn-%d-%d" % (pid, step)
            plog.append(batch(1, pid=pid, epoch=0, seq=seq[pid], txn=True, value=value))
            seq[pid] += 1
            open_txn.setdefault(pid, (offset, []))[1].append((offset, value))
    for pid, (first, _values) in open_txn.items():  # end them all: the LSO is the log end
        aborted.append((pid, first, plog.log_end_offset))
        plog.append(marker(False, pid, 0), origin=AppendOrigin.COORDINATOR)
    assert len(plog.segments) > 10
    return aborted, [v for _, v in sorted(committed)]


def _fetch(b: InProcessBroker, offset: int, partition_max_bytes: int) -> Any:
    r = b.call(API_FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 1,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "t", "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": offset, "last_fetched_epoch": -1,
            "log_start_offset": -1, "partition_max_bytes": partition_max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    part = r.responses[0].partitions[0]
    assert part.error_code == 0
    return part


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_aborted_list_is_the_returned_range_and_consumers_see_the_committed_records(
        tmp_path: Path, seed: int) -> None:
    b = InProcessBroker(tmp_path / "d")
    try:
        aborted, committed = _build(b, seed)
        plog = b.broker.logs.get_partition("t", 0)
        assert plog is not None
        end = plog.log_end_offset
        rng = random.Random(seed)
        # every offset once, with sizes from one small batch to a whole segment
        for offset in range(end):
            pmb = rng.choice([1, 100, 300, 1000, 4000])
            part = _fetch(b, offset, pmb)
            data = bytes(part.records or b"")
            if not data:
                assert part.aborted_transactions == []
                continue
            last = max(h.last_offset for _, h in rb.iter_headers(data))
            expected = sorted((pid, first) for pid, first, mark in aborted if mark >= offset and first <= last)
            got = sorted((a.producer_id, a.first_offset) for a in part.aborted_transactions)
            assert got == expected, (offset, pmb, last)

        # a consumer that drops aborted batches as librdkafka does, by each fetch's list
        for pmb in (1, 250, 700):
            offset, seen = 0, []
            while offset < end:
                part = _fetch(b, offset, pmb)
                data = bytes(part.records or b"")
                assert data, offset
                starts: dict[int, list[int]] = {}
                for a in sorted(part.aborted_transactions, key=lambda a: a.first_offset):
                    starts.setdefault(a.producer_id, []).append(a.first_offset)
                aborting: set[int] = set()
                for _base, header, values, control in iter_batches(data):
                    if header.last_offset < offset:
                        continue
                    pid = header.producer_id
                    while starts.get(pid) and starts[pid][0] <= header.base_offset:
                        starts[pid].pop(0)
                        aborting.add(pid)
                    if control is not None:
                        aborting.discard(pid)
                    elif not (header.is_transactional and pid in aborting):
                        seen.extend(values)
                    offset = header.last_offset + 1
            assert seen == committed, pmb
    finally:
        b.close()

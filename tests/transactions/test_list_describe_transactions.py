"""ListTransactions and DescribeTransactions answer as Kafka's TransactionStateManager and
TransactionCoordinator do (its testListTransactionsFiltering): a state filter naming only unknown
states matches nothing, the duration filter applies to every state but Dead (a completed transaction
keeps its start time, an id that never started one has -1), and an empty transactional id is an
INVALID_REQUEST. Driven in process with a manual clock, across a restart (the start time is in the
``__transaction_state`` record, so replay keeps it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from tests.inproc import InProcessBroker

LIST_TRANSACTIONS, DESCRIBE_TRANSACTIONS = 66, 65


@pytest.fixture
def b(tmp_path: Path) -> Iterator[InProcessBroker]:
    broker = InProcessBroker(tmp_path / "d")
    broker.create_topic("t")
    yield broker
    broker.close()


def _listed(b: InProcessBroker, states: list[str], duration_ms: int = -1) -> tuple[list[str], list[str]]:
    r = b.call(LIST_TRANSACTIONS, 1, {"state_filters": states, "producer_id_filters": [],
                                      "duration_filter": duration_ms})
    assert r.error_code == ErrorCode.none
    return sorted(t.transactional_id for t in r.transaction_states), list(r.unknown_state_filters)


def _described(b: InProcessBroker, *ids: str) -> list[Any]:
    return list(b.call(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": list(ids)}).transaction_states)


def _start_ms(state: Any) -> int:
    return int(state.transaction_start_time.timestamp() * 1000)


def _three_ids(b: InProcessBroker) -> int:
    """'done' (a committed transaction, started at the returned time), 'open' (Ongoing, started
    1 s later) and 'idle' (Empty: never started one). The clock ends 1 s after 'open' started."""
    _, pid, epoch = b.init_producer_id("done")
    started = b.clock.now_ms()
    assert b.add_partitions("done", pid, epoch, [("t", 0)]) == {("t", 0): 0}
    assert b.end_txn("done", pid, epoch, commit=True) == 0
    b.clock.advance(1000)
    _, pid, epoch = b.init_producer_id("open")
    assert b.add_partitions("open", pid, epoch, [("t", 0)]) == {("t", 0): 0}
    b.init_producer_id("idle")
    b.clock.advance(1000)
    return started


def test_a_state_filter_of_unknown_names_only_lists_nothing(b: InProcessBroker) -> None:
    _three_ids(b)
    assert _listed(b, []) == (["done", "idle", "open"], [])
    assert _listed(b, ["Ongoing"]) == (["open"], [])
    assert _listed(b, ["ongoing"]) == ([], ["ongoing"])
    assert _listed(b, ["Bogus", "Bogus"]) == ([], ["Bogus"])
    assert _listed(b, ["Bogus", "CompleteCommit"]) == (["done"], ["Bogus"])


def test_the_duration_filter_applies_to_every_state_and_survives_a_restart(b: InProcessBroker) -> None:
    started = _three_ids(b)
    [done] = _described(b, "done")
    assert done.transaction_state == "CompleteCommit" and _start_ms(done) == started
    for restart in (False, True):
        if restart:
            b.restart(clean=True)
            assert _start_ms(_described(b, "done")[0]) == started
        # 'done' started 2000 ms ago, 'open' 1000 ms ago, 'idle' at -1
        assert _listed(b, [], 1999) == (["done", "idle"], [])
        assert _listed(b, [], 1000) == (["done", "idle"], [])  # Kafka keeps only those older than it
        assert _listed(b, [], 999) == (["done", "idle", "open"], [])
        assert _listed(b, [], 2000) == (["idle"], [])
        assert _listed(b, ["Ongoing"], 999) == (["open"], [])


def test_the_next_transaction_and_a_new_producer_reset_the_start_time(b: InProcessBroker) -> None:
    _, pid, epoch = b.init_producer_id("x")
    assert b.add_partitions("x", pid, epoch, [("t", 0)]) == {("t", 0): 0}
    assert b.end_txn("x", pid, epoch, commit=False) == 0
    b.clock.advance(500)
    assert b.add_partitions("x", pid, epoch, [("t", 0)]) == {("t", 0): 0}
    assert _start_ms(_described(b, "x")[0]) == b.clock.now_ms()
    assert b.end_txn("x", pid, epoch, commit=True) == 0
    b.init_producer_id("x", pid, epoch)
    [x] = _described(b, "x")
    assert x.transaction_state == "Empty" and _start_ms(x) == 0  # -1, sent as the epoch


def test_describing_the_empty_id_is_an_invalid_request(b: InProcessBroker) -> None:
    _three_ids(b)
    codes = [(s.transactional_id, s.error_code) for s in _described(b, "", "nope", "open")]
    assert codes == [("", ErrorCode.invalid_request), ("nope", ErrorCode.transactional_id_not_found),
                     ("open", ErrorCode.none)]

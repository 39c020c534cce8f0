"""The fault schedule without a broker: which faults a configuration can make, that a fault is
recorded only when it happened, and that broker kills leave the roles room to work (fakes stand in
for the proxy and the broker)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from oncelog.verify.proxy import API_PRODUCE, ProxyStats
from oncelog.verify.roles import COPIER_COMMITS, COUNTERS, PRODUCER_COMMITS, Controls
from oncelog.verify.workload import (
    ALL_FAULTS,
    BrokerControl,
    Workload,
    WorkloadError,
    default_faults,
    unrunnable_faults,
)


class FakeProxy:
    """Drops ``drops`` responses of each armed rule's api (0: the rule never meets a response)."""

    def __init__(self, drops: int = 1) -> None:
        self.stats = ProxyStats()
        self.drops = drops
        self.armed: list[int] = []

    def drop_responses(self, api_key: int, count: int, *, probability: float = 1.0, reset: bool = True) -> None:
        self.armed.append(api_key)
        self.stats.dropped_by_api[api_key] = self.stats.dropped_by_api.get(api_key, 0) + self.drops

    def stop_dropping(self, api_key: int) -> None:
        pass


def workload(faults: set[str], proxy: Any = None, txn: bool = True, broker: Any = None) -> Workload:
    """Three producers, two copiers, two readers (the defaults)."""
    w = Workload("127.0.0.1:1", duration_s=1, seed=3, faults=faults, txn=txn, proxy=proxy, broker=broker)
    w.DROP_WINDOW_S = 0
    return w


def test_what_each_configuration_can_make() -> None:
    assert unrunnable_faults(set(ALL_FAULTS), proxy=True, broker=True, txn=True) == []
    why = unrunnable_faults(set(ALL_FAULTS), proxy=False, broker=False, txn=False)
    assert len(why) == 3 and "--no-proxy" in why[0] and "--broker-cmd" in why[1] and "--no-txn" in why[2]
    assert default_faults(proxy=True, txn=True) == {"drop", "reset", "delay", "zombie", "crash"}
    assert default_faults(proxy=False, txn=False) == set()
    assert not unrunnable_faults(default_faults(proxy=False, txn=True), proxy=False, broker=False, txn=True)


@pytest.mark.parametrize(("faults", "kwargs"), [({"broker-kill"}, {"proxy": FakeProxy()}),
                                                ({"drop"}, {}),
                                                ({"zombie"}, {"proxy": FakeProxy(), "txn": False})])
def test_a_workload_refuses_faults_it_cannot_make(faults: set[str], kwargs: dict[str, Any]) -> None:
    with pytest.raises(WorkloadError, match="cannot make the requested faults"):
        workload(faults, **kwargs)


def test_drops_without_transactions_target_produce_only() -> None:
    """EndTxn and AddPartitionsToTxn responses never come in a --no-txn run: dropping them did nothing
    and was counted as a fault."""
    proxy = FakeProxy()
    w = workload({"drop"}, proxy, txn=False)
    for _ in range(40):
        w._inject("drop", 0, None, [])  # type: ignore[arg-type]
    assert set(proxy.armed) == {API_PRODUCE}
    assert len(w.history.faults) == 40 and all("1 response(s) dropped" in f.detail for f in w.history.faults)
    both = FakeProxy()
    w = workload({"drop"}, both, txn=True)
    for _ in range(40):
        w._inject("drop", 0, None, [])  # type: ignore[arg-type]
    assert len(set(both.armed)) == 3


def test_a_drop_that_dropped_nothing_is_not_a_fault() -> None:
    w = workload({"drop"}, FakeProxy(drops=0))
    w._inject("drop", 0, None, [])  # type: ignore[arg-type]
    assert w.history.faults == []


class FakeBroker:
    def __init__(self, counters: list[int]) -> None:
        self.counters = counters
        self.kills: list[tuple[int, ...]] = []  # the counters at each kill

    def kill_and_restart(self) -> None:
        self.kills.append(tuple(self.counters))

    def pause(self, _seconds: float) -> None:
        pass


def until(condition: Any, timeout_s: float = 5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def test_a_broker_kill_waits_until_producers_and_copiers_committed_since_the_last() -> None:
    """A restarted broker has lost its groups; the copier group needs the initial rebalance delay and
    more to form again, so kills every 2-3 s left the copiers no transaction under faults (15 of 16
    runs). Each kill now waits until producers and copiers committed since the previous one."""
    counters = [0] * COUNTERS
    broker = FakeBroker(counters)
    w = workload({"broker-kill"}, broker=BrokerControl(broker.kill_and_restart, broker.pause))
    w.FAULT_INTERVAL_S = (0.001, 0.002)
    controls = Controls(stop_writes=None, stop_all=None, commands={}, done={}, counters=counters)
    loop = threading.Thread(target=w._fault_loop, args=(controls,), daemon=True)
    loop.start()
    try:
        time.sleep(0.1)
        counters[PRODUCER_COMMITS] = 5  # producers committed, the copier group has not formed yet
        time.sleep(0.1)
        assert broker.kills == []
        counters[COPIER_COMMITS] = 1
        assert until(lambda: len(broker.kills) == 1)
        time.sleep(0.1)
        counters[COPIER_COMMITS] = 2  # only the copiers again: not enough
        time.sleep(0.1)
        assert len(broker.kills) == 1
        counters[PRODUCER_COMMITS] = 6
        assert until(lambda: len(broker.kills) == 2)
        time.sleep(0.05)
        assert len(broker.kills) == 2
    finally:
        w.stop.set()
        loop.join(5)
    assert [k[PRODUCER_COMMITS:COPIER_COMMITS + 1] for k in broker.kills] == [(5, 1), (6, 2)]
    assert [f.kind for f in w.history.faults] == ["broker-kill", "broker-kill"]


def test_a_broker_kill_waits_no_longer_than_its_bound_and_other_faults_go_on() -> None:
    counters = [0] * COUNTERS
    broker = FakeBroker(counters)
    w = workload({"broker-kill", "broker-pause"}, broker=BrokerControl(broker.kill_and_restart, broker.pause))
    w.FAULT_INTERVAL_S = (0.001, 0.002)
    w.PROGRESS_WAIT_S = 0.2
    controls = Controls(stop_writes=None, stop_all=None, commands={}, done={}, counters=counters)
    loop = threading.Thread(target=w._fault_loop, args=(controls,), daemon=True)
    loop.start()
    try:
        time.sleep(0.15)
        assert broker.kills == [] and any(f.kind == "broker-pause" for f in w.history.faults)
        assert until(lambda: len(broker.kills) == 1)  # nobody committed: the bound ran out
    finally:
        w.stop.set()
        loop.join(5)

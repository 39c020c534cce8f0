"""The fault schedule without a broker: which faults a configuration can make, and that a fault is
recorded only when it happened (fakes stand in for the proxy and the broker)."""

from __future__ import annotations

from typing import Any

import pytest

from oncelog.verify.proxy import API_PRODUCE, ProxyStats
from oncelog.verify.workload import (
    ALL_FAULTS,
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

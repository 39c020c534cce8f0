"""Pieces of the workload that need no broker: how clients are spread over processes, the watchdog
around client calls, bootstrap parsing."""

from __future__ import annotations

import threading

import pytest

from oncelog.verify.cli import UsageError, parse_bootstrap
from oncelog.verify.roles import RoleSpec, Stuck, bounded
from oncelog.verify.workload import plan_processes


def roles(producers: int, copiers: int, readers: int) -> list[RoleSpec]:
    return ([RoleSpec("producer", i) for i in range(producers)] + [RoleSpec("copier", i) for i in range(copiers)]
            + [RoleSpec("reader", i) for i in range(readers)])


def test_roles_are_spread_over_processes_with_a_mix_of_kinds() -> None:
    plan = plan_processes(roles(3, 2, 2), 3)
    assert [[r.name for r in p] for p in plan] == [["p0", "x0", "c0"], ["p1", "x1", "c1"], ["p2"]]
    assert sorted(r.name for p in plan for r in p) == sorted(r.name for r in roles(3, 2, 2))
    assert len(plan_processes(roles(1, 0, 0), 4)) == 1
    assert len(plan_processes(roles(4, 4, 4), 4)) == 4


def test_bounded_returns_raises_or_gives_up() -> None:
    assert bounded(lambda: 42, 5) == 42
    with pytest.raises(ZeroDivisionError):
        bounded(lambda: 1 // 0, 5)
    release = threading.Event()
    with pytest.raises(Stuck):
        bounded(lambda: release.wait(30), 0.2)
    release.set()


@pytest.mark.parametrize(("text", "expected"), [("127.0.0.1:9092", ("127.0.0.1", 9092)),
                                                ("[::1]:9092", ("::1", 9092)),
                                                (" broker.example:19092 ", ("broker.example", 19092))])
def test_bootstrap_parsing(text: str, expected: tuple[str, int]) -> None:
    assert parse_bootstrap(text) == expected


@pytest.mark.parametrize("text", ["", "host", "host:", ":1", "host:port", "host:0", "h:1,h:2"])
def test_bad_bootstrap_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_bootstrap(text)

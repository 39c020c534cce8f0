"""Every test starts with no pooled Kafka client (what a fresh Python worker has), no driver-side
preparation and no transaction-timeout guess kept from another test, and leaves no client behind
talking to a broker that its fixture has stopped."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from oncelog.spark import sink
from oncelog.spark.clients import clear_all


@pytest.fixture(autouse=True)
def _no_pooled_clients() -> Iterator[None]:
    clear_all()
    sink._PREPARED.clear()
    sink._SIZED_MS.clear()
    yield
    clear_all()
    sink._PREPARED.clear()
    sink._SIZED_MS.clear()

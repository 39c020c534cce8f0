"""`oncelog verify` against a broker that answers oddly: a lying proxy in front of our broker rewrites
every Produce response (no offset at all, as the Tansu broker answers; or every write at offset 0).
The run reports what it saw (exit 1), never a traceback (issue 11, defect 8)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from kio.static.primitive import i64

from oncelog.testing.broker_process import BrokerProcess
from oncelog.verify.proxy import API_PRODUCE, FaultProxy


def base_offsets(value: int) -> Callable[[Any], Any]:
    def rewrite(resp: Any) -> Any:
        return dataclasses.replace(resp, responses=tuple(
            dataclasses.replace(t, partition_responses=tuple(
                dataclasses.replace(p, base_offset=i64(value)) for p in t.partition_responses))
            for t in resp.responses))
    return rewrite


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("offset", "expected"), [(-1, "missing-offset:"), (0, "inconsistent-offset:")])
def test_odd_produce_answers_are_reported_not_crashed_on(broker: BrokerProcess, offset: int, expected: str) -> None:
    with FaultProxy(broker.host, broker.port, seed=1) as liar:
        liar.rewrite_responses(API_PRODUCE, base_offsets(offset))
        r = subprocess.run([sys.executable, "-m", "oncelog", "verify", "--bootstrap", liar.address, "--no-proxy",
                            "--duration", "4", "--faults", "none", "--producers", "2", "--copiers", "1",
                            "--consumers", "1", "--processes", "2"],
                           capture_output=True, text=True, timeout=280)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    assert expected in r.stdout
    assert "Traceback" not in r.stderr + r.stdout
    if offset == 0:
        assert "non-monotonic-send:" in r.stdout

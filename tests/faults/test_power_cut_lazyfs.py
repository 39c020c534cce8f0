"""Power cuts with LazyFS (``tests/faults/power_cut.py``): two rounds per fsync mode, no violation allowed
(transactional producers and a plain idempotent one, which must have some values acknowledged every round).

Needs a LazyFS binary in ``ONCELOG_LAZYFS`` and FUSE. Marked ``lazyfs``, so ``-m "not lazyfs"`` deselects
it; without the variable it is skipped with the reason, and it fails when the run asked for it with
``-m lazyfs``. ``make power-cut`` runs the full harness (20 rounds per mode).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.faults import power_cut

pytestmark = [pytest.mark.lazyfs, pytest.mark.timeout(900)]


def _lazyfs_binary(config: pytest.Config) -> str:
    path = os.environ.get("ONCELOG_LAZYFS")
    if path:
        return path
    reason = "ONCELOG_LAZYFS is not set: point it at a LazyFS binary to run the power-cut test"
    markexpr = config.getoption("markexpr", "") or ""
    if "lazyfs" in markexpr and "not lazyfs" not in markexpr:
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.mark.parametrize("mode", power_cut.MODES)
def test_power_cuts_leave_transactions_atomic(mode: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    lazyfs = _lazyfs_binary(request.config)
    # One cut after a background flush had time to finish, one right at an fsync (inside a flush).
    opts = power_cut.parse_args(["--lazyfs", lazyfs, "--mode", mode, "--rounds", "2", "--seed", "11",
                                 "--cut", "idle,fsync", "--workdir", str(tmp_path)])
    results = power_cut.run(opts)
    assert len(results) == 2
    findings = [f"round {r.round_no} ({r.cut}): {f.kind}: {f.detail}" for r in results for f in r.findings]
    assert not findings, "\n".join(findings)
    assert all(r.committed > 0 for r in results), "the workload committed nothing"
    assert all(r.plain_acked > 0 for r in results), \
        f"the plain producer had nothing acknowledged: {[(r.round_no, r.plain_sent, r.notes) for r in results]}"

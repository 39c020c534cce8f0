"""The background flush measures flush.ms and the snapshot interval on the monotonic clock.

Probe s37 (``clock_flush.py``, a broker whose wall clock an LD_PRELOAD shim stepped back 1 h while a
producer wrote): 18 fsyncs in the 6 s before the step, none in the 6 s after, and the recovery-point
checkpoint frozen; ``PartitionLog.needs_flush`` compared wall-clock readings, so the flush waited for
the wall clock to come back. Here the in-process broker's ``_flush`` (what its background task runs)
is driven with a ManualClock whose wall clock is stepped while monotonic time passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from oncelog.clock import ManualClock
from oncelog.storage import partition_log, recovery_checkpoint
from tests.inproc import InProcessBroker
from tests.storage.helpers import batch

HOUR_MS = 3_600_000


@pytest.fixture
def ib(tmp_path: Path) -> Iterator[InProcessBroker]:
    b = InProcessBroker(tmp_path / "d", clock=ManualClock())
    b.create_topic("t", 1)
    try:
        yield b
    finally:
        b.close()


def _flush_pass(ib: InProcessBroker) -> None:
    """One run of the broker's background flush task, to its end (back on the loop)."""
    plog = ib.broker.logs.get_partition("t", 0)
    assert plog is not None

    async def once() -> None:
        ib.broker._flush()

    ib.loop.run_until_complete(once())
    ib.run_until(lambda: plog._flush_job is None)


def _checkpointed(ib: InProcessBroker) -> int | None:
    points = recovery_checkpoint.read(ib.data_dir / recovery_checkpoint.FILE_NAME)
    return points.get(("t", 0), (None, None))[0]


def test_the_background_flush_goes_on_after_the_wall_clock_steps_back(ib: InProcessBroker) -> None:
    clock = ib.clock
    plog = ib.broker.logs.get_partition("t", 0)
    assert plog is not None
    interval = plog.config.flush_interval_ms
    assert ib.produce("t", 0, batch(value=b"a")) == 0
    clock.advance(interval)
    _flush_pass(ib)
    assert plog.recovery_point == 1 and _checkpointed(ib) == 1

    clock.step_wall(-HOUR_MS)  # NTP steps the wall clock back; no time passes
    assert ib.produce("t", 0, batch(value=b"b")) == 0
    clock.advance(interval - 1)
    _flush_pass(ib)
    assert plog.recovery_point == 1, "flushed before flush.ms passed"
    clock.advance(1)
    _flush_pass(ib)  # flush.ms of time passed: due, whatever the wall clock says
    assert plog.recovery_point == 2 and _checkpointed(ib) == 2

    clock.step_wall(24 * HOUR_MS)  # a step forward does not make it due early either
    assert ib.produce("t", 0, batch(value=b"c")) == 0
    _flush_pass(ib)
    assert plog.recovery_point == 2
    clock.advance(interval)
    _flush_pass(ib)
    assert plog.recovery_point == 3 and _checkpointed(ib) == 3


def test_the_snapshot_interval_is_time_passed_after_the_wall_clock_steps_back(ib: InProcessBroker) -> None:
    """A periodic flush writes a producer-state snapshot at least every SNAPSHOT_INTERVAL_MS; after
    a step back it did not for as long as the step (the mark's time was a wall-clock reading)."""
    clock = ib.clock
    plog = ib.broker.logs.get_partition("t", 0)
    assert plog is not None
    interval = plog.config.flush_interval_ms
    clock.step_wall(-HOUR_MS)
    passes = partition_log.SNAPSHOT_INTERVAL_MS // interval  # the topic was made at the start
    for i in range(passes):
        assert plog.snapshot_offset is None
        assert ib.produce("t", 0, batch(value=b"v%d" % i)) == 0
        clock.advance(interval)
        _flush_pass(ib)
        assert plog.recovery_point == i + 1
    assert plog.snapshot_offset == passes, "no snapshot in SNAPSHOT_INTERVAL_MS of flushes"

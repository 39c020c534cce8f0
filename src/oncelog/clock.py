"""Injected time. Every layer takes a Clock so tests drive timeouts without sleeping.

Two readings, as Kafka's ``Time`` has: ``now_ms`` is the wall clock (``Time.milliseconds``: record
timestamps, commit timestamps, retention), which NTP or an operator may step back or forward;
``monotonic_ms`` (``Time.hiResClockMs``) never goes back and is not moved by a wall-clock step, so
timers that measure an interval (session timeouts, rebalance deadlines, flush intervals) use it.
Its origin is arbitrary: a monotonic reading is only ever compared with another one, never with a
wall-clock reading, and never stored.

This module is a leaf: it imports nothing of ours, and every layer may import it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...

    def monotonic_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds (timestamps in records and retention are wall-clock in Kafka), and a
    monotonic reading for timers."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000


class ManualClock:
    """A clock tests advance by hand. ``advance`` and ``set`` are time passing (both readings move);
    ``step_wall`` is a wall-clock step (NTP, an operator): only ``now_ms`` moves.

    The monotonic reading starts at ``monotonic_ms`` (default: the same value as the wall clock, so
    that a test that never steps the wall clock sees the two readings equal)."""

    def __init__(self, now_ms: int = 1_700_000_000_000, monotonic_ms: int | None = None) -> None:
        self._now_ms = now_ms
        self._monotonic_ms = now_ms if monotonic_ms is None else monotonic_ms

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> int:
        return self._monotonic_ms

    def advance(self, ms: int) -> None:
        """``ms`` of time pass: both readings move by ``ms`` (the monotonic one never moves back)."""
        self._now_ms += ms
        self._monotonic_ms += max(ms, 0)

    def set(self, now_ms: int) -> None:
        """The wall clock reads ``now_ms``; the monotonic reading moves forward by as much as the wall
        clock did (not at all if it went back)."""
        self.advance(now_ms - self._now_ms)

    def step_wall(self, ms: int) -> None:
        """The wall clock is stepped by ``ms`` (either way) while no time passes: monotonic time stays."""
        self._now_ms += ms

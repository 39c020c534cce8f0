"""Byte-rate quotas per principal, sans-IO (Kafka's ClientQuotaManager, simplified).

Each principal (the authenticated user, or the client id without authentication, as Kafka's
default quota entities) has a sliding window of ``window_count`` one-second samples. ``record``
adds bytes and returns how long the client must be throttled for the observed rate to fall back to
the quota: ``(rate - quota) / quota * window``, Kafka's formula, capped at the window length. The
broker answers with that ``throttle_time_ms`` and mutes the connection for as long (KIP-219).

Invariant: with a quota Q bytes/s and a client that honours the throttle, the bytes accepted over
any window of ``window_count`` seconds stay within about Q x window (one request of slack).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

UNLIMITED = 2**63 - 1


@dataclass
class _Window:
    samples: deque[tuple[int, int]] = field(default_factory=deque)  # (second, bytes)
    total: int = 0


class QuotaManager:
    def __init__(self, bytes_per_second: int, window_count: int = 11, sample_ms: int = 1000) -> None:
        self.quota = bytes_per_second
        self.window_count = window_count
        self.sample_ms = sample_ms
        self._windows: dict[str, _Window] = {}

    @property
    def enabled(self) -> bool:
        return 0 < self.quota < UNLIMITED

    def record(self, principal: str, nbytes: int, now_ms: int) -> int:
        """Account ``nbytes`` to ``principal``; return the throttle time in ms (0 within quota)."""
        if not self.enabled or nbytes <= 0:
            return 0
        w = self._windows.setdefault(principal, _Window())
        second = now_ms // self.sample_ms
        if w.samples and w.samples[-1][0] == second:
            w.samples[-1] = (second, w.samples[-1][1] + nbytes)
        else:
            w.samples.append((second, nbytes))
        w.total += nbytes
        oldest_kept = second - self.window_count + 1
        while w.samples and w.samples[0][0] < oldest_kept:
            w.total -= w.samples.popleft()[1]
        span_ms = max((second - w.samples[0][0]) * self.sample_ms + (now_ms % self.sample_ms) + 1,
                      self.sample_ms)
        span_ms = min(span_ms, self.window_count * self.sample_ms)
        rate = w.total * 1000 / span_ms
        if rate <= self.quota:
            return 0
        throttle = int((rate - self.quota) / self.quota * span_ms)
        return min(throttle, self.window_count * self.sample_ms)

"""What happened when during a demo run: phases, Spark job attempts, injected faults, and the ledger's
visible output over time (for the report's timeline and output-count charts).

Times are seconds since the run started (``time.monotonic()`` based). :class:`OutputSampler` is the
only part that talks to the broker: a read_committed consumer counting the ledger's records as they
become visible, plus the proxy's dropped-acknowledgement counter, sampled every half second.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

DRIVER_KILL = "kill (mid-batch)"
COMMIT_WINDOW_KILL = "kill (commit window)"
DROPPED_ACK = "dropped ack"
ZOMBIE = "zombie attempt"
RUNNING = "Spark job running"
FAULTS = (DRIVER_KILL, COMMIT_WINDOW_KILL, DROPPED_ACK, ZOMBIE)


@dataclass
class Event:
    at: float
    guarantee: str
    kind: str
    detail: str = ""


@dataclass
class Span:
    row: str
    start: float
    end: float
    kind: str


@dataclass
class Timeline:
    t0: float = field(default_factory=time.monotonic)
    spans: list[Span] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    #: per guarantee: (seconds, records of the ledger visible read_committed)
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)

    def since(self, monotonic: float) -> float:
        return monotonic - self.t0

    def now(self) -> float:
        return self.since(time.monotonic())

    def span(self, row: str, kind: str, start: float, end: float | None = None) -> Span:
        s = Span(row, start, self.now() if end is None else end, kind)
        self.spans.append(s)
        return s

    def event(self, guarantee: str, kind: str, at: float | None = None, detail: str = "") -> None:
        self.events.append(Event(self.now() if at is None else at, guarantee, kind, detail))

    def end(self) -> float:
        ends = [s.end for s in self.spans] + [e.at for e in self.events] + \
            [t for ss in self.samples.values() for t, _ in ss]
        return max(ends, default=0.0)


class OutputSampler:
    """Counts the records of ``topic`` visible read_committed, in a thread, and samples the count
    (and ``dropped()``, the proxy's dropped responses so far) every ``every_s`` seconds."""

    def __init__(self, bootstrap: str, topic: str, timeline: Timeline, guarantee: str,
                 on_count: Callable[[int], None] | None = None, dropped: Callable[[], int] | None = None,
                 every_s: float = 0.5) -> None:
        self.bootstrap, self.topic, self.timeline, self.guarantee = bootstrap, topic, timeline, guarantee
        self.on_count, self.dropped, self.every_s = on_count, dropped, every_s
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"sampler-{topic}", daemon=True)
        self.samples = timeline.samples.setdefault(guarantee, [])

    def start(self) -> OutputSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        from confluent_kafka import Consumer

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"oncelog-sampler-{uuid.uuid4()}",
                      "enable.auto.commit": False, "isolation.level": "read_committed",
                      "auto.offset.reset": "earliest", "topic.metadata.refresh.interval.ms": 1000})
        last_dropped = self.dropped() if self.dropped else 0
        try:
            c.subscribe([self.topic])
            next_sample = 0.0
            while True:
                stopping = self._stop.is_set()
                for m in c.consume(num_messages=5000, timeout=0.1):
                    if m.error() is None:
                        self.count += 1
                now = time.monotonic()
                if now >= next_sample or stopping:
                    next_sample = now + self.every_s
                    at = self.timeline.since(now)
                    self.samples.append((at, self.count))
                    if self.on_count is not None:
                        self.on_count(self.count)
                    if self.dropped is not None:
                        d = self.dropped()
                        for _ in range(d - last_dropped):
                            self.timeline.event(self.guarantee, DROPPED_ACK, at)
                        last_dropped = d
                if stopping:
                    return
        finally:
            c.close()

"""The demo's progress, phase by phase: the numbers behind its progress bars.

:class:`DemoProgress` only counts (no terminal, no threads of its own; any thread may call it, one
lock); :class:`RichProgress` shows it with ``rich``. Phases, in order: generating the payments,
then per guarantee the Spark run (its output records against the committed input, with the kills
and restarts so far), reading the outputs, and verifying them.

A run's bar counts distinct progress, never more than the input: at_least_once may write more
records than it read (duplicates) and at_most_once fewer (losses), so the bar is capped at the
input size and completed when the job exits; the detail text shows the real count.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass
class Phase:
    key: str
    label: str
    total: int
    completed: int = 0
    detail: str = ""
    done: bool = False


class DemoProgress:
    def __init__(self, records: int, guarantees: Sequence[str]) -> None:
        self.guarantees = list(guarantees)
        phases = [Phase("generate", "generating payments", records)]
        phases += [Phase(g, f"{g}: Spark run", records) for g in self.guarantees]
        phases += [Phase("read", "reading outputs", len(self.guarantees)),
                   Phase("verify", "verifying", len(self.guarantees))]
        self.phases = {p.key: p for p in phases}
        self.kills: dict[str, int] = dict.fromkeys(self.guarantees, 0)
        self.commit_window_kills: dict[str, int] = dict.fromkeys(self.guarantees, 0)
        self.restarts: dict[str, int] = dict.fromkeys(self.guarantees, 0)
        self.out: dict[str, int] = dict.fromkeys(self.guarantees, 0)
        self._lock = threading.Lock()
        self._listeners: list[Callable[[Phase], None]] = []

    def listen(self, listener: Callable[[Phase], None]) -> None:
        self._listeners.append(listener)

    def _changed(self, phase: Phase) -> None:
        for listener in self._listeners:
            listener(phase)

    def generated(self, n: int) -> None:
        with self._lock:
            p = self.phases["generate"]
            p.completed = min(p.total, p.completed + n)
            p.done = p.completed >= p.total
            p.detail = f"{p.completed:,} committed"
        self._changed(p)

    def _run_detail(self, g: str) -> str:
        kills = self.kills[g] + self.commit_window_kills[g]
        return (f"{self.out[g]:,} out, {kills} kill{'s' if kills != 1 else ''} "
                f"({self.commit_window_kills[g]} in the commit window), {self.restarts[g]} restarts")

    def output(self, g: str, count: int) -> None:
        """``count`` records of ``g``'s ledger are visible (read_committed) so far."""
        with self._lock:
            p = self.phases[g]
            self.out[g] = count
            if not p.done:
                p.completed = min(p.total, count)
            p.detail = self._run_detail(g)
        self._changed(p)

    def _count(self, g: str, counter: dict[str, int]) -> None:
        with self._lock:
            counter[g] += 1
            p = self.phases[g]
            p.detail = self._run_detail(g)
        self._changed(p)

    def killed(self, g: str, commit_window: bool) -> None:
        self._count(g, self.commit_window_kills if commit_window else self.kills)

    def restarted(self, g: str) -> None:
        self._count(g, self.restarts)

    def run_finished(self, g: str) -> None:
        with self._lock:
            p = self.phases[g]
            p.completed, p.done = p.total, True
            p.detail = self._run_detail(g)
        self._changed(p)

    def _step(self, key: str, g: str, verb: str) -> None:
        with self._lock:
            p = self.phases[key]
            p.completed = min(p.total, p.completed + 1)
            p.done = p.completed >= p.total
            p.detail = f"{verb} {g}"
        self._changed(p)

    def read(self, g: str) -> None:
        self._step("read", g, "read")

    def verified(self, g: str) -> None:
        self._step("verify", g, "verified")

    def fraction(self) -> float:
        """The whole demo's share done, each phase weighing the same."""
        with self._lock:
            parts = [p.completed / p.total if p.total else 1.0 for p in self.phases.values()]
        return sum(parts) / len(parts)


class RichProgress:
    """``rich`` progress bars for a :class:`DemoProgress`: one bar per phase, updated as it changes."""

    def __init__(self, progress: DemoProgress, console: object) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.bars = Progress(TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(),
                             TextColumn("[dim]{task.fields[detail]}"), TimeElapsedColumn(),
                             console=console, transient=False)  # type: ignore[arg-type]
        self.tasks = {p.key: self.bars.add_task(p.label, total=p.total, detail="", start=False)
                      for p in progress.phases.values()}
        self._started: set[str] = set()
        progress.listen(self._update)

    def _update(self, phase: Phase) -> None:
        task = self.tasks[phase.key]
        if phase.key not in self._started:
            self._started.add(phase.key)
            self.bars.start_task(task)
        self.bars.update(task, completed=phase.completed, detail=phase.detail)
        if phase.done:
            self.bars.stop_task(task)

    def __enter__(self) -> RichProgress:
        self.bars.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bars.stop()

"""CPU time of a process and of the whole machine, from /proc (Linux), so that the bench can say who
used the CPU during a run: the broker, the clients, or everyone else on a shared machine.

A process's time is user + sys of all its threads (``/proc/PID/stat`` fields 14 and 15, in clock
ticks, usually 10 ms). The machine's busy time is every CPU's non-idle time (``/proc/stat``'s first
line minus idle and iowait). Both are sampled around a run; elsewhere than Linux they read as 0.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_s(pid: int) -> float:
    """User + sys seconds used so far by process ``pid`` (all threads); 0.0 if unreadable."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return 0.0
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) ": the comm may contain spaces
    return (int(fields[11]) + int(fields[12])) / _TICK


def machine_cpu_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of all CPUs since boot; (0, 0) if unreadable."""
    try:
        with open("/proc/stat") as f:
            first = f.readline().split()
    except OSError:
        return 0.0, 0.0
    ticks = [int(v) for v in first[1:9]]  # user nice system idle iowait irq softirq steal
    total = sum(ticks)
    idle = ticks[3] + ticks[4]
    return (total - idle) / _TICK, total / _TICK


@functools.cache
def machine_cpus() -> int:
    """The CPUs ``/proc/stat`` counts (its ``cpuN`` lines): those whose time ``machine_cpu_s`` sums,
    which under taskset or a cpuset are more than this process may run on (``cpu_count``)."""
    try:
        with open("/proc/stat") as f:
            return sum(1 for line in f if line.startswith("cpu") and line[3:4].isdigit()) or cpu_count()
    except OSError:
        return cpu_count()


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


@dataclass
class CpuSample:
    at: float  # monotonic seconds
    broker_s: float
    machine_busy_s: float
    machine_total_s: float

    @classmethod
    def take(cls, broker_pid: int) -> CpuSample:
        busy, total = machine_cpu_s()
        return cls(time.monotonic(), process_cpu_s(broker_pid), busy, total)


@dataclass
class CpuUse:
    """CPU used during one run, in percent of one core (100 = one core busy for the whole run),
    except ``machine_pct``: the share of the machine's capacity that was busy (100 = every core)."""

    broker_pct: float
    clients_pct: float
    client_max_pct: float  # the busiest client process
    machine_pct: float
    others_pct: float  # every core's busy time that was neither the broker nor the clients, in cores %

    @classmethod
    def between(cls, a: CpuSample, b: CpuSample, clients_cpu_s: list[float]) -> CpuUse:
        seconds = max(b.at - a.at, 1e-9)
        broker = (b.broker_s - a.broker_s) / seconds * 100
        clients = sum(clients_cpu_s) / seconds * 100
        total = b.machine_total_s - a.machine_total_s
        busy = b.machine_busy_s - a.machine_busy_s
        machine = busy / total * 100 if total > 0 else 0.0
        # busy core-seconds over the window, minus ours, as % of one core: the busy share is of every
        # CPU /proc/stat counts, whatever this process's affinity
        others = max(busy / max(total, 1e-9) * machine_cpus() * 100 - broker - clients, 0.0) if total > 0 else 0.0
        return cls(round(broker, 1), round(clients, 1), round(max(clients_cpu_s, default=0) / seconds * 100, 1),
                   round(machine, 1), round(others, 1))

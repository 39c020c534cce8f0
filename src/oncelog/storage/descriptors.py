"""File descriptors: what the storage holds open, and what clients' requests may still take.

A broker out of descriptors accepts no connection and opens no file, and one whose data needs more
of them than its limit cannot even start. Every segment keeps its file open (``LogSegment``), so
what a client can multiply is partitions and segment rolls (a topic created with a tiny
``segment.bytes`` rolls at every batch). Both are refused while they would leave fewer than
:func:`headroom` descriptors free under the soft limit (``ulimit -n``):

- a topic or partitions a client creates (``LogManager.check_descriptors``, asked by every
  creation but the internal topics': CreateTopics, CreatePartitions, auto-creation), counted
  against the descriptors open now;
- a client's append that would roll a segment (``PartitionLog``), counted against the descriptors
  open now (:func:`roll_refused`): the segment files, and the connections, which take their room
  from the same budget (a client holding many connections open must not leave a roll without a
  descriptor: its ``open`` failed with EMFILE, and that took the log directory offline);
- a new connection (``Broker.admit``), which may use only half of the headroom.

Each segment file counts twice: a flush (background, the group commit, a clean stop) fsyncs a
duplicate of the descriptor of every segment it covers (``FlushJob``), and a log with many small
segments can have all of them to flush at once. The coordinators' appends (markers, transaction and
offset records) and the internal topics are never refused: they live in the headroom. At start the
broker raises its soft limit to the hard one (:func:`raise_soft_limit`), as servers that hold many
files do.
"""

from __future__ import annotations

import errno
import os
import resource
import threading
import time

#: errno values of an ``open`` refused for want of a descriptor (the process's, or the system's).
EXHAUSTED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})

_lock = threading.Lock()
_segments_open = 0
# Connections ever admitted (:func:`connection_refused` returned None): the count of the open ones
# can grow only by these, so a count of the descriptors plus those admitted since bounds them now.
_connections_admitted = 0
# The last count of /proc/self/fd: (descriptors, segment files open then, connections admitted
# then, time.monotonic() then), for :func:`open_bound`.
_count: tuple[int, int, int, float] | None = None
#: A count older than this is taken again, even when its bound still allows a roll (a bound may
#: drift from the truth by what neither a segment nor a connection opened: the logs' other files).
RECOUNT_S = 10.0
#: A bound that refuses is checked against a new count at most this often (a client retrying a
#: refused roll must not make the loop list /proc/self/fd at every request: 3 us a descriptor).
REFUSED_RECOUNT_S = 0.1


def segment_opened() -> None:
    global _segments_open
    with _lock:  # segments are also made off the event loop (a topic's creation)
        _segments_open += 1


def segment_closed() -> None:
    global _segments_open
    with _lock:
        _segments_open -= 1


def segments_open() -> int:
    """Segment files this process holds open."""
    return _segments_open


def soft_limit() -> int | None:
    """RLIMIT_NOFILE's soft limit; None when unlimited."""
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if limit == resource.RLIM_INFINITY else limit


def headroom(limit: int) -> int:
    """Descriptors that what clients create must leave free: for connections, the logs' other files,
    the coordinators' segment rolls and the broker's threads."""
    return max(256, limit // 10)


def spare_for_new_partitions() -> tuple[int, int] | None:
    """(how many more partitions the descriptors allow, the limit): the descriptors open now, a
    duplicate for each segment open, and two for each new partition's segment, leave the headroom
    free. None where they cannot be counted (no ``/proc/self/fd``) or there is no limit."""
    limit = soft_limit()
    if limit is None:
        return None
    open_now = _count_open()
    if open_now is None:
        return None
    return (limit - headroom(limit) - open_now - _segments_open) // 2, limit


def _count_open() -> int | None:
    """Descriptors this process holds now (None where /proc/self/fd cannot be read)."""
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


def open_bound(*, recount_after_s: float = RECOUNT_S) -> int | None:
    """At least as many descriptors as this process holds now: the last count of /proc/self/fd (taken
    again when older than ``recount_after_s``), plus the segment files opened and the connections
    admitted since (closed ones only make it larger than the truth). A count costs about 3 us a
    descriptor (3 ms at 1,000), so a roll does not count every time. None where there is no /proc."""
    global _count
    now = time.monotonic()
    c = _count
    if c is None or now - c[3] >= recount_after_s:
        n = _count_open()
        if n is None:
            return None
        _count = (n, _segments_open, _connections_admitted, now)
        return n
    return c[0] + (_segments_open - c[1]) + (_connections_admitted - c[2])


def _storage_need(new_segments: int, reserve: int) -> int:
    """Descriptors the storage may need: every segment file open, and ``new_segments`` more, twice
    (its file and a flush's duplicate), plus ``reserve`` kept free."""
    return 2 * (_segments_open + new_segments) + reserve


def roll_refused() -> str | None:
    """Why a client's append may not roll a segment now (None: it may). The descriptors open (the
    connections among them), a flush's duplicate of each segment file, and the new segment's file
    and its duplicate must leave the headroom free, as for a new partition
    (:func:`spare_for_new_partitions`). Counting the segment files alone (as before) let a client
    that held connections open, admitted while few segments were open, then roll until the roll's
    ``open`` failed with EMFILE and stopped the broker. Where /proc cannot be read, only the segment
    files are counted."""
    limit = soft_limit()
    if limit is None:
        return None
    room = headroom(limit)
    need = _segments_open + 2 + room
    open_now = open_bound()
    if open_now is not None and open_now + need > limit:
        open_now = open_bound(recount_after_s=REFUSED_RECOUNT_S)  # the bound may be stale: count again
    if open_now is None:
        if _storage_need(1, room) <= limit:
            return None
        open_now = _segments_open
    elif open_now + need <= limit:
        return None
    return (f"segment roll refused: {open_now} files are open ({_segments_open} of them segment files, which a "
            f"flush may each duplicate) under a limit of {limit} open files (ulimit -n), which keeps {room} "
            "free; raise the limit, close idle connections, or let retention (or DeleteRecords, DeleteTopics) "
            "remove segments")


def connection_refused(connections: int) -> str | None:
    """Why the broker may not take one more connection (None: it may): the connections, the segment
    files open (each twice) and half the headroom (kept for the storage's own files) would reach the
    limit. A refused connection is closed at once; without this, a client holding connections open
    took every descriptor, and the next segment roll failed and stopped the broker. Only the broker's
    admission asks this, and a connection it lets in is counted (:func:`open_bound`)."""
    global _connections_admitted
    limit = soft_limit()
    if limit is None or connections + 1 + _storage_need(0, headroom(limit) // 2) < limit:
        with _lock:
            _connections_admitted += 1
        return None
    return (f"open files limit ({limit}, ulimit -n) nearly reached: {connections} connections and "
            f"{_segments_open} segment files open")


def raise_soft_limit() -> tuple[int, int] | None:
    """Raise the soft descriptor limit to the hard one (at most 2**20 when the hard one is unlimited);
    (before, after) if it moved, None if not."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = 1 << 20 if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return None
        return soft, target
    return None

"""File descriptors: what the storage holds open, and what clients' requests may still take.

A broker out of descriptors accepts no connection and opens no file, and one whose data needs more
of them than its limit cannot even start. Every segment keeps its file open (``LogSegment``), so
what a client can multiply is partitions and segment rolls (a topic created with a tiny
``segment.bytes`` rolls at every batch). Both are refused while they would leave fewer than
:func:`headroom` descriptors free under the soft limit (``ulimit -n``):

- a topic or partitions a client creates (``LogManager.check_descriptors``, asked by every
  creation but the internal topics': CreateTopics, CreatePartitions, auto-creation), counted
  against the descriptors open now;
- a client's append that would roll a segment (``PartitionLog``), counted against the segment
  files open (:func:`segments_open`), which is cheap enough for every roll;
- a new connection (``Broker.admit``), which may use only half of the headroom.

Each segment file counts twice: a flush (background, the group commit, a clean stop) fsyncs a
duplicate of the descriptor of every segment it covers (``FlushJob``), and a log with many small
segments can have all of them to flush at once. The coordinators' appends (markers, transaction and
offset records) and the internal topics are never refused: they live in the headroom. At start the
broker raises its soft limit to the hard one (:func:`raise_soft_limit`), as servers that hold many
files do.
"""

from __future__ import annotations

import os
import resource
import threading

_lock = threading.Lock()
_segments_open = 0


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
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        return None
    return (limit - headroom(limit) - open_now - _segments_open) // 2, limit


def _storage_need(new_segments: int, reserve: int) -> int:
    """Descriptors the storage may need: every segment file open, and ``new_segments`` more, twice
    (its file and a flush's duplicate), plus ``reserve`` kept free."""
    return 2 * (_segments_open + new_segments) + reserve


def roll_refused() -> str | None:
    """Why a client's append may not roll a segment now (None: it may): the segment files open and
    the new one, each twice, would eat into the headroom."""
    limit = soft_limit()
    if limit is None or _storage_need(1, headroom(limit)) <= limit:
        return None
    return (f"segment roll refused: {_segments_open} segment files are open under a limit of {limit} "
            f"open files (ulimit -n), which keeps room for a flush's duplicate of each and {headroom(limit)} "
            "more; raise the limit, or let retention (or DeleteRecords, DeleteTopics) remove segments")


def connection_refused(connections: int) -> str | None:
    """Why the broker may not take one more connection (None: it may): the connections, the segment
    files open (each twice) and half the headroom (kept for the storage's own files) would reach the
    limit. A refused connection is closed at once; without this, a client holding connections open
    took every descriptor, and the next segment roll failed and stopped the broker."""
    limit = soft_limit()
    if limit is None or connections + 1 + _storage_need(0, headroom(limit) // 2) < limit:
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

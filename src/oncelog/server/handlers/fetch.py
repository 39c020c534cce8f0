"""Fetch: read raw batches below the high watermark (read_uncommitted) or the LSO (read_committed).

A fetch that finds fewer than ``min_bytes`` waits up to ``max_wait_ms`` and is woken by any append to
one of its partitions (Kafka's delayed fetch). Response size follows KIP-74: ``max_bytes`` bounds
the whole response and ``partition_max_bytes`` each partition, except that the first partition
with data always returns at least one whole batch so a large batch can never stall a consumer.
Fetch sessions (KIP-227) are declined by answering session id 0: clients then send full fetches.
v9+ checks the fetcher's current leader epoch (FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH) and v12+
answers a diverging epoch when the fetcher's last fetched epoch ended before its fetch offset.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, NamedTuple

from oncelog.protocol.errors import ErrorCode
from oncelog.protocol.messages import Request, td_ms
from oncelog.server.authz import Op, R, allowed
from oncelog.server.handlers.leader_epochs import leader_epoch_error
from oncelog.storage import errors as storage_errors
from oncelog.storage import log_segment
from oncelog.storage.errors import ReadWouldBlock

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

READ_COMMITTED = 1


def _partition_error(index: int, code: ErrorCode, plog: Any = None) -> dict[str, Any]:
    return {"partition_index": index, "error_code": code,
            "high_watermark": plog.readable_end if plog is not None else -1,
            "last_stable_offset": plog.readable_stable_offset if plog is not None else -1,
            "log_start_offset": plog.log_start_offset if plog is not None else -1,
            "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}


def read_fetch(broker: Broker, body: Any, isolation_level: int, max_bytes: int,
               denied: frozenset[str] = frozenset(), nowait: bool = False) -> tuple[list[dict[str, Any]], int, bool]:
    """One pass over the requested partitions: (topics, bytes returned, any error). ``nowait``:
    raise ``ReadWouldBlock`` at the first read that would wait for the disk (nothing changes)."""
    remaining = max_bytes
    total = 0
    errored = False
    topics_out = []
    logs = broker.logs
    for ft in body.topics:
        topic = ft.topic
        parts = []
        for fp in ft.partitions:
            index = fp.partition
            if topic in denied:
                parts.append(_partition_error(index, ErrorCode.topic_authorization_failed))
                errored = True
                continue
            plog = logs.get_partition(topic, index)
            if plog is None:
                parts.append(_partition_error(index, ErrorCode.unknown_topic_or_partition))
                errored = True
                continue
            epoch_error = leader_epoch_error(plog, getattr(fp, "current_leader_epoch", -1))
            if epoch_error != ErrorCode.none:
                parts.append(_partition_error(index, epoch_error, plog))
                errored = True
                continue
            upper = plog.visible_end(isolation_level == READ_COMMITTED)
            fetch_offset = fp.fetch_offset
            last_fetched_epoch = getattr(fp, "last_fetched_epoch", -1)
            if last_fetched_epoch >= 0:
                # KIP-320/595: the fetcher says which epoch its last record had; if this log's
                # history disagrees, answer where that epoch ended instead of records.
                epoch, end = plog.end_offset_for_epoch(last_fetched_epoch)
                if epoch == -1 or end == -1:
                    parts.append(_partition_error(index, ErrorCode.offset_out_of_range, plog))
                    errored = True
                    continue
                if epoch < last_fetched_epoch or end < fetch_offset:
                    parts.append({**_partition_error(index, ErrorCode.none, plog),
                                  "aborted_transactions": [] if isolation_level == READ_COMMITTED else None,
                                  "diverging_epoch": {"epoch": epoch, "end_offset": end}})
                    errored = True
                    continue
            if fetch_offset < plog.log_start_offset or fetch_offset > plog.log_end_offset:
                parts.append(_partition_error(index, ErrorCode.offset_out_of_range, plog))
                errored = True
                continue
            data: bytes | bytearray | memoryview = b""
            aborted = None
            if fetch_offset < upper and (remaining > 0 or total == 0):  # KIP-74: max_bytes 0 still gets a batch
                limit = min(fp.partition_max_bytes, remaining)
                try:
                    data, _first, data_end = plog.read_view(fetch_offset, limit, max_offset=upper,
                                                            min_one_message=(total == 0), nowait=nowait)
                except storage_errors.OffsetOutOfRangeError:
                    parts.append(_partition_error(index, ErrorCode.offset_out_of_range, plog))
                    errored = True
                    continue
                if data and isolation_level == READ_COMMITTED:
                    # Only the transactions the returned batches can belong to (Kafka's
                    # addAbortedTransactions bounds the lookup by the end of the data read).
                    aborted = [{"producer_id": pid, "first_offset": first}
                               for pid, first in plog.aborted_transactions(fetch_offset, data_end)]
                remaining -= len(data)
                total += len(data)
            if isolation_level == READ_COMMITTED and aborted is None:
                aborted = []
            parts.append({"partition_index": index, "error_code": ErrorCode.none,
                          "high_watermark": plog.readable_end, "last_stable_offset": plog.readable_stable_offset,
                          "log_start_offset": plog.log_start_offset, "aborted_transactions": aborted,
                          "preferred_read_replica": -1, "records": data})
        topics_out.append({"topic": topic, "partitions": parts})
    return topics_out, total, errored


#: Reads a fetch may move off the event loop before it reads on the loop whatever is left.
MAX_COLD_READS = 8
#: The least a read off the loop reads.
COLD_READ_AHEAD = 256 << 10


async def _read_off_loop_if_cold(broker: Broker, body: Any, isolation_level: int, max_bytes: int,
                                 denied: frozenset[str], cold: ReadWouldBlock | None = None,
                                 ) -> tuple[list[dict[str, Any]], int, bool]:
    """``read_fetch`` without waiting for the disk on the event loop: a pass that needs pages not
    in memory stops, the broker reads them on its read thread (into the page cache), and the pass
    starts again, from the log's state at that moment (a read in between changes nothing). After
    ``MAX_COLD_READS`` such reads, or if pages just read are still not in memory (a file system that
    cannot tell, e.g. one that answers every such read EAGAIN: then this stops trying for good),
    the pass reads on the loop as before. ``cold``: a pass already made found these pages cold."""
    cold_reads = 0
    warmed = (-1, 0, 0)  # fd, start, end of the last range read into the cache
    while True:
        if cold is None:
            nowait = log_segment.nowait_reads and cold_reads < MAX_COLD_READS
            try:
                return read_fetch(broker, body, isolation_level, max_bytes, denied, nowait=nowait)
            except ReadWouldBlock as exc:
                cold = exc
        fd, start, end = warmed
        if cold.fd == fd and start <= cold.position and cold.position + cold.length <= end:
            log_segment.disable_nowait_reads("pages just read were still reported as not in memory")
            cold = None
            continue
        # A batch header (61 bytes) is read before the batches after it: read ahead.
        length = max(cold.length, COLD_READ_AHEAD)
        warmed = (cold.fd, cold.position, cold.position + length)
        cold_reads += 1
        await broker.read_into_cache(cold.fd, cold.position, length)
        cold = None


def _visible_ends(broker: Broker, partitions: list[tuple[str, int]], isolation_level: int) -> list[Any]:
    """What a wait may change for this fetch, per partition: the end a read stops at (the LSO
    under read_committed, else the high watermark) and the log start offset (None: no log)."""
    out: list[Any] = []
    for topic, index in partitions:
        plog = broker.logs.get_partition(topic, index)
        out.append(None if plog is None else
                   (plog.visible_end(isolation_level == READ_COMMITTED), plog.log_start_offset))
    return out


class _Fetch(NamedTuple):
    body: Any
    isolation_level: int
    max_bytes: int
    min_bytes: int
    deadline: float
    partitions: list[tuple[str, int]]
    denied: frozenset[str]


class _Available:
    """What a waiting fetch could return now, counted from positions in the logs and not read
    (Kafka's ``DelayedFetch.tryComplete``): per partition, the bytes from its fetch offset's batch
    to its visible end (the LSO under read_committed), at most its ``partition_max_bytes``. The
    count only decides when the fetch reads (once: when it reaches ``min_bytes``, or at the
    deadline): an append then costs the waiting fetch an index lookup per partition at most, not
    a read of everything since its offset. Where bytes cannot tell (a partition gone, its log start
    past the fetch offset, the visible end in a later segment than the fetch offset, pages not in
    memory), the fetch reads at once, as Kafka completes in those cases."""

    def __init__(self, f: _Fetch) -> None:
        self.read_committed = f.isolation_level == READ_COMMITTED
        self.wanted = [(fp.fetch_offset, fp.partition_max_bytes) for ft in f.body.topics for fp in ft.partitions]
        # per partition: (log, segment base, position) of the fetch offset, found once
        self._starts: list[tuple[Any, int, int] | None] = [None] * len(self.wanted)

    def enough(self, broker: Broker, partitions: list[tuple[str, int]], min_bytes: int) -> bool:
        total = 0
        nowait = log_segment.nowait_reads
        try:
            for i, (topic, index) in enumerate(partitions):
                plog = broker.logs.get_partition(topic, index)
                fetch_offset, max_bytes = self.wanted[i]
                if plog is None or fetch_offset < plog.log_start_offset:
                    return True  # a read answers the error
                end = plog.visible_end(self.read_committed)
                if end <= fetch_offset:
                    continue
                end_at = plog.position_of(end, nowait)
                start = self._starts[i]
                if start is None or start[0] is not plog or end_at is None or start[1] != end_at[0]:
                    # first count, or the end moved to another segment (a roll at the fetch offset
                    # puts its batch in the new one)
                    at = plog.position_of(fetch_offset, nowait)
                    if at is None:
                        return True
                    start = self._starts[i] = (plog, at[0], at[1])
                if end_at is None or start[1] != end_at[0]:
                    return True
                total += min(end_at[1] - start[2], max_bytes)
                if total >= min_bytes:
                    return True
        except ReadWouldBlock:
            return True  # cold pages: the read fetches them off the loop
        return False


def handle_fetch(broker: Broker, req: Request) -> dict[str, Any] | Awaitable[dict[str, Any]]:
    """Answered at once when the first read finds every page in memory and is enough (``min_bytes``
    reached, an error, no wait asked, no partition); otherwise the rest of the fetch (pages read off
    the loop, the wait for appends) runs as a coroutine that continues from that first read."""
    body = req.body
    if getattr(body, "session_epoch", -1) not in (0, -1):
        # An incremental fetch (KIP-227) names a session this broker never opened: it answers every
        # fetch with session id 0. Kafka's FetchManager answers a session it does not have so,
        # with no partitions; reading the request as a full fetch would ignore its forgotten topics.
        return {"throttle_time": 0, "error_code": ErrorCode.fetch_session_id_not_found, "session_id": 0,
                "responses": []}
    isolation_level = getattr(body, "isolation_level", 0)
    # fetch.max.bytes caps what one response may carry, whatever the client asks for (except that
    # the first batch is always returned whole, KIP-74).
    max_bytes = min(getattr(body, "max_bytes", 0x7FFFFFFF), broker.config.fetch_max_bytes)
    if broker.unread_writers:  # clients that do not read their responses hold memory of all
        max_bytes = min(max_bytes, broker.response_room())
    max_wait_s = max(td_ms(body.max_wait), 0) / 1000
    f = _Fetch(body, isolation_level, max_bytes, body.min_bytes, time.monotonic() + max_wait_s,
               [(ft.topic, fp.partition) for ft in body.topics for fp in ft.partitions],
               frozenset(ft.topic for ft in body.topics if not allowed(broker, req, Op.READ, R.TOPIC, ft.topic)))
    try:
        first = read_fetch(broker, body, isolation_level, max_bytes, f.denied, nowait=log_segment.nowait_reads)
    except ReadWouldBlock as cold:
        return _fetch_rest(broker, req, f, None, cold, None)
    topics_out, total, errored = first
    if total >= f.min_bytes or errored or max_wait_s <= 0 or not f.partitions:
        return _answer(broker, req, topics_out, total)
    # What the first read saw, taken with it: an append between this and the start of the task
    # that waits (another connection's produce in the same turn of the loop) must wake this fetch.
    return _fetch_rest(broker, req, f, first, None, _visible_ends(broker, f.partitions, isolation_level))


def _answer(broker: Broker, req: Request, topics_out: list[dict[str, Any]], total: int) -> dict[str, Any]:
    throttle = broker.throttle(req, broker.fetch_quota, total)
    return {"throttle_time": throttle, "error_code": ErrorCode.none, "session_id": 0, "responses": topics_out}


async def _fetch_rest(broker: Broker, req: Request, f: _Fetch,
                      first: tuple[list[dict[str, Any]], int, bool] | None,
                      cold: ReadWouldBlock | None, ends: list[Any] | None) -> dict[str, Any]:
    """The fetch after its first read: that read's result (``first``) and what it saw
    (``_visible_ends`` taken with it), or the cold pages it stopped at (``cold``). Reads off the
    loop where pages are cold; then, if that read was not enough, waits for appends and reads once
    more: when what it could return reaches ``min_bytes`` (counted, not read: ``_Available``) or at
    the deadline. What moved between the first read and this task's start counts as an append
    during the wait (Kafka's tryCompleteElseWatch checks again once watching)."""
    partitions = f.partitions
    if first is None:
        first = await _read_off_loop_if_cold(broker, f.body, f.isolation_level, f.max_bytes, f.denied, cold)
        ends = _visible_ends(broker, partitions, f.isolation_level)  # with the read: no await between
    topics_out, total, errored = first
    remaining_s = f.deadline - time.monotonic()
    if total >= f.min_bytes or errored or remaining_s <= 0 or not partitions:
        return _answer(broker, req, topics_out, total)
    available = _Available(f)
    while remaining_s > 0:
        # An append that moves nothing this fetch may return (an open transaction's records,
        # under read_committed) is not even counted.
        now = _visible_ends(broker, partitions, f.isolation_level)
        if now != ends:
            ends = now
            if available.enough(broker, partitions, f.min_bytes):
                break
        await broker.wait_for_append(partitions, remaining_s)
        remaining_s = f.deadline - time.monotonic()
    topics_out, total, errored = await _read_off_loop_if_cold(broker, f.body, f.isolation_level,
                                                             f.max_bytes, f.denied)
    return _answer(broker, req, topics_out, total)

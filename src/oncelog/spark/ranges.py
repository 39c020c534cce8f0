"""Reading one partition's offset range ``[start, end)`` with librdkafka, the way every reader here must.

Invariant: a range is complete when the consumer's **position** reaches ``end``, not when a record at
``end - 1`` arrives: transaction markers and (under read_committed) aborted records occupy offsets
but are never delivered, so a reader waiting for ``end - 1`` could wait forever. Used by the Spark
source's executors and by the sink's progress reader.

The timeout is a *stall* timeout: it fails a read whose position has not moved for ``timeout_s``,
however long the whole range takes, so a catch-up over millions of records never times out while
it progresses. A read stops below its end legitimately only while the log holds the end (an open
transaction holds the LSO below it, under read_committed); a log that ends below the range's end, or
a partition that no longer exists, is a data loss at once (:class:`RecordsLost`), not a stall.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, cast

#: The longest ``know_topic`` waits for a topic's metadata before assigning anyway.
METADATA_TIMEOUT_S = 10.0
#: How long a read's position stays put, with no end of partition reported, before the read asks
#: the cluster whether its partition still exists (a deleted one reports nothing: librdkafka waits).
GONE_CHECK_S = 1.0

log = logging.getLogger("oncelog.spark")


class RecordsLost(RuntimeError):
    """The log no longer holds an offset a read asked for: its records were deleted (retention,
    DeleteRecords) or its topic was deleted and made again, after the range was planned.
    ``available`` is the partition's ``(log start, high watermark)`` when the broker told it."""

    def __init__(self, what: str, offset: int, available: tuple[int, int] | None, advice: str = "",
                 gone: bool = False) -> None:
        have = ("its partition no longer exists" if gone else
                f"the log now holds [{available[0]}, {available[1]})" if available else "the log no longer holds it")
        super().__init__(f"reading {what}: offset {offset} is out of range ({have}): its records were deleted "
                         "(retention, DeleteRecords, or the topic deleted and made again) before they were read"
                         + (f". {advice}" if advice else ""))
        self.offset, self.available = offset, available


def know_topic(consumer: Any, topic: str, timeout_s: float) -> None:
    """Fetch ``topic``'s metadata into ``consumer`` before it is first assigned a partition of it.

    librdkafka (2.16) does not ask for the metadata of a topic it meets first in ``assign()``: a
    consumer that has already served another topic (a pooled one, or one reading several topics)
    waits for its once-a-second scan of unknown topics, up to 1 s per new topic (scratch
    ``assigntime.py``: 999 ms every time, 13 ms with the metadata fetched first). A fresh consumer
    is spared only because its first, full metadata request lists every topic. A consumer with a
    ``known_topics`` set (``clients.ConsumerPool``'s) asks once per topic, others every time. A
    consumer's metadata request creates no topic (librdkafka's ``allow.auto.create.topics`` is off
    for consumers unless the user turns it on). A failure is left to the read to report."""
    from confluent_kafka import KafkaException

    known: set[str] | None = getattr(consumer, "known_topics", None)
    if known is not None and topic in known:
        return
    try:
        consumer.list_topics(topic, timeout=timeout_s)
    except KafkaException:
        return
    if known is not None:
        known.add(topic)


def consume_range(consumer: Any, topic: str, partition: int, start: int, end: int, timeout_s: float,
                  max_messages: int, poll_timeout_s: float = 0.2, what: str = "",
                  clock: Callable[[], float] = time.monotonic, skip_lost: bool = False,
                  lost_advice: str = "", renew: Callable[[Any], Any] | None = None) -> Iterator[list[Any]]:
    """Yield lists of the delivered messages of ``[start, end)``, in offset order.

    ``consumer`` is a confluent-kafka Consumer with ``enable.partition.eof`` on and
    ``auto.offset.reset=error``; this assigns it to ``topic``/``partition`` at ``start``. Raises
    TimeoutError if the position stays at one offset below ``end`` for ``timeout_s`` while the log
    holds ``end`` (an open transaction holding the LSO below the end, under read_committed),
    RuntimeError on a consumer error.

    Records of the range the log no longer holds raise :class:`RecordsLost`, whose message ends
    with ``lost_advice``: those below the log's start (deleted after the range was planned), those
    at or past the log's end (a partition end below ``end``: the topic made again, or the log's tail
    lost), and all of a partition that no longer exists. With ``skip_lost`` they are skipped with a
    warning instead, as Spark's Kafka source does under ``failOnDataLoss=false``: the read goes on
    from the log's start, or ends when nothing of the range is left (the range and the log's offsets
    no longer overlap). Only the high watermark decides that the log ends below ``end``: the one the
    fetch that reported the end of the partition carried, confirmed by asking the broker again.

    ``renew(spent)`` (the caller disposes of ``spent`` and returns a new consumer of the same
    configuration) answers librdkafka's MSG_SIZE_TOO_LARGE when the read moved since the last
    renewal: librdkafka doubles a partition's fetch size each time a fetch yields no record and
    never lowers it, and fails at 1 GiB. A compacted log makes such fetches: a batch whose records
    all lie below the fetch offset (the last batch of a segment, emptied at its end by the cleaner),
    which Kafka answers too. A consumer that reads many ranges of one partition (a pooled one) met
    enough of them to fail the query; a new consumer starts again from the configured size. Spark's
    Kafka source counts such offsets as invisible, never as an error.
    """
    from confluent_kafka import KafkaError, Message, TopicPartition

    # Unbound methods: map() calls them without a Python frame. A delivered record always has an offset.
    error_of, offset_of = Message.error, cast(Callable[[Any], int], Message.offset)
    what = what or f"{topic}-{partition} [{start}, {end})"
    know_topic(consumer, topic, min(timeout_s, METADATA_TIMEOUT_S))
    consumer.assign([TopicPartition(topic, partition, start)])
    position = start
    last_move = clock()
    lost_the_rest = False
    renewed_at: int | None = None  # the position of the last renewal of the consumer
    gone_checked = last_move

    def go_on_past_loss(available: tuple[int, int] | None) -> None:
        """Records of the range are gone: raise (``_past_lost``), or go on from where it says, or end
        the read when nothing of the range is left."""
        nonlocal position, lost_the_rest
        resume = _past_lost(position, end, what, skip_lost, available, lost_advice)
        if resume is None:
            lost_the_rest = True
        else:
            position = resume
            consumer.assign([TopicPartition(topic, partition, position)])

    while position < end and not lost_the_rest:
        if clock() - last_move > timeout_s:
            raise TimeoutError(f"reading {what}: stuck at offset {position} below {end} for {timeout_s:g}s")
        before = position
        at_eof = False
        # Ask for no more than the range holds, so the call returns as soon as the range is complete.
        msgs = consumer.consume(num_messages=max(1, min(max_messages, end - position)), timeout=poll_timeout_s)
        if msgs and not any(map(error_of, msgs)):
            # The common case, checked per call rather than per message: records only, every one inside
            # the range (the list is kept whole) or some outside it (kept by offset).
            offsets = list(map(offset_of, msgs))
            low, high = min(offsets), max(offsets)
            position = max(position, high + 1)
            out = msgs if start <= low and high < end else [m for m, o in zip(msgs, offsets, strict=True)
                                                            if start <= o < end]
        else:
            out = []
            for m in msgs:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        position = max(position, m.offset() or 0)
                        at_eof = True
                        continue
                    if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        go_on_past_loss(_available(consumer, topic, partition))
                        break  # the consumer fetches nothing more of the partition until it is assigned again
                    if err.code() == KafkaError.MSG_SIZE_TOO_LARGE and renew is not None and renewed_at != position:
                        renewed_at = position
                        consumer = renew(consumer)
                        know_topic(consumer, topic, min(timeout_s, METADATA_TIMEOUT_S))
                        consumer.assign([TopicPartition(topic, partition, position)])
                        break
                    raise RuntimeError(f"reading {what}: {err}")
                off = int(m.offset() or 0)
                position = max(position, off + 1)
                if start <= off < end:
                    out.append(m)
        if out:
            yield out
        if not msgs:
            # Control markers at the tail are consumed silently; the position tells us.
            pos = consumer.position([TopicPartition(topic, partition)])[0].offset
            if pos >= 0:
                position = max(position, pos)
        if position > before:
            last_move = clock()
        if position < end and not lost_the_rest:
            lost = None
            if at_eof:
                lost = _log_ends_below(consumer, topic, partition, position, end)
            elif clock() - max(last_move, gone_checked) >= GONE_CHECK_S:
                gone_checked = clock()
                if _partition_gone(consumer, topic, partition):
                    _past_lost(position, end, what, skip_lost, None, lost_advice, gone=True)
                    lost_the_rest = True
            if lost is not None:
                go_on_past_loss(lost)


def _available(consumer: Any, topic: str, partition: int) -> tuple[int, int] | None:
    """The partition's ``(log start, high watermark)`` as the broker says it now, or None."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=METADATA_TIMEOUT_S,
                                                   cached=False)
    except KafkaException:
        return None
    return int(low), int(high)


def _log_ends_below(consumer: Any, topic: str, partition: int, position: int, end: int) -> tuple[int, int] | None:
    """At an end of partition reported at ``position`` below ``end``: the partition's ``(log start,
    end)`` when its log ends below ``end`` and holds nothing past ``position``, so ``[position, end)``
    cannot be read (a data loss); None while the read should wait.

    The high watermark decides, not the LSO: under read_committed the end of partition is the LSO,
    which an open transaction holds below a range's end (the progress reader reads to the high
    watermark and waits for such transactions). The fetch that reported the end of the partition
    left its high watermark in the consumer's cache; a cached one below ``end`` is confirmed by
    asking the broker again (one that does not answer, or whose log has grown past ``position``
    since, is not a loss)."""
    from confluent_kafka import KafkaException, TopicPartition

    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition), cached=True)
    except KafkaException:
        return None
    if high < 0 or high >= end:
        return None
    available = _available(consumer, topic, partition)
    if available is None or available[1] > position or available[1] >= end:
        return None
    return available


def _partition_gone(consumer: Any, topic: str, partition: int) -> bool:
    """Whether the cluster says ``topic``'s ``partition`` no longer exists: its topic deleted, or made
    again with fewer partitions (a fresh metadata request). A cluster that does not answer, or a
    topic that is there but not ready (no leader yet), is not a loss."""
    from confluent_kafka import KafkaError, KafkaException

    try:
        md = consumer.list_topics(topic, timeout=METADATA_TIMEOUT_S)
    except KafkaException:
        return False
    tm = md.topics.get(topic)
    if tm is None:
        return True
    if tm.error is not None:
        return bool(tm.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART)
    return partition not in tm.partitions


def _past_lost(position: int, end: int, what: str, skip_lost: bool, available: tuple[int, int] | None,
               advice: str, gone: bool = False) -> int | None:
    """Where a read goes on once the log no longer holds ``position`` (``available`` is what it
    holds; ``gone``: the partition no longer exists): raises :class:`RecordsLost` unless
    ``skip_lost``; else the offset to read from (the log's start, or ``position`` itself if the log
    holds it again: a topic made again and refilled), or None when nothing of ``[position, end)`` is
    left. The three cases and their warnings are Spark's
    (``KafkaDataConsumer.getEarliestAvailableOffsetBetween``)."""
    if not skip_lost or (available is None and not gone):
        raise RecordsLost(what, position, available, advice, gone=gone)
    if gone or available is None:
        log.warning("reading %s: the partition no longer exists (its topic deleted, or made again with fewer "
                    "partitions): records [%d, %d) are skipped (failOnDataLoss=false); some data may have been "
                    "lost", what, position, end)
        return None
    low, high = available
    if position >= high or low >= end:
        log.warning("reading %s: offset %d is out of range and the log now holds [%d, %d): records [%d, %d) "
                    "are skipped (failOnDataLoss=false); some data may have been lost", what, position, low, high,
                    position, end)
        return None
    if position >= low:
        log.warning("reading %s: offset %d was out of range and is back (the topic made again?); some data may "
                    "have been lost (failOnDataLoss=false)", what, position)
        return position
    log.warning("reading %s: offset %d is out of range and the log now starts at %d: records [%d, %d) are "
                "skipped (failOnDataLoss=false); some data may have been lost", what, position, low, position, low)
    return low

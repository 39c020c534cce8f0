"""Storage errors. The server maps each to a Kafka error code; none of them may corrupt stored data."""

from __future__ import annotations

from collections.abc import Sequence


class StorageError(Exception):
    """Base class: an operation was refused and nothing was changed."""


class ReadWouldBlock(Exception):
    """A read asked not to wait (``nowait``) needs pages that are not in memory. ``fd``,
    ``position`` and ``length`` say what to read off the event loop before trying again."""

    def __init__(self, fd: int, position: int, length: int) -> None:
        super().__init__(f"read of {length} bytes at {position} of fd {fd} would wait for the disk")
        self.fd, self.position, self.length = fd, position, length


class TopicExistsError(StorageError):
    pass


class InvalidTopicError(StorageError):
    pass


class InvalidPartitionsError(StorageError):
    pass


class InvalidConfigError(StorageError):
    pass


class PartitionsNotBuiltError(StorageError):
    """A new topic's or partition's files could not be made (no file descriptor left, a full disk);
    what was made of them is closed and removed again."""


class RecordTooLargeError(StorageError):
    pass


class OffsetOutOfRangeError(StorageError):
    pass


class InvalidTimestampError(StorageError):
    """A CreateTime record outside message.timestamp.before/after.max.ms (INVALID_TIMESTAMP)."""


class ProducerStateError(StorageError):
    """An append refused by the producer state (idempotence, epochs, transactions).

    ``error_code`` is the Kafka error code the client must see.
    """

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message)
        self.error_code = error_code


class KeylessRecordError(ProducerStateError):
    """Records without a key for a compacted topic (Kafka's LogValidator refuses them: INVALID_RECORD).

    ``record_errors`` holds (index in the batch, message) for each of them: the Produce response
    names them, so that clients fail exactly those records (librdkafka fails the others of the
    batch with _INVALID_DIFFERENT_RECORD).
    """

    def __init__(self, message: str, record_errors: Sequence[tuple[int, str]] = ()) -> None:
        super().__init__(87, message)  # INVALID_RECORD
        self.record_errors = list(record_errors)

    @classmethod
    def of(cls, topic_partition: str, indexes: Sequence[int]) -> KeylessRecordError:
        """The error for these keyless records of one batch, worded as Kafka's LogValidator words it."""
        each = f"Compacted topic cannot accept message without key in topic partition {topic_partition}"
        shown = ", ".join(f"RecordError(batchIndex={i}, message='{each}')" for i in indexes[:3])
        return cls(f"One or more records have been rejected due to {len(indexes)} record errors in total, "
                   f"and only showing the first three errors at most: [{shown}]", [(i, each) for i in indexes])


class SegmentRollRefusedError(StorageError):
    """A client's append would roll a segment while too few file descriptors are left
    (``storage.descriptors``): nothing was appended."""


class DiskFullError(StorageError):
    """A client's append was refused, or cut short by the disk, for want of free space: nothing of it
    was appended (a short write is truncated away), and the log directory stays online."""

"""Storage errors. The server maps each to a Kafka error code; none of them may corrupt stored data."""

from __future__ import annotations


class StorageError(Exception):
    """Base class: an operation was refused and nothing was changed."""


class TopicExistsError(StorageError):
    pass


class InvalidTopicError(StorageError):
    pass


class InvalidPartitionsError(StorageError):
    pass


class InvalidConfigError(StorageError):
    pass


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
    """A record without a key for a compacted topic (Kafka's LogValidator refuses it: INVALID_RECORD)."""

    def __init__(self, message: str) -> None:
        super().__init__(87, message)  # INVALID_RECORD

"""The three delivery guarantees of the `oncelog` sink and the producer settings each one needs.

- ``exactly_once``: one transactional producer per (sink, Spark partition), whose transaction holds
  the partition's output *and* a progress record; a replayed (batch, partition) already committed is
  skipped, after checking its row count. See docs/design/spark-sink.md.
- ``at_least_once``: idempotent producer (acks=all, retries), no transactions: a replayed batch is
  written again, so a driver crash after the write and before Spark's commit duplicates it.
- ``at_most_once``: the progress record is committed *before* the input is read, in a transaction
  of the same fenced transactional id as exactly_once (so of two concurrent attempts only one can
  mark the batch, and only the one that marked it writes); the output then goes as the input
  arrives, with acks=0 and no retries. A replayed batch is skipped, so whatever the crash lost
  stays lost.
"""

from __future__ import annotations

import enum
from typing import Any

#: Kafka's default ``transaction.max.timeout.ms`` (a broker setting): the most a producer may ask for.
BROKER_MAX_TRANSACTION_TIMEOUT_MS = 900_000
#: The least a sized transaction timeout is (librdkafka's and Kafka's default).
BASE_TRANSACTION_TIMEOUT_MS = 60_000


class Guarantee(enum.StrEnum):
    exactly_once = "exactly_once"
    at_least_once = "at_least_once"
    at_most_once = "at_most_once"

    @classmethod
    def parse(cls, value: str | None) -> Guarantee:
        text = (value or cls.exactly_once.value).strip().lower().replace("-", "_")
        try:
            return cls(text)
        except ValueError:
            raise ValueError(f"option 'processing.guarantee' must be one of {[g.value for g in cls]}, "
                             f"not {value!r}") from None

    @property
    def uses_progress(self) -> bool:
        return self is not Guarantee.at_least_once


def transaction_timeout_ms(rows: int, nbytes: int, explicit_ms: int | None = None,
                           max_ms: int = BROKER_MAX_TRANSACTION_TIMEOUT_MS) -> int:
    """``transaction.timeout.ms`` for a task about to write ``rows`` records of ``nbytes`` bytes.

    The exactly_once sink spools a task's input before opening its transaction, so it lasts only
    as long as producing the spooled records: 60 s plus 0.1 ms per record and 1 s per MB (a slow
    floor of 10 000 records/s and 1 MB/s), capped at Kafka's default broker maximum of 15 minutes.
    An explicit ``transaction.timeout.ms`` option is used as it is.
    """
    if explicit_ms is not None:
        return explicit_ms
    return min(max_ms, BASE_TRANSACTION_TIMEOUT_MS + rows // 10 + nbytes // 1000)


def producer_config(guarantee: Guarantee, base: dict[str, Any], transactional_id: str | None,
                    transaction_timeout_ms: int) -> dict[str, Any]:
    """librdkafka producer settings for ``guarantee`` on top of the user's ``kafka.*`` options.

    For at_most_once this is the *output* producer; its progress mark goes through
    :func:`marker_config`.
    """
    conf = {k: v for k, v in base.items() if k not in ("isolation.level", "group.id")}
    if guarantee is Guarantee.exactly_once:
        if not transactional_id:
            raise ValueError("exactly_once needs a transactional id")
        conf.update({"transactional.id": transactional_id, "enable.idempotence": True, "acks": "all",
                     "transaction.timeout.ms": transaction_timeout_ms})
    elif guarantee is Guarantee.at_least_once:
        conf.update({"enable.idempotence": True, "acks": "all"})
    else:
        conf.update({"enable.idempotence": False, "acks": 0, "retries": 0})
    return conf


def marker_config(base: dict[str, Any], transactional_id: str, transaction_timeout_ms: int) -> dict[str, Any]:
    """The fenced, transactional producer that commits a progress record (both progress guarantees)."""
    return producer_config(Guarantee.exactly_once, base, transactional_id, transaction_timeout_ms)

"""The three delivery guarantees of the `oncelog` sink and the producer settings each one needs.

- ``exactly_once``: one transactional producer per (query, Spark partition), whose transaction holds
  the partition's output *and* a progress record; a replayed (batch, partition) already committed is
  skipped. See docs/design/spark-sink.md.
- ``at_least_once``: idempotent producer (acks=all, retries), no transactions: a replayed batch is
  written again, so a driver crash after the write and before Spark's commit duplicates it.
- ``at_most_once``: a progress record is written *before* the output, which is sent with acks=0 and
  no retries; a replayed batch is skipped, so whatever the crash lost stays lost.
"""

from __future__ import annotations

import enum
from typing import Any


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
            raise ValueError(f"processing.guarantee must be one of {[g.value for g in cls]}, not {value!r}") from None


def producer_config(guarantee: Guarantee, base: dict[str, Any], transactional_id: str | None,
                    transaction_timeout_ms: int) -> dict[str, Any]:
    """librdkafka producer settings for ``guarantee`` on top of the user's ``kafka.*`` options."""
    conf = dict(base)
    conf.pop("isolation.level", None)
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

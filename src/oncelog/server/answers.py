"""Answers a handler gives later, and what the connection may do meanwhile."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from oncelog.server.broker import Broker


class AnsweredWhenDurable:
    """A handler's answer whose request has made every change it will make (its records are
    appended, its state updated): only the acknowledgement waits, for the fsync that makes those
    changes durable (``flush_every_append``, ``flush.messages``): each ``(log, offset)`` of
    ``durability`` synced below its offset (``Broker.durable``, a group commit).

    Invariant the handler keeps: awaiting it changes nothing but the time the answer goes out. So a
    connection may handle the requests queued after it, and the ones that arrive while it waits;
    their answers still go out in request order, after this one (``KafkaConnection._drain``). A
    client that pipelines its produce requests then shares group-commit fsyncs among them instead of
    paying one fsync a request.

    Awaiting it returns ``response`` at once when the logs are already synced that far (a group
    commit has covered it), without a coroutine; otherwise it waits for ``Broker.durable``. Nothing
    runs for it until then (so one never awaited, its client gone, leaves nothing behind): whoever
    appended has already asked for the fsync (:meth:`after_appends`: the produce handler, the
    coordinator's group records). A connection that drops it unawaited has nothing to close. A
    connection that wants to handle new requests while it waits uses :meth:`fsync_future` instead,
    which needs no task.
    """

    __slots__ = ("_broker", "durability", "response")

    def __init__(self, broker: Broker, durability: list[tuple[Any, int]], response: Any) -> None:
        self._broker = broker
        self.durability = durability
        self.response = response

    @classmethod
    def after_appends(cls, broker: Broker, durability: list[tuple[Any, int]], response: Any) -> AnsweredWhenDurable:
        """The answer of a handler that has just appended to each log of ``durability``: asks for
        their group-commit fsyncs now (``Broker.sync_soon``), so they start at the append, not when
        the connection's turn comes to await this answer."""
        for plog, _ in durability:
            broker.sync_soon(plog)
        return cls(broker, durability, response)

    def answering(self, response: Any) -> AnsweredWhenDurable:
        """The same wait, answering ``response`` (a handler's answer after records a coordinator
        appended: ``Coordination.apply_group_records``)."""
        return AnsweredWhenDurable(self._broker, self.durability, response)

    def durable_now(self) -> bool:
        """Whether every change it answers for is durable already (awaiting it would not wait)."""
        return all(plog.synced_end >= offset for plog, offset in self.durability)

    async def _wait(self) -> Any:
        for plog, offset in self.durability:
            await self._broker.durable(plog, offset)
        return self.response

    def fsync_future(self) -> asyncio.Future[None] | None:
        """None when :meth:`durable_now`; else a future that is done when a group-commit fsync has
        moved it on (one log of it further synced, or its disk failed): ask again then. Waiting on
        it needs no task of its own, so a connection can wait for it beside new requests."""
        for plog, offset in self.durability:
            fut = self._broker.synced_future(plog, offset)
            if fut is not None:
                return fut
        return None

    def __await__(self) -> Generator[Any, None, Any]:
        if self.durable_now():
            return self.response
        return (yield from self._wait().__await__())

"""Answers a handler gives later, and what the connection may do meanwhile."""

from __future__ import annotations

from collections.abc import Coroutine, Generator
from typing import Any


class AnsweredWhenDurable:
    """A handler's answer whose request has made every change it will make (its records are
    appended, its state updated): only the acknowledgement waits, for the fsync that makes those
    changes durable (``flush_every_append``, ``flush.messages``).

    Invariant the handler keeps: awaiting it changes nothing but the time the answer goes out. So a
    connection may handle the requests queued after it while it waits; their answers still go out in
    request order, after this one (``KafkaConnection._drain``). A client that pipelines its produce
    requests then shares one group-commit fsync among them instead of paying one fsync a request.
    """

    __slots__ = ("_coro",)

    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None:
        self._coro = coro

    def __await__(self) -> Generator[Any, None, Any]:
        return self._coro.__await__()

    def close(self) -> None:
        """Never to be awaited (the connection is gone): the changes stand, the answer is dropped."""
        self._coro.close()

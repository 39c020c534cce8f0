"""Kafka clients kept for the life of a Python worker process and lent to one task at a time.

Spark reuses its Python worker processes across tasks (``spark.python.worker.reuse``, on by
default), so a consumer or producer made by one task can serve the next one instead of paying for a
new client (threads, connections, metadata) per task.

Invariants:
- An idle client is in a pool only while no task uses it: :meth:`ClientPool.take` removes it, and
  only the borrower may :meth:`~ClientPool.give` it back.
- A client is given back only in a state the next task can start from (a consumer that read its
  range to the end: the next ``assign()`` resets its position; a producer with nothing in flight).
  A client that saw any error is closed, never pooled. What a transactional producer must also
  satisfy is the sink's business (:mod:`oncelog.spark.sink`).
- Keys are the full client configuration (plus, for the sink, the transactional id), so a client
  is reused only for the very settings it was made with.
- At most ``max_idle`` idle clients per pool; the least recently returned is closed first.

Safe to use from several threads (tests run attempts concurrently in one process).
"""

from __future__ import annotations

import atexit
import functools
import gc
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


def config_key(config: Mapping[str, Any], *extra: Hashable) -> tuple[Hashable, ...]:
    return (*extra, *sorted((str(k), repr(v)) for k, v in config.items()))


class ClientPool(Generic[T]):
    def __init__(self, close: Callable[[T], None], max_idle: int = 8) -> None:
        self._close = close
        self.max_idle = max_idle
        self._idle: OrderedDict[tuple[Hashable, int], T] = OrderedDict()
        self._lock = threading.Lock()
        self._serial = 0
        #: clients lent out from the pool, and clients made because none was idle (for tests and the bench)
        self.reused = 0
        self.created = 0

    def take(self, key: Hashable) -> T | None:
        """An idle client made for ``key``, now owned by the caller, or None."""
        with self._lock:
            for k in reversed(self._idle):
                if k[0] == key:
                    self.reused += 1
                    return self._idle.pop(k)
            self.created += 1
        return None

    def give(self, key: Hashable, client: T) -> None:
        with self._lock:
            self._serial += 1
            self._idle[(key, self._serial)] = client
            evicted = []
            while len(self._idle) > self.max_idle:
                evicted.append(self._idle.popitem(last=False)[1])
        for c in evicted:
            self.discard(c)

    def discard(self, client: T) -> None:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._close(client)
        except Exception:  # closing a broken or fenced client must not hide the caller's error
            pass

    def idle(self, key: Hashable | None = None) -> list[T]:
        with self._lock:
            return [c for k, c in self._idle.items() if key is None or k[0] == key]

    def clear(self) -> None:
        """Close every idle client (what a fresh Python worker starts with)."""
        with self._lock:
            idle = list(self._idle.values())
            self._idle.clear()
        for c in idle:
            self.discard(c)


def _close_consumer(c: Any) -> None:
    c.close()


@functools.cache
def _consumer_class() -> type:
    """confluent-kafka's Consumer with a ``known_topics`` set (the C type takes no attributes);
    made on first use, as this module imports confluent-kafka only when a client is made."""
    from confluent_kafka import Consumer

    class PooledConsumer(Consumer):
        """A consumer that remembers the topics whose metadata it has fetched (``ranges.consume_range``)."""

        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__(config)
            self.known_topics: set[str] = set()

    return PooledConsumer


class ConsumerPool(ClientPool[Any]):
    """librdkafka consumers by configuration; :meth:`take` makes one when none is idle."""

    def take(self, config: Mapping[str, Any]) -> Any:  # type: ignore[override]
        c = super().take(config_key(config))
        return c if c is not None else self.make(config)

    @staticmethod
    def make(config: Mapping[str, Any]) -> Any:
        """A new consumer of ``config``, never an idle one (``ranges.consume_range``'s ``renew``)."""
        return _consumer_class()(dict(config))

    def give(self, config: Mapping[str, Any], consumer: Any) -> None:  # type: ignore[override]
        try:
            consumer.unassign()
        except Exception:
            self.discard(consumer)
            return
        super().give(config_key(config), consumer)


#: The source's executor consumers and the progress log's readers.
CONSUMERS = ConsumerPool(_close_consumer)


_heap_frozen = False
_freeze_lock = threading.Lock()
#: The collector's youngest-generation threshold in a settled worker (CPython's default is 700).
WORKER_GC_THRESHOLD0 = 100_000


def in_spark_worker() -> bool:
    """True in a Python worker that Spark started for a task (PySpark sets the flag while it sets the
    task's files up), False in a driver or any other process."""
    try:
        from pyspark.core.files import SparkFiles
    except ImportError:
        return False
    return bool(getattr(SparkFiles, "_is_running_on_worker", False))


def settle_worker() -> bool:
    """Once per Spark Python worker: import the libraries a task uses, then ``gc.freeze()``.

    PySpark's daemon runs ``gc.collect()`` after every task of a reused worker. With PySpark,
    pyarrow, confluent-kafka and this package loaded, each of those full collections walks about
    47,800 objects that live as long as the process: 53-145 ms a task in a 2-core pipeline run,
    0.4-0.9 ms once frozen; and a pipeline task runs in two workers (the source's and the sink's).
    Freezing moves the objects alive now into the collector's permanent generation, so later
    collections walk only what tasks made since.

    It also raises the youngest generation's threshold from 700 to :data:`WORKER_GC_THRESHOLD0`
    net allocations of tracked objects. A task holds thousands of short-lived containers at a time
    (the source's librdkafka messages, 8,192 to an Arrow batch, each with its timestamp tuple): at
    700, automatic collections ran every few hundred records, walked those objects again and again
    as they aged into the older generations: 0.2 us a record read, timed alone (a tenth of the
    workers' busy samples in py-spy). At 100,000 they mostly die, by reference counting, before
    any collection sees them. Cyclic garbage then waits for at most that many allocations.

    Invariants: it freezes at most once per process and never outside a Spark worker (a driver,
    or a test calling the sink in process, keeps its collector as it was). Reference counting still
    frees frozen objects; only a reference cycle among objects alive at the freeze outlives its
    last use, so the cost is at most what existed once, never a growth per task. Returns whether
    this call froze.
    """
    global _heap_frozen
    if _heap_frozen or not in_spark_worker():
        return False
    with _freeze_lock:
        if _heap_frozen:
            return False
        import confluent_kafka  # noqa: F401  (a task's imports, frozen with the rest)
        import pyarrow  # noqa: F401

        gc.collect()  # what is garbage already is freed, not frozen
        gc.freeze()
        gc.set_threshold(WORKER_GC_THRESHOLD0, *gc.get_threshold()[1:])
        _heap_frozen = True
        return True


def clear_all() -> None:
    """Close every pooled client of this process: consumers here, producers in the sink."""
    CONSUMERS.clear()
    from oncelog.spark import sink

    sink.PRODUCERS.clear()
    sink.TXN_PRODUCERS.clear()


atexit.register(clear_all)

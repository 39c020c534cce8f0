"""A broker in the test process, driven without sockets: requests are encoded with kio exactly as a
client would send them, decoded by the broker's own decoder, handled, and the response is encoded and
decoded again. Time is a ManualClock, so timeouts are driven by the test.

Used by broker-level regression tests, the model-based transaction test and the power-cut tests;
``restart()`` closes nothing (a crash) or everything (a clean stop) and loads the same data dir.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from oncelog.clock import ManualClock
from oncelog.protocol import records as rb
from oncelog.protocol.messages import (
    build,
    decode_request,
    decode_response,
    encode_request,
    encode_result,
    request_type,
)
from oncelog.server.broker import Broker
from oncelog.server.config import BrokerConfig

API_PRODUCE = 0
API_FETCH = 1
API_LIST_OFFSETS = 2
API_INIT_PRODUCER_ID = 22
API_ADD_PARTITIONS_TO_TXN = 24
API_ADD_OFFSETS_TO_TXN = 25
API_END_TXN = 26
API_WRITE_TXN_MARKERS = 27
API_TXN_OFFSET_COMMIT = 28
API_DESCRIBE_PRODUCERS = 61


@dataclass
class Session:
    """What a connection tells handlers about its client (server.connection.KafkaConnection)."""

    principal: str
    host: str = "127.0.0.1"
    throttle_ms: int = 0


@dataclass
class Started:
    """A request being handled (``InProcessBroker.start``)."""

    task: asyncio.Task[Any]
    api_key: int
    version: int
    correlation_id: int


class InProcessBroker:
    def __init__(self, data_dir: Path, clock: ManualClock | None = None, **config: Any) -> None:
        self.data_dir = data_dir
        self.clock = clock or ManualClock(1_700_000_000_000)
        self.config = BrokerConfig(data_dir=data_dir, **{"auto_create_topics_enable": True, **config})
        self.loop = asyncio.new_event_loop()
        self.broker = self._open()
        self._corr = 0

    def _open(self) -> Broker:
        return Broker(replace(self.config), clock=self.clock)

    # --- lifecycle ---------------------------------------------------------------------------------
    def crash(self) -> None:
        """Drop the broker without closing anything (kill -9: file descriptors simply go away)."""
        for plog in self.broker.logs.partitions().values():
            for seg in plog.segments:
                seg.abandon()
        self.broker.release_data_dir()

    def restart(self, *, clean: bool = False) -> None:
        if clean:
            self.broker.close()
        else:
            self.crash()
        self.broker = self._open()

    def close(self) -> None:
        self.broker.close()
        self.loop.close()

    # --- requests ----------------------------------------------------------------------------------
    def call(self, api_key: int, version: int, fields: dict[str, Any], client_id: str = "inproc",
             principal: str | None = None) -> Any:
        """Send one request (as ``principal``, e.g. ``User:alice``, if given); return the decoded
        response (None for acks=0 produce)."""
        return self.finish(self.start(api_key, version, fields, client_id, principal))

    def start(self, api_key: int, version: int, fields: dict[str, Any], client_id: str = "inproc",
              principal: str | None = None) -> Started:
        """Send one request and do not wait: its handling runs whenever the loop does (``finish``
        it, or let other calls run the loop meanwhile)."""
        self._corr += 1
        frame = encode_request(api_key, version, self._corr, build(request_type(api_key, version), fields),
                               client_id=client_id)
        request = decode_request(frame[4:], self.broker.supported_versions)
        if principal is not None:
            request = replace(request, session=Session(principal))
        return Started(self.loop.create_task(self._handle(api_key, request)), api_key, version, self._corr)

    def finish(self, started: Started) -> Any:
        """The decoded response of a started request, once its handling is done."""
        result = self.loop.run_until_complete(started.task)
        if result is None:
            return None
        api_key, version, corr = started.api_key, started.version, started.correlation_id
        data = encode_result(api_key, version, corr, result)
        if isinstance(data, list):  # a Fetch response's buffers
            data = b"".join(bytes(p) for p in data)
        return decode_response(api_key, version, data[4:])[1]

    def run_until(self, condition: Any, timeout_s: float = 10.0) -> None:
        """Run the loop (started requests, work handlers started) until ``condition()`` holds."""
        async def wait() -> None:
            while not condition():
                await asyncio.sleep(0.002)

        self.loop.run_until_complete(asyncio.wait_for(wait(), timeout_s))

    async def _handle(self, api_key: int, request: Any) -> Any:
        """On the loop, as the server's connection does: a handler may start work of its own there."""
        result = self.broker.handlers[api_key](self.broker, request)
        return await result if inspect.isawaitable(result) else result

    # --- conveniences --------------------------------------------------------------------------------
    def create_topic(self, name: str, partitions: int = 1) -> None:
        self.broker.logs.create_topic(name, partitions, {})

    def produce(self, topic: str, partition: int, records: bytes, *, transactional_id: str | None = None,
                acks: int = -1, version: int = 9) -> int:
        """Produce raw record batches; returns the partition's error code."""
        resp = self.call(API_PRODUCE, version, {
            "transactional_id": transactional_id, "acks": acks, "timeout": 30_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": records}]}]})
        if resp is None:
            return 0
        return int(resp.responses[0].partition_responses[0].error_code)

    def init_producer_id(self, transactional_id: str | None, producer_id: int = -1, producer_epoch: int = -1,
                         timeout_ms: int = 60_000) -> tuple[int, int, int]:
        r = self.call(API_INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id,
                                                 "transaction_timeout": timeout_ms,
                                                 "producer_id": producer_id, "producer_epoch": producer_epoch})
        return int(r.error_code), int(r.producer_id), int(r.producer_epoch)

    def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                       partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        by_topic: dict[str, list[int]] = {}
        for t, p in partitions:
            by_topic.setdefault(t, []).append(p)
        r = self.call(API_ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": transactional_id, "v3_and_below_producer_id": producer_id,
            "v3_and_below_producer_epoch": producer_epoch,
            "v3_and_below_topics": [{"name": t, "partitions": ps} for t, ps in by_topic.items()]})
        return {(t.name, p.partition_index): int(p.partition_error_code)
                for t in r.results_by_topic_v3_and_below for p in t.results_by_partition}

    def end_txn(self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool) -> int:
        r = self.call(API_END_TXN, 3, {"transactional_id": transactional_id, "producer_id": producer_id,
                                        "producer_epoch": producer_epoch, "committed": commit})
        return int(r.error_code)

    def fetch(self, topic: str, partition: int, offset: int = 0, *, read_committed: bool = True,
              max_bytes: int = 8 << 20) -> Any:
        r = self.call(API_FETCH, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes,
            "isolation_level": 1 if read_committed else 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": partition, "current_leader_epoch": -1, "fetch_offset": offset,
                "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": max_bytes}]}],
            "forgotten_topics_data": [], "rack_id": ""})
        return r.responses[0].partitions[0]

    def visible_values(self, topic: str, partition: int, *, read_committed: bool = True,
                       offset: int = 0) -> list[bytes]:
        """Every record value a read_committed (or read_uncommitted) consumer would deliver from
        ``offset``, in order: control records and, for read_committed, aborted transactions' records
        dropped as librdkafka drops them (by the AbortedTransactions list of each fetch)."""
        out: list[bytes] = []
        while True:
            part = self.fetch(topic, partition, offset, read_committed=read_committed)
            assert part.error_code == 0, f"fetch {topic}-{partition}@{offset}: error {part.error_code}"
            data = part.records or b""
            if not data:
                return out
            aborted: dict[int, list[int]] = {}  # producer id -> first offsets of its aborted transactions
            for a in sorted(part.aborted_transactions or [], key=lambda a: a.first_offset):
                aborted.setdefault(a.producer_id, []).append(a.first_offset)
            aborting: set[int] = set()
            for _base, header, values, control in iter_batches(data):
                if header.last_offset < offset:
                    continue
                pid = header.producer_id
                starts = aborted.get(pid)
                while starts and starts[0] <= header.base_offset:
                    starts.pop(0)
                    aborting.add(pid)
                if control is not None:
                    aborting.discard(pid)
                elif not (read_committed and header.is_transactional and pid in aborting):
                    out.extend(values)
                offset = header.last_offset + 1


def iter_batches(data: bytes) -> Iterator[tuple[int, rb.BatchHeader, list[bytes], int | None]]:
    """(base offset, header, record values, control type or None) of each whole batch in ``data``."""
    from kio.records.readers import read_batch

    for pos, header in rb.iter_headers(data):
        if header.is_control:
            yield header.base_offset, header, [], rb.control_type_of(data, pos, header)
            continue
        batch, _ = read_batch(data, pos)
        yield header.base_offset, header, [bytes(r.value or b"") for r in batch.records], None

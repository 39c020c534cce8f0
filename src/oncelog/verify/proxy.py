"""A fault-injecting TCP proxy for the Kafka protocol, usable in front of any broker.

It understands just enough of the protocol to be useful for faults: request frames (api key,
correlation id) on the way in, and the response carrying the same correlation id on the way out. So
it can drop the response to a request *after the broker processed it* (a lost acknowledgement,
"the producer-to-broker RPC failed"), delay traffic, or reset connections.

Clients must keep talking to the proxy after bootstrap: start the broker with its advertised listener
set to the proxy's address (``oncelog broker --advertised-listener``), so Metadata names the proxy.

The proxy runs its own asyncio loop in a daemon thread; the fault controls are thread-safe (they
take a lock) so synchronous tests and the workload can drive them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

API_PRODUCE = 0
API_METADATA = 3
API_FIND_COORDINATOR = 10
API_END_TXN = 26
API_ADD_PARTITIONS_TO_TXN = 24


@dataclass
class DropRule:
    api_key: int
    remaining: int
    probability: float = 1.0
    reset: bool = True


@dataclass
class ProxyStats:
    connections: int = 0
    requests: int = 0
    dropped_responses: int = 0
    resets: int = 0
    dropped_by_api: dict[int, int] = field(default_factory=dict)


class FaultProxy:
    def __init__(self, target_host: str, target_port: int, *, listen_host: str = "127.0.0.1",
                 listen_port: int = 0, seed: int = 0) -> None:
        self.target = (target_host, target_port)
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((listen_host, listen_port))
        self._sock.listen(128)
        self._sock.setblocking(False)
        self.host, self.port = self._sock.getsockname()[:2]
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._rules: list[DropRule] = []
        self._delay_s = 0.0
        self._transforms: dict[int, Callable[[Any], Any]] = {}
        self.stats = ProxyStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        # Rewrite Metadata and FindCoordinator responses so that clients keep talking to the proxy
        # whatever the broker advertises (single-broker clusters: every node maps to this proxy).
        self.rewrite_addresses = True

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # --- controls (any thread) -------------------------------------------------------------------
    def drop_responses(self, api_key: int, count: int, *, probability: float = 1.0, reset: bool = True) -> None:
        """Drop the next ``count`` responses to ``api_key`` requests (each with ``probability``); with
        ``reset`` the client's connection is also closed, as when a network path dies."""
        with self._lock:
            self._rules.append(DropRule(api_key, count, probability, reset))

    def stop_dropping(self, api_key: int) -> None:
        """Disarm what is left of the drop rules for ``api_key``."""
        with self._lock:
            self._rules = [r for r in self._rules if r.api_key != api_key]

    def set_delay_ms(self, delay_ms: int) -> None:
        with self._lock:
            self._delay_s = delay_ms / 1000

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._delay_s = 0.0

    def reset_connections(self) -> None:
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self._reset_all)

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> FaultProxy:
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, sock=self._sock))
            ready.set()
            loop.run_forever()
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            # Let the connections' tasks finish their cleanup instead of being destroyed pending.
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

        self._thread = threading.Thread(target=main, name="fault-proxy", daemon=True)
        self._thread.start()
        ready.wait(10)
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None:
            return

        def shutdown() -> None:
            if self._server is not None:
                self._server.close()
            self._reset_all()
            loop.stop()

        loop.call_soon_threadsafe(shutdown)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = None

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- forwarding ------------------------------------------------------------------------------
    def _reset_all(self) -> None:
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()

    def _should_drop(self, api_key: int) -> DropRule | None:
        with self._lock:
            for rule in self._rules:
                if rule.api_key == api_key and rule.remaining > 0 and self._rng.random() < rule.probability:
                    rule.remaining -= 1
                    return rule
            self._rules = [r for r in self._rules if r.remaining > 0]
        return None

    def rewrite_responses(self, api_key: int, transform: Callable[[Any], Any] | None) -> None:
        """Pass every response to ``api_key`` requests through ``transform`` (a kio response dataclass
        in, one out), or stop with None: a broker that answers oddly, for testing the checker."""
        with self._lock:
            if transform is None:
                self._transforms.pop(api_key, None)
            else:
                self._transforms[api_key] = transform

    def _point_at_proxy(self, api_key: int, resp: Any) -> Any:
        """Point every broker address in a Metadata/FindCoordinator response at this proxy."""
        import dataclasses

        if api_key == API_METADATA:
            brokers = tuple(dataclasses.replace(b, host=self.host, port=self.port) for b in resp.brokers)
            return dataclasses.replace(resp, brokers=brokers)
        if hasattr(resp, "host") and resp.port >= 0:
            return dataclasses.replace(resp, host=self.host, port=self.port)
        return resp

    def _rewrite(self, api_key: int, version: int, body: bytes, transform: Callable[[Any], Any]) -> bytes:
        """Decode a response (kio codecs), transform it, encode it again."""
        import io

        from kio.index import load_response_schema
        from kio.serial import entity_reader, entity_writer

        try:
            resp_t: Any = load_response_schema(api_key, version)
            header_t = resp_t.__header_schema__
            header, pos = entity_reader(header_t)(body, 0)
            resp, _ = entity_reader(resp_t)(body, pos)
            resp = transform(resp)
            buf = io.BytesIO()
            entity_writer(header_t)(buf, header)
            entity_writer(resp_t)(buf, resp)
            return buf.getvalue()
        except Exception:  # an unparsable response is forwarded untouched
            return body

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        try:
            broker_r, broker_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.transport.abort()
            return
        self._writers.update((client_w, broker_w))
        inflight: dict[int, tuple[int, int]] = {}

        async def upstream() -> None:
            while True:
                head = await client_r.readexactly(4)
                (size,) = struct.unpack(">i", head)
                body = await client_r.readexactly(size)
                if size >= 8:
                    api_key, version, corr = struct.unpack_from(">hhi", body)
                    inflight[corr] = (api_key, version)
                    self.stats.requests += 1
                broker_w.write(head + body)
                await broker_w.drain()

        async def downstream() -> None:
            while True:
                head = await broker_r.readexactly(4)
                (size,) = struct.unpack(">i", head)
                body = await broker_r.readexactly(size)
                corr = struct.unpack_from(">i", body)[0] if size >= 4 else -1
                api_key, version = inflight.pop(corr, (-1, -1))
                rule = self._should_drop(api_key)
                if rule is not None:
                    self.stats.dropped_responses += 1
                    self.stats.dropped_by_api[api_key] = self.stats.dropped_by_api.get(api_key, 0) + 1
                    if rule.reset:
                        self.stats.resets += 1
                        client_w.transport.abort()
                        broker_w.transport.abort()
                        return
                    continue
                with self._lock:
                    delay = self._delay_s
                if delay:
                    await asyncio.sleep(delay)
                if self.rewrite_addresses and api_key in (API_METADATA, API_FIND_COORDINATOR):
                    body = self._rewrite(api_key, version, body, functools.partial(self._point_at_proxy, api_key))
                    head = struct.pack(">i", len(body))
                with self._lock:
                    transform = self._transforms.get(api_key)
                if transform is not None:
                    body = self._rewrite(api_key, version, body, transform)
                    head = struct.pack(">i", len(body))
                client_w.write(head + body)
                await client_w.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            pass  # the proxy is stopping; ending normally keeps asyncio's stream callback quiet
        finally:
            for t in tasks:
                if t.done() and not t.cancelled():
                    t.exception()  # a closed connection ends the other direction: expected, not logged
                t.cancel()
            for w in (client_w, broker_w):
                self._writers.discard(w)
                with contextlib.suppress(Exception):
                    w.transport.abort()

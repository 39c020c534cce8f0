"""One client connection: frames in, responses out, one request at a time.

Kafka processes a connection's requests strictly in order (the socket is muted while a request is
in flight) and clients rely on responses arriving in request order. ``KafkaConnection`` keeps that
invariant with a single processing task per connection draining a queue of frames; reading pauses
when the queue grows, so a fast producer cannot make the broker buffer without bound.

Nothing a client sends may kill the broker: framing errors and unparsable requests close this
connection only; a handler bug is logged and closes this connection only.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

from oncelog.protocol.errors import (
    ErrorCode,
    MalformedRequestError,
    UnknownApiKeyError,
    UnsupportedVersionError,
)
from oncelog.protocol.frames import FrameDecoder, FrameError
from oncelog.protocol.messages import (
    API_FETCH,
    build_response,
    decode_request,
    encode_fetch_response,
    encode_response,
    peek_header,
)
from oncelog.protocol.versions import API_API_VERSIONS, api_name
from oncelog.storage.fileio import StorageOfflineError

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

_MAX_QUEUED_FRAMES = 32


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.decoder = FrameDecoder(broker.config.socket_request_max_bytes)
        self.transport: asyncio.Transport | None = None
        self.frames: deque[bytes] = deque()
        self.task: asyncio.Task[None] | None = None
        self.paused = False
        self.closed = False
        self.peer = "?"

    # --- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.broker.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.broker.connections.discard(self)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        try:
            frames = self.decoder.receive_data(data)
        except FrameError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.close()
            return
        if not frames:
            return
        self.frames.extend(frames)
        if len(self.frames) >= _MAX_QUEUED_FRAMES and not self.paused and self.transport is not None:
            self.transport.pause_reading()
            self.paused = True
        if self.task is None or self.task.done():
            self.task = asyncio.get_running_loop().create_task(self._drain())

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # --- request processing -------------------------------------------------------------------
    async def _drain(self) -> None:
        while self.frames and not self.closed:
            frame = self.frames.popleft()
            if self.paused and len(self.frames) < _MAX_QUEUED_FRAMES // 2 and self.transport is not None:
                self.transport.resume_reading()
                self.paused = False
            try:
                out = await self._handle_frame(frame)
            except asyncio.CancelledError:
                raise
            except StorageOfflineError as exc:
                log.error("closing the connection from %s: %s", self.peer, exc)
                self.broker.storage_failed(exc)
                self.close()
                return
            except Exception:
                log.exception("internal error handling a request from %s; closing the connection", self.peer)
                self.close()
                return
            if out is not None and self.transport is not None and not self.closed:
                if isinstance(out, list):
                    self.transport.writelines(out)  # a Fetch response with its record sets unjoined
                else:
                    self.transport.write(out)

    async def _handle_frame(self, frame: bytes) -> bytes | list[Any] | None:
        broker = self.broker
        try:
            request = decode_request(frame, broker.supported_versions)
        except UnsupportedVersionError as exc:
            return self._unsupported(frame, exc)
        except MalformedRequestError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.close()
            return None
        handler = broker.handlers[request.api_key]
        result: Any = handler(broker, request)
        if inspect.isawaitable(result):
            result = await result
        if result is None:  # acks=0 produce: no response at all
            return None
        if request.api_key == API_FETCH and isinstance(result, dict):
            return encode_fetch_response(request.api_version, request.correlation_id, result)
        if isinstance(result, dict):
            result = build_response(request.api_key, request.api_version, result)
        return encode_response(request.api_key, request.api_version, request.correlation_id, result)

    def _unsupported(self, frame: bytes, exc: UnsupportedVersionError) -> bytes | None:
        api_key, api_version, correlation_id = peek_header(frame)
        if api_key == API_API_VERSIONS:
            # Kafka answers an unknown ApiVersions version with a v0 body carrying error 35 and the
            # supported keys, so the client can pick a version it shares with us.
            body = build_response(API_API_VERSIONS, 0, {
                "error_code": ErrorCode.unsupported_version,
                "api_keys": self.broker.api_version_entries(),
            })
            return encode_response(API_API_VERSIONS, 0, correlation_id, body)
        kind = "unknown api key" if isinstance(exc, UnknownApiKeyError) else "unsupported version"
        log.warning("closing connection from %s: %s %s v%d", self.peer, kind, api_name(api_key), api_version)
        self.close()
        return None

"""One client connection: frames in, responses out, requests handled in order.

Kafka processes a connection's requests strictly in order (the socket is muted while a request is
in flight) and clients rely on responses arriving in request order. ``KafkaConnection`` keeps that
invariant with one queue of frames per connection and at most one place draining it: requests whose
handling completes without waiting (most of them) are handled right in ``data_received``; at the first
that must wait (an fsync, a delayed fetch, a full send buffer, a throttle) a single task takes over
the queue from that request on, and ``data_received`` only queues frames until that task has
finished. Handling inline saves each request a task and a pass of the event loop.

One kind of wait does not hold the queue: a request whose changes are all made and whose answer
only waits for their fsync (``AnsweredWhenDurable``: a produce under ``flush_every_append``). The
requests queued behind it, and the ones that arrive while it waits, are handled meanwhile, in order,
and their answers are held until its answer has gone out. So a client that pipelines its produces
shares group-commit fsyncs among them, and a request's records join the next fsync as soon as it
arrives instead of after the answers before it. Handling still happens in request order; only the
acknowledgements wait together.

Memory a connection can hold, whatever the client does (the bound ``make test`` checks): one
partial frame (at most ``socket_request_max_bytes``), the queued requests (reading pauses at
``queued_max_requests_per_connection`` frames, or when every connection's queued bytes together
exceed ``queued_max_request_bytes``), and the responses the client has not read: once the
transport's buffer passes ``socket_send_buffer_high_bytes`` (asyncio's ``pause_writing``) no
further request is handled and nothing more is read until the client drains it, so at most one
response (a Fetch is capped by ``fetch_max_bytes``) lands above that mark. A client that never
reads its responses therefore costs a bounded amount, not a growing one; and many such clients
together cost at most ``queued_max_response_bytes`` plus one batch each: the bytes held by
connections past their mark shrink every Fetch's ``max_bytes`` (``Broker.response_room``).

Quotas: a response carrying a throttle time mutes the connection for that long before its next
request is handled (KIP-219). Connections beyond ``max_connections`` (or ``max_connections_per_ip``
from one address) are closed on accept; idle ones are closed after ``connections_max_idle_ms``.

Nothing a client sends may kill the broker: framing errors and unparsable requests close this
connection only; a handler bug is logged and closes this connection only.

Authentication (SASL on): until ``authenticator`` is complete, only the requests its state allows
are handled (ApiVersions, SaslHandshake, SaslAuthenticate, in Kafka's order); any other closes the
connection before it is parsed, and no frame may exceed ``sasl_server_max_receive_size``. A handler
sets ``close_after_response`` to send one last answer (a refused login) and close. ``principal`` is
``User:ANONYMOUS`` until SaslAuthenticate succeeds, then ``User:<name>``.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import time
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
    build_response,
    decode_request,
    encode_response,
    encode_result,
    peek_header,
)
from oncelog.protocol.versions import API_API_VERSIONS, api_name
from oncelog.security.sasl_server_authenticator import SaslServerAuthenticator
from oncelog.server.answers import AnsweredWhenDurable
from oncelog.server.handlers.sasl import handle_raw_token
from oncelog.storage.fileio import StorageOfflineError

if TYPE_CHECKING:
    from oncelog.server.broker import Broker

log = logging.getLogger("oncelog.server")

CLOSE_LINGER_S = 0.2  # between a connection's last answer and its close (see _close_after_linger)
WRITE_BATCH_BYTES = 256 * 1024  # responses of one pass over the queue are written together up to this


class _Pending:
    """A request whose handler must wait: its awaitable (a coroutine or a future), and the request to
    encode the result for (None for a bare SASL token, whose awaitable returns the answer frame)."""

    __slots__ = ("awaitable", "request")

    def __init__(self, request: Any, awaitable: Any) -> None:
        self.request = request
        self.awaitable = awaitable

    def discard(self) -> None:
        """Never to be awaited (the connection is gone before its task ran): close or cancel it, so
        that no coroutine is left unawaited and no future's exception unretrieved (an
        ``AnsweredWhenDurable`` runs nothing until awaited: nothing to stop)."""
        aw = self.awaitable
        if inspect.iscoroutine(aw):
            aw.close()
        elif isinstance(aw, asyncio.Future):
            aw.cancel()


def _wake(waiter: asyncio.Future[None], _done: Any = None) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _size(out: Any) -> int:
    """Bytes an answer holds: a frame, or a Fetch answer's buffers; none for no answer (acks=0) or a
    request still waiting for its answer."""
    if type(out) is list:
        return sum(len(b) for b in out)
    if out is None or isinstance(out, _Pending):
        return 0
    return len(out)


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        cfg = broker.config
        self.decoder = FrameDecoder(cfg.socket_request_max_bytes)
        self.transport: asyncio.Transport | None = None
        self.frames: deque[bytes] = deque()
        self.queued_bytes = 0
        self.task: asyncio.Task[None] | None = None
        self.reading_paused = False
        self.writable = asyncio.Event()
        self.writable.set()
        self.closed = False
        self.peer = "?"
        self.host = "?"
        self.principal = "User:ANONYMOUS"
        self.last_active = time.monotonic()
        self._max_frames = max(cfg.queued_max_requests_per_connection, 1)
        self.throttle_ms = 0  # set by a handler whose response carries a throttle time
        # SASL: None when the listener does not authenticate (PLAINTEXT/SSL).
        self.authenticator: SaslServerAuthenticator | None = broker.security.new_authenticator()
        self.close_after_response = False  # set by a handler: this response is the last one
        self._pending: list[Any] = []  # responses not yet handed to the transport (see _drain)
        self._pending_bytes = 0
        self._handoff: _Pending | None = None  # started by _drain_now, not yet taken up by its task
        # Set while the drain task waits for a held answer's fsync and would handle new requests
        # meanwhile: data_received resolves it when frames arrive (see _answer_ahead).
        self._arrival: asyncio.Future[None] | None = None
        # Answers held back behind a request waiting for its fsync (see _drain) are bounded as the
        # send buffer is: past this, the connection waits for the fsync before handling more.
        self._ahead_max_bytes = max(cfg.socket_send_buffer_high_bytes, WRITE_BATCH_BYTES)

    # --- asyncio.Protocol ---------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not an asyncio.Transport
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.host = str(peer[0]) if peer else "?"
        refusal = self.broker.admit(self)
        if refusal is not None:
            log.warning("refusing a connection from %s: %s", self.peer, refusal)
            self.closed = True
            transport.close()
            return
        high = max(self.broker.config.socket_send_buffer_high_bytes, 1)
        transport.set_write_buffer_limits(high=high, low=high // 4)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.broker.connections.discard(self)
        self.broker.unread_writers.discard(self)
        self.broker.queued_request_bytes -= self.queued_bytes
        self.queued_bytes = 0
        self.frames.clear()
        self.writable.set()
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self._handoff is not None:  # its task never ran: nothing will await it
            self._handoff.discard()
            self._handoff = None

    def pause_writing(self) -> None:
        """The client is not reading its responses: handle nothing more until it does. What its send
        buffer holds counts against every Fetch's room (``Broker.response_room``) meanwhile."""
        self.writable.clear()
        self.broker.unread_writers.add(self)
        self._update_reading()

    def resume_writing(self) -> None:
        self.writable.set()
        self.broker.unread_writers.discard(self)
        self._update_reading()

    def data_received(self, data: bytes) -> None:
        if self.close_after_response:
            return  # the last answer is out; nothing more is read
        self.last_active = time.monotonic()
        try:
            frames = self.decoder.receive_data(data)
        except FrameError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.close()
            return
        if self.authenticator is not None and not self.authenticator.complete:
            limit = self.broker.config.sasl_server_max_receive_size
            if self.decoder.buffered > limit + 4 or any(len(f) > limit for f in frames):
                log.warning("closing connection from %s: a frame above sasl.server.max.receive.size (%d bytes) "
                            "before SASL authentication completed", self.peer, limit)
                self.close()
                return
        if not frames:
            return
        self.frames.extend(frames)
        n = sum(len(f) for f in frames)
        self.queued_bytes += n
        self.broker.queued_request_bytes += n
        self._update_reading()
        if self.task is None or self.task.done():
            self._drain_now()
        elif self._arrival is not None and not self._arrival.done():
            self._arrival.set_result(None)  # the task waits for an fsync: it handles these meanwhile

    def _update_reading(self) -> None:
        """Read while the queue is short, the broker has room and the client takes its responses."""
        if self.transport is None or self.closed:
            return
        cfg = self.broker.config
        full = len(self.frames) >= self._max_frames or not self.writable.is_set() or \
            (self.frames and self.broker.queued_request_bytes > cfg.queued_max_request_bytes)
        if full and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        elif not full and self.reading_paused:
            self.transport.resume_reading()
            self.reading_paused = False

    def close(self) -> None:
        self._send_pending()  # the answers to earlier requests still go out, then the close
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _close_after_linger(self) -> None:
        """Close a little after the last answer (a refused login) was written, not at once: an answer
        and the end of the stream arriving in one read make some clients (kafka-python) report only
        the disconnect and lose the reason. Nothing more is read or handled meanwhile."""
        asyncio.get_running_loop().call_later(CLOSE_LINGER_S, self.close)

    # --- request processing -------------------------------------------------------------------
    def _next_frame(self) -> bytes:
        frame = self.frames.popleft()
        self.queued_bytes -= len(frame)
        self.broker.queued_request_bytes -= len(frame)
        self._update_reading()
        return frame

    def _drain_now(self) -> None:
        """Handle the queued frames here, without a task, while each one's handling completes at once.
        The first that must wait (a handler's awaitable, a throttle, a full send buffer) is handed with
        the rest of the queue to one task (``_drain``), so answers stay in request order."""
        while self.frames and not self.closed and self.writable.is_set():
            frame = self._next_frame()
            try:
                out = self._start_frame(frame)
            except Exception as exc:
                self._failed(frame, exc)
                return
            if isinstance(out, _Pending):  # must wait for it
                self._handoff = out
                self.task = asyncio.get_running_loop().create_task(self._drain(out, frame))
                return
            if not self._answered(out):
                return
            if self.throttle_ms > 0:
                self.task = asyncio.get_running_loop().create_task(self._drain())
                return
            if self._pending_bytes >= WRITE_BATCH_BYTES:
                self._send_pending()
        if self.frames and not self.closed:
            self.task = asyncio.get_running_loop().create_task(self._drain())  # waits for the client to read
            return
        self._send_pending()

    async def _drain(self, first: _Pending | None = None, first_frame: bytes = b"") -> None:
        """Handle the queued frames in order, waiting where a request must (``first``: the awaitable
        rest of the request ``first_frame`` that ``_drain_now`` started). Responses are written once
        per pass over the queue (one writev for the requests that arrived together, not a send per
        response); whatever is pending goes out before anything that can wait (a handler's fsync, a
        full send buffer, a throttle) and before the connection closes, so batching never delays an
        answer behind a wait."""
        frame = first_frame
        self._handoff = None  # taken up: cancelling this task now cancels its wait
        # Requests handled while an earlier one waits for its fsync (AnsweredWhenDurable), with their
        # frames, answered in order before anything else is answered or waited for.
        ahead: deque[tuple[bytes, Any]] = deque()
        try:
            await self._drain_queue(first, frame, ahead)
        finally:
            for _frame, held in ahead:  # a handler failed, the task was cancelled or the connection is done
                if isinstance(held, _Pending):
                    held.discard()

    async def _drain_queue(self, first: _Pending | None, frame: bytes, ahead: deque[tuple[bytes, Any]]) -> None:
        out: bytes | list[Any] | _Pending | None
        ahead_bytes = 0
        while True:
            if first is None:
                if ahead and (self.throttle_ms > 0 or not self.frames or self.closed or not self.writable.is_set()):
                    # Nothing queued: wait for the held answers, and handle what arrives meanwhile.
                    answered = await self._answer_ahead(ahead, listen=not self.frames and self._may_hold_more(ahead))
                    if answered is False:
                        return
                    ahead_bytes = sum(_size(held) for _, held in ahead)
                if self.throttle_ms > 0:
                    # KIP-219: the response went out with its throttle time; mute until it has passed
                    # (frames arriving meanwhile are queued: this task is not done).
                    self._send_pending()
                    delay, self.throttle_ms = self.throttle_ms, 0
                    await asyncio.sleep(delay / 1000)
                if not self.frames or self.closed:
                    break
                if not self.writable.is_set():
                    self._send_pending()
                    await self.writable.wait()
                    continue
            try:
                if first is not None:
                    out, first = first, None
                else:
                    frame = self._next_frame()
                    out = self._start_frame(frame)
                if self._may_go_ahead(out, ahead):
                    size = _size(out)
                    if ahead_bytes + size <= self._ahead_max_bytes:
                        ahead.append((frame, out))
                        ahead_bytes += size
                        continue
                if ahead:  # this request is answered after them, the same way
                    ahead.append((frame, out))
                    ahead_bytes = 0
                    if not await self._answer_ahead(ahead, listen=False):
                        return
                    if not self.frames or self._pending_bytes >= WRITE_BATCH_BYTES:
                        self._send_pending()
                    continue
                if isinstance(out, _Pending):
                    out = self._encode(out.request, await out.awaitable)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(frame, exc)
                return
            if not self._answered(out):
                return
            if not self.frames or self._pending_bytes >= WRITE_BATCH_BYTES:
                self._send_pending()
        self._send_pending()

    def _may_hold_more(self, ahead: deque[tuple[bytes, Any]]) -> bool:
        """Whether nothing (a throttle, a full send buffer, a last answer, the bound on held
        requests) stops the connection from handling another request while answers are held."""
        return not (self.closed or self.throttle_ms > 0 or self.close_after_response or
                    not self.writable.is_set() or len(ahead) >= self._max_frames)

    def _may_go_ahead(self, out: Any, ahead: deque[tuple[bytes, Any]]) -> bool:
        """Whether the request just started may wait in ``ahead`` while later ones are handled (the
        ones queued now, and the ones that arrive while it waits): it only waits for an fsync (or it
        is answered already and something before it waits), and ``_may_hold_more``."""
        if not self._may_hold_more(ahead):
            return False
        if isinstance(out, _Pending):
            return isinstance(out.awaitable, AnsweredWhenDurable)
        return bool(ahead)

    async def _answer_ahead(self, ahead: deque[tuple[bytes, Any]], *, listen: bool) -> bool | None:
        """Answer, in request order, the requests handled while an earlier one waited for its fsync;
        False when the connection is done (as ``_answered``). With ``listen``, a wait for a held
        answer's fsync also ends when new requests arrive: then None, with the rest still held, so
        that the caller handles the new ones meanwhile (their appends join the next group commit
        instead of waiting for this one to be answered). Whatever is left in ``ahead`` when the
        connection is done (cancelled, failed, closed) is discarded by ``_drain``: its changes
        stand, its answer is dropped with the connection."""
        while ahead:
            frame, out = ahead[0]
            if isinstance(out, _Pending):
                aw = out.awaitable
                if listen and isinstance(aw, AnsweredWhenDurable) and not aw.durable_now() and \
                        self._may_hold_more(ahead) and not await self._fsynced_or_arrived(aw):
                    return None
                try:
                    out = self._encode(out.request, await out.awaitable)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    ahead.popleft()
                    self._failed(frame, exc)
                    return False
            ahead.popleft()
            if not self._answered(out):
                return False
        return True

    async def _fsynced_or_arrived(self, aw: AnsweredWhenDurable) -> bool:
        """Wait until ``aw`` may be answered (True) or new requests are queued (False)."""
        while (fut := aw.fsync_future()) is not None:
            waiter = asyncio.get_running_loop().create_future()
            wake = functools.partial(_wake, waiter)
            fut.add_done_callback(wake)
            self._arrival = waiter
            try:
                await waiter
            finally:
                self._arrival = None
                fut.remove_done_callback(wake)
            if not fut.done():
                if self.frames:
                    return False
            elif fut.cancelled() or fut.exception() is not None:
                return True  # the fsync failed: awaiting the answer raises it (the disk is offline)
        return True

    def _answered(self, out: bytes | list[Any] | None) -> bool:
        """Queue a request's answer for writing; False when the connection is done (its last answer
        is out: a refused login closes after a linger)."""
        if out is not None and self.transport is not None and not self.closed:
            if type(out) is list:  # a Fetch response with its record sets unjoined
                self._pending.extend(out)
                self._pending_bytes += sum(len(b) for b in out)
            else:
                self._pending.append(out)
                self._pending_bytes += len(out)
            self.last_active = time.monotonic()
        if self.close_after_response:
            self._send_pending()
            self._close_after_linger()
            return False
        if self.throttle_ms > 0:
            self._send_pending()  # the throttled answer goes out before the mute
        return not self.closed

    def _failed(self, frame: bytes, exc: Exception) -> None:
        """A request's handling raised: the storage is offline (the broker stops serving it) or a
        handler has a bug; either way this connection closes, and only this one."""
        if isinstance(exc, StorageOfflineError):
            log.error("closing the connection from %s: %s", self.peer, exc)
            self.broker.storage_failed(exc)
            self.close()
            return
        try:
            key, version, _ = peek_header(frame)
            api = f"{api_name(key)} v{version}"
        except Exception:
            api = "an unparsable request"
        log.error("internal error handling %s from %s; closing the connection", api, self.peer, exc_info=exc)
        self.close()

    def _send_pending(self) -> None:
        if self._pending:
            if self.transport is not None and not self.closed:
                self.transport.writelines(self._pending)
            self._pending = []
            self._pending_bytes = 0

    def _start_frame(self, frame: bytes) -> bytes | list[Any] | _Pending | None:
        """Everything of handling ``frame`` that runs without waiting: the answer (a frame, a Fetch
        answer's buffers, or None for no answer), or, when the handler must wait, a ``_Pending`` whose
        awaitable finishes the handling. Pending answers go out before such a wait."""
        broker = self.broker
        auth = self.authenticator
        if auth is not None and auth.expects_raw_token:  # after SaslHandshake v0: a bare token, no header
            self._send_pending()
            return _Pending(None, handle_raw_token(broker, self, auth, frame))
        if auth is not None and not auth.complete and not self._may_handle_before_authentication(frame, auth):
            self.close()
            return None
        try:
            request = decode_request(frame, broker.supported_versions, self)
        except UnsupportedVersionError as exc:
            return self._unsupported(frame, exc)
        except MalformedRequestError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            self.close()
            return None
        result: Any = broker.handlers[request.api_key](broker, request)
        if type(result) is not dict and inspect.isawaitable(result):  # most answers are dicts: skip the ABC check
            self._send_pending()  # earlier answers do not wait for this one's fsync
            return _Pending(request, result)
        return self._encode(request, result)

    def _encode(self, request: Any, result: Any) -> bytes | list[Any] | None:
        if result is None:  # acks=0 produce: no response at all
            return None
        if request is None:  # a bare SASL token's answer is already a frame
            return result
        auth = self.authenticator
        if auth is not None and request.api_key == API_API_VERSIONS:
            auth.api_versions_answered()  # Kafka: after ApiVersions, SaslHandshake must follow
        return encode_result(request.api_key, request.api_version, request.correlation_id, result)

    def _may_handle_before_authentication(self, frame: bytes, auth: SaslServerAuthenticator) -> bool:
        """Kafka's SaslServerAuthenticator: only the request the SASL state expects, checked before the
        request is parsed, so an unauthenticated peer never reaches another API's decoder."""
        try:
            api_key, api_version, _ = peek_header(frame)
        except MalformedRequestError as exc:
            log.warning("closing connection from %s: %s", self.peer, exc)
            return False
        if auth.allows(api_key):
            return True
        log.warning("closing connection from %s: unexpected %s v%d request in SASL state %s", self.peer,
                    api_name(api_key), api_version, auth.state.value)
        return False

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

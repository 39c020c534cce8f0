"""Kafka request framing, sans-IO: bytes in, whole frames out.

Every Kafka message on the wire is an int32 size followed by that many bytes. ``FrameDecoder`` is
fed whatever the socket produced and returns complete frames; it raises ``FrameError`` for a negative
or oversized length, after which the connection must be closed (Kafka's ``InvalidReceiveException``):
the stream can no longer be resynchronised.
"""

from __future__ import annotations

import struct

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """The peer sent a frame length we refuse; close the connection."""


class FrameDecoder:
    """Accumulates bytes and yields complete frames (without their 4-byte size prefix).

    Invariant: ``_buffer[_pos:]`` holds the unconsumed bytes; a frame is returned only when all of
    its bytes arrived. Not thread-safe: one decoder per connection.
    """

    __slots__ = ("_buffer", "_max_frame_bytes", "_pos")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buffer = bytearray()
        self._pos = 0
        self._max_frame_bytes = max_frame_bytes

    @property
    def buffered(self) -> int:
        return len(self._buffer) - self._pos

    def receive_data(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        buf = self._buffer
        pos = self._pos
        end = len(buf)
        while end - pos >= 4:
            (size,) = _SIZE.unpack_from(buf, pos)
            if size < 0:
                raise FrameError(f"negative frame size {size}")
            if size > self._max_frame_bytes:
                raise FrameError(f"frame size {size} exceeds the maximum {self._max_frame_bytes}")
            if end - pos - 4 < size:
                break
            with memoryview(buf) as view:  # one copy (a bytearray slice would copy twice)
                frames.append(view[pos + 4 : pos + 4 + size].tobytes())
            pos += 4 + size
        if pos == end:
            buf.clear()
            self._pos = 0
        elif pos > 65536 and pos * 2 > end:
            del buf[:pos]
            self._pos = 0
        else:
            self._pos = pos
        return frames


def frame(payload: bytes | bytearray) -> bytes:
    """Prefix ``payload`` with its int32 size."""
    return _SIZE.pack(len(payload)) + bytes(payload)

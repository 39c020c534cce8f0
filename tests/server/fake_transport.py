"""Just enough of an asyncio transport to drive a ``KafkaConnection`` without a socket."""

from __future__ import annotations


class FakeTransport:
    """Records the frames written (``written``), whether reading is paused (``reading``), and the
    close; a write after the close is counted (``written_after_close``), not refused."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.reading = True
        self.written_after_close = 0

    def get_extra_info(self, name: str) -> object:
        return ("127.0.0.1", 5555) if name == "peername" else None

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def writelines(self, data: list[bytes]) -> None:
        if self.closed:
            self.written_after_close += 1
        self.written.extend(bytes(d) for d in data)

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closed = True

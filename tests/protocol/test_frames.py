from __future__ import annotations

import struct

import pytest

from oncelog.protocol.frames import FrameDecoder, FrameError, frame


def test_frames_split_across_reads_are_reassembled() -> None:
    d = FrameDecoder()
    data = frame(b"hello") + frame(b"") + frame(b"world!")
    out: list[bytes] = []
    for i in range(len(data)):
        out += d.receive_data(data[i : i + 1])
    assert out == [b"hello", b"", b"world!"]
    assert d.buffered == 0


def test_many_frames_in_one_read() -> None:
    d = FrameDecoder()
    assert d.receive_data(frame(b"a") * 3 + frame(b"bc")[:3]) == [b"a", b"a", b"a"]
    assert d.receive_data(frame(b"bc")[3:]) == [b"bc"]


def test_oversized_frame_is_refused_before_reading_it() -> None:
    d = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameError, match="exceeds"):
        d.receive_data(struct.pack(">i", 1025))


def test_negative_size_is_refused() -> None:
    with pytest.raises(FrameError, match="negative"):
        FrameDecoder().receive_data(struct.pack(">i", -5) + b"xxxx")

"""Wire framing: encode/decode round trip and reader errors over a real socketpair."""

from __future__ import annotations

import socket
import struct

import pytest

from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op


@pytest.fixture
def pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair()
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize(
    ("ints", "tail"),
    [
        pytest.param((), b"", id="empty"),
        pytest.param((1, -2, 2**62), b"token", id="values-and-tail"),
        pytest.param(tuple(range(255)), b"x" * 70000, id="max-values-big-tail"),
    ],
)
def test_round_trip(pair: tuple[socket.socket, socket.socket], ints: tuple[int, ...], tail: bytes) -> None:
    a, b = pair
    reader = protocol.FrameReader(b, 1 << 20)
    for rid in (1, 2):
        a.sendall(protocol.encode(Op.MALLOC, rid, ints, tail))
    for rid in (1, 2):
        assert reader.read() == protocol.Message(Op.MALLOC, 0, rid, ints, tail)
    a.close()
    assert reader.read() is None


def test_reply_flag(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    a.sendall(protocol.encode_reply(Op.PING, 9, 0, 1234, tail=b"PONG"))
    msg = protocol.FrameReader(b, 4096).read()
    assert msg == protocol.Message(Op.PING, protocol.FLAG_REPLY, 9, (0, 1234), b"PONG")


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        pytest.param(struct.pack(">I", 5000) + b"x" * 10, protocol.FrameTooLarge, id="oversized"),
        pytest.param(struct.pack(">I", 3) + b"abc", protocol.FrameTruncated, id="shorter-than-header"),
        pytest.param(struct.pack(">I", 20) + b"x" * 5, protocol.FrameTruncated, id="eof-mid-frame"),
        pytest.param(
            struct.pack(">IHHIB", 9, 1, 0, 1, 3), protocol.FrameTruncated, id="fewer-values-than-said"
        ),
        pytest.param(b"\x00\x00", protocol.FrameTruncated, id="eof-mid-length"),
    ],
)
def test_bad_frames(pair: tuple[socket.socket, socket.socket], raw: bytes, error: type[Exception]) -> None:
    a, b = pair
    a.sendall(raw)
    a.shutdown(socket.SHUT_WR)
    with pytest.raises(error):
        protocol.FrameReader(b, 4096).read()


def test_too_many_values() -> None:
    with pytest.raises(ValueError, match="at most 255"):
        protocol.encode(Op.MALLOC, 1, tuple(range(256)))

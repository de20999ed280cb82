"""The aclserver wire protocol: lean length-prefixed frames on a plain stream socket.

Shared by the server and the client library. Owns framing only (the op numbers and argument
layouts are the table in ``flexnpu_wire/ops.py``); it knows nothing about ACL semantics. A
frame is::

    uint32 length (big-endian, of everything after it)
    uint16 op | uint16 flags | uint32 request_id | uint8 n_ints    (the fixed header)
    n_ints x int64 (big-endian)                                     (the values)
    tail bytes (token, file name, tag or error text; op dependent)

A reply carries the request's op and id with ``FLAG_REPLY`` set; its first value is the ACL
return code (0 success) and, when non-zero, the tail holds a human-readable message. Bulk data
never travels here: memcpy frames carry offsets into the shared-memory data link.
"""

from __future__ import annotations

import socket
import struct
from typing import NamedTuple

from flexnpu_wire.ops import Op

__all__ = [
    "FLAG_REPLY",
    "HEADER",
    "MAX_PRE_AUTH_FRAME_BYTES",
    "PROTOCOL_VERSION",
    "FrameReader",
    "FrameTooLarge",
    "FrameTruncated",
    "Message",
    "Op",
    "ProtocolError",
    "decode",
    "encode",
    "encode_reply",
]

PROTOCOL_VERSION = 1
FLAG_REPLY = 0x1
HEADER = struct.Struct(">HHIB")
_HEADER_SIZE = HEADER.size
_HEADER_UNPACK = HEADER.unpack_from
_LENGTH = struct.Struct(">I")
_LENGTH_UNPACK = _LENGTH.unpack_from
_MAX_INTS = 255
_INITIAL_BUFFER = 64 * 1024
MAX_PRE_AUTH_FRAME_BYTES = 640
"""Largest frame a server reads before HELLO succeeded (a HELLO with the longest token the daemon accepts, 512 hex digits, is 537)."""


class Message(NamedTuple):
    """One decoded frame."""

    op: int
    flags: int
    request_id: int
    ints: tuple[int, ...]
    tail: bytes


class ProtocolError(Exception):
    """The byte stream is not a valid frame sequence; the connection must be closed."""


class FrameTooLarge(ProtocolError):
    """A frame announced more bytes than max_frame_bytes."""


class FrameTruncated(ProtocolError):
    """The peer closed mid-frame, or a frame is shorter than its header says."""


_PACKERS: dict[int, struct.Struct] = {}


def _packer(n: int) -> struct.Struct:
    packer = _PACKERS.get(n)
    if packer is None:
        packer = _PACKERS[n] = struct.Struct(f">IHHIB{n}q")
    return packer


def encode(
    op: int, request_id: int, ints: tuple[int, ...] = (), tail: bytes = b"", *, flags: int = 0
) -> bytes:
    """One complete frame (length prefix included), ready for ``sendall``."""
    n = len(ints)
    packer = _PACKERS.get(n) or _new_packer(n)
    try:
        if tail:
            return packer.pack(packer.size - 4 + len(tail), op, flags, request_id, n, *ints) + tail
        return packer.pack(packer.size - 4, op, flags, request_id, n, *ints)
    except struct.error as exc:
        raise ValueError(
            f"frame values must be 64-bit signed integers, got {repr(ints)[:200]}: {exc}"
        ) from None


def encode_reply(op: int, request_id: int, ret: int, *values: int, tail: bytes = b"") -> bytes:
    """A reply frame: ``ret`` first, then the op's output values."""
    n = len(values) + 1
    packer = _PACKERS.get(n) or _new_packer(n)
    if tail:
        return packer.pack(packer.size - 4 + len(tail), op, FLAG_REPLY, request_id, n, ret, *values) + tail
    return packer.pack(packer.size - 4, op, FLAG_REPLY, request_id, n, ret, *values)


def _new_packer(n: int) -> struct.Struct:
    if n > _MAX_INTS:
        raise ValueError(f"at most {_MAX_INTS} values per frame, got {n}")
    return _packer(n)


_VALUES: dict[int, struct.Struct] = {}
_new_message = tuple.__new__


def _values(n: int) -> struct.Struct:
    values = _VALUES[n] = struct.Struct(f">{n}q")
    return values


def decode(payload: bytes | bytearray | memoryview, offset: int, length: int) -> Message:
    """Decode one payload of ``length`` bytes starting at ``offset`` (length prefix excluded)."""
    if length < _HEADER_SIZE:
        raise FrameTruncated(f"frame of {length} bytes is shorter than the {_HEADER_SIZE}-byte header")
    op, flags, request_id, n = _HEADER_UNPACK(payload, offset)
    body = _HEADER_SIZE + 8 * n
    if length < body:
        raise FrameTruncated(f"frame of {length} bytes is too short for its {n} values ({body} bytes)")
    values = _VALUES.get(n) or _values(n)
    ints = values.unpack_from(payload, offset + _HEADER_SIZE)
    tail = bytes(payload[offset + body : offset + length]) if length > body else b""
    return _new_message(Message, (op, flags, request_id, ints, tail))  # C-level: skips NamedTuple.__new__


class FrameReader:
    """Reads frames from a socket through one reusable buffer (usually one recv per frame)."""

    def __init__(
        self, sock: socket.socket, max_frame_bytes: int, *, initial_buffer: int = _INITIAL_BUFFER
    ) -> None:
        self._sock = sock
        self._max = max_frame_bytes
        self._buf = bytearray(initial_buffer)
        self._view: memoryview | None = memoryview(self._buf)
        self._start = 0
        self._end = 0

    @property
    def max_frame_bytes(self) -> int:
        return self._max

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        """Raise (after authentication) or lower the frame size limit for later frames."""
        self._max = value

    def next_buffered(self) -> Message | None:
        """The next frame if it is already complete in the buffer, else None (never blocks)."""
        avail = self._end - self._start
        if avail < 4:
            return None
        (length,) = _LENGTH_UNPACK(self._buf, self._start)
        if length > self._max:
            raise FrameTooLarge(f"frame of {length} bytes exceeds max_frame_bytes {self._max}")
        need = 4 + length
        if avail < need:
            return None
        msg = decode(self._buf, self._start + 4, length)
        self._start += need
        if self._start == self._end:
            self._start = self._end = 0
        return msg

    def fill(self) -> bool:
        """One ``recv`` into the buffer; False on end of stream (FrameTruncated if mid-frame)."""
        avail = self._end - self._start
        need = 4
        if avail >= 4:
            (length,) = _LENGTH.unpack_from(self._buf, self._start)
            need = 4 + length
        self._make_room(need)
        view = self._view if self._view is not None else memoryview(self._buf)
        got = self._sock.recv_into(view[self._end :])
        if got == 0:
            if avail == 0:
                return False
            raise FrameTruncated(f"peer closed the connection after {avail} of {need} bytes of a frame")
        self._end += got
        return True

    def read(self) -> Message | None:
        """The next frame; None on a clean end of stream between frames.

        Raises FrameTooLarge, FrameTruncated, or OSError from the socket.
        """
        if self._start == self._end and self._view is not None:
            # fast path: an empty buffer and (usually) exactly one whole frame per recv
            buf = self._buf
            got = self._sock.recv_into(self._view)
            if got == 0:
                return None
            if got >= 4 + _HEADER_SIZE:
                (length,) = _LENGTH_UNPACK(buf, 0)
                if got == 4 + length and length <= self._max:
                    op, flags, request_id, n = _HEADER_UNPACK(buf, 4)
                    body = _HEADER_SIZE + 8 * n
                    if length >= body:
                        values = _VALUES.get(n) or _values(n)
                        ints = values.unpack_from(buf, 4 + _HEADER_SIZE)
                        tail = bytes(buf[4 + body : got]) if length > body else b""
                        return _new_message(Message, (op, flags, request_id, ints, tail))
            self._end = got
        while True:
            msg = self.next_buffered()
            if msg is not None:
                return msg
            if not self.fill():
                return None

    def _make_room(self, need: int) -> None:
        avail = self._end - self._start
        if self._start + need <= len(self._buf) and self._end < len(self._buf):
            return
        if self._start:
            self._buf[:avail] = self._buf[self._start : self._end]
            self._start, self._end = 0, avail
        if need > len(self._buf) or self._end >= len(self._buf):
            if self._view is not None:
                self._view.release()
                self._view = None
            self._buf.extend(bytes(max(need, 2 * len(self._buf)) - len(self._buf)))
            self._view = memoryview(self._buf)

"""The control link as seen by the client: requests and replies over one stream socket.

``connect`` prefers the unix socket of client.conf when it answers and falls back to TCP. On
the unix socket the aclserver may pass a file descriptor with a reply (a sealed memfd for the
staging region or a host buffer): the reader receives it with the frame's bytes and keeps it
for that reply (``take_fd``), in order, whichever thread reads.
"""

from __future__ import annotations

import array
import contextlib
import itertools
import os
import socket
import threading
from collections import deque

from flexnpu_client.errors import ConnectError
from flexnpu_wire import framing as protocol
from flexnpu_wire.clientconf import ClientConf
from flexnpu_wire.ops import Op

__all__ = ["SocketTransport", "connect"]

_REPLY_MAX_FRAME = 1 << 20
_FD_OPS = frozenset({int(Op.STAGING_FD), int(Op.MALLOC_HOST_FD)})
_ANCILLARY = socket.CMSG_SPACE(8 * array.array("i").itemsize)


class _FdSocket:
    """A unix socket's ``recv_into`` that also keeps the descriptors passed with the bytes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fds: deque[int] = deque()

    def recv_into(self, buffer: memoryview) -> int:
        got, ancdata, _flags, _addr = self.sock.recvmsg_into([buffer], _ANCILLARY, socket.MSG_CMSG_CLOEXEC)
        for level, kind, data in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds = array.array("i")
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
                self.fds.extend(fds)
        return got


class SocketTransport:
    """Frames over one connected socket; thread-safe, several requests in flight at once.

    Threads sharing the connection do not wait for each other's round trips: each sends its
    request (under a short send lock) and waits for the reply with its own request id. Whichever
    waiting thread holds the read lock reads frames off the socket and hands every reply that is
    not its own to the thread waiting for it; when it has its own reply it passes the reading
    role on. The aclserver may answer out of order (a blocking synchronize does not hold up the
    calls of other threads), so replies are matched by id, never by order.
    """

    def __init__(self, sock: socket.socket, kind: str) -> None:
        self.sock = sock
        self.kind = kind
        self._fd_socket = _FdSocket(sock) if kind == "unix" else None
        self._reader = protocol.FrameReader(self._fd_socket or sock, _REPLY_MAX_FRAME)  # type: ignore[arg-type]
        self._read = self._read_with_fds if self._fd_socket is not None else self._reader.read
        self._frame_fds: dict[int, int] = {}
        self._sendall = sock.sendall
        self._ids = itertools.count(1)
        self._send_lock = threading.Lock()
        self._recv_lock = threading.Lock()
        self._mutex = threading.Lock()
        self._replies: dict[int, protocol.Message] = {}
        self._waiters: dict[int, threading.Lock] = {}
        self._broken: ConnectError | None = None
        self.lock = threading.RLock()
        """Held by a multi-frame exchange that needs the session's staging region to itself."""

    def request(self, op: int, ints: tuple[int, ...] = (), tail: bytes = b"") -> protocol.Message:
        """Send one request and return its reply (ConnectError if the link breaks)."""
        with self._send_lock:  # send() inlined: this is the hot path of every call
            rid = next(self._ids) & 0xFFFFFFFF
            try:
                self._sendall(protocol.encode(op, rid, ints, tail))
            except OSError as exc:
                raise self._break(f"aclserver connection ({self.kind}) failed: {exc}") from exc
        if not self._replies and self._recv_lock.acquire(blocking=False):
            # the common case: nobody else is reading, and the next frame is our reply
            try:
                try:
                    msg = self._read()
                except (OSError, protocol.ProtocolError) as exc:
                    raise self._break(f"aclserver connection ({self.kind}) failed: {exc}") from exc
                if msg is not None and msg.request_id == rid:
                    return msg
                return self._read_until(rid, have_first=True, first=msg)
            finally:
                self._recv_lock.release()
                if self._waiters:
                    self._wake_one()
        return self.receive(rid)

    def _read_with_fds(self) -> protocol.Message | None:
        """The next frame; a successful reply of an op that passes a descriptor takes the oldest
        one received (descriptors arrive in the order of the frames they belong to)."""
        msg = self._reader.read()
        fds = self._fd_socket
        if msg is not None and msg.op in _FD_OPS and fds is not None and msg.ints and msg.ints[0] == 0:
            if not fds.fds:
                raise protocol.ProtocolError(
                    f"the reply to request {msg.request_id} came without its descriptor"
                )
            with self._mutex:
                self._frame_fds[msg.request_id] = fds.fds.popleft()
        return msg

    def take_fd(self, rid: int) -> int:
        """The descriptor that came with the reply to request ``rid`` (the caller owns it)."""
        with self._mutex:
            fd = self._frame_fds.pop(rid, -1)
        if fd < 0:
            raise ConnectError(f"the aclserver's reply to request {rid} passed no descriptor")
        return fd

    def request_id(
        self, op: int, ints: tuple[int, ...] = (), tail: bytes = b""
    ) -> tuple[int, protocol.Message]:
        """``request``, also returning the request id (for ``take_fd``)."""
        rid = self.send(op, ints, tail)
        return rid, self.receive(rid)

    def send(self, op: int, ints: tuple[int, ...] = (), tail: bytes = b"") -> int:
        """Send a request without waiting; return its id (pass it to ``receive``)."""
        with self._send_lock:
            rid = next(self._ids) & 0xFFFFFFFF
            try:
                self._sendall(protocol.encode(op, rid, ints, tail))
            except OSError as exc:
                raise self._break(f"aclserver connection ({self.kind}) failed: {exc}") from exc
        return rid

    def receive(self, rid: int) -> protocol.Message:
        """The reply to request ``rid`` (in whatever order the replies arrive)."""
        while True:
            if self._broken is not None:
                raise self._broken
            if self._replies:
                with self._mutex:
                    reply = self._replies.pop(rid, None)
                if reply is not None:
                    return reply
            if self._recv_lock.acquire(blocking=False):
                try:
                    return self._read_until(rid)
                finally:
                    self._recv_lock.release()
                    if self._waiters:
                        self._wake_one()
            self._wait_turn(rid)

    def _read_until(
        self, rid: int, *, have_first: bool = False, first: protocol.Message | None = None
    ) -> protocol.Message:
        """As the reader: read frames until ``rid``'s reply arrives; deliver the others.

        With ``have_first``, ``first`` is a frame (or None: end of stream) the caller already read.
        """
        if not have_first and self._replies:
            with self._mutex:
                reply = self._replies.pop(rid, None)
            if reply is not None:
                return reply
        while True:
            msg: protocol.Message | None
            if have_first:
                msg, have_first = first, False
            else:
                try:
                    msg = self._read()
                except (OSError, protocol.ProtocolError) as exc:
                    raise self._break(f"aclserver connection ({self.kind}) failed: {exc}") from exc
            if msg is None:
                raise self._break(f"aclserver closed the connection ({self.kind})")
            if msg.request_id == rid:
                return msg
            if msg.op == 0:  # the server could not decode a frame: it closes the connection
                text = msg.tail.decode(errors="replace")
                raise self._break(f"aclserver refused a frame and closed the connection: {text}")
            with self._mutex:
                self._replies[msg.request_id] = msg
                waiter = self._waiters.pop(msg.request_id, None)
            if waiter is not None:
                waiter.release()

    def _wait_turn(self, rid: int) -> None:
        """Block until ``rid``'s reply was delivered or the reading role is free."""
        gate = threading.Lock()
        gate.acquire()
        with self._mutex:
            if rid in self._replies or self._broken is not None:
                return
            self._waiters[rid] = gate
        if self._recv_lock.acquire(blocking=False):  # the reader left meanwhile: take over
            self._recv_lock.release()
            with self._mutex:
                if self._waiters.get(rid) is gate:
                    del self._waiters[rid]
                    return
        gate.acquire()  # released by the reader (our reply, its departure, or a broken link)

    def _wake_one(self) -> None:
        with self._mutex:
            if not self._waiters:
                return
            rid = next(iter(self._waiters))
            gate = self._waiters.pop(rid)
        gate.release()

    def _break(self, message: str) -> ConnectError:
        err = ConnectError(message)
        with self._mutex:
            if self._broken is None:
                self._broken = err
            waiters = list(self._waiters.values())
            self._waiters.clear()
        for gate in waiters:
            gate.release()
        return self._broken

    def close(self, *, wait: float = 5.0) -> None:
        """Half-close and wait (up to ``wait`` s) until the server has released this connection's
        resources and closed its side, so a new client may connect right away."""
        with self.lock:
            try:
                self.sock.shutdown(socket.SHUT_WR)
                self.sock.settimeout(wait)
                while self.sock.recv(65536):
                    pass
            except OSError:
                pass
            finally:
                self.sock.close()
                for fd in [*self._frame_fds.values(), *(self._fd_socket.fds if self._fd_socket else ())]:
                    with contextlib.suppress(OSError):
                        os.close(fd)
                self._frame_fds.clear()


def connect(conf: ClientConf, *, timeout: float = 5.0, prefer: str = "unix") -> SocketTransport:
    """Connect to the first endpoint that answers (unix first unless ``prefer='tcp'``)."""
    order = ["unix", "tcp"] if prefer == "unix" else ["tcp", "unix"]
    errors: list[str] = []
    for kind in order:
        try:
            if kind == "unix" and conf.endpoints.unix:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout)
                    sock.connect(conf.endpoints.unix)
                except OSError:
                    sock.close()
                    raise
            elif kind == "tcp" and conf.endpoints.tcp_address:
                sock = socket.create_connection(conf.endpoints.tcp_address, timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            else:
                continue
        except OSError as exc:
            errors.append(f"{kind}: {exc}")
            continue
        sock.settimeout(None)
        return SocketTransport(sock, kind)
    raise ConnectError(
        f"no aclserver endpoint answered ({'; '.join(errors) or 'none configured'})", claim_uid=conf.claim_uid
    )

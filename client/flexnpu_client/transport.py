"""The control link as seen by the client: one request/reply at a time over a stream socket.

``connect`` prefers the unix socket of client.conf when it answers and falls back to TCP.
"""

from __future__ import annotations

import itertools
import socket
import threading

from flexnpu_client.errors import ConnectError
from flexnpu_wire import framing as protocol
from flexnpu_wire.clientconf import ClientConf

__all__ = ["SocketTransport", "connect"]

_REPLY_MAX_FRAME = 1 << 20


class SocketTransport:
    """Frames over one connected socket; thread-safe (requests are serialized)."""

    def __init__(self, sock: socket.socket, kind: str) -> None:
        self.sock = sock
        self.kind = kind
        self._reader = protocol.FrameReader(sock, _REPLY_MAX_FRAME)
        self._read = self._reader.read
        self._sendall = sock.sendall
        self._ids = itertools.count(1)
        self.lock = threading.RLock()
        """Held across a pipelined exchange (``send`` ... ``receive``)."""

    def request(self, op: int, ints: tuple[int, ...] = (), tail: bytes = b"") -> protocol.Message:
        """Send one request and return its reply (ConnectError if the link breaks)."""
        with self.lock:
            rid = next(self._ids) & 0xFFFFFFFF
            try:
                self._sendall(protocol.encode(op, rid, ints, tail))
                reply = self._read()
            except (OSError, protocol.ProtocolError) as exc:
                raise ConnectError(f"aclserver connection ({self.kind}) failed: {exc}") from exc
            if reply is None:
                raise ConnectError(f"aclserver closed the connection ({self.kind})")
            if reply.request_id != rid and reply.op != 0:
                raise ConnectError(f"aclserver answered request {reply.request_id}, expected {rid}")
            return reply

    def send(self, op: int, ints: tuple[int, ...] = (), tail: bytes = b"") -> int:
        """Send a request without waiting; return its id (hold ``lock`` until its ``receive``)."""
        rid = next(self._ids) & 0xFFFFFFFF
        try:
            self.sock.sendall(protocol.encode(op, rid, ints, tail))
        except OSError as exc:
            raise ConnectError(f"aclserver connection ({self.kind}) failed: {exc}") from exc
        return rid

    def receive(self, rid: int) -> protocol.Message:
        """The reply to request ``rid`` (replies come in request order)."""
        try:
            reply = self._reader.read()
        except (OSError, protocol.ProtocolError) as exc:
            raise ConnectError(f"aclserver connection ({self.kind}) failed: {exc}") from exc
        if reply is None:
            raise ConnectError(f"aclserver closed the connection ({self.kind})")
        if reply.request_id != rid and reply.op != protocol.Op.NONE:
            raise ConnectError(f"aclserver answered request {reply.request_id}, expected {rid}")
        return reply

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

"""Sockets of the aclserver: the TCP and unix listeners, authentication and the one-client rule.

Owns the connection lifecycle: PING (unauthenticated liveness) on any connection, HELLO with
the claim token (constant-time compare) before anything else, at most one authenticated client
at a time, protocol errors answered (when possible) and the connection closed, and the session
released when its connection ends for any reason. One thread per connection.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import selectors
import socket
import threading
from pathlib import Path

from dra_driver.aclserver import codes, protocol
from dra_driver.aclserver.backend import Backend
from dra_driver.aclserver.protocol import Op
from dra_driver.aclserver.session import Session
from dra_driver.aclserver.spec import AclServerSpec
from dra_driver.logs import ClaimLogger

__all__ = ["Server"]


class Server:
    """Listens on both endpoints and serves connections until ``serve`` sees its stop socket."""

    def __init__(self, spec: AclServerSpec, backend: Backend, *, log: ClaimLogger) -> None:
        self.spec = spec
        self.backend = backend
        self.log = log
        self.tcp_port = 0
        self._token = spec.token.encode()
        self._listeners: list[socket.socket] = []
        self._conns: dict[socket.socket, threading.Thread] = {}
        self._conns_lock = threading.Lock()
        self._active_lock = threading.Lock()
        self._active_pid: int | None = None
        self._sessions: set[Session] = set()

    def start(self) -> None:
        """Create the shm dir and bind both listeners (OSError if either endpoint fails)."""
        Path(self.spec.shm_dir).mkdir(parents=True, exist_ok=True)
        tcp = socket.create_server((self.spec.tcp_host, self.spec.tcp_port), backlog=16)
        self._listeners.append(tcp)
        self.tcp_port = tcp.getsockname()[1]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec.unix_socket)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listeners.append(unix)
        unix.bind(self.spec.unix_socket)
        os.chmod(self.spec.unix_socket, 0o666)  # noqa: S103 - the container may run as any user; HELLO needs the token
        unix.listen(16)

    def serve(self, stop: socket.socket) -> None:
        """Accept connections until ``stop`` becomes readable."""
        with selectors.DefaultSelector() as sel:
            for listener in self._listeners:
                listener.setblocking(False)
                sel.register(listener, selectors.EVENT_READ)
            sel.register(stop, selectors.EVENT_READ)
            while True:
                for key, _ in sel.select():
                    if key.fileobj is stop:
                        return
                    assert isinstance(key.fileobj, socket.socket)
                    try:
                        conn, _addr = key.fileobj.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(True)
                    if conn.family != socket.AF_UNIX:
                        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    thread = threading.Thread(target=self._serve_conn, args=(conn,), daemon=True, name="conn")
                    with self._conns_lock:
                        self._conns[conn] = thread
                    thread.start()

    def shutdown(self) -> None:
        """Stop accepting, end every connection (releasing its session) and remove the socket file."""
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        with self._conns_lock:
            conns = list(self._conns.items())
            sessions = list(self._sessions)
        for session in sessions:
            session.cancel()
        for conn, _thread in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for _conn, thread in conns:
            thread.join(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec.unix_socket)

    def _serve_conn(self, conn: socket.socket) -> None:
        reader = protocol.FrameReader(conn, self.spec.max_frame_bytes)
        session: Session | None = None
        # Until it authenticates, a connection may idle only briefly: an unauthenticated peer
        # cannot hold a server thread (and its socket) for ever.
        conn.settimeout(self.spec.auth_timeout_ms / 1000)
        try:
            while True:
                try:
                    msg = reader.read()
                except protocol.ProtocolError as exc:
                    self.log.warning("closing a connection: %s", exc)
                    conn.sendall(
                        protocol.encode_reply(
                            Op.NONE, 0, codes.ACL_ERROR_INVALID_PARAM, tail=str(exc).encode()
                        )
                    )
                    return
                if msg is None:
                    return
                if msg.op == Op.PING:
                    conn.sendall(
                        protocol.encode_reply(
                            msg.op, msg.request_id, codes.ACL_SUCCESS, os.getpid(), tail=b"PONG"
                        )
                    )
                elif session is not None:
                    if msg.op == Op.HELLO:
                        conn.sendall(
                            _error(
                                msg, codes.ACL_ERROR_INVALID_PARAM, "this connection is already authenticated"
                            )
                        )
                    else:
                        conn.sendall(session.handle(msg))
                else:
                    session, reply = self._hello(msg)
                    if session is not None:
                        conn.settimeout(None)  # an authenticated client may idle as long as it likes
                        with self._conns_lock:
                            self._sessions.add(session)
                    conn.sendall(reply)
                    if session is None:
                        return
        except OSError:
            return
        finally:
            if session is not None:
                with self._conns_lock:
                    self._sessions.discard(session)
                session.close()
                with self._active_lock:
                    self._active_pid = None
            with contextlib.suppress(OSError):
                conn.close()
            with self._conns_lock:
                self._conns.pop(conn, None)

    def _hello(self, msg: protocol.Message) -> tuple[Session | None, bytes]:
        if msg.op != Op.HELLO:
            return None, _error(
                msg, codes.ACL_ERROR_RT_NO_PERMISSION, "authenticate with HELLO and the claim token first"
            )
        if not hmac.compare_digest(msg.tail, self._token):
            self.log.warning("refused a client: invalid token")
            return None, _error(msg, codes.ACL_ERROR_RT_NO_PERMISSION, "invalid token")
        if len(msg.ints) != 2 or msg.ints[0] != protocol.PROTOCOL_VERSION:
            return None, _error(
                msg,
                codes.ACL_ERROR_INVALID_PARAM,
                f"HELLO must carry (protocol version {protocol.PROTOCOL_VERSION}, client pid)",
            )
        client_pid = msg.ints[1]
        with self._active_lock:
            if self._active_pid is not None:
                return None, _error(
                    msg,
                    codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
                    f"the aclserver of claim {self.spec.claim_uid} already serves a client (pid {self._active_pid});"
                    " one client at a time",
                )
            self._active_pid = client_pid
        try:
            session = Session(self.backend, shm_dir=self.spec.shm_dir, staging_bytes=self.spec.staging_bytes)
        except OSError as exc:
            with self._active_lock:
                self._active_pid = None
            return None, _error(
                msg, codes.ACL_ERROR_INTERNAL_ERROR, f"cannot create the staging region: {exc}"
            )
        self.log.info("client pid %d connected", client_pid)
        staging = session.staging
        reply = protocol.encode_reply(
            msg.op,
            msg.request_id,
            codes.ACL_SUCCESS,
            os.getpid(),
            self.backend.device_count(),
            staging.size,
            tail=staging.name.encode(),
        )
        return session, reply


def _error(msg: protocol.Message, code: int, text: str) -> bytes:
    return protocol.encode_reply(msg.op, msg.request_id, code, tail=text.encode())

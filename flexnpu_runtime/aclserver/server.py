"""Sockets of the aclserver: listeners, authentication, and up to ``max_sessions`` sessions per claim.

Owns the connection lifecycle. One selector loop (the main thread) accepts connections and
serves every connection that has not authenticated yet: it answers PING, reads frames of at most
``MAX_PRE_AUTH_FRAME_BYTES`` (a 13-byte header announcing a large frame allocates nothing),
closes a connection whose HELLO has not succeeded ``auth_timeout_ms`` after connect (an absolute
deadline: PINGs do not extend it), and backs off when ``accept`` fails with EMFILE/ENFILE
instead of dying.

Unauthenticated connections are accepted within budgets of their own, per listener and per
TCP peer, which never count against ``max_sessions`` (``admission.py``). The TCP listener exists
only if the claim asked for TCP (``tcp_listen``). Before HELLO a PING on TCP answers nothing
about the process (its pid is 0). Only an authenticated session gets a thread (at most
``max_sessions`` of them); its calls run there with a blocking socket, the lowest-latency path
for a small call. Sessions share the claim's quota (``Claim``); each one's
memory, streams and host buffers are released when its connection ends for any reason (a
SIGKILL'd client closes its socket).
"""

from __future__ import annotations

import array
import collections
import contextlib
import errno
import hmac
import os
import queue
import select
import selectors
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from dra_driver import files
from dra_driver.logs import ClaimLogger
from flexnpu_runtime.aclserver.admission import Admission, Pending
from flexnpu_runtime.aclserver.backend import Backend
from flexnpu_runtime.aclserver.claim import Claim, SessionRefused
from flexnpu_runtime.aclserver.dispatch import WAITING_OPS, FdReply, Session
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op
from flexnpu_wire.launch import AclServerSpec

__all__ = ["SOCKET_MODE", "Server"]

SOCKET_MODE = 0o666
"""The unix socket is connectable by any uid: the container's processes may run as any user and
the file is reachable only through the claim's own shm dir; HELLO needs the claim token."""
_BACKOFF_MIN_S = 0.05
_BACKOFF_MAX_S = 1.0
_PING, _HELLO = int(Op.PING), int(Op.HELLO)
_MAX_WAITERS = 64
"""Blocking synchronize calls of one session served off its thread at once (more run inline)."""
_PRECISE_S = 0.001
_KEEP_WHILE_RUNNING = (WAITING_OPS - {int(Op.MODEL_EXECUTE)}) | {int(Op.FINALIZE)}
"""Ops a session thread running an execution itself does not serve meanwhile: they may wait for
the session's work (an execution's handler never does while the session thread runs one)."""


class Server:
    """Listens on both endpoints and serves connections until ``serve`` sees its stop socket."""

    def __init__(self, spec: AclServerSpec, backend: Backend, book: QuotaBook, *, log: ClaimLogger) -> None:
        self.spec = spec
        self.book = book
        self.log = log
        self.tcp_port = 0
        self.claim = Claim(backend, book, spec, on_sessions_changed=self._sessions_changed)
        self._token = spec.token.encode()
        self._listeners: list[socket.socket] = []
        self.admission = Admission(spec, log=log)
        self._live: dict[int, _Connection] = {}
        self._lock = threading.Lock()
        self._stopping = False

    def start(self) -> None:
        """Create the shm dir and bind both listeners (OSError if either endpoint fails)."""
        shm = Path(self.spec.shm_dir)
        if shm.is_symlink():
            raise OSError(errno.ELOOP, f"shm dir {shm} is a symlink; refusing to use it")
        shm.mkdir(parents=True, exist_ok=True)
        backlog = min(128, self.spec.max_connections)
        if self.spec.tcp_listen:
            tcp = socket.create_server((self.spec.tcp_host, self.spec.tcp_port), backlog=backlog)
            self._listeners.append(tcp)
            self.tcp_port = tcp.getsockname()[1]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec.unix_socket)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listeners.append(unix)
        unix.bind(self.spec.unix_socket)
        os.chmod(self.spec.unix_socket, SOCKET_MODE)
        unix.listen(backlog)

    # -- the selector loop -------------------------------------------------------------------------

    def serve(self, stop: socket.socket) -> None:
        """Accept and authenticate connections until ``stop`` becomes readable."""
        admission = self.admission
        backoff = 0.0
        paused_until = 0.0
        listening = True
        with selectors.DefaultSelector() as sel:
            for listener in self._listeners:
                listener.setblocking(False)
                sel.register(listener, selectors.EVENT_READ, "listen")
            sel.register(stop, selectors.EVENT_READ, "stop")
            while True:
                now = time.monotonic()
                if not listening and now >= paused_until:
                    for listener in self._listeners:
                        sel.register(listener, selectors.EVENT_READ, "listen")
                    listening = True
                timeout = admission.next_deadline(now + 3600) - now
                if not listening:
                    timeout = min(timeout, paused_until - now)
                for key, _ in sel.select(max(0.0, timeout)):
                    if key.data == "stop":
                        admission.drop_all(sel)
                        return
                    if key.data == "listen":
                        assert isinstance(key.fileobj, socket.socket)
                        try:
                            admission.accept(key.fileobj, sel)
                            backoff = 0.0
                        except OSError as exc:
                            if exc.errno not in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                                raise
                            # Out of descriptors: stop accepting for a while, keep serving sessions.
                            backoff = min(_BACKOFF_MAX_S, max(_BACKOFF_MIN_S, backoff * 2))
                            admission.accept_failed(exc, backoff)
                            if listening:
                                for listener in self._listeners:
                                    sel.unregister(listener)
                                listening = False
                            paused_until = time.monotonic() + backoff
                            break
                    else:
                        self._on_pending(key.data, sel)
                admission.expire(sel)

    def _on_pending(self, fd: int, sel: selectors.BaseSelector) -> None:
        pending = self.admission.get(fd)
        if pending is None:
            return
        try:
            if not pending.reader.fill():
                self.admission.drop(fd, sel, "")
                return
            while True:
                msg = pending.reader.next_buffered()
                if msg is None:
                    return
                if msg.op == Op.PING:  # the pid only to the claim's own pods (and the daemon)
                    pid = os.getpid() if pending.peer == "unix" else 0
                    pending.sock.send(
                        protocol.encode_reply(msg.op, msg.request_id, codes.ACL_SUCCESS, pid, tail=b"PONG")
                    )
                    continue
                conn, reply = self._hello(msg, pending)
                if conn is None:
                    with contextlib.suppress(OSError):
                        pending.sock.send(reply)
                    self.admission.drop(fd, sel, "")
                    return
                self._promote(fd, sel, pending, conn, reply)
                return
        except (BlockingIOError, InterruptedError):
            return
        except protocol.ProtocolError as exc:
            with contextlib.suppress(OSError):
                pending.sock.send(
                    protocol.encode_reply(Op.NONE, 0, codes.ACL_ERROR_INVALID_PARAM, tail=str(exc).encode())
                )
            self.admission.drop(fd, sel, f"before authentication: {exc}")
        except OSError:
            self.admission.drop(fd, sel, "")

    def _promote(
        self, fd: int, sel: selectors.BaseSelector, pending: Pending, conn: _Connection, reply: bytes
    ) -> None:
        """Hand an authenticated connection to its own thread."""
        self.admission.take(fd)
        sel.unregister(pending.sock)
        pending.sock.setblocking(True)
        pending.reader.max_frame_bytes = self.spec.max_frame_bytes
        with self._lock:
            self._live[fd] = conn
        conn.start(lambda: self._serve_session(conn, reply))

    # -- sessions ------------------------------------------------------------------------------------

    def _serve_session(self, conn: _Connection, hello_reply: bytes) -> None:
        session = conn.session
        try:
            conn.serve(hello_reply)
        except protocol.ProtocolError as exc:
            self.log.warning("closing session %d: %s", session.session_id, exc)
            with contextlib.suppress(OSError):
                conn.sendall(
                    protocol.encode_reply(Op.NONE, 0, codes.ACL_ERROR_INVALID_PARAM, tail=str(exc).encode())
                )
        except OSError:
            return
        finally:
            conn.stop()
            self.claim.close_session(session)
            with contextlib.suppress(OSError):
                conn.sock.close()
            with self._lock:
                self._live = {k: v for k, v in self._live.items() if v is not conn}

    def _hello(self, msg: protocol.Message, pending: Pending) -> tuple[_Connection | None, bytes]:
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
        try:
            conn = _Connection(self.claim, pending.sock, pending.reader, client_pid=client_pid)
        except SessionRefused as exc:
            return None, _error(msg, exc.code, exc.message)
        except OSError as exc:
            return None, _error(
                msg, codes.ACL_ERROR_INTERNAL_ERROR, f"cannot create the staging region: {exc}"
            )
        session = conn.session
        self.log.info(
            "session %d opened for client pid %d (%d of %d)",
            session.session_id,
            client_pid,
            self.claim.session_count(),
            self.spec.max_sessions,
        )
        staging = session.staging
        reply = protocol.encode_reply(
            msg.op,
            msg.request_id,
            codes.ACL_SUCCESS,
            os.getpid(),
            self.book.device_count(),
            staging.size,
            tail=staging.name.encode(),
        )
        return conn, reply

    def shutdown(self) -> None:
        """Stop accepting, end every session (releasing its resources) and remove the socket file."""
        self._stopping = True
        for listener in self._listeners:
            listener.close()
        self._listeners.clear()
        self.admission.shutdown()
        with self._lock:
            live = list(self._live.values())
        for item in live:
            item.session.cancel()
            with contextlib.suppress(OSError):
                item.sock.shutdown(socket.SHUT_RDWR)
        for item in live:
            if item.thread is not None:
                item.thread.join(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.spec.unix_socket)

    def _sessions_changed(self, count: int) -> None:
        """Record the session count next to the ready file (``flexnpu-smi`` and metrics read it)."""
        if self._stopping:
            return
        with contextlib.suppress(OSError):
            files.write_atomic(
                Path(self.spec.ready_file).with_suffix(".sessions"),
                f"{count}\n".encode(),
                mode=0o644,
                sync=False,
            )


class _Connection:
    """An authenticated connection and its session, which answers on it (it is the session's
    ``model_runs.Link``): its calls run on the connection's thread (``serve``), a blocking call off it
    (``_Waiters``), and a synchronous execution's reply may come from the thread that ends it."""

    def __init__(
        self, claim: Claim, sock: socket.socket, reader: protocol.FrameReader, *, client_pid: int
    ) -> None:
        self.sock = sock
        self.thread: threading.Thread | None = None
        self._reader = reader
        self._send_lock = threading.Lock()
        self._waiters = _Waiters(self._answer_later)
        self.session = claim.open_session(client_pid, unix=sock.family == socket.AF_UNIX, link=self)
        self._handle = self.session.handle
        self.pause = _ServingPause(self.session, sock, reader, self.dispatch)

    def start(self, run: Callable[[], None]) -> None:
        """Serve the connection on a thread of its own (``run``: the server's session loop)."""
        self.thread = threading.Thread(target=run, daemon=True, name="session")
        self.thread.start()

    def sendall(self, data: bytes) -> None:
        with self._send_lock:
            self.sock.sendall(data)

    def send_later(self, frame: bytes) -> None:
        """A late reply: the client may have gone meanwhile (its session is then being closed)."""
        try:
            with self._send_lock:
                self.sock.sendall(frame)
        except OSError:
            pass

    def _answer_later(self, msg: protocol.Message) -> None:
        reply = self._handle(msg)
        assert reply.__class__ is bytes  # waiting ops pass no descriptor
        with contextlib.suppress(OSError):
            self.sendall(reply)

    def dispatch(self, msg: protocol.Message) -> None:
        op = msg.op
        if op > _HELLO:  # every ACL op: the hot path first
            if op in WAITING_OPS and self.session.would_block(msg) and self._waiters.submit(msg):
                return  # replies may go out of order: clients match them by request id
            reply = self._handle(msg)
            if reply is None:
                return  # answered later by the work it queued
            with self._send_lock:
                if reply.__class__ is bytes:
                    self.sock.sendall(reply)
                else:
                    assert isinstance(reply, FdReply)
                    _send_with_fd(self.sock, reply)
        elif op == _PING:
            self.sendall(
                protocol.encode_reply(op, msg.request_id, codes.ACL_SUCCESS, os.getpid(), tail=b"PONG")
            )
        elif op == _HELLO:
            self.sendall(
                _error(msg, codes.ACL_ERROR_INVALID_PARAM, "this connection is already authenticated")
            )
        else:
            reply = self._handle(msg)
            assert reply.__class__ is bytes  # the pre-ACL ops pass no descriptor
            self.sendall(reply)

    def serve(self, hello_reply: bytes) -> None:
        """Answer calls until the client closes (ProtocolError: it broke the framing)."""
        pause, reader = self.pause, self._reader
        kept = pause.kept
        self.sendall(hello_reply)
        while True:
            if kept:
                msg = kept.popleft()
            else:
                read = reader.read()
                if read is None:
                    return
                msg = read
            pause.serving = not kept  # frames kept for later go first, in order
            self.dispatch(msg)

    def stop(self) -> None:
        self._waiters.stop()


class _Waiters:
    """Threads that answer one session's blocking calls (a synchronize, a synchronous model
    execution) off its thread, at most ``_MAX_WAITERS`` at once; kept for the next call, since
    starting a thread costs about a tenth of a 1 ms model execution."""

    def __init__(self, answer: Callable[[protocol.Message], None]) -> None:
        self._answer = answer
        self._queue: queue.SimpleQueue[protocol.Message | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0

    def submit(self, msg: protocol.Message) -> bool:
        """Hand ``msg`` to an idle waiter (or a new one); False when all are busy (run it inline)."""
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < _MAX_WAITERS:
                self._threads += 1
                threading.Thread(target=self._run, daemon=True, name="wait").start()
            else:
                return False
        self._queue.put(msg)
        return True

    def _run(self) -> None:
        while (msg := self._queue.get()) is not None:
            try:
                self._answer(msg)
            finally:
                with self._lock:
                    self._idle += 1

    def stop(self) -> None:
        with self._lock:
            for _ in range(self._threads):
                self._queue.put(None)
            self._threads = self._idle = 0


class _ServingPause:
    """How a session thread waits while it holds the die for a synchronous execution it runs
    itself (``Streams.run_now``): it keeps serving its connection, so the client's other threads
    are not held up. Frames are served in order until one that may wait for the session's work
    (it would wait for this very execution): that one and all after it are kept for the session
    loop (``kept``). The end of the stream or a broken read ends the session's work at once
    (``end``), as the session loop does; it meets the same end on its next read. The last
    ``_PRECISE_S`` or so of each wait is a plain timed wait on the cancel event, as in a worker
    thread: poll's millisecond timeout would overshoot the die time."""

    def __init__(
        self,
        session: Session,
        sock: socket.socket,
        reader: protocol.FrameReader,
        dispatch: Callable[[protocol.Message], None],
    ) -> None:
        self._cancel = session.streams.cancelled
        self._end = session.cancel
        self._reader = reader
        self._dispatch = dispatch
        self._poll = select.poll()
        self._poll.register(sock, select.POLLIN)
        self.kept: collections.deque[protocol.Message] = collections.deque()
        self.serving = True

    def is_set(self) -> bool:
        return self._cancel.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        deadline = time.monotonic() + (timeout if timeout is not None else 3600.0)
        while self.serving and not self._cancel.is_set():
            poll_ms = int((deadline - time.monotonic() - _PRECISE_S) * 1000)
            if poll_ms <= 0:
                break
            try:
                msg = self._reader.next_buffered()
                if msg is None:
                    if self._poll.poll(poll_ms) and not self._reader.fill():
                        self.serving = False  # the client is gone: so is its work
                        self._end()
                    continue
                if msg.op in _KEEP_WHILE_RUNNING:
                    self.kept.append(msg)
                    self.serving = False
                    continue
                self._dispatch(msg)
            except (OSError, protocol.ProtocolError):
                self.serving = False
                self._end()
        return self._cancel.wait(max(0.0, deadline - time.monotonic()))


def _send_with_fd(sock: socket.socket, reply: FdReply) -> None:
    """Send a reply frame with its descriptor attached to the frame's first byte (SCM_RIGHTS)."""
    sent = sock.sendmsg([reply.frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [reply.fd]))])
    if sent < len(reply.frame):
        sock.sendall(reply.frame[sent:])


def _error(msg: protocol.Message, code: int, text: str) -> bytes:
    return protocol.encode_reply(msg.op, msg.request_id, code, tail=text.encode())

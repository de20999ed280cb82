"""The aclserver's connections that have not authenticated yet: accepting them, their budgets and deadlines.

**Budgets** (issue 25 class 1: one pod's tokenless connections must not keep another claim's
tenant out). Authenticated sessions are bounded by ``max_sessions`` alone; no unauthenticated
connection counts against them. Unauthenticated connections have a budget of their own,
``max_connections - max_sessions``, once per listener: the unix socket (reachable only from the
claim's own pods) never competes with TCP. On TCP one peer (a remote address) holds at most
``per_peer_pending`` of them; when the TCP budget is full, a new peer's connection takes the place
of the oldest one of the peer holding the most, so a flood from a few addresses cannot keep a
new address out. A refused connection gets one error frame saying why, then is closed.

Each connection has an absolute deadline (``auth_timeout_ms`` after connect) for its HELLO to
succeed; ``expire`` closes those past it. Warnings about refused, dropped and timed-out
connections are logged at most once per kind every few seconds, and counted for the log line at
shutdown. The selector loop that serves these connections is ``server.Server``'s; this class is
only ever used from that one thread.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import time
from dataclasses import dataclass, field

from dra_driver.logs import ClaimLogger
from flexnpu_wire import codes
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op
from flexnpu_wire.launch import AclServerSpec

__all__ = ["Admission", "Pending"]

_PRE_AUTH_BUFFER = 1024
_WARN_EVERY_S = 5.0
_PER_PEER_PENDING = 8
"""Unauthenticated TCP connections one remote address holds at most (fewer if the budget is small)."""


@dataclass(slots=True)
class Pending:
    """A connection that has not authenticated yet (served by the selector loop)."""

    sock: socket.socket
    reader: protocol.FrameReader
    deadline: float
    peer: str
    """``unix``, or ``tcp:`` and the remote address."""


@dataclass(slots=True)
class _Counters:
    refused_full: int = 0
    accept_errors: int = 0
    timed_out: int = 0
    last_warning: dict[str, float] = field(default_factory=dict)


class Admission:
    """The unauthenticated connections of one aclserver, within their budgets (module docstring)."""

    def __init__(self, spec: AclServerSpec, *, log: ClaimLogger) -> None:
        self.auth_timeout_ms = spec.auth_timeout_ms
        self.log = log
        self._pending: dict[int, Pending] = {}
        self._peers: collections.Counter[str] = collections.Counter()
        """Unauthenticated connections per peer (``Pending.peer``)."""
        self.pending_cap = max(1, spec.max_connections - spec.max_sessions)
        """Unauthenticated connections at once, per listener."""
        self.per_peer_pending = max(1, min(_PER_PEER_PENDING, self.pending_cap // 2))
        self._counters = _Counters()

    def accept(self, listener: socket.socket, sel: selectors.BaseSelector) -> None:
        """Accept every connection waiting on ``listener``: register it with ``sel``, or refuse it."""
        deadline = time.monotonic() + self.auth_timeout_ms / 1000
        while True:
            try:
                conn, _addr = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            unix = conn.family == socket.AF_UNIX
            peer = "unix" if unix else f"tcp:{_addr[0]}"
            refusal = self._admit(peer, sel)
            if refusal:
                self._counters.refused_full += 1
                self._warn("full", f"refused a connection: {refusal}")
                with contextlib.suppress(OSError):
                    conn.setblocking(False)
                    conn.send(
                        protocol.encode_reply(
                            Op.NONE, 0, codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, tail=refusal.encode()
                        )
                    )
                conn.close()
                continue
            conn.setblocking(False)
            if conn.family != socket.AF_UNIX:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = protocol.FrameReader(
                conn, protocol.MAX_PRE_AUTH_FRAME_BYTES, initial_buffer=_PRE_AUTH_BUFFER
            )
            self._pending[conn.fileno()] = Pending(conn, reader, deadline, peer)
            self._peers[peer] += 1
            sel.register(conn, selectors.EVENT_READ, conn.fileno())

    def accept_failed(self, exc: OSError, backoff: float) -> None:
        """Out of descriptors: the server stops accepting for ``backoff`` seconds."""
        self._counters.accept_errors += 1
        self._warn("accept", f"accept failed ({exc.strerror}); pausing {backoff:.2f}s")

    def _admit(self, peer: str, sel: selectors.BaseSelector) -> str:
        """Why a new unauthenticated connection from ``peer`` is refused ("": it is admitted,
        possibly in the place of another TCP peer's oldest; see the module docstring)."""
        tcp = peer != "unix"
        if tcp and self._peers[peer] >= self.per_peer_pending:
            return (
                f"too many connections from {peer[4:]} before authentication"
                f" (limit {self.per_peer_pending} per peer)"
            )
        pool = [p for p in self._peers if (p != "unix") == tcp]
        if sum(self._peers[p] for p in pool) < self.pending_cap:
            return ""
        heaviest = max(pool, key=lambda p: self._peers[p])
        if not tcp or self._peers[heaviest] <= self._peers[peer] + 1:
            return f"too many connections (limit {self.pending_cap} unauthenticated on the {peer[:4].rstrip(':')} socket)"
        oldest = min(
            (fd for fd, p in self._pending.items() if p.peer == heaviest),
            key=lambda fd: self._pending[fd].deadline,
        )
        self.drop(oldest, sel, f"made room for a connection from {peer[4:]} ({heaviest[4:]} held the most)")
        return ""

    def get(self, fd: int) -> Pending | None:
        return self._pending.get(fd)

    def next_deadline(self, default: float) -> float:
        """The earliest deadline of a connection (``default`` when there is none)."""
        return min((p.deadline for p in self._pending.values()), default=default)

    def expire(self, sel: selectors.BaseSelector) -> None:
        """Close every connection whose HELLO has not succeeded by its deadline."""
        now = time.monotonic()
        for fd in [fd for fd, p in self._pending.items() if p.deadline <= now]:
            self._counters.timed_out += 1
            self.drop(fd, sel, f"no HELLO within {self.auth_timeout_ms} ms of connect")

    def take(self, fd: int) -> Pending | None:
        """Take a connection out of the unauthenticated ones (None: it is not one)."""
        pending = self._pending.pop(fd, None)
        if pending is not None:
            self._peers[pending.peer] -= 1
            if not self._peers[pending.peer]:
                del self._peers[pending.peer]
        return pending

    def drop(self, fd: int, sel: selectors.BaseSelector, why: str) -> None:
        """Close an unauthenticated connection (``why``: logged, if not empty)."""
        pending = self.take(fd)
        if pending is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            sel.unregister(pending.sock)
        pending.sock.close()
        if why:
            self._warn("drop", f"closed an unauthenticated connection: {why}")

    def drop_all(self, sel: selectors.BaseSelector) -> None:
        for fd in list(self._pending):
            self.drop(fd, sel, "")

    def shutdown(self) -> None:
        """Close every unauthenticated connection and log what was refused or timed out."""
        c = self._counters
        if c.refused_full or c.accept_errors or c.timed_out:
            self.log.info(
                "connections refused at the cap: %d, accept errors: %d, closed without HELLO in time: %d",
                c.refused_full,
                c.accept_errors,
                c.timed_out,
            )
        for pending in list(self._pending.values()):
            pending.sock.close()
        self._pending.clear()
        self._peers.clear()

    def _warn(self, kind: str, message: str) -> None:
        """Log at most one line per kind every few seconds (a flood must not flood the log)."""
        now = time.monotonic()
        if now - self._counters.last_warning.get(kind, 0.0) >= _WARN_EVERY_S:
            self._counters.last_warning[kind] = now
            self.log.warning("%s", message)

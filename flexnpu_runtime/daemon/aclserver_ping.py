"""Asks an aclserver whether it still serves: the unauthenticated PING op on its unix socket.

Process liveness (``processes.is_alive``) says the process exists; this says it answers. Used by
``List`` to report a live but unresponsive aclserver as ``Unknown``. Never raises.

The socket lives in the claim's shm dir, which the tenant's container can write: whatever answers
there may be the tenant's. So a PING (issue 25, class 4):

- checks the peer's credentials (``SO_PEERCRED``) before it sends a byte: the listener must be the
  aclserver process the daemon started (its pid), or the answer is "not our aclserver";
- runs under one absolute deadline, connect to last byte, whatever the peer does (a peer that
  answers a byte at a time cannot stretch it);
- reads at most one small frame.

:class:`Pinger` runs PINGs off the caller's thread, at most one in flight per claim however many
callers ask (the daemon's API workers wait on it up to their own deadline, never on the socket).
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from flexnpu_wire import framing as protocol

__all__ = ["PING_DEADLINE", "Answer", "Pinger", "ping"]

_REQUEST_ID = 0x464E  # arbitrary, echoed back
_MAX_FRAME = 4096
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
PING_DEADLINE = 1.0
"""Seconds one PING may take, connect to answer, whatever the socket's peer does."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What a PING found: the pid the aclserver named, or None and why not."""

    pid: int | None
    reason: str = ""


def peer_pid(sock: socket.socket) -> int:
    """The pid of the process on the other end of a connected unix socket (its listener's, for a server)."""
    pid, _uid, _gid = _UCRED.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
    return int(pid)


def ping(unix_socket: str, *, expect_pid: int | None = None, timeout: float = PING_DEADLINE) -> Answer:
    """PING the aclserver on ``unix_socket`` within ``timeout`` seconds in all.

    ``expect_pid``: the process that must hold the socket's other end (the aclserver the daemon
    started); a socket held by any other process is not asked anything.
    """
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(left())
            s.connect(unix_socket)
            if expect_pid is not None:
                holder = peer_pid(s)
                if holder != expect_pid:
                    return Answer(
                        None, f"the socket is held by pid {holder}, not by the aclserver (pid {expect_pid})"
                    )
            s.settimeout(left())
            s.sendall(protocol.encode(protocol.Op.PING, _REQUEST_ID))
            buf = bytearray()
            need = 4
            while len(buf) < need:
                s.settimeout(left())
                chunk = s.recv(need - len(buf))
                if not chunk:
                    return Answer(None, "the socket closed before it answered")
                buf += chunk
                if need == 4 and len(buf) == 4:
                    (length,) = struct.unpack(">I", buf)
                    if length > _MAX_FRAME:
                        return Answer(None, f"it answered a frame of {length} bytes")
                    need = 4 + length
            msg = protocol.decode(bytes(buf), 4, need - 4)
    except TimeoutError:
        return Answer(None, f"no answer within {timeout:g} s")
    except (OSError, protocol.ProtocolError) as exc:
        return Answer(None, str(exc) or type(exc).__name__)
    if msg.op != protocol.Op.PING or msg.request_id != _REQUEST_ID or len(msg.ints) < 2 or msg.ints[0] != 0:
        return Answer(None, "it did not answer PING")
    return Answer(int(msg.ints[1]))


class Pinger:
    """PINGs on their own threads, one in flight per claim; callers wait up to a deadline.

    A socket that never answers holds one thread for :data:`PING_DEADLINE` at most, and every
    caller that asks about it meanwhile shares that one PING instead of starting another.
    """

    def __init__(self, *, timeout: float = PING_DEADLINE) -> None:
        self.timeout = timeout
        self._lock = threading.Lock()
        self._inflight: dict[str, tuple[threading.Event, list[Answer]]] = {}

    def ping_all(
        self, targets: Mapping[str, tuple[str, int]], *, wait: float | None = None
    ) -> dict[str, Answer]:
        """claim UID → answer, for ``targets`` (claim UID → (unix socket, expected pid)), all PINGed
        at once; waits ``wait`` seconds in all (default: one PING's deadline) and reports a claim
        whose PING has not ended by then as not answering."""
        waits = {uid: self._start(uid, path, pid) for uid, (path, pid) in targets.items()}
        deadline = time.monotonic() + (self.timeout if wait is None else wait)
        out: dict[str, Answer] = {}
        for uid, (done, result) in waits.items():
            if done.wait(max(0.0, deadline - time.monotonic())) and result:
                out[uid] = result[0]
            else:
                out[uid] = Answer(None, f"no answer within {self.timeout:g} s")
        return out

    def _start(self, uid: str, path: str, pid: int) -> tuple[threading.Event, list[Answer]]:
        with self._lock:
            running = self._inflight.get(uid)
            if running is not None:
                return running
            slot: tuple[threading.Event, list[Answer]] = (threading.Event(), [])
            self._inflight[uid] = slot

        def run() -> None:
            try:
                slot[1].append(ping(path, expect_pid=pid, timeout=self.timeout))
            finally:
                with self._lock:
                    self._inflight.pop(uid, None)
                slot[0].set()

        threading.Thread(target=run, name=f"ping-{uid[:8]}", daemon=True).start()
        return slot

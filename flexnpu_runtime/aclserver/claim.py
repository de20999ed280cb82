"""What the sessions of one claim share: the backend, the host-memory budget and the session limit.

``Claim`` opens and closes sessions (at most ``max_sessions``) and books host memory — host
buffers of the data link and the model bytes a session is loading — against the claim's own
host-memory limit (the launch spec's ``host_memory_bytes``: ``hostMemory`` of its VnpuConfig,
by default its device memory quota). Device memory is the quota book's (``quota.py``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.dispatch import Session
from flexnpu_wire import codes
from flexnpu_wire.launch import AclServerSpec

__all__ = ["MAX_HOST_BUFFERS", "Claim", "SessionRefused"]

MAX_HOST_BUFFERS = 256
"""Host buffers of one claim at once (each is a region file and a mapping)."""
_session_ids = itertools.count(1)


class SessionRefused(Exception):
    """HELLO was valid but no session can be opened (the claim is at its session limit)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Claim:
    """What the sessions of one claim share; thread-safe."""

    def __init__(
        self,
        backend: Backend,
        spec: AclServerSpec,
        *,
        on_sessions_changed: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self.host_limit = spec.host_memory_limit
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._host_bytes = 0
        self._host_buffers = 0
        self._opening = 0
        self._on_change = on_sessions_changed

    def open_session(self, client_pid: int, *, unix: bool = False) -> Session:
        """A new session (SessionRefused at the limit; OSError if its staging region fails);
        ``unix``: its connection can pass file descriptors (the sealed-memfd data link)."""
        with self._lock:
            if len(self._sessions) + self._opening >= self.spec.max_sessions:
                raise SessionRefused(
                    codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
                    f"the aclserver of claim {self.spec.claim_uid} already serves {len(self._sessions)}"
                    f" sessions, its limit (max_sessions {self.spec.max_sessions})",
                )
            session_id = next(_session_ids)
            self._opening += 1
        try:
            session = Session(
                self.backend,
                shm_dir=self.spec.shm_dir,
                staging_bytes=self.spec.staging_bytes,
                claim=self,
                session_id=session_id,
                client_pid=client_pid,
                unix=unix,
            )
        finally:
            with self._lock:
                self._opening -= 1
        with self._lock:
            self._sessions[session_id] = session
            count = len(self._sessions)
        self._on_change(count)
        return session

    def close_session(self, session: Session) -> None:
        """Release everything ``session`` holds (idempotent)."""
        session.close()
        with self._lock:
            gone = self._sessions.pop(session.session_id, None) is not None
            count = len(self._sessions)
        if gone:
            self._on_change(count)

    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def reserve_host(self, size: int, *, buffer: bool = True) -> None:
        """Book ``size`` bytes of host memory against the claim's host-memory limit (AclFailure
        207001 if over; ``buffer``: it is one more host buffer, also bounded in number)."""
        limit = self.host_limit
        with self._lock:
            if self._host_bytes + size > limit or (buffer and self._host_buffers >= MAX_HOST_BUFFERS):
                raise AclFailure(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"host memory of {size} bytes refused: {self._host_bytes} bytes in {self._host_buffers}"
                    f" host buffers already, the limit is {limit} bytes (the claim's hostMemory)"
                    f" and {MAX_HOST_BUFFERS} buffers",
                )
            self._host_bytes += size
            self._host_buffers += buffer

    def release_host(self, size: int, *, buffer: bool = True) -> None:
        with self._lock:
            self._host_bytes -= size
            self._host_buffers -= buffer

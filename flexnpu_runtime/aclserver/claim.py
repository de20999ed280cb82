"""What the sessions of one claim share: the backend, the quota book, the host-memory budget and
the session limit.

``Claim`` opens and closes sessions (at most ``max_sessions``) and hands each the quota book
(device memory, ``quota.py``) and the claim's host-memory budget (``hostmem.py``: host buffers
of the data link and the model bytes a session is loading, against ``hostMemory``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from flexnpu_runtime.aclserver.backend import Backend
from flexnpu_runtime.aclserver.dispatch import Session
from flexnpu_runtime.aclserver.hostmem import HostBudget
from flexnpu_runtime.aclserver.model_runs import Link
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes
from flexnpu_wire.launch import AclServerSpec

__all__ = ["Claim", "SessionRefused"]

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
        book: QuotaBook,
        spec: AclServerSpec,
        *,
        on_sessions_changed: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.backend = backend
        self.book = book
        self.spec = spec
        self.host = HostBudget(spec.host_memory_limit)
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._opening = 0
        self._on_change = on_sessions_changed

    def open_session(self, client_pid: int, *, unix: bool = False, link: Link | None = None) -> Session:
        """A new session (SessionRefused at the limit; OSError if its staging region fails);
        ``unix``: its connection can pass file descriptors (the sealed-memfd data link); ``link``:
        the connection it answers on."""
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
                self.book,
                shm_dir=self.spec.shm_dir,
                staging_bytes=self.spec.staging_bytes,
                host=self.host,
                sessions=self.session_count,
                session_id=session_id,
                client_pid=client_pid,
                unix=unix,
                link=link,
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

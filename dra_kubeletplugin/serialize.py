"""Serialisation of prepare/unprepare calls: an in-process lock plus, optionally, a file lock, waited for until a deadline.

The kubelet may send concurrent calls; the Go helper serialises them by default. During a
rolling update two plugin instances run side by side and either may get any call, so they
additionally take an ``fcntl.flock`` on a shared file (``<plugin dir>/serialize.lock``). The wait
for either is bounded by the kubelet's deadline for the call (:meth:`CallSerializer.hold`): a
call that could not get its turn in time is answered, not left queued past the point where the
kubelet stopped listening.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dra_kubeletplugin import errors

__all__ = ["CallSerializer", "TurnMissed"]

_POLL_FIRST = 0.002
_POLL_MAX = 0.05


class TurnMissed(errors.ApiUnavailable):
    """Another call held the serializer until this call's deadline; nothing of this call ran."""


class CallSerializer:
    """``with serializer.hold(deadline): ...`` runs one call at a time (``with serializer:`` waits forever).

    **Parameters:**

    * ``lock_file`` — when given, also hold an exclusive ``flock`` on this file (created with mode
      0600 if missing) so that several processes serialise too.
    * ``enabled`` — ``False`` makes :meth:`hold` a no-op (the Go helper's ``Serialize(false)``).
    """

    def __init__(self, lock_file: Path | None = None, *, enabled: bool = True) -> None:
        self._lock = threading.Lock()
        self._lock_file = lock_file
        self._enabled = enabled

    @contextlib.contextmanager
    def hold(self, deadline: float | None = None) -> Iterator[None]:
        """Hold the call's turn; :class:`TurnMissed` if it does not come before ``deadline`` (monotonic)."""
        if not self._enabled:
            yield
            return
        timeout = -1.0 if deadline is None else max(deadline - time.monotonic(), 0.0)
        if not self._lock.acquire(timeout=timeout):
            raise TurnMissed(
                "another prepare or unprepare call held the serializer until this call's deadline"
            )
        try:
            fd = self._flock(deadline) if self._lock_file is not None else None
            try:
                yield
            finally:
                if fd is not None:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
        finally:
            self._lock.release()

    def __enter__(self) -> CallSerializer:
        self._cm = self.hold(None)
        self._cm.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._cm.__exit__(None, None, None)

    def _flock(self, deadline: float | None) -> int:
        """The file lock, waited for with a short backoff until ``deadline`` (another process holds it)."""
        assert self._lock_file is not None
        try:
            self._lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            raise errors.InvalidArgument(f"cannot open the serialize lock {self._lock_file}: {exc}") from exc
        pause = _POLL_FIRST
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if deadline is None else fcntl.LOCK_NB))
                return fd
            except BlockingIOError:
                if time.monotonic() >= deadline:  # type: ignore[operator]
                    os.close(fd)
                    raise TurnMissed(
                        f"another plugin instance held {self._lock_file} until this call's deadline"
                    ) from None
                time.sleep(pause)  # another process holds it: poll (flock has no timeout)
                pause = min(pause * 2, _POLL_MAX)
            except OSError as exc:
                os.close(fd)
                raise errors.InvalidArgument(f"cannot lock {self._lock_file}: {exc}") from exc

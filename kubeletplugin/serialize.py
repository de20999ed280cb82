"""Serialisation of prepare/unprepare calls: an in-process lock plus, optionally, a file lock.

The kubelet may send concurrent calls; the Go helper serialises them by default. During a
rolling update two plugin instances run side by side and either may get any call, so they
additionally take an ``fcntl.flock`` on a shared file (``<plugin dir>/serialize.lock``).
"""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path
from types import TracebackType

from dra_driver.errors import ErrorCode, Unavailable


class CallSerializer:
    """A re-usable context manager: ``with serializer: ...`` runs one call at a time.

    **Parameters:**

    * ``lock_file`` — when given, also hold an exclusive ``flock`` on this file (created
      with mode 0600 if missing) so that several processes serialise too.
    """

    def __init__(self, lock_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._lock_file = lock_file
        self._fd: int | None = None

    @property
    def lock_file(self) -> Path | None:
        return self._lock_file

    def __enter__(self) -> CallSerializer:
        self._lock.acquire()
        if self._lock_file is None:
            return self
        try:
            self._lock_file.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
            except BaseException:
                os.close(fd)
                raise
        except OSError as exc:
            self._lock.release()
            raise Unavailable(
                f"cannot lock {self._lock_file}: {exc}", code=ErrorCode.INTERNAL, field="serialize_lock_file"
            ) from exc
        self._fd = fd
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
        finally:
            self._lock.release()

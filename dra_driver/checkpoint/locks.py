"""Per-claim locks: one prepare or unprepare of a claim at a time, in this process and across processes.

This module owns :class:`ClaimLocks` (a ``threading.Lock`` and an ``flock`` on ``<dir>/<uid>.lock``
per claim), the handle its holder marks when the claim's entry is gone, and :class:`ClaimBusy`,
the error a caller gets when the claim stays held past its timeout.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dra_driver import files
from dra_driver.errors import ErrorCode, Unavailable


class ClaimBusy(Unavailable):
    """Another thread or process is working on this claim (its claim lock is held)."""


@dataclass(slots=True)
class ClaimLockHandle:
    drop: bool = False  # set by the holder once the claim's entry is gone: the lock file goes too


class ClaimLocks:
    """One lock per claim, held for a whole prepare or unprepare of that claim (network retries
    included), so that the checkpoint lock itself is only ever held for one short step.

    In-process, a ``threading.Lock`` per UID; across processes (two plugin instances in a
    rolling update, ``flexnpu-smi``), an ``flock`` on ``<dir>/<uid>.lock``. The file is unlinked
    by the holder when the claim's entry is gone (``drop=True``); a waiter that then gets the
    lock on the unlinked file sees that its inode is no longer the path's and tries again.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._mutex = threading.Lock()
        self._local: dict[str, threading.Lock] = {}
        self._held: set[str] = set()

    def busy(self, uid: str) -> bool:
        """Whether this process is working on ``uid`` right now."""
        with self._mutex:
            return uid in self._held

    @contextlib.contextmanager
    def hold(self, uid: str, *, timeout: float) -> Iterator[ClaimLockHandle]:
        """Hold claim ``uid`` (raises :class:`ClaimBusy` after ``timeout`` seconds)."""
        with self._mutex:
            local = self._local.setdefault(uid, threading.Lock())
        deadline = time.monotonic() + timeout
        acquired = local.acquire(timeout=timeout) if timeout > 0 else local.acquire(blocking=False)
        if not acquired:
            raise _busy(uid, timeout)
        handle = ClaimLockHandle()
        try:
            with self._mutex:
                self._held.add(uid)
            path = self.directory / f"{uid}.lock"
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            while True:
                try:
                    with files.locked(path, timeout=max(deadline - time.monotonic(), 0.0)) as fd:
                        if not _same_file(fd, path):
                            continue  # the previous holder unlinked it: lock the new one
                        try:
                            yield handle
                        finally:  # also when the holder raised (a rollback that dropped the entry)
                            if handle.drop:
                                files.remove_nofollow(path)
                        return
                except files.LockTimeout as exc:
                    raise _busy(uid, timeout) from exc
        finally:
            with self._mutex:
                self._held.discard(uid)
                if handle.drop:
                    self._local.pop(uid, None)
            local.release()


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    return os.fstat(fd).st_ino == st.st_ino


def _busy(uid: str, timeout: float) -> ClaimBusy:
    return ClaimBusy(
        f"another prepare or unprepare of this claim is still running (waited {timeout:g} s)",
        code=ErrorCode.DEVICE_BUSY,
        claim_uid=uid,
        field="claim",
    )

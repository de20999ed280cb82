"""One daemon instance owns a node's daemon state: an ``flock`` on ``<state-dir>/daemon.lock``, held for life.

Two instances can run at once — a DaemonSet rolling update whose new pod starts while the old
one is still terminating, a surge, a second daemon started by hand. Only the holder of this lock
recovers the registry, adopts aclservers and serves the API; another waits (logging who holds
it) and serves nothing, so its readiness probe fails until it has adopted. The kernel releases
the lock when its holder dies, however it dies. The lock file is never inherited by an
aclserver (``O_CLOEXEC``; launches close every other descriptor), so a lock cannot outlive its
daemon. It is the same primitive as the plugin's ``serialize.lock`` (``dra_driver/files.py``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from dra_driver import files

__all__ = ["held", "holder"]

log = logging.getLogger("flexnpu.daemon")

WAIT_STEP = 1.0
"""Seconds of each attempt while another instance holds the lock (a stop request is seen in between)."""
REPORT_EVERY = 30.0


@contextlib.contextmanager
def held(path: Path, stop: threading.Event, *, instance: str = "") -> Iterator[bool]:
    """Hold the daemon lock at ``path`` for the ``with`` block; yields False if ``stop`` was set first."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    reported = 0.0
    with contextlib.ExitStack() as stack:
        while not stop.is_set():
            try:
                fd = stack.enter_context(files.locked(path, timeout=WAIT_STEP))
            except files.LockTimeout:
                now = time.monotonic()
                if now - reported >= REPORT_EVERY:
                    log.warning("waiting for %s: another daemon instance holds it (%s)", path, holder(path))
                    reported = now
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} instance {instance or '-'}\n".encode(), 0)
            yield True
            return
    yield False


def holder(path: Path) -> str:
    """Who holds (or last held) the lock, as its file says."""
    try:
        return path.read_text(errors="replace").strip()[:200] or "unknown"
    except OSError:
        return "unknown"

"""Supervision: notice an aclserver's exit as it happens, say why, restart it within its budget.

One thread waits on a pidfd per running aclserver (no polling while nothing happens; without
pidfd support it checks every ``monitor_interval``; a full pass also runs every
:data:`RESYNC_SECONDS`). A new aclserver only adds a pidfd; the process table is read when a
pidfd fires. An exit is recorded as Exited with its reason — the exit status when the daemon is
its parent, and an OOM kill when its cgroup counted one more than when it started (its memory
bound, ``bounds.py``) — then the aclserver is restarted, at most ``max_restarts`` times. Past
the budget it stays Exited (``AclserverDown`` on the claim) until the node registers it again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import threading

from dra_driver.daemon_api.values import Endpoints, EntityState
from dra_driver.errors import FlexNPUError
from dra_driver.logs import claim_logger
from flexnpu_runtime.daemon import processes
from flexnpu_runtime.daemon.aclservers import Aclservers
from flexnpu_runtime.daemon.entities import Claim
from flexnpu_runtime.daemon.model import Entity
from flexnpu_runtime.daemon.settings import Settings

__all__ = ["RESYNC_SECONDS", "Supervisor"]

log = logging.getLogger("flexnpu.daemon")
MIB = 1024 * 1024

RESYNC_SECONDS = 30.0
"""A full liveness pass this often even when no pidfd fired (a safety net, not the mechanism)."""


class Supervisor:
    """The monitor thread (``start``/``stop``) and one liveness pass (``check_once``)."""

    def __init__(self, settings: Settings, aclservers: Aclservers) -> None:
        self.settings = settings
        self.aclservers = aclservers
        self.entities = aclservers.entities
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="aclserver-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=self.settings.stop_timeout + self.settings.ready_timeout)

    def wake(self) -> None:
        """A new aclserver runs: watch its pidfd."""
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def check_once(self, only: set[tuple[int, int]] | None = None) -> None:
        """Notice aclservers that died: mark them Exited and restart each within the budget.
        ``only``: look at these (pid, start time) alone — those whose pidfd fired."""
        for entity, claim in self.entities.running():
            if only is not None and (entity.pid, entity.pid_start_time) not in only:
                continue
            if claim.launched is not None:
                claim.launched.exit_status()  # reap our child so it does not linger as a zombie
            if processes.is_alive(entity.pid, entity.pid_start_time):
                continue
            if not claim.lock.acquire(blocking=False):
                continue  # a register/unregister of this claim is in progress; look again later
            try:
                self._handle_exit(claim, entity)
            finally:
                claim.lock.release()

    def _loop(self) -> None:
        watched: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, start time)
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                try:
                    quiet = self._watch_running(sel, watched)
                    events = sel.select(RESYNC_SECONDS if quiet else self.settings.monitor_interval)
                    full = not events or not quiet  # a timeout is a resync; polling mode checks all
                    fired: set[tuple[int, int]] = set()
                    for key, _ in events:
                        if key.fileobj == self._wake_r:
                            with contextlib.suppress(BlockingIOError):
                                os.read(self._wake_r, 4096)
                            continue
                        assert isinstance(key.fileobj, int)
                        sel.unregister(key.fileobj)
                        os.close(key.fileobj)
                        ident = watched.pop(key.fileobj, None)
                        if ident is not None:
                            fired.add(ident)
                    if self._stop.is_set():
                        break
                    if full or fired:
                        self.check_once(None if full else fired)
                except Exception:
                    log.exception("monitor pass failed")
                    self._stop.wait(self.settings.monitor_interval)
            for fd in watched:
                os.close(fd)

    def _watch_running(self, sel: selectors.BaseSelector, watched: dict[int, tuple[int, int]]) -> bool:
        """Open a pidfd for every running aclserver not watched yet. False when the monitor must
        poll instead: pidfds are unavailable, or a dead aclserver still waits to be handled."""
        want = {(e.pid, e.pid_start_time) for e, _ in self.entities.running()}
        have = set(watched.values())
        for fd, ident in list(watched.items()):
            if ident not in want:
                sel.unregister(fd)
                os.close(fd)
                del watched[fd]
        quiet = True
        for pid, start in want - have:
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                quiet = False  # already gone: a pass handles it soon
                continue
            except (OSError, AttributeError):
                return False
            if not processes.is_alive(pid, start):  # exited (or the pid was reused) before we opened it
                os.close(fd)
                quiet = False
                continue
            watched[fd] = (pid, start)
            sel.register(fd, selectors.EVENT_READ)
        return quiet

    def _handle_exit(self, claim: Claim, entity: Entity) -> None:
        uid = entity.claim_uid
        clog = claim_logger(uid, entity.request.namespace, entity.request.name, base=log)
        why = self._why(claim, entity)
        exited = dataclasses.replace(entity, state=EntityState.EXITED, message=why)
        if not self.entities.replace(entity, exited):
            return  # changed meanwhile
        clog.warning("%s (restarts so far: %d)", why, entity.restarts)
        self.aclservers.stop(entity, claim=claim)
        if entity.restarts >= self.settings.max_restarts:
            return
        restarted = dataclasses.replace(exited, restarts=entity.restarts + 1)
        try:
            started = self.aclservers.restart(claim, restarted)
        except FlexNPUError as exc:
            self.entities.update_if_present(
                dataclasses.replace(restarted, message=f"{why}; restart failed: {exc}")
            )
            clog.error("restart failed: %s", exc)
            return
        clog.warning("restarted aclserver: pid %d on %s", started.pid, describe(started.endpoints))

    def _why(self, claim: Claim, entity: Entity) -> str:
        """How the aclserver ended, as far as the daemon can tell."""
        status = claim.launched.exit_status() if claim.launched is not None else None
        why = f"aclserver pid {entity.pid} exited" + (f" with status {status}" if status is not None else "")
        cgroups = self.aclservers.cgroups
        if cgroups is not None and entity.cgroup:
            fig = cgroups.figures(entity.claim_uid)
            if fig.oom_kills > entity.oom_kills:
                limit = f"{fig.memory_max // MIB} MiB" if fig.memory_max >= 0 else "its bound"
                why += f": killed by the kernel's OOM killer at its memory bound ({limit}, cgroup {entity.cgroup})"
            if fig.task_limit_hits > entity.task_limit_hits:
                limit = f"pids.max {fig.tasks_max}" if fig.tasks_max >= 0 else "its bound"
                why += (
                    f": it hit its task bound ({limit}, cgroup {entity.cgroup}; refused"
                    f" {fig.task_limit_hits - entity.task_limit_hits} thread or process starts)"
                )
        return why


def describe(endpoints: Endpoints) -> str:
    return f"tcp {endpoints.tcp_host}:{endpoints.tcp_port}, unix {endpoints.unix_socket}"

"""The daemon's lifecycle logic: register, unregister, list, re-adopt at start, monitor.

Owns the in-memory view of the registry and is the only writer of the registry file. Every
entity is recorded (state Starting) before its aclserver starts and updated once it is ready,
so a crash at any point leaves something :meth:`Manager.recover` can converge from: it
re-adopts live aclservers (same PID, start time and command line) and removes the rest.

Locking: one lock per claim serialises register/unregister/restart of that claim (held while
a process starts or stops); one short global lock guards the map and the registry file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import selectors
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dra_driver import files as dra_files
from dra_driver import wirefiles
from dra_driver.daemon import files, liveness, processes, registry, shmfs, spec, usage, validation
from dra_driver.daemon.launcher import Launcher
from dra_driver.daemon.model import DieCapacity, Entity
from dra_driver.daemon_api.values import (
    Endpoints,
    EntityInfo,
    EntityState,
    RegisterRequest,
    RegisterResult,
    ShareUsage,
)
from dra_driver.errors import ErrorCode, FlexNPUError, StateError
from dra_driver.logs import claim_logger
from flexnpu_wire.launch import DEFAULT_MAX_SESSIONS, DEFAULT_MAX_SHARES_PER_DIE, DEFAULT_STAGING_BYTES

log = logging.getLogger("flexnpu.daemon")

RESYNC_SECONDS = 30.0
"""A full liveness pass this often even when no pidfd fired (a safety net, not the mechanism)."""


@dataclass(frozen=True, slots=True)
class Settings:
    """Where things live and how long to wait (built once by ``main``)."""

    state_dir: Path
    run_dir: Path
    shm_root: Path
    tcp_host: str
    ready_timeout: float = 10.0
    stop_timeout: float = 2.0
    monitor_interval: float = 0.5
    max_restarts: int = 1
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_shares_per_die: int = DEFAULT_MAX_SHARES_PER_DIE
    shm_mount: bool = False
    """Each claim's shm dir is its own tmpfs, sized from its quota (needs CAP_SYS_ADMIN)."""
    shm_problem: str = ""
    """Why that bound cannot be kept here (``dra_driver/daemon/shmroot.py``): no aclserver starts."""

    @property
    def registry_file(self) -> Path:
        return self.state_dir / registry.FILE_NAME

    @property
    def ledger_dir(self) -> Path:
        return self.shm_root / spec.LEDGER_DIR_NAME

    def paths(self, claim_uid: str) -> spec.ClaimPaths:
        return spec.claim_paths(claim_uid, run_dir=self.run_dir, shm_root=self.shm_root)


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :meth:`Manager.recover` found and did."""

    adopted: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    killed_orphans: tuple[int, ...] = ()
    removed_dirs: tuple[str, ...] = ()
    corrupt_copy: Path | None = None


@dataclass(slots=True)
class _Claim:
    lock: threading.Lock = field(default_factory=threading.Lock)
    launched: processes.Launched | None = None


class Manager:
    """Registered claims and their aclservers. Thread-safe; see the module docstring."""

    def __init__(self, settings: Settings, dies: Mapping[int, DieCapacity], launcher: Launcher) -> None:
        self.settings = settings
        self.launcher = launcher
        self.dies = dict(dies)
        self.started_at = time.time()
        self._entities: dict[str, Entity] = {}
        self._claims: dict[str, _Claim] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._sampler = usage.Sampler()
        self._ledgers = usage.LedgerReader(self.settings.ledger_dir)
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # ---- start-up ----

    def recover(self) -> RecoveryReport:
        """Load the registry, re-adopt live aclservers, remove dead ones and orphans. Call once."""
        s = self.settings
        corrupt_copy: Path | None = None
        try:
            loaded = registry.load(s.registry_file)
        except StateError as exc:
            corrupt_copy = registry.quarantine(s.registry_file)
            log.error("%s; kept a copy at %s, starting with an empty registry", exc, corrupt_copy)
            loaded = []
        adopted: dict[str, Entity] = {}
        removed: list[str] = []
        for entity in loaded:
            clog = claim_logger(entity.claim_uid, entity.request.namespace, entity.request.name, base=log)
            if entity.state is EntityState.RUNNING and processes.is_alive(
                entity.pid, entity.pid_start_time, entity.cmdline
            ):
                adopted[entity.claim_uid] = entity
                clog.info("re-adopted aclserver pid %d", entity.pid)
                continue
            if entity.pid:
                processes.stop_group(entity.pid, start_time=entity.pid_start_time, timeout=s.stop_timeout)
            files.remove_claim_files(s.paths(entity.claim_uid))
            removed.append(entity.claim_uid)
            clog.warning("removed %s entry (aclserver pid %d not running)", entity.state, entity.pid)
        owned_pids = {e.pid for e in adopted.values()}
        killed: list[int] = []
        for pid, why in processes.find_aclservers(spec.specs_dir(s.run_dir), run_dir=s.run_dir):
            if pid in owned_pids:
                continue
            st = processes.stat(pid)
            if st is None:
                continue
            if st.pgrp == pid:  # it leads its group, as our aclservers do: stop the whole group
                processes.stop_group(pid, start_time=st.start_time, timeout=0.5)
            else:
                processes.kill(pid)
            killed.append(pid)
            log.warning("killed orphan aclserver pid %d (%s; not in the registry)", pid, why)
        removed_dirs = self._remove_unowned_files(set(adopted))
        with self._lock:
            self._entities = adopted
            self._persist()
        return RecoveryReport(
            adopted=tuple(sorted(adopted)),
            removed=tuple(removed),
            killed_orphans=tuple(killed),
            removed_dirs=tuple(removed_dirs),
            corrupt_copy=corrupt_copy,
        )

    def _remove_unowned_files(self, owned: set[str]) -> list[str]:
        s = self.settings
        removed: list[str] = []
        if s.shm_root.is_dir():
            for d in sorted(s.shm_root.iterdir()):
                if d.name != spec.LEDGER_DIR_NAME and d.name not in owned and d.is_dir():
                    files.remove_claim_files(s.paths(d.name))
                    removed.append(str(d))
        spec_dir = spec.specs_dir(s.run_dir)
        if spec_dir.is_dir():
            for f in sorted(spec_dir.iterdir()):
                if spec.claim_uid_of_file(f.name) not in owned:
                    f.unlink(missing_ok=True)
        for name in removed:
            log.warning("removed shm dir %s (no registry entry owns it)", name)
        return removed

    # ---- API ----

    def register(self, request: RegisterRequest) -> RegisterResult:
        """Start the claim's aclserver, or return the running one for an identical request."""
        uid = request.claim_uid
        clog = claim_logger(uid, request.namespace, request.name, base=log)
        with self._claim(uid) as claim:
            with self._lock:
                decision = validation.check_register(
                    request, dies=self.dies, entities=self._entities.values()
                )
                entity = decision.existing
                if (
                    entity is not None
                    and entity.state is EntityState.RUNNING
                    and processes.is_alive(entity.pid, entity.pid_start_time)
                ):
                    return RegisterResult(uid, entity.pid, entity.endpoints, existing=True)
                if entity is None:
                    paths = self.settings.paths(uid)
                    entity = Entity(
                        request=request,
                        state=EntityState.STARTING,
                        endpoints=Endpoints(
                            tcp_host=request.tcp_host or self.settings.tcp_host,
                            unix_socket=str(paths.unix_socket),
                            shm_dir=str(paths.shm_dir),
                        ),
                    )
                    self._entities[uid] = entity
                    # Visible before the process starts; made durable while it starts (in _start).
                    self._persist(sync=False)
                    new = True
                else:
                    new = False  # registered but not running: start it again below
            if not new and entity.pid:  # leftovers of the previous process group, if any
                processes.stop_group(
                    entity.pid, start_time=entity.pid_start_time, timeout=self.settings.stop_timeout
                )
            try:
                started = self._start(claim, entity, tcp_port=0) if new else self._restart(claim, entity)
            except BaseException:
                if new:
                    self._discard(claim, entity)
                raise
            clog.info("aclserver pid %d ready on %s", started.pid, _describe(started.endpoints))
            return RegisterResult(uid, started.pid, started.endpoints, existing=not new)

    def unregister(self, claim_uid: str) -> bool:
        """Stop the claim's aclserver group and remove its files. False if it was not registered."""
        if not validation.CLAIM_UID_RE.match(claim_uid):
            return False
        with self._claim(claim_uid) as claim:
            with self._lock:
                entity = self._entities.get(claim_uid)
            if entity is None:
                files.remove_claim_files(self.settings.paths(claim_uid))
                return False
            self._discard(claim, entity)
            claim_logger(claim_uid, entity.request.namespace, entity.request.name, base=log).info(
                "unregistered; aclserver pid %d stopped", entity.pid
            )
            return True

    def list(self, *, probe: bool = False) -> list[EntityInfo]:
        """Every registered claim with its process state and usage per vNPU.

        Liveness comes from the process table (exits are noticed by the monitor as they happen);
        ``probe`` also PINGs each running aclserver (a live but silent one is reported Unknown)
        and reads its RSS and session count; without it (the node's periodic watch) those are -1
        and a List costs a few /proc reads and one pass over the cached die ledgers.
        """
        with self._lock:
            snapshot = sorted(self._entities.values(), key=lambda e: e.claim_uid)
        figures = self._ledgers.figures(
            self.settings.ledger_dir, (s.die_phy_id for e in snapshot for s in e.request.shares)
        )
        out = []
        for e in snapshot:
            state, message = e.state, e.message
            alive = processes.is_alive(e.pid, e.pid_start_time)
            if state is EntityState.RUNNING and not alive:
                state = EntityState.EXITED
            elif probe and state is EntityState.RUNNING and liveness.ping(e.endpoints.unix_socket) != e.pid:
                state, message = EntityState.UNKNOWN, f"aclserver pid {e.pid} runs but does not answer PING"
            sessions = usage.sessions(self.settings.paths(e.claim_uid).sessions) if alive and probe else -1
            shares = []
            for s in e.request.shares:
                key = (e.claim_uid, s.virtual_id)
                fig = figures.get(key)
                shares.append(
                    ShareUsage(
                        share=s,
                        memory_used_bytes=fig.mem_used if fig else -1,
                        compute_used_percent=self._sampler.percent(key, fig.consumed_us) if fig else -1,
                        compute_used_us=fig.consumed_us if fig else -1,
                        sessions=sessions,
                    )
                )
            out.append(
                EntityInfo(
                    entity_id=e.claim_uid,
                    namespace=e.request.namespace,
                    name=e.request.name,
                    shares=tuple(shares),
                    pid=e.pid,
                    state=state,
                    endpoints=e.endpoints,
                    restarts=e.restarts,
                    rss_bytes=processes.rss_bytes(e.pid) if alive and probe else -1,
                    started_at=e.started_at,
                    message=message,
                )
            )
        self._sampler.forget((e.claim_uid, s.virtual_id) for e in snapshot for s in e.request.shares)
        return out

    def set_dies(self, dies: Mapping[int, DieCapacity]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Serve the dies a new discovery found; returns (added, removed) physical IDs. Registered
        claims on a removed die keep their aclservers (nothing alive is stopped); new ones are refused."""
        with self._lock:
            added = tuple(sorted(dies.keys() - self.dies.keys()))
            removed = tuple(sorted(self.dies.keys() - dies.keys()))
            self.dies = dict(dies)
        return added, removed

    def entity_count(self) -> int:
        with self._lock:
            return len(self._entities)

    # ---- monitor ----

    def start_monitor(self) -> None:
        self._monitor = threading.Thread(target=self._monitor_loop, name="aclserver-monitor", daemon=True)
        self._monitor.start()

    def stop_monitor(self) -> None:
        self._stop.set()
        self._wake()
        if self._monitor is not None:
            self._monitor.join(timeout=self.settings.stop_timeout + self.settings.ready_timeout)

    def check_once(self) -> None:
        """Notice aclservers that died: mark them Exited and restart each up to max_restarts times."""
        with self._lock:
            running = [
                (e, self._claims.setdefault(e.claim_uid, _Claim()))  # adopted entities have no _Claim yet
                for e in self._entities.values()
                if e.state is EntityState.RUNNING
            ]
        for entity, claim in running:
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

    def _monitor_loop(self) -> None:
        """Wait for aclserver exits on their pidfds (no polling while nothing happens); without
        pidfd support, check every ``monitor_interval``. A full pass also runs every
        ``RESYNC_SECONDS`` as a safety net."""
        watched: dict[int, tuple[int, int]] = {}  # pidfd -> (pid, start time)
        with selectors.DefaultSelector() as sel:
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                try:
                    quiet = self._watch_running(sel, watched)
                    timeout = RESYNC_SECONDS if quiet else self.settings.monitor_interval
                    events = sel.select(timeout)
                    for key, _ in events:
                        if key.fileobj == self._wake_r:
                            with contextlib.suppress(BlockingIOError):
                                os.read(self._wake_r, 4096)
                        else:
                            assert isinstance(key.fileobj, int)
                            sel.unregister(key.fileobj)
                            os.close(key.fileobj)
                            watched.pop(key.fileobj, None)
                    if self._stop.is_set():
                        break
                    self.check_once()
                except Exception:
                    log.exception("monitor pass failed")
                    self._stop.wait(self.settings.monitor_interval)
            for fd in watched:
                os.close(fd)

    def _watch_running(self, sel: selectors.BaseSelector, watched: dict[int, tuple[int, int]]) -> bool:
        """Open a pidfd for every running aclserver not watched yet. False when the monitor must
        poll instead: pidfds are unavailable, or a dead aclserver still waits to be handled."""
        with self._lock:
            want = {
                (e.pid, e.pid_start_time) for e in self._entities.values() if e.state is EntityState.RUNNING
            }
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

    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _handle_exit(self, claim: _Claim, entity: Entity) -> None:
        uid = entity.claim_uid
        clog = claim_logger(uid, entity.request.namespace, entity.request.name, base=log)
        with self._lock:
            if self._entities.get(uid) != entity:
                return  # changed meanwhile
            status = claim.launched.exit_status() if claim.launched is not None else None
            why = f"aclserver pid {entity.pid} exited" + (
                f" with status {status}" if status is not None else ""
            )
            exited = dataclasses.replace(entity, state=EntityState.EXITED, message=why)
            self._entities[uid] = exited
            self._persist()
        clog.warning("%s (restarts so far: %d)", why, entity.restarts)
        processes.stop_group(entity.pid, start_time=entity.pid_start_time, timeout=self.settings.stop_timeout)
        if entity.restarts >= self.settings.max_restarts:
            return
        restarted = dataclasses.replace(exited, restarts=entity.restarts + 1)
        try:
            started = self._restart(claim, restarted)
        except FlexNPUError as exc:
            with self._lock:
                if uid in self._entities:
                    self._entities[uid] = dataclasses.replace(
                        restarted, message=f"{why}; restart failed: {exc}"
                    )
                    self._persist()
            clog.error("restart failed: %s", exc)
            return
        clog.warning("restarted aclserver: pid %d on %s", started.pid, _describe(started.endpoints))

    # ---- effects ----

    def _restart(self, claim: _Claim, entity: Entity) -> Entity:
        """Start ``entity`` again on its old TCP port if that is still free, else on a new one."""
        host, port = entity.endpoints.tcp_host, entity.endpoints.tcp_port
        if port and processes.port_free(host, port):
            try:
                return self._start(claim, entity, tcp_port=port)
            except FlexNPUError as exc:
                claim_logger(entity.claim_uid, base=log).warning(
                    "port %d unusable (%s); trying a new one", port, exc
                )
        return self._start(claim, entity, tcp_port=0)

    def _start(self, claim: _Claim, entity: Entity, *, tcp_port: int) -> Entity:
        """Launch the aclserver for ``entity`` and wait until it is ready; record it as Running."""
        s = self.settings
        uid = entity.claim_uid
        paths = s.paths(uid)
        tmpfs = (
            shmfs.size_for(
                host_memory_bytes=sum(sh.host_memory_limit for sh in entity.request.shares),
                max_sessions=s.max_sessions,
                staging_bytes=DEFAULT_STAGING_BYTES,
            )
            if s.shm_mount
            else None
        )
        if s.shm_problem:  # a tenant could fill the node's shared memory: refused, naming why
            raise StateError(
                f"no aclserver is started: {s.shm_problem}",
                code=ErrorCode.SHM_UNBOUNDED,
                claim_uid=uid,
                field="shm-mount",
            )
        try:
            files.prepare_shm_dir(paths, ledger_dir=s.ledger_dir, tmpfs_bytes=tmpfs)
        except OSError as exc:
            raise StateError(
                f"cannot prepare the shm dir {paths.shm_dir}: {exc.strerror or exc}",
                code=ErrorCode.INTERNAL,
                claim_uid=uid,
                field="shm_dir",
            ) from exc
        doc = spec.build_spec(
            entity.request,
            paths=paths,
            shm_root=s.shm_root,
            tcp_host=entity.endpoints.tcp_host,
            tcp_port=tcp_port,
            max_sessions=s.max_sessions,
            max_shares_per_die=s.max_shares_per_die,
        )
        wirefiles.write_spec(paths.spec, doc)
        launched = self.launcher.launch(spec_path=paths.spec, stderr_path=paths.stderr)
        claim.launched = launched
        try:
            dra_files.fsync_file(
                s.registry_file
            )  # the Starting record, made durable while the aclserver starts
            ready = processes.wait_ready(
                launched,
                ready_path=paths.ready,
                stderr_path=paths.stderr,
                timeout=s.ready_timeout,
                claim_uid=uid,
            )
        except BaseException:
            processes.stop_group(
                launched.pid,
                start_time=launched.start_time,
                timeout=s.stop_timeout,
                reap=launched.exit_status,
            )
            raise
        running = dataclasses.replace(
            entity,
            state=EntityState.RUNNING,
            pid=launched.pid,
            pid_start_time=launched.start_time,
            cmdline=processes.cmdline(launched.pid) or launched.cmdline,
            endpoints=Endpoints(
                tcp_host=ready.tcp_host,
                tcp_port=ready.tcp_port,
                unix_socket=ready.unix_socket,
                shm_dir=str(paths.shm_dir),
            ),
            started_at=ready.started_at,
            message=entity.message if entity.restarts else "",
        )
        with self._lock:
            self._entities[uid] = running
            self._persist()
        self._wake()  # the monitor opens a pidfd for the new process
        return running

    def _discard(self, claim: _Claim, entity: Entity) -> None:
        """Stop the claim's group, remove its files and its registry entry."""
        s = self.settings
        launched = claim.launched
        pid, start_time = entity.pid, entity.pid_start_time
        if launched is not None and not pid:
            pid, start_time = launched.pid, launched.start_time
        reap = launched.exit_status if launched is not None else (lambda: None)
        if pid and not processes.stop_group(pid, start_time=start_time, timeout=s.stop_timeout, reap=reap):
            raise StateError(
                f"aclserver process group {pid} is still alive after SIGKILL",
                code=ErrorCode.INTERNAL,
                claim_uid=entity.claim_uid,
                field="pid",
            )
        files.remove_claim_files(s.paths(entity.claim_uid))
        with self._lock:
            self._entities.pop(entity.claim_uid, None)
            claim.launched = None
            self._persist()

    def _persist(self, *, sync: bool = True) -> None:
        """Write the registry (caller holds ``self._lock``)."""
        registry.save(self.settings.registry_file, self._entities.values(), sync=sync)

    @contextmanager
    def _claim(self, claim_uid: str) -> Iterator[_Claim]:
        with self._lock:
            claim = self._claims.setdefault(claim_uid, _Claim())
        with claim.lock:
            yield claim


def _describe(endpoints: Endpoints) -> str:
    return f"tcp {endpoints.tcp_host}:{endpoints.tcp_port}, unix {endpoints.unix_socket}"

"""Starting, restarting and stopping one claim's aclserver: shm dir, launch spec, cgroup, process.

Callers (``manager`` for register/unregister, ``supervision`` for restarts) hold the claim's
lock. Each start prepares the claim's shm dir and launch spec, makes its cgroup with its bounds
(``cgroups``; none when the node gives none), launches the process into that cgroup, waits for
its ready file and records it as Running. Stopping signals the process group, then empties the
cgroup (a process that left the group is still in it). Its captured stderr is retired, never
deleted, when the claim's files go (``claim_files.retire_stderr``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from dra_driver import files as dra_files
from dra_driver import wirefiles
from dra_driver.daemon_api.values import Endpoints, EntityState
from dra_driver.errors import ErrorCode, FlexNPUError, StateError
from dra_driver.logs import claim_logger
from flexnpu_runtime.daemon import bounds, claim_files, launch_spec, processes, shmfs
from flexnpu_runtime.daemon.cgroups import Cgroups
from flexnpu_runtime.daemon.entities import Claim, Entities
from flexnpu_runtime.daemon.launcher import Launcher
from flexnpu_runtime.daemon.model import Entity
from flexnpu_runtime.daemon.ownership import Doubt
from flexnpu_runtime.daemon.settings import Settings

__all__ = ["Aclservers"]

log = logging.getLogger("flexnpu.daemon")


class Aclservers:
    """Makes and stops the aclserver of one claim at a time (the caller holds its lock)."""

    def __init__(
        self,
        settings: Settings,
        launcher: Launcher,
        entities: Entities,
        *,
        cgroups: Cgroups | None,
        started: Callable[[], None] = lambda: None,
    ) -> None:
        self.settings = settings
        self.launcher = launcher
        self.entities = entities
        self.cgroups = cgroups
        self._started = started  # tells the supervisor a new process is there to watch
        self.doubts: dict[str, Doubt] = {}
        """Live aclservers recovery found without an entry, kept (``ownership``); by claim UID."""

    def settle_doubt(self, claim_uid: str, *, proof: str) -> bool:
        """The plugin's Register or Unregister of a kept claim proves whose it is: stop its kept
        aclserver if it is this daemon's (True); refuse (StateError) if another install's; False
        if nothing of the claim is kept. The caller holds the claim's lock."""
        doubt = self.doubts.get(claim_uid)
        if doubt is None:
            return False
        if not doubt.ours(self.settings.owner):
            raise StateError(
                f"a live aclserver no entry of this daemon owns serves this claim ({doubt.describe(self.settings.owner)});"
                " it is kept and not replaced: stop it through the daemon that started it",
                code=ErrorCode.DEVICE_BUSY,
                claim_uid=claim_uid,
                field="claim_uid",
            )
        for pid in doubt.pids:
            st = processes.stat(pid)
            if st is not None:
                processes.stop_group(pid, start_time=st.start_time, timeout=self.settings.stop_timeout)
        if self.cgroups is not None and self.cgroups.exists(claim_uid):
            self.cgroups.remove(claim_uid, timeout=max(self.settings.stop_timeout, 1.0))
        del self.doubts[claim_uid]
        log.warning("stopped the kept aclserver %s: %s", doubt.describe(self.settings.owner), proof)
        return True

    def bounds(self, entity: Entity) -> bounds.Bounds:
        s = self.settings
        return bounds.bounds_for(
            entity.request.shares,
            max_sessions=s.max_sessions,
            staging_bytes=s.staging_bytes,
            overhead_bytes=s.memory_overhead_bytes,
        )

    def restart(self, claim: Claim, entity: Entity) -> Entity:
        """Start ``entity`` again on its old TCP port if that is still free, else on a new one."""
        host, port = entity.endpoints.tcp_host, entity.endpoints.tcp_port
        if port and processes.port_free(host, port):
            try:
                return self.start(claim, entity, tcp_port=port)
            except FlexNPUError as exc:
                claim_logger(entity.claim_uid, base=log).warning(
                    "port %d unusable (%s); trying a new one", port, exc
                )
        return self.start(claim, entity, tcp_port=0)

    def start(self, claim: Claim, entity: Entity, *, tcp_port: int) -> Entity:
        """Launch the aclserver for ``entity`` and wait until it is ready; record it as Running."""
        s = self.settings
        uid = entity.claim_uid
        paths = s.paths(uid)
        tmpfs = (
            shmfs.size_for(
                host_memory_bytes=sum(sh.host_memory_limit for sh in entity.request.shares),
                max_sessions=s.max_sessions,
                staging_bytes=s.staging_bytes,
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
            claim_files.prepare_shm_dir(paths, ledger_dir=s.ledger_dir, tmpfs_bytes=tmpfs)
        except OSError as exc:
            raise StateError(
                f"cannot prepare the shm dir {paths.shm_dir}: {exc.strerror or exc}",
                code=ErrorCode.INTERNAL,
                claim_uid=uid,
                field="shm_dir",
            ) from exc
        doc = launch_spec.build_spec(
            entity.request,
            paths=paths,
            shm_root=s.shm_root,
            tcp_host=entity.endpoints.tcp_host,
            tcp_port=tcp_port,
            max_sessions=s.max_sessions,
            max_shares_per_die=s.max_shares_per_die,
        )
        wirefiles.write_spec(paths.spec, doc)
        procs = self.cgroups.create(uid, self.bounds(entity)) if self.cgroups is not None else ()
        before = self.cgroups.figures(uid) if self.cgroups is not None else None
        try:
            launched = self.launcher.launch(spec_path=paths.spec, stderr_path=paths.stderr, cgroup=procs)
        except FlexNPUError as exc:
            raise exc.for_claim(uid) from None
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
            cgroup=self.cgroups.relative(uid) if self.cgroups is not None else "",
            oom_kills=max(before.oom_kills, 0) if before is not None else 0,
            task_limit_hits=max(before.task_limit_hits, 0) if before is not None else 0,
        )
        self.entities.put(running)
        self._started()
        return running

    def stop(self, entity: Entity, *, claim: Claim | None = None) -> bool:
        """Stop the claim's process group and empty its cgroup; True when nothing of it is left."""
        s = self.settings
        launched = claim.launched if claim is not None else None
        pid, start_time = entity.pid, entity.pid_start_time
        if launched is not None and not pid:
            pid, start_time = launched.pid, launched.start_time
        reap = launched.exit_status if launched is not None else (lambda: None)
        gone = not pid or processes.stop_group(pid, start_time=start_time, timeout=s.stop_timeout, reap=reap)
        if self.cgroups is not None and self.cgroups.exists(entity.claim_uid):
            gone = self.cgroups.empty(entity.claim_uid, timeout=max(s.stop_timeout, 1.0)) and gone
        return gone

    def discard(self, claim: Claim, entity: Entity) -> None:
        """Stop the claim's aclserver, remove its files and cgroup and its registry entry."""
        if not self.stop(entity, claim=claim):
            raise StateError(
                f"aclserver process group {entity.pid} is still alive after SIGKILL",
                code=ErrorCode.INTERNAL,
                claim_uid=entity.claim_uid,
                field="pid",
            )
        self.remove_files(entity.claim_uid)
        self.entities.drop(entity.claim_uid, claim)

    def remove_files(self, claim_uid: str) -> None:
        """The claim's shm dir, spec, ready and sessions files and cgroup; its stderr is retired."""
        claim_files.remove_claim_files(self.settings.paths(claim_uid))
        if self.cgroups is not None:
            others = self.cgroups.owners(claim_uid) - {"", self.settings.owner}
            if others:  # another install's cgroup of the same name: never ours to empty
                log.warning(
                    "claim %s: left cgroup %s alone: another daemon's (%s)",
                    claim_uid,
                    self.cgroups.relative(claim_uid),
                    ", ".join(sorted(others)),
                )
            else:
                self.cgroups.remove(claim_uid)

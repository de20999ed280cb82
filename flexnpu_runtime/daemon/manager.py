"""The daemon's API behind its gRPC face: register, unregister, list, health; the parts wired together.

:class:`Manager` composes what each concern owns:

- ``entities``    the registered claims in memory, their locks, the registry file;
- ``aclservers``  starting, restarting and stopping one claim's aclserver (files, cgroup, process);
- ``recovery``    re-adoption and clean-up at start;
- ``supervision`` the pidfd monitor, exit reasons (OOM kills) and restarts within the budget.

Every entity is recorded (state Starting) before its aclserver starts and updated once it is
ready, so a crash at any point leaves something recovery can converge from.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

from dra_driver.daemon_api.values import (
    Endpoints,
    EntityInfo,
    EntityState,
    HealthInfo,
    RegisterRequest,
    RegisterResult,
    ShareUsage,
)
from dra_driver.logs import claim_logger
from flexnpu_runtime.daemon import aclserver_ping, processes, registration_rules, usage
from flexnpu_runtime.daemon.aclservers import Aclservers
from flexnpu_runtime.daemon.cgroup_layout import Figures
from flexnpu_runtime.daemon.cgroups import Cgroups
from flexnpu_runtime.daemon.entities import Entities
from flexnpu_runtime.daemon.launcher import Launcher
from flexnpu_runtime.daemon.model import DieCapacity, Entity
from flexnpu_runtime.daemon.recovery import RecoveryReport, recover
from flexnpu_runtime.daemon.settings import Settings
from flexnpu_runtime.daemon.supervision import RESYNC_SECONDS, Supervisor, describe

__all__ = ["RESYNC_SECONDS", "Manager", "RecoveryReport", "Settings"]

log = logging.getLogger("flexnpu.daemon")

VERSION = "0.1.0"


class Manager:
    """Registered claims and their aclservers. Thread-safe; see the module docstring.

    **Parameters:**
    * cgroups - the node's claim cgroups (``cgroups.open_cgroups``); None: aclservers run in the
      daemon's own cgroup, unbounded, for the reason ``cgroup_problem`` says.
    * instance - who answers ``Health`` (the daemon pod's UID).
    """

    def __init__(
        self,
        settings: Settings,
        dies: Mapping[int, DieCapacity],
        launcher: Launcher,
        *,
        cgroups: Cgroups | None = None,
        cgroup_problem: str = "",
        instance: str = "",
        install: str = "",
    ) -> None:
        """``install``: this daemon state's identity (``ownership.install_id``), on every cgroup it makes."""
        if install:
            settings = dataclasses.replace(settings, owner=install)
        self.settings = settings
        self.launcher = launcher
        self.dies = dict(dies)
        self.started_at = time.time()
        self.cgroups = cgroups
        self.cgroup_problem = cgroup_problem
        self.instance = instance
        self.adopted = False
        self.entities = Entities(settings.registry_file)
        self.aclservers = Aclservers(settings, launcher, self.entities, cgroups=cgroups, started=self._wake)
        self.supervisor = Supervisor(settings, self.aclservers)
        self._sampler = usage.Sampler()
        self._ledgers = usage.LedgerReader(self.settings.ledger_dir)
        self._pinger = aclserver_ping.Pinger()

    # ---- start-up ----

    def recover(self) -> RecoveryReport:
        """Re-adopt live aclservers, remove dead ones and orphans (``recovery``). Call once."""
        report = recover(self.settings, self.aclservers)
        self.adopted = True
        return report

    # ---- API ----

    def register(self, request: RegisterRequest) -> RegisterResult:
        """Start the claim's aclserver, or return the running one for an identical request."""
        uid = request.claim_uid
        clog = claim_logger(uid, request.namespace, request.name, base=log)
        with self.entities.claim(uid) as claim:
            if uid in self.aclservers.doubts:  # a valid request for it is the proof (``ownership``)
                with self.entities.locked() as table:
                    registration_rules.check_register(request, dies=self.dies, entities=table.values())
                self.aclservers.settle_doubt(uid, proof="the claim is registered again")
            with self.entities.locked() as table:
                decision = registration_rules.check_register(request, dies=self.dies, entities=table.values())
                entity = decision.existing
                if (
                    entity is not None
                    and entity.state is EntityState.RUNNING
                    and processes.is_alive(entity.pid, entity.pid_start_time)
                ):
                    return RegisterResult(uid, entity.pid, entity.endpoints, existing=True)
                new = entity is None
                if entity is None:
                    paths = self.settings.paths(uid)
                    entity = Entity(
                        request=request,
                        state=EntityState.STARTING,
                        endpoints=Endpoints(
                            tcp_host=request.tcp_host or self.settings.tcp_host,
                            tcp_port=request.tcp_port,
                            unix_socket=str(paths.unix_socket),
                            shm_dir=str(paths.shm_dir),
                        ),
                    )
                    table[uid] = entity
                    # Visible before the process starts; made durable while it starts (aclservers.start).
                    self.entities.save(sync=False)
            if not new:  # registered but not running: leftovers of the previous process go first
                self.aclservers.stop(entity, claim=claim)
            try:
                started = self.aclservers.restart(claim, entity)
            except BaseException:
                if new:
                    self.aclservers.discard(claim, entity)
                raise
            clog.info("aclserver pid %d ready on %s", started.pid, describe(started.endpoints))
            return RegisterResult(uid, started.pid, started.endpoints, existing=not new)

    def unregister(self, claim_uid: str) -> bool:
        """Stop the claim's aclserver group and remove its files. False if it was not registered."""
        if not registration_rules.CLAIM_UID_RE.match(claim_uid):
            return False
        with self.entities.claim(claim_uid) as claim:
            entity = self.entities.get(claim_uid)
            if entity is None:
                kept = self.aclservers.settle_doubt(claim_uid, proof="the claim is unregistered")
                self.aclservers.remove_files(claim_uid)
                return kept
            self.aclservers.discard(claim, entity)
            claim_logger(claim_uid, entity.request.namespace, entity.request.name, base=log).info(
                "unregistered; aclserver pid %d stopped", entity.pid
            )
            return True

    def list(self, *, probe: bool = False) -> list[EntityInfo]:
        """Every registered claim with its process state, usage per vNPU and cgroup figures.

        Liveness comes from the process table (exits are noticed by the monitor as they happen);
        ``probe`` also PINGs each running aclserver (a live but silent one is reported Unknown;
        all at once, on the pinger's threads, within one deadline: ``aclserver_ping``) and reads its RSS and session count; without it (the node's periodic watch) those are -1
        and a List costs a few /proc reads and one pass over the cached die ledgers.
        """
        snapshot = self.entities.snapshot()
        answers = (
            self._pinger.ping_all(
                {
                    e.claim_uid: (e.endpoints.unix_socket, e.pid)
                    for e in snapshot
                    if e.state is EntityState.RUNNING and processes.is_alive(e.pid, e.pid_start_time)
                }
            )
            if probe
            else {}
        )
        figures = self._ledgers.figures(
            self.settings.ledger_dir, (s.die_phy_id for e in snapshot for s in e.request.shares)
        )
        out = []
        for e in snapshot:
            state, message = e.state, e.message
            alive = processes.is_alive(e.pid, e.pid_start_time)
            if state is EntityState.RUNNING and not alive:
                state = EntityState.EXITED
            elif (
                state is EntityState.RUNNING and e.claim_uid in answers and answers[e.claim_uid].pid != e.pid
            ):
                answer = answers[e.claim_uid]
                state = EntityState.UNKNOWN
                message = f"aclserver pid {e.pid} runs but does not answer PING: " + (
                    answer.reason or f"the answer names pid {answer.pid}"
                )
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
            cg = self.cgroups.figures(e.claim_uid) if probe and self.cgroups and e.cgroup else Figures()
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
                    cgroup=e.cgroup,
                    memory_current_bytes=cg.memory_current,
                    memory_max_bytes=cg.memory_max,
                    memory_peak_bytes=cg.memory_peak,
                    tasks_current=cg.tasks_current,
                    tasks_max=cg.tasks_max,
                    cpu_weight=cg.cpu_weight,
                    oom_kills=cg.oom_kills,
                )
            )
        self._sampler.forget((e.claim_uid, s.virtual_id) for e in snapshot for s in e.request.shares)
        return out

    def set_dies(self, dies: Mapping[int, DieCapacity]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Serve the dies a new discovery found; returns (added, removed) physical IDs. Registered
        claims on a removed die keep their aclservers (nothing alive is stopped); new ones are refused."""
        with self.entities.locked():  # the lock a registration checks its die under
            added = tuple(sorted(dies.keys() - self.dies.keys()))
            removed = tuple(sorted(self.dies.keys() - dies.keys()))
            self.dies = dict(dies)
        return added, removed

    def entity_count(self) -> int:
        return self.entities.count()

    def health(self, pid: int) -> HealthInfo:
        return HealthInfo(
            ok=True,
            pid=pid,
            version=VERSION,
            entities=self.entity_count(),
            dies=len(self.dies),
            started_at=self.started_at,
            shm_problem=self.settings.shm_problem,
            adopted=self.adopted,
            cgroups=self.cgroups.describe() if self.cgroups is not None else "",
            cgroup_problem=self.cgroup_problem,
            instance=self.instance,
            die_ids=tuple(sorted(self.dies)),
        )

    # ---- monitor ----

    def start_monitor(self) -> None:
        self.supervisor.start()

    def stop_monitor(self) -> None:
        self.supervisor.stop()

    def check_once(self) -> None:
        self.supervisor.check_once()

    def _wake(self) -> None:
        self.supervisor.wake()

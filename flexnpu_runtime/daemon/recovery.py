"""Recovery at start: re-adopt every live aclserver of the registry, remove only what is proven gone.

Run once, by the one daemon instance holding the state's lock, before the API serves. An entry
is re-adopted when its process still runs with the recorded PID, start time and command line
(in the host PID namespace, so this holds across restarts of the daemon's container). Anything
else is removed: an entry whose process is gone (its files go, its stderr is retired), a live
aclserver no entry owns (found by its command line, our zygote's marker, or in a cgroup under
our parent that no entry owns), files no entry owns, and cgroups no entry owns once they are
empty. A registry that cannot be read is kept aside, never deleted.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from dra_driver.daemon_api.values import EntityState
from dra_driver.errors import StateError
from dra_driver.logs import claim_logger
from flexnpu_runtime.daemon import claim_files, launch_spec, processes, registration_rules, registry
from flexnpu_runtime.daemon.aclservers import Aclservers
from flexnpu_runtime.daemon.model import Entity
from flexnpu_runtime.daemon.settings import Settings

__all__ = ["RecoveryReport", "recover"]

log = logging.getLogger("flexnpu.daemon")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :func:`recover` found and did."""

    adopted: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    killed_orphans: tuple[int, ...] = ()
    removed_dirs: tuple[str, ...] = ()
    removed_cgroups: tuple[str, ...] = ()
    corrupt_copy: Path | None = None

    def describe(self) -> str:
        corrupt = f", corrupt registry kept at {self.corrupt_copy}" if self.corrupt_copy else ""
        return (
            f"adopted {len(self.adopted)}, removed {len(self.removed)}, killed {len(self.killed_orphans)}"
            f" orphans, removed {len(self.removed_dirs)} shm dirs and {len(self.removed_cgroups)} cgroups"
            f"{corrupt}"
        )


def recover(settings: Settings, aclservers: Aclservers) -> RecoveryReport:
    """Load the registry, re-adopt live aclservers, remove dead ones and orphans (see the module)."""
    s = settings
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
            where = f" in cgroup {entity.cgroup}" if entity.cgroup else ""
            clog.info("re-adopted aclserver pid %d%s", entity.pid, where)
            continue
        aclservers.stop(entity)
        aclservers.remove_files(entity.claim_uid)
        removed.append(entity.claim_uid)
        clog.warning("removed %s entry (aclserver pid %d not running)", entity.state, entity.pid)
    killed = _kill_orphans(s, aclservers, owned=adopted)
    removed_dirs = _remove_unowned_files(s, set(adopted))
    removed_cgroups = _remove_unowned_cgroups(aclservers, set(adopted))
    aclservers.entities.reset(adopted)
    return RecoveryReport(
        adopted=tuple(sorted(adopted)),
        removed=tuple(removed),
        killed_orphans=tuple(killed),
        removed_dirs=tuple(removed_dirs),
        removed_cgroups=tuple(removed_cgroups),
        corrupt_copy=corrupt_copy,
    )


def _kill_orphans(s: Settings, aclservers: Aclservers, *, owned: dict[str, Entity]) -> list[int]:
    owned_pids = {e.pid for e in owned.values()}
    killed: list[int] = []
    for pid, why in processes.find_aclservers(launch_spec.specs_dir(s.run_dir), run_dir=s.run_dir):
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
    return killed


def _remove_unowned_files(s: Settings, owned: set[str]) -> list[str]:
    removed: list[str] = []
    if s.shm_root.is_dir():
        for d in sorted(s.shm_root.iterdir()):
            if d.name != launch_spec.LEDGER_DIR_NAME and d.name not in owned and d.is_dir():
                claim_files.remove_claim_files(s.paths(d.name))
                removed.append(str(d))
    spec_dir = launch_spec.specs_dir(s.run_dir)
    if spec_dir.is_dir():
        for f in sorted(spec_dir.iterdir()):
            if f.is_dir() and not f.is_symlink():
                continue  # retired stderr files
            uid = launch_spec.claim_uid_of_file(f.name)
            if uid in owned:
                continue
            if f.name.endswith(".stderr.log"):
                claim_files.retire_stderr(f)
            else:
                f.unlink(missing_ok=True)
    for name in removed:
        log.warning("removed shm dir %s (no registry entry owns it)", name)
    return removed


def _remove_unowned_cgroups(aclservers: Aclservers, owned: set[str]) -> list[str]:
    """Cgroups under our parent that no entry owns: whatever still runs there is killed, then they go."""
    cgroups = aclservers.cgroups
    if cgroups is None:
        return []
    removed: list[str] = []
    for uid in sorted(cgroups.claims() - owned):
        if not registration_rules.CLAIM_UID_RE.match(uid):
            log.warning("left cgroup %s alone: not a claim UID this daemon makes", uid[:80])
            continue
        left = cgroups.members(uid)
        if left:
            log.warning("killing %s in cgroup %s (no registry entry owns it)", left, cgroups.relative(uid))
        if cgroups.remove(uid):
            removed.append(uid)
            log.info("removed stale cgroup %s", cgroups.relative(uid))
    return removed

"""Recovery at start: re-adopt every live aclserver of the registry, remove only what is proven gone.

Run once, by the one daemon instance holding the state's lock, before the API serves. An entry
is re-adopted when its process still runs with the recorded PID, start time and command line
(in the host PID namespace, so this holds across restarts of the daemon's container). An entry
whose process is gone is removed (its files go, its stderr is retired).

Nothing alive is removed on doubt (``ownership``): a live aclserver no entry owns (found by its
command line, our zygote's marker, or in a cgroup under the parent that no entry owns) may be
another install's, or ours with its entry lost with a damaged registry. It is kept with its
files and cgroup, reported and counted (:attr:`RecoveryReport.kept`). What goes is what is
provably nothing: files no entry and no live aclserver owns, and empty claim cgroups that carry
this daemon's install identity (or none). A registry that cannot be read is kept aside, never
deleted.
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
from flexnpu_runtime.daemon.ownership import Doubt
from flexnpu_runtime.daemon.settings import Settings

__all__ = ["RecoveryReport", "recover"]

log = logging.getLogger("flexnpu.daemon")


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """What :func:`recover` found and did."""

    adopted: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    kept: tuple[Doubt, ...] = ()
    """Live aclservers no entry owns: kept, never killed on doubt (``ownership``)."""
    removed_dirs: tuple[str, ...] = ()
    removed_cgroups: tuple[str, ...] = ()
    corrupt_copy: Path | None = None

    def describe(self) -> str:
        corrupt = f", corrupt registry kept at {self.corrupt_copy}" if self.corrupt_copy else ""
        return (
            f"adopted {len(self.adopted)}, removed {len(self.removed)}, kept {len(self.kept)} live aclservers"
            f" no entry owns, removed {len(self.removed_dirs)} shm dirs and {len(self.removed_cgroups)} cgroups"
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
    kept = _unowned_live(s, aclservers, owned=adopted)
    for doubt in kept:
        log.warning(
            "kept a live aclserver no registry entry owns (never killed on doubt): %s",
            doubt.describe(s.owner),
        )
    alive = set(adopted) | {d.claim_uid for d in kept}
    removed_dirs = _remove_unowned_files(s, alive)
    removed_cgroups = _remove_unowned_cgroups(aclservers, alive, install=s.owner)
    aclservers.entities.reset(adopted)
    aclservers.doubts = {d.claim_uid: d for d in kept}
    return RecoveryReport(
        adopted=tuple(sorted(adopted)),
        removed=tuple(removed),
        kept=kept,
        removed_dirs=tuple(removed_dirs),
        removed_cgroups=tuple(removed_cgroups),
        corrupt_copy=corrupt_copy,
    )


def _unowned_live(s: Settings, aclservers: Aclservers, *, owned: dict[str, Entity]) -> tuple[Doubt, ...]:
    """Live aclservers no entry owns: by their command line or our zygote's marker (under our run
    dir: this daemon's install, unless its state was replaced), and processes in claim cgroups
    under the parent no entry owns (by the identity the cgroup carries)."""
    owned_pids = {e.pid for e in owned.values()}
    by_uid: dict[str, Doubt] = {}
    for pid, why in processes.find_aclservers(launch_spec.specs_dir(s.run_dir), run_dir=s.run_dir):
        if pid in owned_pids:
            continue
        uid = _claim_of(pid)
        by_uid[uid or f"pid-{pid}"] = Doubt(uid, (pid,), s.owner, why)
    cgroups = aclservers.cgroups
    if cgroups is not None:
        for uid in sorted(cgroups.claims() - set(owned)):
            members = tuple(cgroups.members(uid))
            if not members:
                continue
            owners = cgroups.owners(uid) - {""}
            owner = owners.pop() if len(owners) == 1 else ""
            earlier = by_uid.pop(uid, None)
            pids = tuple(sorted(set(members) | set(earlier.pids if earlier else ())))
            by_uid[uid] = Doubt(
                uid, pids, owner or (earlier.owner if earlier else ""), f"cgroup {cgroups.relative(uid)}"
            )
    return tuple(by_uid[k] for k in sorted(by_uid))


def _claim_of(pid: int) -> str:
    """The claim UID an aclserver serves, from its process title or spec path ("" if not shown)."""
    args: tuple[str, ...] = processes.cmdline(pid) or ()
    if "--spec" in args and args.index("--spec") + 1 < len(args):
        return launch_spec.claim_uid_of_file(Path(args[args.index("--spec") + 1]).name)
    for word in args:
        if registration_rules.CLAIM_UID_RE.match(word):
            return word
    return ""


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


def _remove_unowned_cgroups(aclservers: Aclservers, alive: set[str], *, install: str) -> list[str]:
    """Empty claim cgroups under the parent that no entry owns and that carry our identity (or
    none): they go. One with processes, or another install's, stays (``ownership``)."""
    cgroups = aclservers.cgroups
    if cgroups is None:
        return []
    removed: list[str] = []
    for uid in sorted(cgroups.claims() - alive):
        if not registration_rules.CLAIM_UID_RE.match(uid):
            log.warning("left cgroup %s alone: not a claim UID this daemon makes", uid[:80])
            continue
        others = cgroups.owners(uid) - {"", install}
        if others:
            log.info(
                "left cgroup %s alone: another daemon's (%s)",
                cgroups.relative(uid),
                ", ".join(sorted(others)),
            )
            continue
        if cgroups.remove_if_empty(uid):  # a process that arrived since keeps it: nothing is killed
            removed.append(uid)
            log.info("removed stale cgroup %s", cgroups.relative(uid))
    return removed

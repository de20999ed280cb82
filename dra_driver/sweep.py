"""Orphan sweep: remove what is on the node but owned by no checkpoint entry.

Runs with the checkpoint locked (see :meth:`kubeletplugin.prepare.Preparer.locked`), so no
prepare is in flight and no entry can appear while it decides. What it looks at:

* aclserver groups in the daemon's registry whose claim UID no entry names → Unregister;
* CDI spec files of this driver's kind whose claim UID no entry names → delete;
* per-claim ``client.conf`` directories under ``<run-dir>/claims`` → delete;
* per-claim shm directories under the shm root that neither an entry nor the daemon owns → delete;
* hard-split vNPUs the driver's ledger says it made for a claim no entry names, and that no
  container uses → destroy (``dra_driver/vnpu/sweeping.py``; a vNPU made outside the driver is
  never an orphan).

The control link itself is node infrastructure and stays; this driver adds no per-claim
addresses to it. Each removal is reported to the caller (who logs it and posts an Event).
:func:`find` is the dry run: it only lists.
"""

from __future__ import annotations

import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dra_driver import cdi
from dra_driver.daemon_api.values import EntityInfo
from dra_driver.errors import Unavailable
from dra_driver.vnpu.sweeping import HardSweep


class DaemonView(Protocol):
    def list(self) -> list[EntityInfo]: ...

    def unregister(self, claim_uid: str) -> bool: ...


@dataclass(frozen=True, slots=True)
class Orphan:
    kind: str  # aclserver | cdi-spec | client-conf | shm-dir | hard-vnpu | vnpu-record
    uid: str
    ref: str  # what it is: a path, or "pid N"

    def describe(self) -> str:
        return f"{self.kind} {self.ref} (claim {self.uid})"


@dataclass(frozen=True, slots=True)
class SweepPlaces:
    cdi_dir: Path
    cdi_kind: cdi.Kind
    run_dir: Path
    shm_dir: Path
    hard: HardSweep | None = None


def find(owned: Collection[str], places: SweepPlaces, daemon: DaemonView | None) -> list[Orphan]:
    """Everything on the node that no claim UID in ``owned`` accounts for."""
    out: list[Orphan] = []
    daemon_uids: set[str] = set()
    if daemon is not None:
        try:
            for ent in daemon.list():
                daemon_uids.add(ent.entity_id)
                if ent.entity_id not in owned:
                    out.append(Orphan("aclserver", ent.entity_id, f"pid {ent.pid}"))
        except Unavailable:
            pass  # the daemon is down: its orphans wait for the next pass
    for uid, path in sorted(cdi.list_specs(places.cdi_dir, places.cdi_kind).items()):
        if uid not in owned:
            out.append(Orphan("cdi-spec", uid, str(path)))
    for d in _children(places.run_dir / "claims"):
        if d.name not in owned:
            out.append(Orphan("client-conf", d.name, str(d)))
    for d in _children(places.shm_dir):
        if d.name not in owned and d.name not in daemon_uids and not d.name.startswith("."):
            out.append(Orphan("shm-dir", d.name, str(d)))
    if places.hard is not None:
        for uid, vnpu_id, exists in places.hard.find(owned):
            out.append(Orphan("hard-vnpu" if exists else "vnpu-record", uid, f"vnpu {vnpu_id}"))
    return out


def remove(orphan: Orphan, daemon: DaemonView | None, places: SweepPlaces | None = None) -> None:
    if orphan.kind in ("hard-vnpu", "vnpu-record"):
        if places is not None and places.hard is not None:
            places.hard.remove(int(orphan.ref.split()[-1]))
    elif orphan.kind == "aclserver":
        if daemon is not None:
            daemon.unregister(orphan.uid)
    elif orphan.kind == "cdi-spec":
        cdi.remove_spec(Path(orphan.ref))
    else:
        shutil.rmtree(orphan.ref, ignore_errors=True)


def _children(parent: Path) -> list[Path]:
    try:
        return sorted(p for p in parent.iterdir() if p.is_dir() and not p.is_symlink())
    except FileNotFoundError:
        return []

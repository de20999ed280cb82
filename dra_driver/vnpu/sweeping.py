"""The hard-vNPU part of the orphan sweep (``dra_driver/sweep.py``): find and remove with proof.

A vNPU is an orphan only when the driver's ledger (``dra_driver/vnpu/ownership.py``) says the
driver made it, no checkpoint entry owns its claim, and no container uses it
(:func:`dra_driver.vnpu.planning.orphans`). A vNPU made outside the driver is never touched. When
the vNPUs cannot be listed or the ledger cannot be read, nothing is found this pass. A ledger
record whose vNPU no longer exists and whose claim has no entry is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from dra_driver import slices
from dra_driver.devices import Inventory
from dra_driver.errors import FlexNPUError, StateError
from dra_driver.vnpu import Vnpu, VnpuManager, held_by, ownership
from dra_driver.vnpu.planning import orphans

__all__ = ["HardSweep", "foreign_vnpus", "held_capacity"]


@dataclass(frozen=True)
class HardSweep:
    """What the sweep needs to judge and remove hard vNPUs."""

    manager: VnpuManager
    inventory: Callable[[], Inventory]
    state_dir: Path

    def find(self, owned: Collection[str]) -> list[tuple[str, int, bool]]:
        """(claim UID, vNPU ID, exists) of each orphan: a vNPU to destroy, or a stale record."""
        try:
            existing = self.manager.list()
        except FlexNPUError:
            return []  # cannot list: doubt keeps things, next pass
        book = ownership.load(self.state_dir)
        if book is None:
            return []
        out = [
            (book[v.vnpu_id], v.vnpu_id, True)
            for v in orphans(existing, ledger=book, owners=owned, checkpoint_readable=True)
        ]
        present = {v.vnpu_id for v in existing}
        out += [
            (uid, vid, False) for vid, uid in sorted(book.items()) if vid not in present and uid not in owned
        ]
        return out

    def remove(self, vnpu_id: int) -> None:
        """Destroy the vNPU (if it still exists), then drop its ledger record."""
        for v in self.manager.list():
            if v.vnpu_id != vnpu_id:
                continue
            if v.in_use:
                raise StateError(f"vNPU {vnpu_id} is in use by a container; not destroyed", field="vnpuID")
            die = self.inventory().by_phy_id(v.phy_id)
            if die is None:
                raise StateError(
                    f"vNPU {vnpu_id} is on die {v.phy_id}, which this node no longer has", field="vnpuID"
                )
            self.manager.destroy(die, vnpu_id)
        ownership.remove(self.state_dir, vnpu_id)


def foreign_vnpus(manager: VnpuManager, state_dir: Path) -> tuple[Vnpu, ...] | None:
    """vNPUs on the node that the driver did not make (not in its ledger); None if unknown.

    When the ledger cannot be read every vNPU counts as foreign, so its capacity is held back
    (doubt keeps things: a die is never offered twice).
    """
    try:
        existing = manager.list()
    except FlexNPUError:
        return None
    book = ownership.load(state_dir)
    return tuple(v for v in existing if book is None or v.vnpu_id not in book)


def held_capacity(vnpus: tuple[Vnpu, ...], inventory: Inventory) -> dict[int, slices.Held]:
    """What foreign vNPUs hold per die, for ``slices.build_pool(held=...)`` (pure)."""
    return {
        phy: slices.Held(aicore=a, aicpu=c, memory_mib=m, media=md, vnpus=n)
        for phy, (a, c, m, md, n) in held_by(vnpus, inventory).items()
    }

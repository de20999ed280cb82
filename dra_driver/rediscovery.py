"""What changed between two discoveries of a node's dies, and which dies may be published yet.

Pure. The node process (``kubeletplugin/rediscovery.py``) discovers again every ``--rediscover-seconds``
(an emulated inventory file or ``npu-smi``); on a change it makes the node able to serve the new
inventory (the emulated device root, the vNPU manager) and publishes a die only once every part
that serves it can: a die handed out as shares needs ``flexnpu-daemon`` to know it (the daemon
discovers on its own, ``flexnpu-daemon --rediscover-seconds``). A die that disappears is simply
no longer published; claims prepared on it stay as they are (nothing alive is removed on doubt).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from dra_driver.devices import Die, DieMode, Inventory

__all__ = ["Change", "describe", "needs_daemon", "withheld"]

SHARED_MODES = frozenset({DieMode.SOFT, DieMode.BOTH, DieMode.ALL})
HARD_MODES = frozenset({DieMode.HARD, DieMode.ALL})


@dataclass(frozen=True, slots=True)
class Change:
    added: tuple[int, ...] = ()
    removed: tuple[int, ...] = ()
    modes: tuple[tuple[int, str, str], ...] = ()  # (phy, before, after)
    health: tuple[tuple[int, str, str], ...] = ()
    other: bool = False  # driver/firmware versions, templates, a die's other facts

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.modes or self.health or self.other)

    def text(self) -> str:
        parts = []
        if self.added:
            parts.append(f"dies added {list(self.added)}")
        if self.removed:
            parts.append(f"dies removed {list(self.removed)}")
        parts += [f"die {p} mode {a} -> {b}" for p, a, b in self.modes]
        parts += [f"die {p} health {a} -> {b}" for p, a, b in self.health]
        if self.other and not parts:
            parts.append("die facts or versions changed")
        return "; ".join(parts) or "nothing"


def describe(old: Inventory, new: Inventory, mode_of: Callable[[Die, Inventory], DieMode]) -> Change:
    before = {d.phy_id: d for d in old.dies}
    after = {d.phy_id: d for d in new.dies}
    both = sorted(before.keys() & after.keys())
    modes = tuple(
        (p, str(mode_of(before[p], old)), str(mode_of(after[p], new)))
        for p in both
        if mode_of(before[p], old) != mode_of(after[p], new)
    )
    health = tuple(
        (p, str(before[p].health), str(after[p].health)) for p in both if before[p].health != after[p].health
    )
    other = old != new and not (before.keys() ^ after.keys()) and not modes and not health
    return Change(
        added=tuple(sorted(after.keys() - before.keys())),
        removed=tuple(sorted(before.keys() - after.keys())),
        modes=modes,
        health=health,
        other=other,
    )


def needs_daemon(mode: DieMode) -> bool:
    return mode in SHARED_MODES


def withheld(
    new: Inventory,
    mode_of: Callable[[Die, Inventory], DieMode],
    *,
    daemon_dies: Collection[int] | None,
    served_shared: Collection[int],
) -> frozenset[int]:
    """Dies of ``new`` not to publish yet: handed out as shares, not served as shares before, and not
    known to the daemon (``daemon_dies``; None: the daemon could not be asked)."""
    out = set()
    for die in new.dies:
        if not needs_daemon(mode_of(die, new)) or die.phy_id in served_shared:
            continue
        if daemon_dies is None or die.phy_id not in daemon_dies:
            out.add(die.phy_id)
    return frozenset(out)

"""The dies this node serves now: the discovered inventory, the dies withheld from publishing, each die's mode.

One object, shared by the preparer, the publisher and rediscovery (the only writer). The inventory
is discovered on first use (``flexnpu-smi`` may never need it); :meth:`ServedDies.replace` swaps
inventory and withheld dies as one, so a reader never sees one without the other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from dra_driver import rediscovery, slices
from dra_driver.devices import Die, DieMode, Inventory

__all__ = ["ServedDies"]


class ServedDies:
    """The inventory (discovered lazily), the withheld dies, and the mode each die is published in."""

    def __init__(self, discover: Callable[[], Inventory], *, default_mode: str) -> None:
        self._discover = discover
        self._state: tuple[Inventory, frozenset[int]] | None = None
        self.default_mode = DieMode(default_mode)

    @property
    def inventory(self) -> Inventory:
        return self._current()[0]

    @property
    def withheld(self) -> frozenset[int]:
        """Dies discovered but not published yet: not every part that serves them can (rediscovery)."""
        return self._current()[1]

    def _current(self) -> tuple[Inventory, frozenset[int]]:
        state = self._state
        if state is None:
            state = self._state = (self._discover(), frozenset())
        return state

    def replace(self, inventory: Inventory, withheld: frozenset[int]) -> None:
        self._state = (inventory, withheld)

    def mode_of(self, die: Die, inventory: Inventory) -> DieMode:
        return slices.resolve_mode(die, inventory, self.default_mode)

    def published(self) -> Inventory:
        """The inventory without the withheld dies: what the pool offers."""
        inventory, withheld = self._current()
        if not withheld:
            return inventory
        return dataclasses.replace(
            inventory, dies=tuple(d for d in inventory.dies if d.phy_id not in withheld)
        )

    def offers_templates(self, inventory: Inventory) -> bool:
        """Whether any die of ``inventory`` is published with hard-split templates."""
        return any(self.mode_of(d, inventory) in rediscovery.HARD_MODES for d in inventory.dies)

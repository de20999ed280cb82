"""Device discovery: one interface, several backends.

A backend answers one question, "which dies does this node have?", as an
:class:`~dra_driver.devices.Inventory`:

* :mod:`.emulated` reads an inventory file (machines without NPUs, tests, demos);
* :mod:`.npu_smi` runs ``npu-smi`` on a real Ascend node.

Callers build the backend once with :func:`from_config` and call ``discover()`` whenever
they need a fresh view. This package decides nothing about publishing or sharing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from dra_driver.devices import Inventory
from dra_driver.discovery.emulated import EmulatedDiscovery
from dra_driver.discovery.npu_smi import NpuSmiDiscovery

__all__ = ["Discovery", "EmulatedDiscovery", "NpuSmiDiscovery", "from_config"]


class Discovery(Protocol):
    """A discovery backend. ``discover`` raises InvalidInput (bad file or output) or Unavailable."""

    def discover(self) -> Inventory: ...


def from_config(*, inventory: Path | None, npu_smi: str) -> Discovery:
    """The emulated backend when an inventory file is given, else ``npu-smi``.

    Usage: ``discovery.from_config(inventory=config.inventory, npu_smi=config.npu_smi).discover()``.
    """
    if inventory is not None:
        return EmulatedDiscovery(inventory)
    return NpuSmiDiscovery(npu_smi)

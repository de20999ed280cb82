"""The node's hard-split vNPUs: one manager, built once, on from the start or from the first die that offers templates.

:class:`NodeVnpus` is what the preparer (its ``hard-vnpu`` effects, :class:`~kubeletplugin.hardsplit.HardVnpus`),
the reconciler's orphan sweep (:class:`~dra_driver.vnpu.sweeping.HardSweep`) and the publisher (capacity
held by vNPUs made outside the driver) share. Both are built here, once, over this object as their
:class:`~dra_driver.vnpu.VnpuManager`: when rediscovery finds a die that now offers templates,
:meth:`NodeVnpus.serve` replaces the backend inside and turns the side on; nobody else is told.

While off (no die offers templates), every manager call raises ``StateError`` (``VnpuFailed``):
a claim with a template device fails naming it, and the sweep, which cannot list, finds nothing
(doubt keeps things).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

from dra_driver import vnpu
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, StateError
from dra_driver.templates import Template
from dra_driver.vnpu import Vnpu, VnpuManager
from dra_driver.vnpu.sweeping import HardSweep
from kubeletplugin.hardsplit import HardVnpus

__all__ = ["NodeVnpus"]

log = logging.getLogger("flexnpu.node")


class NodeVnpus:
    """A :class:`VnpuManager` that forwards to this node's backend; ``effects`` and ``sweep`` use it."""

    def __init__(
        self,
        *,
        inventory: Callable[[], Inventory],
        emulated: bool,
        device_root: Path,
        npu_smi: str,
        state_dir: Path,
        on: bool,
    ) -> None:
        self._inventory = inventory
        self._emulated = emulated
        self._device_root = device_root
        self._npu_smi = npu_smi
        self.state_dir = state_dir
        self._lock = threading.Lock()
        self._backend = self._build(inventory())
        self.on = on
        """Whether any die offers hard-split templates (at start, or since a rediscovery)."""
        self.effects = HardVnpus(self, inventory, state_dir)
        self.sweep = HardSweep(self, inventory, state_dir)

    def _build(self, inventory: Inventory) -> VnpuManager:
        return vnpu.from_config(
            inventory=inventory, emulated=self._emulated, device_root=self._device_root, npu_smi=self._npu_smi
        )

    def serve(self, inventory: Inventory) -> None:
        """From now on, serve the dies of ``inventory`` (a die of it offers templates)."""
        backend = self._build(inventory)
        with self._lock:
            if not self.on:
                log.info("a die now offers hard-split templates: the vNPU manager is started")
            self._backend, self.on = backend, True

    def _current(self) -> VnpuManager:
        with self._lock:
            if not self.on:
                raise StateError(
                    "this node has no die that offers hard-split templates: no vNPU manager",
                    code=ErrorCode.VNPU_FAILED,
                    field="effects.hard-vnpu",
                )
            return self._backend

    def list(self) -> tuple[Vnpu, ...]:
        return self._current().list()

    def create(self, die: Die, template: Template, vnpu_id: int) -> Vnpu:
        return self._current().create(die, template, vnpu_id)

    def destroy(self, die: Die, vnpu_id: int) -> bool:
        return self._current().destroy(die, vnpu_id)

    def check_prerequisites(self, die: Die) -> None:
        self._current().check_prerequisites(die)

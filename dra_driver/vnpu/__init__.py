"""Hard-split vNPUs: create, destroy and list HDK template instances behind one interface.

A :class:`VnpuManager` answers "which vNPUs exist on this node?" and makes or removes one. Two
backends:

* :mod:`.npu_smi` runs ``npu-smi set -t create-vnpu`` / ``destroy-vnpu`` and parses
  ``npu-smi info -t info-vnpu`` (real nodes; tests use ``flexnpu_testing/fake_npu_smi.py``);
* :mod:`.emulated` keeps the vNPUs of an emulated node in a state file and makes their device
  nodes ``<device-root>/dev/vdavinci<id>`` (machines without NPUs, tests, demos).

Both check what they did: a create that reports success but whose vNPU is missing, or that
fails after making it, is undone before the error is raised, so nothing half-made stays. What to
create, and when, is decided elsewhere (prepare records the vNPU before it is made; the sweep
destroys only what no checkpoint entry owns). Errors carry the field and a stable code:
``TemplateUnsupported``, ``VnpuIdInUse``, ``VnpuModeNotContainer``, ``VnpuOperationFailed``,
``InvalidNpuSmiOutput``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from dra_driver import templates
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from dra_driver.templates import Template

__all__ = [
    "Vnpu",
    "VnpuManager",
    "check_template",
    "free_vnpu_id",
    "from_config",
    "held_by",
]


@dataclass(frozen=True, slots=True)
class Vnpu:
    """One vNPU that exists on the node (``npu-smi info -t info-vnpu`` or the emulated state)."""

    vnpu_id: int
    phy_id: int
    card_id: int
    chip_id: int
    template: str
    vgroup: int = 0
    in_use: bool = False  # a container holds it (npu-smi Status 1)

    @property
    def device_node(self) -> str:
        """The host device node of this vNPU (the container sees it as ``/dev/davinci<id>``)."""
        return f"/dev/vdavinci{self.vnpu_id}"


class VnpuManager(Protocol):
    """A vNPU backend. Every method raises a :class:`~dra_driver.errors.FlexNPUError` subclass."""

    def list(self) -> tuple[Vnpu, ...]:
        """Every vNPU on the node, sorted by ID."""
        ...

    def create(self, die: Die, template: Template, vnpu_id: int) -> Vnpu:
        """Make one instance of ``template`` on ``die`` with ``vnpu_id``; verified, or undone and raised."""
        ...

    def destroy(self, die: Die, vnpu_id: int) -> bool:
        """Remove the vNPU; whether it existed. Absent is not an error."""
        ...

    def check_prerequisites(self, die: Die) -> None:
        """StateError ``VnpuModeNotContainer`` unless the chip is in container vNPU mode."""
        ...


def check_template(die: Die, template_name: str, inventory: Inventory) -> Template:
    """The template of ``die``'s chip model named ``template_name``, else InvalidInput."""
    for t in templates.for_model(die.model, inventory.templates):
        if t.name == template_name:
            return t
    offered = ", ".join(t.name for t in templates.for_model(die.model, inventory.templates)) or "none"
    raise InvalidInput(
        f"template {template_name[:64]!r} is not supported by die {die.phy_id} ({die.model}); it offers {offered}",
        code=ErrorCode.TEMPLATE_UNSUPPORTED,
        field="template",
    )


def free_vnpu_id(die: Die, taken: Iterable[int]) -> int:
    """The lowest vNPU ID of the die's range that is not ``taken`` (pure); StateError if none."""
    used = set(taken)
    for vnpu_id in templates.vnpu_id_range(die.model, die.phy_id):
        if vnpu_id not in used:
            return vnpu_id
    raise StateError(
        f"die {die.phy_id}: every vNPU ID of {templates.vnpu_id_range(die.model, die.phy_id)} is in use",
        code=ErrorCode.VNPU_ID_IN_USE,
        field="vnpuID",
    )


def held_by(vnpus: Iterable[Vnpu], inventory: Inventory) -> dict[int, tuple[int, int, int, int, int]]:
    """Per physical ID: (aicore, aicpu, memory MiB, media, count) the given vNPUs hold (pure).

    Unknown templates count as the whole die (doubt keeps things: nothing is offered next to it).
    """
    out: dict[int, list[int]] = {}
    for v in vnpus:
        die = inventory.by_phy_id(v.phy_id)
        if die is None:
            continue
        acc = out.setdefault(v.phy_id, [0, 0, 0, 0, 0])
        t = next(
            (x for x in templates.for_model(die.model, inventory.templates) if x.name == v.template), None
        )
        if t is None:
            acc[0] += die.aicore
            acc[1] += die.aicpu
            acc[2] += templates.template_memory_mib(die.model, die.memory_mib)
            acc[3] += templates.media_of(die.model) or 0
        else:
            acc[0] += t.aicore
            acc[1] += t.aicpu
            acc[2] += t.memory_mib
            acc[3] += t.media or 0
        acc[4] += 1
    return {k: (v[0], v[1], v[2], v[3], v[4]) for k, v in out.items()}


def from_config(
    *, inventory: Inventory, emulated: bool, device_root: Path, npu_smi: str, state_file: Path | None = None
) -> VnpuManager:
    """The emulated backend on an emulated node (an inventory file), else npu-smi."""
    if emulated:
        from dra_driver.vnpu.emulated import EmulatedVnpus

        return EmulatedVnpus(device_root, inventory, state_file=state_file)
    from dra_driver.vnpu.npu_smi import NpuSmiVnpus

    return NpuSmiVnpus(npu_smi, inventory)

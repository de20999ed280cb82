"""What a claim's hard-split devices become (pure): vNPUs to make, CDI edits, claim status, orphans.

The sequencer (``kubeletplugin/prepare.py``) records each :class:`HardVnpu` in the checkpoint
before it asks the :class:`~dra_driver.vnpu.VnpuManager` to make it, and undoes it by destroying
that vNPU. This module only decides:

* :func:`plan_vnpus` - for each allocated template device ``npu-<phy>-<template>-<i>``, the die,
  the template and a free vNPU ID (lowest of the die's range not taken by an existing vNPU or a
  recorded one). Errors name the claim and the result: an unknown device, a template the chip
  model does not offer (``TemplateUnsupported``), a die that turned unhealthy (``DieUnhealthy``),
  no ID left (``VnpuIdInUse``).
* :func:`device_edits` - the container gets ``/dev/vdavinci<id>`` as ``/dev/davinci<id>``; the
  shared Ascend nodes and the driver mounts come from the spec-level edits, nothing of the
  physical die.
* :func:`status_data` - ``status.devices[].data`` of a hard vNPU: template, vNPU ID, resources.
* :func:`orphans` - which existing vNPUs the sweep may destroy: only those this driver's ledger
  says it made, that no checkpoint entry owns, and that no container uses; never one made
  outside the driver, never while the checkpoint cannot be read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import cdi
from dra_driver.devices import Die, Health, Inventory, parse_template_device_name
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from dra_driver.templates import Template
from dra_driver.vnpu import Vnpu, check_template, free_vnpu_id

__all__ = ["HardVnpu", "device_edits", "from_records", "orphans", "plan_vnpus", "spec_env", "status_data"]

CONTAINER_NODE_PREFIX = "/dev/davinci"
HOST_NODE_PREFIX = "/dev/vdavinci"


@dataclass(frozen=True, slots=True)
class HardVnpu:
    """One vNPU a claim gets: which result, which die, which template, which ID."""

    request: str
    device: str
    die: Die
    template: Template
    vnpu_id: int

    @property
    def host_node(self) -> str:
        return f"{HOST_NODE_PREFIX}{self.vnpu_id}"

    @property
    def container_node(self) -> str:
        return f"{CONTAINER_NODE_PREFIX}{self.vnpu_id}"

    def to_dict(self) -> dict[str, Any]:
        """What the checkpoint records (enough to destroy it without the inventory)."""
        return {
            "vnpuID": self.vnpu_id,
            "phy": self.die.phy_id,
            "card": self.die.card_id,
            "chip": self.die.chip_id,
            "template": self.template.name,
            "device": self.device,
            "request": self.request,
        }


def plan_vnpus(
    results: Sequence[tuple[str, str]],
    *,
    inventory: Inventory,
    taken: Iterable[int],
    claim_uid: str,
) -> tuple[HardVnpu, ...]:
    """The vNPUs for ``results`` (request, device) of template devices, in order (pure)."""
    used = set(taken)
    out: list[HardVnpu] = []
    for request, device in results:
        fld = f"status.allocation.devices.results[{request}/{device}]"
        parsed = parse_template_device_name(device)
        die = inventory.by_phy_id(parsed[0]) if parsed else None
        if parsed is None or die is None:
            raise InvalidInput(
                f"device {device[:64]!r} is not a template device of this node",
                code=ErrorCode.DEVICE_NOT_FOUND,
                claim_uid=claim_uid,
                field=f"{fld}.device",
            )
        try:
            template = check_template(die, parsed[1], inventory)
        except InvalidInput as err:
            raise InvalidInput(
                err.message, code=err.code, claim_uid=claim_uid, field=f"{fld}.device"
            ) from None
        if die.health == Health.UNHEALTHY:
            raise StateError(
                f"die {die.phy_id} is unhealthy; the {template.name} vNPU allocated on it is not made",
                code=ErrorCode.DIE_UNHEALTHY,
                claim_uid=claim_uid,
                field=f"{fld}.device",
            )
        try:
            vnpu_id = free_vnpu_id(die, used)
        except StateError as err:
            raise StateError(err.message, code=err.code, claim_uid=claim_uid, field=f"{fld}.device") from None
        used.add(vnpu_id)
        out.append(HardVnpu(request=request, device=device, die=die, template=template, vnpu_id=vnpu_id))
    return tuple(out)


def from_records(
    records: Iterable[Mapping[str, Any]], *, inventory: Inventory, claim_uid: str
) -> tuple[HardVnpu, ...]:
    """The vNPUs a checkpoint entry recorded (``HardVnpu.to_dict``), for a repeat prepare."""
    out: list[HardVnpu] = []
    for rec in records:
        try:
            phy, vnpu_id, name = int(rec["phy"]), int(rec["vnpuID"]), str(rec["template"])
            request, device = str(rec["request"]), str(rec["device"])
        except (KeyError, TypeError, ValueError):
            raise StateError(
                f"a recorded hard vNPU is malformed: {str(dict(rec))[:200]}",
                code=ErrorCode.CHECKPOINT_CORRUPT,
                claim_uid=claim_uid,
                field="effects.hard-vnpu",
            ) from None
        die = inventory.by_phy_id(phy)
        if die is None:
            raise StateError(
                f"vNPU {vnpu_id} was made on die {phy}, which this node no longer has",
                code=ErrorCode.DEVICE_NOT_FOUND,
                claim_uid=claim_uid,
                field="effects.hard-vnpu",
            )
        template = check_template(die, name, inventory)
        out.append(HardVnpu(request=request, device=device, die=die, template=template, vnpu_id=vnpu_id))
    return tuple(out)


def device_edits(vnpu: HardVnpu, *, device_root: Path) -> cdi.Edits:
    """Per-device CDI edits: the vNPU's node only (the host ``vdavinci`` as the container ``davinci``)."""
    return cdi.Edits(
        env=(f"FLEXNPU_VNPU_TEMPLATE_{vnpu.vnpu_id}={vnpu.template.name}",),
        device_nodes=(
            cdi.DeviceNode(path=vnpu.container_node, host_path=cdi.host_path(device_root, vnpu.host_node)),
        ),
    )


def spec_env(vnpus: Sequence[HardVnpu]) -> dict[str, str]:
    """Spec-level environment of a claim with hard vNPUs."""
    if not vnpus:
        return {}
    return {
        "FLEXNPU_VNPU_IDS": ",".join(str(v.vnpu_id) for v in vnpus),
        "FLEXNPU_TEMPLATES": ",".join(v.template.name for v in vnpus),
    }


def status_data(vnpu: HardVnpu) -> dict[str, Any]:
    """``status.devices[].data`` of a hard vNPU (the claim status names template, ID, resources)."""
    data: dict[str, Any] = {
        "mode": "hard",
        "die": vnpu.die.phy_id,
        "vdieID": vnpu.die.vdie_id,
        "model": vnpu.die.model,
        "template": vnpu.template.name,
        "vnpuID": vnpu.vnpu_id,
        "deviceNode": vnpu.host_node,
        "aicore": vnpu.template.aicore,
        "aicpu": vnpu.template.aicpu,
        "memoryBytes": vnpu.template.memory_bytes,
    }
    if vnpu.template.media is not None:
        data["media"] = vnpu.template.media
    return data


def orphans(
    existing: Iterable[Vnpu],
    *,
    ledger: Mapping[int, str],
    owners: Iterable[str],
    checkpoint_readable: bool,
) -> tuple[Vnpu, ...]:
    """vNPUs the sweep may destroy (pure).

    ``ledger`` maps each vNPU ID this driver made to the claim UID it made it for; ``owners``
    are the claim UIDs with a checkpoint entry. A vNPU is an orphan only when the driver made it,
    its claim has no entry, no container uses it, and the checkpoint could be read.
    """
    if not checkpoint_readable:
        return ()
    live = set(owners)
    return tuple(
        v
        for v in sorted(existing, key=lambda v: v.vnpu_id)
        if v.vnpu_id in ledger and ledger[v.vnpu_id] not in live and not v.in_use
    )

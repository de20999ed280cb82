"""The device model: Ascend chips, their dies, and the facts per chip model.

Pure data. The hard-split templates of each chip model are in ``dra_driver/templates.py``. Discovery backends (``dra_driver.discovery``) produce an :class:`Inventory`;
the slice builder, the planner and the CDI writer consume it. Nothing here touches the world.
Planning's first stage is here: :meth:`Inventory.allocated` reads a claim's allocation results as
this node's devices (:class:`AllocatedDevice`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dra_driver.errors import ErrorCode, InvalidInput, quote
from dra_driver.templates import Template
from flexnpu_wire.codes import Policy

MIB = 1024 * 1024
GIB = 1024 * MIB

VDIE_RE = re.compile(r"^[0-9A-F]{8}(-[0-9A-F]{8}){4}$")
PCI_BUS_RE = re.compile(r"^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$")


SHARE_POLICIES = (Policy.ELASTIC, Policy.FIXED, Policy.BEST_EFFORT)
"""One share device per policy per die (the default, elastic, first); see ``dra_driver/slices.py``."""


class Health(StrEnum):
    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"
    UNKNOWN = "Unknown"


class DieMode(StrEnum):
    """How a die is handed out (see docs/device-model.md)."""

    WHOLE = "whole"
    SOFT = "soft"
    HARD = "hard"
    BOTH = "both"  # whole and soft devices on one die, kept apart by shared counters (slices.py)
    ALL = "all"  # whole, soft and hard-split templates on one die, kept apart by shared counters


@dataclass(frozen=True, slots=True)
class ChipModel:
    """Published facts for one Ascend chip model (public figures: HAMi's Ascend device config, mind-cluster's docs)."""

    name: str  # npu-smi "Name" / Chip Name, e.g. "910B3"
    generation: str  # "A2", "A3", "inference", "A1"
    dies_per_chip: int
    memory_mib: int  # per die
    aicore: int  # per die
    aicpu: int
    vector_cores: int
    memory_kind: str  # "HBM" or "DDR"

    def soc_name(self, npu_name: str = "") -> str:
        """SoC name: ``Ascend`` + chip name (A2/310P), ``<chip>_<npu name>`` on A3."""
        if self.generation == "A3":
            return f"Ascend910_{npu_name}" if npu_name else "Ascend910_93"
        return f"Ascend{self.name}"


# Figures from HAMi's Ascend device config and mind-cluster's vNPU template docs.
CHIP_MODELS: dict[str, ChipModel] = {
    m.name: m
    for m in (
        ChipModel("910B1", "A2", 1, 65536, 24, 6, 48, "HBM"),
        ChipModel("910B2", "A2", 1, 65536, 24, 6, 48, "HBM"),
        ChipModel("910B2C", "A2", 1, 65536, 24, 6, 48, "HBM"),
        ChipModel("910B3", "A2", 1, 65536, 20, 7, 40, "HBM"),
        ChipModel(
            "910B4",
            "A2",
            1,
            32768,
            20,
            7,
            40,
            "HBM",
        ),
        # Atlas A3 (910_93): two dies per chip, 64 GB HBM per die; 24 AI cores per die (training).
        ChipModel("Ascend910", "A3", 2, 65536, 24, 7, 48, "HBM"),
        ChipModel(
            "310P3",
            "inference",
            1,
            21527,
            8,
            7,
            7,
            "DDR",
        ),
    )
}


@dataclass(frozen=True, slots=True)
class Die:
    """One die: the unit this driver publishes as a DRA device.

    An A2 or 310P chip has one die; an A3 chip has two, each with its own physical ID,
    PCI bus ID and memory. ``phy_id`` is N in ``/dev/davinciN`` and unique per node.
    """

    vdie_id: str
    model: str
    card_id: int
    chip_id: int
    phy_id: int
    logic_id: int
    pci_bus_id: str
    numa_node: int
    memory_mib: int
    aicore: int
    aicpu: int
    health: Health = Health.HEALTHY
    die_index: int = 0
    npu_name: str = ""

    @property
    def chip_model(self) -> ChipModel:
        return CHIP_MODELS[self.model]

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def device_node(self) -> str:
        return f"/dev/davinci{self.phy_id}"

    @property
    def whole_device_name(self) -> str:
        """DRA device name of the whole die (a DNS label, stable per physical ID)."""
        return f"npu-{self.phy_id}"

    def share_device_name(self, policy: Policy) -> str:
        """DRA device name of the die's share device of ``policy``: ``vnpu-<phy>`` (elastic, the name
        it always had) or ``vnpu-<phy>-<policy>``."""
        return f"vnpu-{self.phy_id}" if policy is Policy.ELASTIC else f"vnpu-{self.phy_id}-{policy}"

    @property
    def share_device_names(self) -> tuple[str, ...]:
        return tuple(self.share_device_name(p) for p in SHARE_POLICIES)


@dataclass(frozen=True, slots=True)
class Inventory:
    """What discovery found on a node: dies plus node-wide driver facts."""

    dies: tuple[Die, ...]
    driver_version: str = ""
    firmware_version: str = ""
    source: str = ""  # "emulated:<path>" or "npu-smi"
    die_modes: dict[int, DieMode] = field(default_factory=dict)  # per phy_id override
    templates: Mapping[str, tuple[Template, ...]] = field(default_factory=dict)
    """Per chip model, templates reported by ``npu-smi info -t template-info`` (override the table)."""

    def by_device_name(self, name: str) -> Die | None:
        """The die of a published device: whole, a share device of any policy, or a template slot."""
        for die in self.dies:
            if name == die.whole_device_name or name in die.share_device_names:
                return die
        parsed = parse_template_device_name(name)
        return self.by_phy_id(parsed[0]) if parsed else None

    def device_mode(self, name: str) -> DieMode | None:
        """How a published device hands out its die: ``whole``, ``soft`` or ``hard`` (None: unknown)."""
        die = self.by_device_name(name)
        if die is None:
            return None
        if name == die.whole_device_name:
            return DieMode.WHOLE
        if name in die.share_device_names:
            return DieMode.SOFT
        return DieMode.HARD

    def share_policy(self, name: str) -> Policy | None:
        """The policy a share device serves (None: not a share device of this node)."""
        die = self.by_device_name(name)
        return next((p for p in SHARE_POLICIES if die and name == die.share_device_name(p)), None)

    def by_phy_id(self, phy_id: int) -> Die | None:
        for die in self.dies:
            if die.phy_id == phy_id:
                return die
        return None

    def allocated(
        self, results: list[Any], *, driver_name: str, pool_name: str, claim_uid: str
    ) -> tuple[AllocatedDevice, ...]:
        """This driver's allocation ``results`` (``status.allocation.devices.results``) as devices of
        this node, sorted by (request, device, shareID). Raises InvalidInput naming the field; a
        device this node does not publish is DeviceNotFound."""
        uid = claim_uid
        devices: list[AllocatedDevice] = []
        for i, res in enumerate(results):
            fld = f"status.allocation.devices.results[{i}]"
            if not isinstance(res, Mapping):
                raise InvalidInput("result is not an object", claim_uid=uid, field=fld)
            if res.get("driver") != driver_name:
                continue
            pool = res.get("pool")
            device = res.get("device")
            request = res.get("request")
            if not isinstance(request, str) or not request:
                raise InvalidInput("result has no request name", claim_uid=uid, field=f"{fld}.request")
            for key, value in (("pool", pool), ("device", device)):
                if not isinstance(value, str):
                    raise InvalidInput(
                        f"{key} must be a string, got {type(value).__name__}",
                        claim_uid=uid,
                        field=f"{fld}.{key}",
                    )
            if res.get("shareID") is not None and not isinstance(res.get("shareID"), str):
                raise InvalidInput("shareID must be a string", claim_uid=uid, field=f"{fld}.shareID")
            if pool != pool_name:
                raise InvalidInput(
                    f"device {quote(device)} is allocated from pool {quote(pool)}, but this node's pool is {quote(pool_name)}",
                    code=ErrorCode.DEVICE_NOT_FOUND,
                    claim_uid=uid,
                    field=f"{fld}.pool",
                )
            die = self.by_device_name(device) if isinstance(device, str) else None
            if die is None:
                raise InvalidInput(
                    f"device {quote(device)} is not a device of this node ({pool_name})",
                    code=ErrorCode.DEVICE_NOT_FOUND,
                    claim_uid=uid,
                    field=f"{fld}.device",
                )
            mode = self.device_mode(str(device)) or DieMode.SOFT
            slot = parse_template_device_name(str(device)) if mode == DieMode.HARD else None
            share_id = res.get("shareID")
            consumed = res.get("consumedCapacity") or {}
            if not isinstance(consumed, Mapping):
                raise InvalidInput(
                    "consumedCapacity is not a map", claim_uid=uid, field=f"{fld}.consumedCapacity"
                )
            devices.append(
                AllocatedDevice(
                    request=request,
                    pool=str(pool),
                    device=str(device),
                    die=die,
                    mode=mode,
                    share_id=str(share_id) if share_id else None,
                    consumed_capacity={str(k): str(v) for k, v in consumed.items()},
                    admin_access=bool(res.get("adminAccess")),
                    policy=self.share_policy(str(device)) if mode == DieMode.SOFT else None,
                    template=slot[1] if slot else None,
                )
            )
        devices.sort(key=lambda d: (d.request, d.device, d.share_id or ""))
        return tuple(devices)


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of a claim, read as a device of this node (``Inventory.allocated``)."""

    request: str  # as in the allocation result, possibly "req/sub"
    pool: str
    device: str
    die: Die
    mode: DieMode
    share_id: str | None
    consumed_capacity: Mapping[str, str]
    admin_access: bool
    policy: Policy | None = None  # soft split: the policy its share device serves
    template: str | None = None  # hard split: the template its device ``npu-<phy>-<template>-<i>`` names

    @property
    def device_policy(self) -> Policy:
        return self.policy or Policy.ELASTIC

    @property
    def request_name(self) -> str:
        """The top-level request name (the kubelet matches containers against it)."""
        return self.request.split("/", 1)[0]


_TEMPLATE_DEVICE = re.compile(r"^npu-(\d+)-(vir[0-9a-z-]+)-(\d+)$")


def template_device_name(die: Die, template: Template, index: int) -> str:
    """DRA device name of one template instance slot: ``npu-<phy>-<template>-<index>``."""
    return f"npu-{die.phy_id}-{template.dns_name}-{index}"


def parse_template_device_name(name: str) -> tuple[int, str, int] | None:
    """(physical ID, template name with underscores, index) of a template device name, else None."""
    m = _TEMPLATE_DEVICE.match(name)
    if m is None:
        return None
    return int(m.group(1)), m.group(2).replace("-", "_"), int(m.group(3))

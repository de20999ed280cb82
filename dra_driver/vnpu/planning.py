"""Which vNPU each template result of a claim gets (pure): IDs, recorded vNPUs, evidence, orphans.

The sequencer (``kubeletplugin/prepare.py``) records each :class:`HardVnpu` in the checkpoint
before it asks the :class:`~dra_driver.vnpu.VnpuManager` to make it, and undoes it by destroying
that vNPU. This module only decides; what the container gets for a vNPU is rendered by
``dra_driver/render.py``.

* :func:`claim_vnpus` - planning's vNPU stage (``dra_driver/plan.py`` calls it once): a new
  prepare's vNPUs, or a repeat prepare's recorded ones (:func:`from_records`) with the template
  devices its record lacks. A new vNPU gets, for its allocated template device
  ``npu-<phy>-<template>-<i>``, the die, the template and a free vNPU ID (lowest of the die's range
  not taken by an existing vNPU or a recorded one, :func:`taken_ids`). Errors name the claim and
  the result: a template the chip model does not offer (``TemplateUnsupported``), a die that
  turned unhealthy (``DieUnhealthy``), no ID left (``VnpuIdInUse``).
* :func:`parse_record` - the one reader of a recorded vNPU (``HardVnpu.to_dict`` in a checkpoint
  effect); :func:`from_records` turns a claim's records back into :class:`HardVnpu` for a repeat
  prepare.
* :func:`from_evidence` - the vNPUs a claim whose checkpoint record was lost holds, from the
  driver's ledger and the live vNPU list (``flexnpu-smi adopt``), or an error when the evidence
  does not explain every template device.
* :func:`orphans` - which existing vNPUs the sweep may destroy: only those this driver's ledger
  says it made, that no checkpoint entry owns, and that no container uses; never one made
  outside the driver, never while the checkpoint cannot be read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from dra_driver import templates
from dra_driver.devices import AllocatedDevice, Die, DieMode, Health, Inventory, parse_template_device_name
from dra_driver.errors import ErrorCode, InvalidInput, StateError
from dra_driver.templates import Template
from dra_driver.vnpu import Vnpu, check_template, free_vnpu_id
from dra_driver.vnpu import ownership as vnpu_ledger

__all__ = [
    "HardVnpu",
    "RecordedVnpu",
    "claim_vnpus",
    "from_evidence",
    "from_records",
    "orphans",
    "parse_record",
]

CONTAINER_NODE_PREFIX = "/dev/davinci"
HOST_NODE_PREFIX = "/dev/vdavinci"
RECORD_FIELD = "effects.hard-vnpu"


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


@dataclass(frozen=True, slots=True)
class RecordedVnpu:
    """A recorded vNPU as read back: its die (still on this node), template name and ID."""

    die: Die
    template: str
    vnpu_id: int
    request: str = ""  # "" in a record that does not name them
    device: str = ""


class TemplateSlot(NamedTuple):
    """An allocated template device ``npu-<phy>-<template>-<i>`` of a claim: its request, its
    name, its die and the template's name."""

    request: str
    device: str
    die: Die
    template: str


@dataclass(frozen=True, slots=True)
class ClaimVnpus:
    """A claim's vNPUs (:func:`claim_vnpus`) and, for a repeat prepare, the template devices its
    record names no vNPU for."""

    vnpus: tuple[HardVnpu, ...] = ()
    missing: tuple[str, ...] = ()


def claim_vnpus(
    devices: Sequence[AllocatedDevice],
    *,
    recorded: Sequence[Mapping[str, Any]] | None,
    others: Callable[[], Iterable[Mapping[str, Any]]],
    existing: Callable[[], Iterable[Vnpu]],
    inventory: Inventory,
    claim_uid: str,
) -> ClaimVnpus:
    """The vNPUs of a claim's template devices (of ``devices``, as ``Inventory.allocated`` read them). A
    repeat prepare (``recorded``: its completed entry's vNPU records) gets the ones it recorded, and
    the template devices its record lacks (an earlier adopt's entry: not as the die); a new prepare
    (``recorded`` None) gets new IDs avoiding every vNPU ``existing`` on the node and every one
    ``others`` recorded (both asked only when there are template devices; the caller holds the
    checkpoint lock, so two prepares never pick the same ID)."""
    slots = [
        TemplateSlot(d.request, d.device, d.die, d.template or "") for d in devices if d.mode == DieMode.HARD
    ]
    if recorded is not None:
        have = {str(r.get("device") or "") for r in recorded}
        missing = tuple(slot.device for slot in slots if slot.device not in have)
        vnpus = from_records(recorded, inventory=inventory, claim_uid=claim_uid) if recorded else ()
        return ClaimVnpus(vnpus, missing)
    if not slots:
        return ClaimVnpus()
    taken = taken_ids(existing(), others())
    return ClaimVnpus(_make(slots, inventory=inventory, taken=taken, claim_uid=claim_uid))


def taken_ids(existing: Iterable[Vnpu], recorded: Iterable[Mapping[str, Any]]) -> set[int]:
    """vNPU IDs a new vNPU must not use: existing ones and ones recorded by any claim."""
    return {v.vnpu_id for v in existing} | {int(r["vnpuID"]) for r in recorded}


def _slot(request: str, device: str, inventory: Inventory, *, claim_uid: str, fld: str) -> TemplateSlot:
    parsed = parse_template_device_name(device)
    die = inventory.by_phy_id(parsed[0]) if parsed else None
    if parsed is None or die is None:
        raise InvalidInput(
            f"device {device[:64]!r} is not a template device of this node",
            code=ErrorCode.DEVICE_NOT_FOUND,
            claim_uid=claim_uid,
            field=fld,
        )
    return TemplateSlot(request, device, die, parsed[1])


def _make(
    slots: Iterable[TemplateSlot], *, inventory: Inventory, taken: Iterable[int], claim_uid: str
) -> tuple[HardVnpu, ...]:
    used = set(taken)
    out: list[HardVnpu] = []
    for slot in slots:
        request, device, die = slot.request, slot.device, slot.die
        fld = _result_field(request, device)
        template = _template(slot, inventory, claim_uid=claim_uid, fld=fld)
        if die.health == Health.UNHEALTHY:
            raise StateError(
                f"die {die.phy_id} is unhealthy; the {template.name} vNPU allocated on it is not made",
                code=ErrorCode.DIE_UNHEALTHY,
                claim_uid=claim_uid,
                field=fld,
            )
        try:
            vnpu_id = free_vnpu_id(die, used)
        except StateError as err:
            raise StateError(err.message, code=err.code, claim_uid=claim_uid, field=fld) from None
        used.add(vnpu_id)
        out.append(HardVnpu(request=request, device=device, die=die, template=template, vnpu_id=vnpu_id))
    return tuple(out)


def parse_record(rec: Mapping[str, Any], *, inventory: Inventory, claim_uid: str) -> RecordedVnpu:
    """A recorded vNPU (``HardVnpu.to_dict``); StateError when it is malformed or its die is gone."""
    try:
        phy, template, vnpu_id = int(rec["phy"]), str(rec["template"]), int(rec["vnpuID"])
        request, device = str(rec.get("request") or ""), str(rec.get("device") or "")
    except (KeyError, TypeError, ValueError):
        raise StateError(
            f"a recorded hard vNPU is malformed: {str(dict(rec))[:200]}",
            code=ErrorCode.CHECKPOINT_CORRUPT,
            claim_uid=claim_uid,
            field=RECORD_FIELD,
        ) from None
    die = inventory.by_phy_id(phy)
    if die is None:
        raise StateError(
            f"vNPU {vnpu_id} was made on die {phy}, which this node no longer has",
            code=ErrorCode.DEVICE_NOT_FOUND,
            claim_uid=claim_uid,
            field=RECORD_FIELD,
        )
    return RecordedVnpu(die=die, template=template, vnpu_id=vnpu_id, request=request, device=device)


def from_records(
    records: Iterable[Mapping[str, Any]], *, inventory: Inventory, claim_uid: str
) -> tuple[HardVnpu, ...]:
    """The vNPUs a checkpoint entry recorded, for a repeat prepare (each record names its result)."""
    out: list[HardVnpu] = []
    for rec in records:
        r = parse_record(rec, inventory=inventory, claim_uid=claim_uid)
        if not r.device or not r.request:
            raise StateError(
                f"recorded vNPU {r.vnpu_id} does not name the result it was made for",
                code=ErrorCode.CHECKPOINT_CORRUPT,
                claim_uid=claim_uid,
                field=RECORD_FIELD,
            )
        template = check_template(r.die, r.template, inventory)
        out.append(
            HardVnpu(request=r.request, device=r.device, die=r.die, template=template, vnpu_id=r.vnpu_id)
        )
    return tuple(out)


def from_evidence(
    results: Sequence[tuple[str, str]],
    *,
    ledger: Mapping[int, str] | None,
    live: Iterable[Vnpu],
    inventory: Inventory,
    claim_uid: str,
) -> tuple[HardVnpu, ...]:
    """The vNPUs claim ``claim_uid`` holds for ``results`` (request, device), from evidence (pure).

    A vNPU is the claim's only when the driver's ledger says it made it for this claim, its ID is
    in the die's range, and, if it still exists, its template is the device's. One that no longer
    exists (a reboot) is the claim's too: the repeat prepare makes it again. A template device that
    no such vNPU explains is a StateError naming it: the claim is left to the sweep rather than
    recorded with a shape the node never made.
    """
    if ledger is None:
        raise vnpu_ledger.unreadable(claim_uid, "no vNPU can be attributed to the claim")
    present = {v.vnpu_id: v for v in live}
    mine = sorted(vid for vid, uid in ledger.items() if uid == claim_uid)
    out: list[HardVnpu] = []
    for request, device in results:
        fld = _result_field(request, device)
        die, template = _template_of(device, inventory, claim_uid=claim_uid, fld=fld)
        ids = set(templates.vnpu_id_range(die.model, die.phy_id))
        fits = [
            vid
            for vid in mine
            if vid in ids and (vid not in present or present[vid].template == template.name)
        ]
        fits.sort(key=lambda vid: (vid not in present, vid))  # a live vNPU before a record whose vNPU is gone
        if not fits:
            raise StateError(
                f"no vNPU the driver's ledger records for this claim on die {die.phy_id} is a {template.name}"
                f" (ledger IDs of the claim: {mine or 'none'}); left for the sweep",
                code=ErrorCode.VNPU_FAILED,
                claim_uid=claim_uid,
                field=fld,
            )
        mine.remove(fits[0])
        out.append(HardVnpu(request=request, device=device, die=die, template=template, vnpu_id=fits[0]))
    return tuple(out)


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


def _result_field(request: str, device: str) -> str:
    return f"status.allocation.devices.results[{request}/{device}].device"


def _template_of(device: str, inventory: Inventory, *, claim_uid: str, fld: str) -> tuple[Die, Template]:
    slot = _slot("", device, inventory, claim_uid=claim_uid, fld=fld)
    return slot.die, _template(slot, inventory, claim_uid=claim_uid, fld=fld)


def _template(slot: TemplateSlot, inventory: Inventory, *, claim_uid: str, fld: str) -> Template:
    try:
        return check_template(slot.die, slot.template, inventory)
    except InvalidInput as err:
        raise InvalidInput(err.message, code=err.code, claim_uid=claim_uid, field=fld) from None

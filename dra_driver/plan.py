"""What a claim gets on this node: pure planning from the allocated claim object.

The preparer asks once: :func:`plan_prepare` takes the claim, this node (:class:`NodeFacts`) and
every checkpoint entry, and returns the whole :class:`PreparePlan` — the step (a new prepare, a
repeat, a redo of an unfinished entry, an answer from the record of a withdrawn die, nothing to
do), the claim's plan with its shares and vNPUs, and its refusal, if any. It is a straight
pipeline; each stage lives with its concern, takes what the stage before gave, and is asked once:

1. the claim read here (right UID, allocated, its results a list), then its results as this
   node's devices (``Inventory.allocated``, ``dra_driver/devices.py``) and this driver's opaque
   configs (``sharing.driver_configs``) — :func:`plan_claim`;
2. every soft-split device's shares and resolved ``VnpuConfig``, and what a new prepare must
   refuse (a config naming another policy than its share device serves, a ``hostMemory`` over the
   node's bound): ``sharing.plan_shares``, ``dra_driver/sharing.py``;
3. for a new prepare, the conflicts with what other claims hold: ``records.check_conflicts``;
4. the hard split's vNPUs (new IDs, or a repeat prepare's recorded ones and the template devices
   its record lacks): ``planning.claim_vnpus``, ``dra_driver/vnpu/planning.py``;
5. for a claim with shares, the interposition its configs chose, possible with this node's
   ``libascendcl.so`` (``NodeFacts.client_library``): ``interposition.for_claim``,
   ``dra_driver/interposition.py``.

A claim that breaks two rules is refused for the first in that order. It performs no I/O and logs
nothing; every error names the claim UID and the field. The same input always gives the same
plan, so a retry or a restart recomputes it instead of storing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from enum import StrEnum
from typing import Any

from dra_driver import interposition, records, sharing
from dra_driver.devices import AllocatedDevice, DieMode, Inventory
from dra_driver.errors import ErrorCode, InvalidInput, StateError, quote
from dra_driver.records import ClaimEntry, ClaimState, DieRecord
from dra_driver.sharing import ConfigEntry
from dra_driver.vnpu import Vnpu, planning
from dra_driver.vnpu.planning import HardVnpu
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_wire.shares import Share


@dataclass(frozen=True, slots=True)
class PlannedDevice(AllocatedDevice):
    """An allocated device (``dra_driver/devices.py``) with what planning gave it."""

    shares: tuple[
        Share, ...
    ] = ()  # soft split: the vNPUs (one, or N with ``vnpus: N``) the aclserver enforces
    config: sharing.VnpuConfig | None = None  # soft split: the resolved opaque config
    vnpu: HardVnpu | None = None  # hard split: the vNPU made for it (dra_driver/vnpu/planning.py)


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]
    configs: tuple[ConfigEntry, ...]

    @property
    def vnpus(self) -> tuple[HardVnpu, ...]:
        """The claim's hard-split vNPUs, once assigned (``with_vnpus``)."""
        return tuple(d.vnpu for d in self.devices if d.vnpu is not None)

    def hard_results(self) -> tuple[tuple[str, str], ...]:
        """(request, device) of each hard-split device (what an adopt or a hard split works on)."""
        return tuple((d.request, d.device) for d in self.devices if d.mode == DieMode.HARD)

    def with_vnpus(self, vnpus: Sequence[HardVnpu]) -> ClaimPlan:
        """The plan with each hard-split device's vNPU (in device order)."""
        by_device = {v.device: v for v in vnpus}
        return replace(
            self, devices=tuple(replace(d, vnpu=by_device.get(d.device, d.vnpu)) for d in self.devices)
        )

    @property
    def shares(self) -> tuple[Share, ...]:
        """The claim's shares, in virtual-ID order."""
        return tuple(sh for d in self.devices for sh in d.shares)

    @property
    def dies(self) -> tuple[DieRecord, ...]:
        """What the claim will hold, as recorded with its intent (the conflict check reads these)."""
        return tuple(
            DieRecord(
                phy=d.die.phy_id,
                mode=d.mode,
                device=d.device,
                share_id=d.share_id,
                policy=d.shares[0].policy if d.shares else None,
            )
            for d in self.devices
        )


class Step(StrEnum):
    """What the preparer does with a claim, as :func:`plan_prepare` decides it."""

    NEW = "new"  # record the intent with every planned effect, then make them
    REPEAT = "repeat"  # the claim is prepared: put back what is missing, refresh its status
    REDO = "redo"  # an unfinished entry (or one without its vNPUs): undo it, then plan again
    WITHDRAWN = "withdrawn"  # a prepared claim on a die this node no longer publishes: its record answers
    NOTHING = "nothing"  # only other drivers' results: nothing to do here


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What planning knows of this node besides its checkpoint."""

    driver_name: str
    pool_name: str
    inventory: Inventory
    host_memory: sharing.HostMemoryBound
    client_library: Callable[[], interposition.ClientLibrary]
    """This node's ``libascendcl.so`` as probed (asked only for a claim with shares)."""


@dataclass(frozen=True, slots=True)
class PreparePlan:
    """The whole plan of one prepare: the step, the claim's plan (with its vNPUs for ``NEW`` and
    ``REPEAT``), and the refusal, if any, of a claim that was read (its plan names the devices whose
    status says why)."""

    step: Step
    plan: ClaimPlan
    refused: Exception | None = None
    missing: tuple[str, ...] = ()  # REDO of a completed entry: template devices it recorded no vNPU for
    dies: tuple[DieRecord, ...] = ()  # NEW: what the claim will hold, recorded with its intent


def plan_prepare(
    claim: Mapping[str, Any],
    *,
    ref: ClaimRef,
    node: NodeFacts,
    entries: Mapping[str, ClaimEntry],
    existing: Callable[[], Iterable[Vnpu]],
) -> PreparePlan:
    """Everything a prepare of ``claim`` needs decided, in one call, from the claim, this node and
    every checkpoint entry (``entries``, read under the checkpoint lock, so that the conflict check
    and the vNPU IDs hold until the intent is recorded). ``existing`` lists the vNPUs on the node
    (asked only when a new prepare has template devices). Raises InvalidInput/StateError if the
    claim cannot be read as this node's; a refusal after that is returned with the plan."""
    entry = entries.get(ref.uid)
    complete = entry is not None and entry.state == ClaimState.PREPARE_COMPLETED
    allocated = plan_results(claim, driver_name=node.driver_name)
    try:
        base = plan_claim(
            claim, ref=ref, driver_name=node.driver_name, pool_name=node.pool_name, inventory=node.inventory
        )
    except InvalidInput as not_here:
        # The kubelet's repeat prepare of a completed claim one of whose dies a changed inventory
        # withdrew: its entry answers when it records exactly the claim's allocated devices.
        if not_here.code != ErrorCode.DEVICE_NOT_FOUND or entry is None or not complete:
            raise
        if allocated != {(d.device, d.share_id) for d in entry.dies}:
            raise
        return PreparePlan(Step.WITHDRAWN, ClaimPlan(ref=ref, devices=(), configs=()), refused=not_here)
    if not base.devices:
        return PreparePlan(Step.NOTHING, base)
    try:
        shared = sharing.plan_shares(
            base.devices,
            base.configs,
            bound=node.host_memory,
            claim_uid=ref.uid,
            claim=f"{ref.namespace}/{ref.name}",
        )
        plan = replace(
            base,
            devices=tuple(
                d if s is None else replace(d, shares=s.shares, config=s.config)
                for d, s in zip(base.devices, shared.devices, strict=True)
            ),
        )
        if entry is not None and not complete:
            return _interposed(PreparePlan(Step.REDO, plan), node)
        if entry is None:  # a new prepare: it agrees with its share devices, the node and other claims
            if shared.refused_new is not None:
                raise shared.refused_new
            records.check_conflicts(plan, records.held_dies(entries, but=ref.uid))
        vnpus = planning.claim_vnpus(
            plan.devices,
            recorded=entry.vnpu_records if entry is not None else None,
            others=lambda: [r for other in entries.values() for r in other.vnpu_records],
            existing=existing,
            inventory=node.inventory,
            claim_uid=ref.uid,
        )
        plan = plan.with_vnpus(vnpus.vnpus)
        if entry is not None:
            decided = PreparePlan(Step.REDO if vnpus.missing else Step.REPEAT, plan, missing=vnpus.missing)
        else:
            decided = PreparePlan(Step.NEW, plan, dies=plan.dies)
        return _interposed(decided, node)
    except Exception as refused:
        return PreparePlan(Step.NEW, base, refused=refused)


def _interposed(decided: PreparePlan, node: NodeFacts) -> PreparePlan:
    """``decided``, refused if the interposition its shares chose is impossible on this node (the
    last stage: a claim that breaks an earlier rule is refused for that one)."""
    if not decided.plan.shares:
        return decided
    configs = [d.config for d in decided.plan.devices if d.config is not None]
    try:  # the chosen interposition must be possible on this node, before any effect
        interposition.for_claim(configs, node.client_library(), claim_uid=decided.plan.ref.uid)
    except Exception as refused:
        return replace(decided, refused=refused)
    return decided


def _get(doc: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = doc
    for k in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(k)
    return cur


def plan_results(claim: Mapping[str, Any], *, driver_name: str) -> set[tuple[str, str | None]]:
    """(device, shareID) of each of this driver's allocation results of ``claim``, as
    :func:`plan_claim` reads them but without the node's inventory (malformed results are left out)."""
    out: set[tuple[str, str | None]] = set()
    results = _get(claim, "status", "allocation", "devices", "results")
    for res in results if isinstance(results, list) else []:
        if (
            isinstance(res, Mapping)
            and res.get("driver") == driver_name
            and isinstance(res.get("device"), str)
        ):
            share = res.get("shareID")
            out.add((str(res["device"]), str(share) if share else None))
    return out


def plan_claim(
    claim: Mapping[str, Any],
    *,
    ref: ClaimRef,
    driver_name: str,
    pool_name: str,
    inventory: Inventory,
) -> ClaimPlan:
    """Decide which of this node's devices ``claim`` gets and which opaque configs apply (the
    devices as ``Inventory.allocated`` reads them). Raises InvalidInput/StateError per claim."""
    uid = ref.uid
    actual_uid = _get(claim, "metadata", "uid")
    if actual_uid != uid:
        raise StateError(
            f"claim {ref.namespace}/{ref.name} got replaced: the API has UID {quote(actual_uid)}, "
            f"the kubelet asked for {quote(uid)}",
            code=ErrorCode.CLAIM_REPLACED,
            claim_uid=uid,
            field="metadata.uid",
        )
    allocation = _get(claim, "status", "allocation")
    if not isinstance(allocation, Mapping):
        raise StateError(
            f"claim {ref.namespace}/{ref.name} is not allocated",
            code=ErrorCode.CLAIM_NOT_ALLOCATED,
            claim_uid=uid,
            field="status.allocation",
        )
    results = _get(allocation, "devices", "results") or []
    raw_configs = _get(allocation, "devices", "config")
    if not isinstance(results, list):
        raise InvalidInput(
            f"results must be a list, got {type(results).__name__}",
            claim_uid=uid,
            field="status.allocation.devices.results",
        )
    devices = inventory.allocated(results, driver_name=driver_name, pool_name=pool_name, claim_uid=uid)
    configs = sharing.driver_configs(
        raw_configs, driver_name=driver_name, field="status.allocation.devices.config", claim_uid=uid
    )
    return ClaimPlan(
        ref=ref,
        devices=tuple(PlannedDevice(**{f.name: getattr(d, f.name) for f in fields(d)}) for d in devices),
        configs=tuple(configs),
    )


def resolve_shares(plan: ClaimPlan) -> ClaimPlan:
    """The plan with each soft device's share (quota from the allocation, virtual IDs in device
    order) and its resolved opaque config (``sharing.plan_shares``). Raises InvalidInput naming the field."""
    shared = sharing.plan_shares(plan.devices, plan.configs, claim_uid=plan.ref.uid, claim="")
    return replace(
        plan,
        devices=tuple(
            d if s is None else replace(d, shares=s.shares, config=s.config)
            for d, s in zip(plan.devices, shared.devices, strict=True)
        ),
    )

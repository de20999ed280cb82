"""What a claim gets on this node: pure planning from the allocated claim object.

The preparer asks once: :func:`plan_prepare` takes the claim, this node (:class:`NodeFacts`) and
every checkpoint entry, and returns the whole :class:`PreparePlan` — the step (a new prepare, a
repeat, a redo of an unfinished entry, an answer from the record of a withdrawn die, nothing to
do), the claim's plan with its shares and vNPUs, and its refusal, if any. The pieces it is made of:
given the ResourceClaim (as the API returned it), the driver name, this node's pool and
inventory, :func:`plan_claim` decides which dies the claim gets and how, and which opaque
configs apply to which request; :func:`resolve_shares` then gives each soft-split device its
share (quota from the allocation, virtual ID) and its resolved ``VnpuConfig`` — resolved
once, here, over the policy of the share device the scheduler chose (``vnpu-<phy>`` elastic,
``vnpu-<phy>-fixed``, ``vnpu-<phy>-best-effort``: ``dra_driver/slices.py``), which is the
share's policy unless a config names one. :func:`check_device_policies` refuses a new prepare
whose config names another policy than its device serves.
:func:`check_conflicts` is the node's last line of defence against what other claims hold.
The hard split is planned here too: :func:`assign_vnpus` gives each template device a vNPU ID
(avoiding every existing and recorded one), :func:`recorded_vnpus` gives a repeat prepare the
vNPUs its claim recorded, :func:`missing_vnpus` names the template devices a record lacks.
It performs no I/O and logs nothing; every error names the claim UID and the field. The same
input always gives the same plan, so a retry or a restart recomputes it instead of storing it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from dra_driver import sharing, slices
from dra_driver.devices import Die, DieMode, Inventory
from dra_driver.errors import ErrorCode, InvalidInput, StateError, quote
from dra_driver.records import ClaimEntry, ClaimState, DieRecord, HeldDie, held_dies
from dra_driver.sharing import Policy
from dra_driver.vnpu import Vnpu, planning
from dra_driver.vnpu.planning import HardVnpu
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_wire.shares import Share


@dataclass(frozen=True, slots=True)
class OpaqueConfig:
    """One ``opaque`` config entry for this driver, with where it came from."""

    source: str  # "FromClass" | "FromClaim"
    requests: tuple[str, ...]  # empty = all requests
    parameters: Mapping[str, Any]
    index: int  # position in status.allocation.devices.config (for error messages)

    def applies_to(self, request: str) -> bool:
        top = request.split("/", 1)[0]
        return not self.requests or request in self.requests or top in self.requests


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    request: str  # as in the allocation result, possibly "req/sub"
    pool: str
    device: str
    die: Die
    mode: DieMode
    share_id: str | None
    consumed_capacity: Mapping[str, str]
    admin_access: bool
    shares: tuple[
        Share, ...
    ] = ()  # soft split: the vNPUs (one, or N with ``vnpus: N``) the aclserver enforces
    config: sharing.VnpuConfig | None = None  # soft split: the resolved opaque config
    vnpu: HardVnpu | None = None  # hard split: the vNPU made for it (dra_driver/vnpu/planning.py)
    policy: Policy | None = None  # soft split: the policy its share device serves

    @property
    def device_policy(self) -> Policy:
        return self.policy or Policy.ELASTIC

    @property
    def request_name(self) -> str:
        """The top-level request name (the kubelet matches containers against it)."""
        return self.request.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    ref: ClaimRef
    devices: tuple[PlannedDevice, ...]
    configs: tuple[OpaqueConfig, ...]

    def configs_for(self, request: str) -> list[OpaqueConfig]:
        """Class configs first, then claim configs, each in order: later entries win."""
        ordered = sorted(
            (c for c in self.configs if c.applies_to(request)),
            key=lambda c: (0 if c.source == "FromClass" else 1, c.index),
        )
        return ordered

    @property
    def vnpus(self) -> tuple[HardVnpu, ...]:
        """The claim's hard-split vNPUs, once assigned (``with_vnpus``)."""
        return tuple(d.vnpu for d in self.devices if d.vnpu is not None)

    def hard_results(self) -> tuple[tuple[str, str], ...]:
        """(request, device) of each hard-split device, for ``dra_driver.vnpu.planning.plan_vnpus``."""
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

    def die_records(self) -> tuple[DieRecord, ...]:
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


def _get(doc: Mapping[str, Any], *keys: str) -> Any:
    cur: Any = doc
    for k in keys:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(k)
    return cur


def plan_claim(
    claim: Mapping[str, Any],
    *,
    ref: ClaimRef,
    driver_name: str,
    pool_name: str,
    inventory: Inventory,
) -> ClaimPlan:
    """Decide what this node prepares for ``claim``. Raises InvalidInput/StateError per claim."""
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

    devices: list[PlannedDevice] = []
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
                    f"{key} must be a string, got {type(value).__name__}", claim_uid=uid, field=f"{fld}.{key}"
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
        die = inventory.by_device_name(device) if isinstance(device, str) else None
        if die is None:
            raise InvalidInput(
                f"device {quote(device)} is not a device of this node ({pool_name})",
                code=ErrorCode.DEVICE_NOT_FOUND,
                claim_uid=uid,
                field=f"{fld}.device",
            )
        mode = inventory.device_mode(str(device)) or DieMode.SOFT
        share_id = res.get("shareID")
        consumed = res.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping):
            raise InvalidInput(
                "consumedCapacity is not a map", claim_uid=uid, field=f"{fld}.consumedCapacity"
            )
        devices.append(
            PlannedDevice(
                request=request,
                pool=pool,
                device=str(device),
                die=die,
                mode=mode,
                share_id=str(share_id) if share_id else None,
                consumed_capacity={str(k): str(v) for k, v in consumed.items()},
                admin_access=bool(res.get("adminAccess")),
                policy=inventory.share_policy(str(device)) if mode == DieMode.SOFT else None,
            )
        )

    configs = [
        OpaqueConfig(source=c.source, requests=c.requests, parameters=c.parameters, index=c.index)
        for c in sharing.driver_configs(
            raw_configs,
            driver_name=driver_name,
            field="status.allocation.devices.config",
            claim_uid=uid,
        )
    ]
    devices.sort(key=lambda d: (d.request, d.device, d.share_id or ""))
    return ClaimPlan(ref=ref, devices=tuple(devices), configs=tuple(configs))


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
    try:
        base = plan_claim(
            claim, ref=ref, driver_name=node.driver_name, pool_name=node.pool_name, inventory=node.inventory
        )
    except InvalidInput as not_here:
        # The kubelet's repeat prepare of a completed claim one of whose dies a changed inventory
        # withdrew: its entry answers when it records exactly the claim's allocated devices.
        if not_here.code != ErrorCode.DEVICE_NOT_FOUND or entry is None or not complete:
            raise
        if plan_results(claim, driver_name=node.driver_name) != {(d.device, d.share_id) for d in entry.dies}:
            raise
        return PreparePlan(Step.WITHDRAWN, ClaimPlan(ref=ref, devices=(), configs=()), refused=not_here)
    if not base.devices:
        return PreparePlan(Step.NOTHING, base)
    try:
        plan = resolve_shares(base)  # validates quotas and opaque config
        if entry is not None and complete:
            recorded = entry.vnpu_records
            missing = tuple(missing_vnpus(plan, recorded))  # an earlier adopt's entry: not as the die
            plan = recorded_vnpus(plan, recorded, inventory=node.inventory)
            return PreparePlan(Step.REDO if missing else Step.REPEAT, plan, missing=missing)
        if entry is not None:
            return PreparePlan(Step.REDO, plan)
        check_device_policies(plan)  # a new prepare's config agrees with its share device
        check_host_memory(plan, node.host_memory)  # and no more host memory than the node allows
        check_conflicts(plan, held_dies(entries, but=ref.uid))
        if plan.hard_results():  # vNPU IDs against every recorded one and every one on the node
            others = [r for other in entries.values() for r in other.vnpu_records]
            plan = assign_vnpus(plan, recorded=others, existing=existing(), inventory=node.inventory)
        return PreparePlan(Step.NEW, plan, dies=plan.die_records())
    except Exception as refused:
        return PreparePlan(Step.NEW, base, refused=refused)


def plan_results(claim: Mapping[str, Any], *, driver_name: str) -> set[tuple[str, str | None]]:
    """(device, shareID) of each of this driver's allocation results of ``claim``, as
    :func:`plan_claim` reads them but without the node's inventory (malformed results are left out)."""
    out: set[tuple[str, str | None]] = set()
    for res in _get(claim, "status", "allocation", "devices", "results") or []:
        if (
            isinstance(res, Mapping)
            and res.get("driver") == driver_name
            and isinstance(res.get("device"), str)
        ):
            share = res.get("shareID")
            out.add((str(res["device"]), str(share) if share else None))
    return out


def resolve_shares(plan: ClaimPlan) -> ClaimPlan:
    """The plan with each soft device's share (quota from the allocation, virtual IDs in device
    order) and its resolved opaque config. Raises InvalidInput naming the field."""
    uid = plan.ref.uid
    out: list[PlannedDevice] = []
    vid = 0
    for d in plan.devices:
        if d.mode != DieMode.SOFT:
            out.append(d)
            continue
        fld = f"status.allocation.devices.results[{d.request}/{d.device}].consumedCapacity"
        params = [
            (f"status.allocation.devices.config[{c.index}].opaque.parameters", c.parameters)
            for c in plan.configs_for(d.request)
        ]
        quota = sharing.share_quota(
            d.consumed_capacity, die_memory_bytes=d.die.memory_bytes, claim_uid=uid, field=fld
        )
        cfg = sharing.resolve(params, claim_uid=uid, base=sharing.VnpuConfig(policy=d.device_policy))
        each = (
            sharing.split(quota, cfg.vnpus, memory_only=cfg.memory_only, claim_uid=uid, field=fld)
            if cfg.vnpus > 1
            else quota
        )
        host = sharing.split_host_memory(cfg.host_memory, cfg.vnpus)
        shares = tuple(
            Share(
                virtual_id=vid + i,
                die_phy_id=d.die.phy_id,
                memory_bytes=each.memory_bytes,
                compute_percent=each.compute_percent,
                policy=str(cfg.policy),
                memory_only=cfg.memory_only,
                host_memory_bytes=host[i],
                priority=str(cfg.priority),
            )
            for i in range(cfg.vnpus)
        )
        out.append(replace(d, shares=shares, config=cfg))
        vid += cfg.vnpus
    return replace(plan, devices=tuple(out))


def check_device_policies(plan: ClaimPlan) -> None:
    """Refuse a share whose config names another policy than the share device the scheduler chose
    serves (the scheduler keeps one policy per die only through the device). Checked for a new
    prepare; a claim prepared before share devices had a policy keeps what it was prepared with."""
    for d in plan.devices:
        if d.config is None or d.config.policy == d.device_policy:
            continue
        setters = [c for c in plan.configs_for(d.request) if "policy" in c.parameters]
        at = setters[-1].index if setters else 0
        want = d.config.policy
        raise InvalidInput(
            f"policy {quote(str(want))} does not agree with the share device {quote(d.device)} the scheduler chose,"
            f" which serves {quote(str(d.device_policy))} shares: ask for {quote(str(want))} share devices"
            f" (the chart's DeviceClass {_CLASS_OF[want]}: devices whose attribute mode is"
            f" {quote(slices.share_mode(want))}), so that the scheduler places the share on a die without another policy",
            code=ErrorCode.INVALID_OPAQUE_CONFIG,
            claim_uid=plan.ref.uid,
            field=f"status.allocation.devices.config[{at}].opaque.parameters.policy",
        )


def check_host_memory(plan: ClaimPlan, bound: sharing.HostMemoryBound) -> None:
    """Refuse a share whose ``hostMemory`` is over the node's bound or its DeviceClass's value
    (:func:`dra_driver.sharing.check_host_memory`). Checked for a new prepare; a claim prepared
    before the bound was lowered keeps what it was prepared with."""
    for d in plan.devices:
        if d.config is None or d.config.host_memory is None:
            continue
        memory = sum(s.memory_bytes for s in d.shares)
        configs = [
            (c.source, f"status.allocation.devices.config[{c.index}].opaque.parameters", c.parameters)
            for c in plan.configs_for(d.request)
        ]
        sharing.check_host_memory(
            configs,
            memory_bytes=memory,
            bound=bound,
            claim_uid=plan.ref.uid,
            who=f"claim {plan.ref.namespace}/{plan.ref.name} (request {d.request}, device {d.device})",
        )


_CLASS_OF = {
    Policy.ELASTIC: "vnpu.flexnpu.io",
    Policy.FIXED: "vnpu-fixed.flexnpu.io",
    Policy.BEST_EFFORT: "vnpu-best-effort.flexnpu.io",
}


def check_conflicts(plan: ClaimPlan, held: Iterable[HeldDie]) -> None:
    """Refuse a plan that collides with what other claims hold: one die is whole XOR shared,
    one policy per die (also within the claim)."""
    uid = plan.ref.uid
    shares = plan.shares
    policies = {s.die_phy_id: s.policy for s in shares}
    held = list(held)
    for d in plan.devices:
        for other in held:
            if other.phy != d.die.phy_id:
                continue
            if DieMode.WHOLE in (d.mode, other.mode) or {d.mode, other.mode} == {DieMode.SOFT, DieMode.HARD}:
                raise StateError(
                    f"die {d.die.phy_id} ({d.device}) is already prepared "
                    f"{'exclusively' if other.mode == DieMode.WHOLE else 'as shares'} for claim "
                    f"{other.namespace}/{other.name} ({other.uid})",
                    code=ErrorCode.DEVICE_BUSY,
                    claim_uid=uid,
                    field="status.allocation.devices.results",
                )
            mine, theirs = policies.get(d.die.phy_id), other.policy
            if mine and theirs and mine != theirs:
                raise StateError(
                    f"die {d.die.phy_id} runs shares with policy {quote(theirs)} (claim "
                    f"{other.namespace}/{other.name}); this claim asks for {quote(mine)}",
                    code=ErrorCode.POLICY_CONFLICT,
                    claim_uid=uid,
                    field="config.opaque.parameters.policy",
                )
    whole = {d.die.phy_id for d in plan.devices if d.mode == DieMode.WHOLE}
    for d in plan.devices:
        if d.mode != DieMode.WHOLE and d.die.phy_id in whole:
            raise StateError(
                f"this claim asks for die {d.die.phy_id} whole and for a share of it ({d.device}); "
                "a die is either exclusive or shared",
                code=ErrorCode.DEVICE_BUSY,
                claim_uid=uid,
                field="status.allocation.devices.results",
            )
    for a in shares:
        for b in shares:
            if a.die_phy_id == b.die_phy_id and a.policy != b.policy:
                raise StateError(
                    f"two shares of die {a.die_phy_id} in this claim ask for policies {quote(a.policy)} and {quote(b.policy)}",
                    code=ErrorCode.POLICY_CONFLICT,
                    claim_uid=uid,
                    field="config.opaque.parameters.policy",
                )


# -- the hard split: vNPU IDs --------------------------------------------------------------------


def assign_vnpus(
    plan: ClaimPlan,
    *,
    recorded: Iterable[Mapping[str, Any]],
    existing: Iterable[Vnpu],
    inventory: Inventory,
) -> ClaimPlan:
    """The plan with a vNPU ID for each hard result, avoiding every existing vNPU and every one any
    claim ``recorded`` (the caller runs it under the checkpoint lock, so two prepares never pick the
    same ID)."""
    vnpus = planning.plan_vnpus(
        plan.hard_results(), inventory=inventory, taken=taken_ids(existing, recorded), claim_uid=plan.ref.uid
    )
    return plan.with_vnpus(vnpus)


def recorded_vnpus(
    plan: ClaimPlan, recorded: Sequence[Mapping[str, Any]], *, inventory: Inventory
) -> ClaimPlan:
    """The plan with the vNPUs its completed claim ``recorded`` (a repeat prepare's CDI spec and status)."""
    if not recorded:
        return plan
    return plan.with_vnpus(planning.from_records(list(recorded), inventory=inventory, claim_uid=plan.ref.uid))


def missing_vnpus(plan: ClaimPlan, recorded: Iterable[Mapping[str, Any]]) -> list[str]:
    """Template devices of ``plan`` for which the claim ``recorded`` no vNPU."""
    have = {str(r.get("device") or "") for r in recorded}
    return [device for _, device in plan.hard_results() if device not in have]


def taken_ids(existing: Iterable[Vnpu], recorded: Iterable[Mapping[str, Any]]) -> set[int]:
    """vNPU IDs a new vNPU must not use: existing ones and ones recorded by any claim."""
    return {v.vnpu_id for v in existing} | {int(r["vnpuID"]) for r in recorded}

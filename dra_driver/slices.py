"""What this node publishes: its NPU dies as ResourceSlice spec fragments (pure).

Owns the device model on the wire (names, attributes, capacities, counters): *what* to publish.
The generic half — the pool type, the split into slices within the API limits, pre-validation,
and the controller that compares the pool with what the API server holds and writes the
difference — is the kubelet-plugin helper's ``dra_kubeletplugin/resourceslice/``. It must not do
I/O, log, or import ``kubernetes``. Output is deterministic
(sorted by physical ID), so a restart recomputes the same slices.

Modes per die (:func:`resolve_mode`):

* ``whole`` -> one exclusive device ``npu-<phy>``.
* ``soft``  -> one share device per compute policy (:func:`share_mode`): ``vnpu-<phy>``
  (``elastic``, the default: attribute ``mode`` ``soft``), ``vnpu-<phy>-fixed`` (``soft-fixed``)
  and ``vnpu-<phy>-best-effort`` (``soft-best-effort``), each with attribute ``policy``,
  ``allowMultipleAllocations`` and consumable
  ``memory`` (128 MiB steps) and ``compute`` (1 % steps) capacities (KEP-5075). Its AI Core and
  AI CPU counts are int attributes, not capacities: a share would consume all of a capacity that
  has no request policy. A third consumable capacity, ``shares`` (value ``max_shares_per_die``,
  default 63, request policy ``default: 1, validValues: [1]``), is the per-die share limit the
  scheduler sees: every share consumes exactly one, so the share after the last one the node can
  serve stays pending instead of failing prepare. It is a capacity and not a counter because the
  v1.36 allocator charges a device's counters once while it is allocated at all, however many
  shares it has (see ``flexnpu_testing/scheduler.py``): a counter cannot count shares.
* ``both``  -> both devices on one die, kept apart by the scheduler through shared counters
  (KEP-4815). The die gets a counter set ``die-<phy>`` with ``memory`` (bytes) and
  ``compute`` (100). The whole device consumes **all** of them; the soft device consumes a
  token, ``memory: 1`` (one byte).

  Why a token is enough, whichever way the allocator accounts for a device that is allocated
  many times: the v1.36 allocator (``checkAvailableCounters``) rebuilds the available
  counters from devices that are *allocated at all* (``IsDeviceAllocated`` since
  kubernetes#139040, which added shared allocations), and in the current cycle charges a
  multi-allocatable device's ``consumesCounters`` only for its first share (``allocateDevice``
  skips the check while the device has capacity in use, kubernetes#134103). So:

  - shares allocated => the soft device counts as allocated => at least 1 byte of the die's
    ``memory`` counter is used => the whole device (needs all of it) no longer fits;
  - whole allocated => the counter is at 0 => the soft device (needs 1) does not fit.

  If an allocator instead subtracted the token once per share, N shares would use N bytes
  (at most a few hundred, since a share is at least 128 MiB): both rules still hold and no
  share is refused for it. Schedulers without kubernetes#139040 ignore counters of
  multi-allocated devices from earlier cycles; there a whole claim could land on a die with
  shares. Use ``use_counters=False`` (one mode per die) on such clusters.

* ``hard`` -> HDK templates as partitionable devices (``dra_driver/templates.py``): one
  exclusive device per possible instance, ``npu-<phy>-<template>-<i>`` (as many as the die could
  hold of that template alone), attribute ``template`` (e.g. ``vir10_3c_32g``), capacities
  ``aicore``, ``aicpu``, ``memory`` (and ``media`` on 310P). The die's counter set ``die-<phy>``
  has ``aicore``, ``aicpu``, ``memory``, ``vnpus`` (the size of its vNPU ID range) and, on 310P,
  ``media``; each instance consumes its template's figures and one ``vnpus``, so the scheduler
  alone keeps every combination within the die (two ``vir10_3c_32g`` fill a 910B3).
* ``all``  -> whole, soft and hard on one die. Counters as in ``hard``; the whole device consumes
  all of ``aicore``, ``aicpu``, ``memory`` (and ``media``), so it waits while anything else is
  allocated and keeps everything else off. Soft and hard **alternate** on a die rather than
  share it, through the die's ``vnpus`` counter: each template instance consumes one (as in
  ``hard``), each share device **all** of it (plus the 1-byte ``memory`` token that keeps the
  whole device off). So with a template on the die no share device fits (fewer ``vnpus`` than it
  needs), with a share on the die ``vnpus`` is 0 and no template fits, and shares pile up on
  their device because the v1.36 allocator checks and charges a multi-allocatable device's
  counters only for its first allocation: ``allocateDevice`` skips ``checkAvailableCounters``
  while the device has capacity in use (``skipCounterCheck``, kubernetes#134103; committed shares
  are in ``AggregatedCapacity``, and every share here consumes capacity, at least one
  ``shares``), and counts a committed device's counters once (``IsDeviceAllocated``,
  kubernetes#139040). The same makes the three share devices of a die (one per policy) exclude
  each other: the scheduler keeps one policy per die. An allocator that charged the counters
  again per share would leave the second share of a die pending (never a mix). Four counters a
  die (five on 310P) and two per share device: the allocator's counter work per node and pod
  follows the counters of the pool (``checkAvailableCounters`` compares every counter of the
  pool on each device it tries), so this is what keeps templates as cheap to place as shares.

One policy per die, decided by the scheduler: the aclservers of a die share one compute ledger,
so all shares of a die run one policy. On an ``all`` die the ``vnpus`` counter says so (above);
``soft`` dies have no counters and on ``both`` dies a share device consumes only a token, so the
exclusion is in the pool instead: ``policies`` (what this node prepared: die -> policy) puts a ``NoSchedule``
taint ``npu.flexnpu.io/share-policy=<policy>`` on the die's share devices of every other policy,
and the node republishes when a die's policy changes (its first share prepared, its last gone). A
claim allocated in the moment before that lands is refused by the node's ``PolicyConflict``
guard, which is counted. A class selects by ``mode``, an attribute every device has (a selector
naming an attribute a device lacks is a CEL error); ``mode == "soft"`` keeps selecting exactly
the shares of the default policy.

Held resources: a die with vNPUs that no claim of this driver owns (made outside the driver) is
published without the capacity they hold (``held``): its counter totals are reduced, and it gets
no whole and no soft device (a virtualized chip cannot be used whole).

``use_counters=False`` is the fallback when the API server drops ``sharedCounters`` /
``consumesCounters`` (DRAPartitionableDevices off): every die is then published in exactly one
mode; ``both`` becomes ``fallback_mode`` (``whole`` unless told otherwise), so whole and shared
can never meet on one die.

Device order (the allocator is first-fit in slice-name, then device, order): whole devices
ascending by physical ID, then share devices by die descending (elastic, fixed, best-effort
within a die), so exclusive claims fill dies from one end and shares from the other, and they
collide on a die only when the node is nearly full. That is the order of an empty node; the node
reorders each slice's devices by what is allocated on each die (``dra_driver/placement.py``:
binpack or spread). The split into slices (:func:`dra_driver.placement.layout`) does not depend on
usage: whole and share devices first, then template instances grouped by template across dies.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver import placement, templates
from dra_driver.devices import MIB, SHARE_POLICIES, Die, DieMode, Health, Inventory, template_device_name
from dra_driver.errors import ErrorCode, InvalidInput
from dra_driver.templates import Template
from dra_kubeletplugin.resourceslice import pools
from flexnpu_wire.codes import Policy
from flexnpu_wire.launch import DEFAULT_MAX_SHARES_PER_DIE  # one default for the node and the ledger

JSON = dict[str, Any]

DesiredPool = pools.Pool
"""The pool this node publishes: the helper's ``resourceslice.pools.Pool`` (this module's name for it)."""
MAX_COUNTERS_PER_SET = pools.MAX_COUNTERS_PER_SET
MAX_DEVICES_PER_SLICE = pools.MAX_DEVICES_PER_SLICE
MAX_DEVICES_PER_SLICE_WITH_COUNTERS = pools.MAX_DEVICES_PER_SLICE_WITH_COUNTERS

SOFT_MEMORY_STEP = 128 * MIB
"""Granularity of a soft share's ``memory`` (bytes)."""
SOFT_COMPUTE_DEFAULT = 1
"""A share that does not ask for ``compute`` gets the smallest guaranteed slice, 1 %.

A default of 100 would make every memory-only claim take a whole die's compute and block all
other shares; 1 % keeps them packable, and the elastic / best-effort policies (opaque config)
let such a share borrow idle time beyond its floor.
"""
FULL_COMPUTE = 100
SHARES_CAPACITY = "shares"
SHARE_TOKEN = "1"  # noqa: S105 (a counter amount, not a secret)
"""What a soft device consumes from its die's ``memory`` counter (see the module docstring)."""

PCI_BUS_ATTRIBUTE = "resource.kubernetes.io/pciBusID"
UNHEALTHY_TAINT = "npu.flexnpu.io/unhealthy"
"""Taint key on the devices of an unhealthy die: NoSchedule keeps new claims off it (DRADeviceTaints)."""
POLICY_TAINT = "npu.flexnpu.io/share-policy"
"""Taint key on a die's share devices of the policies it does not run now (value: the one it runs)."""

_MODE_NAMES = {m.value for m in DieMode}


@dataclass(frozen=True, slots=True)
class Held:
    """Resources of a die held by vNPUs this driver does not own (made outside it)."""

    aicore: int = 0
    aicpu: int = 0
    memory_mib: int = 0
    media: int = 0
    vnpus: int = 0

    def __bool__(self) -> bool:
        return any((self.aicore, self.aicpu, self.memory_mib, self.media, self.vnpus))


def resolve_mode(die: Die, inventory: Inventory, default_mode: str) -> DieMode:
    """The mode of one die: the inventory's per-die override, else ``default_mode``.

    Values are ``whole``, ``soft``, ``both`` or ``hard``; anything else is InvalidInput.
    """
    raw = inventory.die_modes.get(die.phy_id, default_mode)
    if str(raw) not in _MODE_NAMES:
        raise InvalidInput(
            f"die {die.phy_id}: unknown mode {raw!r}; use one of {', '.join(sorted(_MODE_NAMES))}",
            code=ErrorCode.INVALID_CONFIG,
            field="default-mode" if die.phy_id not in inventory.die_modes else f"dies[{die.phy_id}].mode",
        )
    return DieMode(str(raw))


def build_pool(
    inventory: Inventory,
    *,
    driver_name: str,
    node_name: str,
    mode_of: Callable[[Die], DieMode] | None = None,
    use_counters: bool = True,
    fallback_mode: DieMode = DieMode.WHOLE,
    generation: int = 0,
    max_shares_per_die: int = DEFAULT_MAX_SHARES_PER_DIE,
    held: Mapping[int, Held] | None = None,
    policies: Mapping[int, Policy] | None = None,
) -> DesiredPool:
    """The pool this node publishes: device slices first, then counter slices.

    ``mode_of`` defaults to ``resolve_mode(die, inventory, "both")``. With
    ``use_counters=False`` a ``both`` die is published as ``fallback_mode`` only.
    ``driver_name`` is part of the signature for symmetry with the publisher; the
    fragments do not contain it. ``max_shares_per_die`` (>= 1) is the ``shares`` capacity of
    every soft device. ``held`` maps a physical ID to what vNPUs made outside the driver hold on
    that die (see the module docstring). Without counters a ``hard`` or ``all`` die is published
    as ``fallback_mode``: templates need counters. ``policies`` maps a physical ID to the policy
    its shares run now: the die's share devices of the other policies are tainted NoSchedule.
    """
    del driver_name  # the publisher puts it in every slice
    if max_shares_per_die < 1:
        raise InvalidInput(
            f"the share limit per die must be at least 1, not {max_shares_per_die}",
            code=ErrorCode.INVALID_CONFIG,
            field="max-shares-per-die",
        )
    if fallback_mode not in (DieMode.WHOLE, DieMode.SOFT):
        raise InvalidInput(
            f"fallback mode must be whole or soft, not {fallback_mode!r}",
            code=ErrorCode.INVALID_CONFIG,
            field="fallback_mode",
        )
    resolve = mode_of or (lambda die: resolve_mode(die, inventory, DieMode.BOTH))
    dies = sorted(inventory.dies, key=lambda d: d.phy_id)

    whole: list[JSON] = []
    soft: list[list[JSON]] = []  # per die, one share device per policy
    hard: list[list[JSON]] = []
    counter_sets: list[JSON] = []
    for die in dies:
        mode = resolve(die)
        held_here = (held or {}).get(die.phy_id, Held())
        if mode in (DieMode.BOTH, DieMode.HARD, DieMode.ALL) and not use_counters:
            mode = fallback_mode
        if mode in (DieMode.HARD, DieMode.ALL):
            counter_sets.append(_hard_counter_set(die, held_here))
            hard.append(
                [
                    _template_device(die, inventory, t, i)
                    for t, i in _template_slots(die, inventory, held_here)
                ]
            )
            if held_here:
                continue  # a virtualized die is neither whole nor soft
            if mode == DieMode.ALL:
                whole.append(_whole_device(die, inventory, counters=_hard_whole_counters(die)))
                soft.append(
                    _share_devices(
                        die,
                        inventory,
                        counters=_all_soft_counters(die),
                        max_shares=max_shares_per_die,
                        running=(policies or {}).get(die.phy_id),
                    )
                )
            continue
        both = mode == DieMode.BOTH
        if mode in (DieMode.WHOLE, DieMode.BOTH):
            whole.append(
                _whole_device(die, inventory, counters=_both_counters(die, whole=True) if both else None)
            )
        if mode in (DieMode.SOFT, DieMode.BOTH):
            soft.append(
                _share_devices(
                    die,
                    inventory,
                    counters=_both_counters(die, whole=False) if both else None,
                    max_shares=max_shares_per_die,
                    running=(policies or {}).get(die.phy_id),
                )
            )
        if both:
            counter_sets.append(_counter_set(die))

    hard_devices = [d for per_die in reversed(hard) for d in per_die]
    devices = whole + hard_devices + [d for per_die in reversed(soft) for d in per_die]
    return DesiredPool(name=node_name, slices=placement.layout(devices, counter_sets), generation=generation)


def share_mode(policy: Policy) -> str:
    """The ``mode`` attribute of a share device of ``policy``: ``soft`` (elastic) or ``soft-<policy>``."""
    return str(DieMode.SOFT) if policy is Policy.ELASTIC else f"{DieMode.SOFT}-{policy}"


# --- devices -----------------------------------------------------------------------------


def _attributes(die: Die, inventory: Inventory, mode: DieMode) -> JSON:
    chip = die.chip_model
    attrs: JSON = {
        "model": {"string": die.model},
        "socName": {"string": chip.soc_name(die.npu_name)},
        "generation": {"string": chip.generation},
        "vdieID": {"string": die.vdie_id},
        "uuid": {"string": die.vdie_id},
        "phyID": {"int": die.phy_id},
        "logicID": {"int": die.logic_id},
        "cardID": {"int": die.card_id},
        "chipID": {"int": die.chip_id},
        "dieIndex": {"int": die.die_index},
        "numaNode": {"int": die.numa_node},
        PCI_BUS_ATTRIBUTE: {"string": die.pci_bus_id},
        "healthy": {"bool": die.health == Health.HEALTHY},
        "mode": {"string": str(mode)},
    }
    if inventory.driver_version:
        attrs["driverVersion"] = {"string": inventory.driver_version}
    if inventory.firmware_version:
        attrs["firmwareVersion"] = {"string": inventory.firmware_version}
    return dict(sorted(attrs.items()))


def _whole_device(die: Die, inventory: Inventory, *, counters: JSON | None) -> JSON:
    device: JSON = {
        "name": die.whole_device_name,
        "attributes": _attributes(die, inventory, DieMode.WHOLE),
        "capacity": {
            "aicore": {"value": str(die.aicore)},
            "aicpu": {"value": str(die.aicpu)},
            "compute": {"value": str(FULL_COMPUTE)},
            "memory": {"value": str(die.memory_bytes)},
        },
    }
    if counters is not None:
        device["consumesCounters"] = [{"counterSet": _counter_set_name(die), "counters": counters}]
    _taint_if_unhealthy(device, die)
    return device


def _share_devices(
    die: Die, inventory: Inventory, *, counters: JSON | None, max_shares: int, running: Policy | None
) -> list[JSON]:
    """The die's share devices, one per policy; while it runs ``running``, the others are tainted."""
    out = []
    for policy in SHARE_POLICIES:
        device = _soft_device(die, inventory, counters=counters, max_shares=max_shares, policy=policy)
        if running is not None and policy != running:
            device.setdefault("taints", []).append(
                {"key": POLICY_TAINT, "value": str(running), "effect": "NoSchedule"}
            )
        out.append(device)
    return out


def _soft_device(
    die: Die, inventory: Inventory, *, counters: JSON | None, max_shares: int, policy: Policy
) -> JSON:
    step = SOFT_MEMORY_STEP
    max_memory = die.memory_bytes // step * step
    # On a multi-allocatable device every capacity is consumed by each share: one without a
    # requestPolicy is taken whole by a request that does not name it (KEP-5075). So the AI
    # Core / AI CPU counts are attributes here, not capacities; a share's compute is ``compute``.
    attributes = _attributes(die, inventory, DieMode.SOFT)
    attributes.update(
        aicore={"int": die.aicore},
        aicpu={"int": die.aicpu},
        mode={"string": share_mode(policy)},
        policy={"string": str(policy)},
    )
    device: JSON = {
        "name": die.share_device_name(policy),
        "attributes": dict(sorted(attributes.items())),
        "allowMultipleAllocations": True,
        "capacity": {
            "compute": {
                "value": str(FULL_COMPUTE),
                "requestPolicy": {
                    "default": str(SOFT_COMPUTE_DEFAULT),
                    "validRange": {"min": "1", "max": str(FULL_COMPUTE), "step": "1"},
                },
            },
            "memory": {
                "value": str(die.memory_bytes),
                "requestPolicy": {
                    "default": str(step),
                    "validRange": {"min": str(step), "max": str(max_memory), "step": str(step)},
                },
            },
            SHARES_CAPACITY: {
                "value": str(max_shares),
                "requestPolicy": {"default": "1", "validValues": ["1"]},
            },
        },
    }
    if counters is not None:
        device["consumesCounters"] = [{"counterSet": _counter_set_name(die), "counters": counters}]
    _taint_if_unhealthy(device, die)
    return device


def _both_counters(die: Die, *, whole: bool) -> JSON:
    if whole:
        return {"compute": {"value": str(FULL_COMPUTE)}, "memory": {"value": str(die.memory_bytes)}}
    return {"memory": {"value": SHARE_TOKEN}}


def _template_slots(die: Die, inventory: Inventory, held: Held) -> list[tuple[Template, int]]:
    """(template, index) per publishable instance slot of the die, in table order."""
    avail = _hard_totals(die, held)
    slots: list[tuple[Template, int]] = []
    for t in templates.for_model(die.model, inventory.templates):
        n = templates.instances(
            t,
            aicore=avail["aicore"],
            aicpu=avail["aicpu"],
            memory_mib=avail["memory"] // MIB,
            media=avail.get("media"),
        )
        n = min(n, avail["vnpus"])
        slots += [(t, i) for i in range(n)]
    return slots


def _hard_totals(die: Die, held: Held) -> dict[str, int]:
    totals = {
        "aicore": max(0, die.aicore - held.aicore),
        "aicpu": max(0, die.aicpu - held.aicpu),
        "memory": max(0, templates.template_memory_mib(die.model, die.memory_mib) - held.memory_mib) * MIB,
        "vnpus": max(0, len(templates.vnpu_id_range(die.model, die.phy_id)) - held.vnpus),
    }
    media = templates.media_of(die.model)
    if media is not None:
        totals["media"] = max(0, media - held.media)
    return totals


def _hard_counter_set(die: Die, held: Held) -> JSON:
    counters: JSON = {name: {"value": str(v)} for name, v in sorted(_hard_totals(die, held).items())}
    return {"name": _counter_set_name(die), "counters": counters}


def _hard_whole_counters(die: Die) -> JSON:
    totals = _hard_totals(die, Held())
    return {name: {"value": str(v)} for name, v in sorted(totals.items()) if name != "vnpus"}


def _all_soft_counters(die: Die) -> JSON:
    """A share device of an ``all`` die: the ``memory`` token and all of ``vnpus`` (see the module docstring)."""
    return {"memory": {"value": SHARE_TOKEN}, "vnpus": {"value": str(_hard_totals(die, Held())["vnpus"])}}


def _template_device(die: Die, inventory: Inventory, template: Template, index: int) -> JSON:
    attributes = _attributes(die, inventory, DieMode.HARD)
    attributes["template"] = {"string": template.name}
    capacity: JSON = {
        "aicore": {"value": str(template.aicore)},
        "aicpu": {"value": str(template.aicpu)},
        "memory": {"value": str(template.memory_bytes)},
    }
    counters: JSON = {
        "aicore": {"value": str(template.aicore)},
        "aicpu": {"value": str(template.aicpu)},
        "memory": {"value": str(template.memory_bytes)},
        "vnpus": {"value": "1"},
    }
    if templates.media_of(die.model) is not None:
        capacity["media"] = {"value": str(template.media or 0)}
        counters["media"] = {"value": str(template.media or 0)}
    device: JSON = {
        "name": template_device_name(die, template, index),
        "attributes": dict(sorted(attributes.items())),
        "capacity": dict(sorted(capacity.items())),
        "consumesCounters": [
            {"counterSet": _counter_set_name(die), "counters": dict(sorted(counters.items()))}
        ],
    }
    _taint_if_unhealthy(device, die)
    return device


def _taint_if_unhealthy(device: JSON, die: Die) -> None:
    if die.health == Health.UNHEALTHY:
        device["taints"] = [{"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}]


def _counter_set_name(die: Die) -> str:
    return f"die-{die.phy_id}"


def _counter_set(die: Die) -> JSON:
    return {
        "name": _counter_set_name(die),
        "counters": {
            "compute": {"value": str(FULL_COMPUTE)},
            "memory": {"value": str(die.memory_bytes)},
        },
    }

"""Placement policies: in which order a node lists its devices, and how full a node is (pure).

The v1.36 allocator has no device scoring: it walks pools, slices (by name) and devices (in
listed order) and takes the first solution. So the order a node publishes *is* its die-level
placement policy. This module computes that order from the capacity allocated on each die, and
the node-level fill the scheduler extender (``controller/extender.py``) scores nodes by. It does
no I/O and imports no ``kubernetes``.

* :func:`die_usage` — what the allocated claims of one pool hold on each die, per kind of
  device: shares (compute and memory of the die's share devices), templates (AI Cores and memory
  of its template instances), whole.
* :func:`order_pool` — the pool with the devices of each slice permuted (a device never changes
  slice, so the helper's invariants hold: no device is in two slices or in none at any moment;
  a change of one slice keeps the pool's generation, see ``dra_kubeletplugin/resourceslice/sync.py``):

  - **binpack**: share devices of the most-used die (by shares) first, empty dies after, full
    dies last; template instances the same by template use;
  - **spread**: least-used first, full dies last;
  - ties (e.g. empty dies) by physical ID *descending* for shares and templates and *ascending*
    for whole dies, so exclusive claims and shares start at opposite ends of the node;
  - whole devices: ascending by physical ID whatever is allocated (any free die serves a whole
    claim, and a static order makes a whole allocation republish nothing);
  - a die's devices of one kind keep their relative order (policies of a share, template slots).

  A share's die counts as used by its shares only: a die held whole or by templates cannot take
  a share at all (the counters keep them apart), so it sorts like an empty one and the allocator
  skips it; likewise for templates. This keeps a share's allocation from reordering the template
  slices and the reverse, so one allocation changes one slice (no generation bump).
* :func:`node_fill` / :func:`node_score` — a node's fill (dies in use, compute, memory) and the
  extender's score 0..10 for a policy: binpack the fullest node, spread the emptiest.

Slice layout (:func:`layout`, used by ``dra_driver/slices.py``) does not depend on usage: whole
and share devices first, then template instances grouped by template across all dies, each group
kept in one slice when it fits, so a template claim finds every instance of its template in one
slice and the order within it is the whole policy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from fractions import Fraction
from typing import Any

from dra_driver.errors import ErrorCode, InvalidInput
from dra_kubeletplugin.resourceslice import pools, sync

JSON = dict[str, Any]

ANNOTATION = "npu.flexnpu.io/placement"
"""A pod's own policy for the extender (``spread`` or ``binpack``), over the cluster's default."""
MAX_EXTENDER_PRIORITY = 10
"""``k8s.io/kube-scheduler/extender/v1.MaxExtenderPriority``: an extender scores 0..10."""


class Placement(StrEnum):
    BINPACK = "binpack"
    SPREAD = "spread"

    @classmethod
    def parse(cls, value: str | None, *, field: str = "placement") -> Placement:
        """``binpack`` or ``spread`` (case-insensitive); anything else is InvalidInput naming ``field``."""
        text = (value or "").strip().lower()
        try:
            return cls(text)
        except ValueError:
            raise InvalidInput(
                f"unknown placement policy {value!r}; use binpack or spread",
                code=ErrorCode.INVALID_CONFIG,
                field=field,
            ) from None


class Kind(StrEnum):
    WHOLE = "whole"
    SHARE = "share"
    TEMPLATE = "template"


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    """What the ordering needs to know of one published device."""

    phy: int
    kind: Kind
    template: str = ""
    memory: int = 0  # bytes: a share device's die memory, a template instance's own memory
    aicore: int = 0  # a template instance's AI Cores


@dataclass(frozen=True, slots=True)
class DieTotals:
    """A die's totals the fill is measured against (from its devices and counter set)."""

    memory: int = 0
    aicore: int = 0


@dataclass(frozen=True, slots=True)
class DieUse:
    """What allocated claims hold on one die."""

    whole: bool = False
    shares: int = 0
    compute: Fraction = Fraction(0)  # percent of the die, summed over shares
    share_memory: int = 0
    templates: int = 0
    template_aicore: int = 0
    template_memory: int = 0

    @property
    def used(self) -> bool:
        return self.whole or self.shares > 0 or self.templates > 0

    def share_fill(self, totals: DieTotals) -> Fraction:
        """How full the die is for shares: the larger of compute and memory, 0..1."""
        return max(
            self.compute / 100, Fraction(self.share_memory, totals.memory) if totals.memory else Fraction(0)
        )

    def template_fill(self, totals: DieTotals) -> Fraction:
        return max(
            Fraction(self.template_aicore, totals.aicore) if totals.aicore else Fraction(0),
            Fraction(self.template_memory, totals.memory) if totals.memory else Fraction(0),
        )

    def fill(self, totals: DieTotals) -> Fraction:
        """How full the die is, 0..1: 1 when held whole, else the fuller of its shares and templates."""
        if self.whole:
            return Fraction(1)
        return min(Fraction(1), max(self.share_fill(totals), self.template_fill(totals)))


@dataclass(frozen=True, slots=True)
class Allocated:
    """One allocation result of this driver: its pool, device and what a share consumed."""

    pool: str
    device: str
    consumed: Mapping[str, str] = field(default_factory=dict)


# --- reading the pool -----------------------------------------------------------------------


def device_infos(pool: pools.Pool) -> dict[str, DeviceInfo]:
    """Device name -> what it is, for every device of ``pool`` with a ``phyID`` attribute."""
    out: dict[str, DeviceInfo] = {}
    for spec in pool.slices:
        for dev in spec.get("devices") or []:
            info = _info(dev)
            if info is not None:
                out[dev["name"]] = info
    return out


def die_totals(pool: pools.Pool) -> dict[int, DieTotals]:
    """Per die: memory and AI Cores, from its counter set ``die-<phy>`` and its devices' capacity."""
    memory: dict[int, int] = {}
    aicore: dict[int, int] = {}
    for spec in pool.slices:
        for cset in spec.get("sharedCounters") or []:
            name = str(cset.get("name", ""))
            if not name.startswith("die-") or not name[4:].isdigit():
                continue
            phy = int(name[4:])
            counters = cset.get("counters") or {}
            if "aicore" in counters:
                aicore[phy] = _int(counters["aicore"].get("value"))
            if "memory" in counters:
                memory[phy] = max(memory.get(phy, 0), _int(counters["memory"].get("value")))
        for dev in spec.get("devices") or []:
            info = _info(dev)
            if info is None:
                continue
            caps = dev.get("capacity") or {}
            if info.kind in (Kind.WHOLE, Kind.SHARE) and "memory" in caps:
                memory[info.phy] = max(memory.get(info.phy, 0), _int(caps["memory"].get("value")))
            if info.kind is Kind.WHOLE and "aicore" in caps:
                aicore.setdefault(info.phy, _int(caps["aicore"].get("value")))
    phys = set(memory) | set(aicore)
    return {p: DieTotals(memory=memory.get(p, 0), aicore=aicore.get(p, 0)) for p in phys}


def _info(dev: JSON) -> DeviceInfo | None:
    attrs = dev.get("attributes") or {}
    phy = (attrs.get("phyID") or {}).get("int")
    if not isinstance(phy, int):
        return None
    caps = dev.get("capacity") or {}
    if dev.get("allowMultipleAllocations"):
        return DeviceInfo(phy, Kind.SHARE, memory=_int((caps.get("memory") or {}).get("value")))
    template = (attrs.get("template") or {}).get("string")
    if template:
        return DeviceInfo(
            phy,
            Kind.TEMPLATE,
            template=str(template),
            memory=_int((caps.get("memory") or {}).get("value")),
            aicore=_int((caps.get("aicore") or {}).get("value")),
        )
    return DeviceInfo(phy, Kind.WHOLE)


def _int(value: object) -> int:
    """A quantity as an integer ("8", "34359738368", "256Mi", "1.5Gi"); 0 when it is not one."""
    return _quantity(str(value))


@functools.lru_cache(maxsize=4096)
def _quantity(text: str) -> int:
    """:func:`_int` of a string, kept: the same few quantities (a share's compute and memory) are
    read again for every claim of a pool each time one of them changes."""
    try:
        return int(sync.parse_quantity(text))
    except ValueError:
        return 0


def allocated_results(
    claims: Iterable[Mapping[str, Any]], *, driver: str, pool: str | None = None
) -> list[Allocated]:
    """The allocation results of ``driver`` (in ``pool`` only, when given) of every allocated claim."""
    out: list[Allocated] = []
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for res in (allocation.get("devices") or {}).get("results") or []:
            if res.get("driver") != driver or (pool is not None and res.get("pool") != pool):
                continue
            if res.get("adminAccess"):
                continue  # admin access holds nothing
            out.append(
                Allocated(
                    pool=str(res.get("pool", "")),
                    device=str(res.get("device", "")),
                    consumed=dict(res.get("consumedCapacity") or {}),
                )
            )
    return out


def die_usage(results: Iterable[Allocated], infos: Mapping[str, DeviceInfo]) -> dict[int, DieUse]:
    """Per die, what ``results`` hold (results naming a device not in ``infos`` are skipped)."""
    # Summed in one list per die, a DieUse made once per die (not one per result: this runs for
    # every claim event, over all the pool's results, in the node's ordering and the extender).
    sums: dict[int, list[int]] = {}  # whole, shares, compute, share memory, templates, AI Cores, memory
    for res in results:
        info = infos.get(res.device)
        if info is None:
            continue
        acc = sums.get(info.phy)
        if acc is None:
            acc = sums[info.phy] = [0, 0, 0, 0, 0, 0, 0]
        if info.kind is Kind.WHOLE:
            acc[0] = 1
        elif info.kind is Kind.SHARE:
            acc[1] += 1
            acc[2] += _int(res.consumed.get("compute", "1"))
            acc[3] += _int(res.consumed.get("memory", "0"))
        else:
            acc[4] += 1
            acc[5] += info.aicore
            acc[6] += info.memory
    return {
        phy: DieUse(
            whole=bool(acc[0]),
            shares=acc[1],
            compute=Fraction(acc[2]),
            share_memory=acc[3],
            templates=acc[4],
            template_aicore=acc[5],
            template_memory=acc[6],
        )
        for phy, acc in sums.items()
    }


# --- ordering -------------------------------------------------------------------------------


def order_pool(
    pool: pools.Pool, usage: Mapping[int, DieUse], policy: Placement, facts: PoolFacts | None = None
) -> pools.Pool:
    """``pool`` with each slice's devices in ``policy`` order for ``usage``; no device changes slice.
    ``facts``: the pool's :class:`PoolFacts` when the caller has them already."""
    infos = facts.infos if facts is not None else device_infos(pool)
    totals = facts.totals if facts is not None else die_totals(pool)
    keys: dict[tuple[Kind, int], tuple[Any, ...]] = {}  # a die's key per kind, worked out once
    slices = [
        {
            **spec,
            "devices": _order_groups(
                facts.groups[i] if facts is not None else device_groups(spec["devices"], infos),
                totals,
                usage,
                policy,
                keys,
            ),
        }
        if "devices" in spec
        else spec
        for i, spec in enumerate(pool.slices)
    ]
    return dataclasses.replace(pool, slices=slices)


def order_devices(
    devices: Sequence[JSON],
    infos: Mapping[str, DeviceInfo],
    totals: Mapping[int, DieTotals],
    usage: Mapping[int, DieUse],
    policy: Placement,
    *,
    keys: dict[tuple[Kind, int], tuple[Any, ...]] | None = None,
) -> list[JSON]:
    """The devices in ``policy`` order (stable: a die's devices of one kind keep their order).

    Kinds keep their published block order (whole, shares, then templates, as :func:`layout`
    puts them); within a kind, dies go by :func:`die_key` (kept in ``keys`` per kind and die:
    it depends on nothing else), a die's devices of one template together; devices the pool
    does not know stay at the end, in order.
    """
    return _order_groups(device_groups(devices, infos), totals, usage, policy, {} if keys is None else keys)


_KIND_RANK = {Kind.WHOLE: 0, Kind.SHARE: 1, Kind.TEMPLATE: 2}


@dataclass(frozen=True, slots=True)
class DeviceGroups:
    """A slice's devices as :func:`order_devices` moves them: each run of one kind, die and
    template (in the order listed), and the devices the pool does not know."""

    groups: tuple[tuple[DeviceInfo, tuple[JSON, ...]], ...]
    unknown: tuple[JSON, ...]
    dies: tuple[DeviceInfo, ...]  # a device of each kind and die in the slice


def device_groups(devices: Sequence[JSON], infos: Mapping[str, DeviceInfo]) -> DeviceGroups:
    """``devices`` grouped by kind, die and template, each group in listed order."""
    groups: dict[tuple[Kind, int, str], tuple[DeviceInfo, list[JSON]]] = {}
    unknown: list[JSON] = []
    for dev in devices:
        info = infos.get(dev["name"])
        if info is None:
            unknown.append(dev)
        else:
            groups.setdefault((info.kind, info.phy, info.template), (info, []))[1].append(dev)
    dies = {(info.kind, info.phy): info for info, _ in groups.values()}
    return DeviceGroups(
        tuple((info, tuple(devs)) for info, devs in groups.values()), tuple(unknown), tuple(dies.values())
    )


def _order_groups(
    grouped: DeviceGroups,
    totals: Mapping[int, DieTotals],
    usage: Mapping[int, DieUse],
    policy: Placement,
    keys: dict[tuple[Kind, int], tuple[Any, ...]],
) -> list[JSON]:
    """The groups by (kind, :func:`die_key`, template), then the unknown devices. It is the stable
    sort of the devices by (kind, die key, template, position): a die key names its die, so no two
    groups tie and a group's devices stay together in listed order. The slice's dies are sorted
    first (their keys hold fractions, slow to compare), the groups then by the die's rank."""

    def key(info: DeviceInfo) -> tuple[Any, ...]:
        die = keys.get((info.kind, info.phy))
        if die is None:
            use = usage.get(info.phy, DieUse())
            die = keys[(info.kind, info.phy)] = die_key(info, totals.get(info.phy, DieTotals()), use, policy)
        return (_KIND_RANK[info.kind], die)

    rank = {(info.kind, info.phy): r for r, info in enumerate(sorted(grouped.dies, key=key))}
    out: list[JSON] = []
    for _, devs in sorted(grouped.groups, key=lambda g: (rank[(g[0].kind, g[0].phy)], g[0].template)):
        out += devs
    out += grouped.unknown
    return out


_NO_FILL = Fraction(0)
"""The fill of a die with no device of the kind allocated."""


def die_key(info: DeviceInfo, totals: DieTotals, use: DieUse, policy: Placement) -> tuple[Any, ...]:
    """Sort key of a die for a device of ``info.kind`` (smaller first)."""
    if info.kind is Kind.WHOLE:
        # Static, ascending: any free die serves a whole claim as well as another, and an order
        # that moved a die's whole device at each allocation would republish for each one.
        return (info.phy,)
    if info.kind is Kind.SHARE:
        fill = use.share_fill(totals) if use.shares else _NO_FILL
    else:
        fill = use.template_fill(totals) if use.templates else _NO_FILL
    full = fill >= 1
    if policy is Placement.BINPACK:
        return (full, -fill, -info.phy)
    return (full, fill, -info.phy)


@dataclass(frozen=True)
class PoolFacts:
    """What the ordering reads of a pool, worked out once per pool (not per allocation)."""

    infos: Mapping[str, DeviceInfo]
    totals: Mapping[int, DieTotals]
    counters: Mapping[tuple[str, str], int]  # (counter set, counter) -> the pool's total
    consumes: Mapping[str, Mapping[tuple[str, str], int]]  # device -> what it consumes of them
    least: Mapping[str, Mapping[str, int]]  # share device -> capacity -> the least a share consumes
    capacity: Mapping[str, Mapping[str, int]]  # share device -> capacity -> its value
    groups: Sequence[DeviceGroups]  # per slice (empty for a slice without devices)
    consumers: Mapping[tuple[str, str], tuple[str, ...]]  # counter -> the devices consuming it
    over: frozenset[str]  # devices consuming more of a counter than the pool has

    @classmethod
    def of(cls, pool: pools.Pool) -> PoolFacts:
        counters: dict[tuple[str, str], int] = {}
        consumes: dict[str, dict[tuple[str, str], int]] = {}
        least: dict[str, dict[str, int]] = {}
        capacity: dict[str, dict[str, int]] = {}
        for spec in pool.slices:
            for cset in spec.get("sharedCounters") or []:
                for name, c in (cset.get("counters") or {}).items():
                    counters[(str(cset.get("name", "")), name)] = _int(c.get("value"))
            for dev in spec.get("devices") or []:
                use: dict[tuple[str, str], int] = {}
                for cons in dev.get("consumesCounters") or []:
                    for name, c in (cons.get("counters") or {}).items():
                        key = (str(cons.get("counterSet", "")), name)
                        use[key] = use.get(key, 0) + _int(c.get("value"))
                consumes[dev["name"]] = use
                if dev.get("allowMultipleAllocations"):
                    least[dev["name"]], capacity[dev["name"]] = _share_least(dev)
        infos = device_infos(pool)
        consumers: dict[tuple[str, str], list[str]] = {}
        over: set[str] = set()
        for name, use in consumes.items():
            for key, amount in use.items():
                if key in counters:
                    consumers.setdefault(key, []).append(name)
                    if amount > counters[key]:
                        over.add(name)
        return cls(
            infos,
            die_totals(pool),
            counters,
            consumes,
            least,
            capacity,
            [device_groups(spec.get("devices") or [], infos) for spec in pool.slices],
            {key: tuple(names) for key, names in consumers.items()},
            frozenset(over),
        )


def _share_least(dev: JSON) -> tuple[dict[str, int], dict[str, int]]:
    """Per capacity of a share device: the least one share consumes of it, and its value. Each share
    consumes at least the ``validRange`` minimum or the smallest ``validValues`` entry; a capacity
    without a policy is consumed whole."""
    least: dict[str, int] = {}
    value: dict[str, int] = {}
    for cap, spec in (dev.get("capacity") or {}).items():
        policy = spec.get("requestPolicy") or {}
        value[cap] = _int(spec.get("value"))
        if "validRange" in policy:
            least[cap] = _int((policy["validRange"] or {}).get("min", "0"))
        elif policy.get("validValues"):
            least[cap] = min(_int(v) for v in policy["validValues"])
        else:
            least[cap] = value[cap]
    return least, value


def unfit_devices(facts: PoolFacts, results: Iterable[Allocated]) -> frozenset[str]:
    """The devices of the pool that no claim can get now, whatever it asks, by the v1.36
    allocator's own rules (sound, not complete: a device left out may still be unusable). It walks
    past them, so where they stand in the order changes no first fit:

    * an exclusive device (whole die, template instance) already allocated;
    * a share device with a share (capacity in use: the allocator does not check its counters
      again) that has less of some capacity left than the least a share consumes of it;
    * any other device whose ``consumesCounters`` do not fit in what its counter sets have left
      once every allocated device consumed its counters once (a whole die with a share on it, a
      share device on a die held whole, holding templates or another share device's shares, a
      template instance on a full die ...).
    """
    consumed: dict[str, dict[str, int]] = {}  # allocated device -> capacity -> what its shares consume
    for r in results:
        mine = consumed.setdefault(r.device, {})
        for cap, value in r.consumed.items():
            mine[cap] = mine.get(cap, 0) + _int(value)
    counters = facts.counters
    available: dict[tuple[str, str], int] = {}  # the counters allocated devices consume, what is left
    out: set[str] = set()
    for name, mine in consumed.items():
        use = facts.consumes.get(name)
        if use is None:
            continue  # not a device of this pool
        for key, amount in use.items():
            if key in counters:
                available[key] = available.get(key, counters[key]) - amount
        if name in facts.least:  # a share device with shares: its capacity, not its counters
            caps, least = facts.capacity[name], facts.least[name]
            if any(caps[c] - mine.get(c, 0) < least[c] for c in caps):
                out.add(name)
        else:
            out.add(name)
    # Every other device by its counters: only those consuming a counter something consumed
    # can have lost their fit; the rest fit as on an empty pool (all but ``facts.over``).
    candidates = set(facts.over)
    for key in available:
        candidates.update(facts.consumers.get(key, ()))
    for name in candidates - consumed.keys():
        for key, amount in facts.consumes[name].items():
            if key in counters and amount > available.get(key, counters[key]):
                out.add(name)
                break
    return frozenset(out)


def first_fit_view(pool: pools.Pool, unfit: frozenset[str]) -> list[list[str]]:
    """Per slice, the names of its devices in order without ``unfit`` ones: two orders of one pool
    with the same view make the allocator (first fit in slice, then device order) pick the same
    devices for any claim, since the devices it skips are the only ones that moved."""
    return [[d["name"] for d in spec.get("devices") or [] if d["name"] not in unfit] for spec in pool.slices]


# --- slice layout ---------------------------------------------------------------------------


def layout(devices: Sequence[JSON], counter_sets: Sequence[JSON]) -> list[JSON]:
    """Slices for ``devices`` whose assignment does not depend on usage: whole and share devices
    first (in order), then template instances grouped by template, a group in one slice when it
    fits; then the counter-set slices as :func:`pools.split` makes them."""
    limited = bool(counter_sets) or any(d.get("consumesCounters") or d.get("taints") for d in devices)
    per_slice = pools.MAX_DEVICES_PER_SLICE_WITH_COUNTERS if limited else pools.MAX_DEVICES_PER_SLICE
    plain = [d for d in devices if not _template_of(d)]
    groups: dict[str, list[JSON]] = {}
    for d in devices:
        if t := _template_of(d):
            groups.setdefault(t, []).append(d)
    chunks: list[list[JSON]] = [plain[i : i + per_slice] for i in range(0, len(plain), per_slice)]
    current: list[JSON] = []
    for group in groups.values():
        for start in range(0, len(group), per_slice):
            part = group[start : start + per_slice]
            if len(current) + len(part) > per_slice:
                chunks.append(current)
                current = []
            current += part
    if current:
        chunks.append(current)
    slices: list[JSON] = [{"devices": chunk} for chunk in chunks if chunk]
    per_set = pools.MAX_COUNTER_SETS_PER_SLICE
    slices += [
        {"sharedCounters": list(counter_sets[i : i + per_set])} for i in range(0, len(counter_sets), per_set)
    ]
    return slices or [{"devices": []}]


def _template_of(dev: JSON) -> str:
    return str(((dev.get("attributes") or {}).get("template") or {}).get("string") or "")


# --- node level -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeFill:
    """How full a node's NPUs are: dies in use, dies partly used, compute and memory fractions."""

    dies: int = 0
    dies_in_use: int = 0
    dies_partly_used: int = 0
    compute: Fraction = Fraction(0)  # 0..1 of the node's dies
    memory: Fraction = Fraction(0)

    @property
    def fill(self) -> Fraction:
        """One figure 0..1: the mean of dies in use, compute and memory."""
        if not self.dies:
            return Fraction(0)
        return (Fraction(self.dies_in_use, self.dies) + self.compute + self.memory) / 3


def node_fill(totals: Mapping[int, DieTotals], usage: Mapping[int, DieUse]) -> NodeFill:
    """The fill of one node (one pool) from its dies' totals and what is allocated on them."""
    dies = len(totals)
    if not dies:
        return NodeFill()
    in_use = partly = 0
    compute = memory = Fraction(0)
    for phy, tot in totals.items():
        use = usage.get(phy)
        if use is None:
            continue  # nothing allocated: no fill, no memory (a DieUse() would add zeros)
        f = use.fill(tot)
        if use.used:
            in_use += 1
            partly += f < 1
        compute += f
        if use.whole:
            memory += 1
        elif tot.memory:
            memory += min(Fraction(1), Fraction(use.share_memory + use.template_memory, tot.memory))
    return NodeFill(dies, in_use, partly, compute / dies, memory / dies)


def node_score(fill: NodeFill, policy: Placement) -> int:
    """The extender's score 0..10: binpack the fullest node, spread the emptiest.

    An empty node scores 0 for binpack and any used node at least 1 (so the first share on a
    node pulls the next ones there, however small); spread mirrors it.
    """
    return node_scores(fill)[policy]


def node_scores(fill: NodeFill) -> dict[Placement, int]:
    """:func:`node_score` for every policy (the fill's step worked out once)."""
    f = fill.fill
    step = 0 if f <= 0 else min(MAX_EXTENDER_PRIORITY, 1 + int(f * (MAX_EXTENDER_PRIORITY - 1)))
    return {p: step if p is Placement.BINPACK else MAX_EXTENDER_PRIORITY - step for p in Placement}

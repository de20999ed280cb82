"""A pool as a driver describes it, the API's limits on slices, and the split of devices and counters into slices. Pure.

The Go helper's ``resourceslice.DriverResources``/``Pool``/``Slice``: a driver describes each pool
as ResourceSlice ``spec`` fragments in wire JSON, each either ``{"devices": [...]}`` or
``{"sharedCounters": [...]}`` (1.35+: not both); the controller adds ``driver``, ``pool`` and
``nodeName``. :func:`split` cuts a device list and a counter-set list into slices within the
per-slice limits (resource.k8s.io/v1, 1.35+), :func:`validate` pre-checks a pool as the helper
and the API server would (duplicate names, unknown counter references, names, limits) and lists
every problem. What the devices *are* is the driver's business.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_kubeletplugin.errors import InvalidArgument

__all__ = [
    "MAX_ATTRIBUTES_AND_CAPACITIES",
    "MAX_ATTRIBUTE_STRING",
    "MAX_CONSUMES_COUNTERS",
    "MAX_COUNTERS_PER_SET",
    "MAX_COUNTER_SETS_PER_SLICE",
    "MAX_DEVICES_PER_SLICE",
    "MAX_DEVICES_PER_SLICE_WITH_COUNTERS",
    "MAX_POOL_NAME",
    "DriverResources",
    "Pool",
    "PoolInvalid",
    "split",
    "validate",
]

JSON = dict[str, Any]

# resource.k8s.io/v1 limits (k8s.io/api resource/v1 types.go, 1.35+ semantics).
MAX_DEVICES_PER_SLICE = 128
MAX_DEVICES_PER_SLICE_WITH_COUNTERS = 64
MAX_COUNTER_SETS_PER_SLICE = 8
MAX_COUNTERS_PER_SET = 32
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_CONSUMES_COUNTERS = 2
MAX_ATTRIBUTE_STRING = 64
MAX_POOL_NAME = 253

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_C_IDENTIFIER = re.compile(r"^[_a-zA-Z][_a-zA-Z0-9]*$")
_ATTRIBUTE_KINDS = ("int", "bool", "string", "version")


@dataclass(frozen=True, slots=True)
class Pool:
    """One pool as it should exist: its name, its slices (``spec`` fragments), a generation.

    ``generation`` > the published one forces a generation bump (the Go helper's
    ``Pool.Generation``); 0 lets the controller decide. Publish at least one (possibly empty)
    slice: an empty pool is not the same as no pool.
    """

    name: str
    slices: list[JSON] = field(default_factory=list)
    generation: int = 0

    @property
    def device_names(self) -> list[str]:
        return [d["name"] for s in self.slices for d in s.get("devices", [])]


@dataclass(frozen=True, slots=True)
class DriverResources:
    """Every pool a driver publishes from this node (usually one, named after the node)."""

    pools: Mapping[str, Pool] = field(default_factory=dict)

    @classmethod
    def single(cls, pool: Pool) -> DriverResources:
        return cls(pools={pool.name: pool})


class PoolInvalid(InvalidArgument):
    """A pool the API server would refuse; ``problems`` lists ``(field, message)``, ``field`` the first."""

    problems: tuple[tuple[str, str], ...] = ()
    field: str = ""

    @classmethod
    def make(cls, pool: str, problems: tuple[tuple[str, str], ...]) -> PoolInvalid:
        err = cls(f"pool {pool!r} is invalid: " + "; ".join(f"{f}: {m}" for f, m in problems))
        err.problems, err.field = problems, problems[0][0] if problems else ""
        return err


def split(devices: Sequence[JSON], counter_sets: Sequence[JSON]) -> list[JSON]:
    """Device slices (≤ 64 devices when any device consumes counters or has taints, else ≤ 128),
    then counter-set slices (≤ 8 sets each); one empty device slice when there is nothing."""
    limited = bool(counter_sets) or any(d.get("consumesCounters") or d.get("taints") for d in devices)
    per_slice = MAX_DEVICES_PER_SLICE_WITH_COUNTERS if limited else MAX_DEVICES_PER_SLICE
    slices: list[JSON] = [{"devices": chunk} for chunk in _chunks(devices, per_slice)]
    slices += [{"sharedCounters": chunk} for chunk in _chunks(counter_sets, MAX_COUNTER_SETS_PER_SLICE)]
    return slices or [{"devices": []}]


def validate(pool: Pool) -> None:
    """Pre-validate a pool like the Go helper and the API server would; :class:`PoolInvalid` if not.

    Checks duplicate device and counter-set names, ``consumesCounters`` that reference an
    unknown counter set or counter, names (DNS labels, qualified names), and the per-slice and
    per-device limits. Every problem is listed in the message; ``field`` names the first.
    """
    problems: list[tuple[str, str]] = []
    if not pool.name or len(pool.name) > MAX_POOL_NAME:
        problems.append(("pool.name", f"pool name {pool.name!r} must be 1..{MAX_POOL_NAME} characters"))
    if not pool.slices:
        problems.append(("slices", "a pool needs at least one (possibly empty) slice"))

    counters: dict[str, set[str]] = {}
    for i, spec in enumerate(pool.slices):
        for j, cset in enumerate(spec.get("sharedCounters") or []):
            where = f"slices[{i}].sharedCounters[{j}]"
            name = cset.get("name", "")
            if not _DNS_LABEL.match(name) or len(name) > 63:
                problems.append((f"{where}.name", f"counter set name {name!r} is not a DNS label"))
            if name in counters:
                problems.append((f"{where}.name", f"duplicate counter set name {name!r}"))
            names = set((cset.get("counters") or {}).keys())
            counters[name] = names
            problems += _check_counters(f"{where}.counters", cset.get("counters") or {})

    seen_devices: set[str] = set()
    for i, spec in enumerate(pool.slices):
        where = f"slices[{i}]"
        has_devices, has_counters = "devices" in spec, "sharedCounters" in spec
        if has_devices == has_counters:
            problems.append((where, "a slice has either devices or sharedCounters, not both or neither"))
        unknown = set(spec) - {"devices", "sharedCounters"}
        if unknown:
            problems.append((where, f"unexpected slice fields {sorted(unknown)}"))
        sets_ = spec.get("sharedCounters") or []
        if len(sets_) > MAX_COUNTER_SETS_PER_SLICE:
            problems.append(
                (f"{where}.sharedCounters", f"{len(sets_)} counter sets > {MAX_COUNTER_SETS_PER_SLICE}")
            )
        devices = spec.get("devices") or []
        limited = any(d.get("consumesCounters") or d.get("taints") for d in devices)
        limit = MAX_DEVICES_PER_SLICE_WITH_COUNTERS if limited else MAX_DEVICES_PER_SLICE
        if len(devices) > limit:
            problems.append((f"{where}.devices", f"{len(devices)} devices > {limit} per slice"))
        for j, device in enumerate(devices):
            problems += _check_device(f"{where}.devices[{j}]", device, seen_devices, counters)

    if problems:
        raise PoolInvalid.make(pool.name, tuple(problems))


def _chunks(items: Sequence[JSON], size: int) -> Iterable[list[JSON]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def _qualified_name_ok(name: str) -> bool:
    domain, sep, ident = name.rpartition("/")
    if sep and (not _DNS_SUBDOMAIN.match(domain) or len(domain) > 63):
        return False
    return bool(_C_IDENTIFIER.match(ident)) and len(ident) <= 32


def _check_counters(where: str, counters: JSON) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    if len(counters) > MAX_COUNTERS_PER_SET:
        problems.append((where, f"{len(counters)} counters > {MAX_COUNTERS_PER_SET}"))
    for name, counter in counters.items():
        if not _DNS_LABEL.match(name) or len(name) > 63:
            problems.append((f"{where}.{name}", f"counter name {name!r} is not a DNS label"))
        if not isinstance(counter, dict) or not isinstance(counter.get("value"), str):
            problems.append((f"{where}.{name}.value", "a counter value must be a quantity string"))
    return problems


def _check_device(
    where: str, device: JSON, seen: set[str], counter_sets: dict[str, set[str]]
) -> list[tuple[str, str]]:
    problems: list[tuple[str, str]] = []
    name = device.get("name", "")
    if not _DNS_LABEL.match(name) or len(name) > 63:
        problems.append((f"{where}.name", f"device name {name!r} is not a DNS label"))
    if name in seen:
        problems.append((f"{where}.name", f"duplicate device name {name!r}"))
    seen.add(name)

    attributes: JSON = device.get("attributes") or {}
    capacity: JSON = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        problems.append(
            (
                where,
                f"{len(attributes) + len(capacity)} attributes+capacities > {MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for key, value in attributes.items():
        if not _qualified_name_ok(key):
            problems.append((f"{where}.attributes.{key}", "not a qualified name"))
        kinds = [k for k in _ATTRIBUTE_KINDS if k in value]
        if len(kinds) != 1 or len(value) != 1:
            problems.append((f"{where}.attributes.{key}", "exactly one of int, bool, string, version"))
        elif kinds[0] == "string" and len(str(value["string"])) > MAX_ATTRIBUTE_STRING:
            problems.append((f"{where}.attributes.{key}", f"string longer than {MAX_ATTRIBUTE_STRING}"))
    multi = bool(device.get("allowMultipleAllocations"))
    for key, value in capacity.items():
        if not _qualified_name_ok(key):
            problems.append((f"{where}.capacity.{key}", "not a qualified name"))
        if not isinstance(value.get("value"), str):
            problems.append((f"{where}.capacity.{key}.value", "a capacity value must be a quantity string"))
        if "requestPolicy" in value and not multi:
            problems.append(
                (f"{where}.capacity.{key}.requestPolicy", "requestPolicy needs allowMultipleAllocations")
            )

    consumes = device.get("consumesCounters") or []
    if len(consumes) > MAX_CONSUMES_COUNTERS:
        problems.append((f"{where}.consumesCounters", f"{len(consumes)} entries > {MAX_CONSUMES_COUNTERS}"))
    for k, use in enumerate(consumes):
        at = f"{where}.consumesCounters[{k}]"
        cset = use.get("counterSet", "")
        if cset not in counter_sets:
            problems.append((f"{at}.counterSet", f"unknown counter set {cset!r}"))
            continue
        problems += _check_counters(f"{at}.counters", use.get("counters") or {})
        for counter in use.get("counters") or {}:
            if counter not in counter_sets[cset]:
                problems.append(
                    (f"{at}.counters.{counter}", f"counter set {cset!r} has no counter {counter!r}")
                )
    return problems

"""The pure half of the ResourceSlice controller: compare the slices the API holds with the desired pools.

The Go helper's sync (``resourceslice/resourceslicecontroller.go``), steps 1-6, per pool: the
current generation is the highest stored; slices of an older generation, another pool, or without
a matching index in their name are obsolete; a matched slice has changed when its spec differs
semantically (quantities by value, empty == absent, order kept); the generation is bumped when
slices are added or more than one changed (or the driver asks for a higher one), and then every
matched slice is rewritten. :class:`Plan` says what to delete (first), update in place and create
(with the index-prefixed ``generateName``). Fields the server is known to drop are left out of
comparisons, and :func:`dropped_fields` finds them in a stored answer. :class:`Comparisons` remembers
the answers of earlier plans for the controller (a stored version against the same desired slice). No I/O.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from dra_kubeletplugin.resourceslice.pools import DriverResources, Pool

__all__ = [
    "API_VERSION",
    "GENERATE_NAME_MAX",
    "Comparisons",
    "Plan",
    "SyncResult",
    "desired_spec",
    "dropped_fields",
    "generate_name",
    "parse_quantity",
    "plan_pools",
    "plan_sync",
    "slice_index",
    "specs_equal",
]

JSON = dict[str, Any]

API_VERSION = "resource.k8s.io/v1"
GENERATE_NAME_MAX = 58
"""The API server truncates a generateName base to this many characters."""

# Fields whose loss on the server means a feature gate is off (Go helper's DroppedFieldsError).
PARTITIONABLE_FIELDS = ("sharedCounters", "consumesCounters", "perDeviceNodeSelection")
CONSUMABLE_FIELDS = ("allowMultipleAllocations", "requestPolicy")
DEVICE_FIELDS = ("consumesCounters", "allowMultipleAllocations", "taints", "bindingConditions")
_QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step"})
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:(e[+-]?[0-9]+)|([a-zA-Z]*))$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


@dataclass(frozen=True, slots=True)
class Plan:
    """What one sync does, in this order: delete, update, create."""

    generation: int
    delete: tuple[JSON, ...] = ()
    update: tuple[JSON, ...] = ()
    create: tuple[JSON, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.delete or self.update or self.create)


@dataclass(frozen=True, slots=True)
class SyncResult:
    generation: int
    deleted: int = 0
    updated: int = 0
    created: int = 0

    @property
    def writes(self) -> int:
        return self.deleted + self.updated + self.created


class Comparisons:
    """Remembered answers of :func:`specs_equal` for stored slices, so a plan does not compare again
    what an earlier plan compared: a stored slice's uid and resourceVersion name its content, and a
    desired slice fragment is not changed once given (new content comes as a new pool), so the same
    stored version against the same fragment object in the same place compares the same. One answer
    per stored slice (its newest version); safe from any thread.
    """

    MAX_SLICES = 256
    """Stored slices remembered at most (then forgotten all at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._answers: dict[str, tuple[str, JSON, tuple[Any, ...], bool]] = {}

    def equal(
        self,
        stored: Mapping[str, Any],
        fragment: JSON,
        where: tuple[Any, ...],
        wanted: Callable[[], JSON],
        ignored: frozenset[str],
    ) -> bool:
        """Whether ``stored``'s spec equals ``wanted()``, the spec of ``fragment`` placed by ``where``
        (all else the wanted spec depends on), ``ignored`` fields left out."""
        where = (*where, ignored)
        meta = stored.get("metadata") or {}
        uid, version = str(meta.get("uid") or ""), str(meta.get("resourceVersion") or "")
        with self._lock:
            seen = self._answers.get(uid)
        if (
            uid
            and version
            and seen is not None
            and seen[0] == version
            and seen[1] is fragment
            and seen[2] == where
        ):
            return seen[3]
        answer = specs_equal(stored.get("spec") or {}, wanted(), ignored)
        if uid and version:
            with self._lock:
                if len(self._answers) >= self.MAX_SLICES:
                    self._answers.clear()
                self._answers[uid] = (version, fragment, where, answer)
        return answer


# --- planning ---------------------------------------------------------------------------


def generate_name(index: int, *, driver_name: str, node_name: str) -> str:
    """``<index hex, ≥5 digits>-<driver>-<node>-`` (1.36+), as the API server will truncate it."""
    return f"{index:05x}-{driver_name}-{node_name}-"[:GENERATE_NAME_MAX]


def slice_index(name: str, *, driver_name: str, node_name: str) -> int | None:
    """The desired-slice index encoded in a slice name, or None if it has none."""
    head, sep, _ = name.partition("-")
    if not sep or len(head) < 5:
        return None
    try:
        index = int(head, 16)
    except ValueError:
        return None
    if not name.startswith(generate_name(index, driver_name=driver_name, node_name=node_name)):
        return None
    return index


def desired_spec(pool: Pool, index: int, *, driver_name: str, node_name: str, generation: int) -> JSON:
    """The full ResourceSlice spec for desired slice ``index``."""
    return {
        "driver": driver_name,
        "pool": {"name": pool.name, "generation": generation, "resourceSliceCount": len(pool.slices)},
        "nodeName": node_name,
        **pool.slices[index],
    }


def plan_pools(
    existing: Iterable[JSON],
    desired: DriverResources,
    *,
    driver_name: str,
    node_name: str,
    ignore: Iterable[str] = (),
    comparisons: Comparisons | None = None,
) -> dict[str, Plan]:
    """One :class:`Plan` per pool: each desired pool against its own slices, and a delete-only plan for
    each pool the API holds slices of that is no longer desired (the Go helper deletes those too)."""
    by_pool: dict[str, list[JSON]] = {}
    for item in existing:
        by_pool.setdefault(str(_pool(item).get("name") or ""), []).append(item)
    plans = {
        name: plan_sync(
            by_pool.get(name, ()),
            pool,
            driver_name=driver_name,
            node_name=node_name,
            ignore=ignore,
            comparisons=comparisons,
        )
        for name, pool in sorted(desired.pools.items())
    }
    for name, items in sorted(by_pool.items()):
        if name not in desired.pools:
            plans[name] = Plan(generation=0, delete=tuple(sorted(items, key=_name)))
    return plans


def plan_sync(
    existing: Iterable[JSON],
    desired: Pool,
    *,
    driver_name: str,
    node_name: str,
    ignore: Iterable[str] = (),
    comparisons: Comparisons | None = None,
) -> Plan:
    """Compare the slices the API holds with the desired pool (the Go helper's sync, steps 1-6).

    ``existing`` are this driver's slices on this node as the server returned them. ``ignore``
    names fields the server is known to drop; they are left out of comparisons. Create bodies
    carry ``generateName`` but no ownerReferences (the publisher adds the Node's).
    ``comparisons``: answers remembered from earlier plans (see :class:`Comparisons`).
    """
    ignored = frozenset(ignore)
    items = sorted(existing, key=_name)
    current = max((_pool(s).get("generation", 0) or 0 for s in items), default=0)
    count = len(desired.slices)

    obsolete: list[JSON] = []
    matched: dict[int, JSON] = {}
    for item in items:
        pool = _pool(item)
        index = slice_index(item["metadata"]["name"], driver_name=driver_name, node_name=node_name)
        if (
            (pool.get("generation", 0) or 0) != current
            or pool.get("name") != desired.name
            or index is None
            or index >= count
            or index in matched
        ):
            obsolete.append(item)
        else:
            matched[index] = item

    def spec(index: int, generation: int) -> JSON:
        return desired_spec(
            desired, index, driver_name=driver_name, node_name=node_name, generation=generation
        )

    def equal(i: int, item: JSON) -> bool:
        if comparisons is None:
            return specs_equal(item.get("spec") or {}, spec(i, current), ignored)
        where = (driver_name, node_name, desired.name, count, current)
        return comparisons.equal(item, desired.slices[i], where, lambda: spec(i, current), ignored)

    changed = [i for i, item in sorted(matched.items()) if not equal(i, item)]
    missing = [i for i in range(count) if i not in matched]
    if desired.generation > current:
        generation = desired.generation
    elif missing or len(changed) > 1:
        generation = current + 1
    else:
        generation = current
    rewrite = sorted(matched) if generation != current else changed

    update = tuple(
        {**matched[i], "apiVersion": API_VERSION, "kind": "ResourceSlice", "spec": spec(i, generation)}
        for i in rewrite
    )
    create = tuple(
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"generateName": generate_name(i, driver_name=driver_name, node_name=node_name)},
            "spec": spec(i, generation),
        }
        for i in missing
    )
    return Plan(generation=generation, delete=tuple(obsolete), update=update, create=create)


def specs_equal(stored: Mapping[str, Any], wanted: Mapping[str, Any], ignore: Iterable[str] = ()) -> bool:
    """Semantic equality of two slice specs: quantities by value, empty == absent, order kept."""
    ignored = frozenset(ignore)
    return bool(_normal(stored, ignored) == _normal(wanted, ignored))


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> tuple[str, ...]:
    """Fields present in the spec we sent but missing from what the server stored."""
    dropped: set[str] = set()
    for name in PARTITIONABLE_FIELDS:
        if sent.get(name) and not stored.get(name):
            dropped.add(name)
    stored_devices = {d.get("name"): d for d in stored.get("devices") or []}
    for device in sent.get("devices") or []:
        kept = stored_devices.get(device.get("name"), {})
        for name in DEVICE_FIELDS:
            if device.get(name) and not kept.get(name):
                dropped.add(name)
        kept_capacity = kept.get("capacity") or {}
        for cap, value in (device.get("capacity") or {}).items():
            if value.get("requestPolicy") and not (kept_capacity.get(cap) or {}).get("requestPolicy"):
                dropped.add("requestPolicy")
    return tuple(sorted(dropped))


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity string as a number (``"64Gi"``, ``"1e3"``, ``"100m"``)."""
    match = _QUANTITY.match(text.strip())
    if not match or (match.group(3) or "") not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    try:
        number = Decimal(match.group(1))
        if match.group(2):
            return number * (Decimal(10) ** int(match.group(2)[1:]))
        return number * _SUFFIX[match.group(3) or ""]
    except InvalidOperation as exc:
        raise ValueError(f"not a quantity: {text!r}") from exc


def _name(item: Mapping[str, Any]) -> str:
    return str((item.get("metadata") or {}).get("name", ""))


def _pool(item: Mapping[str, Any]) -> JSON:
    return dict((item.get("spec") or {}).get("pool") or {})


def _normal(value: Any, ignored: frozenset[str], key: str = "") -> Any:
    """Comparable form: no None/empty values, no ignored fields, quantities as numbers."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k in ignored or (k == "timeAdded" and key == "taints"):
                continue  # the API server stamps a taint's timeAdded; ours never sets it
            n = _normal(v, ignored, k)
            if n is None or n in ({}, []):
                continue
            out[k] = n
        return out
    if isinstance(value, list):
        return [_normal(v, ignored, key) for v in value]
    if isinstance(value, str) and key in _QUANTITY_KEYS | {"validValues"}:
        try:
            return parse_quantity(value)
        except ValueError:
            return value
    return value

"""A stand-in for kube-scheduler's DRA allocator (v1.36 semantics), for tests and demos.

It owns: reading a ResourceClaim, its DeviceClasses and the ResourceSlices of one node, picking
devices the way the structured-parameters allocator does, and writing ``status.allocation`` and
``status.reservedFor`` through the status subresource. It talks to the API only through the
official ``kubernetes`` client, so it works against any apiserver, fake or real. It must not be
used by the driver itself: in a cluster, kube-scheduler allocates.

How it charges (facts measured on a real v1.36 kube-scheduler; where this module and a real
scheduler differ, this module is wrong):

* A depth-first search over the claim's requests, in order, and for each request over its
  devices in slice-name then device order, with backtracking: a later request that cannot be
  satisfied makes an earlier one try its next device, like the real allocator.
* One request with ``count: N`` takes N **distinct** devices; two results of one request never
  land on the same device, even a multi-allocatable one. Two *requests* of one claim may share a
  multi-allocatable device, each result with its own ``shareID`` and ``consumedCapacity``.
* Consumable capacity (``allowMultipleAllocations``) is summed per share over every allocated
  claim and this one; a capacity with a request policy is rounded up to it (``default`` when not
  requested); one without a policy is consumed whole. On an exclusive device,
  ``capacity.requests`` is a minimum the device's capacity must meet.
* Shared counters (``allocateDevice`` / ``checkAvailableCounters`` of the incubating allocator):
  a device allocated by earlier claims (exclusively or by any number of shares) uses its
  ``consumesCounters`` **once** (``IsDeviceAllocated``, kubernetes#139040). A result of the
  claim being allocated adds its device's ``consumesCounters`` - except on a multi-allocatable
  device whose capacity is already in use (a committed share with ``consumedCapacity``, or a
  share picked earlier for this claim): there the allocator skips the counter check and charges
  nothing (``skipCounterCheck``, kubernetes#134103), so shares pile up on a device whose counters
  were charged for its first share. A device fits only if no counter of its **pool** is then
  over its value: each check compares every counter of every counter set of the pool, as the
  allocator does (an already overdrawn pool fits nothing that consumes counters). The available
  counters of a pool are set up once per claim and node by walking every device of the pool.
* A pool is used only when all of its ``resourceSliceCount`` slices of the newest generation are
  seen, and its device names are unique; otherwise none of its devices is allocated.

Supported: ``exactly`` requests (``ExactCount`` with ``count``, or ``All``: every matching
device, each one allocatable) and ``firstAvailable``
subrequests; CEL selectors of the forms ``device.driver == "x"`` and
``device.attributes["domain"].name == <literal>`` joined by ``&&`` (anything else raises
NotImplementedError); device taints with NoSchedule/NoExecute against request tolerations.
``constraints`` with ``matchAttribute`` (every device of the named requests, or of all, has the
attribute, with one value) or ``distinctAttribute`` (has it, each value once).
Not supported (NotImplementedError): ``adminAccess``.
Unlike kube-scheduler it adds no ``resource.kubernetes.io/delete-protection`` finalizer, since no
resourceclaim controller runs next to it to remove it again.

Usage::

    sim = SchedulerSim(srv.api_client(), "npu.flexnpu.io")
    claim = sim.allocate("ns", "claim-1", "node-1", reserved_for=[{"resource": "pods", "name": "p", "uid": uid}])
"""

from __future__ import annotations

import functools
import math
import re
import uuid
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from flexnpu_testing.fake_apiserver import quantities
from flexnpu_testing.fake_apiserver.quantities import format_quantity

__all__ = ["SchedulerSim", "Unschedulable"]


@functools.lru_cache(maxsize=8192)
def _quantity(text: str) -> tuple[Fraction, str]:
    """A quantity string parsed once (the real allocator works on parsed quantities in its cache)."""
    return quantities.parse_quantity(text)


def _exact(value: Fraction) -> Fraction | int:
    """A counter amount as an int when it is whole (the same value, compared faster), else the Fraction."""
    return int(value) if value.denominator == 1 else value


Obj = dict[str, Any]
DevKey = tuple[str, str, str]  # driver, pool, device
CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter
Amount = Fraction | int  # a counter amount: an int when whole (see _exact)
MAX_CONFLICT_RETRIES = 5

_CEL_DRIVER = re.compile(r'^device\.driver\s*==\s*"([^"]*)"$')
_CEL_ATTR = re.compile(r'^device\.attributes\["([^"]+)"\]\.([A-Za-z_][A-Za-z0-9_]*)\s*==\s*(.+)$')


class Unschedulable(Exception):
    """No set of devices on the node satisfies the claim; it stays pending."""

    def __init__(self, namespace: str, claim_name: str, reason: str) -> None:
        super().__init__(f"claim {namespace}/{claim_name} cannot be allocated: {reason}")
        self.namespace = namespace
        self.claim_name = claim_name
        self.reason = reason


@dataclass(frozen=True, slots=True)
class _Candidate:
    driver: str
    pool: str
    device: Obj
    pool_unusable: bool = False  # incomplete or invalid pool: the allocator skips its devices
    key: DevKey = field(init=False)  # (driver, pool, device name), made once (the allocator's DeviceID)
    attrs: dict[tuple[str, str], object] = field(init=False, compare=False, repr=False)
    """(domain, name) -> the attribute's value, looked up once per device (a node view's devices
    do not change: a changed slice makes a new view)."""

    shares: dict[tuple[tuple[str, str], ...], dict[str, Amount] | None] = field(
        init=False, compare=False, repr=False
    )
    """Requested capacity -> what one share of it consumes here (:func:`_consumed_capacity`), once."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.driver, self.pool, self.device["name"]))
        object.__setattr__(self, "attrs", {})
        object.__setattr__(self, "shares", {})

    def consumed_by_share(self, wanted: dict[str, str]) -> dict[str, Amount] | None:
        """What one share requesting ``wanted`` consumes of this device (None: it cannot fit)."""
        key = tuple(sorted(wanted.items()))
        if key not in self.shares:
            self.shares[key] = _consumed_capacity(self.device, wanted)
        return self.shares[key]

    def attribute(self, domain: str, name: str) -> object:
        """The value of ``device.attributes["domain"].name`` (None when the device has none)."""
        try:
            return self.attrs[(domain, name)]
        except KeyError:
            value = self.attrs[(domain, name)] = _attribute(self, domain, name)
            return value

    @property
    def multi(self) -> bool:
        return bool(self.device.get("allowMultipleAllocations"))


@dataclass
class _Node:
    """The node's devices (in allocator order) and counter sets, newest pool generation only."""

    candidates: list[_Candidate]
    counter_sets: dict[tuple[str, str, str], dict[str, Amount]]  # (driver, pool, set) -> totals
    _uses: dict[DevKey, dict[CounterKey, Amount] | None] = field(default_factory=dict)
    _totals: dict[CounterKey, Amount] | None = None
    _pool_counters: dict[tuple[str, str], list[CounterKey]] | None = None
    _by_key: dict[DevKey, _Candidate] | None = None
    _usage_cache: tuple[Hashable, _State] | None = None

    def index(self) -> dict[DevKey, int]:
        return {c.key: i for i, c in enumerate(self.candidates)}

    def counter_use(self, cand: _Candidate) -> dict[CounterKey, Amount] | None:
        """What ``cand`` consumes of its counter sets, worked out once per node view."""
        if cand.key not in self._uses:
            self._uses[cand.key] = _counter_use(cand, self.counter_sets)
        return self._uses[cand.key]

    def totals(self) -> dict[CounterKey, Amount]:
        if self._totals is None:
            self._totals = {
                (driver, pool, cset, name): value
                for (driver, pool, cset), totals in self.counter_sets.items()
                for name, value in totals.items()
            }
        return self._totals

    def pool_counters(self, driver: str, pool: str) -> list[CounterKey]:
        """Every counter of every counter set of one pool (what the allocator compares per device)."""
        if self._pool_counters is None:
            grouped: dict[tuple[str, str], list[CounterKey]] = {}
            for key in self.totals():
                grouped.setdefault((key[0], key[1]), []).append(key)
            self._pool_counters = grouped
        return self._pool_counters.get((driver, pool), [])

    def by_key(self) -> dict[DevKey, _Candidate]:
        if self._by_key is None:
            self._by_key = {c.key: c for c in self.candidates}
        return self._by_key

    def usage(self, claim: Obj, claims: Sequence[Obj], key: Hashable | None) -> _State:
        """:func:`_usage_of` for ``claim``, kept while ``key`` (the snapshot's claims on this node,
        see :meth:`Snapshot.claims_key`) is unchanged: the same state as rebuilding it, which
        kube-scheduler's snapshot does not redo for an unchanged node either. None: not kept."""
        if key is None:
            return _usage_of(claim, self, claims)
        uid = claim["metadata"]["uid"]
        own = any(c["metadata"]["uid"] == uid for c in claims)
        cache_key = (key, uid if own else None)
        if self._usage_cache is None or self._usage_cache[0] != cache_key:
            self._usage_cache = (cache_key, _usage_of(claim, self, claims))
        return self._usage_cache[1].fork()


@dataclass
class _State:
    """What other claims hold, plus what the claim being allocated has picked so far."""

    exclusive: set[DevKey] = field(default_factory=set)
    consumed: dict[tuple[DevKey, str], Amount] = field(default_factory=dict)
    available: dict[CounterKey, Amount] = field(default_factory=dict)  # after earlier claims
    used: dict[CounterKey, Amount] = field(default_factory=dict)  # by this claim's results
    overdrawn_pools: set[tuple[str, str]] = field(default_factory=set)
    shared: set[DevKey] = field(default_factory=set)  # multi-allocatable, capacity in use by other claims
    sharing: dict[DevKey, int] = field(default_factory=dict)  # ... and by this claim's results

    def fork(self) -> _State:
        """A copy to allocate one claim on: what a search changes is copied, the rest shared (read only)."""
        return _State(
            exclusive=set(self.exclusive),
            consumed=dict(self.consumed),
            available=self.available,
            used=dict(self.used),
            overdrawn_pools=self.overdrawn_pools,
            shared=self.shared,
            sharing=dict(self.sharing),
        )


class _Matches:
    """The devices that match a request, found lazily in allocator order: like the real allocator,
    a device is looked at (selectors, taints, capacity) only when the search reaches it."""

    def __init__(self, node: _Node, test: Callable[[_Candidate], dict[str, Amount] | None]) -> None:
        self._node, self._test = node, test
        self._items: list[tuple[int, dict[str, Amount]]] = []
        self._next = 0  # next candidate index to look at

    def at(self, pos: int) -> tuple[int, dict[str, Amount]] | None:
        """The ``pos``-th matching device (candidate index, what one share consumes), or None."""
        candidates = self._node.candidates
        while len(self._items) <= pos and self._next < len(candidates):
            consumed = self._test(candidates[self._next])
            if consumed is not None:
                self._items.append((self._next, consumed))
            self._next += 1
        return self._items[pos] if pos < len(self._items) else None

    def all(self) -> list[tuple[int, dict[str, Amount]]]:
        self.at(len(self._node.candidates))
        return list(self._items)


@dataclass(frozen=True)
class _Option:
    """One way to satisfy a request: an ``exactly`` request or one ``firstAvailable`` subrequest."""

    result_name: str
    class_name: str
    count: int
    tolerations: list[Obj]
    matching: _Matches
    class_config: list[Obj]


Pick = tuple[int, dict[str, Amount]]
MAX_SEARCH_STEPS = 200_000
"""Bound on devices tried per claim (kube-scheduler bounds its filter by time instead)."""


@dataclass(frozen=True)
class _Constraint:
    """``matchAttribute`` or ``distinctAttribute`` over some (or all) of the claim's requests."""

    requests: frozenset[str]  # empty: every request
    attribute: str  # fully qualified: <domain>/<name>
    distinct: bool

    def allows(self, request: str, cand: _Candidate, placed: Sequence[tuple[str, _Candidate]]) -> bool:
        if self.requests and request not in self.requests:
            return True
        domain, _, name = self.attribute.rpartition("/")
        value = _attribute(cand, domain, name)
        if value is None:
            return False
        others = [
            _attribute(c, domain, name) for req, c in placed if not self.requests or req in self.requests
        ]
        return value not in others if self.distinct else all(v == value for v in others)


class _Search:
    """Depth-first search with backtracking over requests, then devices, like the real allocator."""

    def __init__(self, node: _Node, state: _State, constraints: Sequence[_Constraint] = ()) -> None:
        self.node = node
        self.state = state
        self.constraints = tuple(constraints)
        self.placed: list[tuple[str, _Candidate]] = []  # (top-level request, device) so far
        self.steps = 0
        self.best: dict[int, int] = {}  # request index -> most devices ever placed for it

    def run(self, requests: list[list[_Option]]) -> list[tuple[_Option, list[Pick]]] | None:
        chosen: list[tuple[_Option, list[Pick]]] = []
        return chosen if self._request(requests, 0, chosen) else None

    def reason(self, requests: list[list[_Option]], specs: list[Obj]) -> str:
        if self.steps >= MAX_SEARCH_STEPS:
            return f"gave up after trying {self.steps} devices"
        if not requests:
            return "no requests"
        r = min(max(self.best, default=0), len(requests) - 1)  # the deepest request reached
        wanted = "; ".join(
            f"{self.best.get(r, 0)} of {o.count} distinct device(s) of class {o.class_name!r} available"
            for o in requests[r]
        )
        return f"request {specs[r]['name']!r}: {wanted}"

    def _request(
        self, requests: list[list[_Option]], r: int, chosen: list[tuple[_Option, list[Pick]]]
    ) -> bool:
        if r == len(requests):
            return True
        for option in requests[r]:
            picks: list[Pick] = []
            if self._device(requests, r, option=option, start=0, picks=picks, chosen=chosen):
                return True
        return False

    def _device(
        self,
        requests: list[list[_Option]],
        r: int,
        *,
        option: _Option,
        start: int,
        picks: list[Pick],
        chosen: list[tuple[_Option, list[Pick]]],
    ) -> bool:
        self.best[r] = max(self.best.get(r, 0), len(picks))
        if len(picks) == option.count:
            chosen.append((option, list(picks)))
            if self._request(requests, r + 1, chosen):
                return True
            chosen.pop()
            return False
        # Distinct devices per request: each next pick comes after the previous one in order
        # (a set of devices, not each permutation of it).
        pos = start - 1
        while (item := option.matching.at(pos := pos + 1)) is not None:
            if self.steps >= MAX_SEARCH_STEPS:
                return False
            self.steps += 1
            index, consumed = item
            cand = self.node.candidates[index]
            request = option.result_name.split("/", 1)[0]
            if not all(c.allows(request, cand, self.placed) for c in self.constraints):
                continue
            undo = self._take(cand, consumed)
            if undo is None:
                continue
            picks.append((index, consumed))
            self.placed.append((request, cand))
            if self._device(requests, r, option=option, start=pos + 1, picks=picks, chosen=chosen):
                return True
            self.placed.pop()
            picks.pop()
            undo()
        return False

    def _take(self, cand: _Candidate, consumed: dict[str, Amount]) -> Callable[[], None] | None:
        """Charge one result on ``cand`` if it fits; returns how to give it back, or None."""
        st = self.state
        key = cand.key
        if key in st.exclusive:
            return None
        if cand.multi:
            caps = cand.device.get("capacity") or {}
            for name, amount in consumed.items():
                total = _exact(_quantity(caps[name]["value"])[0])
                if st.consumed.get((key, name), 0) + amount > total:
                    return None
        use = self.node.counter_use(cand)
        if use is None:
            return None
        if cand.multi and (key in st.shared or st.sharing.get(key)):
            use = {}  # the allocator's skipCounterCheck: charged with the device's first share
        if use:
            if (cand.driver, cand.pool) in st.overdrawn_pools:
                return None
            for ckey, amount in use.items():
                st.used[ckey] = st.used.get(ckey, 0) + amount
            # Like checkAvailableCounters: every counter of the pool, not only the device's.
            used, available = st.used, st.available
            for ckey in self.node.pool_counters(cand.driver, cand.pool):
                if used.get(ckey, 0) > available[ckey]:
                    for k, amount in use.items():
                        used[k] -= amount
                    return None
        if cand.multi:
            st.sharing[key] = st.sharing.get(key, 0) + 1
            for name, amount in consumed.items():
                st.consumed[(key, name)] = st.consumed.get((key, name), 0) + amount
        else:
            st.exclusive.add(key)

        def undo() -> None:
            for ckey, amount in use.items():
                st.used[ckey] -= amount
            if cand.multi:
                st.sharing[key] -= 1
                for name, amount in consumed.items():
                    st.consumed[(key, name)] -= amount
            else:
                st.exclusive.discard(key)

        return undo


class SchedulerSim:
    """Allocates ResourceClaims on one node the way kube-scheduler's DRA plugin would."""

    def __init__(self, api_client: kubernetes.client.ApiClient, driver_name: str) -> None:
        self._client = api_client
        self._api = kubernetes.client.ResourceV1Api(api_client)
        self.driver_name = driver_name

    # ---- public

    @property
    def api_client(self) -> kubernetes.client.ApiClient:
        return self._client

    def schedule_pod(self, namespace: str, pod_name: str, node_name: str) -> dict[str, Any] | None:
        """A pod's extended-resource requests (KEP-5004): see ``flexnpu_testing/extended_resources.py``."""
        from flexnpu_testing import extended_resources

        return extended_resources.schedule_pod(self, namespace, pod_name, node_name)

    def allocate(
        self,
        namespace: str,
        claim_name: str,
        node_name: str,
        *,
        reserved_for: list[dict[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """Allocate the claim on ``node_name`` and reserve it; returns the stored claim (camelCase dict).

        An already allocated claim only gets the new ``reserved_for`` entries. Raises Unschedulable.
        """
        for attempt in range(MAX_CONFLICT_RETRIES):
            claim = self._read_claim(namespace, claim_name)
            status = dict(claim.get("status") or {})
            if not status.get("allocation"):
                status["allocation"] = self._plan(claim, node_name)
            reserved = list(status.get("reservedFor") or [])
            for ref in reserved_for or []:
                if all(r.get("uid") != ref.get("uid") for r in reserved):
                    reserved.append(dict(ref))
            if reserved:
                status["reservedFor"] = reserved
            try:
                return self._write_status(claim, status)
            except ApiException as exc:
                if exc.status != 409 or attempt == MAX_CONFLICT_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    def deallocate(self, namespace: str, claim_name: str) -> dict[str, Any]:
        """Clear allocation, reservations and device status, as the resourceclaim controller does."""
        for attempt in range(MAX_CONFLICT_RETRIES):
            claim = self._read_claim(namespace, claim_name)
            status = {
                k: v
                for k, v in (claim.get("status") or {}).items()
                if k not in ("allocation", "reservedFor", "devices")
            }
            try:
                return self._write_status(claim, status)
            except ApiException as exc:
                if exc.status != 409 or attempt == MAX_CONFLICT_RETRIES - 1:
                    raise
        raise AssertionError("unreachable")

    # ---- planning

    def plan_on(self, claim: Obj, node_name: str, *, snapshot: Snapshot) -> Obj:
        """The allocation ``claim`` would get on ``node_name`` given ``snapshot`` (no API call, nothing
        written); raises Unschedulable. For a scheduler that chooses among nodes (``flexnpu_testing/cluster.py``)."""
        return self._plan(claim, node_name, snapshot)

    def commit(self, claim: Obj, allocation: Obj, *, reserved_for: list[dict[str, Any]] | None = None) -> Obj:
        """Write a planned allocation (and reservations) to the claim's status; returns the stored claim.
        A conflict (the claim changed since it was read) raises the ApiException: plan again."""
        status = dict(claim.get("status") or {})
        status["allocation"] = allocation
        if reserved_for:
            status["reservedFor"] = [*(status.get("reservedFor") or []), *reserved_for]
        return self._write_status(claim, status)

    def _plan(self, claim: Obj, node_name: str, snapshot: Snapshot | None = None) -> Obj:
        meta = claim["metadata"]
        ns, name = meta["namespace"], meta["name"]
        devices = (claim.get("spec") or {}).get("devices") or {}
        constraints = [_constraint(c, f"claim {ns}/{name}") for c in devices.get("constraints") or []]
        if snapshot is None:
            node = self._node_devices(node_name)
            state = self._usage(claim, node)
        else:
            node = snapshot.node(node_name)
            claims_key = getattr(snapshot, "claims_key", None)
            state = node.usage(
                claim,
                list(snapshot.claims_on(node_name)),
                claims_key(node_name) if claims_key is not None else None,
            )
        requests: list[list[_Option]] = []
        for request in devices.get("requests") or []:
            subs = (
                [(request["name"], request["exactly"])]
                if request.get("exactly")
                else [
                    (f"{request['name']}/{sub['name']}", sub) for sub in request.get("firstAvailable") or []
                ]
            )
            requests.append([self._option(result_name, sub, node, snapshot) for result_name, sub in subs])
        search = _Search(node, state, constraints)
        chosen = search.run(requests)
        if chosen is None:
            raise Unschedulable(ns, name, search.reason(requests, devices.get("requests") or []))
        results: list[Obj] = []
        class_configs: list[Obj] = []
        for option, picks in chosen:
            results += [_result(option, node.candidates[i], consumed) for i, consumed in picks]
            for cfg in option.class_config:
                class_configs.append(
                    {"source": "FromClass", "requests": [option.result_name], **_config_body(cfg)}
                )
        claim_configs = [
            {"source": "FromClaim", "requests": list(cfg.get("requests") or []), **_config_body(cfg)}
            for cfg in devices.get("config") or []
        ]
        config = class_configs + claim_configs
        alloc: Obj = {
            "devices": {"results": results},
            "nodeSelector": {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                ]
            },
        }
        if config:
            alloc["devices"]["config"] = config
        return alloc

    def _option(
        self, result_name: str, request: Obj, node: _Node, snapshot: Snapshot | None = None
    ) -> _Option:
        """One (sub)request: the devices that match its selectors and tolerate their taints, in order."""
        mode = request.get("allocationMode", "ExactCount")
        if mode not in ("ExactCount", "All"):
            raise NotImplementedError(
                f"request {result_name!r}: allocationMode {mode!r} is not supported by SchedulerSim"
            )
        if request.get("adminAccess"):
            raise NotImplementedError(
                f"request {result_name!r}: adminAccess is not supported by SchedulerSim"
            )
        cls = (
            snapshot.device_class(request["deviceClassName"])
            if snapshot is not None
            else self._device_class(request["deviceClassName"])
        )
        selector = _Selector(())  # the class's selectors, then the request's, all in order
        for s in [*((cls.get("spec") or {}).get("selectors") or []), *(request.get("selectors") or [])]:
            selector = selector.then(_compile_cel(s["cel"]["expression"]))
        wanted = (request.get("capacity") or {}).get("requests") or {}

        checks = selector.checks

        def test(cand: _Candidate) -> dict[str, Amount] | None:
            if cand.pool_unusable:
                return None
            attrs = cand.attrs
            got: object
            for attr, want in checks:  # the selector, evaluated here for this device (CEL's &&)
                if attr is None:
                    got = cand.driver
                elif (got := attrs.get(attr, _MISSING)) is _MISSING:
                    got = cand.attribute(*attr)
                if got != want:
                    return None
            if not _tolerated(cand.device, request):
                return None
            if cand.multi:
                return cand.consumed_by_share(wanted)
            return {} if _exclusive_capacity_fits(cand.device, wanted) else None

        matching = _Matches(node, test)
        return _Option(
            result_name=result_name,
            class_name=request["deviceClassName"],
            # All: every matching device, and at least one (none matching cannot be satisfied)
            count=(len(matching.all()) or 1) if mode == "All" else int(request.get("count", 1)),
            tolerations=list(request.get("tolerations") or []),
            matching=matching,
            class_config=list((cls.get("spec") or {}).get("config") or []),
        )

    # ---- API reads

    def _node_devices(self, node_name: str) -> _Node:
        """Devices and counter sets of the node's pools, newest pool generation only, in slice order."""
        return node_from_slices(list(map(self._to_dict, self._api.list_resource_slice().items)), node_name)

    def _usage(self, claim: Obj, node: _Node, claims: Iterable[Obj] | None = None) -> _State:
        """What every other allocated claim holds on these devices.

        Counters: each device allocated at all (exclusively or by any number of shares) uses its
        ``consumesCounters`` once, as the v1.36 allocator rebuilds them from allocated devices.
        """
        if claims is None:
            claims = map(self._to_dict, self._api.list_resource_claim_for_all_namespaces().items)
        return _usage_of(claim, node, claims)

    def _device_class(self, name: str) -> Obj:
        return self._to_dict(self._api.read_device_class(name))

    def _read_claim(self, namespace: str, name: str) -> Obj:
        return self._to_dict(self._api.read_namespaced_resource_claim(name, namespace))

    def _write_status(self, claim: Obj, status: Obj) -> Obj:
        meta = claim["metadata"]
        body = {**claim, "status": status}
        model = kubernetes.client.ResourceV1ResourceClaim.from_dict(body)
        assert model is not None
        stored = self._api.replace_namespaced_resource_claim_status(meta["name"], meta["namespace"], model)
        return self._to_dict(stored)

    def _to_dict(self, model: Any) -> Obj:
        out: Obj = self._client.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
        return out


class Snapshot(Protocol):
    """What a scheduling cycle reads instead of the API (a scheduler's informer caches)."""

    def node(self, node_name: str) -> _Node: ...
    def claims_on(self, node_name: str) -> Iterable[Obj]: ...
    def device_class(self, name: str) -> Obj: ...

    # Optional: ``claims_key(node_name) -> Hashable | None``, a key that changes whenever
    # ``claims_on(node_name)`` may have (None: do not keep the node's usage between claims).


def node_from_slices(all_slices: Iterable[Obj], node_name: str) -> _Node:
    """The node's devices and counter sets from ResourceSlices (newest pool generation, slice order)."""
    slices = [s for s in all_slices if s["spec"].get("nodeName") == node_name or s["spec"].get("allNodes")]
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
        newest[key] = max(newest.get(key, 0), int(s["spec"]["pool"]["generation"]))
    current = [
        s
        for s in sorted(slices, key=lambda s: s["metadata"]["name"])
        if int(s["spec"]["pool"]["generation"]) == newest[(s["spec"]["driver"], s["spec"]["pool"]["name"])]
    ]
    unusable: set[tuple[str, str]] = set()
    for key in newest:
        pool_slices = [s for s in current if (s["spec"]["driver"], s["spec"]["pool"]["name"]) == key]
        expected = max(int(s["spec"]["pool"].get("resourceSliceCount") or 1) for s in pool_slices)
        names = [d["name"] for s in pool_slices for d in s["spec"].get("devices") or []]
        if len(pool_slices) < expected or len(names) != len(set(names)):
            unusable.add(key)  # incomplete or invalid: the allocator does not use the pool
    candidates: list[_Candidate] = []
    counters: dict[tuple[str, str, str], dict[str, Amount]] = {}
    for s in current:
        spec = s["spec"]
        driver, pool = spec["driver"], spec["pool"]["name"]
        for cset in spec.get("sharedCounters") or []:
            counters[(driver, pool, cset["name"])] = {
                n: _exact(_quantity(c["value"])[0]) for n, c in (cset.get("counters") or {}).items()
            }
        candidates += [
            _Candidate(driver, pool, dev, (driver, pool) in unusable) for dev in spec.get("devices") or []
        ]
    return _Node(candidates, counters)


def _usage_of(claim: Obj, node: _Node, claims: Iterable[Obj]) -> _State:
    """What every other allocated claim of ``claims`` holds on the node's devices (see ``_usage``)."""
    state = _State()
    allocated: set[DevKey] = set()
    for other in claims:
        allocation = (other.get("status") or {}).get("allocation")
        if other["metadata"]["uid"] == claim["metadata"]["uid"] or not allocation:
            continue
        for res in (allocation.get("devices") or {}).get("results") or []:
            if res.get("adminAccess"):
                continue
            key = (res["driver"], res["pool"], res["device"])
            allocated.add(key)
            if res.get("shareID") is None:
                state.exclusive.add(key)
            elif res.get("consumedCapacity"):
                state.shared.add(key)  # in the allocator's AggregatedCapacity
            for cap, value in (res.get("consumedCapacity") or {}).items():
                state.consumed[(key, cap)] = state.consumed.get((key, cap), 0) + _exact(_quantity(value)[0])
    state.available = dict(node.totals())
    # Like the allocator, walk every device of the node's pools and charge the allocated ones
    # (it does so for a pool with counter sets, the first time it checks a device's counters).
    for cand in node.candidates if state.available else ():
        if cand.key not in allocated:
            continue
        for ckey, amount in (node.counter_use(cand) or {}).items():
            if ckey in state.available:
                state.available[ckey] -= amount
    state.overdrawn_pools = {(k[0], k[1]) for k, v in state.available.items() if v < 0}
    return state


# ---- pure helpers


def _constraint(doc: Obj, where: str) -> _Constraint:
    kinds = [k for k in ("matchAttribute", "distinctAttribute") if doc.get(k)]
    if len(kinds) != 1:
        raise NotImplementedError(
            f"{where}: a constraint needs exactly one of matchAttribute, distinctAttribute"
        )
    return _Constraint(
        requests=frozenset(doc.get("requests") or ()),
        attribute=str(doc[kinds[0]]),
        distinct=kinds[0] == "distinctAttribute",
    )


def _config_body(cfg: Obj) -> Obj:
    return {k: v for k, v in cfg.items() if k not in ("requests", "source")}


@functools.lru_cache(maxsize=1024)
def _compile_cel(expression: str) -> _Selector:
    """Compile the supported CEL subset into a :class:`_Selector`, once per expression (kube-scheduler
    caches its compiled programs too); anything else is NotImplementedError. It is evaluated per
    device each time, its terms in order, stopping at the first false one (CEL's ``&&``)."""
    terms = [t.strip() for t in expression.split("&&")]
    checks: list[tuple[tuple[str, str] | None, object]] = []  # None: device.driver
    for term in terms:
        if (m := _CEL_DRIVER.match(term)) is not None:
            checks.append((None, m.group(1)))
        elif (m := _CEL_ATTR.match(term)) is not None:
            domain, attr, literal = m.group(1), m.group(2), _cel_literal(m.group(3).strip(), expression)
            checks.append(((domain, attr), literal))
        else:
            raise NotImplementedError(
                f'CEL selector {expression!r}: SchedulerSim only supports `device.driver == "x"` and '
                f'`device.attributes["domain"].name == <literal>` joined by `&&`'
            )
    return _Selector(tuple(checks))


_MISSING = object()


class _Selector:
    """A compiled selector: ``(attribute, literal)`` terms in order (``None``: ``device.driver``),
    all of which must hold (evaluated per device by ``SchedulerSim._option``'s test). Selectors of
    one request are joined into one (:meth:`then`)."""

    __slots__ = ("checks",)

    def __init__(self, checks: tuple[tuple[tuple[str, str] | None, object], ...]) -> None:
        self.checks = checks

    def then(self, other: _Selector) -> _Selector:
        return _Selector(self.checks + other.checks)


def _cel_literal(text: str, expression: str) -> object:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    raise NotImplementedError(f"CEL selector {expression!r}: unsupported literal {text!r}")


def _attribute(cand: _Candidate, domain: str, name: str) -> object:
    attrs = cand.device.get("attributes") or {}
    attr = attrs.get(f"{domain}/{name}")
    if attr is None and domain == cand.driver:
        attr = attrs.get(name)
    if not isinstance(attr, dict):
        return None
    for kind in ("string", "int", "bool", "version"):
        if kind in attr:
            return attr[kind]
    return None


def _tolerated(dev: Obj, request: Obj) -> bool:
    tolerations = request.get("tolerations") or []
    for taint in dev.get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(tol: Obj, taint: Obj) -> bool:
    if tol.get("effect") and tol["effect"] != taint.get("effect"):
        return False
    if tol.get("operator", "Equal") == "Exists":
        return not tol.get("key") or tol["key"] == taint.get("key")
    return bool(tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""))


def _consumed_capacity(dev: Obj, wanted: dict[str, str]) -> dict[str, Amount] | None:
    """Per-capacity amounts one share consumes (policy-rounded), or None if the request cannot fit."""
    caps = dev.get("capacity") or {}
    if any(name not in caps for name in wanted):
        return None
    out: dict[str, Amount] = {}
    for name, cap in caps.items():
        total = _quantity(cap["value"])[0]
        policy = cap.get("requestPolicy") or {}
        if name not in wanted:
            out[name] = _exact(_quantity(policy["default"])[0] if policy.get("default") else total)
            continue
        amount = _quantity(wanted[name])[0]
        if policy.get("validValues"):
            fitting = sorted(v for v in (_quantity(x)[0] for x in policy["validValues"]) if v >= amount)
            if not fitting:
                return None
            amount = fitting[0]
        elif policy.get("validRange"):
            rng = policy["validRange"]
            low = _quantity(rng["min"])[0]
            amount = max(amount, low)
            if rng.get("step"):
                step = _quantity(rng["step"])[0]
                amount = low + math.ceil((amount - low) / step) * step
            if rng.get("max") and amount > _quantity(rng["max"])[0]:
                return None
        out[name] = _exact(amount)
    return out


def _exclusive_capacity_fits(dev: Obj, wanted: dict[str, str]) -> bool:
    """On an exclusive device, each requested capacity is a minimum the device must have."""
    caps = dev.get("capacity") or {}
    for name, amount in wanted.items():
        if name not in caps or _quantity(caps[name]["value"])[0] < _quantity(amount)[0]:
            return False
    return True


def _result(option: _Option, cand: _Candidate, consumed: dict[str, Amount]) -> Obj:
    result: Obj = {
        "request": option.result_name,
        "driver": cand.driver,
        "pool": cand.pool,
        "device": cand.device["name"],
    }
    if option.tolerations:
        result["tolerations"] = option.tolerations
    if cand.multi:
        result["shareID"] = str(uuid.uuid4())
        result["consumedCapacity"] = {
            cap: _format(amount, _fmt(cand.device, cap)) for cap, amount in consumed.items()
        }
    return result


def _counter_use(
    cand: _Candidate, counter_sets: dict[tuple[str, str, str], dict[str, Amount]]
) -> dict[CounterKey, Amount] | None:
    out: dict[CounterKey, Amount] = {}
    for cons in cand.device.get("consumesCounters") or []:
        cset = counter_sets.get((cand.driver, cand.pool, cons["counterSet"]))
        if cset is None:
            return None  # unknown counter set: the real allocator treats the device as unusable
        for name, ctr in (cons.get("counters") or {}).items():
            if name not in cset:
                return None
            key = (cand.driver, cand.pool, cons["counterSet"], name)
            out[key] = out.get(key, 0) + _exact(_quantity(ctr["value"])[0])
    return out


@functools.lru_cache(maxsize=4096)
def _format(amount: Amount, fmt: str) -> str:
    """``format_quantity``, once per amount (the allocator keeps quantities, not strings)."""
    return format_quantity(Fraction(amount), fmt)


def _fmt(dev: Obj, cap: str) -> str:
    return _quantity((dev.get("capacity") or {})[cap]["value"])[1]

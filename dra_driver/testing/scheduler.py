"""A minimal stand-in for kube-scheduler's DRA allocator, for tests and demos.

It owns: reading a ResourceClaim, its DeviceClasses and the ResourceSlices of one node, picking
devices first-fit the way the structured-parameters allocator does (exclusive devices,
consumable capacity with request policies, shared counters), and writing ``status.allocation``
and ``status.reservedFor`` through the status subresource. It talks to the API only through the
official ``kubernetes`` client, so it works against any apiserver, fake or real. It must not be
used by the driver itself: in a cluster, kube-scheduler allocates.

Supported: ``exactly`` requests (``ExactCount`` with ``count``) and ``firstAvailable``
subrequests; CEL selectors of the forms ``device.driver == "x"`` and
``device.attributes["domain"].name == <literal>`` joined by ``&&`` (anything else raises
NotImplementedError); device taints with NoSchedule/NoExecute against request tolerations. Shared counters are
charged once per device in use (a second share of a multi-allocatable device adds no counter use),
summed over every allocated claim in the cluster, so a whole-die device and the share device of
the same die can exclude each other through one counter set.
Not supported (NotImplementedError): ``allocationMode: All``, ``constraints``, ``adminAccess``.
Unlike kube-scheduler it adds no ``resource.kubernetes.io/delete-protection`` finalizer, since no
resourceclaim controller runs next to it to remove it again.

Usage::

    sim = SchedulerSim(srv.api_client(), "npu.flexnpu.io")
    claim = sim.allocate("ns", "claim-1", "node-1", reserved_for=[{"resource": "pods", "name": "p", "uid": uid}])
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from dra_driver.testing.fake_apiserver import format_quantity, parse_quantity

__all__ = ["SchedulerSim", "Unschedulable"]

Obj = dict[str, Any]
DevKey = tuple[str, str, str]  # driver, pool, device
CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter
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

    @property
    def key(self) -> DevKey:
        return (self.driver, self.pool, self.device["name"])


@dataclass
class _Usage:
    """What is allocated on the node: by other claims, plus what this allocation picked so far."""

    exclusive: set[DevKey] = field(default_factory=set)
    in_use: set[DevKey] = field(default_factory=set)
    consumed: dict[tuple[DevKey, str], Fraction] = field(default_factory=dict)
    counters: dict[CounterKey, Fraction] = field(default_factory=dict)


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
        """A pod's extended-resource requests (KEP-5004): see ``dra_driver/testing/extended_resources.py``."""
        from dra_driver.testing import extended_resources

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

    def _plan(self, claim: Obj, node_name: str) -> Obj:
        meta = claim["metadata"]
        ns, name = meta["namespace"], meta["name"]
        devices = (claim.get("spec") or {}).get("devices") or {}
        if devices.get("constraints"):
            raise NotImplementedError(
                f"claim {ns}/{name}: spec.devices.constraints are not supported by SchedulerSim"
            )
        candidates, counter_sets = self._node_devices(node_name)
        usage = self._usage(claim, candidates)
        results: list[Obj] = []
        class_configs: list[Obj] = []
        for request in devices.get("requests") or []:
            options = (
                [(request["name"], request["exactly"])]
                if request.get("exactly")
                else [
                    (f"{request['name']}/{sub['name']}", sub) for sub in request.get("firstAvailable") or []
                ]
            )
            reasons = []
            for result_name, sub in options:
                picked, reason = self._pick(result_name, sub, candidates, counter_sets, usage)
                if picked is not None:
                    results += picked
                    for cfg in self._device_class(sub["deviceClassName"]).get("spec", {}).get("config") or []:
                        class_configs.append(
                            {"source": "FromClass", "requests": [result_name], **_config_body(cfg)}
                        )
                    break
                reasons.append(reason)
            else:
                raise Unschedulable(ns, name, f"request {request['name']!r}: " + "; ".join(reasons))
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

    def _pick(
        self,
        result_name: str,
        request: Obj,
        candidates: list[_Candidate],
        counter_sets: dict[tuple[str, str, str], dict[str, Fraction]],
        usage: _Usage,
    ) -> tuple[list[Obj] | None, str]:
        mode = request.get("allocationMode", "ExactCount")
        if mode != "ExactCount":
            raise NotImplementedError(
                f"request {result_name!r}: allocationMode {mode!r} is not supported by SchedulerSim"
            )
        if request.get("adminAccess"):
            raise NotImplementedError(
                f"request {result_name!r}: adminAccess is not supported by SchedulerSim"
            )
        cls = self._device_class(request["deviceClassName"])
        selectors = [
            _compile_cel(s["cel"]["expression"]) for s in (cls.get("spec") or {}).get("selectors") or []
        ]
        selectors += [_compile_cel(s["cel"]["expression"]) for s in request.get("selectors") or []]
        wanted = (request.get("capacity") or {}).get("requests") or {}
        count = int(request.get("count", 1))
        picked: list[Obj] = []
        tentative = _Usage(
            set(usage.exclusive), set(usage.in_use), dict(usage.consumed), dict(usage.counters)
        )
        for cand in candidates:
            if len(picked) == count:
                break
            dev = cand.device
            if not all(sel(cand) for sel in selectors) or not _tolerated(dev, request):
                continue
            multi = bool(dev.get("allowMultipleAllocations"))
            if cand.key in tentative.exclusive or (not multi and cand.key in tentative.in_use):
                continue
            consumed = _consumed_capacity(dev, wanted) if multi else {}
            if consumed is None or not _capacity_fits(cand.key, dev, consumed, tentative):
                continue
            counter_use = _counter_use(cand, counter_sets) if cand.key not in tentative.in_use else {}
            if counter_use is None or any(
                tentative.counters.get(k, Fraction(0)) + v > counter_sets[k[:3]][k[3]]
                for k, v in counter_use.items()
            ):
                continue
            for k, v in counter_use.items():
                tentative.counters[k] = tentative.counters.get(k, Fraction(0)) + v
            tentative.in_use.add(cand.key)
            result: Obj = {
                "request": result_name,
                "driver": cand.driver,
                "pool": cand.pool,
                "device": dev["name"],
            }
            if request.get("tolerations"):
                result["tolerations"] = request["tolerations"]
            if multi:
                for cap, amount in consumed.items():
                    tentative.consumed[(cand.key, cap)] = (
                        tentative.consumed.get((cand.key, cap), Fraction(0)) + amount
                    )
                result["shareID"] = str(uuid.uuid4())
                result["consumedCapacity"] = {
                    cap: format_quantity(amount, _fmt(dev, cap)) for cap, amount in consumed.items()
                }
            else:
                tentative.exclusive.add(cand.key)
            picked.append(result)
        if len(picked) < count:
            return (
                None,
                f"{len(picked)} of {count} device(s) of class {request['deviceClassName']!r} available",
            )
        usage.exclusive, usage.in_use, usage.consumed, usage.counters = (
            tentative.exclusive,
            tentative.in_use,
            tentative.consumed,
            tentative.counters,
        )
        return picked, ""

    # ---- API reads

    def _node_devices(
        self, node_name: str
    ) -> tuple[list[_Candidate], dict[tuple[str, str, str], dict[str, Fraction]]]:
        """Devices and counter sets of the node's pools, newest pool generation only, in slice order."""
        slices = [
            s
            for s in map(self._to_dict, self._api.list_resource_slice().items)
            if s["spec"].get("nodeName") == node_name or s["spec"].get("allNodes")
        ]
        newest: dict[tuple[str, str], int] = {}
        for s in slices:
            key = (s["spec"]["driver"], s["spec"]["pool"]["name"])
            newest[key] = max(newest.get(key, 0), int(s["spec"]["pool"]["generation"]))
        candidates: list[_Candidate] = []
        counters: dict[tuple[str, str, str], dict[str, Fraction]] = {}
        for s in sorted(slices, key=lambda s: s["metadata"]["name"]):
            spec = s["spec"]
            driver, pool = spec["driver"], spec["pool"]["name"]
            if int(spec["pool"]["generation"]) != newest[(driver, pool)]:
                continue
            for cset in spec.get("sharedCounters") or []:
                counters[(driver, pool, cset["name"])] = {
                    n: parse_quantity(c["value"])[0] for n, c in (cset.get("counters") or {}).items()
                }
            candidates += [_Candidate(driver, pool, dev) for dev in spec.get("devices") or []]
        return candidates, counters

    def _usage(self, claim: Obj, candidates: list[_Candidate]) -> _Usage:
        """What every other allocated claim holds on these devices."""
        by_key = {c.key: c for c in candidates}
        usage = _Usage()
        for other in map(self._to_dict, self._api.list_resource_claim_for_all_namespaces().items):
            allocation = (other.get("status") or {}).get("allocation")
            if other["metadata"]["uid"] == claim["metadata"]["uid"] or not allocation:
                continue
            for res in (allocation.get("devices") or {}).get("results") or []:
                key = (res["driver"], res["pool"], res["device"])
                if res.get("shareID") is None:
                    usage.exclusive.add(key)
                for cap, value in (res.get("consumedCapacity") or {}).items():
                    usage.consumed[(key, cap)] = (
                        usage.consumed.get((key, cap), Fraction(0)) + parse_quantity(value)[0]
                    )
                if key in usage.in_use or key not in by_key:
                    usage.in_use.add(key)
                    continue
                usage.in_use.add(key)
                for cons in by_key[key].device.get("consumesCounters") or []:
                    for name, ctr in (cons.get("counters") or {}).items():
                        ckey = (key[0], key[1], cons["counterSet"], name)
                        usage.counters[ckey] = (
                            usage.counters.get(ckey, Fraction(0)) + parse_quantity(ctr["value"])[0]
                        )
        return usage

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


# ---- pure helpers


def _config_body(cfg: Obj) -> Obj:
    return {k: v for k, v in cfg.items() if k not in ("requests", "source")}


def _compile_cel(expression: str) -> Callable[[_Candidate], bool]:
    """Compile the supported CEL subset into a predicate; anything else is NotImplementedError."""
    terms = [t.strip() for t in expression.split("&&")]
    preds: list[Callable[[_Candidate], bool]] = []
    for term in terms:
        if (m := _CEL_DRIVER.match(term)) is not None:
            want = m.group(1)
            preds.append(lambda c, want=want: c.driver == want)  # type: ignore[misc]
        elif (m := _CEL_ATTR.match(term)) is not None:
            domain, attr, literal = m.group(1), m.group(2), _cel_literal(m.group(3).strip(), expression)
            preds.append(lambda c, d=domain, a=attr, v=literal: _attribute(c, d, a) == v)  # type: ignore[misc]
        else:
            raise NotImplementedError(
                f'CEL selector {expression!r}: SchedulerSim only supports `device.driver == "x"` and '
                f'`device.attributes["domain"].name == <literal>` joined by `&&`'
            )
    return lambda c: all(p(c) for p in preds)


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


def _consumed_capacity(dev: Obj, wanted: dict[str, str]) -> dict[str, Fraction] | None:
    """Per-capacity amounts one share consumes (policy-rounded), or None if the request cannot fit."""
    caps = dev.get("capacity") or {}
    if any(name not in caps for name in wanted):
        return None
    out: dict[str, Fraction] = {}
    for name, cap in caps.items():
        total = parse_quantity(cap["value"])[0]
        policy = cap.get("requestPolicy") or {}
        if name not in wanted:
            out[name] = parse_quantity(policy["default"])[0] if policy.get("default") else total
            continue
        amount = parse_quantity(wanted[name])[0]
        if policy.get("validValues"):
            fitting = sorted(v for v in (parse_quantity(x)[0] for x in policy["validValues"]) if v >= amount)
            if not fitting:
                return None
            amount = fitting[0]
        elif policy.get("validRange"):
            rng = policy["validRange"]
            low = parse_quantity(rng["min"])[0]
            amount = max(amount, low)
            if rng.get("step"):
                step = parse_quantity(rng["step"])[0]
                amount = low + math.ceil((amount - low) / step) * step
            if rng.get("max") and amount > parse_quantity(rng["max"])[0]:
                return None
        out[name] = amount
    return out


def _capacity_fits(key: DevKey, dev: Obj, consumed: dict[str, Fraction], usage: _Usage) -> bool:
    caps = dev.get("capacity") or {}
    for name, amount in consumed.items():
        total = parse_quantity(caps[name]["value"])[0]
        if usage.consumed.get((key, name), Fraction(0)) + amount > total:
            return False
    return True


def _counter_use(
    cand: _Candidate, counter_sets: dict[tuple[str, str, str], dict[str, Fraction]]
) -> dict[CounterKey, Fraction] | None:
    out: dict[CounterKey, Fraction] = {}
    for cons in cand.device.get("consumesCounters") or []:
        cset = counter_sets.get((cand.driver, cand.pool, cons["counterSet"]))
        if cset is None:
            return None  # unknown counter set: the real allocator treats the device as unusable
        for name, ctr in (cons.get("counters") or {}).items():
            if name not in cset:
                return None
            key = (cand.driver, cand.pool, cons["counterSet"], name)
            out[key] = out.get(key, Fraction(0)) + parse_quantity(ctr["value"])[0]
    return out


def _fmt(dev: Obj, cap: str) -> str:
    return parse_quantity((dev.get("capacity") or {})[cap]["value"])[1]

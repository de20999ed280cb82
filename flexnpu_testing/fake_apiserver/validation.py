"""The validation and normalisation rules of the served types that catch driver bugs."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from flexnpu_testing.fake_apiserver.quantities import canonical_quantity, parse_quantity
from flexnpu_testing.fake_apiserver.resources import Obj, Resource, bad_request
from flexnpu_testing.fake_apiserver.selectors import LABEL_KEY

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


# --------------------------------------------------------------------------- validation


def _quantity_fields(res: Resource, obj: Obj) -> Iterator[tuple[dict[str, Any] | list[Any], str | int, str]]:
    """(container, key, field path) of every Quantity the served types hold."""

    def qmap(container: Any, fld: str) -> Iterator[tuple[Any, Any, str]]:
        if isinstance(container, dict):
            for name in container:
                yield container, name, f"{fld}[{name}]"

    def requests(devices: Any, fld: str) -> Iterator[tuple[Any, Any, str]]:
        for i, req in enumerate((devices or {}).get("requests") or []):
            for j, sub in enumerate([req.get("exactly"), *list(req.get("firstAvailable") or [])]):
                if isinstance(sub, dict):
                    where = f"{fld}.requests[{i}]." + ("exactly" if j == 0 else f"firstAvailable[{j - 1}]")
                    yield from qmap((sub.get("capacity") or {}).get("requests"), f"{where}.capacity.requests")

    spec = obj.get("spec") or {}
    if res.kind == "ResourceSlice":
        for i, dev in enumerate(spec.get("devices") or []):
            for name, cap in (dev.get("capacity") or {}).items():
                fld = f"spec.devices[{i}].capacity[{name}]"
                if "value" in cap:
                    yield cap, "value", f"{fld}.value"
                policy = cap.get("requestPolicy") or {}
                if "default" in policy:
                    yield policy, "default", f"{fld}.requestPolicy.default"
                for k, _ in enumerate(policy.get("validValues") or []):
                    yield policy["validValues"], k, f"{fld}.requestPolicy.validValues[{k}]"
                for bound in ("min", "max", "step"):
                    if bound in (policy.get("validRange") or {}):
                        yield policy["validRange"], bound, f"{fld}.requestPolicy.validRange.{bound}"
            for j, cons in enumerate(dev.get("consumesCounters") or []):
                for name, ctr in (cons.get("counters") or {}).items():
                    yield ctr, "value", f"spec.devices[{i}].consumesCounters[{j}].counters[{name}].value"
        for i, cset in enumerate(spec.get("sharedCounters") or []):
            for name, ctr in (cset.get("counters") or {}).items():
                yield ctr, "value", f"spec.sharedCounters[{i}].counters[{name}].value"
    elif res.kind == "ResourceClaim":
        yield from requests(spec.get("devices"), "spec.devices")
        alloc = (obj.get("status") or {}).get("allocation") or {}
        for i, result in enumerate((alloc.get("devices") or {}).get("results") or []):
            yield from qmap(
                result.get("consumedCapacity"), f"status.allocation.devices.results[{i}].consumedCapacity"
            )
    elif res.kind == "ResourceClaimTemplate":
        yield from requests((spec.get("spec") or {}).get("devices"), "spec.spec.devices")


def canonicalize_quantities(res: Resource, obj: Obj) -> None:
    """Rewrite quantities in canonical form, as a real apiserver's round trip through Go does."""
    for container, key, fld in list(_quantity_fields(res, obj)):
        try:
            container[key] = canonical_quantity(container[key])  # type: ignore[index]
        except (ValueError, ZeroDivisionError) as exc:
            raise bad_request(f"{fld}: {exc}") from exc


def drop_partitionable(obj: Obj) -> None:
    """Drop DRAPartitionableDevices fields, like an apiserver with that feature gate off."""
    spec = obj.get("spec") or {}
    spec.pop("sharedCounters", None)
    spec.pop("perDeviceNodeSelection", None)
    for dev in spec.get("devices") or []:
        for key in ("consumesCounters", "nodeName", "nodeSelector", "allNodes"):
            dev.pop(key, None)


def validate(res: Resource, obj: Obj, old: Obj | None) -> list[tuple[str, str]]:
    """Field errors as (field, message); empty when valid."""
    causes: list[tuple[str, str]] = []
    meta = obj.get("metadata") or {}
    name = meta.get("name", "")
    pattern, limit, what = (
        (DNS1123_LABEL, 63, "RFC 1123 label")
        if res.kind == "Namespace"
        else (DNS1123_SUBDOMAIN, 253, "RFC 1123 subdomain")
    )
    if not isinstance(name, str) or not pattern.match(name) or len(name) > limit:
        causes.append(
            (
                "metadata.name",
                f"Invalid value: {json.dumps(name)}: a lowercase {what} must consist of lower case alphanumeric characters, '-' or '.'",
            )
        )
    for key in meta.get("labels") or {}:
        if not LABEL_KEY.match(key):
            causes.append(
                (
                    "metadata.labels",
                    f"Invalid value: {json.dumps(key)}: name part must consist of alphanumeric characters",
                )
            )
    if res.kind == "ResourceSlice":
        causes += _validate_slice(obj, old)
    elif res.kind == "ResourceClaim":
        causes += _validate_claim(obj, old)
    elif res.kind == "DeviceClass":
        causes += validate_device_class(obj)
    return causes


def _validate_slice(obj: Obj, old: Obj | None) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    driver = spec.get("driver")
    if not driver:
        causes.append(("spec.driver", "Required value"))
    elif not isinstance(driver, str) or not DNS1123_SUBDOMAIN.match(driver) or len(driver) > 63:
        causes.append(
            (
                "spec.driver",
                f"Invalid value: {json.dumps(driver)}: must be a DNS subdomain of at most 63 characters",
            )
        )
    pool = spec.get("pool")
    if not isinstance(pool, dict):
        causes.append(("spec.pool", "Required value"))
        pool = {}
    if not pool.get("name"):
        causes.append(("spec.pool.name", "Required value"))
    elif (
        not all(DNS1123_SUBDOMAIN.match(p) for p in str(pool["name"]).split("/"))
        or len(str(pool["name"])) > 253
    ):
        causes.append(
            (
                "spec.pool.name",
                f"Invalid value: {json.dumps(pool['name'])}: must be DNS subdomains separated by '/'",
            )
        )
    if not isinstance(pool.get("generation"), int) or pool["generation"] < 0:
        causes.append(
            (
                "spec.pool.generation",
                f"Invalid value: {json.dumps(pool.get('generation'))}: must be greater than or equal to 0",
            )
        )
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        causes.append(
            (
                "spec.pool.resourceSliceCount",
                f"Invalid value: {json.dumps(pool.get('resourceSliceCount'))}: must be greater than zero",
            )
        )
    selectors = [k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)]
    if len(selectors) != 1:
        what = "Required value" if not selectors else f"Invalid value: {selectors}"
        causes.append(
            (
                "spec",
                f"{what}: exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required",
            )
        )
    devices = spec.get("devices") or []
    counters = spec.get("sharedCounters") or []
    if devices and counters:
        causes.append(("spec", "Invalid value: only one of `devices` or `sharedCounters` may be set"))
    limited = any(d.get("consumesCounters") or d.get("taints") for d in devices if isinstance(d, dict))
    max_devices = 64 if limited else 128
    if len(devices) > max_devices:
        causes.append(("spec.devices", f"Too many: {len(devices)}: must have at most {max_devices} items"))
    seen: set[str] = set()
    for i, dev in enumerate(devices):
        causes += _validate_device(dev, f"spec.devices[{i}]", seen, bool(spec.get("perDeviceNodeSelection")))
    if len(counters) > 8:
        causes.append(("spec.sharedCounters", f"Too many: {len(counters)}: must have at most 8 items"))
    for i, cset in enumerate(counters):
        if not DNS1123_LABEL.match(str(cset.get("name", ""))):
            causes.append(
                (
                    f"spec.sharedCounters[{i}].name",
                    f"Invalid value: {json.dumps(cset.get('name'))}: must be a DNS label",
                )
            )
        for cname in cset.get("counters") or {}:
            if not DNS1123_LABEL.match(cname):
                causes.append(
                    (f"spec.sharedCounters[{i}].counters[{cname}]", "Invalid value: must be a DNS label")
                )
        if len(cset.get("counters") or {}) > 32:
            causes.append(
                (
                    f"spec.sharedCounters[{i}].counters",
                    f"Too many: {len(cset['counters'])}: must have at most 32 items",
                )
            )
    if old is not None:
        old_spec = old.get("spec") or {}
        for fld, new_v, old_v in (
            ("spec.nodeName", spec.get("nodeName"), old_spec.get("nodeName")),
            ("spec.driver", spec.get("driver"), old_spec.get("driver")),
            ("spec.pool.name", pool.get("name"), (old_spec.get("pool") or {}).get("name")),
        ):
            if new_v != old_v:
                causes.append((fld, f"Invalid value: {json.dumps(new_v)}: field is immutable"))
    return causes


def _validate_device(dev: Any, fld: str, seen: set[str], per_device: bool) -> list[tuple[str, str]]:
    if not isinstance(dev, dict):
        return [(fld, "Invalid value: must be an object")]
    causes: list[tuple[str, str]] = []
    name = dev.get("name", "")
    if not isinstance(name, str) or not DNS1123_LABEL.match(name) or len(name) > 63:
        causes.append(
            (
                f"{fld}.name",
                f"Invalid value: {json.dumps(name)}: a lowercase RFC 1123 label must be at most 63 characters",
            )
        )
    elif name in seen:
        causes.append((f"{fld}.name", f"Duplicate value: {json.dumps(name)}"))
    seen.add(str(name))
    attrs = dev.get("attributes") or {}
    caps = dev.get("capacity") or {}
    if len(attrs) + len(caps) > 32:
        causes.append(
            (
                fld,
                f"Too many: {len(attrs) + len(caps)}: must have at most 32 attributes and capacities combined",
            )
        )
    for aname, attr in attrs.items():
        afld = f"{fld}.attributes[{aname}]"
        causes += _validate_qualified_name(aname, afld)
        kinds = [
            k
            for k in ("int", "bool", "string", "version", "ints", "bools", "strings", "versions")
            if isinstance(attr, dict) and attr.get(k) is not None
        ]
        if len(kinds) != 1:
            causes.append((afld, "Invalid value: exactly one value must be specified"))
            continue
        value = attr[kinds[0]]
        if kinds[0] == "string" and (not isinstance(value, str) or len(value) > 64):
            causes.append((f"{afld}.string", "Too long: may not be more than 64 bytes"))
        if kinds[0] == "version" and (
            not isinstance(value, str) or len(value) > 64 or not SEMVER.match(value)
        ):
            causes.append(
                (f"{afld}.version", f"Invalid value: {json.dumps(value)}: must be a semantic version")
            )
        if kinds[0] == "int" and (isinstance(value, bool) or not isinstance(value, int)):
            causes.append((f"{afld}.int", f"Invalid value: {json.dumps(value)}: must be an integer"))
        if kinds[0] == "bool" and not isinstance(value, bool):
            causes.append((f"{afld}.bool", f"Invalid value: {json.dumps(value)}: must be a boolean"))
    for cname, cap in caps.items():
        causes += _validate_qualified_name(cname, f"{fld}.capacity[{cname}]")
        if isinstance(cap, dict) and cap.get("requestPolicy") and not dev.get("allowMultipleAllocations"):
            causes.append(
                (
                    f"{fld}.capacity[{cname}].requestPolicy",
                    "Forbidden: allowed only when allowMultipleAllocations is true",
                )
            )
        if isinstance(cap, dict) and isinstance(cap.get("requestPolicy"), dict):
            causes += _validate_request_policy(cap["requestPolicy"], f"{fld}.capacity[{cname}].requestPolicy")
    if len(dev.get("consumesCounters") or []) > 2:
        causes.append((f"{fld}.consumesCounters", "Too many: must have at most 2 items"))
    for i, cons in enumerate(dev.get("consumesCounters") or []):
        if not isinstance(cons, dict) or not DNS1123_LABEL.match(str(cons.get("counterSet", ""))):
            causes.append((f"{fld}.consumesCounters[{i}].counterSet", "Invalid value: must be a DNS label"))
            continue
        if len(cons.get("counters") or {}) > 32:
            causes.append(
                (
                    f"{fld}.consumesCounters[{i}].counters",
                    f"Too many: {len(cons['counters'])}: must have at most 32 items",
                )
            )
    if len(dev.get("taints") or []) > 16:
        causes.append((f"{fld}.taints", "Too many: must have at most 16 items"))
    for i, taint in enumerate(dev.get("taints") or []):
        if taint.get("effect") not in ("NoSchedule", "NoExecute", "None"):
            causes.append(
                (f"{fld}.taints[{i}].effect", f"Unsupported value: {json.dumps(taint.get('effect'))}")
            )
    device_node = [k for k in ("nodeName", "nodeSelector", "allNodes") if dev.get(k)]
    if per_device and len(device_node) != 1:
        causes.append(
            (
                fld,
                "Invalid value: exactly one of `nodeName`, `nodeSelector`, `allNodes` is required with perDeviceNodeSelection",
            )
        )
    if not per_device and device_node:
        causes.append((f"{fld}.{device_node[0]}", "Forbidden: only allowed with perDeviceNodeSelection"))
    return causes


def _validate_request_policy(policy: Obj, fld: str) -> list[tuple[str, str]]:
    """At most one of validValues (<= 10, ascending, containing the default) and validRange; a default with either."""
    causes: list[tuple[str, str]] = []
    values, rng = policy.get("validValues"), policy.get("validRange")
    if values and rng:
        causes.append((fld, "Invalid value: only one of `validValues` and `validRange` may be set"))
    if (values or rng) and policy.get("default") is None:
        causes.append(
            (f"{fld}.default", "Required value: a default is required with validValues or validRange")
        )
    try:
        default = parse_quantity(policy["default"])[0] if policy.get("default") is not None else None
        if values:
            parsed = [parse_quantity(v)[0] for v in values]
            if len(parsed) > 10:
                causes.append((f"{fld}.validValues", f"Too many: {len(parsed)}: must have at most 10 items"))
            if parsed != sorted(set(parsed)):
                causes.append(
                    (
                        f"{fld}.validValues",
                        "Invalid value: must be sorted in ascending order without duplicates",
                    )
                )
            if default is not None and default not in parsed:
                causes.append((f"{fld}.default", "Invalid value: must be one of validValues"))
        if rng:
            if rng.get("min") is None:
                causes.append((f"{fld}.validRange.min", "Required value"))
            else:
                low = parse_quantity(rng["min"])[0]
                high = parse_quantity(rng["max"])[0] if rng.get("max") is not None else None
                if high is not None and high < low:
                    causes.append(
                        (f"{fld}.validRange.max", "Invalid value: must be greater than or equal to min")
                    )
                if default is not None and (default < low or (high is not None and default > high)):
                    causes.append((f"{fld}.default", "Invalid value: must be within validRange"))
    except ValueError as exc:
        causes.append((fld, f"Invalid value: {exc}"))
    return causes


def _validate_qualified_name(name: str, fld: str) -> list[tuple[str, str]]:
    domain, _, ident = name.rpartition("/")
    if domain and (not DNS1123_SUBDOMAIN.match(domain) or len(domain) > 63):
        return [
            (
                fld,
                f"Invalid value: {json.dumps(name)}: the domain must be a DNS subdomain of at most 63 characters",
            )
        ]
    if not C_IDENTIFIER.match(ident) or len(ident) > 32:
        return [(fld, f"Invalid value: {json.dumps(name)}: must be a C identifier of at most 32 characters")]
    return []


def _validate_claim(obj: Obj, old: Obj | None) -> list[tuple[str, str]]:
    causes: list[tuple[str, str]] = []
    spec = obj.get("spec") or {}
    for i, req in enumerate((spec.get("devices") or {}).get("requests") or []):
        fld = f"spec.devices.requests[{i}]"
        if not DNS1123_LABEL.match(str(req.get("name", ""))):
            causes.append(
                (f"{fld}.name", f"Invalid value: {json.dumps(req.get('name'))}: must be a DNS label")
            )
        if bool(req.get("exactly")) == bool(req.get("firstAvailable")):
            causes.append((fld, "Invalid value: exactly one of `exactly` or `firstAvailable` is required"))
        elif req.get("exactly") and not req["exactly"].get("deviceClassName"):
            causes.append((f"{fld}.exactly.deviceClassName", "Required value"))
    if old is not None and spec != (old.get("spec") or {}):
        causes.append(("spec", "Invalid value: field is immutable"))
    status = obj.get("status") or {}
    alloc = status.get("allocation")
    old_alloc = (old.get("status") or {}).get("allocation") if old else None
    if alloc and old_alloc and alloc != old_alloc:
        causes.append(("status.allocation", "Invalid value: field is immutable"))
    reserved = status.get("reservedFor") or []
    if reserved and not alloc:
        causes.append(("status.reservedFor", "Forbidden: may not be specified when `allocated` is not set"))
    if len(reserved) > 256:
        causes.append(("status.reservedFor", "Too many: must have at most 256 items"))
    uids = [r.get("uid") for r in reserved]
    if len(set(uids)) != len(uids):
        causes.append(("status.reservedFor", "Duplicate value: reservedFor uids must be unique"))
    results = {
        (r.get("driver"), r.get("pool"), r.get("device"), r.get("shareID"))
        for r in ((alloc or {}).get("devices") or {}).get("results") or []
    }
    seen: set[tuple[Any, ...]] = set()
    for i, dev in enumerate(status.get("devices") or []):
        key = (dev.get("driver"), dev.get("pool"), dev.get("device"), dev.get("shareID"))
        if key in seen:
            causes.append(
                (
                    f"status.devices[{i}]",
                    f"Duplicate value: {json.dumps(dict(zip(('driver', 'pool', 'device', 'shareID'), key, strict=True)))}",
                )
            )
        seen.add(key)
        if key not in results:
            causes.append(
                (
                    f"status.devices[{i}]",
                    f"Invalid value: {json.dumps(dict(zip(('driver', 'pool', 'device', 'shareID'), key, strict=True)))}: must be an allocated device in the claim",
                )
            )
        if len(dev.get("conditions") or []) > 8:
            causes.append((f"status.devices[{i}].conditions", "Too many: must have at most 8 items"))
        if len(json.dumps(dev.get("data"))) > 10 * 1024:
            causes.append((f"status.devices[{i}].data", "Too long: must have at most 10240 bytes"))
    return causes


# --- DeviceClass (DRAExtendedResource) ----------------------------------------------------

REQUESTS_PREFIX = "requests."
_QUALIFIED_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def is_extended_resource_name(name: str) -> bool:
    """``IsExtendedResourceName`` of the Kubernetes validation: domain-prefixed, not native, quota-name valid."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith(REQUESTS_PREFIX):
        return False
    domain, _, ident = (REQUESTS_PREFIX + name).rpartition("/")
    return (
        len(domain) <= 253
        and bool(_DNS_SUBDOMAIN.match(domain))
        and 0 < len(ident) <= 63
        and bool(_QUALIFIED_PART.match(ident))
    )


def validate_device_class(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Field errors of a DeviceClass's ``spec.extendedResourceName`` (the fake API server calls this)."""
    name = (obj.get("spec") or {}).get("extendedResourceName")
    if name is None:
        return []
    if not isinstance(name, str) or not is_extended_resource_name(name):
        return [
            (
                "spec.extendedResourceName",
                f'Invalid value: "{name}": must be an extended resource name: a domain-prefixed path '
                "such as example.com/npu, outside the kubernetes.io domain",
            )
        ]
    return []

"""Admission-time checks of ``VnpuConfig`` in ResourceClaims and ResourceClaimTemplates.

Pure: given an ``admission.k8s.io/v1`` ``AdmissionReview`` request (a plain JSON dict), say whether
the object may be stored, with the same messages prepare gives (the same decoder,
:func:`dra_driver.sharing.decode`, and the same equal-distribution rule, :func:`sharing.split`),
naming the object and the field in the object the user wrote. Served by ``controller/webhook.py``.

What is checked, for each ``spec.devices.config[i].opaque`` whose ``driver`` is this driver (other
drivers' configs are never looked at): the parameters decode strictly (kind, apiVersion, unknown or
misspelled fields, wrong types, unknown values, ``hostMemory``); ``config[i].requests`` name requests
of the claim; and for each share request (its device class is a share class) the claim's configs,
overlaid in order, give a ``vnpus`` that divides the request's ``memory`` and ``compute``
(defaults and 128 MiB rounding as the published request policy has them), and names the policy
the request's DeviceClass serves, when the webhook knows it (``class=policy`` in
``--share-classes``), and asks for no more ``hostMemory`` than the node's bound allows for the
request's memory (:class:`dra_driver.sharing.HostMemoryBound`, ``--host-memory-ratio`` and
``--max-host-memory``, the same flags prepare has). Class-level configs are
not seen here (prepare still applies them first); a claim the webhook admits can still fail at
prepare on what only the node knows (the die, the class config).

It performs no I/O and logs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_driver import sharing
from dra_driver.errors import ErrorCode, InvalidInput, quote
from dra_driver.sharing import Policy

__all__ = ["KINDS", "Verdict", "check_object", "review"]

ADMISSION_VERSION = "admission.k8s.io/v1"
KINDS = {"ResourceClaim": "spec.devices", "ResourceClaimTemplate": "spec.spec.devices"}
"""The kinds checked, and where their device requests and configs are."""
DEFAULT_MEMORY = sharing.MEMORY_STEP  # the share device's request policy: default 128Mi, step 128Mi
DEFAULT_COMPUTE = 1


@dataclass(frozen=True, slots=True)
class Verdict:
    allowed: bool
    message: str = ""


def parse_share_classes(items: Iterable[str]) -> dict[str, Policy | None]:
    """``class`` or ``class=policy`` entries (the webhook's ``--share-classes``): the DeviceClasses of shares,
    each with the policy its devices serve when known."""
    out: dict[str, Policy | None] = {}
    for item in items:
        name, _, policy = item.partition("=")
        try:
            out[name.strip()] = Policy(policy.strip()) if policy.strip() else None
        except ValueError:
            raise InvalidInput(
                f"unknown policy {quote(policy)} for share class {quote(name)}; use one of"
                f" {', '.join(p.value for p in Policy)}",
                code=ErrorCode.INVALID_CONFIG,
                field="share-classes",
            ) from None
    return out


def review(
    doc: Any,
    *,
    driver_name: str,
    share_classes: Iterable[str],
    host_memory: sharing.HostMemoryBound | None = None,
) -> dict[str, Any]:
    """The ``AdmissionReview`` answer to ``doc`` (an ``AdmissionReview`` with a ``request``).

    A malformed review raises :class:`InvalidInput` (the server answers 400); an object that is not
    one of :data:`KINDS`, a DELETE, or one without this driver's config is allowed.
    """
    if not isinstance(doc, Mapping) or doc.get("kind") != "AdmissionReview":
        raise InvalidInput("not an AdmissionReview", code=ErrorCode.INVALID_ARGUMENT, field="kind")
    request = doc.get("request")
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str) or not request["uid"]:
        raise InvalidInput(
            "the AdmissionReview has no request.uid", code=ErrorCode.INVALID_ARGUMENT, field="request.uid"
        )
    kind = (request.get("kind") or {}).get("kind") if isinstance(request.get("kind"), Mapping) else None
    obj = request.get("object")
    verdict = Verdict(allowed=True)
    if kind in KINDS and request.get("operation") in ("CREATE", "UPDATE") and isinstance(obj, Mapping):
        verdict = check_object(
            kind,
            obj,
            namespace=str(request.get("namespace") or ""),
            driver_name=driver_name,
            share_classes=parse_share_classes(share_classes),
            host_memory=host_memory or sharing.HostMemoryBound(),
        )
    response: dict[str, Any] = {"uid": request["uid"], "allowed": verdict.allowed}
    if not verdict.allowed:
        response["status"] = {"code": 422, "reason": "Invalid", "message": verdict.message}
    return {
        "apiVersion": doc.get("apiVersion") or ADMISSION_VERSION,
        "kind": "AdmissionReview",
        "response": response,
    }


def check_object(
    kind: str,
    obj: Mapping[str, Any],
    *,
    namespace: str,
    driver_name: str,
    share_classes: Mapping[str, Policy | None],
    host_memory: sharing.HostMemoryBound | None = None,
) -> Verdict:
    """Whether a ResourceClaim or ResourceClaimTemplate ``obj`` may be stored."""
    meta = _map(obj.get("metadata"))
    name = str(meta.get("name") or meta.get("generateName") or "")
    who = f"{kind} {meta.get('namespace') or namespace}/{name}"
    prefix = KINDS[kind]
    try:
        _check_devices(
            _at(obj, prefix),
            prefix=prefix,
            driver_name=driver_name,
            share_classes=share_classes,
            host_memory=host_memory or sharing.HostMemoryBound(),
        )
    except InvalidInput as err:
        return Verdict(allowed=False, message=f"{who}: {err}")
    return Verdict(allowed=True)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _at(obj: Mapping[str, Any], dotted: str) -> Mapping[str, Any]:
    node: Any = obj
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


@dataclass(frozen=True, slots=True)
class _Config:
    index: int
    requests: tuple[str, ...]
    parameters: Mapping[str, Any]

    def applies_to(self, request: str) -> bool:
        return not self.requests or request in self.requests


def _check_devices(
    devices: Mapping[str, Any],
    *,
    prefix: str,
    driver_name: str,
    share_classes: Mapping[str, Policy | None],
    host_memory: sharing.HostMemoryBound,
) -> None:
    requests = _list(devices.get("requests"))
    names = {str(r.get("name")) for r in requests if isinstance(r, Mapping)}
    configs = list(_own_configs(devices.get("config"), prefix=prefix, driver_name=driver_name, names=names))
    for cfg in configs:  # every own config decodes on its own, whatever it applies to
        sharing.decode(cfg.parameters, claim_uid="", where=f"{prefix}.config[{cfg.index}].opaque.parameters")
    for j, req in enumerate(requests):
        if not isinstance(req, Mapping):
            continue
        for where, sub, names_of in _share_requests(req, f"{prefix}.requests[{j}]", share_classes):
            applied = [c for c in configs if any(c.applies_to(n) for n in names_of)]
            resolved = sharing.resolve(
                ((f"{prefix}.config[{c.index}].opaque.parameters", c.parameters) for c in applied),
                claim_uid="",
            )
            served = share_classes.get(str(sub.get("deviceClassName")))
            if (
                served is not None
                and any("policy" in c.parameters for c in applied)
                and resolved.policy != served
            ):
                at = [c.index for c in applied if "policy" in c.parameters][-1]
                better = [k for k, v in share_classes.items() if v == resolved.policy]
                raise InvalidInput(
                    f"policy {quote(str(resolved.policy))} does not agree with the DeviceClass"
                    f" {quote(sub.get('deviceClassName'))} of {where}, whose share devices serve"
                    f" {quote(str(served))} shares: ask for {quote(str(resolved.policy))} share devices"
                    + (f" (the DeviceClass {better[0]})" if better else "")
                    + ", so that the scheduler places the share on a die without another policy",
                    code=ErrorCode.INVALID_OPAQUE_CONFIG,
                    field=f"{prefix}.config[{at}].opaque.parameters.policy",
                )
            quota = _requested_quota(sub, where=f"{where}.capacity.requests")
            sharing.check_host_memory(
                (
                    ("FromClaim", f"{prefix}.config[{c.index}].opaque.parameters", c.parameters)
                    for c in applied
                ),
                memory_bytes=quota.memory_bytes,
                bound=host_memory,
                claim_uid="",
                who=f"the request {where}",
            )
            if resolved.vnpus > 1:
                sharing.split(
                    quota,
                    resolved.vnpus,
                    memory_only=resolved.memory_only,
                    claim_uid="",
                    field=f"{where}.capacity.requests",
                )


def _own_configs(raw: Any, *, prefix: str, driver_name: str, names: set[str]) -> Iterable[_Config]:
    for entry in sharing.driver_configs(raw, driver_name=driver_name, field=f"{prefix}.config"):
        unknown = [r for r in entry.requests if r.split("/", 1)[0] not in names]
        if unknown:
            raise InvalidInput(
                f"names no request of this claim: {quote(unknown)} (requests: {', '.join(sorted(names))})",
                code=ErrorCode.INVALID_OPAQUE_CONFIG,
                field=f"{prefix}.config[{entry.index}].requests",
            )
        yield _Config(index=entry.index, requests=entry.requests, parameters=entry.parameters)


def _share_requests(
    req: Mapping[str, Any], where: str, share_classes: Mapping[str, Policy | None]
) -> Iterable[tuple[str, Mapping[str, Any], Sequence[str]]]:
    """(field, request body, names a config may use for it) of each share (sub)request."""
    name = str(req.get("name"))
    exactly = req.get("exactly")
    if isinstance(exactly, Mapping) and exactly.get("deviceClassName") in share_classes:
        yield f"{where}.exactly", exactly, (name,)
    subs = req.get("firstAvailable")
    for k, sub in enumerate(_list(subs)):
        if isinstance(sub, Mapping) and sub.get("deviceClassName") in share_classes:
            yield f"{where}.firstAvailable[{k}]", sub, (name, f"{name}/{sub.get('name')}")


def _requested_quota(request: Mapping[str, Any], *, where: str) -> sharing.ShareQuota:
    """What the scheduler will allocate: the request's memory rounded up to 128 MiB, its compute."""
    asked = _map(_map(request.get("capacity")).get("requests"))
    memory = DEFAULT_MEMORY
    if "memory" in asked:
        memory = sharing.parse_quantity(str(asked["memory"]), claim_uid="", field=f"{where}.memory")
        memory = -(-memory // sharing.MEMORY_STEP) * sharing.MEMORY_STEP
    compute = DEFAULT_COMPUTE
    if "compute" in asked:
        compute = sharing.parse_quantity(str(asked["compute"]), claim_uid="", field=f"{where}.compute")
    return sharing.ShareQuota(memory_bytes=memory, compute_percent=compute)

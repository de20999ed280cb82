"""Served resource types and the ``Status`` errors a real apiserver answers with.

Owns the table of resources the fake serves (:data:`RESOURCES`) and :class:`APIError`, whose
:meth:`APIError.status` is the Status body every failure carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


# --------------------------------------------------------------------------- resources


@dataclass(frozen=True, slots=True)
class Resource:
    """One served resource type and the strategy bits that differ between types."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False
    has_generation: bool = False
    returns_deleted: bool = False
    field_labels: tuple[str, ...] = ()
    short_names: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return self.version if not self.group else f"{self.group}/{self.version}"

    @property
    def key(self) -> str:
        """Store key, also accepted by ``get_object``: ``pods`` or ``events.events.k8s.io``."""
        return self.plural if not self.group else f"{self.plural}.{self.group}"

    @property
    def qualified(self) -> str:
        return self.key


EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "regarding.kind",
    "regarding.namespace",
    "regarding.name",
    "regarding.uid",
    "reason",
    "reportingComponent",
    "source",
    "type",
)

RESOURCES: tuple[Resource, ...] = (
    Resource(
        "",
        "v1",
        "namespaces",
        "Namespace",
        False,
        has_status=True,
        field_labels=("status.phase",),
        short_names=("ns",),
    ),
    Resource(
        "",
        "v1",
        "nodes",
        "Node",
        False,
        has_status=True,
        field_labels=("spec.unschedulable",),
        short_names=("no",),
    ),
    Resource(
        "",
        "v1",
        "pods",
        "Pod",
        True,
        has_status=True,
        has_generation=True,
        returns_deleted=True,
        field_labels=(
            "spec.nodeName",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "spec.restartPolicy",
        ),
        short_names=("po",),
    ),
    Resource("", "v1", "events", "Event", True, field_labels=EVENT_FIELDS, short_names=("ev",)),
    Resource("events.k8s.io", "v1", "events", "Event", True, field_labels=EVENT_FIELDS, short_names=("ev",)),
    Resource(
        "resource.k8s.io",
        "v1",
        "resourceslices",
        "ResourceSlice",
        False,
        has_generation=True,
        returns_deleted=True,
        field_labels=("spec.nodeName", "spec.driver", "spec.pool.name"),
    ),
    Resource(
        "resource.k8s.io",
        "v1",
        "resourceclaims",
        "ResourceClaim",
        True,
        has_status=True,
        has_generation=True,
        returns_deleted=True,
    ),
    Resource(
        "resource.k8s.io",
        "v1",
        "resourceclaimtemplates",
        "ResourceClaimTemplate",
        True,
        has_generation=True,
        returns_deleted=True,
    ),
    Resource(
        "admissionregistration.k8s.io",
        "v1",
        "validatingwebhookconfigurations",
        "ValidatingWebhookConfiguration",
        False,
        has_generation=True,
    ),
    Resource(
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "DeviceClass",
        False,
        has_generation=True,
        returns_deleted=True,
    ),
)
BY_PATH: dict[tuple[str, str, str], Resource] = {(r.group, r.version, r.plural): r for r in RESOURCES}
BY_KEY: dict[str, Resource] = {r.key: r for r in RESOURCES}


# --------------------------------------------------------------------------- errors


class APIError(Exception):
    """An error the server answers with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: Obj | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def status(self) -> Obj:
        body: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details is not None:
            body["details"] = self.details
        return body


def details_of(res: Resource, name: str) -> Obj:
    details: Obj = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def not_found(res: Resource, name: str) -> APIError:
    return APIError(404, "NotFound", f'{res.qualified} "{name}" not found', details_of(res, name))


def already_exists(res: Resource, name: str) -> APIError:
    return APIError(409, "AlreadyExists", f'{res.qualified} "{name}" already exists', details_of(res, name))


def conflict(res: Resource, name: str, why: str) -> APIError:
    return APIError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}',
        details_of(res, name),
    )


def bad_request(message: str) -> APIError:
    return APIError(400, "BadRequest", message)


def invalid(res: Resource, name: str, causes: list[tuple[str, str]]) -> APIError:
    """422 Invalid; ``causes`` are (field, message-after-field) pairs, like field.ErrorList."""
    rendered = [f"{fld}: {msg}" for fld, msg in causes]
    joined = rendered[0] if len(rendered) == 1 else "[" + ", ".join(rendered) + "]"
    group = f".{res.group}" if res.group else ""
    details = {
        "name": name,
        "kind": res.kind,
        "causes": [{"reason": "FieldValueInvalid", "message": msg, "field": fld} for fld, msg in causes],
    }
    if res.group:
        details["group"] = res.group
    return APIError(422, "Invalid", f'{res.kind}{group} "{name}" is invalid: {joined}', details)

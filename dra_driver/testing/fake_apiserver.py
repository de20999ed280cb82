"""An in-process fake Kubernetes API server that speaks the real REST and watch protocol.

It owns: serving the handful of resources FlexNPU touches (core ``nodes``, ``namespaces``,
``events``, ``pods``; ``events.k8s.io/v1`` ``events``; ``resource.k8s.io/v1`` ``resourceslices``,
``resourceclaims`` (+ ``/status``), ``resourceclaimtemplates``, ``deviceclasses``) over HTTP/1.1 JSON
to the official ``kubernetes`` client, with the apiserver semantics drivers depend on: one global
resourceVersion, optimistic concurrency, Status error bodies, delete preconditions, finalizers,
label/field selectors, status-subresource isolation, merge / strategic-merge / JSON / server-side
apply patches, watches with history, bookmarks and 410 Gone, and the validation rules that catch
driver bugs. It must not grow endpoints a real apiserver lacks: driver code talks to it only
through the ``kubernetes`` client, so it runs unchanged against a real cluster. Test-only hooks
(``set_down``, ``compact``, ``request_log``, ``get_object``, ``put_object``) are Python methods.

Usage::

    with FakeAPIServer() as srv:
        api = kubernetes.client.ResourceV1Api(srv.api_client())
        api.list_resource_slice(field_selector="spec.nodeName=node-1")

Run standalone: ``python -m dra_driver.testing.fake_apiserver --port 6443 --kubeconfig-out kc``.

Simplified on purpose (see also the project report): ``limit``/``continue`` and the list
``resourceVersion``/``resourceVersionMatch`` parameters are ignored (lists return everything, current);
the garbage collector runs synchronously inside the delete (background propagation; ``Orphan``
leaves dependents and their ownerReferences as they are; ``Foreground`` acts like background);
no namespace cascade; pods are deleted at once (no graceful termination); ``dryRun`` is refused
with 400 rather than silently written; server-side apply tracks ownership only between *apply*
managers (fields written by PUT/merge patches have no owner); managedFields are not returned;
unknown fields are kept rather than pruned; core and ``events.k8s.io`` events are separate stores.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import queue
import re
import secrets
import signal
import socket
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from fractions import Fraction
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import kubernetes.client
import yaml

__all__ = ["RESOURCES", "FakeAPIServer", "Resource", "main"]

Obj = dict[str, Any]

GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery utilrand
GENERATE_NAME_MAX_BASE = 58
BOOKMARK_INTERVAL_S = 1.0
DEFAULT_WATCH_TIMEOUT_S = 1800.0
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
SERVER_VERSION = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0-flexnpu-fake",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)

# Strategic-merge-patch metadata (the patchStrategy/patchMergeKey struct tags of the Go types).
# ResourceClaim status.devices has listType=map but NO patchStrategy tag, so a real apiserver
# REPLACES it under strategic merge patch; only server-side apply merges it by key.
SMP_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("metadata", "ownerReferences"): "uid",
    ("status", "reservedFor"): "uid",
    ("status", "conditions"): "type",
    ("spec", "containers"): "name",
}
SMP_MERGE_PRIMITIVES = frozenset({("metadata", "finalizers")})

# Server-side-apply list types (+listType=map keys; +listType=set). Everything else is atomic.
SSA_MAP_KEYS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("status", "devices"): ("driver", "device", "pool", "shareID"),
    ("status", "devices", "conditions"): ("type",),
    ("status", "reservedFor"): ("uid",),
    ("status", "conditions"): ("type",),
    ("metadata", "ownerReferences"): ("uid",),
}
SSA_SETS = frozenset({("metadata", "finalizers")})


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


_EVENT_FIELDS = (
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
    Resource("", "v1", "events", "Event", True, field_labels=_EVENT_FIELDS, short_names=("ev",)),
    Resource("events.k8s.io", "v1", "events", "Event", True, field_labels=_EVENT_FIELDS, short_names=("ev",)),
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
        "resource.k8s.io",
        "v1",
        "deviceclasses",
        "DeviceClass",
        False,
        has_generation=True,
        returns_deleted=True,
    ),
)
_BY_PATH: dict[tuple[str, str, str], Resource] = {(r.group, r.version, r.plural): r for r in RESOURCES}
_BY_KEY: dict[str, Resource] = {r.key: r for r in RESOURCES}


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


def _details(res: Resource, name: str) -> Obj:
    details: Obj = {"name": name, "kind": res.plural}
    if res.group:
        details["group"] = res.group
    return details


def not_found(res: Resource, name: str) -> APIError:
    return APIError(404, "NotFound", f'{res.qualified} "{name}" not found', _details(res, name))


def already_exists(res: Resource, name: str) -> APIError:
    return APIError(409, "AlreadyExists", f'{res.qualified} "{name}" already exists', _details(res, name))


def conflict(res: Resource, name: str, why: str) -> APIError:
    return APIError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {res.qualified} "{name}": {why}',
        _details(res, name),
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


# --------------------------------------------------------------------------- quantities

_SUFFIX_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_SUFFIX_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_QUANTITY = re.compile(r"^([+-]?[0-9]*\.?[0-9]*)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E|[eE][+-]?[0-9]+)?$")


def parse_quantity(text: object) -> tuple[Fraction, str]:
    """Parse a Kubernetes quantity into (value, format) with format binary/decimal/exponent."""
    if not isinstance(text, str):
        raise ValueError(f"quantity must be a string, got {type(text).__name__}")
    m = _QUANTITY.match(text.strip())
    if not m or m.group(1) in ("", "+", "-", "."):
        raise ValueError(
            f"quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$': {text!r}"
        )
    number = Fraction(m.group(1))
    suffix = m.group(2) or ""
    if suffix in _SUFFIX_BINARY:
        return number * _SUFFIX_BINARY[suffix], "binary"
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:]), "exponent"
    return number * Fraction(10) ** _SUFFIX_DECIMAL[suffix], "decimal"


def format_quantity(value: Fraction, fmt: str = "decimal") -> str:
    """Canonical form, as the apiserver stores it (rounded up to 1n; 1024Mi -> 1Gi, 1000 -> 1k)."""
    nano = value * 10**9
    if nano.denominator != 1:
        nano = Fraction(-((-nano.numerator) // nano.denominator))  # ceil
    value = nano / 10**9
    if value == 0:
        return "0"
    if fmt == "binary" and value.denominator == 1 and abs(value) >= 1024:
        for suffix, mult in reversed(list(_SUFFIX_BINARY.items())):
            if value % mult == 0:
                return f"{int(value / mult)}{suffix}"
        return str(int(value))
    exponent = -9
    while exponent < 18 and (value / Fraction(10) ** (exponent + 3)).denominator == 1:
        exponent += 3
    mantissa = int(value / Fraction(10) ** exponent)
    if fmt == "exponent":
        return f"{mantissa}e{exponent}" if exponent else str(mantissa)
    suffix = {v: k for k, v in _SUFFIX_DECIMAL.items()}[exponent]
    return f"{mantissa}{suffix}"


def canonical_quantity(text: object) -> str:
    value, fmt = parse_quantity(text)
    return format_quantity(value, fmt)


# --------------------------------------------------------------------------- selectors


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: tuple[str, ...] = ()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=", "notin"


_SET_TERM = re.compile(r"^\s*(\S+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_EQ_TERM = re.compile(r"^\s*([^\s!=]+)\s*(==|=|!=)\s*([^\s,]*)\s*$")


def parse_label_selector(text: str) -> list[LabelRequirement]:
    """Parse the label selector grammar of k8s.io/apimachinery/pkg/labels; bad input -> 400."""
    reqs: list[LabelRequirement] = []
    for term in _split_top_level(text):
        if not term.strip():
            continue
        m = _SET_TERM.match(term)
        if m:
            values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
            req = LabelRequirement(m.group(1), m.group(2), values)
        elif (m := _EQ_TERM.match(term)) is not None:
            op = "=" if m.group(2) in ("=", "==") else "!="
            req = LabelRequirement(m.group(1), op, (m.group(3),))
        elif term.strip().startswith("!"):
            req = LabelRequirement(term.strip()[1:].strip(), "!")
        else:
            req = LabelRequirement(term.strip(), "exists")
        if not LABEL_KEY.match(req.key):
            raise bad_request(
                f"unable to parse requirement: invalid label key {req.key!r} in selector {text!r}"
            )
        reqs.append(req)
    return reqs


def _split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


def parse_field_selector(res: Resource, text: str) -> list[FieldRequirement]:
    """Parse ``a=b,c!=d``; fields the resource does not index -> 400, like the real server."""
    reqs: list[FieldRequirement] = []
    for term in text.split(","):
        if not term.strip():
            continue
        if "!=" in term:
            key, value, equal = *term.split("!=", 1), False
        elif "==" in term:
            key, value, equal = *term.split("==", 1), True
        elif "=" in term:
            key, value, equal = *term.split("=", 1), True
        else:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        key = key.strip()
        if key not in ("metadata.name", "metadata.namespace", *res.field_labels):
            raise bad_request(f"field label not supported: {key}")
        reqs.append(FieldRequirement(key, equal, value.strip()))
    return reqs


def field_value(res: Resource, obj: Obj, path: str) -> str:
    """The string a field selector compares for ``path`` (missing fields read as "")."""
    if res.kind == "Event":
        path = _event_field_path(res, path)
    cur: Any = obj
    for part in path.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if cur is None:
        return "false" if path == "spec.unschedulable" else ""
    if isinstance(cur, bool):
        return "true" if cur else "false"
    if isinstance(cur, dict):
        return str(cur.get("component", ""))
    return str(cur)


def _event_field_path(res: Resource, path: str) -> str:
    head, _, rest = path.partition(".")
    if res.group == "events.k8s.io":
        if head == "involvedObject":
            return f"regarding.{rest}"
        return {"source": "deprecatedSource.component", "reportingComponent": "reportingController"}.get(
            path, path
        )
    if head == "regarding":
        return f"involvedObject.{rest}"
    return path


@dataclass(frozen=True, slots=True)
class Selector:
    """Namespace + label + field filter of one list or watch request."""

    res: Resource
    namespace: str | None
    labels: tuple[LabelRequirement, ...] = ()
    fields: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        if not all(r.matches(labels) for r in self.labels):
            return False
        return all((field_value(self.res, obj, r.field) == r.value) == r.equal for r in self.fields)


# --------------------------------------------------------------------------- patches


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch with the list merge keys of the served Go types (SMP_MERGE_KEYS)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if key.startswith("$"):
            continue
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and sub in SMP_MERGE_KEYS:
            result[key] = _smp_merge_list(result.get(key) or [], value, SMP_MERGE_KEYS[sub], sub)
        elif isinstance(value, list) and sub in SMP_MERGE_PRIMITIVES:
            merged = list(result.get(key) or [])
            merged += [v for v in value if v not in merged]
            result[key] = merged
        else:
            result[key] = strategic_merge_patch(result.get(key), value, sub)
    return result


def _smp_merge_list(live: list[Any], patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    result = copy.deepcopy(live)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {key}")
        idx = next(
            (i for i, cur in enumerate(result) if isinstance(cur, dict) and cur.get(key) == item[key]), None
        )
        if item.get("$patch") == "delete":
            if idx is not None:
                del result[idx]
        elif idx is None:
            result.append({k: v for k, v in copy.deepcopy(item).items() if not k.startswith("$")})
        else:
            result[idx] = strategic_merge_patch(result[idx], item, path)
    return result


def json_patch(doc: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test); apply errors -> 422."""
    if not isinstance(ops, list):
        raise bad_request("json: cannot unmarshal object into Go value of type jsonpatch.Patch")
    doc = copy.deepcopy(doc)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid JSON patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind == "test":
            if _pointer_get(doc, path) != op.get("value"):
                raise _unprocessable(f"testing value {path} failed: test failed")
        elif kind == "remove":
            doc = _pointer_remove(doc, path)
        elif kind == "add":
            doc = _pointer_add(doc, path, copy.deepcopy(op.get("value")))
        elif kind == "replace":
            _pointer_get(doc, path)
            doc = _pointer_add(_pointer_remove(doc, path), path, copy.deepcopy(op.get("value")))
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_pointer_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _pointer_remove(doc, op["from"])
            doc = _pointer_add(doc, path, value)
        else:
            raise bad_request(f"Unexpected kind: {kind}")
    return doc


def _unprocessable(message: str) -> APIError:
    return APIError(422, "Invalid", message)


def _pointer_parts(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise _unprocessable(f"JSON pointer must start with '/': {path!r}")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _pointer_get(doc: Any, path: str) -> Any:
    cur = doc
    for part in _pointer_parts(path):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.isdigit() and int(part) < len(cur):
            cur = cur[int(part)]
        else:
            raise _unprocessable(f"doc is missing path: {path!r}")
    return cur


def _pointer_parent(doc: Any, path: str) -> tuple[Any, str]:
    parts = _pointer_parts(path)
    if not parts:
        raise _unprocessable("cannot address the document root")
    parent = (
        _pointer_get(doc, "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts[:-1]))
        if len(parts) > 1
        else doc
    )
    return parent, parts[-1]


def _pointer_remove(doc: Any, path: str) -> Any:
    parent, last = _pointer_parent(doc, path)
    if isinstance(parent, dict) and last in parent:
        del parent[last]
    elif isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        del parent[int(last)]
    else:
        raise _unprocessable(f"unable to remove nonexistent key: {last}: missing value")
    return doc


def _pointer_add(doc: Any, path: str, value: Any) -> Any:
    if path == "":
        return value
    parent, last = _pointer_parent(doc, path)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list) and last == "-":
        parent.append(value)
    elif isinstance(parent, list) and last.isdigit() and int(last) <= len(parent):
        parent.insert(int(last), value)
    else:
        raise _unprocessable(f"add operation does not apply: doc is missing path: {path!r}")
    return doc


# --------------------------------------------------------------------------- server-side apply

ItemKey = tuple[tuple[str, Any], ...]
FieldPath = tuple["str | ItemKey", ...]
_MISSING = object()


def ssa_field_paths(value: Any, fp: FieldPath = ()) -> set[FieldPath]:
    """The fields an applied configuration sets: leaves, list-map items (by key) and set members."""
    out: set[FieldPath] = set()
    if isinstance(value, dict) and value:
        for key, sub in value.items():
            out |= ssa_field_paths(sub, (*fp, key))
        return out
    schema = _schema_path(fp)
    if isinstance(value, list) and schema in SSA_MAP_KEYS:
        for item in value:
            elem = _item_key(item, SSA_MAP_KEYS[schema])
            out.add((*fp, elem))
            if isinstance(item, dict):
                fields = {k: v for k, v in item.items() if k not in SSA_MAP_KEYS[schema]}  # keys: the item
                out |= ssa_field_paths(fields, (*fp, elem)) if fields else set()
        return out
    if isinstance(value, list) and schema in SSA_SETS:
        return {(*fp, (("$value", v),)) for v in value}
    out.add(fp)
    return out


def ssa_merge(live: Any, applied: Any, schema: tuple[str, ...] = ()) -> Any:
    """Merge an applied configuration into the live object: maps granular, list-maps by key, sets by value."""
    if isinstance(applied, dict):
        result = copy.deepcopy(live) if isinstance(live, dict) else {}
        for key, sub in applied.items():
            result[key] = ssa_merge(result.get(key), sub, (*schema, key))
        return result
    if isinstance(applied, list) and schema in SSA_MAP_KEYS:
        keys = SSA_MAP_KEYS[schema]
        merged = copy.deepcopy(live) if isinstance(live, list) else []
        for item in applied:
            idx = next(
                (i for i, cur in enumerate(merged) if _item_key(cur, keys) == _item_key(item, keys)), None
            )
            if idx is None:
                merged.append(ssa_merge({}, item, schema))
            else:
                merged[idx] = ssa_merge(merged[idx], item, schema)
        return merged
    if isinstance(applied, list) and schema in SSA_SETS:
        merged = list(live) if isinstance(live, list) else []
        return merged + [v for v in applied if v not in merged]
    return copy.deepcopy(applied)


def _schema_path(fp: FieldPath) -> tuple[str, ...]:
    return tuple(e for e in fp if isinstance(e, str))


def _item_key(item: Any, keys: tuple[str, ...]) -> ItemKey:
    if not isinstance(item, dict):
        return (("$value", json.dumps(item, sort_keys=True)),)
    return tuple((k, item.get(k)) for k in keys)


def _path_get(obj: Any, fp: FieldPath) -> Any:
    cur = obj
    for elem in fp:
        if isinstance(elem, str):
            if not isinstance(cur, dict) or elem not in cur:
                return _MISSING
            cur = cur[elem]
        elif elem[0][0] == "$value":
            return elem[0][1] if isinstance(cur, list) and elem[0][1] in cur else _MISSING
        else:
            keys = tuple(k for k, _ in elem)
            found = [i for i in cur if _item_key(i, keys) == elem] if isinstance(cur, list) else []
            if not found:
                return _MISSING
            cur = found[0]
    return cur


def _path_remove(obj: Any, fp: FieldPath) -> None:
    parent = _path_get(obj, fp[:-1])
    last = fp[-1]
    if isinstance(last, str):
        if isinstance(parent, dict):
            parent.pop(last, None)
    elif isinstance(parent, list):
        keys = tuple(k for k, _ in last)
        if last[0][0] == "$value":
            parent[:] = [v for v in parent if v != last[0][1]]
        else:
            parent[:] = [i for i in parent if _item_key(i, keys) != last]
        if not parent:
            grand = _path_get(obj, fp[:-2])
            if isinstance(grand, dict) and isinstance(fp[-2], str):
                grand.pop(fp[-2], None)


def _render_path(fp: FieldPath) -> str:
    parts = []
    for elem in fp:
        if isinstance(elem, str):
            parts.append(f".{elem}")
        else:
            parts.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in elem if v is not None) + "]")
    return "".join(parts)


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


# --------------------------------------------------------------------------- store and watches


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    res: Resource
    type: str
    obj: Obj
    prev: Obj | None


def _watch_event(ev: _Event, sel: Selector) -> Obj | None:
    """What one watcher sees of a change, after its selector (the watch cache's rules)."""
    if ev.res is not sel.res:
        return None
    now = sel.matches(ev.obj)
    if ev.type != "MODIFIED":
        return {"type": ev.type, "object": ev.obj} if now else None
    before = sel.matches(ev.prev)
    if now:
        return {"type": "MODIFIED" if before else "ADDED", "object": ev.obj}
    if before and ev.prev is not None:
        gone = dict(ev.prev)
        gone["metadata"] = {**ev.prev["metadata"], "resourceVersion": str(ev.rv)}
        return {"type": "DELETED", "object": gone}
    return None


@dataclass(eq=False)
class _Watcher:
    sel: Selector
    bookmarks: bool
    queue: queue.Queue[Obj | None] = field(default_factory=queue.Queue)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class _Store:
    """All objects, the global resourceVersion, the watch history and the watchers; one lock."""

    def __init__(self, watch_history: int) -> None:
        self.lock = threading.RLock()
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {r.key: {} for r in RESOURCES}
        self.rv = 0
        self.history: deque[_Event] = deque()
        self.history_limit = watch_history
        self.floor = 0
        self.watchers: set[_Watcher] = set()
        self.owners: dict[str, dict[tuple[str, str], set[FieldPath]]] = {}
        self.drop_partitionable = False
        self.accepting_watches = True  # False while down or stopped: new watches end at once
        ns_res = _BY_KEY["namespaces"]
        for ns in DEFAULT_NAMESPACES:
            self.create(ns_res, None, {"metadata": {"name": ns}})

    # ---- reads

    def get(self, res: Resource, ns: str | None, name: str) -> Obj:
        with self.lock:
            obj = self.objects[res.key].get((ns or "", name))
            if obj is None:
                raise not_found(res, name)
            return copy.deepcopy(obj)

    def list(self, sel: Selector) -> Obj:
        with self.lock:
            items = [copy.deepcopy(o) for _, o in sorted(self.objects[sel.res.key].items()) if sel.matches(o)]
            rv = self.rv
        for item in items:  # typed lists carry kind/apiVersion only on the list
            item.pop("kind", None)
            item.pop("apiVersion", None)
        return {
            "kind": f"{sel.res.kind}List",
            "apiVersion": sel.res.api_version,
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    # ---- writes

    def create(self, res: Resource, ns: str | None, body: Any) -> Obj:
        obj = self._check_body(res, ns, body)
        meta = obj["metadata"]
        if meta.get("resourceVersion"):
            raise APIError(500, "InternalError", "resourceVersion should not be set on objects to be created")
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "managedFields",
            "selfLink",
        ):
            meta.pop(key, None)
        if res.has_status:
            obj.pop("status", None)
        if res.kind == "Pod":
            obj["status"] = {"phase": "Pending"}
        elif res.kind == "Namespace":
            obj["status"] = {"phase": "Active"}
        self._normalize(res, obj)
        with self.lock:
            if res.namespaced and ("", ns) not in self.objects["namespaces"]:
                raise APIError(
                    404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"}
                )
            if not meta.get("name"):
                base = meta.get("generateName")
                if not base:
                    raise invalid(
                        res, "", [("metadata.name", "Required value: name or generateName is required")]
                    )
                for _ in range(8):
                    name = base[:GENERATE_NAME_MAX_BASE] + "".join(
                        secrets.choice(GENERATE_NAME_ALPHABET) for _ in range(5)
                    )
                    if (ns or "", name) not in self.objects[res.key]:
                        break
                meta["name"] = name
            name = meta["name"]
            causes = validate(res, obj, None)
            if causes:
                raise invalid(res, name, causes)
            if (ns or "", name) in self.objects[res.key]:
                raise already_exists(res, name)
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            if res.has_generation:
                meta["generation"] = 1
            return self._commit(res, "ADDED", obj, None)

    def update(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        subresource: str,
        mutate: Callable[[Obj], Any],
        *,
        is_patch: bool = False,
    ) -> Obj:
        """PUT/PATCH core: ``mutate`` maps the live object to the requested one; strategy applies."""
        with self.lock:
            old = self.objects[res.key].get((ns or "", name))
            if old is None:
                raise not_found(res, name)
            cand = mutate(copy.deepcopy(old))
            cand = self._check_body(res, ns, cand)
            cmeta = cand["metadata"]
            if cmeta.get("name", name if is_patch else None) != name:
                raise bad_request(
                    f"the name of the object ({cmeta.get('name')}) does not match the name on the URL ({name})"
                )
            ometa = old["metadata"]
            if cmeta.get("resourceVersion") and cmeta["resourceVersion"] != ometa["resourceVersion"]:
                raise conflict(
                    res,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
            if cmeta.get("uid") and cmeta["uid"] != ometa["uid"] and is_patch:
                # a patched object carries the new uid into validation: metadata.uid is immutable
                raise invalid(
                    res,
                    name,
                    [("metadata.uid", f"Invalid value: {json.dumps(cmeta['uid'])}: field is immutable")],
                )
            if cmeta.get("uid") and cmeta["uid"] != ometa["uid"]:  # PUT: the body's uid is a precondition
                raise conflict(
                    res,
                    name,
                    f"Precondition failed: UID in precondition: {cmeta['uid']}, UID in object meta: {ometa['uid']}",
                )
            new = self._prepare_update(res, old, cand, subresource)
            self._normalize(res, new)
            causes = validate(res, new, old)
            if causes:
                raise invalid(res, name, causes)
            if new == old:
                return copy.deepcopy(old)  # a no-op update writes nothing and keeps the resourceVersion
            if res.has_generation and _spec_part(new) != _spec_part(old):
                new["metadata"]["generation"] = int(ometa.get("generation", 1)) + 1
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                gone = self._commit(res, "DELETED", new, old)
                self._collect_garbage(gone["metadata"]["uid"])
                return gone
            return self._commit(res, "MODIFIED", new, old)

    def delete(self, res: Resource, ns: str | None, name: str, options: Obj) -> Obj:
        with self.lock:
            old = self.objects[res.key].get((ns or "", name))
            if old is None:
                raise not_found(res, name)
            pre = options.get("preconditions") or {}
            ometa = old["metadata"]
            if pre.get("uid") and pre["uid"] != ometa["uid"]:
                raise conflict(
                    res,
                    name,
                    f"Precondition failed: UID in precondition: {pre['uid']}, UID in object meta: {ometa['uid']}",
                )
            if pre.get("resourceVersion") and pre["resourceVersion"] != ometa["resourceVersion"]:
                raise conflict(
                    res,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {pre['resourceVersion']}, ResourceVersion in object meta: {ometa['resourceVersion']}",
                )
            if ometa.get("finalizers"):
                if ometa.get("deletionTimestamp"):
                    return copy.deepcopy(old)
                new = copy.deepcopy(old)
                new["metadata"]["deletionTimestamp"] = _now()
                new["metadata"]["deletionGracePeriodSeconds"] = 0
                return self._commit(res, "MODIFIED", new, old)
            gone = self._commit(res, "DELETED", copy.deepcopy(old), old)
            if options.get("propagationPolicy") != "Orphan":
                self._collect_garbage(gone["metadata"]["uid"])
            return gone

    def delete_collection(self, sel: Selector, options: Obj) -> Obj:
        with self.lock:
            doomed = [o for _, o in sorted(self.objects[sel.res.key].items()) if sel.matches(o)]
            items = []
            for obj in doomed:
                meta = obj["metadata"]
                if (
                    meta.get("namespace", "") if sel.res.namespaced else "",
                    meta["name"],
                ) not in self.objects[sel.res.key]:
                    continue  # already collected as a dependent of an earlier item
                item = self.delete(sel.res, meta.get("namespace"), meta["name"], options)
                item.pop("kind", None)
                item.pop("apiVersion", None)
                items.append(item)
            return {
                "kind": f"{sel.res.kind}List",
                "apiVersion": sel.res.api_version,
                "metadata": {"resourceVersion": str(self.rv)},
                "items": items,
            }

    def apply(
        self,
        res: Resource,
        ns: str | None,
        name: str,
        subresource: str,
        applied: Any,
        *,
        manager: str,
        force: bool,
    ) -> Obj:
        """Server-side apply with a simplified field-ownership model (apply managers only)."""
        if not isinstance(applied, dict):
            raise bad_request("apply patch must be an object")
        if not applied.get("kind") or not applied.get("apiVersion"):
            raise bad_request(
                f"Object 'Kind' or 'apiVersion' is missing in apply configuration for {res.qualified} \"{name}\""
            )
        ameta = applied.get("metadata") or {}
        if ameta.get("name", name) != name:
            raise bad_request(
                f"the name of the object ({ameta.get('name')}) does not match the name on the URL ({name})"
            )
        scope = self._apply_scope(res, applied, subresource)
        new_paths = ssa_field_paths(scope)
        with self.lock:
            live = self.objects[res.key].get((ns or "", name))
            if live is None:
                if subresource:
                    raise not_found(res, name)
                created = self.create(
                    res, ns, {**ssa_merge({}, scope), "metadata": {**scope.get("metadata", {}), "name": name}}
                )
                self.owners[created["metadata"]["uid"]] = {(manager, subresource): new_paths}
                return created
            owners = self.owners.setdefault(live["metadata"]["uid"], {})
            conflicts: list[tuple[str, FieldPath]] = []
            for (other, other_sub), paths in owners.items():
                if (other, other_sub) == (manager, subresource):
                    continue
                for fp in sorted(new_paths & paths, key=_render_path):
                    if isinstance(fp[-1], str) and _path_get(live, fp) != _path_get(scope, fp):
                        if force:
                            paths.discard(fp)
                        else:
                            conflicts.append((other, fp))
            if conflicts:
                raise APIError(
                    409,
                    "Conflict",
                    f"Apply failed with {len(conflicts)} conflict(s): "
                    + "; ".join(f'conflict with "{m}": {_render_path(fp)}' for m, fp in conflicts),
                    {
                        "name": name,
                        "kind": res.plural,
                        "causes": [
                            {
                                "reason": "FieldManagerConflict",
                                "message": f'conflict with "{m}"',
                                "field": _render_path(fp),
                            }
                            for m, fp in conflicts
                        ],
                    },
                )
            stale = owners.get((manager, subresource), set()) - new_paths
            others = set().union(*(p for k, p in owners.items() if k != (manager, subresource)))

            def mutate(obj: Obj) -> Obj:
                merged: Obj = ssa_merge(obj, scope)
                if ameta.get("uid"):
                    merged["metadata"]["uid"] = ameta["uid"]
                for fp in sorted(stale, key=len):
                    if not any(o[: len(fp)] == fp for o in others):
                        _path_remove(merged, fp)
                return merged

            result = self.update(res, ns, name, subresource, mutate, is_patch=True)
            owners[(manager, subresource)] = new_paths
            return result

    def put_raw(self, res: Resource, obj: Obj) -> Obj:
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") if res.namespaced else None
        with self.lock:
            if (ns or "", meta.get("name", "")) not in self.objects[res.key]:
                body = copy.deepcopy(obj)
                body["metadata"].pop("resourceVersion", None)
                return self.create(res, ns, body)
            return self.update(
                res,
                ns,
                meta["name"],
                "",
                lambda old: {**copy.deepcopy(obj), "metadata": {**obj["metadata"], "resourceVersion": ""}},
            )

    # ---- watches

    def watch(
        self, sel: Selector, rv_param: str | None, *, bookmarks: bool, initial_events: bool | None
    ) -> _Watcher:
        """Register a watcher; its queue already holds the replayed or synthetic events."""
        watcher = _Watcher(sel, bookmarks)
        with self.lock:
            if not self.accepting_watches:
                watcher.queue.put(None)
                return watcher
            if initial_events or (initial_events is None and rv_param in (None, "", "0")):
                for _, obj in sorted(self.objects[sel.res.key].items()):
                    if sel.matches(obj):
                        watcher.queue.put({"type": "ADDED", "object": copy.deepcopy(obj)})
                if initial_events:
                    watcher.queue.put(self._bookmark(sel.res, {"k8s.io/initial-events-end": "true"}))
            elif rv_param in (None, "", "0"):
                pass  # sendInitialEvents=false without a version: start at the most recent state
            else:
                try:
                    since = int(rv_param or "0")
                except ValueError as exc:
                    raise bad_request(f"invalid resource version: {rv_param}") from exc
                if since < self.floor:
                    gone = APIError(410, "Expired", f"too old resource version: {since} ({self.floor + 1})")
                    watcher.queue.put({"type": "ERROR", "object": gone.status()})
                    watcher.queue.put(None)
                    return watcher
                for ev in self.history:
                    if ev.rv > since and (out := _watch_event(ev, sel)) is not None:
                        watcher.queue.put(out)
            self.watchers.add(watcher)
        return watcher

    def request_bookmark(self, watcher: _Watcher) -> None:
        with self.lock:  # under the lock: every event up to self.rv is already queued
            if watcher in self.watchers:
                watcher.queue.put(self._bookmark(watcher.sel.res, None))

    def unwatch(self, watcher: _Watcher) -> None:
        with self.lock:
            self.watchers.discard(watcher)

    def close_watchers(self, *, accept_new: bool) -> None:
        with self.lock:
            self.accepting_watches = accept_new
            for watcher in self.watchers:
                watcher.queue.put(None)
            self.watchers.clear()

    def compact(self) -> None:
        with self.lock:
            self.history.clear()
            self.floor = self.rv

    # ---- internals

    def _collect_garbage(self, owner_uid: str) -> None:
        """The garbage collector, done at once: delete dependents whose owners are all gone."""
        live = {o["metadata"]["uid"] for store in self.objects.values() for o in store.values()}
        for res in RESOURCES:
            for obj in list(self.objects[res.key].values()):
                refs = obj["metadata"].get("ownerReferences") or []
                uids = {r.get("uid") for r in refs}
                if owner_uid in uids and not uids & live:
                    meta = obj["metadata"]
                    with contextlib.suppress(APIError):  # a cascade may have taken it already
                        self.delete(res, meta.get("namespace"), meta["name"], {})

    def _bookmark(self, res: Resource, annotations: dict[str, str] | None) -> Obj:
        meta: Obj = {"resourceVersion": str(self.rv)}
        if annotations:
            meta["annotations"] = annotations
        return {
            "type": "BOOKMARK",
            "object": {"kind": res.kind, "apiVersion": res.api_version, "metadata": meta},
        }

    def _commit(self, res: Resource, kind: str, obj: Obj, prev: Obj | None) -> Obj:
        self.rv += 1
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        obj["metadata"]["resourceVersion"] = str(self.rv)
        meta = obj["metadata"]
        key = (meta.get("namespace", "") if res.namespaced else "", meta["name"])
        if kind == "DELETED":
            self.objects[res.key].pop(key, None)
            self.owners.pop(meta.get("uid", ""), None)
        else:
            self.objects[res.key][key] = obj
        stored = copy.deepcopy(obj)
        ev = _Event(self.rv, res, kind, stored, copy.deepcopy(prev) if prev is not None else None)
        self.history.append(ev)
        while len(self.history) > self.history_limit:
            self.floor = self.history.popleft().rv
        for watcher in self.watchers:
            if (out := _watch_event(ev, watcher.sel)) is not None:
                watcher.queue.put(out)
        return copy.deepcopy(obj)

    def _check_body(self, res: Resource, ns: str | None, body: Any) -> Obj:
        if not isinstance(body, dict):
            raise bad_request(f"the body of the request was not a {res.kind} object")
        obj = copy.deepcopy(body)
        if obj.get("kind") and obj["kind"] != res.kind:
            raise bad_request(
                f"the kind of the object ({obj['kind']}) does not match the kind of the request ({res.kind})"
            )
        if obj.get("apiVersion") and obj["apiVersion"] != res.api_version:
            raise bad_request(
                f"the API version in the data ({obj['apiVersion']}) does not match the expected API version ({res.api_version})"
            )
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if res.namespaced:
            if meta.get("namespace") and meta["namespace"] != ns:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = ns
        else:
            meta.pop("namespace", None)
        obj["kind"], obj["apiVersion"] = res.kind, res.api_version
        return obj

    def _prepare_update(self, res: Resource, old: Obj, cand: Obj, subresource: str) -> Obj:
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in cand:
                new["status"] = cand["status"]
            else:
                new.pop("status", None)
            return new
        new = cand
        meta, ometa = new["metadata"], old["metadata"]
        for key in (
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "resourceVersion",
        ):
            if key in ometa:
                meta[key] = ometa[key]
            else:
                meta.pop(key, None)
        meta.pop("managedFields", None)
        if res.has_status:
            if "status" in old:
                new["status"] = copy.deepcopy(old["status"])
            else:
                new.pop("status", None)
        return new

    def _normalize(self, res: Resource, obj: Obj) -> None:
        if res.kind == "ResourceSlice" and self.drop_partitionable:
            drop_partitionable(obj)
        canonicalize_quantities(res, obj)

    @staticmethod
    def _apply_scope(res: Resource, applied: Obj, subresource: str) -> Obj:
        if subresource == "status":
            return {"status": copy.deepcopy(applied.get("status") or {})}
        scope = {
            k: copy.deepcopy(v) for k, v in applied.items() if k not in ("kind", "apiVersion", "metadata")
        }
        if res.has_status:
            scope.pop("status", None)
        meta = {
            k: copy.deepcopy(v)
            for k, v in (applied.get("metadata") or {}).items()
            if k in ("labels", "annotations", "ownerReferences", "finalizers")
        }
        if meta:
            scope["metadata"] = meta
        return scope


# --------------------------------------------------------------------------- HTTP


def _discovery_resources(group: str, version: str) -> list[Obj]:
    out: list[Obj] = []
    for res in RESOURCES:
        if (res.group, res.version) != (group, version):
            continue
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        out.append(
            {
                "name": res.plural,
                "singularName": res.kind.lower(),
                "namespaced": res.namespaced,
                "kind": res.kind,
                "verbs": verbs,
                "shortNames": list(res.short_names),
            }
        )
        if res.has_status:
            out.append(
                {
                    "name": f"{res.plural}/status",
                    "singularName": "",
                    "namespaced": res.namespaced,
                    "kind": res.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
    return out


_GROUPS = sorted({(r.group, r.version) for r in RESOURCES if r.group})


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], owner: FakeAPIServer) -> None:
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(addr, _Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client (or stop()) closed the connection: not the fake's problem
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        # headers and body go out in two writes: without NODELAY, Nagle + delayed ACK add 40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self.server.conn_lock:
            self.server.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.conn_lock:
            self.server.connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def do_PUT(self) -> None:
        self._handle("PUT")

    def do_PATCH(self) -> None:
        self._handle("PATCH")

    def do_DELETE(self) -> None:
        self._handle("DELETE")

    # ---- plumbing

    def _handle(self, method: str) -> None:
        owner = self.server.owner
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        owner._record(method, parts.path)
        try:
            if owner._down:
                raise APIError(503, "ServiceUnavailable", "the fake apiserver is down (set_down)")
            if query.get("dryRun"):
                raise bad_request("dryRun is not supported by the fake apiserver (it would have written)")
            self._route(method, parts.path, query, raw)
        except APIError as err:
            self._send_json(err.code, err.status())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as exc:  # a bug in the fake must still answer like an apiserver
            self._send_json(500, APIError(500, "InternalError", f"Internal error occurred: {exc!r}").status())

    def _send_json(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self, raw: bytes, *, yaml_ok: bool = False) -> Any:
        try:
            if yaml_ok:
                return yaml.safe_load(raw.decode() or "{}")
            return json.loads(raw.decode() or "null")
        except (ValueError, yaml.YAMLError) as exc:
            raise bad_request(f"error decoding request body: {exc}") from exc

    # ---- routing

    def _route(self, method: str, path: str, query: dict[str, str], raw: bytes) -> None:
        owner = self.server.owner
        if path in ("/healthz", "/readyz", "/livez"):
            self._send_text(200, "ok")
            return
        if path.rstrip("/") == "/version":
            self._send_json(200, SERVER_VERSION)
            return
        segs = [unquote(s) for s in path.strip("/").split("/")] if path.strip("/") else []
        if segs == ["api"]:
            self._send_json(
                200,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": owner.url.removeprefix("http://")}
                    ],
                },
            )
            return
        if segs == ["apis"]:
            groups = [
                {
                    "name": g,
                    "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                    "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v},
                }
                for g, v in _GROUPS
            ]
            self._send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            return
        if len(segs) >= 2 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        if (group, version) not in _GROUPS and (group, version) != ("", "v1"):
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        if not rest:
            gv = version if not group else f"{group}/{version}"
            self._send_json(
                200,
                {
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": gv,
                    "resources": _discovery_resources(group, version),
                },
            )
            return
        ns: str | None = None
        if (
            rest[0] == "namespaces"
            and len(rest) >= 3
            and (res3 := _BY_PATH.get((group, version, rest[2]))) is not None
            and res3.namespaced
        ):
            ns, rest = rest[1], rest[2:]
        res = _BY_PATH.get((group, version, rest[0]))
        if res is None or len(rest) > 3 or (res.namespaced and ns is None and len(rest) > 1):
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub and not (sub == "status" and res.has_status):
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        if name is None:
            self._collection(method, res, ns, query, raw)
        else:
            self._item(method, res, ns, name, sub=sub, query=query, raw=raw)

    def _selector(self, res: Resource, ns: str | None, query: dict[str, str]) -> Selector:
        labels = tuple(parse_label_selector(query.get("labelSelector", "")))
        fields = tuple(parse_field_selector(res, query.get("fieldSelector", "")))
        return Selector(res, ns, labels, fields)

    def _collection(
        self, method: str, res: Resource, ns: str | None, query: dict[str, str], raw: bytes
    ) -> None:
        store = self.server.owner._store
        if method == "GET":
            sel = self._selector(res, ns, query)
            if query.get("watch", "").lower() in ("true", "1"):
                self._watch(sel, query)
            else:
                self._send_json(200, store.list(sel))
        elif method == "POST":
            if res.namespaced and ns is None:
                raise APIError(
                    405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
                )
            self._send_json(201, store.create(res, ns, self._body(raw)))
        elif method == "DELETE":
            options = self._body(raw) or {}
            self._send_json(
                200,
                store.delete_collection(
                    self._selector(res, ns, query), options if isinstance(options, dict) else {}
                ),
            )
        else:
            raise APIError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )

    def _item(
        self,
        method: str,
        res: Resource,
        ns: str | None,
        name: str,
        *,
        sub: str,
        query: dict[str, str],
        raw: bytes,
    ) -> None:
        store = self.server.owner._store
        if method == "GET":
            self._send_json(200, store.get(res, ns, name))
        elif method == "PUT":
            body = self._body(raw)
            self._send_json(200, store.update(res, ns, name, sub, lambda _old: body))
        elif method == "PATCH":
            self._send_json(200, self._patch(res, ns, name, sub=sub, query=query, raw=raw))
        elif method == "DELETE" and not sub:
            options = self._body(raw) or {}
            out = store.delete(res, ns, name, options if isinstance(options, dict) else {})
            pending = (
                bool(out["metadata"].get("deletionTimestamp"))
                and store.objects[res.key].get((ns or "", name)) is not None
            )
            if res.returns_deleted:
                self._send_json(202 if pending else 200, out)
            else:
                details = {**_details(res, name), "uid": out["metadata"]["uid"]}
                self._send_json(
                    202 if pending else 200,
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Success",
                        "details": details,
                    },
                )
        else:
            raise APIError(
                405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
            )

    def _patch(
        self, res: Resource, ns: str | None, name: str, *, sub: str, query: dict[str, str], raw: bytes
    ) -> Obj:
        store = self.server.owner._store
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/apply-patch+yaml":
            manager = query.get("fieldManager")
            if not manager:
                raise bad_request("PATCH, application/apply-patch+yaml requires fieldManager to be set")
            force = query.get("force", "").lower() in ("true", "1")
            return store.apply(
                res, ns, name, sub, self._body(raw, yaml_ok=True), manager=manager, force=force
            )
        patch = self._body(raw)
        if ctype == "application/merge-patch+json":
            return store.update(res, ns, name, sub, lambda old: merge_patch(old, patch), is_patch=True)
        if ctype == "application/strategic-merge-patch+json":
            if isinstance(patch, list):
                raise bad_request("strategic merge patch must be a JSON object")
            return store.update(
                res, ns, name, sub, lambda old: strategic_merge_patch(old, patch), is_patch=True
            )
        if ctype == "application/json-patch+json":
            return store.update(res, ns, name, sub, lambda old: json_patch(old, patch), is_patch=True)
        raise APIError(
            415,
            "UnsupportedMediaType",
            f"the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ctype!r})",
        )

    def _watch(self, sel: Selector, query: dict[str, str]) -> None:
        store = self.server.owner._store
        try:
            timeout = (
                float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else DEFAULT_WATCH_TIMEOUT_S
            )
        except ValueError as exc:
            raise bad_request(f"invalid timeoutSeconds: {query['timeoutSeconds']}") from exc
        bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1")
        initial = {"true": True, "false": False}.get(query.get("sendInitialEvents", "").lower())
        if initial and not bookmarks:
            raise invalid(
                sel.res,
                "",
                [
                    (
                        "allowWatchBookmarks",
                        "Required value: allowWatchBookmarks must be true if sendInitialEvents = true",
                    )
                ],
            )
        watcher = store.watch(sel, query.get("resourceVersion"), bookmarks=bookmarks, initial_events=initial)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True
        deadline = time.monotonic() + timeout
        last_bookmark = time.monotonic()
        try:
            while (remaining := deadline - time.monotonic()) > 0:
                wait = min(remaining, BOOKMARK_INTERVAL_S) if bookmarks else remaining
                try:
                    item = watcher.queue.get(timeout=wait)
                except queue.Empty:
                    if bookmarks and time.monotonic() - last_bookmark >= BOOKMARK_INTERVAL_S:
                        store.request_bookmark(watcher)
                        last_bookmark = time.monotonic()
                    continue
                if item is None:
                    break
                data = (json.dumps(item) + "\n").encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            pass
        finally:
            store.unwatch(watcher)


# --------------------------------------------------------------------------- public API


class FakeAPIServer:
    """A fake kube-apiserver on a real socket, for the official ``kubernetes`` client.

    **Parameters:**

    * **host**, **port** - where to listen (port 0 picks a free port).
    * **watch_history** - how many past changes a watch can resume from before 410 Gone.
    * **drop_partitionable_fields** - behave like an apiserver with DRAPartitionableDevices off.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        watch_history: int = 1000,
        drop_partitionable_fields: bool = False,
    ) -> None:
        self._host = host
        self._port = port
        self._store = _Store(watch_history)
        self._store.drop_partitionable = drop_partitionable_fields
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._down = False
        self._log: list[tuple[str, str]] = []
        self._log_lock = threading.Lock()
        self.url = ""

    @property
    def drop_partitionable_fields(self) -> bool:
        return self._store.drop_partitionable

    @drop_partitionable_fields.setter
    def drop_partitionable_fields(self, value: bool) -> None:
        self._store.drop_partitionable = value

    def start(self) -> FakeAPIServer:
        self._httpd = _HTTPServer((self._host, self._port), self)
        port = self._httpd.server_address[1]
        self.url = f"http://{self._host}:{port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"fake-apiserver-{port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener, end open watch streams and drop open connections."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self._store.close_watchers(accept_new=False)
        httpd.shutdown()
        httpd.server_close()
        with httpd.conn_lock:
            conns = list(httpd.connections)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FakeAPIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def write_kubeconfig(self, path: Path) -> Path:
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "fake", "user": {"token": "fake-token"}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
            "current-context": "fake",
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config))
        return path

    def api_client(self) -> kubernetes.client.ApiClient:
        cfg = kubernetes.client.Configuration()
        cfg.host = self.url
        return kubernetes.client.ApiClient(cfg)

    def set_down(self, down: bool) -> None:
        """While down every request gets 503 ServiceUnavailable; going down ends open watches."""
        self._down = down
        self._store.close_watchers(accept_new=not down)

    def compact(self) -> None:
        """Forget the watch history: watches from any older resourceVersion get 410 Gone."""
        self._store.compact()

    def request_log(self) -> list[tuple[str, str]]:
        with self._log_lock:
            return list(self._log)

    def clear_request_log(self) -> None:
        with self._log_lock:
            self._log.clear()

    def get_object(self, resource: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The stored object (a copy), or None; ``resource`` is a plural or ``plural.group``."""
        res = self._resource(resource)
        try:
            return self._store.get(res, namespace if res.namespaced else None, name)
        except APIError:
            return None

    def put_object(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or unconditionally replace an object (validation and watch events included)."""
        return self._store.put_raw(self._resource(resource), obj)

    def resource_version(self) -> int:
        """The current global resourceVersion."""
        with self._store.lock:
            return self._store.rv

    def _resource(self, resource: str) -> Resource:
        res = _BY_KEY.get(resource) or next((r for r in RESOURCES if r.plural == resource), None)
        if res is None:
            raise KeyError(f"unknown resource {resource!r}; known: {sorted(_BY_KEY)}")
        return res

    def _record(self, method: str, path: str) -> None:
        with self._log_lock:
            self._log.append((method, path))


def main(argv: list[str] | None = None) -> int:
    """Run the fake apiserver until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m dra_driver.testing.fake_apiserver",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="listen port (default 0 = pick a free port)")
    parser.add_argument(
        "--kubeconfig-out", type=Path, default=None, help="write a kubeconfig for this server here"
    )
    parser.add_argument(
        "--watch-history", type=int, default=1000, help="changes kept for watch resumption (default 1000)"
    )
    parser.add_argument(
        "--drop-partitionable-fields", action="store_true", help="act as if DRAPartitionableDevices were off"
    )
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    srv = FakeAPIServer(
        args.host,
        args.port,
        watch_history=args.watch_history,
        drop_partitionable_fields=args.drop_partitionable_fields,
    ).start()
    if args.kubeconfig_out:
        srv.write_kubeconfig(args.kubeconfig_out)
    print(srv.url, flush=True)
    try:
        done.wait()
    finally:
        srv.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

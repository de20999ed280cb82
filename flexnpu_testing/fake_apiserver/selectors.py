"""Label and field selectors of list and watch requests (k8s.io/apimachinery grammar)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from flexnpu_testing.fake_apiserver.resources import Obj, Resource, bad_request

LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


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

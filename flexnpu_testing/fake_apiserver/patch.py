"""Merge, strategic-merge, JSON and server-side-apply patches, as a real apiserver applies them."""

from __future__ import annotations

import copy
import json
from typing import Any

from flexnpu_testing.fake_apiserver.resources import APIError, bad_request

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


def path_get(obj: Any, fp: FieldPath) -> Any:
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


def path_remove(obj: Any, fp: FieldPath) -> None:
    parent = path_get(obj, fp[:-1])
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
            grand = path_get(obj, fp[:-2])
            if isinstance(grand, dict) and isinstance(fp[-2], str):
                grand.pop(fp[-2], None)


def render_path(fp: FieldPath) -> str:
    parts = []
    for elem in fp:
        if isinstance(elem, str):
            parts.append(f".{elem}")
        else:
            parts.append("[" + ",".join(f"{k}={json.dumps(v)}" for k, v in elem if v is not None) + "]")
    return "".join(parts)

"""All objects, the global resourceVersion, the watch history and the watchers, under one lock.

Implements the storage strategy of each verb (create, update, delete with preconditions and
finalizers, server-side apply ownership, the garbage collector) and what each watcher sees.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import queue
import secrets
import threading
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flexnpu_testing.fake_apiserver import webhooks
from flexnpu_testing.fake_apiserver.patch import (
    FieldPath,
    path_get,
    path_remove,
    render_path,
    ssa_field_paths,
    ssa_merge,
)
from flexnpu_testing.fake_apiserver.resources import (
    BY_KEY,
    RESOURCES,
    APIError,
    Obj,
    Resource,
    already_exists,
    bad_request,
    conflict,
    invalid,
    not_found,
)
from flexnpu_testing.fake_apiserver.selectors import Selector
from flexnpu_testing.fake_apiserver.validation import canonicalize_quantities, drop_partitionable, validate

GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery utilrand
GENERATE_NAME_MAX_BASE = 58
DEFAULT_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


@dataclass(frozen=True, slots=True)
class Change:
    rv: int
    res: Resource
    type: str
    obj: Obj
    prev: Obj | None


def watch_event(ev: Change, sel: Selector) -> Obj | None:
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
class Watcher:
    sel: Selector
    bookmarks: bool
    queue: queue.Queue[Obj | None] = field(default_factory=queue.Queue)


def _encode_continue(rv: int, key: tuple[str, str]) -> str:
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": list(key)}).encode()
    return base64.urlsafe_b64encode(raw).decode()


def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        doc = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(doc["rv"]), (str(doc["start"][0]), str(doc["start"][1]))
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise bad_request(f"continue key is not valid: {exc}") from exc


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _spec_part(obj: Obj) -> Obj:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "kind", "apiVersion")}


class Store:
    """All objects, the global resourceVersion, the watch history and the watchers; one lock."""

    def __init__(self, watch_history: int) -> None:
        self.lock = threading.RLock()
        self.objects: dict[str, dict[tuple[str, str], Obj]] = {r.key: {} for r in RESOURCES}
        self.rv = 0
        self.history: deque[Change] = deque()
        self.history_limit = watch_history
        self.floor = 0
        self.watchers: set[Watcher] = set()
        self.owners: dict[str, dict[tuple[str, str], set[FieldPath]]] = {}
        self.drop_partitionable = False
        self.accepting_watches = True  # False while down or stopped: new watches end at once
        self.webhooks = webhooks.Webhooks(
            lambda: [copy.deepcopy(o) for o in self.objects[webhooks.KEY].values()]
        )
        ns_res = BY_KEY["namespaces"]
        for ns in DEFAULT_NAMESPACES:
            self.create(ns_res, None, {"metadata": {"name": ns}})

    # ---- reads

    def get(self, res: Resource, ns: str | None, name: str) -> Obj:
        with self.lock:
            obj = self.objects[res.key].get((ns or "", name))
            if obj is None:
                raise not_found(res, name)
            return copy.deepcopy(obj)

    def list(self, sel: Selector, *, limit: int = 0, continue_token: str = "") -> Obj:
        """Matching objects in key order; ``limit`` pages them with a ``continue`` token.

        A continued list answers at the first page's resourceVersion with the objects after
        the token's key as they are now (a real apiserver reads a snapshot at that version).
        A token older than the watch history is 410 Expired, as after a compaction.
        """
        start: tuple[str, str] | None = None
        list_rv: int | None = None
        if continue_token:
            list_rv, start = _decode_continue(continue_token)
        with self.lock:
            if list_rv is not None and list_rv < self.floor:
                raise APIError(
                    410,
                    "Expired",
                    "The provided continue parameter is too old to display a consistent list result.",
                )
            keys = sorted(self.objects[sel.res.key])
            matched: list[tuple[tuple[str, str], Obj]] = []
            remaining = 0
            for key in keys:
                if start is not None and key <= start:
                    continue
                obj = self.objects[sel.res.key][key]
                if not sel.matches(obj):
                    continue
                if limit and len(matched) >= limit:
                    remaining += 1
                    continue
                matched.append((key, copy.deepcopy(obj)))
            rv = self.rv if list_rv is None else list_rv
        items = [o for _, o in matched]
        for item in items:  # typed lists carry kind/apiVersion only on the list
            item.pop("kind", None)
            item.pop("apiVersion", None)
        meta: Obj = {"resourceVersion": str(rv)}
        if remaining:
            meta["continue"] = _encode_continue(rv, matched[-1][0])
            meta["remainingItemCount"] = remaining
        return {
            "kind": f"{sel.res.kind}List",
            "apiVersion": sel.res.api_version,
            "metadata": meta,
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
            self.webhooks.check(res, "CREATE", copy.deepcopy(obj), None)
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
            if not subresource:
                self.webhooks.check(res, "UPDATE", copy.deepcopy(new), copy.deepcopy(old))
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
                for fp in sorted(new_paths & paths, key=render_path):
                    if isinstance(fp[-1], str) and path_get(live, fp) != path_get(scope, fp):
                        if force:
                            paths.discard(fp)
                        else:
                            conflicts.append((other, fp))
            if conflicts:
                raise APIError(
                    409,
                    "Conflict",
                    f"Apply failed with {len(conflicts)} conflict(s): "
                    + "; ".join(f'conflict with "{m}": {render_path(fp)}' for m, fp in conflicts),
                    {
                        "name": name,
                        "kind": res.plural,
                        "causes": [
                            {
                                "reason": "FieldManagerConflict",
                                "message": f'conflict with "{m}"',
                                "field": render_path(fp),
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
                        path_remove(merged, fp)
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
    ) -> Watcher:
        """Register a watcher; its queue already holds the replayed or synthetic events."""
        watcher = Watcher(sel, bookmarks)
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
                    if ev.rv > since and (out := watch_event(ev, sel)) is not None:
                        watcher.queue.put(out)
            self.watchers.add(watcher)
        return watcher

    def request_bookmark(self, watcher: Watcher) -> None:
        with self.lock:  # under the lock: every event up to self.rv is already queued
            if watcher in self.watchers:
                watcher.queue.put(self._bookmark(watcher.sel.res, None))

    def unwatch(self, watcher: Watcher) -> None:
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
        ev = Change(self.rv, res, kind, stored, copy.deepcopy(prev) if prev is not None else None)
        self.history.append(ev)
        while len(self.history) > self.history_limit:
            self.floor = self.history.popleft().rv
        for watcher in self.watchers:
            if (out := watch_event(ev, watcher.sel)) is not None:
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

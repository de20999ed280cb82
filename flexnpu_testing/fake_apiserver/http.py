"""The HTTP face: routing, discovery documents, JSON bodies, chunked watch streams.

Maps REST paths and verbs onto :class:`~flexnpu_testing.fake_apiserver.object_store.Store` and
answers every failure with a ``Status`` body, as a real apiserver does.
"""

from __future__ import annotations

import contextlib
import json
import queue
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

from flexnpu_testing.fake_apiserver import faults
from flexnpu_testing.fake_apiserver.patch import json_patch, merge_patch, strategic_merge_patch
from flexnpu_testing.fake_apiserver.resources import (
    BY_PATH,
    RESOURCES,
    APIError,
    Obj,
    Resource,
    bad_request,
    details_of,
    invalid,
)
from flexnpu_testing.fake_apiserver.selectors import Selector, parse_field_selector, parse_label_selector

if TYPE_CHECKING:
    from flexnpu_testing.fake_apiserver.harness import FakeAPIServer

BOOKMARK_INTERVAL_S = 1.0
DEFAULT_WATCH_TIMEOUT_S = 1800.0
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


GROUPS = sorted({(r.group, r.version) for r in RESOURCES if r.group})


class HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, addr: tuple[str, int], owner: FakeAPIServer) -> None:
        self.owner = owner
        self.connections: set[socket.socket] = set()
        self.conn_lock = threading.Lock()
        super().__init__(addr, Handler)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a client (or stop()) closed the connection: not the fake's problem
        super().handle_error(request, client_address)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HTTPServer

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
                for g, v in GROUPS
            ]
            self._send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            return
        if len(segs) >= 2 and segs[0] == "api":
            group, version, rest = "", segs[1], segs[2:]
        elif len(segs) >= 3 and segs[0] == "apis":
            group, version, rest = segs[1], segs[2], segs[3:]
        else:
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        if (group, version) not in GROUPS and (group, version) != ("", "v1"):
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
            and (res3 := BY_PATH.get((group, version, rest[2]))) is not None
            and res3.namespaced
        ):
            ns, rest = rest[1], rest[2:]
        res = BY_PATH.get((group, version, rest[0]))
        if res is None or len(rest) > 3 or (res.namespaced and ns is None and len(rest) > 1):
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if sub and not (sub == "status" and res.has_status):
            raise APIError(404, "NotFound", "the server could not find the requested resource")
        if name is None:
            self._collection(method, res, ns, query, raw)
        elif (armed := owner._ambiguities.match(method=method, plural=res.plural, name=name)) is not None:
            self._ambiguous(armed[0], armed[1], res, ns, name)
        else:
            self._item(method, res, ns, name, sub=sub, query=query, raw=raw)

    def _ambiguous(
        self, rule: faults.AmbiguityRule, released: threading.Event, res: Resource, ns: str | None, name: str
    ) -> None:
        """Answer ``rule.mode`` instead of the stored object (see :mod:`.faults`)."""
        if rule.mode is faults.Ambiguity.TIMEOUT:
            left = None if rule.until is None else max(0.0, rule.until - time.monotonic())
            released.wait(left)  # held, never answered: the client's read timeout fires first
            self.close_connection = True
            return
        try:
            obj: Obj | None = self.server.owner._store.get(res, ns, name)
        except APIError:
            obj = None
        code, ctype, data = faults.body_for(rule.mode, obj=obj, name=name, namespace=ns)
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
                try:
                    limit = int(query.get("limit") or 0)
                except ValueError as exc:
                    raise bad_request(f"invalid limit: {query['limit']}") from exc
                self._send_json(
                    200, store.list(sel, limit=max(limit, 0), continue_token=query.get("continue", ""))
                )
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
                details = {**details_of(res, name), "uid": out["metadata"]["uid"]}
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

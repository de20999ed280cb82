"""The public face: :class:`FakeAPIServer` (start, stop, test hooks) and the standalone ``main``."""

from __future__ import annotations

import argparse
import contextlib
import copy
import socket
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import kubernetes.client
import yaml

from dra_driver.liveness import handle_signals
from flexnpu_testing.fake_apiserver import faults
from flexnpu_testing.fake_apiserver.http import HTTPServer
from flexnpu_testing.fake_apiserver.object_store import Store
from flexnpu_testing.fake_apiserver.resources import BY_KEY, RESOURCES, APIError, Resource


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
        self._store = Store(watch_history)
        self._store.drop_partitionable = drop_partitionable_fields
        self._httpd: HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._down = False
        self._ambiguities = faults.Ambiguities()
        self._log: list[tuple[str, str]] = []
        self._log_lock = threading.Lock()
        self.url = ""

    def route_service(self, namespace: str, name: str, port: int, *, to: tuple[str, int]) -> None:
        """Test hook: admission webhooks that name the Service ``namespace/name:port`` reach ``to``."""
        self._store.webhooks.route_service(namespace, name, port, to=to)

    @property
    def drop_partitionable_fields(self) -> bool:
        return self._store.drop_partitionable

    @drop_partitionable_fields.setter
    def drop_partitionable_fields(self, value: bool) -> None:
        self._store.drop_partitionable = value

    def start(self) -> FakeAPIServer:
        self._httpd = HTTPServer((self._host, self._port), self)
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
        self._ambiguities.disarm()
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

    def answer_ambiguously(
        self,
        mode: faults.Ambiguity | str,
        *,
        seconds: float | None = None,
        resource: str = "resourceclaims",
        method: str = "GET",
        names: Iterable[str] = (),
    ) -> None:
        """Answer ``method`` requests on items of ``resource`` with ``mode`` (see :mod:`.faults`).

        For ``seconds`` (then normal again), or until :meth:`answer_normally`; ``names`` limits
        it to those objects. List and watch requests are answered normally.
        """
        until = None if seconds is None else time.monotonic() + seconds
        self._ambiguities.arm(
            faults.AmbiguityRule(faults.Ambiguity(mode), resource, method, frozenset(names), until)
        )

    def answer_normally(self) -> None:
        """End :meth:`answer_ambiguously` now (held ``timeout`` requests are closed unanswered)."""
        self._ambiguities.disarm()

    @property
    def ambiguous_answers(self) -> int:
        """How many requests got an ambiguous answer so far."""
        return self._ambiguities.answered

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
        """Create or unconditionally replace an object (validation and watch events included).

        A ``status`` in ``obj`` is written too, through the status subresource (a second write,
        as a controller would do after creating the object).
        """
        res = self._resource(resource)
        stored = self._store.put_raw(res, obj)
        if res.has_status and "status" in obj and stored.get("status") != obj["status"]:
            meta = stored["metadata"]
            stored = self._store.update(
                res,
                meta.get("namespace") if res.namespaced else None,
                meta["name"],
                "status",
                lambda old: {**old, "status": copy.deepcopy(obj["status"])},
            )
        return stored

    def delete_object(self, resource: str, name: str, namespace: str | None = None) -> bool:
        """Delete an object as a DELETE request would (finalizers, GC, watch events); False if absent."""
        res = self._resource(resource)
        try:
            self._store.delete(res, namespace if res.namespaced else None, name, {})
        except APIError:
            return False
        return True

    def resource_version(self) -> int:
        """The current global resourceVersion."""
        with self._store.lock:
            return self._store.rv

    def _resource(self, resource: str) -> Resource:
        res = BY_KEY.get(resource) or next((r for r in RESOURCES if r.plural == resource), None)
        if res is None:
            raise KeyError(f"unknown resource {resource!r}; known: {sorted(BY_KEY)}")
        return res

    def _record(self, method: str, path: str) -> None:
        with self._log_lock:
            self._log.append((method, path))


def main(argv: list[str] | None = None) -> int:
    """Run the fake apiserver until SIGTERM/SIGINT."""
    parser = argparse.ArgumentParser(
        prog="python -m flexnpu_testing.fake_apiserver",
        description="An in-process fake Kubernetes API server that speaks the real REST and watch protocol.",
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
    handle_signals(lambda _signum: done.set())
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

"""The HTTP side of telemetry: the metrics port, ``GET /metrics`` and ``GET /healthz``.

This module owns the WSGI app (the Prometheus exposition of a registry, and the liveness verdict
on ``/healthz`` and ``/livez``), the threaded server it runs in, and binding the port — at once,
or in the background while the previous pod of a rolling update still holds it.
"""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from dra_driver.errors import ErrorCode, InvalidInput

PORT_RETRY_SECONDS: Final = 1.0

WsgiApp = Callable[..., Iterable[bytes]]
Verdict = Callable[[], tuple[bool, str]]


def wsgi_app(registry: CollectorRegistry, health: Callable[[], Verdict | None]) -> WsgiApp:
    """``/healthz`` from the current liveness verdict (``health()``), everything else the exposition."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, object], start_response: Callable[..., object]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") in ("/healthz", "/livez"):
            verdict = health()
            healthy, text = verdict() if verdict is not None else (True, "ok\n")
            status = "200 OK" if healthy else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [text.encode()]
        body: Iterable[bytes] = metrics(environ, start_response)
        return body

    return app


class MetricsEndpoint:
    """The metrics port of one process: bound by :meth:`start`, released by :meth:`stop`.

    With ``wait_for_port`` a port in use (``EADDRINUSE``, a fixed port only) is bound later, every
    ``PORT_RETRY_SECONDS``, instead of failing :meth:`start`.
    """

    def __init__(self, host: str, port: int, app: WsgiApp, *, wait_for_port: bool = False) -> None:
        self._host = host
        self._port = port
        self._app = app
        self._wait_for_port = wait_for_port
        self._lock = threading.Lock()
        self._stopped = False
        self._server: _Server | None = None
        self._retry: threading.Thread | None = None

    @property
    def port(self) -> int | None:
        """The bound port, or None while nothing is serving."""
        server = self._server
        return server.port if server else None

    def start(self) -> None:
        """Bind and serve; idempotent."""
        if self._stopped or self._server is not None or self._retry is not None:
            return
        try:
            self._server = _Server(self._host, self._port, self._app)
        except OSError as exc:
            if self._wait_for_port and exc.errno == errno.EADDRINUSE and self._port > 0:
                self._retry = threading.Thread(target=self._bind_later, name="metrics-bind", daemon=True)
                self._retry.start()
                return
            raise InvalidInput(
                f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror or exc}",
                code=ErrorCode.INVALID_CONFIG,
                field="metrics_port",
            ) from exc

    def stop(self) -> None:
        """Stop serving and give up a pending bind; idempotent."""
        with self._lock:
            self._stopped = True
            server, self._server = self._server, None
        if server is not None:
            server.stop()

    def _bind_later(self) -> None:
        """Bind the port once its holder (the previous pod of a rolling update) let it go."""
        stop = threading.Event()
        while not self._stopped:
            stop.wait(PORT_RETRY_SECONDS)  # a polled condition: the port becomes free
            try:
                server = _Server(self._host, self._port, self._app)
            except OSError:
                continue
            with self._lock:
                if self._stopped:
                    server.stop()
                    return
                self._server = server
            return


class _Server:
    """A threaded WSGI server for an app on ``host:port``, serving in a daemon thread."""

    def __init__(self, host: str, port: int, app: WsgiApp) -> None:
        class Server(ThreadingWSGIServer):
            address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

        self._httpd: WSGIServer = make_server(host, port, app, Server, handler_class=_QuietHandler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="metrics-http", daemon=True)
        self._thread.start()
        self.port = int(self._httpd.server_port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return

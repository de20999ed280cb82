"""The small HTTPS JSON server the webhook and the scheduler extender are served by.

A :class:`JsonHandler` subclass maps ``POST`` paths to functions of the decoded JSON body (their
answer is sent as JSON; a ``BadRequest`` they raise is a 400 with its reason) and ``GET`` paths to
text; :func:`serve` runs it (TLS 1.2+ when a certificate is given, which the API server and
kube-scheduler's ``enableHTTPS`` need) until ``stop`` is set. A body over ``MAX_BODY`` gets 413.

No client can stop it (issue 25, class 5: one idle TCP connection held the webhook's accept
thread in its TLS handshake): the accept thread only accepts. Each connection's TLS handshake runs
on that connection's own thread under one absolute deadline (:data:`HANDSHAKE_SECONDS`), every
read and write after it under :data:`IDLE_SECONDS`, and one peer address holds at most
:data:`MAX_CONNECTIONS_PER_PEER` connections (:data:`MAX_CONNECTIONS` in all); a connection over
either bound is closed at once, the others are served.
"""

from __future__ import annotations

import json
import logging
import select
import socket
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024
"""The API server's own request limit is 3 MiB; a review or an extender call is never larger."""

HANDSHAKE_SECONDS = 5.0
"""The whole TLS handshake of one connection, however the peer paces it."""
IDLE_SECONDS = 10.0
"""The longest one read or write of a connection may wait (the API server's own call timeout is 10 s)."""
MAX_CONNECTIONS_PER_PEER = 32
MAX_CONNECTIONS = 256

PostRoute = Callable[[Any, "JsonHandler"], Any]
GetRoute = Callable[[], tuple[str, str]]  # -> (content type, body)


class Unavailable(Exception):
    """A GET route is not ready to answer (e.g. ``/readyz`` before the caches listed): a 503 with this message."""


class BadRequest(ValueError):
    """The body is not what the route expects: a 400 with this message."""


class JsonHandler(BaseHTTPRequestHandler):
    """Routes set by :func:`serve` on the server: ``post_routes`` and ``get_routes``."""

    server: JsonServer
    protocol_version = "HTTP/1.1"
    timeout = IDLE_SECONDS
    disable_nagle_algorithm = True
    """No write waits for the client's delayed ACK (with Nagle, tens of ms a call on a kept-alive
    connection: the extender's p50 was 18 ms before)."""
    wbufsize = -1
    """Buffered: an answer's headers and body go out in one write (one TLS record) when the handler
    flushes after the call (``handle_one_request``), not one send for the headers and one for the body."""

    def log_message(self, format: str, *args: Any) -> None:
        if log.isEnabledFor(logging.DEBUG):  # every request passes here: nothing to format at info
            log.debug("%s %s " + format, self.server.name, self.address_string(), *args)

    def answer(self, status: HTTPStatus, body: Any, content_type: str = "application/json") -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        if isinstance(body, str) and content_type == "application/json":
            content_type = "text/plain"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        route = self.server.get_routes.get(self.path.split("?", 1)[0])
        if route is None:
            self.answer(HTTPStatus.NOT_FOUND, f"no route {self.path}\n")
            return
        try:
            content_type, body = route()
        except Unavailable as err:
            self.answer(HTTPStatus.SERVICE_UNAVAILABLE, f"{err}\n", "text/plain")
            return
        self.answer(HTTPStatus.OK, body, content_type)

    def do_POST(self) -> None:
        route = self.server.post_routes.get(self.path.split("?", 1)[0])
        if route is None:
            self.answer(HTTPStatus.NOT_FOUND, f"no route {self.path}\n")
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self.answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a request body is at most {MAX_BODY} bytes\n")
            return
        try:
            doc = json.loads(self.rfile.read(length) or b"null")
        except ValueError as err:
            self.answer(HTTPStatus.BAD_REQUEST, f"malformed {self.server.what}: not JSON: {err}\n")
            return
        try:
            result = route(doc, self)
        except BadRequest as err:
            log.warning(
                "%s: refused a malformed request from %s: %s", self.server.name, self.address_string(), err
            )
            self.answer(HTTPStatus.BAD_REQUEST, f"{err}\n")
            return
        self.answer(HTTPStatus.OK, result)


class JsonServer(ThreadingHTTPServer):
    daemon_threads = True
    name = "https"
    what = "request"  # in the 400 of a body that is not JSON: "malformed <what>: ..."
    post_routes: Mapping[str, PostRoute] = {}
    get_routes: Mapping[str, GetRoute] = {}
    tls: ssl.SSLContext | None = None

    def __init__(self, address: tuple[str, int], handler: type[JsonHandler]) -> None:
        super().__init__(address, handler)
        self._peers: Counter[str] = Counter()
        self._peers_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        """On the accept thread: count the connection against its peer's bound, then hand it to its own thread."""
        peer = _peer(client_address)
        with self._peers_lock:
            full = (
                self._peers[peer] >= MAX_CONNECTIONS_PER_PEER or sum(self._peers.values()) >= MAX_CONNECTIONS
            )
            if not full:
                self._peers[peer] += 1
        if full:
            log.warning("%s: refused a connection from %s: too many open connections", self.name, peer)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._release(_peer(client_address))

    def _release(self, peer: str) -> None:
        with self._peers_lock:
            self._peers[peer] -= 1
            if self._peers[peer] <= 0:
                del self._peers[peer]

    def finish_request(self, request: Any, client_address: Any) -> None:
        """On the connection's own thread: the TLS handshake (within its deadline), then the handler."""
        conn = request
        if self.tls is not None:
            try:
                conn = handshake(self.tls, request, deadline=time.monotonic() + HANDSHAKE_SECONDS)
            except (OSError, ssl.SSLError) as err:
                log.info("%s: no TLS handshake with %s: %s", self.name, client_address, err)
                return
        try:
            self.RequestHandlerClass(conn, client_address, self)  # type: ignore[arg-type]
        finally:
            if conn is not request:
                self.shutdown_request(conn)


def _peer(client_address: Any) -> str:
    return str(client_address[0]) if isinstance(client_address, tuple) else ""


def handshake(context: ssl.SSLContext, sock: socket.socket, *, deadline: float) -> ssl.SSLSocket:
    """``sock`` wrapped in TLS, its handshake done by ``deadline`` (``TimeoutError`` past it)."""
    sock.setblocking(False)
    tls = context.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    wait: tuple[list[ssl.SSLSocket], list[ssl.SSLSocket]]
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            wait = ([tls], [])
        except ssl.SSLWantWriteError:
            wait = ([], [tls])
        left = deadline - time.monotonic()
        if left <= 0 or not any(select.select(*wait, [], left)):
            tls.close()
            raise TimeoutError(f"the TLS handshake took longer than {HANDSHAKE_SECONDS:g} s")
    tls.settimeout(IDLE_SECONDS)
    return tls


def serve(
    *,
    name: str,
    what: str = "request",
    host: str,
    port: int,
    tls_cert: Path | None,
    tls_key: Path | None,
    post_routes: Mapping[str, PostRoute],
    get_routes: Mapping[str, GetRoute],
    stop: threading.Event,
    ready: threading.Event | None = None,
    bound: Callable[[int], None] | None = None,
) -> None:
    """Serve until ``stop`` is set; ``bound`` gets the port (0 binds a free one), ``ready`` is set then."""
    server = JsonServer((host, port), JsonHandler)
    server.name, server.what = name, what
    server.post_routes, server.get_routes = post_routes, get_routes
    if tls_cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(tls_cert, tls_key)
        server.tls = context  # each connection's handshake runs on its own thread (finish_request)
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    log.info(
        "%s: serving %s on %s:%d (%s)",
        name,
        ", ".join(sorted(post_routes)),
        host,
        server.server_address[1],
        "TLS" if tls_cert else "plain HTTP",
    )
    if bound is not None:
        bound(int(server.server_address[1]))
    if ready is not None:
        ready.set()
    stop.wait()
    server.shutdown()
    server.server_close()


def run_until_signal(body: Callable[[threading.Event], None], stop: threading.Event | None = None) -> int:
    """The process body of a server subcommand: ``body(stop)`` until SIGTERM/SIGINT."""
    from dra_driver.liveness import handle_signals

    stop = stop or threading.Event()
    handle_signals(lambda _signum: stop.set())
    body(stop)
    return 0

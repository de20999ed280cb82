"""The validating admission webhook for ``VnpuConfig`` (``flexnpu-dra webhook``): HTTPS, the API
server's ``AdmissionReview`` v1 JSON in and out, each review decided by the pure
:func:`dra_driver.admission.review`.

Why a webhook and not a ValidatingAdmissionPolicy: the opaque ``parameters`` are a
``runtime.RawExtension``, which the API server's OpenAPI describes as an object without
properties, so a policy's typed CEL cannot reach the fields inside; and a webhook runs the very
decoder prepare runs, so both say the same thing.

Routes: ``POST /validate`` (the review), ``GET /readyz`` (200 once serving). A body that is not an
``AdmissionReview`` gets 400 with the reason; a body over :data:`MAX_BODY` gets 413; the server
goes on serving.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from dra_driver import admission
from dra_driver.config import WebhookConfig
from dra_driver.errors import FlexNPUError

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024
"""The API server's own request limit is 3 MiB; a review is never larger."""
VALIDATE_PATH = "/validate"
READY_PATH = "/readyz"


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("webhook %s " + format, self.address_string(), *args)

    def _answer(self, status: HTTPStatus, body: dict[str, Any] | str) -> None:
        data = (json.dumps(body) if isinstance(body, dict) else body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json" if isinstance(body, dict) else "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == READY_PATH:
            self._answer(HTTPStatus.OK, "ok\n")
        else:
            self._answer(HTTPStatus.NOT_FOUND, f"no route {self.path}\n")

    def do_POST(self) -> None:
        if self.path.split("?", 1)[0] != VALIDATE_PATH:
            self._answer(HTTPStatus.NOT_FOUND, f"no route {self.path}\n")
            return
        try:
            length = int(self.headers.get("Content-Length") or "0")
        except ValueError:
            length = -1
        if length < 0 or length > MAX_BODY:
            self.close_connection = True
            self._answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"a review is at most {MAX_BODY} bytes\n")
            return
        try:
            doc = json.loads(self.rfile.read(length) or b"null")
            answer = admission.review(
                doc,
                driver_name=self.server.settings.driver_name,
                share_classes=self.server.settings.share_classes,
            )
        except (ValueError, FlexNPUError) as err:
            log.warning("webhook: refused a malformed review from %s: %s", self.address_string(), err)
            self._answer(HTTPStatus.BAD_REQUEST, f"malformed AdmissionReview: {err}\n")
            return
        response = answer["response"]
        if not response["allowed"]:
            log.info("webhook: denied %s: %s", response["uid"], response["status"]["message"])
        self._answer(HTTPStatus.OK, answer)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    settings: WebhookConfig


def serve(settings: WebhookConfig, *, ready: threading.Event | None = None, stop: threading.Event) -> None:
    """Serve until ``stop`` is set. TLS when a certificate is given (the API server requires it)."""
    server = _Server((settings.host, settings.port), _Handler)
    server.settings = settings
    if settings.tls_cert is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(settings.tls_cert, settings.tls_key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="webhook", daemon=True)
    thread.start()
    log.info(
        "webhook: serving %s on %s:%d (%s)",
        VALIDATE_PATH,
        settings.host,
        server.server_address[1],
        "TLS" if settings.tls_cert else "plain HTTP",
    )
    if ready is not None:
        ready.set()
    stop.wait()
    server.shutdown()
    server.server_close()


def run(settings: WebhookConfig, stop: threading.Event | None = None) -> int:
    """The process body of ``flexnpu-dra webhook``: serve until SIGTERM/SIGINT."""
    import signal

    stop = stop or threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    serve(settings, stop=stop)
    return 0

"""The validating admission webhook for ``VnpuConfig`` (``flexnpu-dra webhook``): HTTPS, the API
server's ``AdmissionReview`` v1 JSON in and out, each review decided by the pure
:func:`dra_driver.admission.review`.

Why a webhook and not a ValidatingAdmissionPolicy: the opaque ``parameters`` are a
``runtime.RawExtension``, which the API server's OpenAPI describes as an object without
properties, so a policy's typed CEL cannot reach the fields inside; and a webhook runs the very
decoder prepare runs, so both say the same thing.

Routes: ``POST /validate`` (the review), ``GET /readyz`` (200 once serving). A body that is not an
``AdmissionReview`` gets 400 with the reason; a body over :data:`MAX_BODY` gets 413; the server
goes on serving. The HTTPS JSON server is ``controller/https.py`` (the scheduler extender's too).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from controller import https
from controller.https import BadRequest, JsonHandler
from dra_driver import admission
from dra_driver.config import WebhookConfig
from dra_driver.errors import FlexNPUError

log = logging.getLogger(__name__)

MAX_BODY = https.MAX_BODY
VALIDATE_PATH = "/validate"
READY_PATH = "/readyz"


def _validate(settings: WebhookConfig) -> https.PostRoute:
    def route(doc: Any, handler: JsonHandler) -> Any:
        try:
            answer = admission.review(
                doc,
                driver_name=settings.driver_name,
                share_classes=settings.share_classes,
                host_memory=settings.host_memory,
            )
        except (ValueError, FlexNPUError) as err:
            raise BadRequest(f"malformed AdmissionReview: {err}") from err
        response = answer["response"]
        if not response["allowed"]:
            log.info("webhook: denied %s: %s", response["uid"], response["status"]["message"])
        return answer

    return route


def serve(settings: WebhookConfig, *, ready: threading.Event | None = None, stop: threading.Event) -> None:
    """Serve until ``stop`` is set. TLS when a certificate is given (the API server requires it)."""
    https.serve(
        name="webhook",
        what="AdmissionReview",
        host=settings.host,
        port=settings.port,
        tls_cert=settings.tls_cert,
        tls_key=settings.tls_key,
        post_routes={VALIDATE_PATH: _validate(settings)},
        get_routes={READY_PATH: lambda: ("text/plain", "ok\n")},
        stop=stop,
        ready=ready,
    )


def run(settings: WebhookConfig, stop: threading.Event | None = None) -> int:
    """The process body of ``flexnpu-dra webhook``: serve until SIGTERM/SIGINT."""
    return https.run_until_signal(lambda stop_: serve(settings, stop=stop_), stop)

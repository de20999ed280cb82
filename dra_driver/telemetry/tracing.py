"""Trace spans of the claim lifecycle: span names and attributes, the provider, OTLP export.

This module owns how a :class:`~dra_driver.telemetry.Telemetry` (and the scheduler extender) builds
its own ``TracerProvider`` (never the global one), the attribute names a claim's span carries and
the OTLP/HTTP (protobuf) exporter of ``--otlp-endpoint`` (``opentelemetry-exporter-otlp-proto-http``, a
dependency; batched by the SDK's ``BatchSpanProcessor``, whose ``OTEL_BSP_*`` variables apply). Finished
spans go to OTLP only: the process keeps none (tests attach a recorder to ``Tracing.provider``,
``flexnpu_testing/telemetry.py``).
"""

from __future__ import annotations

import urllib.parse
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from dra_driver.errors import ErrorCode, InvalidInput

SCOPE_NAME: Final = "dra_driver.telemetry"

ATTR_CLAIM_UID: Final = "flexnpu.claim.uid"
ATTR_CLAIM_NAMESPACE: Final = "flexnpu.claim.namespace"
ATTR_CLAIM_NAME: Final = "flexnpu.claim.name"
ATTR_ERROR_TYPE: Final = "error.type"

FLAG: Final = "otlp-endpoint"
"""The flag that sets the endpoint, which errors about it name (``dra_driver/config.py``)."""

EXPORT_TIMEOUT_SECONDS: Final = 5.0
"""How long one export (with its retries) may take: a collector that is down when the process stops
delays the stop by about this much (OpenTelemetry's default, 10 s, would take a third of the pod's
termination grace on top of the node's own stop)."""

TRACES_PATH: Final = "/v1/traces"
"""OTLP/HTTP's path for spans, added to an endpoint given without a path (as OpenTelemetry does to
``OTEL_EXPORTER_OTLP_ENDPOINT``)."""


class Tracing:
    """One process's tracer: its provider and, optionally, OTLP export."""

    def __init__(self, resource: Resource, otlp_endpoint: str = "") -> None:
        self.provider = TracerProvider(sampler=ALWAYS_ON, resource=resource, shutdown_on_exit=False)
        if otlp_endpoint:
            self.provider.add_span_processor(BatchSpanProcessor(otlp_exporter(otlp_endpoint)))
        self.tracer: trace.Tracer = self.provider.get_tracer(SCOPE_NAME)

    def shutdown(self) -> None:
        self.provider.shutdown()


def traces_url(endpoint: str) -> str:
    """The URL spans are POSTed to: ``endpoint`` itself when it has a path, else its ``/v1/traces``."""
    url = urllib.parse.urlsplit(endpoint)
    if url.path.strip("/"):
        return endpoint
    return urllib.parse.urlunsplit(url._replace(path=TRACES_PATH))


def otlp_exporter(endpoint: str) -> SpanExporter:
    """The OTLP/HTTP (protobuf) span exporter to ``endpoint`` (``--otlp-endpoint``).

    Raises InvalidInput (InvalidConfig) naming the flag when the exporter package is missing (an
    install without the project's dependencies) or refuses the endpoint: the process stops at start.
    """
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ImportError as err:
        raise InvalidInput(
            f"an OTLP endpoint was given but the exporter cannot be loaded ({err});"
            " install opentelemetry-exporter-otlp-proto-http",
            code=ErrorCode.INVALID_CONFIG,
            field=FLAG,
        ) from None
    try:
        exporter: SpanExporter = OTLPSpanExporter(
            endpoint=traces_url(endpoint), timeout=EXPORT_TIMEOUT_SECONDS
        )
    except ValueError as err:
        raise InvalidInput(
            f"cannot export spans to {endpoint!r}: {err}", code=ErrorCode.INVALID_CONFIG, field=FLAG
        ) from None
    return exporter

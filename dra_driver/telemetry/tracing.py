"""Trace spans of the claim lifecycle: span names and attributes, the provider, OTLP export.

This module owns how a :class:`~dra_driver.telemetry.Telemetry` (and the scheduler extender) builds
its own ``TracerProvider`` (never the global one), the attribute names a claim's span carries and
the optional OTLP exporter, which must already be installed (no dependency is added here). Finished
spans go to OTLP only: the process keeps none (tests attach a recorder to ``Tracing.provider``,
``flexnpu_testing/telemetry.py``).
"""

from __future__ import annotations

import importlib
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


class Tracing:
    """One process's tracer: its provider and, optionally, OTLP export."""

    def __init__(self, resource: Resource, otlp_endpoint: str = "") -> None:
        self.provider = TracerProvider(sampler=ALWAYS_ON, resource=resource, shutdown_on_exit=False)
        if otlp_endpoint:
            self.provider.add_span_processor(BatchSpanProcessor(otlp_exporter(otlp_endpoint)))
        self.tracer: trace.Tracer = self.provider.get_tracer(SCOPE_NAME)

    def shutdown(self) -> None:
        self.provider.shutdown()


def otlp_exporter(endpoint: str) -> SpanExporter:
    """An OTLP span exporter from whichever OTLP package is installed (gRPC first, then HTTP)."""
    for module in (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    ):
        try:
            exporter_cls = importlib.import_module(module).OTLPSpanExporter
        except ImportError:
            continue
        exporter: SpanExporter = exporter_cls(endpoint=endpoint)
        return exporter
    raise InvalidInput(
        "an OTLP endpoint was given but no opentelemetry-exporter-otlp package is installed",
        code=ErrorCode.INVALID_CONFIG,
        field="otlp_endpoint",
    )

"""Trace spans of the claim lifecycle: span names and attributes, the bounded in-memory buffer, OTLP.

This module owns how a :class:`~dra_driver.telemetry.Telemetry` builds its own ``TracerProvider``
(never the global one), the attribute names a claim's span carries, the buffer ``spans()`` reads
and the optional OTLP exporter, which must already be installed (no dependency is added here).
"""

from __future__ import annotations

import collections
import importlib
import threading
from collections.abc import Iterable
from typing import Final

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON

from dra_driver.errors import ErrorCode, InvalidInput

SCOPE_NAME: Final = "dra_driver.telemetry"
SPAN_BUFFER: Final = 512  # finished spans kept for spans(); older ones are dropped

ATTR_CLAIM_UID: Final = "flexnpu.claim.uid"
ATTR_CLAIM_NAMESPACE: Final = "flexnpu.claim.namespace"
ATTR_CLAIM_NAME: Final = "flexnpu.claim.name"
ATTR_ERROR_TYPE: Final = "error.type"


class RecentSpans(SpanExporter):
    """A bounded in-memory span exporter (the SDK's InMemorySpanExporter grows without limit)."""

    def __init__(self, maxlen: int) -> None:
        self._spans: collections.deque[ReadableSpan] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def export(self, spans: Iterable[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._spans.extend(spans)
        return SpanExportResult.SUCCESS

    def finished(self) -> list[ReadableSpan]:
        with self._lock:
            return list(self._spans)

    def shutdown(self) -> None:
        pass


class Tracing:
    """One process's tracer: its provider, the recent-spans buffer and, optionally, OTLP export."""

    def __init__(self, resource: Resource, otlp_endpoint: str = "") -> None:
        self.recent = RecentSpans(SPAN_BUFFER)
        self.provider = TracerProvider(sampler=ALWAYS_ON, resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(SimpleSpanProcessor(self.recent))
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

"""Reading a process's telemetry from inside it, for tests and benches: metric values and spans.

Production keeps neither: Prometheus scrapes the metrics endpoint, and finished spans go to OTLP
when an endpoint is configured, else nowhere. A test attaches what it reads:

* :func:`metric_values` - the current values of a Prometheus registry (``Telemetry.registry``) as
  ``name{label=value,...} -> value``, as Prometheus would scrape them.
* :func:`record_spans` - a bounded recorder of finished spans on a :class:`Tracing` (a node's
  ``Telemetry.tracing``, the extender's ``scores.tracing``), from the moment it is attached.
* :class:`ProbedTelemetry` - a :class:`~dra_driver.telemetry.Telemetry` with both attached at
  construction: ``snapshot()`` and ``spans()``.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterable
from typing import Any, Final

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client.registry import CollectorRegistry

from dra_driver.telemetry import Telemetry
from dra_driver.telemetry.metrics import CONSTANT_LABELS
from dra_driver.telemetry.tracing import Tracing

SPAN_BUFFER: Final = 512  # finished spans a recorder keeps; older ones are dropped


class RecentSpans(SpanExporter):
    """A bounded in-memory span exporter (the SDK's InMemorySpanExporter grows without limit, and a
    bench records hundreds of thousands of spans)."""

    def __init__(self, maxlen: int = SPAN_BUFFER) -> None:
        self._spans: collections.deque[ReadableSpan] = collections.deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def export(self, spans: Iterable[ReadableSpan]) -> SpanExportResult:
        with self._lock:
            self._spans.extend(spans)
        return SpanExportResult.SUCCESS

    def finished(self) -> list[ReadableSpan]:
        """Finished spans, oldest first (the last ``maxlen``)."""
        with self._lock:
            return list(self._spans)

    def shutdown(self) -> None:
        pass


def record_spans(tracing: Tracing, maxlen: int = SPAN_BUFFER) -> RecentSpans:
    """Keep the last ``maxlen`` spans ``tracing`` finishes from now on."""
    recent = RecentSpans(maxlen)
    tracing.provider.add_span_processor(SimpleSpanProcessor(recent))
    return recent


def metric_values(registry: CollectorRegistry | None) -> dict[str, float]:
    """Current values of ``registry`` as ``name{label=value,...} -> value``.

    Labels are sorted and unquoted; the constant ``node``/``driver`` labels and ``target_info``
    are left out. Histograms appear as ``_bucket{le=...}``, ``_count`` and ``_sum``. Empty for no
    registry (telemetry disabled).
    """
    out: dict[str, float] = {}
    for family in registry.collect() if registry is not None else ():
        if family.name == "target":
            continue
        for sample in family.samples:
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in CONSTANT_LABELS
            )
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return out


class ProbedTelemetry(Telemetry):
    """A node's :class:`Telemetry` that a test reads in process (same arguments)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._recent = record_spans(self.tracing) if self.tracing is not None else None
        self._shut = False

    def shutdown(self) -> None:
        self._shut = True
        super().shutdown()

    def snapshot(self) -> dict[str, float]:
        """Current metric values (:func:`metric_values`); empty when disabled or shut down."""
        return {} if self._shut else metric_values(self.registry)

    def spans(self) -> list[ReadableSpan]:
        """Finished spans, oldest first (the last ``SPAN_BUFFER``); empty when tracing is off."""
        return self._recent.finished() if self._recent is not None else []

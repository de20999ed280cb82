"""Observability of the claim lifecycle: Prometheus metrics and trace spans (OpenTelemetry SDK).

This package owns the metric names, their labels and buckets, the span names and attributes, and
the optional Prometheus HTTP endpoint: :class:`Telemetry` (here) puts together the instruments
(``metrics.py``), the tracer (``tracing.py``) and the endpoint (``endpoint.py``). It does not decide what a claim gets, does not log, and
never sets the global OpenTelemetry providers: each :class:`Telemetry` has its own
``MeterProvider``, ``TracerProvider`` and Prometheus ``CollectorRegistry``, so tests (and a
process embedding several drivers) can keep many apart.

Usage (the node process builds one, the prepare/unprepare code calls it per claim)::

    tel = Telemetry(node_name="node-1", driver_name="npu.flexnpu.io", metrics_port=8080)
    tel.start()
    with tel.operation("prepare", claim_uid=uid, namespace=ns, name=name) as rec:
        result = prepare_one(...)        # an exception is counted (error_type) and re-raised
        if result.error:                 # a failure put into the claim's slot, not raised
            rec.fail(result.error.code)
    tel.set_prepared_vnpus({(0, "soft"): 3, (1, "whole"): 1})
    tel.shutdown()

Metrics (all carry the constant labels ``node`` and ``driver``; a "request" is one claim's
prepare or unprepare, not one kubelet gRPC call, which may carry a batch of claims)::

    flexnpu_dra_prepare_requests_total{result,error_type}      counter
    flexnpu_dra_unprepare_requests_total{result,error_type}    counter
    flexnpu_dra_prepare_duration_seconds{result}               histogram, 1 ms .. 45 s
    flexnpu_dra_unprepare_duration_seconds{result}             histogram, 1 ms .. 45 s
    flexnpu_dra_operations_in_flight{operation}                gauge
    flexnpu_dra_prepared_vnpus{die,mode}                       gauge
    flexnpu_dra_residuals_found_total{kind}                    counter
    flexnpu_dra_residuals_removed_total{kind}                  counter
    flexnpu_dra_loop_errors_total{loop}                        counter
    flexnpu_dra_loop_since_last_pass_seconds{loop}             gauge
    target_info{node,driver,service_name,k8s_node_name}        OpenTelemetry resource, value 1

- ``result`` is ``success`` or ``error``. ``error_type`` is empty on success, else the
  :class:`~dra_driver.errors.ErrorCode` value of a ``FlexNPUError`` (``DaemonUnavailable``), the
  class name of any other exception (``OSError``), or the code given to :meth:`OpRecord.fail`.
  The request counters are pre-created at zero for ``success`` and for every ``ErrorCode``, the
  in-flight gauge for both operations and the residual counters for every kind, so dashboards
  show 0 rather than "no data". Histograms cannot be pre-created without a fake observation.
- The 45 s top bucket is the kubelet's per-call DRA timeout (the kubelet's DRA manager cancels a
  NodePrepareResources/NodeUnprepareResources call after 45 s); anything
  slower lands in ``+Inf`` and has already failed on the kubelet side.
- ``kind`` is one of :class:`ResidualKind`: what the reconciler or the sweep found without an
  owner (``claim``, ``aclserver``, ``cdi-spec``, ``shm-dir``, ``client-conf``, ``link-address``).

Relation to the Ascend conventions: mind-cluster's npu-exporter labels chips
with ``id`` (the NPU *logic* ID), ``vdie_id`` (the die's stable VDie ID) and ``model_name``, and
HAMi uses ``hami_*`` names with bytes and 0-100 ratios. ``die`` here is the *physical* ID (npu-smi
"Phy-ID", the same number the CDI and daemon code use), because the logic ID changes when
devices are hidden from a container; it is neither ``id`` nor ``vdie_id``, and joining with
npu-exporter series needs a die-info mapping published elsewhere (not by this module). ``mode``
is the :class:`~dra_driver.devices.DieMode` of the prepared device (``whole``/``soft``/``hard``).
Units follow Prometheus (seconds, plain counts), unlike npu-exporter's MB/KB.

``loop`` names a long-lived loop of the node (``reconciler``, ``claim-watch``, ``publisher``, …,
see ``dra_driver/liveness.py``): errors it caught and went on from, and the age of its last pass.
The same endpoint answers ``GET /healthz`` with the liveness verdict set by
:meth:`Telemetry.serve_health` (200 healthy, 503 when a loop is stale; the body names each loop).

Spans: one ``flexnpu.prepare`` / ``flexnpu.unprepare`` span per claim (kind INTERNAL), current
while the body runs, with ``flexnpu.claim.uid``, ``flexnpu.claim.namespace``,
``flexnpu.claim.name``; on failure ``error.type`` (same value as the metric label), status
ERROR, and an exception event when the body raised. Finished spans go to an OTLP/HTTP exporter when
``otlp_endpoint`` is set (``--otlp-endpoint``; ``tracing.py``), else nowhere: the process keeps no
span buffer. Tests and benches read the metric values and the spans
through ``flexnpu_testing/telemetry.py`` (on :attr:`Telemetry.registry` and
:attr:`Telemetry.tracing`).

Cost: ``enabled=False`` makes every call a no-op (no providers are built); ``tracing=False``
drops the span work and keeps the metrics. ``bench/bench_telemetry_overhead.py`` measures both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Literal, Self

from opentelemetry.sdk.resources import Resource
from prometheus_client.registry import Collector, CollectorRegistry

from dra_driver.errors import InvalidInput
from dra_driver.telemetry.endpoint import PORT_RETRY_SECONDS, MetricsEndpoint, Verdict, wsgi_app
from dra_driver.telemetry.metrics import (
    DURATION_BUCKETS,
    MAX_EXTRA_ERROR_TYPES,
    NOOP_TIMED,
    OTHER_ERROR,
    PREFIX,
    Instruments,
    Operation,
    OpRecord,
    ResidualKind,
    Timed,
    checked_prepared,
    residual_attrs,
)
from dra_driver.telemetry.tracing import SCOPE_NAME, Tracing

__all__ = [
    "DURATION_BUCKETS",
    "MAX_EXTRA_ERROR_TYPES",
    "OTHER_ERROR",
    "PORT_RETRY_SECONDS",
    "PREFIX",
    "SCOPE_NAME",
    "SERVICE_NAME",
    "OpRecord",
    "Operation",
    "ResidualKind",
    "Telemetry",
]

SERVICE_NAME = "flexnpu-dra-driver"


class Telemetry:
    """Metrics and spans for one node process.

    **Parameters:**

    * **node_name**, **driver_name** - values of the constant ``node`` and ``driver`` labels.
    * **metrics_port** - ``< 0``: record in-process only (``registry`` still holds the values), no
      HTTP server; ``0``: bind a free port (tests; read ``.port``); ``> 0``: that port.
    * **metrics_host** - address the endpoint binds to.
    * **tracing** - open a span per operation (exported over OTLP when an endpoint is given).
    * **otlp_endpoint** - also export spans over OTLP/HTTP to this collector (``--otlp-endpoint``:
      a base URL, spans go to its ``/v1/traces``, or the full traces URL); needs tracing.
    * **enabled** - ``False`` turns every method into a no-op (nothing is built or recorded).
    * **wait_for_port** - when the port is in use, keep trying to bind it in the background
      (every ``PORT_RETRY_SECONDS``) instead of failing ``start()``: during a rolling update of a
      host-network DaemonSet the old pod holds the port until it exits (``kubeletplugin/core.py``
      sets it when ``--pod-uid`` is given).
    """

    def __init__(
        self,
        *,
        node_name: str,
        driver_name: str,
        metrics_port: int = -1,
        metrics_host: str = "0.0.0.0",
        tracing: bool = True,
        otlp_endpoint: str = "",
        enabled: bool = True,
        wait_for_port: bool = False,
    ) -> None:
        if not node_name:
            raise InvalidInput("node name must not be empty", field="node_name")
        if not driver_name:
            raise InvalidInput("driver name must not be empty", field="driver_name")
        if metrics_port > 65535:
            raise InvalidInput(f"metrics port {metrics_port} is above 65535", field="metrics_port")
        if otlp_endpoint and not tracing:
            raise InvalidInput("an OTLP endpoint needs tracing enabled", field="otlp_endpoint")
        self.node_name = node_name
        self.driver_name = driver_name
        self.enabled = enabled
        self._closed = not enabled
        self._lock = threading.Lock()
        self._health: Verdict | None = None
        # The Prometheus registry the endpoint serves and the span provider (None when disabled or,
        # for tracing, off): what a reader in the same process (tests, benches) attaches to.
        self.registry: CollectorRegistry | None = None
        self.tracing: Tracing | None = None
        self._endpoint: MetricsEndpoint | None = None
        if not enabled:
            return
        resource = Resource(
            {
                "service.name": SERVICE_NAME,
                "k8s.node.name": node_name,
                "node": node_name,
                "driver": driver_name,
            }
        )
        if tracing:
            self.tracing = Tracing(resource, otlp_endpoint)
        self._metrics = Instruments(resource, self.tracing.tracer if self.tracing else None)
        self.registry = self._metrics.registry
        if metrics_port >= 0:
            app = wsgi_app(self.registry, lambda: self._health)
            self._endpoint = MetricsEndpoint(metrics_host, metrics_port, app, wait_for_port=wait_for_port)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the Prometheus endpoint (``GET /metrics``) if a port was given; idempotent."""
        if not self._closed and self._endpoint is not None:
            self._endpoint.start()

    def add_collector(self, collector: Collector) -> None:
        """Serve ``collector``'s series on this endpoint too (``dra_driver/usage_metrics.py``)."""
        if self.registry is not None:
            self.registry.register(collector)

    def serve_health(
        self,
        verdict: Callable[[], tuple[bool, str]],
        loop_ages: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """Answer ``GET /healthz`` with ``verdict()`` (healthy, text); export ``loop_ages()`` as a gauge."""
        self._health = verdict
        if self.enabled:
            self._metrics.loop_ages = loop_ages

    def loop_error(self, loop: str) -> None:
        """Count one unexpected error that long-lived loop ``loop`` caught and went on from."""
        if not self._closed:
            self._metrics.loop_errors.add(1, {"loop": loop[:64]})

    @property
    def port(self) -> int | None:
        """The bound metrics port, or None when no endpoint is serving."""
        return self._endpoint.port if self._endpoint is not None else None

    def shutdown(self) -> None:
        """Stop the endpoint and the providers; later calls record nothing. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._endpoint is not None:
            self._endpoint.stop()
        if self.tracing is not None:
            self.tracing.shutdown()
        self._metrics.provider.shutdown()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.shutdown()

    # -- recording ---------------------------------------------------------------------------

    def operation(
        self,
        op: Operation | Literal["prepare", "unprepare"],
        *,
        claim_uid: str,
        namespace: str = "",
        name: str = "",
    ) -> AbstractContextManager[OpRecord, Literal[False]]:
        """Time one claim's prepare or unprepare; use as ``with tel.operation(...) as rec:``.

        While the body runs the in-flight gauge is up by one and the span is current. On exit the
        duration and the count are recorded with ``result``/``error_type``; an exception from the
        body is recorded and re-raised unchanged.
        """
        if self._closed:
            return NOOP_TIMED
        try:
            ops = self._metrics.ops[op]
        except KeyError:
            raise InvalidInput(
                f"unknown operation {op!r}; expected prepare or unprepare", field="op"
            ) from None
        if not claim_uid:
            raise InvalidInput("an operation needs the claim UID", field="claim_uid")
        return Timed(ops, claim_uid, namespace, name)

    def set_prepared_vnpus(self, counts: Mapping[tuple[int, str], int]) -> None:
        """Replace the prepared-devices gauge: ``(die physical ID, mode) -> count``.

        Pass the full picture each time; a key seen before but missing now reads 0 (the series
        stays, so a die going idle shows as 0, not as a gap).
        """
        checked = checked_prepared(counts)
        if not self._closed:
            self._metrics.set_prepared(checked)

    def residual_found(self, kind: ResidualKind | str, n: int = 1) -> None:
        """Count ``n`` leftovers of ``kind`` found without an owner."""
        attrs = residual_attrs(kind, n)
        if not self._closed and n:
            self._metrics.residuals_found.add(n, attrs)

    def residual_removed(self, kind: ResidualKind | str, n: int = 1) -> None:
        """Count ``n`` leftovers of ``kind`` removed."""
        attrs = residual_attrs(kind, n)
        if not self._closed and n:
            self._metrics.residuals_removed.add(n, attrs)

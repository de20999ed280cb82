"""Observability of the claim lifecycle: Prometheus metrics and trace spans (OpenTelemetry SDK).

This module owns the metric names, their labels and buckets, the span names and attributes, and
the optional Prometheus HTTP endpoint. It does not decide what a claim gets, does not log, and
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
ERROR, and an exception event when the body raised. Finished spans go to a bounded in-memory
buffer (:meth:`Telemetry.spans`, last ``SPAN_BUFFER`` spans) and, when ``otlp_endpoint`` is set,
to an OTLP exporter, which must already be installed (this module adds no dependency).

Cost: ``enabled=False`` makes every call a no-op (no providers are built); ``tracing=False``
drops the span work and keeps the metrics. ``bench/bench_telemetry_overhead.py`` measures both.
"""

from __future__ import annotations

import collections
import errno
import importlib
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AbstractContextManager
from enum import StrEnum
from types import TracebackType
from typing import Final, Literal
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput

__all__ = [
    "DURATION_BUCKETS",
    "SPAN_BUFFER",
    "OpRecord",
    "Operation",
    "ResidualKind",
    "Telemetry",
]

PREFIX: Final = "flexnpu_dra"
PORT_RETRY_SECONDS: Final = 1.0
SERVICE_NAME: Final = "flexnpu-dra-driver"
SCOPE_NAME: Final = "dra_driver.telemetry"

# Seconds; 1 ms (a checkpoint hit) to the kubelet's 45 s call timeout.
DURATION_BUCKETS: Final[tuple[float, ...]] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    20.0,
    30.0,
    45.0,
)

SPAN_BUFFER: Final = 512  # finished spans kept for spans(); older ones are dropped

# Labels every series carries; snapshot() leaves them out of its keys.
CONSTANT_LABELS: Final = ("node", "driver")

ATTR_CLAIM_UID: Final = "flexnpu.claim.uid"
ATTR_CLAIM_NAMESPACE: Final = "flexnpu.claim.namespace"
ATTR_CLAIM_NAME: Final = "flexnpu.claim.name"
ATTR_ERROR_TYPE: Final = "error.type"

SUCCESS: Final = "success"
ERROR: Final = "error"

# Distinct error_type values besides ErrorCode before new ones are folded into OTHER_ERROR,
# so a caller passing unusual codes cannot grow the series without bound.
MAX_EXTRA_ERROR_TYPES: Final = 32
OTHER_ERROR: Final = "Other"

_ERROR_TYPE_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")

PREPARED_MODES: Final = frozenset({"whole", "soft", "hard"})


class Operation(StrEnum):
    """The timed claim operations."""

    PREPARE = "prepare"
    UNPREPARE = "unprepare"


class ResidualKind(StrEnum):
    """What the reconciler or the sweep can find left over without an owner."""

    CLAIM = "claim"
    ACLSERVER = "aclserver"
    CDI_SPEC = "cdi-spec"
    SHM_DIR = "shm-dir"
    CLIENT_CONF = "client-conf"
    LINK_ADDRESS = "link-address"


class OpRecord:
    """What the body of :meth:`Telemetry.operation` can say about its claim.

    ``fail(code)`` marks the operation failed without raising (a failure put in the claim's slot
    of a batch result). The first failure recorded wins; an exception escaping the body
    overrides it.
    """

    __slots__ = ("_error_type",)

    def __init__(self) -> None:
        self._error_type = ""

    def fail(self, code: ErrorCode | str) -> None:
        """Mark the operation failed with ``code`` (an ErrorCode or a short identifier)."""
        value = str(code)
        if not _ERROR_TYPE_RE.fullmatch(value):
            raise InvalidInput(
                f"error type {value!r} must be an ErrorCode or an identifier of at most 64 chars",
                field="code",
            )
        if not self._error_type:
            self._error_type = value

    @property
    def failed(self) -> bool:
        return bool(self._error_type)

    @property
    def error_type(self) -> str:
        """The recorded error type, ``""`` while the operation has not failed."""
        return self._error_type


class Telemetry:
    """Metrics and spans for one node process.

    **Parameters:**

    * **node_name**, **driver_name** - values of the constant ``node`` and ``driver`` labels.
    * **metrics_port** - ``< 0``: record in-process only (``snapshot()`` still works), no HTTP
      server; ``0``: bind a free port (tests; read ``.port``); ``> 0``: that port.
    * **metrics_host** - address the endpoint binds to.
    * **tracing** - open a span per operation (kept in memory, see ``spans()``).
    * **otlp_endpoint** - also export spans over OTLP to this endpoint; needs tracing and an
      installed ``opentelemetry-exporter-otlp`` package.
    * **enabled** - ``False`` turns every method into a no-op (nothing is built or recorded).
    * **wait_for_port** - when the port is in use, keep trying to bind it in the background
      (every ``PORT_RETRY_SECONDS``) instead of failing ``start()``: during a rolling update of a
      host-network DaemonSet the old pod holds the port until it exits (``kubeletplugin/node.py``
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
        self._wait_for_port = wait_for_port
        self._port_retry: threading.Thread | None = None
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
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host
        self._lock = threading.Lock()
        self._closed = not enabled
        self._server: _Server | None = None
        self._spans: _RecentSpans | None = None
        self._tracer_provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None
        self._prepared: dict[tuple[int, str], int] = {}
        self._extra_error_types: set[str] = set()
        self._health: Callable[[], tuple[bool, str]] | None = None
        self._loop_ages: Callable[[], Mapping[str, float]] | None = None
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
            self._spans = _RecentSpans(SPAN_BUFFER)
            self._tracer_provider = TracerProvider(
                sampler=ALWAYS_ON, resource=resource, shutdown_on_exit=False
            )
            self._tracer_provider.add_span_processor(SimpleSpanProcessor(self._spans))
            if otlp_endpoint:
                self._tracer_provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(otlp_endpoint)))
            self._tracer = self._tracer_provider.get_tracer(SCOPE_NAME)
        self._registry = CollectorRegistry()
        self._reader = PrometheusMetricReader(
            scope_info_enabled=False,
            resource_attribute_filter=CONSTANT_LABELS.__contains__,
            registry=self._registry,
        )
        self._meter_provider = MeterProvider(
            metric_readers=[self._reader],
            resource=resource,
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,
        )
        meter = self._meter_provider.get_meter(SCOPE_NAME)
        self._ops: dict[str, _OpInstruments] = {
            op: _OpInstruments(self, meter, op) for op in (Operation.PREPARE, Operation.UNPREPARE)
        }
        # An observable gauge over plain ints: two SDK measurements per operation cost more
        # than the rest of the metrics work together (see bench/bench_telemetry_overhead.py).
        meter.create_observable_gauge(
            f"{PREFIX}_operations_in_flight",
            callbacks=[self._observe_in_flight],
            unit="{operation}",
            description="Claim prepare/unprepare operations running now.",
        )
        self._residuals_found = meter.create_counter(
            f"{PREFIX}_residuals_found_total",
            unit="{object}",
            description="Leftovers found that no live claim or checkpoint entry owns, by kind.",
        )
        self._residuals_removed = meter.create_counter(
            f"{PREFIX}_residuals_removed_total",
            unit="{object}",
            description="Leftovers removed by the reconciler or the sweep, by kind.",
        )
        meter.create_observable_gauge(
            f"{PREFIX}_prepared_vnpus",
            callbacks=[self._observe_prepared],
            unit="{device}",
            description="Prepared vNPUs (soft/hard shares) or whole dies, by physical die ID and mode.",
        )
        for kind in ResidualKind:
            self._residuals_found.add(0, {"kind": kind.value})
            self._residuals_removed.add(0, {"kind": kind.value})
        self._loop_errors = meter.create_counter(
            f"{PREFIX}_loop_errors_total",
            unit="{error}",
            description="Unexpected errors a long-lived loop caught, logged and went on from, by loop.",
        )
        meter.create_observable_gauge(
            f"{PREFIX}_loop_since_last_pass",
            callbacks=[self._observe_loop_ages],
            unit="s",
            description="Seconds since each long-lived loop last completed a pass.",
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Start the Prometheus endpoint (``GET /metrics``) if a port was given; idempotent."""
        if self._closed or self._metrics_port < 0 or self._server is not None:
            return
        if self._port_retry is not None:
            return
        try:
            httpd, thread = _serve(self._metrics_host, self._metrics_port, self._wsgi_app())
        except OSError as exc:
            if self._wait_for_port and exc.errno == errno.EADDRINUSE and self._metrics_port > 0:
                self._port_retry = threading.Thread(target=self._bind_later, name="metrics-bind", daemon=True)
                self._port_retry.start()
                return
            raise InvalidInput(
                f"cannot serve metrics on {self._metrics_host}:{self._metrics_port}: {exc.strerror or exc}",
                code=ErrorCode.INVALID_CONFIG,
                field="metrics_port",
            ) from exc
        self._server = _Server(httpd.shutdown, httpd.server_close, thread, int(httpd.server_port))

    def _bind_later(self) -> None:
        """Bind the metrics port once its holder (the previous pod of a rolling update) let it go."""
        stop = threading.Event()
        while not self._closed:
            stop.wait(PORT_RETRY_SECONDS)  # a polled condition: the port becomes free
            try:
                httpd, thread = _serve(self._metrics_host, self._metrics_port, self._wsgi_app())
            except OSError:
                continue
            with self._lock:
                if self._closed:
                    httpd.shutdown()
                    httpd.server_close()
                    return
                self._server = _Server(httpd.shutdown, httpd.server_close, thread, int(httpd.server_port))
            return

    def add_collector(self, collector: Collector) -> None:
        """Serve ``collector``'s series on this endpoint too (``dra_driver/usage_metrics.py``)."""
        if self.enabled:
            self._registry.register(collector)

    def serve_health(
        self,
        verdict: Callable[[], tuple[bool, str]],
        loop_ages: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        """Answer ``GET /healthz`` with ``verdict()`` (healthy, text); export ``loop_ages()`` as a gauge."""
        self._health = verdict
        self._loop_ages = loop_ages

    def loop_error(self, loop: str) -> None:
        """Count one unexpected error that long-lived loop ``loop`` caught and went on from."""
        if not self._closed:
            self._loop_errors.add(1, {"loop": loop[:64]})

    @property
    def port(self) -> int | None:
        """The bound metrics port, or None when no endpoint is serving."""
        return self._server.port if self._server else None

    def shutdown(self) -> None:
        """Stop the endpoint and the providers; later calls record nothing. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            server, self._server = self._server, None
        if server is not None:
            server.stop()
        if self._tracer_provider is not None:
            self._tracer_provider.shutdown()
        self._meter_provider.shutdown()

    def __enter__(self) -> Telemetry:
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
            return _NOOP_TIMED
        try:
            ops = self._ops[op]
        except KeyError:
            raise InvalidInput(
                f"unknown operation {op!r}; expected prepare or unprepare", field="op"
            ) from None
        if not claim_uid:
            raise InvalidInput("an operation needs the claim UID", field="claim_uid")
        return _Timed(ops, claim_uid, namespace, name)

    def set_prepared_vnpus(self, counts: Mapping[tuple[int, str], int]) -> None:
        """Replace the prepared-devices gauge: ``(die physical ID, mode) -> count``.

        Pass the full picture each time; a key seen before but missing now reads 0 (the series
        stays, so a die going idle shows as 0, not as a gap).
        """
        checked: dict[tuple[int, str], int] = {}
        for key, count in counts.items():
            die, mode = key
            if isinstance(die, bool) or not isinstance(die, int) or die < 0:
                raise InvalidInput(f"die ID {die!r} must be a non-negative int", field="counts")
            if str(mode) not in PREPARED_MODES:
                raise InvalidInput(f"mode {mode!r} must be one of whole, soft, hard", field="counts")
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidInput(
                    f"count {count!r} for die {die} must be a non-negative int", field="counts"
                )
            checked[(die, str(mode))] = count
        if self._closed:
            return
        with self._lock:
            for key in self._prepared:
                self._prepared[key] = 0
            self._prepared.update(checked)

    def residual_found(self, kind: ResidualKind | str, n: int = 1) -> None:
        """Count ``n`` leftovers of ``kind`` found without an owner."""
        attrs = _residual_attrs(kind, n)
        if not self._closed and n:
            self._residuals_found.add(n, attrs)

    def residual_removed(self, kind: ResidualKind | str, n: int = 1) -> None:
        """Count ``n`` leftovers of ``kind`` removed."""
        attrs = _residual_attrs(kind, n)
        if not self._closed and n:
            self._residuals_removed.add(n, attrs)

    # -- reading -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, float]:
        """Current values as ``name{label=value,...} -> value``, as Prometheus would scrape them.

        Labels are sorted and unquoted; the constant ``node``/``driver`` labels and
        ``target_info`` are left out. Histograms appear as ``_bucket{le=...}``, ``_count``
        and ``_sum``. Empty when disabled or shut down.
        """
        if self._closed:
            return {}
        out: dict[str, float] = {}
        for family in self._registry.collect():
            if family.name == "target":
                continue
            for sample in family.samples:
                labels = ",".join(
                    f"{k}={v}" for k, v in sorted(sample.labels.items()) if k not in CONSTANT_LABELS
                )
                out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
        return out

    def spans(self) -> list[ReadableSpan]:
        """Finished spans, oldest first (the last ``SPAN_BUFFER``); empty when tracing is off."""
        return self._spans.finished() if self._spans else []

    # -- private -----------------------------------------------------------------------------

    def _error_type_of(self, exc: BaseException | None, record: OpRecord) -> str:
        if exc is None:
            return record.error_type
        if isinstance(exc, FlexNPUError):
            return str(exc.code)
        return type(exc).__name__

    def _bounded_error_type(self, error_type: str) -> str:
        if error_type in _ERROR_CODES or error_type in self._extra_error_types:
            return error_type
        with self._lock:
            if len(self._extra_error_types) >= MAX_EXTRA_ERROR_TYPES:
                return OTHER_ERROR
            self._extra_error_types.add(error_type)
        return error_type

    def _observe_loop_ages(self, _options: CallbackOptions) -> Iterable[Observation]:
        ages = self._loop_ages() if self._loop_ages is not None else {}
        return [Observation(age, {"loop": name}) for name, age in sorted(ages.items())]

    def _wsgi_app(self) -> Callable[..., Iterable[bytes]]:
        """``/healthz`` from the liveness verdict, everything else the Prometheus exposition."""
        metrics = make_wsgi_app(self._registry)

        def app(environ: dict[str, object], start_response: Callable[..., object]) -> Iterable[bytes]:
            if environ.get("PATH_INFO") in ("/healthz", "/livez"):
                healthy, text = self._health() if self._health is not None else (True, "ok\n")
                status = "200 OK" if healthy else "503 Service Unavailable"
                start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
                return [text.encode()]
            body: Iterable[bytes] = metrics(environ, start_response)
            return body

        return app

    def _observe_in_flight(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(ops.running, ops.op_attrs) for ops in self._ops.values()]

    def _observe_prepared(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._prepared.items())
        return [Observation(count, {"die": str(die), "mode": mode}) for (die, mode), count in items]


# -- private helpers -------------------------------------------------------------------------

_ERROR_CODES: Final = frozenset(code.value for code in ErrorCode)


class _OpInstruments:
    """The instruments and pre-built attribute dicts of one operation (built once)."""

    def __init__(self, tel: Telemetry, meter: Meter, op: Operation) -> None:
        self.tel = tel
        self.span_name = f"flexnpu.{op.value}"
        self.tracer = tel._tracer
        self.op_attrs = {"operation": op.value}
        self.running = 0
        self.running_lock = threading.Lock()
        self.requests = meter.create_counter(
            f"{PREFIX}_{op.value}_requests_total",
            unit="{request}",
            description=f"Claim {op.value} operations (one per claim), by result and error type.",
        )
        self.duration = meter.create_histogram(
            f"{PREFIX}_{op.value}_duration_seconds",
            unit="s",
            description=f"Time to {op.value} one claim, by result.",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self.success_attrs = {"result": SUCCESS, "error_type": ""}
        self.success_duration_attrs = {"result": SUCCESS}
        self.error_duration_attrs = {"result": ERROR}
        self.error_attrs: dict[str, dict[str, str]] = {}
        self.requests.add(0, self.success_attrs)
        for code in ErrorCode:
            self.requests.add(0, self._error_attrs(code.value))

    def _error_attrs(self, error_type: str) -> dict[str, str]:
        attrs = self.error_attrs.get(error_type)
        if attrs is None:
            attrs = self.error_attrs.setdefault(error_type, {"result": ERROR, "error_type": error_type})
        return attrs

    def begin(self) -> None:
        with self.running_lock:
            self.running += 1

    def finish(self, seconds: float, error_type: str) -> None:
        with self.running_lock:
            self.running -= 1
        if error_type:
            self.requests.add(1, self._error_attrs(error_type))
            self.duration.record(seconds, self.error_duration_attrs)
        else:
            self.requests.add(1, self.success_attrs)
            self.duration.record(seconds, self.success_duration_attrs)


class _Timed:
    """The context manager returned by :meth:`Telemetry.operation` (a class: cheaper than a
    generator-based one on the hot path)."""

    __slots__ = ("_name", "_namespace", "_ops", "_record", "_span", "_start", "_token", "_uid")

    def __init__(self, ops: _OpInstruments, uid: str, namespace: str, name: str) -> None:
        self._ops = ops
        self._uid = uid
        self._namespace = namespace
        self._name = name
        self._record = OpRecord()
        self._start = 0.0
        self._span: trace.Span | None = None
        self._token: object = None

    def __enter__(self) -> OpRecord:
        ops = self._ops
        if ops.tracer is not None:
            attrs = {ATTR_CLAIM_UID: self._uid}
            if self._namespace:
                attrs[ATTR_CLAIM_NAMESPACE] = self._namespace
            if self._name:
                attrs[ATTR_CLAIM_NAME] = self._name
            span = ops.tracer.start_span(ops.span_name, kind=SpanKind.INTERNAL, attributes=attrs)
            self._span = span
            self._token = otel_context.attach(trace.set_span_in_context(span))
        ops.begin()
        self._start = time.perf_counter()
        return self._record

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        seconds = time.perf_counter() - self._start
        ops = self._ops
        tel = ops.tel
        error_type = tel._error_type_of(exc, self._record)
        if error_type:
            error_type = tel._bounded_error_type(error_type)
        ops.finish(seconds, error_type)
        span = self._span
        if span is not None:
            if error_type:
                span.set_attribute(ATTR_ERROR_TYPE, error_type)
                if exc is not None:
                    span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, str(exc) if exc is not None else error_type))
            otel_context.detach(self._token)  # type: ignore[arg-type]
            span.end()
        return False


class _NoopTimed:
    """What ``operation()`` returns when telemetry is disabled or shut down."""

    __slots__ = ()

    def __enter__(self) -> OpRecord:
        return OpRecord()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        return False


_NOOP_TIMED: Final = _NoopTimed()


class _RecentSpans(SpanExporter):
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


class _Server:
    """The running Prometheus endpoint and how to stop it."""

    def __init__(
        self, stop_serving: Callable[[], None], close: Callable[[], None], thread: threading.Thread, port: int
    ) -> None:
        self._stop_serving = stop_serving
        self._close = close
        self._thread = thread
        self.port = port

    def stop(self) -> None:
        self._stop_serving()
        self._close()
        self._thread.join(timeout=5)


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return


def _serve(host: str, port: int, app: Callable[..., Iterable[bytes]]) -> tuple[WSGIServer, threading.Thread]:
    """A threaded WSGI server for ``app`` on ``host:port``, serving in a daemon thread."""

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    httpd = make_server(host, port, app, Server, handler_class=_QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread


def _residual_attrs(kind: ResidualKind | str, n: int) -> dict[str, str]:
    try:
        value = ResidualKind(kind).value
    except ValueError:
        allowed = ", ".join(k.value for k in ResidualKind)
        raise InvalidInput(
            f"unknown residual kind {kind!r}; expected one of {allowed}", field="kind"
        ) from None
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise InvalidInput(f"residual count {n!r} must be a non-negative int", field="n")
    return {"kind": value}


def _otlp_exporter(endpoint: str) -> SpanExporter:
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

"""Metrics of the claim lifecycle: names, labels, buckets, the instruments and the timed helpers.

This module owns every ``flexnpu_dra_*`` instrument of a node process (listed in the package
docstring, :mod:`dra_driver.telemetry`), the label values they accept (:class:`Operation`,
:class:`ResidualKind`, bounded ``error_type``), the Prometheus registry they are read from, and the
context manager that times one claim's prepare or unprepare (:class:`Timed`: counts, duration,
in-flight, and the claim's span when a tracer is given).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from enum import StrEnum
from types import TracebackType
from typing import Final, Literal

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import CallbackOptions, Meter, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CollectorRegistry

from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput
from dra_driver.telemetry.tracing import (
    ATTR_CLAIM_NAME,
    ATTR_CLAIM_NAMESPACE,
    ATTR_CLAIM_UID,
    ATTR_ERROR_TYPE,
    SCOPE_NAME,
)

PREFIX: Final = "flexnpu_dra"

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

# Labels every series carries: the resource attributes the Prometheus reader turns into labels.
CONSTANT_LABELS: Final = ("node", "driver")

SUCCESS: Final = "success"
ERROR: Final = "error"

# Distinct error_type values besides ErrorCode before new ones are folded into OTHER_ERROR,
# so a caller passing unusual codes cannot grow the series without bound.
MAX_EXTRA_ERROR_TYPES: Final = 32
OTHER_ERROR: Final = "Other"

_ERROR_TYPE_RE: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
_ERROR_CODES: Final = frozenset(code.value for code in ErrorCode)

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
    def error_type(self) -> str:
        """The recorded error type, ``""`` while the operation has not failed."""
        return self._error_type


class ErrorTypes:
    """The ``error_type`` label values: every ErrorCode, then at most ``MAX_EXTRA_ERROR_TYPES`` more."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._extra: set[str] = set()

    def of(self, exc: BaseException | None, record: OpRecord) -> str:
        """The bounded error type of an operation that raised ``exc`` or recorded ``record``."""
        if exc is None:
            error_type = record.error_type
        elif isinstance(exc, FlexNPUError):
            error_type = str(exc.code)
        else:
            error_type = type(exc).__name__
        return self._bounded(error_type) if error_type else ""

    def _bounded(self, error_type: str) -> str:
        if error_type in _ERROR_CODES or error_type in self._extra:
            return error_type
        with self._lock:
            if len(self._extra) >= MAX_EXTRA_ERROR_TYPES:
                return OTHER_ERROR
            self._extra.add(error_type)
        return error_type


class OpInstruments:
    """The instruments and pre-built attribute dicts of one operation (built once)."""

    def __init__(
        self, meter: Meter, op: Operation, tracer: trace.Tracer | None, error_types: ErrorTypes
    ) -> None:
        self.span_name = f"flexnpu.{op.value}"
        self.tracer = tracer
        self.error_types = error_types
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


class Timed:
    """The context manager :meth:`Telemetry.operation` returns (a class: cheaper than a
    generator-based one on the hot path)."""

    __slots__ = ("_name", "_namespace", "_ops", "_record", "_span", "_start", "_token", "_uid")

    def __init__(self, ops: OpInstruments, uid: str, namespace: str, name: str) -> None:
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
        error_type = ops.error_types.of(exc, self._record)
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


class NoopTimed:
    """What ``operation()`` returns when telemetry is disabled or shut down."""

    __slots__ = ()

    def __enter__(self) -> OpRecord:
        return OpRecord()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        return False


NOOP_TIMED: Final = NoopTimed()


class Instruments:
    """Every instrument of one node process, on its own ``MeterProvider`` and registry."""

    def __init__(self, resource: Resource, tracer: trace.Tracer | None) -> None:
        self.registry = CollectorRegistry()
        self._lock = threading.Lock()
        self._prepared: dict[tuple[int, str], int] = {}
        self.loop_ages: Callable[[], Mapping[str, float]] | None = None
        reader = PrometheusMetricReader(
            scope_info_enabled=False,
            resource_attribute_filter=CONSTANT_LABELS.__contains__,
            registry=self.registry,
        )
        self.provider = MeterProvider(
            metric_readers=[reader],
            resource=resource,
            exemplar_filter=AlwaysOffExemplarFilter(),
            shutdown_on_exit=False,
        )
        meter = self.provider.get_meter(SCOPE_NAME)
        error_types = ErrorTypes()
        self.ops: dict[str, OpInstruments] = {
            op: OpInstruments(meter, op, tracer, error_types)
            for op in (Operation.PREPARE, Operation.UNPREPARE)
        }
        # An observable gauge over plain ints: two SDK measurements per operation cost more
        # than the rest of the metrics work together (see bench/bench_telemetry_overhead.py).
        meter.create_observable_gauge(
            f"{PREFIX}_operations_in_flight",
            callbacks=[self._observe_in_flight],
            unit="{operation}",
            description="Claim prepare/unprepare operations running now.",
        )
        self.residuals_found = meter.create_counter(
            f"{PREFIX}_residuals_found_total",
            unit="{object}",
            description="Leftovers found that no live claim or checkpoint entry owns, by kind.",
        )
        self.residuals_removed = meter.create_counter(
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
            self.residuals_found.add(0, {"kind": kind.value})
            self.residuals_removed.add(0, {"kind": kind.value})
        self.loop_errors = meter.create_counter(
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

    def set_prepared(self, checked: Mapping[tuple[int, str], int]) -> None:
        """Replace the prepared-devices gauge; keys seen before but missing now read 0."""
        with self._lock:
            for key in self._prepared:
                self._prepared[key] = 0
            self._prepared.update(checked)

    def _observe_loop_ages(self, _options: CallbackOptions) -> Iterable[Observation]:
        ages = self.loop_ages() if self.loop_ages is not None else {}
        return [Observation(age, {"loop": name}) for name, age in sorted(ages.items())]

    def _observe_in_flight(self, _options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(ops.running, ops.op_attrs) for ops in self.ops.values()]

    def _observe_prepared(self, _options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = sorted(self._prepared.items())
        return [Observation(count, {"die": str(die), "mode": mode}) for (die, mode), count in items]


def checked_prepared(counts: Mapping[tuple[int, str], int]) -> dict[tuple[int, str], int]:
    """``counts`` for the prepared-devices gauge, each key and value checked."""
    checked: dict[tuple[int, str], int] = {}
    for key, count in counts.items():
        die, mode = key
        if isinstance(die, bool) or not isinstance(die, int) or die < 0:
            raise InvalidInput(f"die ID {die!r} must be a non-negative int", field="counts")
        if str(mode) not in PREPARED_MODES:
            raise InvalidInput(f"mode {mode!r} must be one of whole, soft, hard", field="counts")
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidInput(f"count {count!r} for die {die} must be a non-negative int", field="counts")
        checked[(die, str(mode))] = count
    return checked


def residual_attrs(kind: ResidualKind | str, n: int) -> dict[str, str]:
    """The ``kind`` label of a residual count, both checked."""
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

"""Tests for dra_driver.telemetry: counts, durations, in-flight, gauges, residuals, spans, and
the Prometheus endpoint scraped over real HTTP."""

from __future__ import annotations

import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from opentelemetry.trace import StatusCode
from prometheus_client.parser import text_string_to_metric_families

from dra_driver import telemetry
from dra_driver.errors import ErrorCode, InvalidInput, StateError, Unavailable
from dra_driver.telemetry import OpRecord, ResidualKind, Telemetry, tracing
from flexnpu_testing.telemetry import SPAN_BUFFER, ProbedTelemetry
from flexnpu_testing.waiting import wait_for

NODE = "node-a"
DRIVER = "npu.flexnpu.io"


@pytest.fixture
def tel() -> Iterator[ProbedTelemetry]:
    t = ProbedTelemetry(node_name=NODE, driver_name=DRIVER)
    yield t
    t.shutdown()


def requests_key(op: str, result: str, error_type: str = "") -> str:
    return f"flexnpu_dra_{op}_requests_total{{error_type={error_type},result={result}}}"


def duration_key(op: str, suffix: str, result: str) -> str:
    return f"flexnpu_dra_{op}_duration_seconds_{suffix}{{result={result}}}"


def in_flight_key(op: str) -> str:
    return f"flexnpu_dra_operations_in_flight{{operation={op}}}"


# -- counts and durations -------------------------------------------------------------------


@pytest.mark.parametrize(
    "op", [pytest.param("prepare", id="prepare"), pytest.param("unprepare", id="unprepare")]
)
def test_success_counts_and_duration(tel: ProbedTelemetry, op: str) -> None:
    before = time.perf_counter()
    for i in range(3):
        with tel.operation(op, claim_uid=f"uid-{i}", namespace="ns", name=f"claim-{i}") as rec:
            assert not rec.error_type  # not failed
    elapsed = time.perf_counter() - before

    snap = tel.snapshot()
    assert snap[requests_key(op, "success")] == 3
    assert snap[duration_key(op, "count", "success")] == 3
    assert 0 < snap[duration_key(op, "sum", "success")] <= elapsed
    assert snap[f"flexnpu_dra_{op}_duration_seconds_bucket{{le=+Inf,result=success}}"] == 3
    assert duration_key(op, "count", "error") not in snap
    other = "unprepare" if op == "prepare" else "prepare"
    assert snap[requests_key(other, "success")] == 0


def raise_exc(exc: BaseException) -> Callable[[OpRecord], None]:
    def body(_rec: OpRecord) -> None:
        raise exc

    return body


def fail_with(*codes: ErrorCode | str) -> Callable[[OpRecord], None]:
    def body(rec: OpRecord) -> None:
        for code in codes:
            rec.fail(code)

    return body


def fail_then_raise(code: str, exc: BaseException) -> Callable[[OpRecord], None]:
    def body(rec: OpRecord) -> None:
        rec.fail(code)
        raise exc

    return body


ERROR_CASES = [
    pytest.param(
        raise_exc(Unavailable("daemon down", code=ErrorCode.DAEMON_UNAVAILABLE, claim_uid="u")),
        "DaemonUnavailable",
        True,
        id="flexnpu-error-uses-its-code",
    ),
    pytest.param(raise_exc(StateError("mismatch")), "Internal", True, id="default-code-of-subclass"),
    pytest.param(
        raise_exc(FileNotFoundError(2, "gone")), "FileNotFoundError", True, id="foreign-exception-class"
    ),
    pytest.param(raise_exc(KeyboardInterrupt()), "KeyboardInterrupt", True, id="base-exception"),
    pytest.param(fail_with(ErrorCode.DEVICE_BUSY), "DeviceBusy", False, id="fail-with-error-code"),
    pytest.param(fail_with("LinkSetup"), "LinkSetup", False, id="fail-with-custom-identifier"),
    pytest.param(fail_with("QuotaInvalid", "DeviceBusy"), "QuotaInvalid", False, id="first-fail-wins"),
    pytest.param(
        fail_then_raise("DeviceBusy", OSError("io")), "OSError", True, id="exception-overrides-fail"
    ),
]


@pytest.mark.parametrize(("body", "error_type", "raises"), ERROR_CASES)
def test_error_paths(
    tel: ProbedTelemetry, body: Callable[[OpRecord], None], error_type: str, raises: bool
) -> None:
    caught: BaseException | None = None
    try:
        with tel.operation("prepare", claim_uid="uid-err") as rec:
            body(rec)
    except BaseException as exc:
        caught = exc
    assert (caught is not None) == raises

    snap = tel.snapshot()
    assert snap[requests_key("prepare", "error", error_type)] == 1
    assert snap[requests_key("prepare", "success")] == 0
    assert snap[duration_key("prepare", "count", "error")] == 1
    assert snap[duration_key("prepare", "sum", "error")] > 0
    assert duration_key("prepare", "count", "success") not in snap
    errors = {k: v for k, v in snap.items() if k.startswith("flexnpu_dra_prepare_requests_total") and v}
    assert errors == {requests_key("prepare", "error", error_type): 1}


def test_exception_is_reraised_unchanged(tel: ProbedTelemetry) -> None:
    err = Unavailable("busy", code=ErrorCode.DAEMON_UNAVAILABLE)
    with pytest.raises(Unavailable) as info:
        with tel.operation("unprepare", claim_uid="uid-1"):
            raise err
    assert info.value is err


def test_counter_series_precreated_at_zero(tel: ProbedTelemetry) -> None:
    snap = tel.snapshot()
    for op in ("prepare", "unprepare"):
        assert snap[requests_key(op, "success")] == 0
        for code in ErrorCode:
            assert snap[requests_key(op, "error", code.value)] == 0
        assert snap[in_flight_key(op)] == 0
    for kind in ResidualKind:
        assert snap[f"flexnpu_dra_residuals_found_total{{kind={kind.value}}}"] == 0
        assert snap[f"flexnpu_dra_residuals_removed_total{{kind={kind.value}}}"] == 0


def test_histogram_buckets_cover_1ms_to_45s(tel: ProbedTelemetry) -> None:
    with tel.operation("prepare", claim_uid="uid-1"):
        pass
    bounds = sorted(
        float(key.split("le=")[1].split(",")[0])
        for key in tel.snapshot()
        if key.startswith("flexnpu_dra_prepare_duration_seconds_bucket") and "+Inf" not in key
    )
    assert bounds == list(telemetry.DURATION_BUCKETS)
    assert bounds[0] == 0.001
    assert bounds[-1] == 45.0


def test_unbounded_error_types_fold_into_other(tel: ProbedTelemetry) -> None:
    for i in range(telemetry.MAX_EXTRA_ERROR_TYPES + 5):
        with tel.operation("prepare", claim_uid=f"uid-{i}") as rec:
            rec.fail(f"Custom{i}")
    snap = tel.snapshot()
    assert snap[requests_key("prepare", "error", "Custom0")] == 1
    assert snap[requests_key("prepare", "error", telemetry.OTHER_ERROR)] == 5
    # ErrorCode values never fold, however many custom types came first.
    with tel.operation("prepare", claim_uid="uid-x") as rec:
        rec.fail(ErrorCode.DEVICE_BUSY)
    assert tel.snapshot()[requests_key("prepare", "error", "DeviceBusy")] == 1


# -- in flight -------------------------------------------------------------------------------


def test_in_flight_inside_and_after(tel: ProbedTelemetry) -> None:
    with tel.operation("prepare", claim_uid="uid-1"):
        snap = tel.snapshot()
        assert snap[in_flight_key("prepare")] == 1
        assert snap[in_flight_key("unprepare")] == 0
        with tel.operation("unprepare", claim_uid="uid-2"):
            assert tel.snapshot()[in_flight_key("unprepare")] == 1
    snap = tel.snapshot()
    assert snap[in_flight_key("prepare")] == 0
    assert snap[in_flight_key("unprepare")] == 0


def test_in_flight_back_to_zero_after_exception(tel: ProbedTelemetry) -> None:
    with pytest.raises(RuntimeError):
        with tel.operation("prepare", claim_uid="uid-1"):
            assert tel.snapshot()[in_flight_key("prepare")] == 1
            raise RuntimeError("boom")
    assert tel.snapshot()[in_flight_key("prepare")] == 0


def test_in_flight_counts_concurrent_threads(tel: ProbedTelemetry) -> None:
    release = threading.Event()
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            with tel.operation("prepare", claim_uid=f"uid-{i}"):
                if not release.wait(timeout=30):
                    raise TimeoutError("never released")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: tel.snapshot()[in_flight_key("prepare")] == 4, what="4 operations in flight")
    finally:
        release.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors
    snap = tel.snapshot()
    assert snap[in_flight_key("prepare")] == 0
    assert snap[requests_key("prepare", "success")] == 4


# -- gauge and residuals ---------------------------------------------------------------------


def test_prepared_vnpus_gauge_updates_and_keeps_series(tel: ProbedTelemetry) -> None:
    assert not any(k.startswith("flexnpu_dra_prepared_vnpus") for k in tel.snapshot())
    tel.set_prepared_vnpus({(0, "soft"): 3, (1, "whole"): 1})
    snap = tel.snapshot()
    assert snap["flexnpu_dra_prepared_vnpus{die=0,mode=soft}"] == 3
    assert snap["flexnpu_dra_prepared_vnpus{die=1,mode=whole}"] == 1

    tel.set_prepared_vnpus({(0, "soft"): 2, (2, "hard"): 4})
    snap = tel.snapshot()
    assert snap["flexnpu_dra_prepared_vnpus{die=0,mode=soft}"] == 2
    assert snap["flexnpu_dra_prepared_vnpus{die=1,mode=whole}"] == 0
    assert snap["flexnpu_dra_prepared_vnpus{die=2,mode=hard}"] == 4


@pytest.mark.parametrize(
    "counts",
    [
        pytest.param({(-1, "soft"): 1}, id="negative-die"),
        pytest.param({("0", "soft"): 1}, id="die-not-int"),
        pytest.param({(0, "both"): 1}, id="mode-not-a-prepared-mode"),
        pytest.param({(0, "soft"): -1}, id="negative-count"),
        pytest.param({(0, "soft"): 1.5}, id="count-not-int"),
    ],
)
def test_prepared_vnpus_rejects_bad_input(
    tel: ProbedTelemetry, counts: dict[tuple[object, str], object]
) -> None:
    tel.set_prepared_vnpus({(0, "soft"): 7})
    with pytest.raises(InvalidInput) as info:
        tel.set_prepared_vnpus(counts)  # type: ignore[arg-type]
    assert info.value.field == "counts"
    assert tel.snapshot()["flexnpu_dra_prepared_vnpus{die=0,mode=soft}"] == 7  # unchanged


def test_residual_counters(tel: ProbedTelemetry) -> None:
    tel.residual_found("shm-dir", 3)
    tel.residual_found(ResidualKind.ACLSERVER)
    tel.residual_removed("shm-dir", 2)
    tel.residual_removed("shm-dir", 0)
    snap = tel.snapshot()
    assert snap["flexnpu_dra_residuals_found_total{kind=shm-dir}"] == 3
    assert snap["flexnpu_dra_residuals_found_total{kind=aclserver}"] == 1
    assert snap["flexnpu_dra_residuals_removed_total{kind=shm-dir}"] == 2
    assert snap["flexnpu_dra_residuals_removed_total{kind=aclserver}"] == 0
    assert snap["flexnpu_dra_residuals_found_total{kind=cdi-spec}"] == 0


@pytest.mark.parametrize(
    ("kind", "n", "field"),
    [
        pytest.param("pod", 1, "kind", id="unknown-kind"),
        pytest.param("shm-dir", -1, "n", id="negative-count"),
        pytest.param("shm-dir", True, "n", id="bool-count"),
    ],
)
def test_residuals_reject_bad_input(tel: ProbedTelemetry, kind: str, n: int, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        tel.residual_found(kind, n)
    assert info.value.field == field
    with pytest.raises(InvalidInput):
        tel.residual_removed(kind, n)


# -- misuse ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "uid", "field"),
    [
        pytest.param("allocate", "uid-1", "op", id="unknown-operation"),
        pytest.param("prepare", "", "claim_uid", id="empty-claim-uid"),
    ],
)
def test_operation_rejects_bad_arguments(tel: ProbedTelemetry, op: str, uid: str, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        tel.operation(op, claim_uid=uid)  # type: ignore[arg-type]
    assert info.value.field == field
    assert tel.snapshot()[in_flight_key("prepare")] == 0


@pytest.mark.parametrize(
    "code",
    [
        pytest.param("", id="empty"),
        pytest.param("claim abc failed", id="spaces"),
        pytest.param("X" * 65, id="too-long"),
    ],
)
def test_fail_rejects_non_identifier_codes(code: str) -> None:
    with pytest.raises(InvalidInput) as info:
        OpRecord().fail(code)
    assert info.value.field == "code"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"node_name": ""}, "node_name", id="empty-node"),
        pytest.param({"driver_name": ""}, "driver_name", id="empty-driver"),
        pytest.param({"metrics_port": 70000}, "metrics_port", id="port-too-large"),
        pytest.param(
            {"otlp_endpoint": "http://collector:4317", "tracing": False}, "otlp_endpoint", id="otlp-no-trace"
        ),
    ],
)
def test_constructor_rejects_bad_config(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"node_name": NODE, "driver_name": DRIVER, **kwargs}
    with pytest.raises(InvalidInput) as info:
        Telemetry(**args)  # type: ignore[arg-type]
    assert info.value.field == field


def test_otlp_endpoint_builds_the_http_exporter() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    exporter = tracing.otlp_exporter("http://127.0.0.1:4318")
    try:
        assert isinstance(exporter, OTLPSpanExporter)
    finally:
        exporter.shutdown()


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        pytest.param("http://otel:4318", "http://otel:4318/v1/traces", id="base"),
        pytest.param("http://otel:4318/", "http://otel:4318/v1/traces", id="base-slash"),
        pytest.param("https://otel/v1/traces", "https://otel/v1/traces", id="full"),
        pytest.param("http://otel:4318/custom/spans", "http://otel:4318/custom/spans", id="own-path"),
    ],
)
def test_traces_url_adds_the_signal_path_only_to_a_base_url(endpoint: str, url: str) -> None:
    assert tracing.traces_url(endpoint) == url


def test_otlp_endpoint_without_the_exporter_package_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # An install without the project's dependencies: the import of the exporter fails.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(InvalidInput) as info:
        Telemetry(node_name=NODE, driver_name=DRIVER, otlp_endpoint="http://127.0.0.1:4318")
    assert info.value.field == "otlp-endpoint"
    assert info.value.code is ErrorCode.INVALID_CONFIG
    assert "opentelemetry-exporter-otlp-proto-http" in str(info.value)


# -- spans -----------------------------------------------------------------------------------


def test_span_on_success(tel: ProbedTelemetry) -> None:
    with tel.operation("prepare", claim_uid="uid-ok", namespace="team-a", name="claim-1"):
        pass
    (span,) = tel.spans()
    assert span.name == "flexnpu.prepare"
    assert span.attributes is not None
    assert dict(span.attributes) == {
        "flexnpu.claim.uid": "uid-ok",
        "flexnpu.claim.namespace": "team-a",
        "flexnpu.claim.name": "claim-1",
    }
    assert span.status.status_code is StatusCode.UNSET
    assert span.resource.attributes["k8s.node.name"] == NODE


def test_span_on_exception(tel: ProbedTelemetry) -> None:
    with pytest.raises(Unavailable):
        with tel.operation("unprepare", claim_uid="uid-bad"):
            raise Unavailable("daemon down", code=ErrorCode.DAEMON_UNAVAILABLE)
    (span,) = tel.spans()
    assert span.name == "flexnpu.unprepare"
    assert span.attributes is not None
    assert span.attributes["flexnpu.claim.uid"] == "uid-bad"
    assert "flexnpu.claim.namespace" not in span.attributes
    assert span.attributes["error.type"] == "DaemonUnavailable"
    assert span.status.status_code is StatusCode.ERROR
    assert span.status.description is not None
    assert "daemon down" in span.status.description
    assert [e.name for e in span.events] == ["exception"]


def test_span_on_marked_failure(tel: ProbedTelemetry) -> None:
    with tel.operation("prepare", claim_uid="uid-busy") as rec:
        rec.fail(ErrorCode.DEVICE_BUSY)
    (span,) = tel.spans()
    assert span.attributes is not None
    assert span.attributes["flexnpu.claim.uid"] == "uid-busy"
    assert span.attributes["error.type"] == "DeviceBusy"
    assert span.status.status_code is StatusCode.ERROR
    assert not span.events


def test_nested_operation_span_is_a_child(tel: ProbedTelemetry) -> None:
    with tel.operation("prepare", claim_uid="outer"):
        with tel.operation("unprepare", claim_uid="inner"):
            pass
    inner, outer = tel.spans()
    assert inner.parent is not None
    assert outer.context is not None
    assert inner.parent.span_id == outer.context.span_id
    assert outer.parent is None


def test_span_buffer_is_bounded(tel: ProbedTelemetry) -> None:
    for i in range(SPAN_BUFFER + 10):
        with tel.operation("prepare", claim_uid=f"uid-{i}"):
            pass
    spans = tel.spans()
    assert len(spans) == SPAN_BUFFER
    assert spans[0].attributes is not None
    assert spans[0].attributes["flexnpu.claim.uid"] == "uid-10"


def test_tracing_off_keeps_metrics() -> None:
    t = ProbedTelemetry(node_name=NODE, driver_name=DRIVER, tracing=False)
    try:
        with t.operation("prepare", claim_uid="uid-1") as rec:
            rec.fail(ErrorCode.QUOTA)
        assert t.spans() == []
        assert t.snapshot()[requests_key("prepare", "error", "QuotaInvalid")] == 1
    finally:
        t.shutdown()


# -- disabled, shutdown, isolation -----------------------------------------------------------


def test_disabled_records_nothing_and_still_reraises() -> None:
    t = ProbedTelemetry(node_name=NODE, driver_name=DRIVER, metrics_port=0, enabled=False)
    t.start()
    assert t.port is None
    with t.operation("prepare", claim_uid="uid-1") as rec:
        rec.fail(ErrorCode.DEVICE_BUSY)
        assert rec.error_type  # failed
    with pytest.raises(ValueError, match="boom"):
        with t.operation("prepare", claim_uid="uid-2"):
            raise ValueError("boom")
    t.set_prepared_vnpus({(0, "soft"): 1})
    t.residual_found("claim")
    assert t.snapshot() == {}
    assert t.spans() == []
    # Misuse is still caught when disabled, so it shows up in tests that run without metrics.
    with pytest.raises(InvalidInput):
        t.residual_found("nope")
    t.shutdown()


def test_after_shutdown_operations_are_noops() -> None:
    t = ProbedTelemetry(node_name=NODE, driver_name=DRIVER)
    t.shutdown()
    t.shutdown()
    with t.operation("prepare", claim_uid="uid-1"):
        pass
    assert t.snapshot() == {}
    assert t.spans() == []


def test_instances_are_isolated() -> None:
    a = ProbedTelemetry(node_name="node-a", driver_name=DRIVER)
    b = ProbedTelemetry(node_name="node-b", driver_name=DRIVER)
    try:
        with a.operation("prepare", claim_uid="uid-1"):
            pass
        assert a.snapshot()[requests_key("prepare", "success")] == 1
        assert b.snapshot()[requests_key("prepare", "success")] == 0
        assert len(a.spans()) == 1
        assert b.spans() == []
    finally:
        a.shutdown()
        b.shutdown()


# -- the Prometheus endpoint over real HTTP --------------------------------------------------


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        assert resp.status == 200
        body: bytes = resp.read()
        return body.decode()


def test_http_endpoint_serves_metrics() -> None:
    with Telemetry(node_name=NODE, driver_name=DRIVER, metrics_port=0, metrics_host="127.0.0.1") as t:
        port = t.port
        assert port is not None
        assert port > 0
        with t.operation("prepare", claim_uid="uid-1"):
            pass
        with t.operation("prepare", claim_uid="uid-2") as rec:
            rec.fail(ErrorCode.DAEMON_UNAVAILABLE)
        t.set_prepared_vnpus({(3, "soft"): 2})
        t.residual_removed("cdi-spec", 4)

        text = scrape(port)
        lines = text.splitlines()
        const = f'driver="{DRIVER}"'
        node = f'node="{NODE}"'

        def line_for(name: str, *labels: str) -> str:
            found = [
                ln
                for ln in lines
                if ln.startswith(name + "{") and all(lb in ln for lb in (const, node, *labels))
            ]
            assert len(found) == 1, (name, labels, found)
            return found[0]

        assert line_for("flexnpu_dra_prepare_requests_total", 'result="success"', 'error_type=""').endswith(
            " 1.0"
        )
        assert line_for(
            "flexnpu_dra_prepare_requests_total", 'result="error"', 'error_type="DaemonUnavailable"'
        ).endswith(" 1.0")
        assert line_for("flexnpu_dra_unprepare_requests_total", 'result="success"').endswith(" 0.0")
        assert line_for("flexnpu_dra_prepare_duration_seconds_count", 'result="success"').endswith(" 1.0")
        assert line_for(
            "flexnpu_dra_prepare_duration_seconds_bucket", 'result="error"', 'le="45.0"'
        ).endswith(" 1.0")
        assert line_for("flexnpu_dra_operations_in_flight", 'operation="prepare"').endswith(" 0.0")
        assert line_for("flexnpu_dra_prepared_vnpus", 'die="3"', 'mode="soft"').endswith(" 2.0")
        assert line_for("flexnpu_dra_residuals_removed_total", 'kind="cdi-spec"').endswith(" 4.0")
        assert "# TYPE flexnpu_dra_prepare_duration_seconds histogram" in lines
        assert "# TYPE flexnpu_dra_prepare_requests_total counter" in lines
        assert "# TYPE flexnpu_dra_operations_in_flight gauge" in lines

        # The whole page parses as Prometheus text, and no series lacks the constant labels.
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["flexnpu_dra_prepare_duration_seconds"].type == "histogram"
        assert families["flexnpu_dra_residuals_found"].type == "counter"
        for family in families.values():
            for sample in family.samples:
                assert sample.labels.get("node") == NODE, sample
                assert sample.labels.get("driver") == DRIVER, sample

        # A second scrape sees later operations (the reader collects on every request).
        with t.operation("unprepare", claim_uid="uid-1"):
            pass
        lines = scrape(port).splitlines()
        assert line_for("flexnpu_dra_unprepare_requests_total", 'result="success"').endswith(" 1.0")

    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_http_endpoint_port_in_use() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        t = Telemetry(node_name=NODE, driver_name=DRIVER, metrics_port=port, metrics_host="127.0.0.1")
        try:
            with pytest.raises(InvalidInput) as info:
                t.start()
            assert info.value.field == "metrics_port"
            assert info.value.code is ErrorCode.INVALID_CONFIG
            assert t.port is None
        finally:
            t.shutdown()


def test_negative_port_records_without_server() -> None:
    with ProbedTelemetry(node_name=NODE, driver_name=DRIVER, metrics_port=-1) as t:
        assert t.port is None
        t.residual_found("link-address")
        assert t.snapshot()["flexnpu_dra_residuals_found_total{kind=link-address}"] == 1

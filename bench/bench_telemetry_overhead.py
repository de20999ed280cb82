"""Per-operation cost of ``Telemetry.operation()`` against an empty context manager, same run.

Each variant times ``--n`` single ``with`` blocks (empty body) with ``perf_counter_ns`` and
prints the median and p99 per call, and the overhead over the empty baseline. Variants:
baseline (``contextlib.nullcontext``), disabled (``enabled=False``), metrics only
(``tracing=False``), metrics + tracing (the default: spans made, exported nowhere without an
OTLP endpoint, as on a node), the same with a bounded span recorder attached (what every node
kept until the test-only ``spans()`` went, ``flexnpu_testing/telemetry.py``), and the error path
(``rec.fail``).
Rounds are interleaved so drift on a busy machine hits every variant alike.

Usage: ``.venv/bin/python bench/bench_telemetry_overhead.py [--n 20000] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

from dra_driver.telemetry import Telemetry
from flexnpu_testing.telemetry import metric_values, record_spans

Body = Callable[[], None]


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _variants(
    full: Telemetry, recorded: Telemetry, metrics_only: Telemetry, disabled: Telemetry
) -> dict[str, Body]:
    def baseline() -> None:
        with contextlib.nullcontext():
            pass

    def off() -> None:
        with disabled.operation("prepare", claim_uid="uid-1", namespace="ns", name="claim"):
            pass

    def metrics() -> None:
        with metrics_only.operation("prepare", claim_uid="uid-1", namespace="ns", name="claim"):
            pass

    def traced() -> None:
        with full.operation("prepare", claim_uid="uid-1", namespace="ns", name="claim"):
            pass

    def traced_recorded() -> None:
        with recorded.operation("prepare", claim_uid="uid-1", namespace="ns", name="claim"):
            pass

    def traced_fail() -> None:
        with full.operation("unprepare", claim_uid="uid-1", namespace="ns", name="claim") as rec:
            rec.fail("DeviceBusy")

    return {
        "empty context manager": baseline,
        "disabled (enabled=False)": off,
        "metrics only (tracing=False)": metrics,
        "metrics + tracing": traced,
        "metrics + tracing + span recorder": traced_recorded,
        "metrics + tracing, rec.fail()": traced_fail,
    }


def _time(body: Body, n: int, out: list[int]) -> None:
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        body()
        out.append(clock() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="calls per variant per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds")
    args = parser.parse_args()

    full = Telemetry(node_name="bench", driver_name="npu.flexnpu.io")
    recorded = Telemetry(node_name="bench", driver_name="npu.flexnpu.io")
    assert recorded.tracing is not None
    recent = record_spans(recorded.tracing)
    metrics_only = Telemetry(node_name="bench", driver_name="npu.flexnpu.io", tracing=False)
    disabled = Telemetry(node_name="bench", driver_name="npu.flexnpu.io", enabled=False)
    try:
        variants = _variants(full, recorded, metrics_only, disabled)
        samples: dict[str, list[int]] = {name: [] for name in variants}
        for body in variants.values():  # warm-up: first series, caches, imports
            _time(body, 1000, [])
        for _ in range(args.rounds):
            for name, body in variants.items():
                _time(body, args.n, samples[name])
        base_med = statistics.median(samples["empty context manager"])
        base_p99 = _pct(samples["empty context manager"], 0.99)
        total = args.n * args.rounds
        print(f"telemetry overhead per operation, {total} calls per variant (ns; us for overhead)")
        print(f"{'variant':34} {'median':>9} {'p99':>9} {'+median':>9} {'+p99':>9}")
        for name, values in samples.items():
            med = statistics.median(values)
            p99 = _pct(values, 0.99)
            print(
                f"{name:34} {med:9.0f} {p99:9.0f} {(med - base_med) / 1000:8.2f}us {(p99 - base_p99) / 1000:8.2f}us"
            )
        snap = metric_values(full.registry)
        print(
            "recorded prepare successes:",
            snap["flexnpu_dra_prepare_requests_total{error_type=,result=success}"],
        )
        print("finished spans the recorder kept:", len(recent.finished()))
    finally:
        for tel in (full, recorded, metrics_only, disabled):
            tel.shutdown()


if __name__ == "__main__":
    main()

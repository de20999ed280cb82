"""Compute quotas across aclserver processes sharing one die (fixed, elastic, best-effort).

Each test runs one or two real aclservers (separate claims) on the same die ledger and clients
that saturate their vNPU. Tolerances are generous (behaviour, not precision: bench_compute.py
measures the precise figures).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_runtime.aclserver import ledger
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer, Tenant
from flexnpu_wire.codes import Policy

WINDOW_S = 2.0
WARMUP_S = 0.3


@contextlib.contextmanager
def servers(tmp_path: Path, specs: list[tuple[int, Policy, bool]]) -> Iterator[list[RunningAclServer]]:
    """One aclserver per (compute %, policy, memory_only), all on die 0 of one ledger."""
    with contextlib.ExitStack() as stack:
        ledger_dir = str(tmp_path / "ledger")
        yield [
            stack.enter_context(
                aclserver_harness.running_aclserver(
                    tmp_path,
                    ledger_dir=ledger_dir,
                    shares=[
                        aclserver_harness.share(0, die=0, compute=pct, policy=policy, memory_only=mem_only)
                    ],
                )
            )
            for pct, policy, mem_only in specs
        ]


def measure(tenants: list[Tenant]) -> list[float]:
    import time

    for t in tenants:
        t.start()
    try:
        pause = threading.Event()
        pause.wait(WARMUP_S)  # measurement window, not synchronisation
        t0 = time.monotonic()
        pause.wait(WINDOW_S)
        t1 = time.monotonic()
    finally:
        for t in tenants:
            t.stop()
    for t in tenants:
        assert t.error is None, t.error
    return [t.share(t0, t1) for t in tenants]


@pytest.mark.parametrize(
    ("specs", "busy", "expect"),
    [
        pytest.param(
            [(30, Policy.FIXED, False), (70, Policy.FIXED, False)],
            [0, 1],
            [(0.20, 0.40), (0.60, 0.80)],
            id="fixed-30-70-both-saturating",
        ),
        pytest.param(
            [(30, Policy.FIXED, False), (70, Policy.FIXED, False)],
            [0],
            [(0.20, 0.40)],
            id="fixed-alone-stays-at-quota",
        ),
        pytest.param(
            [(30, Policy.ELASTIC, False), (70, Policy.ELASTIC, False)],
            [0],
            [(0.80, 1.01)],
            id="elastic-borrows-idle-share",
        ),
        pytest.param(
            [(30, Policy.ELASTIC, False), (70, Policy.ELASTIC, False)],
            [0, 1],
            [(0.20, 0.40), (0.60, 0.80)],
            id="elastic-both-busy-follow-quota",
        ),
        pytest.param([(30, Policy.BEST_EFFORT, False)], [0], [(0.80, 1.01)], id="best-effort-uncapped"),
        pytest.param(
            [(30, Policy.FIXED, False), (0, Policy.ELASTIC, True)],
            [1],
            [(0.80, 1.01)],
            id="memory-only-share-not-capped",
        ),
    ],
)
def test_die_time_follows_policy(
    tmp_path: Path, specs: list[tuple[int, Policy, bool]], busy: list[int], expect: list[tuple[float, float]]
) -> None:
    with servers(tmp_path, specs) as running:
        shares = measure([Tenant(running[i].conf()) for i in busy])
        for got, (lo, hi) in zip(shares, expect, strict=True):
            assert lo <= got <= hi, f"die shares {shares}, expected {expect}"
        entries = ledger.read_entries(str(tmp_path / "ledger"), 0)
        assert sorted(e.pid for e in entries) == sorted(s.proc.pid for s in running)


def test_shares_of_one_claim_on_two_dies_follow_their_own_quota(tmp_path: Path) -> None:
    ledger_dir = str(tmp_path / "ledger")
    shares = [aclserver_harness.share(0, die=10, compute=30), aclserver_harness.share(1, die=11, compute=60)]
    with aclserver_harness.running_aclserver(tmp_path, shares=shares, ledger_dir=ledger_dir) as srv:
        (got,) = measure([Tenant(srv.conf(), device=1)])
        assert 0.50 <= got <= 0.70
        assert [e.quota for e in ledger.read_entries(ledger_dir, 10)] == [30]
        assert [e.quota for e in ledger.read_entries(ledger_dir, 11)] == [60]

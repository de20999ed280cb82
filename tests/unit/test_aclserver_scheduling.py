"""Compute-quota decisions, checked directly and by simulating saturating shares on one die."""

from __future__ import annotations

import dataclasses

import pytest

from flexnpu_runtime.aclserver import scheduling
from flexnpu_runtime.aclserver.scheduling import Row
from flexnpu_wire.codes import Policy

P = scheduling.PERIOD_US


def row(
    slot: int,
    quota: int,
    policy: Policy = Policy.FIXED,
    *,
    used: int = 0,
    waiting: bool = True,
    memory_only: bool = False,
) -> Row:
    return Row(slot, quota, policy, memory_only, waiting, 0.0, 0, used)


def test_die_busy_beyond_lookahead_means_wait() -> None:
    d = scheduling.decide([row(0, 50)], 0, now=0.0, busy_until=0.010)
    assert not d.granted and d.retry_at == pytest.approx(0.010 - scheduling.LOOKAHEAD_US / 1e6)


def test_grant_is_booked_when_the_die_frees() -> None:
    d = scheduling.decide([row(0, 50)], 0, now=0.0100, busy_until=0.0105)
    assert d.granted and d.start == 0.0105


def test_fixed_exhausted_waits_for_next_period_even_if_idle() -> None:
    d = scheduling.decide([row(0, 30, used=30_000)], 0, now=0.02, busy_until=0.0)
    assert not d.granted and d.retry_at == pytest.approx(P / 1e6, abs=1e-5)


def test_elastic_exhausted_borrows_when_nobody_in_budget_waits() -> None:
    rows = [row(0, 30, Policy.ELASTIC, used=30_000), row(1, 70, Policy.ELASTIC, waiting=False)]
    assert scheduling.decide(rows, 0, now=0.02, busy_until=0.0).granted
    rows[1] = dataclasses.replace(rows[1], waiting=True)
    assert not scheduling.decide(rows, 0, now=0.02, busy_until=0.0).granted


def test_least_used_fraction_goes_first() -> None:
    rows = [row(0, 30, used=15_000), row(1, 70, used=10_000)]
    assert scheduling.decide(rows, 1, now=0.02, busy_until=0.0).granted
    assert not scheduling.decide(rows, 0, now=0.02, busy_until=0.0).granted


def test_debt_decays_by_one_budget_per_period() -> None:
    r = row(0, 10, used=25_000)
    assert scheduling.effective_used(r, 1) == 15_000
    assert scheduling.effective_used(r, 3) == 0


def test_slice_never_exceeds_a_capped_budget() -> None:
    assert scheduling.slice_for(row(0, 1), 5_000) == 1_000
    assert scheduling.slice_for(row(0, 1, Policy.BEST_EFFORT), 5_000) == 5_000


def simulate(shares: list[tuple[int, Policy, bool]], seconds: float = 5.0) -> list[float]:
    """Saturating (busy) shares asking for 5 ms slices; returns each share's fraction of the die."""
    rows = [row(i, q, p, waiting=busy) for i, (q, p, busy) in enumerate(shares)]
    total = [0] * len(rows)
    now, busy_until = 0.0, 0.0
    while now < seconds:
        retry = []
        for i in [i for i, r in enumerate(rows) if r.waiting]:
            d = scheduling.decide(rows, i, now=now, busy_until=busy_until)
            if d.granted:
                length = scheduling.slice_for(rows[i], scheduling.SLICE_US)
                rows[i] = dataclasses.replace(
                    rows[i], period_idx=d.period_idx, period_used_us=d.used_before_us + length
                )
                busy_until = d.start + length / 1e6
                total[i] += length
                break
            retry.append(d.retry_at)
        else:
            now = max(now, min(retry))
            continue
        now = max(now, busy_until - scheduling.LOOKAHEAD_US / 1e6)
    return [t / 1e6 / seconds for t in total]


@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        pytest.param(
            [(30, Policy.FIXED, True), (70, Policy.FIXED, True)], [0.30, 0.70], id="fixed-30-70-saturated"
        ),
        pytest.param(
            [(30, Policy.FIXED, True), (70, Policy.FIXED, False)], [0.30, 0.0], id="fixed-alone-stays-capped"
        ),
        pytest.param(
            [(30, Policy.ELASTIC, True), (70, Policy.ELASTIC, False)], [1.0, 0.0], id="elastic-borrows-idle"
        ),
        pytest.param(
            [(30, Policy.ELASTIC, True), (70, Policy.ELASTIC, True)], [0.30, 0.70], id="elastic-both-busy"
        ),
        pytest.param([(10, Policy.BEST_EFFORT, True)], [1.0], id="best-effort-uncapped"),
        pytest.param([(1, Policy.FIXED, True)], [0.01], id="fixed-one-percent"),
    ],
)
def test_simulated_shares(shares: list[tuple[int, Policy, bool]], expected: list[float]) -> None:
    assert simulate(shares) == pytest.approx(expected, abs=0.01)

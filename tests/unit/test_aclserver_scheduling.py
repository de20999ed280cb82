"""Compute-quota decisions, checked directly and by simulating saturating shares on one die."""

from __future__ import annotations

import dataclasses

import pytest

from flexnpu_runtime.aclserver import scheduling
from flexnpu_runtime.aclserver.scheduling import Open, Row
from flexnpu_wire.codes import Policy, Priority

P = scheduling.PERIOD_US


def row(
    slot: int,
    quota: int,
    policy: Policy = Policy.FIXED,
    *,
    used: int = 0,
    waiting: bool = True,
    memory_only: bool = False,
    priority: Priority = Priority.NORMAL,
    last_grant: float = -1.0,
) -> Row:
    return Row(slot, quota, policy, memory_only, waiting, 0.0, 0, used, last_grant, priority)


LC, BATCH = Priority.LATENCY_CRITICAL, Priority.BATCH
Y = scheduling.YIELD_US / 1e6


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


def simulate(
    shares: list[tuple[int, Policy, bool]], seconds: float = 5.0, priorities: tuple[Priority, ...] = ()
) -> list[float]:
    """Saturating (busy) shares asking for 5 ms slices; returns each share's fraction of the die."""
    rows = [
        row(i, q, p, waiting=busy, priority=priorities[i] if priorities else Priority.NORMAL)
        for i, (q, p, busy) in enumerate(shares)
    ]
    total = [0] * len(rows)
    now, busy_until = 0.0, 0.0
    while now < seconds:
        retry = []
        for i in [i for i, r in enumerate(rows) if r.waiting]:
            d = scheduling.decide(rows, i, now=now, busy_until=busy_until)
            if d.granted:
                length = d.slice_us
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


@pytest.mark.parametrize(
    ("rows", "first"),
    [
        pytest.param(
            [row(0, 50, used=40_000, priority=LC), row(1, 50)], 0, id="latency-critical-before-less-used"
        ),
        pytest.param([row(0, 50, used=40_000), row(1, 50, priority=BATCH)], 0, id="normal-before-batch"),
        pytest.param(
            [
                row(0, 50, Policy.BEST_EFFORT, used=60_000, priority=LC),
                row(1, 50, Policy.BEST_EFFORT, used=10_000),
            ],
            1,
            id="over-its-quota-latency-critical-is-normal",
        ),
        pytest.param(
            [row(0, 50, used=40_000, priority=LC, memory_only=True), row(1, 50)],
            1,
            id="memory-only-never-first",
        ),
    ],
)
def test_who_goes_first(rows: list[Row], first: int) -> None:
    granted = [r.slot for r in rows if scheduling.decide(rows, r.slot, now=0.02, busy_until=0.0).granted]
    assert granted == [first]


@pytest.mark.parametrize(
    ("opens", "now", "lc_until", "start", "insert"),
    [
        pytest.param([Open(1, 0.0, 0.005, True)], 0.00123, 0.0, 0.00125, True, id="next-boundary-of-running"),
        pytest.param([Open(1, 0.0, 0.005, True)], 0.0, 0.0, 0.0, True, id="boundary-now"),
        pytest.param([Open(1, 0.0, 0.005, False)], 0.00123, 0.0, 0.005, False, id="not-splittable-after-it"),
        pytest.param(
            [Open(1, 0.0, 0.005, True), Open(1, 0.005, 0.010, True)],
            0.0049995,
            0.0,
            0.005,
            True,
            id="booked-next",
        ),
        pytest.param([Open(1, 0.0, 0.005, True)], 0.00123, 0.0022, 0.0022, True, id="after-inserted-slice"),
        pytest.param(
            [Open(2, 0.0, 0.003, False), Open(1, 0.003, 0.008, True)],
            0.001,
            0.0,
            0.003,
            True,
            id="other-lc-first",
        ),
    ],
)
def test_latency_critical_goes_in_at_the_next_boundary(
    opens: list[Open], now: float, lc_until: float, start: float, insert: bool
) -> None:
    rows = [row(0, 50, priority=LC), row(1, 50, priority=BATCH), row(2, 10, priority=LC, waiting=False)]
    busy_until = max(g.end for g in opens)
    d = scheduling.decide(
        rows, 0, now=now, busy_until=busy_until, opens=opens, lc_until=lc_until, want_us=1_000
    )
    assert d.granted and d.start == pytest.approx(start, abs=1e-9) and d.insert is insert
    assert d.slice_us == 1_000 and not d.splittable
    assert scheduling.decide(rows, 1, now=now, busy_until=busy_until, opens=opens).granted is False


def test_booking_that_waits_to_start_holds_back_the_unprioritized() -> None:
    rows = [row(0, 50), row(1, 50)]
    d = scheduling.decide(rows, 0, now=0.001, busy_until=0.004, last_start=0.002)
    assert not d.granted and d.retry_at == pytest.approx(0.002, abs=1e-5)


@pytest.mark.parametrize(
    ("other", "slice_us", "splittable"),
    [
        pytest.param(
            row(1, 50, waiting=False, last_grant=0.015), scheduling.BORROW_SLICE_US, False, id="normal"
        ),
        pytest.param(
            row(1, 50, waiting=False, last_grant=0.015, priority=LC), 5_000, True, id="latency-critical"
        ),
        pytest.param(row(1, 50, waiting=False, last_grant=-1.0), 5_000, False, id="idle"),
    ],
)
def test_borrowing_is_work_conserving(other: Row, slice_us: int, splittable: bool) -> None:
    """An over-budget elastic share borrows whenever no in-budget share waits (also right after one ran)."""
    rows = [row(0, 50, Policy.ELASTIC, used=60_000, priority=BATCH), other]
    d = scheduling.decide(rows, 0, now=0.02, busy_until=0.0)
    assert d.granted and d.slice_us == slice_us and d.splittable is splittable


@pytest.mark.parametrize(
    ("shares", "priorities", "expected"),
    [
        pytest.param(
            [(30, Policy.ELASTIC, True), (70, Policy.ELASTIC, True)], (LC, BATCH), [0.30, 0.70], id="elastic"
        ),
        pytest.param(
            [(30, Policy.FIXED, True), (70, Policy.FIXED, True)], (LC, BATCH), [0.30, 0.70], id="fixed"
        ),
        pytest.param(
            [(30, Policy.BEST_EFFORT, True), (70, Policy.BEST_EFFORT, True)],
            (LC, BATCH),
            [0.30, 0.70],
            id="best-effort",
        ),
        pytest.param(
            [(30, Policy.ELASTIC, True), (70, Policy.ELASTIC, False)],
            (BATCH, LC),
            [1.0, 0.0],
            id="batch-fills",
        ),
    ],
)
def test_priority_never_buys_more_than_the_quota(
    shares: list[tuple[int, Policy, bool]], priorities: tuple[Priority, ...], expected: list[float]
) -> None:
    assert simulate(shares, priorities=priorities) == pytest.approx(expected, abs=0.01)


def simulate_sync(
    quotas: list[int], policy: Policy, *, task_us: int = 1_000, gap_us: int = 150
) -> list[float]:
    """Tenants that call synchronously: a ``task_us`` task, then ``gap_us`` before the next one (the
    client's round trip). Event by event, as the ledger would ask; returns each one's fraction of 2 s
    and, last, the die's idle fraction."""
    seconds = 2.0
    rows = [row(i, q, policy, waiting=True) for i, q in enumerate(quotas)]
    left = [task_us] * len(rows)  # of the current task
    ready = [0.0] * len(rows)  # when the current task was asked for
    total = [0] * len(rows)
    now, busy_until, busy, opens = 0.0, 0.0, 0, [Open(-1, 0.0, 0.0, False)]
    while now < seconds:
        order = sorted(range(len(rows)), key=lambda i: ready[i])
        asked = [i for i in order if ready[i] <= now + 1e-9]
        got = None
        for i in asked:
            d = scheduling.decide(rows, i, now=now, busy_until=busy_until, want_us=left[i], opens=opens)
            if d.granted:
                got = (i, d)
                break
        if got is None:
            waits = [ready[i] for i in range(len(rows)) if ready[i] > now + 1e-9]
            now = min([now + 50e-6, *waits])
            continue
        i, d = got
        end = d.start + d.slice_us / 1e6
        busy += d.slice_us if d.start < seconds else 0
        rows = [
            dataclasses.replace(r, period_idx=d.period_idx, period_used_us=d.used_before_us + d.slice_us, last_grant=now,
                                waiting=False)
            if r.slot == i else dataclasses.replace(r, waiting=ready[r.slot] <= now + 1e-9)
            for r in rows
        ]  # fmt: skip
        total[i] += d.slice_us
        left[i] -= d.slice_us
        if left[i] <= 0:
            left[i], ready[i] = task_us, end + gap_us / 1e6
        else:
            ready[i] = end  # the rest of its task, asked for as the slice ends
        busy_until, now, opens = end, max(now, end), [Open(i, d.start, end, False)]
    return [t / 1e6 / seconds for t in total] + [1 - busy / 1e6 / seconds]


@pytest.mark.parametrize("policy", [Policy.FIXED, Policy.ELASTIC])
def test_synchronous_callers_split_by_quota_and_keep_the_die_busy(policy: Policy) -> None:
    a, b, idle = simulate_sync([30, 70], policy)
    assert a == pytest.approx(0.30, abs=0.03) and b == pytest.approx(0.70, abs=0.03)
    assert idle < 0.03

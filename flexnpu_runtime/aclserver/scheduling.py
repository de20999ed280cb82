"""Pure compute-quota decisions for one die: may this share start a kernel slice now?

The die runs one kernel slice at a time. Time is cut into periods of ``PERIOD_US``; a capped
share (policy fixed or elastic) may use ``compute_percent`` of each period. Overruns are
carried as debt that decays by one budget per period. Among the shares waiting for the die,
the one that used the smallest fraction of its budget in this period goes first, so shares
that all saturate the die split it in proportion to their quotas.

- ``fixed``: a share that used its budget waits for the next period even if the die idles.
- ``elastic``: a share that used its budget may borrow the die while no in-budget share is busy
  (waiting, or granted a slice in the last ``ACTIVE_S``): idle shares' time is lent out.
- ``best-effort`` and ``memory_only`` shares are not capped (free contention, weighted).

A grant may be booked up to ``LOOKAHEAD_US`` before the die frees, so hand-offs waste no time.
No I/O, no clock: the caller passes ``now`` (seconds, CLOCK_MONOTONIC) and the ledger rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flexnpu_wire.codes import Policy

__all__ = [
    "LOOKAHEAD_US",
    "PERIOD_US",
    "SLICE_US",
    "Decision",
    "Row",
    "budget_us",
    "decide",
    "effective_used",
    "is_capped",
    "period_of",
    "slice_for",
]

PERIOD_US = 100_000
SLICE_US = 5_000
LOOKAHEAD_US = 1_000
_RETRY_US = 300
_EPSILON_S = 1e-6
ACTIVE_S = 2 * SLICE_US / 1e6
"""A share granted a slice this recently still counts as busy (it is running, not idle)."""


@dataclass(frozen=True, slots=True)
class Row:
    """One live ledger entry, as the scheduler sees it."""

    slot: int
    quota: int
    policy: Policy
    memory_only: bool
    waiting: bool
    waiting_since: float
    period_idx: int
    period_used_us: int
    last_grant: float = -1.0


@dataclass(frozen=True, slots=True)
class Decision:
    """Either a grant (``granted``, slice starts at ``start``) or a time to ask again."""

    granted: bool
    start: float = 0.0
    period_idx: int = 0
    used_before_us: int = 0
    retry_at: float = 0.0


def period_of(t: float) -> int:
    return int(t * 1_000_000) // PERIOD_US


def budget_us(quota: int) -> int:
    return quota * PERIOD_US // 100


def is_capped(row: Row) -> bool:
    return not row.memory_only and row.policy is not Policy.BEST_EFFORT


def effective_used(row: Row, period_idx: int) -> int:
    """Time used in ``period_idx``: this period's use, or the debt left from earlier periods."""
    gap = period_idx - row.period_idx
    if gap <= 0:
        return row.period_used_us
    return max(0, row.period_used_us - gap * budget_us(row.quota))


def slice_for(row: Row, remaining_us: int) -> int:
    """The longest slice a share may ask for (a capped share never more than its budget)."""
    limit = SLICE_US
    if is_capped(row):
        limit = min(limit, max(budget_us(row.quota), 100))
    return max(1, min(remaining_us, limit))


def decide(rows: Sequence[Row], me: int, *, now: float, busy_until: float) -> Decision:
    """Whether the share in slot ``me`` may start its next slice, and when to ask again if not."""
    by_slot = {r.slot: r for r in rows}
    mine = by_slot[me]
    if busy_until - now > LOOKAHEAD_US / 1e6 + _EPSILON_S:
        return Decision(False, retry_at=busy_until - LOOKAHEAD_US / 1e6)
    start = max(now, busy_until)
    pidx = period_of(start)
    waiting = [r for r in rows if r.waiting or r.slot == me]

    def in_budget(r: Row) -> bool:
        return not is_capped(r) or effective_used(r, pidx) < budget_us(r.quota)

    if in_budget(mine):
        candidates = [r for r in waiting if in_budget(r)]
    elif mine.policy is Policy.FIXED:
        return Decision(False, retry_at=((pidx + 1) * PERIOD_US + 1) / 1e6)
    elif any(in_budget(r) and (r.waiting or now - r.last_grant < ACTIVE_S) for r in rows if r.slot != me):
        return Decision(False, retry_at=max(now + _RETRY_US / 1e6, busy_until - LOOKAHEAD_US / 1e6))
    else:
        candidates = waiting
    chosen = min(
        candidates, key=lambda r: (effective_used(r, pidx) / max(r.quota, 1), r.waiting_since, r.slot)
    )
    if chosen.slot != me:
        return Decision(False, retry_at=max(now + _RETRY_US / 1e6, busy_until - LOOKAHEAD_US / 1e6))
    return Decision(True, start=start, period_idx=pidx, used_before_us=effective_used(mine, pidx))

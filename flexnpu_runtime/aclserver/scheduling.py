"""Pure compute-quota decisions for one die: may this share start a kernel slice now, and how long?

The die runs one kernel slice at a time. Time is cut into periods of ``PERIOD_US``; a capped
share (policy fixed or elastic) may use ``compute_percent`` of each period. Overruns are
carried as debt that decays by one budget per period. The **policy** says how much of the die a
share gets; its **priority** only says when (``docs/latency.md``):

- ``fixed``: a share that used its budget waits for the next period even if the die idles.
- ``elastic``: a share that used its budget may borrow the die whenever no in-budget share is
  waiting for it (work-conserving: the die never idles while work waits). A borrowed slice is at
  most ``BORROW_SLICE_US`` while an in-budget share that is not prioritized is active, so that
  share soon has the die back (a prioritized one goes in at the next boundary anyway).
- A capped share ahead of another active share (a larger fraction of its budget used) that is between two
  synchronous calls (neither waiting nor holding a grant) gets ``GAP_SLICE_US`` slices: it fills the
  gap, and the other has the die back soon.
- ``best-effort`` and ``memory_only`` shares are not capped (free contention, weighted).

Among the shares waiting for the die and within their quota's part of this period, a
**prioritized** share goes first (``latency-critical``, not memory-only), then ``normal``, then
``batch``; shares beyond their part (best-effort, borrowing) come last, all alike — on every
policy, so priority never buys more than the quota. Within a rank, the share that used the
smallest fraction of its budget, so shares that all saturate the die split it in proportion to
their quotas.

A grant may be booked up to ``LOOKAHEAD_US`` before the die frees, so hand-offs waste no time; at
most one booking waits to start (``last_start`` after ``now``): nobody else books until it
started. The grants that reach past now (at most two: ``Open``) are **splittable** when a
latency-critical share is registered on the die (``Decision.splittable``, decided at the grant):
a prioritized share takes the die at the next ``YIELD_US`` boundary of such a grant (counted from
its start; before it, for one that has not started) — the slice is inserted there
(``Decision.insert``) and every splittable grant reaching past it ends that much later (its holder
asks ``ledger.DieLedger.confirm`` at its end). So a latency-critical call waits at most
``YIELD_US`` for a lower-ranked slice, which is what a die running that slice as ``YIELD_US``
pieces would do, and the lower-ranked share still gets its whole slice (no hand-off of its own
between the pieces). A prioritized share books however far ahead; its own slices are not split.
No I/O, no clock: the caller passes ``now`` (seconds, CLOCK_MONOTONIC), the die's state and the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from flexnpu_wire.codes import Policy, Priority

__all__ = [
    "ACTIVE_S",
    "BORROW_SLICE_US",
    "GAP_SLICE_US",
    "LOOKAHEAD_US",
    "PERIOD_US",
    "SLICE_US",
    "YIELD_US",
    "Decision",
    "Open",
    "Row",
    "budget_us",
    "decide",
    "effective_used",
    "is_capped",
    "period_of",
    "prioritized",
    "slice_for",
]

PERIOD_US = 100_000
SLICE_US = 5_000
LOOKAHEAD_US = SLICE_US
"""A grant may be booked this far ahead: one slice, so its holder books the next one as this starts
(one wake-up per slice, with a whole slice of slack on a loaded machine)."""
YIELD_US = 50
"""A splittable slice yields to a prioritized one at every this many microseconds from its start."""
BORROW_SLICE_US = 1_000
"""An over-budget (borrowing) share's slice while an in-budget share is active."""
GAP_SLICE_US = 250
"""A capped share's slice while a share that used less of its budget is active but not waiting (between
two synchronous calls): the die is not left idle, and the other has it back soon, so shares that call
synchronously split the die by quota (not by call rate) and both stay busy to the period's end."""
_RETRY_US = 300
_EPSILON_S = 1e-6
ACTIVE_S = 2 * SLICE_US / 1e6
"""An in-budget share granted a slice this recently still counts as active (it is running, not idle)."""


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
    priority: Priority = Priority.NORMAL


@dataclass(frozen=True, slots=True)
class Open:
    """A grant that may reach past now (one of the die's last two): where it is now."""

    slot: int
    start: float
    end: float
    splittable: bool


@dataclass(frozen=True, slots=True)
class Decision:
    """Either a grant (``granted``: a slice of ``slice_us`` starts at ``start``) or a time to ask
    again. ``insert``: the slice goes in at ``start`` and every open grant reaching past it moves
    (ends) that much later; otherwise it is the die's new last grant, ``splittable`` or not."""

    granted: bool
    start: float = 0.0
    period_idx: int = 0
    used_before_us: int = 0
    retry_at: float = 0.0
    slice_us: int = 0
    insert: bool = False
    splittable: bool = False


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


def prioritized(row: Row, period_idx: int) -> bool:
    """A latency-critical share within its quota's part of the period (any policy): it goes first."""
    return (
        row.priority is Priority.LATENCY_CRITICAL
        and not row.memory_only
        and effective_used(row, period_idx) < budget_us(row.quota)
    )


def slice_for(row: Row, remaining_us: int) -> int:
    """The longest slice a share may ask for with nobody else in the way (a capped share never
    more than its budget); ``decide`` shortens it while others are active."""
    limit = SLICE_US
    if is_capped(row):
        limit = min(limit, max(budget_us(row.quota), 100))
    return max(1, min(remaining_us, limit))


def decide(
    rows: Sequence[Row],
    me: int,
    *,
    now: float,
    busy_until: float,
    last_start: float = 0.0,
    want_us: int = SLICE_US,
    opens: Sequence[Open] = (),
    lc_until: float = 0.0,
) -> Decision:
    """Whether the share in slot ``me`` may start its next slice (of at most ``want_us``), and when
    to ask again if not. ``busy_until`` is the end of the die's last grant, ``last_start`` its start
    (after ``now``: booked, not started yet); ``opens`` the grants that may reach past now and
    ``lc_until`` the end of the last prioritized slice inserted among them."""
    by_slot = {r.slot: r for r in rows}
    mine = by_slot[me]
    if prioritized(mine, period_of(now)):
        floor = max(now, lc_until)
        return _prioritized(
            rows, mine, now=now, floor=floor, busy_until=busy_until, want_us=want_us, opens=opens
        )
    if last_start > now + _EPSILON_S:  # a booking waits to start
        return Decision(False, retry_at=last_start + _EPSILON_S)
    start = max(now, busy_until)
    pidx = period_of(start)
    if busy_until - now > LOOKAHEAD_US / 1e6 + _EPSILON_S:
        return Decision(False, retry_at=busy_until - LOOKAHEAD_US / 1e6)
    waiting = [r for r in rows if r.waiting or r.slot == me]

    def in_budget(r: Row) -> bool:
        return not is_capped(r) or effective_used(r, pidx) < budget_us(r.quota)

    retry = Decision(False, retry_at=max(now + _RETRY_US / 1e6, busy_until - LOOKAHEAD_US / 1e6))
    if in_budget(mine):
        candidates = [r for r in waiting if in_budget(r)]
    elif mine.policy is Policy.FIXED:
        return Decision(False, retry_at=((pidx + 1) * PERIOD_US + 1) / 1e6)
    elif any(in_budget(r) and r.waiting for r in rows if r.slot != me):
        return retry  # borrow only what nobody in budget waits for
    else:
        candidates = waiting
    if _first(candidates, pidx).slot != me:
        return retry
    used = effective_used(mine, pidx)
    length = slice_for(mine, want_us)
    holding = {g.slot for g in opens if g.end > now}  # running or booked: not between two calls
    if (
        is_capped(mine)
        and used >= budget_us(mine.quota)
        and any(
            is_capped(r)
            and effective_used(r, pidx) < budget_us(r.quota)
            and (r.waiting or now - r.last_grant < ACTIVE_S)
            and not prioritized(r, pidx)  # that one goes in at the next boundary anyway
            for r in rows
            if r.slot != me
        )
    ):
        length = min(length, BORROW_SLICE_US)  # borrowed while an in-budget share is active: soon back
    elif is_capped(mine) and any(
        is_capped(r)
        and not r.waiting
        and r.slot not in holding
        and now - r.last_grant < ACTIVE_S
        and not prioritized(r, pidx)
        and effective_used(r, pidx) / max(r.quota, 1) < used / max(mine.quota, 1)
        for r in rows
        if r.slot != me
    ):
        length = min(length, GAP_SLICE_US)  # filling a gap of a share behind it: it is soon back
    splittable = any(
        r.priority is Priority.LATENCY_CRITICAL and not r.memory_only for r in rows if r.slot != me
    )
    return Decision(
        True, start=start, period_idx=pidx, used_before_us=used, slice_us=length, splittable=splittable
    )


def _prioritized(
    rows: Sequence[Row],
    mine: Row,
    *,
    now: float,
    floor: float,
    busy_until: float,
    want_us: int,
    opens: Sequence[Open],
) -> Decision:
    """A prioritized share's slice: at the first ``YIELD_US`` boundary of a splittable open grant
    (inserted), else after everything booked; another prioritized share that waits longer goes first."""
    pidx = period_of(now)
    rivals = [r for r in rows if (r.waiting or r.slot == mine.slot) and prioritized(r, pidx)]
    if _first(rivals, pidx).slot != mine.slot:
        return Decision(False, retry_at=now + _RETRY_US / 1e6)
    for g in opens:  # what is not splittable (a prioritized slice) keeps its place: go after it
        if not g.splittable and g.end > floor:
            floor = g.end
    start, insert = max(floor, busy_until), False
    for g in sorted(opens, key=lambda g: g.start):
        if not g.splittable or g.end <= floor:
            continue
        k = max(0, -int(-(floor - g.start) * 1e6 // YIELD_US))  # ceil: the next boundary at or after floor
        at = g.start + k * YIELD_US / 1e6
        if at < g.end - _EPSILON_S:
            start, insert = at, True
            break
    pidx = period_of(start)
    length = slice_for(mine, want_us)
    return Decision(
        True,
        start=start,
        period_idx=pidx,
        used_before_us=effective_used(mine, pidx),
        slice_us=length,
        insert=insert,
    )


def _first(candidates: Sequence[Row], pidx: int) -> Row:
    """Who goes first: within their quota's part of the period, prioritized, then normal, then batch;
    then whoever is beyond it (best-effort, borrowing), all alike; within a rank, the least-used
    fraction of budget. So priority orders the time a quota gives, never more of it."""

    def rank(r: Row) -> int:
        if effective_used(r, pidx) >= budget_us(r.quota):
            return 3
        return 0 if prioritized(r, pidx) else max(r.priority.rank, 1)

    return min(
        candidates,
        key=lambda r: (rank(r), effective_used(r, pidx) / max(r.quota, 1), r.waiting_since, r.slot),
    )

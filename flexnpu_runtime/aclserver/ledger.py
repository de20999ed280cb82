"""The per-die compute ledger: the die's time, shared by every aclserver on that die.

``DieLedger`` is the die ledger file (``ledger_file.LedgerFile``: mapping, locking, entries,
liveness; the bytes' layout and codec: ``ledger_format.py``) with what its entries mean for the die: registration with the same-policy rule and the
per-die aclserver limit, and the blocking ``acquire`` loop around ``scheduling.decide`` that writes
each grant (the share's period use, counts and queueing delay, the die's header). The ledger never
trusts a client: only aclservers write it, with time they measured themselves.

**Priority** (``scheduling.py``): a latency-critical share may take the die at the next
``YIELD_US`` boundary of a splittable grant; every splittable grant reaching past that point ends
later by the inserted slice, recorded in its entry (``shifts``: original start, delay; the last
two grants), and its holder asks ``confirm`` at the end it knows where the end went. Priorities may mix on a die
(they change when, not how much); policies may not (the one-policy rule below).

**One aclserver = one slot.** ``slots`` is the die's limit of aclservers (the configured
``max_shares_per_die``, 63 by default, of the aclserver that created the file): the per-die
process limit of the device counts processes, and one aclserver serves all of a claim's vNPUs
(``vnpus: N``) and sessions, so registration refuses a share only when the die already has
``slots`` other live aclservers; it is the same number, counted the same way, as the ``shares``
capacity the scheduler charges once per share device allocation (``dra_driver/slices.py``). The
entries may grow beyond ``slots`` (``ledger_file.py``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Protocol

from dra_driver.errors import ErrorCode, StateError, Unavailable
from flexnpu_runtime.aclserver import scheduling
from flexnpu_runtime.aclserver.ledger_file import LedgerFile, ledger_path, starttime
from flexnpu_runtime.aclserver.ledger_format import (
    DELAY_BUCKETS_S,
    MAX_ENTRIES,
    MAX_VNPUS_PER_ACLSERVER,
    LedgerEntry,
    Mine,
    OpenGrant,
)
from flexnpu_wire.codes import Policy, Priority
from flexnpu_wire.launch import DEFAULT_MAX_SHARES_PER_DIE

__all__ = [
    "DEFAULT_MAX_SHARES",
    "DELAY_BUCKETS_S",
    "MAX_ENTRIES",
    "MAX_VNPUS_PER_ACLSERVER",
    "DieLedger",
    "LedgerEntry",
    "Pause",
    "ledger_path",
    "read_entries",
]

DEFAULT_MAX_SHARES = DEFAULT_MAX_SHARES_PER_DIE
_MAX_SHIFTABLE = 1024
"""Splittable grants remembered for ``confirm`` before the long-ended ones are forgotten."""


class Pause(Protocol):
    """How a thread waiting for the die waits: ``wait(timeout)`` returns True once cancelled.
    A ``threading.Event``; the aclserver's session thread also serves its connection meanwhile."""

    def is_set(self) -> bool: ...

    def wait(self, timeout: float | None = None) -> bool: ...


def read_entries(ledger_dir: str, die_phy_id: int, *, check_liveness: bool = True) -> list[LedgerEntry]:
    """Live entries of a die's ledger (empty if the file does not exist).

    Without ``check_liveness`` the entries are only decoded (no /proc lookups, nothing written):
    for an observer that knows by other means which aclservers live (the daemon's usage report).
    """
    path = ledger_path(ledger_dir, die_phy_id)
    if not os.path.exists(path):
        return []
    ledger = LedgerFile(ledger_dir, die_phy_id, max_shares=DEFAULT_MAX_SHARES, create=False)
    try:
        return ledger.entries() if check_liveness else ledger.snapshot()
    finally:
        ledger.close()


class DieLedger(LedgerFile):
    """An open die ledger: registration and grants over its file. One instance per die per process;
    thread-safe. ``clock``: what it reads as now (CLOCK_MONOTONIC seconds; a test passes its own)."""

    def __init__(
        self,
        ledger_dir: str,
        die_phy_id: int,
        *,
        max_shares: int = DEFAULT_MAX_SHARES,
        create: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(ledger_dir, die_phy_id, max_shares=max_shares, create=create, clock=clock)
        self._shiftable: set[tuple[int, float]] = set()
        """Grants this process holds that may still end later (splittable): (slot, start)."""

    # -- registration -------------------------------------------------------------------------

    def register(
        self,
        *,
        claim_uid: str,
        virtual_id: int,
        quota: int,
        policy: Policy,
        memory_only: bool,
        mem_quota: int,
        pid: int | None = None,
        priority: Priority = Priority.NORMAL,
    ) -> int:
        """Add an entry for one vNPU of aclserver ``pid`` and return it; refuse a policy other shares
        don't use, and a new aclserver on a die that serves ``slots`` already."""
        pid = os.getpid() if pid is None else pid
        started = starttime(pid)
        with self._locked():
            entries = self._live_entries(force=True)
            if not memory_only:
                others = {e.policy for e in entries if not e.memory_only}
                if others and policy not in others:
                    raise StateError(
                        f"die {self.die} already runs shares with policy {', '.join(sorted(others))};"
                        f" all shares of a die must use one policy, this share asks for {policy}",
                        code=ErrorCode.POLICY_CONFLICT,
                        claim_uid=claim_uid,
                        field="policy",
                    )
            servers = {(e.pid, e.starttime) for e in entries}
            limit = min(self.slots, self.max_shares)
            if (pid, started) not in servers and len(servers) >= limit:
                raise Unavailable(
                    f"die {self.die} already serves {len(servers)} aclservers, its limit"
                    f" (max_shares_per_die {limit}; one aclserver however many vNPUs and sessions it serves)",
                    claim_uid=claim_uid,
                    field="max_shares_per_die",
                )
            used = {e.slot for e in entries}
            free = [i for i in range(self.capacity) if i not in used]
            slot = free[0] if free else self._grow(claim_uid)
            self._write_entry(
                LedgerEntry(
                    slot=slot, pid=pid, starttime=started, claim_uid=claim_uid, virtual_id=virtual_id,
                    quota=quota, policy=policy, memory_only=memory_only, waiting=False, waiting_since=0.0,
                    period_idx=0, period_used_us=0, consumed_us=0, mem_used=0, mem_quota=mem_quota, kernels=0,
                    last_grant=0.0, priority=priority, delay_buckets=(0,) * (len(DELAY_BUCKETS_S) + 1),
                )
            )  # fmt: skip
            return slot

    def unregister(self, slot: int) -> None:
        with self._locked():
            self._free(slot)
            busy_until, busy_slot, _ls, _lc = self._die_state()
            if busy_slot == slot:
                self._set_die_state(busy_until=busy_until, busy_slot=-1)

    # -- compute --------------------------------------------------------------------------------
    def acquire(
        self, slot: int, want_us: int, cancel: Pause, *, ready_at: float | None = None
    ) -> tuple[float, float] | None:
        """Block until the die grants ``slot`` a slice of at most ``want_us``; return (start, end).

        Returns None (and clears the waiting flag) when ``cancel`` is set first. ``ready_at``: the
        first slice of a task, ready to run since then; its wait for the die (start - ready_at) is
        counted in the queueing-delay histogram. A splittable grant may end later (a latency-critical
        slice went in): its holder asks ``confirm`` at the end it knows.
        """
        while True:
            if cancel.is_set():
                self._set_waiting(slot, False)
                return None
            with self._locked():
                now = self._clock()  # nothing changes the die's state while the file is locked:
                if self.scan_due():  # decided as of now, not after decoding the entries, but
                    self._live_entries(force=False)  # after a scan of /proc for dead aclservers
                    now = self._clock()
                # decided as waiting from now if not yet; written only if not granted at once
                rows, mine = self._rows(slot, now)
                if mine is None:
                    raise StateError(f"ledger entry {slot} of die {self.die} vanished")
                busy_until, _slot, last_start, lc_until = self._die_state()
                opens = self._opens()
                decision = scheduling.decide(
                    rows, slot, now=now, busy_until=busy_until, last_start=last_start, want_us=want_us,
                    opens=[g for _orig, g in opens], lc_until=lc_until,
                )  # fmt: skip
                if decision.granted:
                    return self._grant(mine, decision, now=now, ready_at=ready_at, opens=opens)
                if not mine.waiting:
                    self._write_fields(slot, waiting=True, waiting_since=now)
            delay = decision.retry_at - self._clock()
            if delay > 0:
                cancel.wait(min(delay, 0.05))

    def _opens(self) -> list[tuple[float, scheduling.Open]]:
        """The die's open grants (file locked), each with its original start."""
        return [
            (g.orig, scheduling.Open(g.slot, g.start, g.end, bool(g.splittable)))
            for g in self._open_grants()
            if g.slot >= 0
        ]

    def _grant(
        self,
        mine: Mine,
        decision: scheduling.Decision,
        *,
        now: float,
        ready_at: float | None,
        opens: list[tuple[float, scheduling.Open]],
    ) -> tuple[float, float]:
        """Write a grant (file locked): the share's period use, counts and delay, and the die's header."""
        slot, slice_us, start = mine.slot, decision.slice_us, decision.start
        end = start + slice_us / 1e6
        self._write_grant(
            slot, period_idx=decision.period_idx, period_used_us=decision.used_before_us + slice_us,
            consumed_us=mine.consumed_us + slice_us, kernels=mine.kernels + 1, last_grant=now,
        )  # fmt: skip
        if ready_at is not None:
            waited = max(0.0, start - ready_at)
            self._count_delay(slot, waited, mine.delay_sum_us + round(waited * 1e6))
        if decision.insert:
            self._insert(start, slice_us / 1e6, opens)
            return start, end
        if decision.splittable:
            if len(self._shiftable) >= _MAX_SHIFTABLE:  # holders that never confirmed: long ended
                self._shiftable = {k for k in self._shiftable if k[1] > now - 1.0}
            self._shiftable.add((slot, start))
            a_orig, a_delay, b_orig, b_delay = self._shifts(slot)
            if a_orig <= b_orig:  # replace the older of the two
                self._set_shifts(slot, (start, 0.0, b_orig, b_delay))
            else:
                self._set_shifts(slot, (a_orig, a_delay, start, 0.0))
        last = opens[-1] if opens else None
        kept = [last] if last is not None else []
        for i, (orig, g) in enumerate(
            [*kept, (start, scheduling.Open(slot, start, end, decision.splittable))]
        ):
            self._write_open(i, OpenGrant(g.slot, int(g.splittable), orig, g.start, g.end))
        self._set_die_state(busy_until=end, busy_slot=slot, last_start=start)
        return start, end

    def _insert(self, at: float, length: float, opens: list[tuple[float, scheduling.Open]]) -> None:
        """A prioritized slice goes in at ``at``: every splittable open grant reaching past it ends
        ``length`` later (and starts later, if it had not started by ``at``); file locked."""
        busy_until, busy_slot, last_start, _lc = self._die_state()
        for i, (orig, g) in enumerate(opens):
            if not g.splittable or g.end <= at:
                continue
            start = g.start + length if g.start >= at else g.start
            self._write_open(i, OpenGrant(g.slot, 1, orig, start, g.end + length))
            if not self._in_use(g.slot):
                continue
            shifts = list(self._shifts(g.slot))
            for j in (0, 2):
                if shifts[j] == orig:
                    shifts[j + 1] += length
            self._set_shifts(g.slot, (shifts[0], shifts[1], shifts[2], shifts[3]))
            self._add_preempted(g.slot)
        self._set_die_state(
            busy_until=max(busy_until, at) + length, busy_slot=busy_slot,
            last_start=last_start + length if last_start >= at else last_start, lc_until=at + length,
        )  # fmt: skip

    def confirm(self, slot: int, grant: tuple[float, float]) -> tuple[float, float] | None:
        """Where a grant of ``slot`` is now, if a latency-critical slice went in before its end (None:
        it ends as granted, or as last confirmed). Ask at the end it knows, with the grant as
        ``acquire`` returned it; once it has ended, it is forgotten."""
        if (slot, grant[0]) not in self._shiftable:
            return None  # not splittable: nothing goes in before its end
        with self._locked():
            shifts = self._shifts(slot) if self._in_use(slot) else ()
            now = self._clock()  # nothing goes in before this any more
        delay = next((shifts[j + 1] for j in (0, 2) if shifts and shifts[j] == grant[0]), 0.0)
        if grant[1] + delay <= now:
            self._shiftable.discard((slot, grant[0]))
        return (grant[0], grant[1] + delay) if delay else None

    def settle(self, slot: int, grant: tuple[float, float], until: float) -> int:
        """A grant of ``slot`` ended at ``until``, not at its end (an emulated operator computes on the
        host while it holds the die, and numpy cannot be cut off at a slice's end): the time it ran
        over is charged to the share's period (carried as debt, as every overrun is), the time it left
        unused is given back (within the grant's period) and the die frees then. Returns the
        microseconds charged (negative: given back)."""
        start, end = grant
        delta = round((max(until, start) - end) * 1e6)
        if not delta:
            return 0
        with self._locked():
            entry = self._decode(slot)
            if entry is None:
                return 0
            pidx = scheduling.period_of(self._clock())
            if delta < 0 and not entry.period_idx == pidx == scheduling.period_of(start):
                return 0  # that period's use is behind: nothing to give back from
            used = max(0, scheduling.effective_used(entry.row(), pidx) + delta)
            self._write_period(slot, max(pidx, entry.period_idx), used, max(0, entry.consumed_us + delta))
            busy_until, busy_slot, _ls, _lc = self._die_state()
            if busy_slot == slot and busy_until == end:  # the die's last grant: it frees at ``until``
                self._set_die_state(busy_until=max(until, start), busy_slot=slot)
            for i, g in enumerate(self._open_grants()):
                if g.slot == slot and g.end == end:
                    self._write_open(i, g._replace(end=max(until, start)))
        return delta

    def set_mem_used(self, slot: int, used: int) -> None:
        with self._locked():
            self._write_fields(slot, mem_used=used)

"""The claim's quota book: shares, device allocations and die time, written once for every backend.

Owns, for the shares of one aclserver: their registration in the die ledgers, the memory quota
check and its reservation (32-byte accounting), the per-device allocation cap, the address book
of live allocations (lookup by any pointer inside one), the free of a buffer a queued task still
uses, compute slices from the die ledger with the die time they used, and ``release_all``. One
lock guards all of it. A backend brings only what touches its device: ``make`` (device memory
for a reservation, called outside the lock) and ``drop`` (give it back).

**Owners.** Every allocation belongs to an owner (a session id; 0 for allocations made without
one). A session sees and frees only its own. ``release_all(owner=None)`` frees every allocation,
``release_all(owner=n)`` exactly owner ``n``'s — one meaning for every backend.

**A free while a task still uses the buffer** (a queued kernel's input, a model's weights, an
execution's outputs): the session ``pin``s what a task uses when it is queued and ``unpin``s it
when the task ends or is cancelled. ``free`` of a pinned allocation returns at once and its pointer
is gone (any later use is an error, as after ``aclrtFree``), but the bytes stay charged to the
share and allocated on the device until the last ``unpin``. So ``mem_info`` always tells what the
claim really holds, and no queued task can keep memory alive beyond the quota.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from flexnpu_runtime.aclserver.backend import AclFailure, Allocation
from flexnpu_runtime.aclserver.ledger import DieLedger, Pause
from flexnpu_wire import codes
from flexnpu_wire.codes import Policy
from flexnpu_wire.launch import AclServerSpec, ShareSpec

__all__ = [
    "ALLOC_ALIGN",
    "MAX_ALLOCATIONS",
    "BookShare",
    "QuotaBook",
    "check_policy",
    "register_shares",
]

ALLOC_ALIGN = 32
MAX_ALLOCATIONS = 65_536
"""Per device: bounds the aclserver's own bookkeeping (host memory) for tiny allocations."""
_BASE_POLICY_MASK = 0xFF
_log = logging.getLogger("flexnpu.aclserver")


def check_policy(policy: int) -> None:
    """Refuse a malloc policy CANN does not define (a base policy, optionally with its flags)."""
    base = policy & _BASE_POLICY_MASK
    if (
        policy < 0
        or policy & ~(_BASE_POLICY_MASK | codes.MALLOC_POLICY_FLAGS)
        or base not in codes.MALLOC_POLICY_BASES
    ):
        raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown malloc policy {policy:#x}")


def register_shares(
    spec: AclServerSpec, ledgers: dict[int, DieLedger]
) -> Iterator[tuple[ShareSpec, DieLedger, int]]:
    """Register each share of ``spec`` (virtual-id order) in its die's ledger, opened once per die
    into ``ledgers``; yields (share, ledger, slot). On an error the caller closes ``ledgers``."""
    for share in sorted(spec.shares, key=lambda s: s.virtual_id):
        ledger = ledgers.get(share.die_phy_id)
        if ledger is None:
            ledger = ledgers[share.die_phy_id] = DieLedger(
                spec.ledger_dir, share.die_phy_id, max_shares=spec.max_shares_per_die
            )
        slot = ledger.register(
            claim_uid=spec.claim_uid,
            virtual_id=share.virtual_id,
            quota=share.compute_percent,
            policy=Policy(share.policy),
            memory_only=share.memory_only,
            mem_quota=share.memory_bytes,
            priority=share.priority_enum,
        )
        yield share, ledger, slot


@dataclass(slots=True, eq=False)
class BookShare:
    """One share's standing: its spec, ledger slot, bytes charged and die time used."""

    spec: ShareSpec
    ledger: DieLedger
    slot: int
    used: int = 0
    count: int = 0
    consumed_us: int = 0


class QuotaBook:
    """The quota book of one aclserver (see the module docstring); thread-safe."""

    def __init__(self, spec: AclServerSpec, *, drop: Callable[[Allocation], None]) -> None:
        self._lock = threading.Lock()
        self._drop = drop
        self._ledgers: dict[int, DieLedger] = {}
        self.shares: list[BookShare] = []
        self._live: dict[int, Allocation] = {}
        self._bases: list[int] = []
        self._deferred: set[Allocation] = set()
        self.drop_failures = 0
        try:
            for share, ledger, slot in register_shares(spec, self._ledgers):
                self.shares.append(BookShare(share, ledger, slot))
        except BaseException:
            self.close()
            raise

    # -- shares ----------------------------------------------------------------------------------

    def device_count(self) -> int:
        return len(self.shares)

    def share(self, device: int) -> BookShare:
        if not 0 <= device < len(self.shares):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_DEVICE, f"device {device} does not exist (0..{len(self.shares) - 1})"
            )
        return self.shares[device]

    def mem_info(self, device: int) -> tuple[int, int]:
        """(free, total) of the device's memory quota, by the book."""
        share = self.share(device)
        total = share.spec.memory_bytes
        with self._lock:
            return total - share.used, total

    # -- allocations -----------------------------------------------------------------------------

    def allocate(
        self,
        device: int,
        size: int,
        policy: int,
        *,
        owner: int,
        make: Callable[[int], tuple[int, Any]],
        charge: bool = True,
    ) -> Allocation:
        """Reserve ``size`` bytes of the device's quota, then ``make(size)`` -> (base, payload).
        ``charge=False``: addresses only (a reserved virtual range, vmm.py), nothing charged."""
        share = self.share(device)
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc size must be positive, got {size}")
        check_policy(policy)
        accounted = -(-size // ALLOC_ALIGN) * ALLOC_ALIGN if charge else 0
        with self._lock:  # the quota check and the reservation are one step
            quota = share.spec.memory_bytes
            if share.used + accounted > quota:
                raise AclFailure(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"malloc of {size} bytes exceeds the memory quota of device {device}:"
                    f" {share.used} of {quota} bytes in use",
                )
            if share.count >= MAX_ALLOCATIONS:
                raise AclFailure(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"device {device} already has {MAX_ALLOCATIONS} allocations",
                )
            share.used += accounted
            share.count += 1
        try:
            base, payload = make(size)
        except BaseException:
            self._uncharge(share, accounted)
            raise
        alloc = Allocation(base, size, accounted, device, owner, payload)
        with self._lock:
            self._live[base] = alloc
            bisect.insort(self._bases, base)
            used = share.used
        share.ledger.set_mem_used(share.slot, used)
        return alloc

    def find(self, ptr: int, count: int = 0, *, owner: int = 0, exact: bool = False) -> Allocation:
        """The live allocation holding ``count`` bytes at ``ptr`` (owner 0: anyone's)."""
        with self._lock:
            i = bisect.bisect_right(self._bases, ptr) - 1
            alloc = self._live[self._bases[i]] if i >= 0 else None
        if (
            alloc is None
            or (exact and alloc.base != ptr)
            or ptr >= alloc.base + alloc.size
            or (owner and alloc.owner != owner)
        ):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} is not an allocation of this client"
            )
        if count < 0 or ptr + count > alloc.base + alloc.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{count} bytes at {ptr:#x} run past the end of its allocation"
                f" ({alloc.size} bytes at {alloc.base:#x})",
            )
        return alloc

    def free(self, ptr: int, *, owner: int = 0) -> None:
        """Free the allocation at exactly ``ptr``; while pinned, its bytes stay charged (see above).

        A device error leaves the allocation as it was."""
        alloc = self.find(ptr, owner=owner, exact=True)
        with self._lock:
            if self._live.get(ptr) is not alloc:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} was freed meanwhile")
            self._unlist(alloc)
            if alloc.pins:
                self._deferred.add(alloc)
                return
        try:
            self._drop(alloc)
        except BaseException:
            with self._lock:
                alloc.freed = False
                self._live[alloc.base] = alloc
                bisect.insort(self._bases, alloc.base)
            raise
        self._uncharge(self.shares[alloc.device], alloc.accounted)

    def pin(self, allocs: Iterable[Allocation]) -> tuple[Allocation, ...]:
        """Mark ``allocs`` as used by one queued task (AclFailure if one was freed already)."""
        held = tuple(allocs)
        with self._lock:
            for alloc in held:
                if alloc.freed:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_PARAM, f"pointer {alloc.base:#x} is not an allocation"
                    )
            for alloc in held:
                alloc.pins += 1
        return held

    def unpin(self, allocs: Iterable[Allocation]) -> None:
        """The task that pinned ``allocs`` ended: a freed allocation whose last use this was goes."""
        done: list[Allocation] = []
        with self._lock:
            for alloc in allocs:
                alloc.pins -= 1
                if alloc.freed and alloc.pins == 0 and alloc in self._deferred:
                    self._deferred.discard(alloc)
                    done.append(alloc)
        self._drop_quietly(done)

    def release_all(self, *, owner: int | None = None) -> None:
        """Free every allocation (``owner`` None) or exactly owner ``owner``'s; device errors are
        logged and counted (the runtime keeps what it could not free)."""
        done: list[Allocation] = []
        with self._lock:
            for alloc in [a for a in self._live.values() if owner is None or a.owner == owner]:
                self._unlist(alloc)
                if alloc.pins:
                    self._deferred.add(alloc)
                else:
                    done.append(alloc)
        self._drop_quietly(done)

    # -- compute ---------------------------------------------------------------------------------

    def acquire_slice(
        self, device: int, want_us: int, cancel: Pause, *, ready_at: float | None = None
    ) -> tuple[float, float] | None:
        """Block until the die grants a slice of at most ``want_us`` under the share's policy and
        priority; (start, end) in CLOCK_MONOTONIC seconds, or None if ``cancel`` was set first (it
        is also how the thread waits meanwhile). ``ready_at``: a task's first slice, ready since
        then (its queueing delay is recorded). A grant that starts later than when it was asked
        for is confirmed at its start (``confirm_slice``)."""
        share = self.share(device)
        grant = share.ledger.acquire(share.slot, want_us, cancel, ready_at=ready_at)
        if grant is not None:
            with self._lock:
                share.consumed_us += round((grant[1] - grant[0]) * 1e6)
        return grant

    def confirm_slice(self, device: int, grant: tuple[float, float]) -> tuple[float, float] | None:
        """Where a booked grant is now if a latency-critical share moved it (None: where it was)."""
        share = self.share(device)
        return share.ledger.confirm(share.slot, grant)

    def settle_slice(self, device: int, grant: tuple[float, float], until: float) -> None:
        """A grant ended at ``until`` rather than its end: the overrun charged, what is left given
        back (``DieLedger.settle``)."""
        share = self.share(device)
        delta = share.ledger.settle(share.slot, grant, until)
        if delta:
            with self._lock:
                share.consumed_us = max(0, share.consumed_us + delta)

    def compute_usage(self, device: int) -> tuple[int, int]:
        """(die microseconds used so far, compute quota in percent) of a device."""
        share = self.share(device)
        with self._lock:
            return share.consumed_us, share.spec.compute_percent

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Free everything (also what tasks still pinned: they are gone), leave the ledgers."""
        self.release_all()
        with self._lock:
            left, self._deferred = list(self._deferred), set()
        self._drop_quietly(left)
        for share in self.shares:
            with contextlib.suppress(OSError):
                share.ledger.unregister(share.slot)
        self.shares = []
        for ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()

    # -- helpers ---------------------------------------------------------------------------------

    def _unlist(self, alloc: Allocation) -> None:
        """Take ``alloc`` out of the address book (under the lock); it stays charged."""
        del self._live[alloc.base]
        del self._bases[bisect.bisect_left(self._bases, alloc.base)]
        alloc.freed = True

    def _uncharge(self, share: BookShare, accounted: int) -> None:
        with self._lock:
            share.used -= accounted
            share.count -= 1
            used = share.used
        share.ledger.set_mem_used(share.slot, used)

    def _drop_quietly(self, allocs: list[Allocation]) -> None:
        for alloc in allocs:
            try:
                self._drop(alloc)
            except AclFailure as exc:
                self.drop_failures += 1
                _log.warning("device memory at %#x was not freed: %s", alloc.base, exc.message)
            if self.shares:
                self._uncharge(self.shares[alloc.device], alloc.accounted)
            alloc.payload = None

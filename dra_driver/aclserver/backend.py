"""The device behind the aclserver: a ``Backend`` protocol and the ``emulated`` implementation.

The emulated backend uses host memory as device memory (exact accounting against each share's
quota) and emulates a kernel as occupying its die for ``duration_us``: each slice of the kernel
is granted by the per-die ledger (so compute quotas hold across aclserver processes), the die
is held for the slice's wall-clock time, and the kernel's visible effect (a tag and a CRC32 of
its input written into an output buffer) is computed for real so tests can see it ran. While the
emulated die is held the host thread sleeps instead of spinning: on a small CI machine spinning
would measure host CPU contention, not the quota scheduler.

A future Ascend runtime backend implements the same protocol with ctypes; nothing here pretends
to drive hardware.
"""

from __future__ import annotations

import bisect
import contextlib
import mmap
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

from dra_driver.aclserver.ledger import DieLedger
from flexnpu_wire import codes
from flexnpu_wire.codes import Policy
from flexnpu_wire.launch import AclServerSpec, ShareSpec

__all__ = ["KERNEL_RESULT_BYTES", "AclFailure", "Backend", "EmulatedBackend"]

ALLOC_ALIGN = 32
MAX_ALLOCATIONS = 65_536
"""Per device: bounds the aclserver's own bookkeeping (host memory) for tiny allocations."""
_PTR_BASE = 0x1_0000_0000_0000
_PTR_GAP = 4096
_MMAP_THRESHOLD = 1 << 20
_HUGE_THRESHOLD = 4 << 20
KERNEL_RESULT_BYTES = 16
_RESULT = struct.Struct("<QQ")


class AclFailure(Exception):
    """An ACL call failed with a numeric ACL error code; nothing was changed."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Backend(Protocol):
    """What the session layer needs from a device. Pointers are opaque ints the backend owns.

    ``owner`` is the session an allocation belongs to: a session sees and frees only its own
    allocations, and ``release_all(owner=...)`` frees exactly one session's (0 / None: any).
    The memory quota is the claim's, shared by every owner.
    """

    def device_count(self) -> int: ...

    def mem_info(self, device: int) -> tuple[int, int]:
        """(free, total) of the device's memory quota."""
        ...

    def malloc(self, device: int, size: int, policy: int, *, owner: int = 0) -> int: ...

    def free(self, ptr: int, *, owner: int = 0) -> None: ...

    def device_view(self, ptr: int, count: int, *, owner: int = 0) -> memoryview:
        """A writable view of ``count`` bytes at ``ptr`` (AclFailure if not one owned allocation)."""
        ...

    def memset(self, ptr: int, value: int, count: int, *, owner: int = 0) -> None: ...

    def acquire_slice(self, device: int, want_us: int, cancel: threading.Event) -> tuple[float, float] | None:
        """Block until the device's die grants a compute slice of at most ``want_us`` under its
        policy; return (start, end) in CLOCK_MONOTONIC seconds (start may lie slightly ahead:
        slices are booked just before the die frees), or None if ``cancel`` was set first."""
        ...

    def complete_kernel(
        self, *, out_ptr: int, tag: int, input_view: memoryview | None, owner: int = 0
    ) -> None:
        """Produce a finished kernel's visible result (tag and CRC32 of its input at ``out_ptr``)."""
        ...

    def compute_usage(self, device: int) -> tuple[int, int]:
        """(die microseconds used so far, compute quota in percent) of a device."""
        ...

    def release_all(self, *, owner: int | None = None) -> None:
        """Free every allocation of ``owner`` (a session ended or finalized); None: of everyone."""
        ...

    def close(self) -> None: ...


def register_shares(
    spec: AclServerSpec, ledgers: dict[int, DieLedger]
) -> Iterator[tuple[ShareSpec, DieLedger, int]]:
    """Register each share of ``spec`` (virtual-id order) in its die's ledger, opened once per die
    into ``ledgers``; yields (share, ledger, slot). Every backend admits its shares this way; on an
    error the caller closes what ``ledgers`` holds."""
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
        )
        yield share, ledger, slot


@dataclass(slots=True)
class _Allocation:
    base: int
    size: int
    accounted: int
    device: int
    owner: int
    buf: bytearray | mmap.mmap
    view: memoryview = field(init=False)

    def __post_init__(self) -> None:
        self.view = memoryview(self.buf)


class _Share:
    def __init__(self, share: ShareSpec, ledger: DieLedger, slot: int) -> None:
        self.spec = share
        self.ledger = ledger
        self.slot = slot
        self.used = 0
        self.count = 0
        self.consumed_us = 0


class EmulatedBackend:
    """Host memory as device memory, a ledger-scheduled sleep as a kernel."""

    def __init__(self, spec: AclServerSpec) -> None:
        self._lock = threading.Lock()
        self._ledgers: dict[int, DieLedger] = {}
        self._shares: list[_Share] = []
        self._allocs: dict[int, _Allocation] = {}
        self._bases: list[int] = []
        self._next = _PTR_BASE
        try:
            for share, ledger, slot in register_shares(spec, self._ledgers):
                self._shares.append(_Share(share, ledger, slot))
        except BaseException:
            self.close()
            raise

    def device_count(self) -> int:
        return len(self._shares)

    def mem_info(self, device: int) -> tuple[int, int]:
        share = self._shares[device] if 0 <= device < len(self._shares) else self._share(device)
        total = share.spec.memory_bytes
        return total - share.used, total

    def malloc(self, device: int, size: int, policy: int, *, owner: int = 0) -> int:
        share = self._share(device)
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc size must be positive, got {size}")
        if policy not in codes.MallocPolicy.__members__.values():
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown malloc policy {policy}")
        accounted = -(-size // ALLOC_ALIGN) * ALLOC_ALIGN
        with self._lock:
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
            buf: bytearray | mmap.mmap
            if size >= _MMAP_THRESHOLD:
                buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
                if size >= _HUGE_THRESHOLD:
                    # transparent huge pages where the node offers them on request (as numpy does
                    # for its large arrays): copies into device memory run at memcpy speed
                    with contextlib.suppress(OSError, AttributeError):
                        buf.madvise(mmap.MADV_HUGEPAGE)
            else:
                buf = bytearray(size)
            base = self._next
            self._next += -(-(size + _PTR_GAP) // _PTR_GAP) * _PTR_GAP
            self._allocs[base] = _Allocation(base, size, accounted, device, owner, buf)
            bisect.insort(self._bases, base)
            share.used += accounted
            share.count += 1
            used = share.used
        share.ledger.set_mem_used(share.slot, used)
        return base

    def free(self, ptr: int, *, owner: int = 0) -> None:
        with self._lock:
            alloc = self._allocs.get(ptr)
            if alloc is None or (owner and alloc.owner != owner):
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} is not an allocation of this client"
                )
            del self._allocs[ptr]
            del self._bases[bisect.bisect_left(self._bases, ptr)]
            share = self._shares[alloc.device]
            share.used -= alloc.accounted
            share.count -= 1
            used = share.used
        share.ledger.set_mem_used(share.slot, used)

    def device_view(self, ptr: int, count: int, *, owner: int = 0) -> memoryview:
        alloc = self._find(ptr, owner)
        offset = ptr - alloc.base
        if count < 0 or offset + count > alloc.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{count} bytes at {ptr:#x} run past the end of its allocation ({alloc.size} bytes at {alloc.base:#x})",
            )
        return alloc.view[offset : offset + count]

    def memset(self, ptr: int, value: int, count: int, *, owner: int = 0) -> None:
        if not 0 <= value <= 255:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"memset value must be a byte, got {value}")
        view = self.device_view(ptr, count, owner=owner)
        view[:] = bytes([value]) * count

    def acquire_slice(self, device: int, want_us: int, cancel: threading.Event) -> tuple[float, float] | None:
        share = self._share(device)
        grant = share.ledger.acquire(share.slot, want_us, cancel)
        if grant is not None:
            with self._lock:
                share.consumed_us += round((grant[1] - grant[0]) * 1e6)
        return grant

    def compute_usage(self, device: int) -> tuple[int, int]:
        share = self._share(device)
        with self._lock:
            return share.consumed_us, share.spec.compute_percent

    def complete_kernel(
        self, *, out_ptr: int, tag: int, input_view: memoryview | None, owner: int = 0
    ) -> None:
        checksum = zlib.crc32(input_view) if input_view is not None else 0
        if out_ptr:
            # freed while the kernel ran: the result has nowhere to go, as on a device
            with contextlib.suppress(AclFailure):
                self.device_view(out_ptr, KERNEL_RESULT_BYTES, owner=owner)[:] = _RESULT.pack(
                    tag & (2**64 - 1), checksum
                )

    def release_all(self, *, owner: int | None = None) -> None:
        with self._lock:
            if owner is None:
                allocs = list(self._allocs.values())
                self._allocs.clear()
                self._bases.clear()
            else:
                allocs = [a for a in self._allocs.values() if a.owner == owner]
                for a in allocs:
                    del self._allocs[a.base]
                self._bases = sorted(self._allocs)
            for a in allocs:
                share = self._shares[a.device]
                share.used -= a.accounted
                share.count -= 1
            used = [(share, share.used) for share in self._shares]
        allocs.clear()  # views handed out (a running kernel's input) keep their buffer alive
        for share, value in used:
            share.ledger.set_mem_used(share.slot, value)

    def close(self) -> None:
        self.release_all()
        for share in self._shares:
            with contextlib.suppress(OSError):
                share.ledger.unregister(share.slot)
        self._shares.clear()
        for ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()

    def _share(self, device: int) -> _Share:
        if not 0 <= device < len(self._shares):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_DEVICE, f"device {device} does not exist (0..{len(self._shares) - 1})"
            )
        return self._shares[device]

    def _find(self, ptr: int, owner: int = 0) -> _Allocation:
        with self._lock:
            i = bisect.bisect_right(self._bases, ptr) - 1
            alloc = self._allocs[self._bases[i]] if i >= 0 else None
        if alloc is None or ptr >= alloc.base + alloc.size or (owner and alloc.owner != owner):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} is not an allocation of this client"
            )
        return alloc

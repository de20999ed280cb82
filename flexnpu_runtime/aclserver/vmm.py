"""CANN's virtual memory calls for one session (torch's expandable segments), on the emulated backend.

A reserved range (``VMM_RESERVE``) is an allocation of the book that is **not charged**: device
addresses backed by lazily mapped host memory (pages cost nothing until written). A physical handle
(``VMM_MALLOC_PHYSICAL``) **is charged** to the share's quota like ``aclrtMalloc`` but has no memory
of its own: its bytes become reachable when it is mapped (``VMM_MAP``) at an address inside a reserved
range, where tensors, copies and operators then address them like any device memory. Unmapping
returns the range's pages to the host (``MADV_DONTNEED``), so the aclserver holds at most what is
mapped, which never exceeds what is charged (bytes written to a reserved range outside its mappings
are host memory bounded by the aclserver's cgroup, not the quota). A session may reserve at most
``RESERVE_FACTOR`` times its device's quota; a range with mappings cannot be released
nor a mapped handle freed (ACL_ERROR_INVALID_PARAM naming it).

On the ascend backend the same books are kept here and each call is also made to the host's CANN
through the backend's hooks (``backend_ascend.py``): ``make_memory``/``make_handle`` reserve a range and
allocate a physical handle, ``map_memory``/``unmap_memory`` map and unmap (instead of the emulated
backend's page discard), and freeing the allocations releases and frees them.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_wire import codes
from flexnpu_wire.framing import Op

if TYPE_CHECKING:
    from flexnpu_runtime.aclserver.backend import Allocation
    from flexnpu_runtime.aclserver.quota import QuotaBook

__all__ = ["RESERVE_FACTOR", "VirtualMemory"]

RESERVE_FACTOR = 16
"""A session's reserved ranges on one device total at most this many times its quota (address space:
torch reserves about the device's total per segment, and one more segment for a tensor that does not
fit, even one beyond the quota, whose physical allocation then fails as out of memory)."""
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]


@dataclass(slots=True)
class _Range:
    alloc: Allocation
    mappings: dict[int, tuple[int, int]] = field(default_factory=dict)
    """address -> (size, handle)."""


class VirtualMemory:
    """The VMM ops of one session (``handlers`` for the dispatcher); thread-safe."""

    def __init__(self, backend: Backend, book: QuotaBook, *, session_id: int) -> None:
        self.backend = backend
        self.book = book
        self.session_id = session_id
        self._ranges: dict[int, _Range] = {}
        self._handles: dict[int, Allocation] = {}
        self._mapped: dict[int, int] = {}  # handle -> mappings of it
        self._lock = threading.Lock()

    def handlers(self) -> dict[Op, Handler]:
        return {
            Op.VMM_RESERVE: self._reserve,
            Op.VMM_RELEASE: self._release,
            Op.VMM_MALLOC_PHYSICAL: self._malloc_physical,
            Op.VMM_FREE_PHYSICAL: self._free_physical,
            Op.VMM_MAP: self._map,
            Op.VMM_UNMAP: self._unmap,
        }

    def _make(self, what: str, device: int, hook: str = "make_memory") -> Callable[[int], tuple[int, Any]]:
        make = getattr(self.backend, hook, None)
        if make is None:
            raise AclFailure(
                codes.ACL_ERROR_API_NOT_SUPPORT, f"{what}: this backend serves no virtual memory"
            )
        return lambda size: make(size, device=device)

    def _reserve(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        device, size = ints
        make = self._make("aclrtReserveMemAddress", device)
        quota = self.book.share(device).spec.memory_bytes
        with self._lock:
            held = sum(r.alloc.size for r in self._ranges.values() if r.alloc.device == device)
        if size <= 0 or held + size > RESERVE_FACTOR * quota:
            raise AclFailure(
                codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                f"aclrtReserveMemAddress: {size} bytes more than the {held} reserved exceed {RESERVE_FACTOR}x the"
                f" device's {quota}-byte quota",
            )
        alloc = self.book.allocate(device, size, 0, owner=self.session_id, make=make, charge=False)
        with self._lock:
            self._ranges[alloc.base] = _Range(alloc)
        return (alloc.base,)

    def _release(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        (address,) = ints
        with self._lock:
            r = self._ranges.get(address)
            if r is None:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"{address:#x} is not a reserved range of this client"
                )
            if r.mappings:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM,
                    f"aclrtReleaseMemAddress: {len(r.mappings)} mappings remain in the range at {address:#x}",
                )
            del self._ranges[address]
        self.book.free(address, owner=self.session_id)
        return ()

    def _malloc_physical(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        device, size = ints
        make_handle = self._make("aclrtMallocPhysical", device, "make_handle")
        alloc = self.book.allocate(device, size, 0, owner=self.session_id, make=make_handle)
        with self._lock:
            self._handles[alloc.base] = alloc
        return (alloc.base,)

    def _free_physical(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        (handle,) = ints
        with self._lock:
            if handle not in self._handles:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"{handle:#x} is not a physical handle of this client"
                )
            if self._mapped.get(handle):
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"aclrtFreePhysical: handle {handle:#x} is still mapped"
                )
            del self._handles[handle]
        self.book.free(handle, owner=self.session_id)
        return ()

    def _map(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        address, size, offset, handle = ints
        with self._lock:
            phys = self._handles.get(handle)
            if phys is None:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"aclrtMapMem: {handle:#x} is not a physical handle"
                )
            if size <= 0 or offset < 0 or offset + size > phys.size:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM,
                    f"aclrtMapMem: {size} bytes from offset {offset} of a {phys.size}-byte handle",
                )
            r = self._range_of(address, size)
            for at, (n, _) in r.mappings.items():
                if at < address + size and address < at + n:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_PARAM,
                        f"aclrtMapMem: {address:#x}+{size} overlaps the mapping at {at:#x}",
                    )
            mapper = getattr(self.backend, "map_memory", None)
            if mapper is not None:
                mapper(address=address, size=size, offset=offset, handle=phys, into=r.alloc)
            r.mappings[address] = (size, handle)
            self._mapped[handle] = self._mapped.get(handle, 0) + 1
        return ()

    def _unmap(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        (address,) = ints
        with self._lock:
            r = self._range_of(address, 1)
            entry = r.mappings.get(address)
            if entry is None:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"aclrtUnmapMem: no mapping starts at {address:#x}"
                )
            unmapper = getattr(self.backend, "unmap_memory", None)
            if unmapper is not None:
                unmapper(address=address, into=r.alloc)
            del r.mappings[address]
            size, handle = entry
            self._mapped[handle] -= 1
        if unmapper is None:
            _discard(r.alloc, address - r.alloc.base, size)
        return ()

    def _range_of(self, address: int, size: int) -> _Range:
        for r in self._ranges.values():
            base = r.alloc.base
            if base <= address and address + size <= base + r.alloc.size:
                return r
        raise AclFailure(
            codes.ACL_ERROR_INVALID_PARAM,
            f"{address:#x}+{size} is not inside one reserved range of this client",
        )


def _discard(alloc: Allocation, offset: int, size: int) -> None:
    """Give the pages of an unmapped range back to the host (they read as zeros afterwards)."""
    payload = alloc.payload
    obj = getattr(payload, "obj", None)
    if isinstance(obj, mmap.mmap):
        page = mmap.PAGESIZE
        start = -(-offset // page) * page
        end = (offset + size) // page * page
        if end > start:
            obj.madvise(mmap.MADV_DONTNEED, start, end - start)

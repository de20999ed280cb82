"""Virtual memory on the ascend backend: ``vmm.py``'s hooks forwarded to the host's CANN.

NOT YET VERIFIED ON HARDWARE (tested against ``tests/c/cann_emulator.c``). ``AscendBackend`` builds one
``VirtualMemory`` and forwards ``make_memory``, ``make_handle``, ``map_memory`` and ``unmap_memory`` to it
(the session layer keeps the books): ``aclrtReserveMemAddress`` (not charged), ``aclrtMallocPhysical``
(charged to the quota like ``aclrtMalloc``; the client sees a token address, the CANN handle stays here),
``aclrtMapMem``, ``aclrtUnmapMem``, ``aclrtReleaseMemAddress``, ``aclrtFreePhysical``. Freeing a range or a
handle (a session's close included) unmaps what CANN still maps there first (``drop``).
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from flexnpu_runtime.aclserver.backend import AclFailure, Allocation
from flexnpu_wire import codes

__all__ = ["Physical", "PhysicalMemProp", "Reserved", "VirtualMemory"]

_HANDLE_BASE = 1 << 59
"""Physical handles are named to the client by token addresses from here (beyond any device or host
address, below the data link's HOST_TAG), so the book never confuses one with device memory."""
_HANDLE_GAP = 1 << 32
_ACL_MEM_LOCATION_TYPE_DEVICE = 1


class PhysicalMemProp(ctypes.Structure):
    """CANN's aclrtPhysicalMemProp (acl/acl_rt.h)."""

    _fields_ = [
        ("handleType", ctypes.c_int),
        ("allocationType", ctypes.c_int),
        ("memAttr", ctypes.c_int),
        ("location_id", ctypes.c_uint32),
        ("location_type", ctypes.c_int),
        ("reserve", ctypes.c_uint64),
    ]


@dataclass(frozen=True, slots=True)
class Reserved:
    """The payload of a reserved range's allocation (CANN's address is its base)."""


@dataclass(frozen=True, slots=True)
class Physical:
    """The payload of a physical handle's allocation: CANN's aclrtDrvMemHandle."""

    handle: int


class VirtualMemory:
    """Reserved ranges, physical handles and their mappings on the share's dies; ``call`` is the runtime's
    checked ACL call, ``select`` makes a virtual device's die current, ``dies`` maps virtual devices to dies."""

    def __init__(
        self, call: Callable[..., None], *, select: Callable[[int], None], dies: Mapping[int, int]
    ) -> None:
        self._call, self._select, self._dies = call, select, dies
        self._handle_ids = itertools.count(_HANDLE_BASE, _HANDLE_GAP)
        self._mappings: dict[int, tuple[int, int]] = {}
        """CANN mappings: address -> (its range's base, the CANN handle mapped there)."""
        self._lock = threading.Lock()

    def make_memory(self, size: int, *, device: int = 0) -> tuple[int, Reserved]:
        """A reserved range of device addresses (aclrtReserveMemAddress)."""
        self._select(device)
        va = ctypes.c_void_p()
        self._call("aclrtReserveMemAddress", ctypes.byref(va), size, 0, None, 0)
        return int(va.value or 0), Reserved()

    def make_handle(self, size: int, *, device: int = 0) -> tuple[int, Physical]:
        """Physical memory of the share's die (aclrtMallocPhysical), named by a token address."""
        self._select(device)
        prop = PhysicalMemProp(
            0, 0, int(codes.MemAttr.HBM_HUGE), self._dies[device], _ACL_MEM_LOCATION_TYPE_DEVICE, 0
        )
        handle = ctypes.c_void_p()
        self._call("aclrtMallocPhysical", ctypes.byref(handle), size, ctypes.byref(prop), 0)
        return next(self._handle_ids), Physical(int(handle.value or 0))

    def map_memory(
        self, *, address: int, size: int, offset: int, handle: Allocation, into: Allocation
    ) -> None:
        """Map ``size`` bytes of ``handle`` from ``offset`` at ``address`` inside the range ``into``."""
        assert isinstance(handle.payload, Physical)
        self._select(into.device)
        self._call("aclrtMapMem", address, size, offset, handle.payload.handle, 0)
        with self._lock:
            self._mappings[address] = (into.base, handle.payload.handle)

    def unmap_memory(self, *, address: int, into: Allocation) -> None:
        self._select(into.device)
        self._call("aclrtUnmapMem", address)
        with self._lock:
            self._mappings.pop(address, None)

    def drop(self, base: int, payload: Reserved | Physical) -> None:
        """Release a range or free a handle (the caller made its die current), unmapping first what CANN
        still maps in it or of it."""
        handle = payload.handle if isinstance(payload, Physical) else None
        with self._lock:
            stale = [a for a, (r, h) in self._mappings.items() if (h == handle if handle else r == base)]
        for address in stale:
            with contextlib.suppress(AclFailure):
                self._call("aclrtUnmapMem", address)
            with self._lock:
                self._mappings.pop(address, None)
        if handle is not None:
            self._call("aclrtFreePhysical", handle)
        else:
            self._call("aclrtReleaseMemAddress", base)

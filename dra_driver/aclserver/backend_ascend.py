"""The aclserver's ``ascend`` backend: the ``Backend`` protocol over the host's CANN runtime.

NOT YET VERIFIED ON HARDWARE. It binds CANN's ``libascendcl.so`` with ctypes (path
configurable, see ``DEFAULT_LIBRARY``) and is tested against ``tests/c/cann_emulator.c``, an
ABI-compatible library with device memory in host RAM and call counters.

* Devices: share ``virtual_id`` i is ACL device ``die_phy_id`` of share i. On nodes where ACL's
  logic IDs differ from physical IDs this mapping needs the logic ID (not handled yet).
* Memory: the share's quota is checked before every ``aclrtMalloc``, with the same 32-byte
  accounting as the emulated backend. ``mem_info`` reports free as the smaller of what the
  quota leaves and what the die really has free.
* Errors: a non-zero ACL code is passed through unchanged, with ``aclGetRecentErrMsg``'s text.
* Threads: ACL's current device is per thread, so every call first selects its share's device in
  the calling thread (cached per thread).
* Device memory is not host-addressable. ``device_view`` refuses with
  ``ACL_ERROR_API_NOT_SUPPORT`` (so emulated kernels, which read device memory, are refused);
  copies go through ``copy_to_device``, ``copy_from_device`` and ``copy_on_device``
  (``aclrtMemcpy``). When ``host_addressable`` is False, the session layer hands its memcpy to
  ``memcpy_regions``, which bounces data-link regions through host memory.
* Compute: slices come from the die ledger, as with the emulated backend, so compute quotas
  hold across aclservers. Real kernels are not intercepted.
"""

from __future__ import annotations

import bisect
import contextlib
import ctypes
import struct
import threading
from dataclasses import dataclass
from typing import Any

from dra_driver.aclserver import datalink
from dra_driver.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, register_shares
from dra_driver.aclserver.ledger import DieLedger
from flexnpu_wire import codes
from flexnpu_wire.datalink import HOST_TAG, split_host_ptr
from flexnpu_wire.launch import AclServerSpec, ShareSpec

__all__ = ["DEFAULT_LIBRARY", "AscendBackend", "AscendRuntime"]

DEFAULT_LIBRARY = "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"
ALLOC_ALIGN = 32
_H2D, _D2H, _D2D = 1, 2, 3
_HBM = int(codes.MemAttr.HBM_MEM)
_RESULT = struct.Struct("<QQ")


class AscendRuntime:
    """The ctypes binding: one method per ACL function, raising AclFailure for a non-zero code."""

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise AclFailure(
                codes.ACL_ERROR_INTERNAL_ERROR, f"cannot load the CANN runtime {path}: {exc}"
            ) from exc
        c = ctypes
        sigs: dict[str, list[Any]] = {
            "aclInit": [c.c_char_p],
            "aclFinalize": [],
            "aclrtSetDevice": [c.c_int32],
            "aclrtResetDevice": [c.c_int32],
            "aclrtGetDeviceCount": [c.POINTER(c.c_uint32)],
            "aclrtMalloc": [c.POINTER(c.c_void_p), c.c_size_t, c.c_int],
            "aclrtFree": [c.c_void_p],
            "aclrtMemcpy": [c.c_void_p, c.c_size_t, c.c_void_p, c.c_size_t, c.c_int],
            "aclrtMemset": [c.c_void_p, c.c_size_t, c.c_int32, c.c_size_t],
            "aclrtGetMemInfo": [c.c_int, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)],
        }
        self._fns: dict[str, Any] = {}
        for name, argtypes in sigs.items():
            try:
                fn = getattr(lib, name)
            except AttributeError as exc:
                raise AclFailure(codes.ACL_ERROR_INTERNAL_ERROR, f"{path} has no symbol {name}") from exc
            fn.argtypes = argtypes
            fn.restype = c.c_int
            self._fns[name] = fn
        self._errmsg = getattr(lib, "aclGetRecentErrMsg", None)
        if self._errmsg is not None:
            self._errmsg.argtypes = []
            self._errmsg.restype = c.c_char_p

    def call(self, name: str, *args: object) -> None:
        ret = int(self._fns[name](*args))
        if ret != 0:
            raw = self._errmsg() if self._errmsg is not None else None
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else ""
            raise AclFailure(ret, f"{name} failed with ACL error {ret}" + (f": {text}" if text else ""))

    def set_device(self, device: int) -> None:
        self.call("aclrtSetDevice", device)

    def device_count(self) -> int:
        n = ctypes.c_uint32()
        self.call("aclrtGetDeviceCount", ctypes.byref(n))
        return n.value

    def malloc(self, size: int, policy: int) -> int:
        ptr = ctypes.c_void_p()
        self.call("aclrtMalloc", ctypes.byref(ptr), size, policy)
        return int(ptr.value or 0)

    def mem_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.call("aclrtGetMemInfo", _HBM, ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


@dataclass(slots=True)
class _Allocation:
    base: int
    size: int
    accounted: int
    device: int
    owner: int


class _Share:
    def __init__(self, spec: ShareSpec, ledger: DieLedger, slot: int) -> None:
        self.spec = spec
        self.ledger = ledger
        self.slot = slot
        self.used = 0
        self.die_us = 0


class AscendBackend:
    """Real device memory through CANN; quotas and die time as the emulated backend keeps them."""

    host_addressable = False

    def __init__(self, spec: AclServerSpec, *, library: str = DEFAULT_LIBRARY) -> None:
        self.rt = AscendRuntime(library)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._allocs: dict[int, _Allocation] = {}
        self._bases: list[int] = []
        self._ledgers: dict[int, DieLedger] = {}
        self._shares: list[_Share] = []
        self.rt.call("aclInit", None)
        try:
            visible = self.rt.device_count()
            for share in sorted(spec.shares, key=lambda s: s.virtual_id):
                if not 0 <= share.die_phy_id < visible:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_DEVICE,
                        f"share {share.virtual_id} is on die {share.die_phy_id}, but the CANN runtime sees"
                        f" devices 0..{visible - 1}",
                    )
            for share, ledger, slot in register_shares(spec, self._ledgers):
                self._shares.append(_Share(share, ledger, slot))
        except BaseException:
            self.close()
            raise

    # -- devices and memory ------------------------------------------------------------------

    def device_count(self) -> int:
        return len(self._shares)

    def mem_info(self, device: int) -> tuple[int, int]:
        share = self._share(device)
        self._select(share)
        real_free, _total = self.rt.mem_info()
        quota = share.spec.memory_bytes
        return min(quota - share.used, real_free), quota

    def malloc(self, device: int, size: int, policy: int, *, owner: int = 0) -> int:
        share = self._share(device)
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc size must be positive, got {size}")
        if policy not in codes.MallocPolicy.__members__.values():
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown malloc policy {policy}")
        accounted = -(-size // ALLOC_ALIGN) * ALLOC_ALIGN
        with self._lock:  # the quota check and the reservation are one step
            quota = share.spec.memory_bytes
            if share.used + accounted > quota:
                raise AclFailure(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"malloc of {size} bytes exceeds the memory quota of device {device}:"
                    f" {share.used} of {quota} bytes in use",
                )
            share.used += accounted
        try:
            self._select(share)
            ptr = self.rt.malloc(size, policy)
            if not 0 < ptr < HOST_TAG:
                if ptr:
                    self.rt.call("aclrtFree", ptr)
                raise AclFailure(
                    codes.ACL_ERROR_INTERNAL_ERROR, f"the CANN runtime returned pointer {ptr:#x}"
                )
        except BaseException:
            with self._lock:
                share.used -= accounted
            raise
        with self._lock:
            self._allocs[ptr] = _Allocation(ptr, size, accounted, device, owner)
            bisect.insort(self._bases, ptr)
            used = share.used
        share.ledger.set_mem_used(share.slot, used)
        return ptr

    def free(self, ptr: int, *, owner: int = 0) -> None:
        alloc = self._find(ptr, 0, owner=owner, exact=True)
        self._select(self._shares[alloc.device])
        self.rt.call("aclrtFree", ptr)
        self._forget(alloc)

    def device_view(self, ptr: int, count: int, *, owner: int = 0) -> memoryview:
        raise AclFailure(
            codes.ACL_ERROR_API_NOT_SUPPORT,
            "device memory of the ascend backend is not host-addressable (use copy_to_device/copy_from_device)",
        )

    def copy_to_device(self, ptr: int, src: memoryview, *, owner: int = 0) -> None:
        alloc = self._find(ptr, src.nbytes, owner=owner)
        buf = _host_buffer(src)
        self._select(self._shares[alloc.device])
        self.rt.call("aclrtMemcpy", ptr, alloc.base + alloc.size - ptr, buf, src.nbytes, _H2D)

    def copy_from_device(self, ptr: int, dst: memoryview, *, owner: int = 0) -> None:
        alloc = self._find(ptr, dst.nbytes, owner=owner)
        if dst.readonly:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "the destination host buffer is read-only")
        self._select(self._shares[alloc.device])
        self.rt.call("aclrtMemcpy", _host_buffer(dst), dst.nbytes, ptr, dst.nbytes, _D2H)

    def copy_on_device(self, dst: int, src: int, count: int, *, owner: int = 0) -> None:
        d, s = self._find(dst, count, owner=owner), self._find(src, count, owner=owner)
        self._select(self._shares[d.device])
        self.rt.call(
            "aclrtMemcpy", dst, d.base + d.size - dst, src, s.base + s.size - src if count else 0, _D2D
        )

    def memcpy_regions(
        self,
        *,
        dst: int,
        src: int,
        count: int,
        span: int,
        dst_region: datalink.Region | None,
        src_region: datalink.Region | None,
        owner: int = 0,
    ) -> None:
        """The session layer's memcpy: a host side is a data-link region (read or written with
        pread/pwrite through a bounce buffer), a device side is checked for all of ``span`` first."""
        for ptr, region in ((dst, dst_region), (src, src_region)):
            if region is None:
                self._find(ptr, span, owner=owner)
        try:
            if dst_region is None and src_region is None:
                self.copy_on_device(dst, src, count, owner=owner)
                return
            buf = memoryview(bytearray(count))
            if src_region is not None:
                src_region.read_into(split_host_ptr(src)[1], buf)
            else:
                self.copy_from_device(src, buf, owner=owner)
            if dst_region is not None:
                dst_region.write_from(split_host_ptr(dst)[1], buf)
            else:
                self.copy_to_device(dst, buf, owner=owner)
        except OSError as exc:  # the client truncated or broke its own region file
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy through the data link failed: {exc}"
            ) from exc

    def memset(self, ptr: int, value: int, count: int, *, owner: int = 0) -> None:
        if not 0 <= value <= 255:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"memset value must be a byte, got {value}")
        alloc = self._find(ptr, count, owner=owner)
        self._select(self._shares[alloc.device])
        self.rt.call("aclrtMemset", ptr, alloc.base + alloc.size - ptr, value, count)

    # -- compute -----------------------------------------------------------------------------

    def acquire_slice(self, device: int, want_us: int, cancel: threading.Event) -> tuple[float, float] | None:
        share = self._share(device)
        grant = share.ledger.acquire(share.slot, want_us, cancel)
        if grant is not None:
            share.die_us += round((grant[1] - grant[0]) * 1e6)
        return grant

    def complete_kernel(
        self, *, out_ptr: int, tag: int, input_view: memoryview | None, owner: int = 0
    ) -> None:
        if out_ptr:
            result = memoryview(bytearray(_RESULT.pack(tag & (2**64 - 1), 0)))
            # freed while the kernel ran: the result has nowhere to go, as on a device
            with contextlib.suppress(AclFailure):
                self.copy_to_device(out_ptr, result[:KERNEL_RESULT_BYTES], owner=owner)

    def compute_usage(self, device: int) -> tuple[int, int]:
        share = self._share(device)
        return share.die_us, share.spec.compute_percent

    # -- lifecycle ---------------------------------------------------------------------------

    def release_all(self, *, owner: int | None = None) -> None:
        with self._lock:
            doomed = [a for a in self._allocs.values() if owner is None or owner in (0, a.owner)]
        for alloc in doomed:
            try:
                self._select(self._shares[alloc.device])
                self.rt.call("aclrtFree", alloc.base)
            except AclFailure:
                pass  # counted as released: the device runtime owns what it could not free
            self._forget(alloc)

    def close(self) -> None:
        self.release_all()
        for share in self._shares:
            with contextlib.suppress(OSError):
                share.ledger.unregister(share.slot)
        self._shares.clear()
        for ledger in self._ledgers.values():
            ledger.close()
        self._ledgers.clear()
        for device in getattr(self._local, "devices", set()):
            with contextlib.suppress(AclFailure):
                self.rt.call("aclrtResetDevice", device)
        with contextlib.suppress(AclFailure):
            self.rt.call("aclFinalize")

    # -- helpers -----------------------------------------------------------------------------

    def _share(self, device: int) -> _Share:
        if not 0 <= device < len(self._shares):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_DEVICE, f"device {device} does not exist (0..{len(self._shares) - 1})"
            )
        return self._shares[device]

    def _select(self, share: _Share) -> None:
        """Make the share's die the calling thread's current ACL device."""
        phy = share.spec.die_phy_id
        if getattr(self._local, "device", None) != phy:
            self.rt.set_device(phy)
            self._local.device = phy
            self._local.devices = getattr(self._local, "devices", set()) | {phy}

    def _find(self, ptr: int, count: int, *, owner: int, exact: bool = False) -> _Allocation:
        with self._lock:
            i = bisect.bisect_right(self._bases, ptr) - 1
            alloc = self._allocs[self._bases[i]] if i >= 0 else None
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
                f"{count} bytes at {ptr:#x} run past the end of its allocation ({alloc.size} bytes at {alloc.base:#x})",
            )
        return alloc

    def _forget(self, alloc: _Allocation) -> None:
        share = self._shares[alloc.device]
        with self._lock:
            if self._allocs.pop(alloc.base, None) is None:
                return
            del self._bases[bisect.bisect_left(self._bases, alloc.base)]
            share.used -= alloc.accounted
            used = share.used
        share.ledger.set_mem_used(share.slot, used)


def _host_buffer(view: memoryview) -> Any:
    """A ctypes array over a contiguous host buffer (a read-only one is copied), passed as a pointer."""
    if not view.c_contiguous:
        raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "a host buffer must be C-contiguous")
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    array_type = ctypes.c_char * flat.nbytes
    return array_type.from_buffer_copy(flat) if flat.readonly else array_type.from_buffer(flat)

"""The aclserver's ``ascend`` backend: the ``Backend`` protocol over the host's CANN runtime.

NOT YET VERIFIED ON HARDWARE. It binds CANN's ``libascendcl.so`` with ctypes (path
configurable, see ``DEFAULT_LIBRARY``) and is tested against ``tests/c/cann_emulator.c``, an
ABI-compatible library with device memory in host RAM and call counters.

* Devices: share ``virtual_id`` i is ACL device ``die_phy_id`` of share i. On nodes where ACL's
  logic IDs differ from physical IDs this mapping needs the logic ID (not handled yet).
* Memory: the quota book (``quota.py``, shared with the emulated backend) checks the share's
  quota before every ``aclrtMalloc`` and frees through ``aclrtFree``. ``mem_info`` reports free
  as the smaller of what the quota leaves and what the die really has free.
* Errors: a non-zero ACL code is passed through unchanged, with ``aclGetRecentErrMsg``'s text.
* Threads: ACL's current device is per thread, so every call first selects its share's device in
  the calling thread (cached per thread).
* Device memory is not host-addressable. ``device_view`` refuses with
  ``ACL_ERROR_API_NOT_SUPPORT`` (so emulated kernels, which read device memory, are refused);
  copies go through ``copy_to_device``, ``copy_from_device`` and ``copy_on_device``
  (``aclrtMemcpy``); the session layer's ``memcpy`` bounces data-link regions through host memory.
* Compute: slices come from the die ledger through the quota book, as with the emulated backend,
  so compute quotas hold across aclservers. Real kernels are not intercepted.
* Models: forwarded to ``aclmdlLoadFromMemWithMem`` with weight and work memory the quota book
  charged (or the caller's), described through CANN's desc queries into the layout of
  ``docs/model-format.md``, executed with CANN datasets of the device buffers; an execution is
  charged the die time the model's previous execution took (``ascend_models.py``).
* Operators (``execute_operator``, called by ``opexec.py`` in stream order): forwarded to CANN's
  single-operator API or to the host's ``libopapi.so`` (``ascend_ops.py``); an aclnn workspace is
  device memory charged to the session's quota while the operator runs.
* Kernel binaries (``kernels.py``'s hooks): ``aclrtBinaryLoadFromData``, ``aclrtBinaryGetFunction``,
  ``aclrtLaunchKernel`` (arguments by value, on the operators' stream of the die, synchronized) and
  ``aclrtBinaryUnLoad``.
* Virtual memory (``vmm.py``'s hooks ``make_memory``, ``make_handle``, ``map_memory``,
  ``unmap_memory``): ``aclrtReserveMemAddress`` (not charged), ``aclrtMallocPhysical`` (charged to
  the quota like ``aclrtMalloc``; the client sees a token address, the CANN handle stays here),
  ``aclrtMapMem``, ``aclrtUnmapMem``, ``aclrtReleaseMemAddress``, ``aclrtFreePhysical``. Freeing a
  range or a handle (a session's close included) unmaps what CANN still maps there first.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flexnpu_runtime.aclserver import datalink
from flexnpu_runtime.aclserver.ascend_models import ModelRuntime
from flexnpu_runtime.aclserver.ascend_ops import OperatorRuntime
from flexnpu_runtime.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, Allocation, Buffer, LoadedModel
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire.datalink import HOST_TAG
from flexnpu_wire.launch import AclServerSpec
from flexnpu_wire.modelfile import ModelFile

if TYPE_CHECKING:
    from flexnpu_wire.opcall import OpCall

__all__ = ["DEFAULT_LIBRARY", "AscendBackend", "AscendRuntime"]

DEFAULT_LIBRARY = "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"
_H2D, _D2H, _D2D = 1, 2, 3
_HBM = int(codes.MemAttr.HBM_MEM)
_RESULT = struct.Struct("<QQ")
_HANDLE_BASE = 1 << 59
"""Physical handles are named to the client by token addresses from here (beyond any device or host
address, below the data link's HOST_TAG), so the book never confuses one with device memory."""
_HANDLE_GAP = 1 << 32
_ACL_MEM_LOCATION_TYPE_DEVICE = 1


class _PhysicalMemProp(ctypes.Structure):
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
class _Reserved:
    """The payload of a reserved range's allocation (CANN's address is its base)."""


@dataclass(frozen=True, slots=True)
class _Physical:
    """The payload of a physical handle's allocation: CANN's aclrtDrvMemHandle."""

    handle: int


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
        vmm: dict[str, list[Any]] = {
            "aclrtReserveMemAddress": [c.POINTER(c.c_void_p), c.c_size_t, c.c_size_t, c.c_void_p, c.c_uint64],
            "aclrtReleaseMemAddress": [c.c_void_p],
            "aclrtMallocPhysical": [
                c.POINTER(c.c_void_p),
                c.c_size_t,
                c.POINTER(_PhysicalMemProp),
                c.c_uint64,
            ],
            "aclrtFreePhysical": [c.c_void_p],
            "aclrtMapMem": [c.c_void_p, c.c_size_t, c.c_size_t, c.c_void_p, c.c_uint64],
            "aclrtUnmapMem": [c.c_void_p],
            "aclrtBinaryLoadFromData": [c.c_void_p, c.c_size_t, c.c_void_p, c.POINTER(c.c_void_p)],
            "aclrtBinaryGetFunction": [c.c_void_p, c.c_char_p, c.POINTER(c.c_void_p)],
            "aclrtLaunchKernel": [c.c_void_p, c.c_uint32, c.c_void_p, c.c_size_t, c.c_void_p],
            "aclrtBinaryUnLoad": [c.c_void_p],
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
        for name, argtypes in vmm.items():  # optional: a runtime without one answers 200001 when it is called
            fn = getattr(lib, name, None)
            if fn is not None:
                fn.argtypes, fn.restype = argtypes, c.c_int
                self._fns[name] = fn
        self._errmsg = getattr(lib, "aclGetRecentErrMsg", None)
        if self._errmsg is not None:
            self._errmsg.argtypes = []
            self._errmsg.restype = c.c_char_p
        self._lib = lib
        self._models: ModelRuntime | None = None
        self._operators: OperatorRuntime | None = None
        self._op_guard = threading.Lock()

    def models(self) -> ModelRuntime:
        """The aclmdl binding, made at the first model call (AclFailure 200001 if the runtime lacks it)."""
        if self._models is None:
            self._models = ModelRuntime(self._lib, self.path, self.call)
        return self._models

    def operators(self) -> OperatorRuntime:
        """The operator binding, made at the first operator (AclFailure if the runtime lacks it)."""
        with self._op_guard:
            if self._operators is None:
                self._operators = OperatorRuntime(self._lib, self.path, self.recent_error)
            return self._operators

    def close_operators(self) -> None:
        if self._operators is not None:
            self._operators.close(self.set_device)

    def recent_error(self) -> str:
        raw = self._errmsg() if self._errmsg is not None else None
        return raw.decode(errors="replace") if isinstance(raw, bytes) else ""

    def call(self, name: str, *args: object, fn: Any = None) -> None:
        if fn is None and name not in self._fns:
            raise AclFailure(
                codes.ACL_ERROR_API_NOT_SUPPORT, f"{name}: the host's CANN runtime {self.path} lacks it"
            )
        ret = int((fn or self._fns[name])(*args))
        if ret != 0:
            text = self.recent_error()
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


class AscendBackend:
    """Real device memory through CANN; quotas and die time kept by the quota book."""

    def __init__(self, spec: AclServerSpec, *, library: str = DEFAULT_LIBRARY) -> None:
        self.rt = AscendRuntime(library)
        self._local = threading.local()
        self._dies: dict[int, int] = {}
        self._handle_ids = itertools.count(_HANDLE_BASE, _HANDLE_GAP)
        self._mappings: dict[int, tuple[int, int]] = {}
        """CANN mappings: address -> (its range's base, the CANN handle mapped there)."""
        self._vmm_lock = threading.Lock()
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
                self._dies[share.virtual_id] = share.die_phy_id
            self.book = QuotaBook(spec, drop=self._drop)
        except BaseException:
            self._finalize()
            raise

    # -- devices and memory ------------------------------------------------------------------

    def mem_info(self, device: int) -> tuple[int, int]:
        free, quota = self.book.mem_info(device)
        self._select(device)
        real_free, _total = self.rt.mem_info()
        return min(free, real_free), quota

    def malloc(self, device: int, size: int, policy: int, *, owner: int = 0) -> int:
        def make(size: int) -> tuple[int, None]:
            self._select(device)
            ptr = self.rt.malloc(size, policy)
            if not 0 < ptr < HOST_TAG:
                if ptr:
                    self.rt.call("aclrtFree", ptr)
                raise AclFailure(
                    codes.ACL_ERROR_INTERNAL_ERROR, f"the CANN runtime returned pointer {ptr:#x}"
                )
            return ptr, None

        return self.book.allocate(device, size, policy, owner=owner, make=make).base

    def _drop(self, alloc: Allocation) -> None:
        self._select(alloc.device)
        payload = alloc.payload
        if isinstance(payload, _Reserved | _Physical):
            self._drop_virtual(alloc.base, payload)
        else:
            self.rt.call("aclrtFree", alloc.base)

    # -- virtual memory (vmm.py's hooks; the session layer keeps the books) ---------------------------

    def make_memory(self, size: int, *, device: int = 0) -> tuple[int, _Reserved]:
        """A reserved range of device addresses (aclrtReserveMemAddress)."""
        self._select(device)
        va = ctypes.c_void_p()
        self.rt.call("aclrtReserveMemAddress", ctypes.byref(va), size, 0, None, 0)
        return int(va.value or 0), _Reserved()

    def make_handle(self, size: int, *, device: int = 0) -> tuple[int, _Physical]:
        """Physical memory of the share's die (aclrtMallocPhysical), named by a token address."""
        self._select(device)
        prop = _PhysicalMemProp(
            0, 0, int(codes.MemAttr.HBM_HUGE), self._dies[device], _ACL_MEM_LOCATION_TYPE_DEVICE, 0
        )
        handle = ctypes.c_void_p()
        self.rt.call("aclrtMallocPhysical", ctypes.byref(handle), size, ctypes.byref(prop), 0)
        return next(self._handle_ids), _Physical(int(handle.value or 0))

    def map_memory(
        self, *, address: int, size: int, offset: int, handle: Allocation, into: Allocation
    ) -> None:
        """Map ``size`` bytes of ``handle`` from ``offset`` at ``address`` inside the range ``into``."""
        assert isinstance(handle.payload, _Physical)
        self._select(into.device)
        self.rt.call("aclrtMapMem", address, size, offset, handle.payload.handle, 0)
        with self._vmm_lock:
            self._mappings[address] = (into.base, handle.payload.handle)

    def unmap_memory(self, *, address: int, into: Allocation) -> None:
        self._select(into.device)
        self.rt.call("aclrtUnmapMem", address)
        with self._vmm_lock:
            self._mappings.pop(address, None)

    def _drop_virtual(self, base: int, payload: _Reserved | _Physical) -> None:
        """Release a range or free a handle, unmapping first what CANN still maps in it or of it."""
        handle = payload.handle if isinstance(payload, _Physical) else None
        with self._vmm_lock:
            stale = [a for a, (r, h) in self._mappings.items() if (h == handle if handle else r == base)]
        for address in stale:
            with contextlib.suppress(AclFailure):
                self.rt.call("aclrtUnmapMem", address)
            with self._vmm_lock:
                self._mappings.pop(address, None)
        if handle is not None:
            self.rt.call("aclrtFreePhysical", handle)
        else:
            self.rt.call("aclrtReleaseMemAddress", base)

    # -- kernel binaries (kernels.py's hooks) ---------------------------------------------------------

    def load_binary(self, device: int, data: memoryview) -> int:
        """aclrtBinaryLoadFromData on ``device``'s die (no load options); CANN's aclrtBinHandle."""
        self._select(device)
        handle = ctypes.c_void_p()
        self.rt.call("aclrtBinaryLoadFromData", _host_buffer(data), data.nbytes, None, ctypes.byref(handle))
        return int(handle.value or 0)

    def binary_function(self, device: int, binary: int, name: str) -> int:
        self._select(device)
        func = ctypes.c_void_p()
        self.rt.call("aclrtBinaryGetFunction", binary, name.encode(), ctypes.byref(func))
        return int(func.value or 0)

    def launch_function(self, device: int, func: int, block_dim: int, args: bytes) -> int:
        """aclrtLaunchKernel with the arguments by value on the die's stream, synchronized; its die µs."""
        ops = self.rt.operators()
        self._select(device)
        block = ctypes.create_string_buffer(args, len(args))

        def launch(stream: int, _held: object) -> None:
            self.rt.call("aclrtLaunchKernel", func, block_dim, block if args else None, len(args), stream)

        return ops.run(self._dies[device], "aclrtLaunchKernel", launch)

    def unload_binary(self, device: int, binary: int) -> None:
        self._select(device)
        self.rt.call("aclrtBinaryUnLoad", binary)

    # -- operators ---------------------------------------------------------------------------------

    def execute_operator(self, call: OpCall, *, device: int, owner: int) -> int:
        """Run ``call`` on ``device``'s die through the host's CANN, in the calling worker's turn; its die µs.
        An aclnn workspace is allocated from the quota for ``owner`` and freed when the operator ended."""

        def workspace(size: int) -> tuple[int, Callable[[], None]]:
            ptr = self.malloc(device, size, 0, owner=owner)
            return ptr, lambda: self.book.free(ptr, owner=owner)

        ops = self.rt.operators()
        self._select(device)
        return ops.execute(call, phy=self._dies[device], workspace=workspace)

    def device_view(self, ptr: int, count: int, *, owner: int = 0) -> memoryview:
        raise AclFailure(
            codes.ACL_ERROR_API_NOT_SUPPORT,
            "device memory of the ascend backend is not host-addressable (use copy_to_device/copy_from_device)",
        )

    def copy_to_device(self, ptr: int, src: memoryview, *, owner: int = 0) -> None:
        alloc = self.book.find(ptr, src.nbytes, owner=owner)
        buf = _host_buffer(src)
        self._select(alloc.device)
        self.rt.call("aclrtMemcpy", ptr, alloc.base + alloc.size - ptr, buf, src.nbytes, _H2D)

    def copy_from_device(self, ptr: int, dst: memoryview, *, owner: int = 0) -> None:
        alloc = self.book.find(ptr, dst.nbytes, owner=owner)
        if dst.readonly:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "the destination host buffer is read-only")
        self._select(alloc.device)
        self.rt.call("aclrtMemcpy", _host_buffer(dst), dst.nbytes, ptr, dst.nbytes, _D2H)

    def copy_on_device(self, dst: int, src: int, count: int, *, owner: int = 0) -> None:
        d, s = self.book.find(dst, count, owner=owner), self.book.find(src, count, owner=owner)
        self._select(d.device)
        self.rt.call(
            "aclrtMemcpy", dst, d.base + d.size - dst, src, s.base + s.size - src if count else 0, _D2D
        )

    def memcpy(
        self,
        *,
        dst: int,
        src: int,
        count: int,
        span: int,
        dst_region: datalink.AnyRegion | None,
        src_region: datalink.AnyRegion | None,
        owner: int = 0,
    ) -> None:
        """A host side is a data-link region (read or written through a bounce buffer), a device
        side is checked for all of ``span`` first."""
        for ptr, region in ((dst, dst_region), (src, src_region)):
            if region is None:
                self.book.find(ptr, span, owner=owner)
        if dst_region is None and src_region is None:
            self.copy_on_device(dst, src, count, owner=owner)
            return
        buf = memoryview(bytearray(count))
        if src_region is not None:
            src_region.read_into(wire_datalink.split_host_ptr(src)[1], buf)
        else:
            self.copy_from_device(src, buf, owner=owner)
        if dst_region is not None:
            dst_region.write_from(wire_datalink.split_host_ptr(dst)[1], buf)
        else:
            self.copy_to_device(dst, buf, owner=owner)

    def memset(self, ptr: int, value: int, count: int, *, owner: int = 0) -> None:
        if not 0 <= value <= 255:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"memset value must be a byte, got {value}")
        alloc = self.book.find(ptr, count, owner=owner)
        self._select(alloc.device)
        self.rt.call("aclrtMemset", ptr, alloc.base + alloc.size - ptr, value, count)

    # -- compute -----------------------------------------------------------------------------

    def complete_kernel(
        self, *, out_ptr: int, tag: int, input_view: memoryview | None, owner: int = 0
    ) -> None:
        if out_ptr:
            result = memoryview(bytearray(_RESULT.pack(tag & (2**64 - 1), 0)))
            # freed while the kernel ran: the result has nowhere to go, as on a device
            with contextlib.suppress(AclFailure):
                self.copy_to_device(out_ptr, result[:KERNEL_RESULT_BYTES], owner=owner)

    # -- models: forwarded to CANN's aclmdl* with the device memory the book holds ------------

    def peek(self, ptr: int, count: int, *, owner: int) -> bytes:
        out = bytearray(count)
        self.copy_from_device(ptr, memoryview(out), owner=owner)
        return bytes(out)

    def describe_model(self, data: memoryview) -> ModelFile:
        mdl = self.rt.models()
        buf = _host_buffer(data)
        work, weight = ctypes.c_size_t(), ctypes.c_size_t()
        mdl.call("aclmdlQuerySizeFromMem", buf, data.nbytes, ctypes.byref(work), ctypes.byref(weight))
        desc = mdl.create_desc()
        try:
            mdl.call("aclmdlGetDescFromMem", desc, buf, data.nbytes)
            return mdl.describe(desc, work=work.value, weight=weight.value)
        finally:
            mdl.destroy_desc(desc)

    def load_model(
        self, device: int, data: memoryview, desc: ModelFile, *, weight: Buffer | None, work: Buffer | None
    ) -> LoadedModel:
        self._select(device)
        model_id = ctypes.c_uint32()
        self.rt.models().call(
            "aclmdlLoadFromMemWithMem", _host_buffer(data), data.nbytes, ctypes.byref(model_id),
            work.ptr if work else None, work.size if work else 0,
            weight.ptr if weight else None, weight.size if weight else 0,
        )  # fmt: skip
        return LoadedModel(device, desc, weight, work, handle=model_id.value)

    def execution(
        self,
        model: LoadedModel,
        inputs: list[Buffer],
        outputs: list[Buffer],
        *,
        batch: int,
        hw: tuple[int, int],
    ) -> tuple[int, Callable[[], None]]:
        """CANN gives no cost up front: an execution is charged the die time the model's previous
        execution took (the first one nothing), measured around ``aclmdlExecute``."""
        mdl = self.rt.models()
        dynamic = model.desc.dynamic_index()

        def run() -> None:
            self._select(model.device)
            datasets = [mdl.dataset(bufs) for bufs in (inputs, outputs)]
            try:
                if dynamic is not None and batch:
                    mdl.call("aclmdlSetDynamicBatchSize", model.handle, datasets[0][0], dynamic, batch)
                elif dynamic is not None and hw != (0, 0):
                    mdl.call("aclmdlSetDynamicHWSize", model.handle, datasets[0][0], dynamic, hw[0], hw[1])
                start = time.monotonic()
                mdl.call("aclmdlExecute", model.handle, datasets[0][0], datasets[1][0])
                model.last_cost_us = round((time.monotonic() - start) * 1e6)
            finally:
                for dataset in datasets:
                    mdl.destroy_dataset(dataset)

        return model.last_cost_us, run

    def unload_model(self, model: LoadedModel) -> None:
        if model.handle is not None:
            self._select(model.device)
            self.rt.models().call("aclmdlUnload", model.handle)
            model.handle = None

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        self.book.close()
        with contextlib.suppress(AclFailure):
            self.rt.close_operators()
        self._local.device = None  # close_operators selected dies behind the cache
        self._finalize()

    def _finalize(self) -> None:
        for device in getattr(self._local, "devices", set()):
            with contextlib.suppress(AclFailure):
                self.rt.call("aclrtResetDevice", device)
        with contextlib.suppress(AclFailure):
            self.rt.call("aclFinalize")

    # -- helpers -----------------------------------------------------------------------------

    def _select(self, device: int) -> None:
        """Make the die of virtual device ``device`` the calling thread's current ACL device."""
        phy = self._dies[device]
        if getattr(self._local, "device", None) != phy:
            self.rt.set_device(phy)
            self._local.device = phy
            self._local.devices = getattr(self._local, "devices", set()) | {phy}


def _host_buffer(view: memoryview) -> Any:
    """A ctypes array over a contiguous host buffer (a read-only one is copied), passed as a pointer."""
    if not view.c_contiguous:
        raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "a host buffer must be C-contiguous")
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    array_type = ctypes.c_char * flat.nbytes
    return array_type.from_buffer_copy(flat) if flat.readonly else array_type.from_buffer(flat)

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
* Models (``ascend_models.py``'s ``AscendModels``): forwarded to ``aclmdlLoadFromMemWithMem`` with weight
  and work memory the quota book charged (or the caller's), described through CANN's desc queries into the
  layout of ``docs/model-format.md``, executed with CANN datasets of the device buffers; an execution is
  charged the die time the model's previous execution took.
* Operators (``execute_operator``, called by ``opexec.py`` in stream order): forwarded to CANN's
  single-operator API or to the host's ``libopapi.so`` (``ascend_ops.py``); an aclnn workspace is
  device memory charged to the session's quota while the operator runs.
* Kernel binaries (``kernels.py``'s hooks): ``aclrtBinaryLoadFromData``, ``aclrtBinaryGetFunction``,
  ``aclrtLaunchKernelWithHostArgs`` (arguments by value, on the operators' stream of the die, synchronized) and
  ``aclrtBinaryUnLoad``.
* Virtual memory (``vmm.py``'s hooks ``make_memory``, ``make_handle``, ``map_memory``,
  ``unmap_memory``): forwarded to ``ascend_vmm.py``'s ``VirtualMemory`` (``aclrtReserveMemAddress``,
  ``aclrtMallocPhysical`` charged to the quota like ``aclrtMalloc``, ``aclrtMapMem``…).
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from flexnpu_runtime.aclserver import datalink
from flexnpu_runtime.aclserver.ascend_ctypes import host_buffer
from flexnpu_runtime.aclserver.ascend_models import AscendModels, ModelRuntime
from flexnpu_runtime.aclserver.ascend_ops import OperatorRuntime
from flexnpu_runtime.aclserver.ascend_vmm import Physical, PhysicalMemProp, Reserved, VirtualMemory
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

_ACL_RT_BINARY_LOAD_OPT_MAGIC = 2


class _BinaryLoadOption(ctypes.Structure):
    """CANN's aclrtBinaryLoadOption (acl/acl_rt.h): the option's type, then its value (a union of 16 bytes,
    its first uint32 the magic)."""

    _fields_ = [("type", ctypes.c_int), ("value", ctypes.c_uint32 * 4)]


class _BinaryLoadOptions(ctypes.Structure):
    """CANN's aclrtBinaryLoadOptions."""

    _fields_ = [("options", ctypes.POINTER(_BinaryLoadOption)), ("numOpt", ctypes.c_size_t)]


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
                c.POINTER(PhysicalMemProp),
                c.c_uint64,
            ],
            "aclrtFreePhysical": [c.c_void_p],
            "aclrtMapMem": [c.c_void_p, c.c_size_t, c.c_size_t, c.c_void_p, c.c_uint64],
            "aclrtUnmapMem": [c.c_void_p],
            "aclrtBinaryLoadFromData": [c.c_void_p, c.c_size_t, c.c_void_p, c.POINTER(c.c_void_p)],
            "aclrtBinaryGetFunction": [c.c_void_p, c.c_char_p, c.POINTER(c.c_void_p)],
            "aclrtLaunchKernelWithHostArgs": [
                c.c_void_p,
                c.c_uint32,
                c.c_void_p,
                c.c_void_p,
                c.c_void_p,
                c.c_size_t,
                c.c_void_p,
                c.c_size_t,
            ],
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
        self._vmm = VirtualMemory(self.rt.call, select=self._select, dies=self._dies)
        self._models = AscendModels(self.rt.models, select=self._select)
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
        if isinstance(payload, Reserved | Physical):
            self._vmm.drop(alloc.base, payload)
        else:
            self.rt.call("aclrtFree", alloc.base)

    # -- virtual memory (vmm.py's hooks; the session layer keeps the books) ---------------------------

    def make_memory(self, size: int, *, device: int = 0) -> tuple[int, Reserved]:
        return self._vmm.make_memory(size, device=device)

    def make_handle(self, size: int, *, device: int = 0) -> tuple[int, Physical]:
        return self._vmm.make_handle(size, device=device)

    def map_memory(
        self, *, address: int, size: int, offset: int, handle: Allocation, into: Allocation
    ) -> None:
        self._vmm.map_memory(address=address, size=size, offset=offset, handle=handle, into=into)

    def unmap_memory(self, *, address: int, into: Allocation) -> None:
        self._vmm.unmap_memory(address=address, into=into)

    # -- kernel binaries (kernels.py's hooks) ---------------------------------------------------------

    def load_binary(self, device: int, data: memoryview, magic: int = 0) -> int:
        """aclrtBinaryLoadFromData on ``device``'s die, with the option ACL_RT_BINARY_LOAD_OPT_MAGIC when
        ``magic`` is not 0 (no options otherwise); CANN's aclrtBinHandle."""
        self._select(device)
        handle = ctypes.c_void_p()
        options = None
        if magic:
            option = _BinaryLoadOption(_ACL_RT_BINARY_LOAD_OPT_MAGIC, (ctypes.c_uint32 * 4)(magic))
            options = ctypes.byref(_BinaryLoadOptions(ctypes.pointer(option), 1))
        self.rt.call("aclrtBinaryLoadFromData", host_buffer(data), data.nbytes, options, ctypes.byref(handle))
        return int(handle.value or 0)

    def binary_function(self, device: int, binary: int, name: str) -> int:
        self._select(device)
        func = ctypes.c_void_p()
        self.rt.call("aclrtBinaryGetFunction", binary, name.encode(), ctypes.byref(func))
        return int(func.value or 0)

    def launch_function(self, device: int, func: int, block_dim: int, args: bytes) -> int:
        """aclrtLaunchKernelWithHostArgs on the die's stream, synchronized; its die µs. The arguments are host
        bytes here (CANN's aclrtLaunchKernel takes them in device memory: the client read them from there)."""
        ops = self.rt.operators()
        self._select(device)
        block = ctypes.create_string_buffer(args, len(args))
        name = "aclrtLaunchKernelWithHostArgs"

        def launch(stream: int, _held: object) -> None:
            self.rt.call(name, func, block_dim, stream, None, block if args else None, len(args), None, 0)

        return ops.run(self._dies[device], name, launch)

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
        buf = host_buffer(src)
        self._select(alloc.device)
        self.rt.call("aclrtMemcpy", ptr, alloc.base + alloc.size - ptr, buf, src.nbytes, _H2D)

    def copy_from_device(self, ptr: int, dst: memoryview, *, owner: int = 0) -> None:
        alloc = self.book.find(ptr, dst.nbytes, owner=owner)
        if dst.readonly:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "the destination host buffer is read-only")
        self._select(alloc.device)
        self.rt.call("aclrtMemcpy", host_buffer(dst), dst.nbytes, ptr, dst.nbytes, _D2H)

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
        return self._models.describe(data)

    def load_model(
        self, device: int, data: memoryview, desc: ModelFile, *, weight: Buffer | None, work: Buffer | None
    ) -> LoadedModel:
        return self._models.load(device, data, desc, weight=weight, work=work)

    def execution(
        self,
        model: LoadedModel,
        inputs: list[Buffer],
        outputs: list[Buffer],
        *,
        batch: int,
        hw: tuple[int, int],
    ) -> tuple[int, Callable[[], None]]:
        return self._models.execution(model, inputs, outputs, batch=batch, hw=hw)

    def unload_model(self, model: LoadedModel) -> None:
        self._models.unload(model)

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

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
"""

from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from flexnpu_runtime.aclserver import datalink
from flexnpu_runtime.aclserver.ascend_models import ModelRuntime
from flexnpu_runtime.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, Allocation, Buffer, LoadedModel
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire.datalink import HOST_TAG
from flexnpu_wire.launch import AclServerSpec
from flexnpu_wire.modelfile import ModelFile

__all__ = ["DEFAULT_LIBRARY", "AscendBackend", "AscendRuntime"]

DEFAULT_LIBRARY = "/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so"
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
        self._lib = lib
        self._models: ModelRuntime | None = None

    def models(self) -> ModelRuntime:
        """The aclmdl binding, made at the first model call (AclFailure 200001 if the runtime lacks it)."""
        if self._models is None:
            self._models = ModelRuntime(self._lib, self.path, self.call)
        return self._models

    def call(self, name: str, *args: object, fn: Any = None) -> None:
        ret = int((fn or self._fns[name])(*args))
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


class AscendBackend:
    """Real device memory through CANN; quotas and die time kept by the quota book."""

    def __init__(self, spec: AclServerSpec, *, library: str = DEFAULT_LIBRARY) -> None:
        self.rt = AscendRuntime(library)
        self._local = threading.local()
        self._dies: dict[int, int] = {}
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
        self.rt.call("aclrtFree", alloc.base)

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

"""The ``emulated`` backend: host memory as device memory, a ledger-scheduled sleep as a kernel.

Device memory is host memory (anonymous mappings from 1 MiB, with transparent huge pages from
4 MiB, so copies run at memcpy speed), accounted exactly by the quota book (``quota.py``). A
kernel occupies its die for ``duration_us``: each slice is granted by the per-die ledger (so
compute quotas hold across aclserver processes) and the die is held for the slice's wall-clock
time while the host thread sleeps (spinning on a small CI machine would measure host CPU
contention, not the quota scheduler). The kernel's visible effect (a tag and a CRC32 of its
input written into an output buffer) is computed for real so tests can see it ran. Models are
files of FlexNPU's emulated format (``docs/model-format.md``): their weight and work memory is
device memory from the quota (or the caller's), an execution holds the die for the model's
declared cost like a kernel, then computes real outputs (``model_exec.py``). Nothing here
pretends to drive hardware.
"""

from __future__ import annotations

import contextlib
import mmap
import struct
import threading
import zlib
from collections.abc import Callable

from flexnpu_runtime.aclserver import datalink, model_exec
from flexnpu_runtime.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, Allocation, Buffer, LoadedModel
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes, modelfile
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire.launch import AclServerSpec
from flexnpu_wire.modelfile import ModelFile

__all__ = ["EmulatedBackend"]

_PTR_BASE = 0x1_0000_0000_0000
_PTR_GAP = 4096
_MMAP_THRESHOLD = 1 << 20
_HUGE_THRESHOLD = 4 << 20
_RESULT = struct.Struct("<QQ")


class EmulatedBackend:
    """Host memory as device memory, a ledger-scheduled sleep as a kernel."""

    def __init__(self, spec: AclServerSpec) -> None:
        self._lock = threading.Lock()
        self._next = _PTR_BASE
        self.book = QuotaBook(spec, drop=_release_buffer)

    def mem_info(self, device: int) -> tuple[int, int]:
        return self.book.mem_info(device)

    def malloc(self, device: int, size: int, policy: int, *, owner: int = 0) -> int:
        return self.book.allocate(device, size, policy, owner=owner, make=self._make).base

    def _make(self, size: int) -> tuple[int, memoryview]:
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
        # addresses are never reused: a pointer freed while a task still used it stays dead
        with self._lock:
            base = self._next
            self._next += -(-(size + _PTR_GAP) // _PTR_GAP) * _PTR_GAP
        return base, memoryview(buf)

    def device_view(self, ptr: int, count: int, *, owner: int = 0) -> memoryview:
        alloc = self.book.find(ptr, count, owner=owner)
        offset = ptr - alloc.base
        view: memoryview | None = alloc.payload
        if view is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{ptr:#x} is a physical memory handle (aclrtMallocPhysical): map it (aclrtMapMem) and use that address",
            )
        return view[offset : offset + count]

    def make_memory(self, size: int, *, device: int = 0) -> tuple[int, memoryview]:
        """Addresses and lazily mapped memory for a reserved range (vmm.py): pages cost nothing until written."""
        buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        with self._lock:
            base = self._next
            self._next += -(-(size + _PTR_GAP) // _PTR_GAP) * _PTR_GAP
        return base, memoryview(buf)

    def make_handle(self, size: int, *, device: int = 0) -> tuple[int, None]:
        """An address for a physical memory handle (vmm.py), which has no memory until it is mapped."""
        with self._lock:
            base = self._next
            self._next += -(-(size + _PTR_GAP) // _PTR_GAP) * _PTR_GAP
        return base, None

    def memset(self, ptr: int, value: int, count: int, *, owner: int = 0) -> None:
        if not 0 <= value <= 255:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"memset value must be a byte, got {value}")
        view = self.device_view(ptr, count, owner=owner)
        view[:] = bytes([value]) * count

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
        src_view = None if src_region else self.device_view(src, span, owner=owner)[:count]
        dst_view = None if dst_region else self.device_view(dst, span, owner=owner)[:count]
        if src_region is not None and dst_region is not None:
            buf = memoryview(bytearray(count))
            src_region.read_into(wire_datalink.split_host_ptr(src)[1], buf)
            dst_region.write_from(wire_datalink.split_host_ptr(dst)[1], buf)
        elif src_region is not None:
            assert dst_view is not None
            src_region.read_into(wire_datalink.split_host_ptr(src)[1], dst_view)
        elif dst_region is not None:
            assert src_view is not None
            dst_region.write_from(wire_datalink.split_host_ptr(dst)[1], src_view)
        else:
            assert dst_view is not None and src_view is not None
            dst_view[:] = src_view

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

    # -- models ------------------------------------------------------------------------------------

    def peek(self, ptr: int, count: int, *, owner: int) -> bytes:
        return bytes(self.device_view(ptr, count, owner=owner))

    def describe_model(self, data: memoryview) -> ModelFile:
        try:
            desc = modelfile.parse_header(data)
            modelfile.check(desc)
        except modelfile.ModelFormatError as exc:
            raise AclFailure(
                codes.ACL_ERROR_PARSE_MODEL,
                f"not a model of FlexNPU's emulated format (docs/model-format.md): {exc}",
            ) from None
        want = modelfile.header_bytes(data) + desc.weight_bytes
        if len(data) != want:
            raise AclFailure(
                codes.ACL_ERROR_MODEL_SIZE_INVALID, f"the model has {len(data)} bytes, its header says {want}"
            )
        return desc

    def load_model(
        self, device: int, data: memoryview, desc: ModelFile, *, weight: Buffer | None, work: Buffer | None
    ) -> LoadedModel:
        if weight is not None and desc.weight_bytes:
            start = modelfile.header_bytes(data)
            self._view(weight)[: desc.weight_bytes] = data[start : start + desc.weight_bytes]
        return LoadedModel(device, desc, weight, work)

    def execution(
        self,
        model: LoadedModel,
        inputs: list[Buffer],
        outputs: list[Buffer],
        *,
        batch: int,
        hw: tuple[int, int],
    ) -> tuple[int, Callable[[], None]]:
        desc = model.desc
        ins, outs = [self._view(b) for b in inputs], [self._view(b) for b in outputs]
        weights = self._view(model.weight)[: desc.weight_bytes] if model.weight is not None else None
        elements = sum(o.tensor.elements(batch, hw) for o in desc.outputs)

        def run() -> None:
            model_exec.run(desc, ins, outs, weights, batch=batch, hw=hw)

        return desc.cost_of(elements), run

    def unload_model(self, model: LoadedModel) -> None:
        """Nothing beyond the memory the session frees through the book."""

    @staticmethod
    def _view(buf: Buffer) -> memoryview:
        """The bytes of ``buf``, from its allocation (valid while the allocation is pinned)."""
        offset = buf.ptr - buf.alloc.base
        view: memoryview = buf.alloc.payload
        return view[offset : offset + buf.size]

    def close(self) -> None:
        self.book.close()


def _release_buffer(alloc: Allocation) -> None:
    """Host memory goes when the last view of it does (a running copy's view keeps it alive)."""
    view = alloc.payload
    if isinstance(view, memoryview):
        obj = view.obj
        view.release()
        if isinstance(obj, mmap.mmap):
            with contextlib.suppress(BufferError):  # another live view: freed when it goes
                obj.close()

"""The aclmdl* half of the ascend backend: CANN's model calls, their structs, a CANN description rendered
as FlexNPU's description layout (``docs/model-format.md``), and the backend's model hooks forwarded to them.

NOT YET VERIFIED ON HARDWARE: tested against ``tests/c/cann_emulator.c``. Bound at the first
model call, so a runtime without the model library still serves memory and kernels; a missing
function is ``ACL_ERROR_API_NOT_SUPPORT`` naming it. Prototypes are CANN's (``acl_mdl.h``,
``acl_base.h``): ``aclmdlIODims`` {char name[128]; size_t dimCount; int64_t dims[128]},
``aclmdlBatch`` {size_t batchCount; uint64_t batch[128]}, ``aclmdlHW`` {size_t hwCount;
uint64_t hw[128][2]}.

``AscendModels`` is what ``AscendBackend`` forwards ``describe_model``, ``load_model``, ``execution`` and
``unload_model`` to: ``aclmdlLoadFromMemWithMem`` with weight and work memory the quota book charged (or the
caller's), executions with CANN datasets of the device buffers, each charged the die time the model's
previous execution took.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

from flexnpu_runtime.aclserver.ascend_ctypes import host_buffer
from flexnpu_runtime.aclserver.backend import AclFailure, Buffer, LoadedModel
from flexnpu_wire import codes, modelfile

__all__ = ["AscendModels", "Batch", "IODims", "ModelRuntime"]

c = ctypes


class IODims(c.Structure):
    _fields_ = [("name", c.c_char * 128), ("dimCount", c.c_size_t), ("dims", c.c_int64 * 128)]


class Batch(c.Structure):
    _fields_ = [("batchCount", c.c_size_t), ("batch", c.c_uint64 * 128)]


class HW(c.Structure):
    _fields_ = [("hwCount", c.c_size_t), ("hw", (c.c_uint64 * 2) * 128)]


_P = c.c_void_p
_ERROR_FNS: dict[str, list[Any]] = {
    "aclmdlQuerySizeFromMem": [_P, c.c_size_t, c.POINTER(c.c_size_t), c.POINTER(c.c_size_t)],
    "aclmdlLoadFromMemWithMem": [_P, c.c_size_t, c.POINTER(c.c_uint32), _P, c.c_size_t, _P, c.c_size_t],
    "aclmdlUnload": [c.c_uint32],
    "aclmdlDestroyDesc": [_P],
    "aclmdlGetDesc": [_P, c.c_uint32],
    "aclmdlGetDescFromMem": [_P, _P, c.c_size_t],
    "aclmdlGetInputDims": [_P, c.c_size_t, c.POINTER(IODims)],
    "aclmdlGetOutputDims": [_P, c.c_size_t, c.POINTER(IODims)],
    "aclmdlGetDynamicBatch": [_P, c.POINTER(Batch)],
    "aclmdlGetDynamicHW": [_P, c.c_size_t, c.POINTER(HW)],
    "aclmdlAddDatasetBuffer": [_P, _P],
    "aclmdlDestroyDataset": [_P],
    "aclDestroyDataBuffer": [_P],
    "aclmdlExecute": [c.c_uint32, _P, _P],
    "aclmdlSetDynamicBatchSize": [c.c_uint32, _P, c.c_size_t, c.c_uint64],
    "aclmdlSetDynamicHWSize": [c.c_uint32, _P, c.c_size_t, c.c_uint64, c.c_uint64],
}
"""Functions that return aclError."""
_VALUE_FNS: dict[str, tuple[Any, list[Any]]] = {
    "aclmdlCreateDesc": (_P, []),
    "aclmdlCreateDataset": (_P, []),
    "aclCreateDataBuffer": (_P, [_P, c.c_size_t]),
    "aclmdlGetNumInputs": (c.c_size_t, [_P]),
    "aclmdlGetNumOutputs": (c.c_size_t, [_P]),
    "aclmdlGetInputSizeByIndex": (c.c_size_t, [_P, c.c_size_t]),
    "aclmdlGetOutputSizeByIndex": (c.c_size_t, [_P, c.c_size_t]),
    "aclmdlGetInputDataType": (c.c_int, [_P, c.c_size_t]),
    "aclmdlGetOutputDataType": (c.c_int, [_P, c.c_size_t]),
    "aclmdlGetInputFormat": (c.c_int, [_P, c.c_size_t]),
    "aclmdlGetOutputFormat": (c.c_int, [_P, c.c_size_t]),
}
"""Functions that return a pointer or a value."""

Dataset = tuple[int, list[int]]
"""A CANN dataset and the data buffers in it."""


class ModelRuntime:
    """CANN's model calls on an opened runtime library; ``call`` checks their aclError."""

    def __init__(self, lib: Any, path: str, call: Callable[..., None]) -> None:
        self._call = call
        self.fns: dict[str, Any] = {}
        for name, argtypes in _ERROR_FNS.items():
            self._bind(lib, path, name, c.c_int, argtypes)
        for name, (restype, argtypes) in _VALUE_FNS.items():
            self._bind(lib, path, name, restype, argtypes)

    def _bind(self, lib: Any, path: str, name: str, restype: Any, argtypes: list[Any]) -> None:
        fn = getattr(lib, name, None)
        if fn is None:
            raise AclFailure(codes.ACL_ERROR_API_NOT_SUPPORT, f"models are not served: {path} has no {name}")
        fn.restype = restype
        fn.argtypes = argtypes
        self.fns[name] = fn

    def call(self, name: str, *args: object) -> None:
        """Call an aclError function (AclFailure with CANN's code and message when it fails)."""
        self._call(name, *args, fn=self.fns[name])

    def _pointer(self, name: str, *args: object) -> int:
        ptr = int(self.fns[name](*args) or 0)
        if not ptr:
            raise AclFailure(codes.ACL_ERROR_BAD_ALLOC, f"{name} returned NULL")
        return ptr

    def create_desc(self) -> int:
        return self._pointer("aclmdlCreateDesc")

    def destroy_desc(self, desc: int) -> None:
        self.fns["aclmdlDestroyDesc"](desc)

    def describe(self, desc: int, *, work: int, weight: int) -> modelfile.ModelFile:
        """CANN's description ``desc`` as a ModelFile (sizes as CANN states them)."""
        f = self.fns

        def tensor(index: int, output: bool) -> modelfile.Tensor:
            dims = IODims()
            self.call("aclmdlGetOutputDims" if output else "aclmdlGetInputDims", desc, index, c.byref(dims))
            side = "Output" if output else "Input"
            return modelfile.Tensor(
                name=dims.name.decode(errors="replace") or f"{side.lower()}{index}",
                data_type=int(f[f"aclmdlGet{side}DataType"](desc, index)),
                format=int(f[f"aclmdlGet{side}Format"](desc, index)),
                dims=tuple(int(d) for d in dims.dims[: min(int(dims.dimCount), modelfile.MAX_DESC_DIMS)]),
            )

        n_in, n_out = int(f["aclmdlGetNumInputs"](desc)), int(f["aclmdlGetNumOutputs"](desc))
        inputs = tuple(tensor(i, False) for i in range(n_in))
        outputs = tuple(modelfile.Output(tensor(i, True)) for i in range(n_out))
        batch, hw = Batch(), HW()
        self.call("aclmdlGetDynamicBatch", desc, c.byref(batch))
        self.call("aclmdlGetDynamicHW", desc, c.c_size_t(-1 & (2**64 - 1)), c.byref(hw))
        sizes = tuple(int(f["aclmdlGetInputSizeByIndex"](desc, i)) for i in range(n_in)) + tuple(
            int(f["aclmdlGetOutputSizeByIndex"](desc, i)) for i in range(n_out)
        )
        return modelfile.ModelFile(
            inputs=inputs,
            outputs=outputs,
            weight_bytes=weight,
            work_bytes=work,
            batch_gears=tuple(int(b) for b in batch.batch[: int(batch.batchCount)]),
            hw_gears=tuple((int(g[0]), int(g[1])) for g in hw.hw[: int(hw.hwCount)]),
            sizes=sizes,
        )

    def dataset(self, buffers: list[Buffer]) -> Dataset:
        """A CANN dataset of data buffers over these device buffers (``destroy_dataset`` frees it)."""
        ds = self._pointer("aclmdlCreateDataset")
        made: list[int] = []
        try:
            for buf in buffers:
                made.append(self._pointer("aclCreateDataBuffer", buf.ptr, buf.size))
                self.call("aclmdlAddDatasetBuffer", ds, made[-1])
        except BaseException:
            self.destroy_dataset((ds, made))
            raise
        return ds, made

    def destroy_dataset(self, dataset: Dataset) -> None:
        ds, buffers = dataset
        for b in buffers:
            self.fns["aclDestroyDataBuffer"](b)
        self.fns["aclmdlDestroyDataset"](ds)


class AscendModels:
    """The backend's model hooks over the host's CANN: ``models`` gives the aclmdl binding (made at the first
    model call), ``select`` makes a virtual device's die current in the calling thread."""

    def __init__(self, models: Callable[[], ModelRuntime], *, select: Callable[[int], None]) -> None:
        self._models, self._select = models, select

    def describe(self, data: memoryview) -> modelfile.ModelFile:
        mdl = self._models()
        buf = host_buffer(data)
        work, weight = c.c_size_t(), c.c_size_t()
        mdl.call("aclmdlQuerySizeFromMem", buf, data.nbytes, c.byref(work), c.byref(weight))
        desc = mdl.create_desc()
        try:
            mdl.call("aclmdlGetDescFromMem", desc, buf, data.nbytes)
            return mdl.describe(desc, work=work.value, weight=weight.value)
        finally:
            mdl.destroy_desc(desc)

    def load(
        self,
        device: int,
        data: memoryview,
        desc: modelfile.ModelFile,
        *,
        weight: Buffer | None,
        work: Buffer | None,
    ) -> LoadedModel:
        self._select(device)
        model_id = c.c_uint32()
        self._models().call(
            "aclmdlLoadFromMemWithMem", host_buffer(data), data.nbytes, c.byref(model_id),
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
        mdl = self._models()
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

    def unload(self, model: LoadedModel) -> None:
        if model.handle is not None:
            self._select(model.device)
            self._models().call("aclmdlUnload", model.handle)
            model.handle = None

"""aclnn functions on the ascend backend: an ``OpCall`` named ``aclnnXxx`` forwarded to the host's ``libopapi.so``.

NOT YET VERIFIED ON HARDWARE (tested against ``tests/c/cann_emulator.c``). ``OperatorRuntime`` (``ascend_ops.py``)
hands such a call to ``AclnnOperators.launch`` on the die's stream. ``libopapi.so`` beside ``libascendcl.so`` is
opened at the first aclnn call (a host without it still serves single operators); its
``aclnnXxxGetWorkspaceSize`` is called with the function's C parameters in CANN's order (``operators/aclnn.py``'s
``SPECS``): ``aclCreateTensor`` (view dims, strides, offset, format, the storage as one dim, the device address),
``aclCreateTensorList``, ``aclCreateScalar``, ``aclCreateIntArray``, and the plain values; the workspace it asks
for is allocated from the share's quota (owned by the session, freed once the operator ended), then
``aclnnXxx(workspace, size, executor, stream)``.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from flexnpu_runtime.aclserver.ascend_ctypes import I64P, PP, Check, P, array, bind, element_size
from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_wire import codes, opcall
from flexnpu_wire.opcall import Placement

__all__ = ["ACLNN_C_TYPES", "AclnnOperators", "Workspace"]

ACL_ERROR_OP_NOT_FOUND = 100024
_ACL_FLOAT, _ACL_INT64, _ACL_BOOL = 0, 9, 12

ACLNN_C_TYPES: dict[tuple[str, str], Any] = {
    ("*", "cubeMathType"): ctypes.c_int8,
    ("aclnnInplaceNormal", "mean"): ctypes.c_float,
    ("aclnnInplaceNormal", "std"): ctypes.c_float,
}
"""aclnn parameters whose C type is narrower than their kind's default (``int``: int64_t, ``double``: double),
by (function or ``*``, parameter); ``tests/c/test_backend_ascend_ops.py`` checks it against aclnn_api.json."""

_NNOPBASE_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "aclCreateTensor": (
        P,
        [I64P, ctypes.c_uint64, ctypes.c_int, I64P, ctypes.c_int64, ctypes.c_int, I64P, ctypes.c_uint64, P],
    ),
    "aclDestroyTensor": (ctypes.c_int, [P]),
    "aclCreateScalar": (P, [P, ctypes.c_int]),
    "aclDestroyScalar": (ctypes.c_int, [P]),
    "aclCreateIntArray": (P, [I64P, ctypes.c_uint64]),
    "aclDestroyIntArray": (ctypes.c_int, [P]),
    "aclCreateTensorList": (P, [PP, ctypes.c_uint64]),
    "aclDestroyTensorList": (ctypes.c_int, [P]),
}

Workspace = Callable[[int], tuple[int, Callable[[], None]]]
"""Allocate ``n`` bytes of device memory charged to the share: (address, release)."""


class AclnnOperators:
    """The host's ``libopapi.so`` beside the runtime ``path``, opened at the first aclnn call."""

    def __init__(self, path: str, check: Check) -> None:
        self._path = os.path.join(os.path.dirname(path), "libopapi.so")
        self._check = check
        self._opapi: ctypes.CDLL | None = None
        self._nn: dict[str, Any] = {}
        self._fns: dict[str, tuple[Any, Any]] = {}
        self._guard = threading.Lock()

    def launch(self, call: opcall.OpCall, stream: int, workspace: Workspace, held: ExitStack) -> None:
        """Launch ``call`` on ``stream``; what CANN must keep until the synchronize is released by ``held``."""
        from flexnpu_runtime.aclserver.operators.aclnn import SPECS  # the parameter table (loads numpy)

        spec = SPECS.get(call.name)
        if spec is None:
            raise AclFailure(ACL_ERROR_OP_NOT_FOUND, f"{call.name}: FlexNPU has no parameter table for it")
        size_fn, run_fn = self._functions(call.name)
        args, types = self._args(call, spec[0], held)
        ws_size, executor = ctypes.c_uint64(), ctypes.c_void_p()
        # each value as its C type (no argtypes: the function object is shared by every die's worker)
        typed = [None if v is None else t(v) for v, t in zip(args, types, strict=True)]
        ret = size_fn(*typed, ctypes.byref(ws_size), ctypes.byref(executor))
        self._check(call.name, call.name + "GetWorkspaceSize", ret)
        ws = 0
        if ws_size.value:
            try:
                ws, release = workspace(ws_size.value)
            except AclFailure as exc:
                raise AclFailure(
                    exc.code, f"{call.name}: its {ws_size.value}-byte workspace: {exc.message}"
                ) from None
            held.callback(release)
        self._check(call.name, call.name, run_fn(ws or None, ws_size.value, executor, stream))

    def _library(self) -> ctypes.CDLL:
        with self._guard:
            if self._opapi is None:
                try:
                    lib = ctypes.CDLL(self._path)
                    self._nn = {name: bind(lib, name, sig) for name, sig in _NNOPBASE_SIGS.items()}
                except (OSError, AttributeError) as exc:
                    raise AclFailure(
                        codes.ACL_ERROR_API_NOT_SUPPORT,
                        f"the host's aclnn library {self._path} cannot serve: {exc}",
                    ) from None
                self._opapi = lib
            return self._opapi

    def _functions(self, name: str) -> tuple[Any, Any]:
        fns = self._fns.get(name)
        if fns is None:
            lib = self._library()
            if not hasattr(lib, name + "GetWorkspaceSize") or not hasattr(lib, name):
                raise AclFailure(
                    ACL_ERROR_OP_NOT_FOUND, f"{name}: the host's libopapi.so has no such function"
                )
            size_fn, run_fn = getattr(lib, name + "GetWorkspaceSize"), getattr(lib, name)
            size_fn.restype = run_fn.restype = ctypes.c_int
            run_fn.argtypes = [P, ctypes.c_uint64, P, P]
            fns = self._fns[name] = (size_fn, run_fn)
        return fns

    def _args(
        self, call: opcall.OpCall, params: Sequence[tuple[str, str]], held: ExitStack
    ) -> tuple[list[Any], list[Any]]:
        nn = self._nn
        inputs, outputs = list(call.inputs), list(call.outputs)
        n_list = len(inputs) - sum(1 for _, k in params if k in ("tensor", "tensor?"))
        args: list[Any] = []
        types: list[Any] = []

        def made(ptr: int | None, destroy: str, what: str) -> int:
            if not ptr:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: {what} could not be made")
            held.callback(nn[destroy], ptr)
            return ptr

        def tensor(t: opcall.Tensor, what: str) -> int | None:
            if t.placement == Placement.ABSENT:
                return None
            if t.placement == Placement.HOST:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: {what} is host memory")
            size = element_size(call.name, what, t.dtype)
            storage = t.storage_bytes // size if t.storage_bytes else _extent(t)
            ptr = nn["aclCreateTensor"](
                array(ctypes.c_int64, t.dims), len(t.dims), t.dtype, array(ctypes.c_int64, t.strides), t.offset,
                t.format, array(ctypes.c_int64, [storage]), 1, t.address or None,
            )  # fmt: skip
            return made(ptr, "aclDestroyTensor", what)

        keep: list[Any] = []
        for pname, kind in params:
            ctype: Any = P
            value: Any
            if kind in ("tensor", "tensor?"):
                value = tensor(inputs.pop(0), pname)
            elif kind == "tensors":
                items = [tensor(inputs.pop(0), f"{pname}[{i}]") for i in range(n_list)]
                value = made(
                    nn["aclCreateTensorList"](array(P, items), len(items)), "aclDestroyTensorList", pname
                )
            elif kind in ("out", "out?", "inout"):
                value = tensor(outputs.pop(0), pname)
            elif kind == "intarray?" and pname not in call.attrs:
                value = None
            else:
                attr = call.attrs.get(pname)
                if attr is None:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: parameter {pname} is missing"
                    )
                ctype, value = self._plain(call.name, pname, kind, attr, keep=keep, made=made)
            args.append(value)
            types.append(ctype)
        held.callback(keep.clear)
        return args, types

    def _plain(
        self, fn: str, pname: str, kind: str, attr: opcall.AttrValue, *, keep: list[Any], made: Any
    ) -> Any:
        nn = self._nn
        if kind in ("intarray", "intarray?"):
            values = attr if isinstance(attr, list) else [attr]
            if not all(isinstance(v, int) for v in values):
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{fn}: {pname} must be a list of ints")
            arr = nn["aclCreateIntArray"](array(ctypes.c_int64, values), len(values))
            return P, made(arr, "aclDestroyIntArray", pname)
        if kind == "string":
            return ctypes.c_char_p, str(attr).encode()
        if not isinstance(attr, bool | int | float):
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{fn}: {pname} must be a number, got {attr!r}")
        if kind == "scalar":
            box: Any
            if isinstance(attr, bool):
                box, dtype = ctypes.c_uint8(int(attr)), _ACL_BOOL
            elif isinstance(attr, int):
                box, dtype = ctypes.c_int64(attr), _ACL_INT64
            else:
                box, dtype = ctypes.c_float(attr), _ACL_FLOAT
            keep.append(box)
            return P, made(nn["aclCreateScalar"](ctypes.byref(box), dtype), "aclDestroyScalar", pname)
        narrow = ACLNN_C_TYPES.get((fn, pname)) or ACLNN_C_TYPES.get(("*", pname))
        if kind == "double":
            return narrow or ctypes.c_double, float(attr)
        if kind == "bool":
            return ctypes.c_bool, bool(attr)
        if kind == "dtype":
            return ctypes.c_int, int(attr)
        return narrow or ctypes.c_int64, int(attr)


def _extent(t: opcall.Tensor) -> int:
    """Elements from the storage's start through the view's last one (its storage when none was sent)."""
    last = t.offset
    for d, s in zip(t.dims, t.strides, strict=True):
        last += (d - 1) * s if d else 0
    return last + 1 if all(t.dims) else 0

"""Operators on the ascend backend: an ``OPERATOR`` message forwarded to the host's CANN.

NOT YET VERIFIED ON HARDWARE (tested against ``tests/c/cann_emulator.c``). The session layer decodes and
checks the message (``opexec.py``: every device tensor lies in the session's allocations, pinned) and, in
stream order on the device's worker, hands the ``OpCall`` to ``OperatorRuntime.execute``:

* **single operators** (any name not starting with ``aclnn``): one ``aclTensorDesc`` per operand
  (``aclCreateTensorDesc`` with the dtype, dims and format; a host operand — a 0-d scalar, a shape —
  ``aclSetTensorPlaceMent(ACL_MEMTYPE_HOST)`` over a host copy of its bytes; an optional input left out
  ``ACL_DT_UNDEFINED``/``ACL_FORMAT_UNDEFINED`` with no dims), one ``aclDataBuffer`` per operand (the view's first
  byte, its bytes; NULL, 0 for a left-out input), the attributes rebuilt with the same ``aclopSetAttr*`` setter the program
  called; then ``aclopCompileAndExecute`` (looked up in ``libacl_op_compiler.so`` beside ``libascendcl.so``,
  else in ``libascendcl.so``; ``aclopExecuteV2`` when neither has it) with ACL_ENGINE_SYS, ACL_COMPILE_SYS. CANN's
  single-operator descriptors have no strides: a strided view is refused (ACL_ERROR_INVALID_PARAM naming it).
* **aclnn** (``aclnnXxx``): ``libopapi.so`` beside ``libascendcl.so`` is opened once; its
  ``aclnnXxxGetWorkspaceSize`` is called with the function's C parameters in CANN's order
  (``operators/aclnn.py``'s ``SPECS``): ``aclCreateTensor`` (view dims, strides, offset, format, the storage as one
  dim, the device address), ``aclCreateTensorList``, ``aclCreateScalar``, ``aclCreateIntArray``, and the plain
  values; the workspace it asks for is allocated from the share's quota (owned by the session, freed once the
  operator ended), then ``aclnnXxx(workspace, size, executor, stream)``.

Both run on one CANN stream per device (``aclrtCreateStream``, made at the first operator), launched and
synchronized under the device's lock, so an operator's results are complete when its task completes and
the next one starts. The die time charged (returned to the worker) is what the launch and synchronize took.
A code CANN answers is passed to the program unchanged as the stream's error, with the operator named and
``aclGetRecentErrMsg``'s text.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from typing import Any

from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_wire import codes, opcall
from flexnpu_wire.modelfile import DTYPE_SIZES
from flexnpu_wire.opcall import AttrKind, Placement

__all__ = ["ACLNN_C_TYPES", "OperatorRuntime"]

ACL_ERROR_OP_NOT_FOUND = 100024
_ACL_MEMTYPE_HOST = 1
_ACL_DT_UNDEFINED = -1
_ACL_FORMAT_UNDEFINED = -1
_ACL_ENGINE_SYS = 0
_ACL_COMPILE_SYS = 0
_ACL_FLOAT, _ACL_INT64, _ACL_BOOL, _ACL_BF16 = 0, 9, 12, 27
_SIZES = {**DTYPE_SIZES, _ACL_BF16: 2}

ACLNN_C_TYPES: dict[tuple[str, str], Any] = {
    ("*", "cubeMathType"): ctypes.c_int8,
    ("aclnnInplaceNormal", "mean"): ctypes.c_float,
    ("aclnnInplaceNormal", "std"): ctypes.c_float,
}
"""aclnn parameters whose C type is narrower than their kind's default (``int``: int64_t, ``double``: double),
by (function or ``*``, parameter); ``tests/unit/test_ascend_ops.py`` checks it against aclnn_api.json."""

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_I64P = ctypes.POINTER(ctypes.c_int64)
_ACLOP_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "aclCreateTensorDesc": (_P, [ctypes.c_int, ctypes.c_int, _I64P, ctypes.c_int]),
    "aclDestroyTensorDesc": (None, [_P]),
    "aclSetTensorPlaceMent": (ctypes.c_int, [_P, ctypes.c_int]),
    "aclCreateDataBuffer": (_P, [_P, ctypes.c_size_t]),
    "aclDestroyDataBuffer": (ctypes.c_int, [_P]),
    "aclopCreateAttr": (_P, []),
    "aclopDestroyAttr": (None, [_P]),
    "aclopSetAttrBool": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_uint8]),
    "aclopSetAttrInt": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int64]),
    "aclopSetAttrFloat": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_float]),
    "aclopSetAttrString": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p]),
    "aclopSetAttrDataType": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int]),
    "aclopSetAttrListBool": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint8)],
    ),
    "aclopSetAttrListInt": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_int, _I64P]),
    "aclopSetAttrListFloat": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)],
    ),
    "aclopSetAttrListDataType": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
    ),
    "aclopSetAttrListString": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    ),
    "aclopSetAttrListListInt": (
        ctypes.c_int,
        [_P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(_I64P)],
    ),
    "aclrtCreateStream": (ctypes.c_int, [_PP]),
    "aclrtSynchronizeStream": (ctypes.c_int, [_P]),
    "aclrtDestroyStream": (ctypes.c_int, [_P]),
}
_OP_ARGS = [ctypes.c_char_p, ctypes.c_int, _PP, _PP, ctypes.c_int, _PP, _PP, _P]
_COMPILE_AND_EXECUTE = (ctypes.c_int, [*_OP_ARGS, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, _P])
_EXECUTE_V2 = (ctypes.c_int, [*_OP_ARGS, _P])
_NNOPBASE_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "aclCreateTensor": (
        _P,
        [
            _I64P,
            ctypes.c_uint64,
            ctypes.c_int,
            _I64P,
            ctypes.c_int64,
            ctypes.c_int,
            _I64P,
            ctypes.c_uint64,
            _P,
        ],
    ),
    "aclDestroyTensor": (ctypes.c_int, [_P]),
    "aclCreateScalar": (_P, [_P, ctypes.c_int]),
    "aclDestroyScalar": (ctypes.c_int, [_P]),
    "aclCreateIntArray": (_P, [_I64P, ctypes.c_uint64]),
    "aclDestroyIntArray": (ctypes.c_int, [_P]),
    "aclCreateTensorList": (_P, [_PP, ctypes.c_uint64]),
    "aclDestroyTensorList": (ctypes.c_int, [_P]),
}


def _bind(lib: ctypes.CDLL, name: str, sig: tuple[Any, list[Any]]) -> Any:
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = sig
    return fn


def _array(ctype: Any, values: Sequence[Any]) -> Any:
    return (ctype * max(1, len(values)))(*values)


Workspace = Callable[[int], tuple[int, Callable[[], None]]]
"""Allocate ``n`` bytes of device memory charged to the share: (address, release)."""


class OperatorRuntime:
    """The CANN operator entry points of one host runtime (bound at the first operator)."""

    def __init__(self, lib: ctypes.CDLL, path: str, errmsg: Callable[[], str]) -> None:
        self._lib, self._path, self._errmsg = lib, path, errmsg
        try:
            self._fn = {name: _bind(lib, name, sig) for name, sig in _ACLOP_SIGS.items()}
        except AttributeError as exc:
            raise AclFailure(
                codes.ACL_ERROR_API_NOT_SUPPORT, f"{path} lacks an operator call: {exc}"
            ) from None
        self._execute, self._execute_name = self._single_op_entry()
        self._opapi: ctypes.CDLL | None = None
        self._nn: dict[str, Any] = {}
        self._aclnn: dict[str, tuple[Any, Any]] = {}
        self._streams: dict[int, int] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()

    def _single_op_entry(self) -> tuple[Any, str]:
        compiler = os.path.join(os.path.dirname(self._path), "libacl_op_compiler.so")
        libs = [self._lib]
        if os.path.exists(compiler):
            try:
                libs.insert(0, ctypes.CDLL(compiler))
            except OSError as exc:
                raise AclFailure(codes.ACL_ERROR_API_NOT_SUPPORT, f"cannot load {compiler}: {exc}") from None
        for lib in libs:
            if hasattr(lib, "aclopCompileAndExecute"):
                return _bind(lib, "aclopCompileAndExecute", _COMPILE_AND_EXECUTE), "aclopCompileAndExecute"
        if hasattr(self._lib, "aclopExecuteV2"):
            return _bind(self._lib, "aclopExecuteV2", _EXECUTE_V2), "aclopExecuteV2"
        raise AclFailure(
            codes.ACL_ERROR_API_NOT_SUPPORT, f"neither {compiler} nor {self._path} has aclopCompileAndExecute"
        )

    # -- the entry point ---------------------------------------------------------------------------

    def execute(self, call: opcall.OpCall, *, phy: int, workspace: Workspace) -> int:
        """Run ``call`` on die ``phy``'s stream (the caller selected the die); its die microseconds."""

        def launch(stream: int, held: ExitStack) -> None:
            if call.name.startswith("aclnn"):
                self._aclnn_call(call, stream, workspace, held)
            else:
                self._aclop_call(call, stream, held)

        return self.run(phy, call.name, launch)

    def run(self, phy: int, what: str, launch: Callable[[int, ExitStack], None]) -> int:
        """``launch(stream, held)`` on die ``phy``'s stream, then its synchronize (what ``held`` keeps —
        CANN's objects, a workspace — is released after it); the die microseconds both took."""
        with self._lock(phy), ExitStack() as held:
            stream = self._stream(phy)
            start = time.monotonic()
            launch(stream, held)
            self._check(what, "aclrtSynchronizeStream", self._fn["aclrtSynchronizeStream"](stream))
            return max(1, round((time.monotonic() - start) * 1e6))

    def close(self, set_device: Callable[[int], None]) -> None:
        """Destroy the streams, each with its die current."""
        for phy, stream in self._streams.items():
            set_device(phy)
            self._fn["aclrtDestroyStream"](stream)
        self._streams.clear()

    def _lock(self, phy: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(phy, threading.Lock())

    def _stream(self, phy: int) -> int:
        stream = self._streams.get(phy)
        if stream is None:
            out = ctypes.c_void_p()
            self._check("operators", "aclrtCreateStream", self._fn["aclrtCreateStream"](ctypes.byref(out)))
            stream = self._streams[phy] = int(out.value or 0)
        return stream

    def _check(self, op: str, what: str, ret: int) -> None:
        if ret:
            text = self._errmsg()
            raise AclFailure(
                int(ret),
                f"{op}: the host's CANN refused it: {what} returned {ret}" + (f": {text}" if text else ""),
            )

    # -- single operators --------------------------------------------------------------------------

    def _aclop_call(self, call: opcall.OpCall, stream: int, held: ExitStack) -> None:
        fn = self._fn
        descs: list[list[int]] = [[], []]
        bufs: list[list[int]] = [[], []]
        keep: list[Any] = []
        for side, tensors in enumerate((call.inputs, call.outputs)):
            for i, t in enumerate(tensors):
                where = f"{('inputs', 'outputs')[side]}[{i}]"
                if t.placement == Placement.ABSENT:  # an optional input left out: CANN's placeholder pair
                    desc = fn["aclCreateTensorDesc"](_ACL_DT_UNDEFINED, 0, None, _ACL_FORMAT_UNDEFINED)
                else:
                    desc = fn["aclCreateTensorDesc"](
                        t.dtype, len(t.dims), _array(ctypes.c_int64, t.dims), t.format
                    )
                if not desc:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: aclCreateTensorDesc of {where}"
                    )
                held.callback(fn["aclDestroyTensorDesc"], desc)
                address, size = (
                    (None, 0) if t.placement == Placement.ABSENT else self._operand(call.name, where, t, keep)
                )
                if t.placement == Placement.HOST:
                    self._check(call.name, "aclSetTensorPlaceMent",
                                fn["aclSetTensorPlaceMent"](desc, _ACL_MEMTYPE_HOST))  # fmt: skip
                buf = fn["aclCreateDataBuffer"](address, size)
                if not buf:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: aclCreateDataBuffer of {where}"
                    )
                held.callback(fn["aclDestroyDataBuffer"], buf)
                descs[side].append(desc)
                bufs[side].append(buf)
        held.callback(keep.clear)  # the host operands' copies live until the synchronize
        attr = fn["aclopCreateAttr"]()
        held.callback(fn["aclopDestroyAttr"], attr)
        for key, value in call.attrs.items():
            self._set_attr(call.name, attr, key, call.kinds.get(key, _kind_of(value)), value)
        args = [
            call.name.encode(), len(call.inputs), _array(_P, descs[0]), _array(_P, bufs[0]),
            len(call.outputs), _array(_P, descs[1]), _array(_P, bufs[1]), attr,
        ]  # fmt: skip
        if self._execute_name == "aclopCompileAndExecute":
            args += [_ACL_ENGINE_SYS, _ACL_COMPILE_SYS, None]
        self._check(call.name, self._execute_name, self._execute(*args, stream))

    @staticmethod
    def _operand(op: str, where: str, t: opcall.Tensor, keep: list[Any]) -> tuple[int | None, int]:
        size = _SIZES.get(t.dtype)
        if size is None:
            raise AclFailure(100026, f"{op}: {where}: aclDataType {t.dtype} is not supported")
        count = 1
        for d in t.dims:
            count *= d
        if t.placement == Placement.HOST:
            host = ctypes.create_string_buffer(t.data, len(t.data))
            keep.append(host)
            return ctypes.addressof(host), len(t.data)
        if t.strides != opcall._contiguous(t.dims) and count > 1:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{op}: {where} is a strided view (strides {list(t.strides)} of dims {list(t.dims)}); CANN's"
                " single-operator path takes contiguous tensors",
            )
        return t.address + t.offset * size, count * size

    def _set_attr(self, op: str, attr: int, key: str, kind: AttrKind, value: opcall.AttrValue) -> None:
        fn, name = self._fn, key.encode()
        values = value if isinstance(value, list) else []
        n = len(values)
        setter: tuple[str, tuple[Any, ...]]
        if kind == AttrKind.BOOL:
            setter = ("aclopSetAttrBool", (int(bool(value)),))
        elif kind == AttrKind.INT:
            setter = ("aclopSetAttrInt", (value,))
        elif kind == AttrKind.DTYPE:
            setter = ("aclopSetAttrDataType", (value,))
        elif kind == AttrKind.FLOAT:
            setter = ("aclopSetAttrFloat", (value,))
        elif kind == AttrKind.STRING:
            setter = ("aclopSetAttrString", (str(value).encode(),))
        elif kind == AttrKind.LIST_BOOL:
            setter = ("aclopSetAttrListBool", (n, _array(ctypes.c_uint8, [int(bool(v)) for v in values])))
        elif kind == AttrKind.LIST_INT:
            setter = ("aclopSetAttrListInt", (n, _array(ctypes.c_int64, values)))
        elif kind == AttrKind.LIST_DTYPE:
            setter = ("aclopSetAttrListDataType", (n, _array(ctypes.c_int, values)))
        elif kind == AttrKind.LIST_FLOAT:
            setter = ("aclopSetAttrListFloat", (n, _array(ctypes.c_float, values)))
        elif kind == AttrKind.LIST_STRING:
            setter = (
                "aclopSetAttrListString",
                (n, _array(ctypes.c_char_p, [str(v).encode() for v in values])),
            )
        else:
            rows = [_array(ctypes.c_int64, v if isinstance(v, list) else []) for v in values]
            counts = _array(ctypes.c_int, [len(v) if isinstance(v, list) else 0 for v in values])
            setter = (
                "aclopSetAttrListListInt",
                (n, counts, _array(_I64P, [ctypes.cast(r, _I64P) for r in rows])),
            )
        self._check(op, f"{setter[0]}({key})", fn[setter[0]](attr, name, *setter[1]))

    # -- aclnn --------------------------------------------------------------------------------------

    def _nnopbase(self) -> dict[str, Any]:
        if not self._nn:
            path = os.path.join(os.path.dirname(self._path), "libopapi.so")
            try:
                self._opapi = ctypes.CDLL(path)
                self._nn = {name: _bind(self._opapi, name, sig) for name, sig in _NNOPBASE_SIGS.items()}
            except (OSError, AttributeError) as exc:
                raise AclFailure(
                    codes.ACL_ERROR_API_NOT_SUPPORT, f"the host's aclnn library {path} cannot serve: {exc}"
                ) from None
        return self._nn

    def _aclnn_fns(self, name: str) -> tuple[Any, Any]:
        fns = self._aclnn.get(name)
        if fns is None:
            self._nnopbase()
            lib = self._opapi
            if lib is None or not hasattr(lib, name + "GetWorkspaceSize") or not hasattr(lib, name):
                raise AclFailure(
                    ACL_ERROR_OP_NOT_FOUND, f"{name}: the host's libopapi.so has no such function"
                )
            size_fn, run_fn = getattr(lib, name + "GetWorkspaceSize"), getattr(lib, name)
            size_fn.restype = run_fn.restype = ctypes.c_int
            run_fn.argtypes = [_P, ctypes.c_uint64, _P, _P]
            fns = self._aclnn[name] = (size_fn, run_fn)
        return fns

    def _aclnn_call(self, call: opcall.OpCall, stream: int, workspace: Workspace, held: ExitStack) -> None:
        from flexnpu_runtime.aclserver.operators.aclnn import SPECS  # the parameter table (loads numpy)

        spec = SPECS.get(call.name)
        if spec is None:
            raise AclFailure(ACL_ERROR_OP_NOT_FOUND, f"{call.name}: FlexNPU has no parameter table for it")
        size_fn, run_fn = self._aclnn_fns(call.name)
        args, types = self._aclnn_args(call, spec[0], held)
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

    def _aclnn_args(
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
            size = _SIZES.get(t.dtype)
            if size is None:
                raise AclFailure(100026, f"{call.name}: {what}: aclDataType {t.dtype} is not supported")
            storage = t.storage_bytes // size if t.storage_bytes else _extent(t)
            ptr = nn["aclCreateTensor"](
                _array(ctypes.c_int64, t.dims), len(t.dims), t.dtype, _array(ctypes.c_int64, t.strides), t.offset,
                t.format, _array(ctypes.c_int64, [storage]), 1, t.address or None,
            )  # fmt: skip
            return made(ptr, "aclDestroyTensor", what)

        keep: list[Any] = []
        for pname, kind in params:
            ctype: Any = _P
            value: Any
            if kind in ("tensor", "tensor?"):
                value = tensor(inputs.pop(0), pname)
            elif kind == "tensors":
                items = [tensor(inputs.pop(0), f"{pname}[{i}]") for i in range(n_list)]
                value = made(
                    nn["aclCreateTensorList"](_array(_P, items), len(items)), "aclDestroyTensorList", pname
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
            arr = nn["aclCreateIntArray"](_array(ctypes.c_int64, values), len(values))
            return _P, made(arr, "aclDestroyIntArray", pname)
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
            return _P, made(nn["aclCreateScalar"](ctypes.byref(box), dtype), "aclDestroyScalar", pname)
        narrow = ACLNN_C_TYPES.get((fn, pname)) or ACLNN_C_TYPES.get(("*", pname))
        if kind == "double":
            return narrow or ctypes.c_double, float(attr)
        if kind == "bool":
            return ctypes.c_bool, bool(attr)
        if kind == "dtype":
            return ctypes.c_int, int(attr)
        return narrow or ctypes.c_int64, int(attr)


def _kind_of(value: opcall.AttrValue) -> AttrKind:
    """The setter for a value without a recorded kind (an OpCall made in Python)."""
    if isinstance(value, bool):
        return AttrKind.BOOL
    if isinstance(value, int):
        return AttrKind.INT
    if isinstance(value, float):
        return AttrKind.FLOAT
    if isinstance(value, str):
        return AttrKind.STRING
    first = value[0] if value else 0
    return {bool: AttrKind.LIST_BOOL, float: AttrKind.LIST_FLOAT, str: AttrKind.LIST_STRING,
            list: AttrKind.LIST_LIST_INT}.get(type(first), AttrKind.LIST_INT)  # fmt: skip


def _extent(t: opcall.Tensor) -> int:
    """Elements from the storage's start through the view's last one (its storage when none was sent)."""
    last = t.offset
    for d, s in zip(t.dims, t.strides, strict=True):
        last += (d - 1) * s if d else 0
    return last + 1 if all(t.dims) else 0

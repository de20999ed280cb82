"""CANN's single-operator API on the ascend backend: an ``OpCall`` rebuilt as CANN's descriptors and launched.

NOT YET VERIFIED ON HARDWARE (tested against ``tests/c/cann_emulator.c``). ``OperatorRuntime`` (``ascend_ops.py``)
hands a call whose name does not start with ``aclnn`` to ``SingleOperators.launch`` on the die's stream: one
``aclTensorDesc`` per operand (``aclCreateTensorDesc`` with the dtype, dims and format; a host operand — a 0-d
scalar, a shape — ``aclSetTensorPlaceMent(ACL_MEMTYPE_HOST)`` over a host copy of its bytes; an optional input
left out ``ACL_DT_UNDEFINED``/``ACL_FORMAT_UNDEFINED`` with no dims), one ``aclDataBuffer`` per operand (the view's
first byte, its bytes; NULL, 0 for a left-out input), the attributes rebuilt with the same ``aclopSetAttr*`` setter
the program called; then ``aclopCompileAndExecute`` (looked up in ``libacl_op_compiler.so`` beside
``libascendcl.so``, else in ``libascendcl.so``; ``aclopExecuteV2`` when neither has it) with ACL_ENGINE_SYS,
ACL_COMPILE_SYS. CANN's single-operator descriptors have no strides: a strided view is refused
(ACL_ERROR_INVALID_PARAM naming it).
"""

from __future__ import annotations

import ctypes
import os
from contextlib import ExitStack
from typing import Any

from flexnpu_runtime.aclserver.ascend_ctypes import (
    I64P,
    PP,
    Check,
    P,
    array,
    bind,
    bind_operator_calls,
    element_size,
)
from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_wire import codes, opcall
from flexnpu_wire.opcall import AttrKind, Placement

__all__ = ["SingleOperators"]

_ACL_MEMTYPE_HOST = 1
_ACL_DT_UNDEFINED = -1
_ACL_FORMAT_UNDEFINED = -1
_ACL_ENGINE_SYS = 0
_ACL_COMPILE_SYS = 0

_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "aclCreateTensorDesc": (P, [ctypes.c_int, ctypes.c_int, I64P, ctypes.c_int]),
    "aclDestroyTensorDesc": (None, [P]),
    "aclSetTensorPlaceMent": (ctypes.c_int, [P, ctypes.c_int]),
    "aclCreateDataBuffer": (P, [P, ctypes.c_size_t]),
    "aclDestroyDataBuffer": (ctypes.c_int, [P]),
    "aclopCreateAttr": (P, []),
    "aclopDestroyAttr": (None, [P]),
    "aclopSetAttrBool": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_uint8]),
    "aclopSetAttrInt": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int64]),
    "aclopSetAttrFloat": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_float]),
    "aclopSetAttrString": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_char_p]),
    "aclopSetAttrDataType": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int]),
    "aclopSetAttrListBool": (
        ctypes.c_int,
        [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint8)],
    ),
    "aclopSetAttrListInt": (ctypes.c_int, [P, ctypes.c_char_p, ctypes.c_int, I64P]),
    "aclopSetAttrListFloat": (
        ctypes.c_int,
        [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_float)],
    ),
    "aclopSetAttrListDataType": (
        ctypes.c_int,
        [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int)],
    ),
    "aclopSetAttrListString": (
        ctypes.c_int,
        [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    ),
    "aclopSetAttrListListInt": (
        ctypes.c_int,
        [P, ctypes.c_char_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(I64P)],
    ),
}
_OP_ARGS = [ctypes.c_char_p, ctypes.c_int, PP, PP, ctypes.c_int, PP, PP, P]
_COMPILE_AND_EXECUTE = (ctypes.c_int, [*_OP_ARGS, ctypes.c_int, ctypes.c_int, ctypes.c_char_p, P])
_EXECUTE_V2 = (ctypes.c_int, [*_OP_ARGS, P])


class SingleOperators:
    """CANN's aclop entry points of one host runtime, bound at construction (AclFailure if it lacks one)."""

    def __init__(self, lib: ctypes.CDLL, path: str, check: Check) -> None:
        self._lib, self._path, self._check = lib, path, check
        self._fn = bind_operator_calls(lib, path, _SIGS)
        self._execute, self._execute_name = self._entry()

    def _entry(self) -> tuple[Any, str]:
        compiler = os.path.join(os.path.dirname(self._path), "libacl_op_compiler.so")
        libs = [self._lib]
        if os.path.exists(compiler):
            try:
                libs.insert(0, ctypes.CDLL(compiler))
            except OSError as exc:
                raise AclFailure(codes.ACL_ERROR_API_NOT_SUPPORT, f"cannot load {compiler}: {exc}") from None
        for lib in libs:
            if hasattr(lib, "aclopCompileAndExecute"):
                return bind(lib, "aclopCompileAndExecute", _COMPILE_AND_EXECUTE), "aclopCompileAndExecute"
        if hasattr(self._lib, "aclopExecuteV2"):
            return bind(self._lib, "aclopExecuteV2", _EXECUTE_V2), "aclopExecuteV2"
        raise AclFailure(
            codes.ACL_ERROR_API_NOT_SUPPORT, f"neither {compiler} nor {self._path} has aclopCompileAndExecute"
        )

    def launch(self, call: opcall.OpCall, stream: int, held: ExitStack) -> None:
        """Launch ``call`` on ``stream``; what CANN must keep until the synchronize is released by ``held``."""
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
                        t.dtype, len(t.dims), array(ctypes.c_int64, t.dims), t.format
                    )
                if not desc:
                    raise AclFailure(
                        codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: aclCreateTensorDesc of {where}"
                    )
                held.callback(fn["aclDestroyTensorDesc"], desc)
                address, size = (
                    (None, 0) if t.placement == Placement.ABSENT else _operand(call.name, where, t, keep)
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
            call.name.encode(), len(call.inputs), array(P, descs[0]), array(P, bufs[0]),
            len(call.outputs), array(P, descs[1]), array(P, bufs[1]), attr,
        ]  # fmt: skip
        if self._execute_name == "aclopCompileAndExecute":
            args += [_ACL_ENGINE_SYS, _ACL_COMPILE_SYS, None]
        self._check(call.name, self._execute_name, self._execute(*args, stream))

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
            setter = ("aclopSetAttrListBool", (n, array(ctypes.c_uint8, [int(bool(v)) for v in values])))
        elif kind == AttrKind.LIST_INT:
            setter = ("aclopSetAttrListInt", (n, array(ctypes.c_int64, values)))
        elif kind == AttrKind.LIST_DTYPE:
            setter = ("aclopSetAttrListDataType", (n, array(ctypes.c_int, values)))
        elif kind == AttrKind.LIST_FLOAT:
            setter = ("aclopSetAttrListFloat", (n, array(ctypes.c_float, values)))
        elif kind == AttrKind.LIST_STRING:
            setter = (
                "aclopSetAttrListString",
                (n, array(ctypes.c_char_p, [str(v).encode() for v in values])),
            )
        else:
            rows = [array(ctypes.c_int64, v if isinstance(v, list) else []) for v in values]
            counts = array(ctypes.c_int, [len(v) if isinstance(v, list) else 0 for v in values])
            setter = (
                "aclopSetAttrListListInt",
                (n, counts, array(I64P, [ctypes.cast(r, I64P) for r in rows])),
            )
        self._check(op, f"{setter[0]}({key})", fn[setter[0]](attr, name, *setter[1]))


def _operand(op: str, where: str, t: opcall.Tensor, keep: list[Any]) -> tuple[int | None, int]:
    """The data buffer's address and bytes of operand ``t`` (a host operand copied into ``keep``)."""
    size = element_size(op, where, t.dtype)
    count = 1
    for d in t.dims:
        count *= d
    if t.placement == Placement.HOST:
        if count * size > len(t.data):  # CANN would read the descriptor's bytes past the copy
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{op}: {where} holds {len(t.data)} bytes, its dims {list(t.dims)} need {count * size}",
            )
        host = ctypes.create_string_buffer(t.data, len(t.data))
        keep.append(host)
        return ctypes.addressof(host), len(t.data)
    if t.strides != opcall.contiguous(t.dims) and count > 1:
        raise AclFailure(
            codes.ACL_ERROR_INVALID_PARAM,
            f"{op}: {where} is a strided view (strides {list(t.strides)} of dims {list(t.dims)}); CANN's"
            " single-operator path takes contiguous tensors",
        )
    return t.address + t.offset * size, count * size


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

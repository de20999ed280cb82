"""The ctypes plumbing the ascend backend's bindings share (``ascend_ops.py``, ``ascend_aclop.py``,
``ascend_aclnn.py``, ``ascend_vmm.py``, ``ascend_models.py``, ``backend_ascend.py``): binding a CANN function
to its prototype, C arrays and host buffers, element sizes, and how an operator's refused call is reported.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

from flexnpu_runtime.aclserver.backend import AclFailure
from flexnpu_wire import codes
from flexnpu_wire.modelfile import DTYPE_SIZES

__all__ = [
    "I64P",
    "PP",
    "Check",
    "P",
    "array",
    "bind",
    "bind_operator_calls",
    "checker",
    "element_size",
    "host_buffer",
]

P = ctypes.c_void_p
PP = ctypes.POINTER(ctypes.c_void_p)
I64P = ctypes.POINTER(ctypes.c_int64)
_ACL_BF16 = 27
_ELEMENT_SIZES = {**DTYPE_SIZES, _ACL_BF16: 2}
_ACL_ERROR_UNSUPPORTED_DATA_TYPE = 100026

Check = Callable[[str, str, int], None]
"""``check(op, what, ret)``: AclFailure with CANN's code and recent message when ``what`` of ``op`` returned
non-zero."""


def bind(lib: ctypes.CDLL, name: str, sig: tuple[Any, list[Any]]) -> Any:
    """``lib``'s function ``name`` with ``sig`` (restype, argtypes); AttributeError if it lacks it."""
    fn = getattr(lib, name)
    fn.restype, fn.argtypes = sig
    return fn


def bind_operator_calls(
    lib: ctypes.CDLL, path: str, sigs: dict[str, tuple[Any, list[Any]]]
) -> dict[str, Any]:
    """Each function of ``sigs`` in ``lib`` by name (AclFailure 200001 if ``path`` lacks one)."""
    try:
        return {name: bind(lib, name, sig) for name, sig in sigs.items()}
    except AttributeError as exc:
        raise AclFailure(codes.ACL_ERROR_API_NOT_SUPPORT, f"{path} lacks an operator call: {exc}") from None


def array(ctype: Any, values: Sequence[Any]) -> Any:
    """A C array of ``values`` (one element at least, so an empty one still has an address)."""
    return (ctype * max(1, len(values)))(*values)


def element_size(op: str, where: str, dtype: int) -> int:
    """Bytes per element of an operand of aclDataType ``dtype`` (AclFailure 100026 naming it if unknown)."""
    size = _ELEMENT_SIZES.get(dtype)
    if size is None:
        raise AclFailure(
            _ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"{op}: {where}: aclDataType {dtype} is not supported"
        )
    return size


def checker(errmsg: Callable[[], str]) -> Check:
    """The ``Check`` of an operator's calls, with ``errmsg`` (aclGetRecentErrMsg's text) in its message."""

    def check(op: str, what: str, ret: int) -> None:
        if ret:
            text = errmsg()
            raise AclFailure(
                int(ret),
                f"{op}: the host's CANN refused it: {what} returned {ret}" + (f": {text}" if text else ""),
            )

    return check


def host_buffer(view: memoryview) -> Any:
    """A ctypes array over a contiguous host buffer (a read-only one is copied), passed as a pointer."""
    if not view.c_contiguous:
        raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "a host buffer must be C-contiguous")
    flat = view.cast("B") if view.format != "B" or view.ndim != 1 else view
    array_type = ctypes.c_char * flat.nbytes
    return array_type.from_buffer_copy(flat) if flat.readonly else array_type.from_buffer(flat)

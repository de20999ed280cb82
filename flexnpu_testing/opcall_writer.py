"""The tail of an ``OPERATOR`` request written in Python, as the C client writes it (``libascendcl/src/op.c``).

The format and its reader are ``client/flexnpu_wire/opcall.py``; the tests write tails with
:func:`encode` to check that reader and to drive the aclserver's operators without the C client.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from flexnpu_wire.opcall import AttrKind, AttrValue, Placement, Tensor, contiguous

__all__ = ["encode"]

_Q = struct.Struct(">q")
_D = struct.Struct(">d")


def _put_blob(out: list[bytes], data: bytes) -> None:
    out.append(_Q.pack(len(data)))
    out.append(data + b"\0" * (-len(data) % 8))


def encode(
    name: str,
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    attrs: Sequence[tuple[str, AttrKind, AttrValue]] = (),
) -> bytes:
    """The tail for an operator, as the C client writes it."""
    out: list[bytes] = []
    _put_blob(out, name.encode("ascii"))
    for t in (*inputs, *outputs):
        out.append(_Q.pack(int(t.placement)))
        if t.placement == Placement.ABSENT:
            continue
        strides = t.strides or contiguous(t.dims)
        words = [t.dtype, t.format, len(t.dims), *t.dims, *strides, t.offset]
        out.append(b"".join(_Q.pack(w) for w in words))
        if t.placement == Placement.DEVICE:
            out.append(_Q.pack(t.address) + _Q.pack(t.storage_bytes))
        else:
            _put_blob(out, t.data)
    for key, kind, value in attrs:
        _put_blob(out, key.encode("ascii"))
        out.append(_Q.pack(int(kind)))
        _put_attr(out, kind, value)
    return b"".join(out)


def _put_attr(out: list[bytes], kind: AttrKind, value: AttrValue) -> None:
    if kind == AttrKind.FLOAT:
        out.append(_D.pack(float(value)))  # type: ignore[arg-type]
    elif kind == AttrKind.STRING:
        _put_blob(out, str(value).encode("ascii"))
    elif kind in (AttrKind.BOOL, AttrKind.INT, AttrKind.DTYPE):
        out.append(_Q.pack(int(value)))  # type: ignore[arg-type]
    else:
        assert isinstance(value, list)
        out.append(_Q.pack(len(value)))
        for v in value:
            if kind == AttrKind.LIST_FLOAT:
                out.append(_D.pack(float(v)))  # type: ignore[arg-type]
            elif kind == AttrKind.LIST_STRING:
                _put_blob(out, str(v).encode("ascii"))
            elif kind == AttrKind.LIST_LIST_INT:
                assert isinstance(v, list)
                out.append(_Q.pack(len(v)) + b"".join(_Q.pack(int(x)) for x in v))  # type: ignore[arg-type]
            else:
                out.append(_Q.pack(int(v)))  # type: ignore[arg-type]

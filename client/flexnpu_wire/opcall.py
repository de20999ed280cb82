"""The tail of an ``OPERATOR`` request: one operator, its tensors and its attributes.

The C client (``libascendcl/src/op.c``, ``fx_op_launch``) writes it for ``aclopCompileAndExecute``,
``aclopExecuteV2`` and the aclnn launches; the aclserver decodes it with ``decode``. The request's
values are ``(stream, n_inputs, n_outputs, n_attrs)``; the tail is a sequence of int64 big-endian
words, where a byte string is its length in one word, then its bytes padded with zeros to a
multiple of 8:

* the operator's name (a byte string, ASCII, 1..128 bytes);
* each tensor, inputs then outputs: ``placement`` (0 absent: an optional input left out, nothing
  follows; 1 device; 2 host, its bytes by value), ``dtype`` (``aclDataType``), ``format``
  (``aclFormat``), ``ndim`` (0..16), ``ndim`` dims, ``ndim`` strides (in elements), ``offset`` (in
  elements), then for a device tensor its address and the bytes the caller says the storage has
  from that address (0: unknown), for a host tensor its bytes (a byte string);
* each attribute: its name (a byte string), its kind (``AttrKind``), its value: one word (bool,
  int, data type; a float as the bits of an IEEE double), a byte string (string), or a count then
  that many values (lists; a list of int lists: each list's count then its values).

``decode`` refuses a malformed tail with ``ContractError`` naming the field, so a bad message from
a client fails that operator only.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from flexnpu_wire.errors import ContractError

__all__ = [
    "MAX_ATTRS",
    "MAX_DIMS",
    "MAX_NAME",
    "MAX_TENSORS",
    "AttrKind",
    "AttrValue",
    "OpCall",
    "Placement",
    "Tensor",
    "contiguous",
    "decode",
]

MAX_NAME = 128
MAX_DIMS = 16
MAX_TENSORS = 64
MAX_ATTRS = 64
MAX_LIST = 1 << 16

AttrValue = bool | int | float | str | list["AttrValue"]


class Placement(IntEnum):
    ABSENT = 0
    DEVICE = 1
    HOST = 2


class AttrKind(IntEnum):
    """An attribute's kind on the wire (the ``aclopSetAttr*`` setter it came from)."""

    BOOL = 0
    INT = 1
    FLOAT = 2
    STRING = 3
    DTYPE = 4
    LIST_DTYPE = 5
    LIST_BOOL = 6
    LIST_INT = 7
    LIST_FLOAT = 8
    LIST_STRING = 9
    LIST_LIST_INT = 10


@dataclass(frozen=True, slots=True)
class Tensor:
    """One operand: a view (dims, strides and offset in elements) of device memory at ``address``
    (``storage_bytes`` the caller's bound, 0 unknown), or host bytes sent by value (``data``)."""

    placement: Placement
    dtype: int = 0
    format: int = 2
    dims: tuple[int, ...] = ()
    strides: tuple[int, ...] = ()
    offset: int = 0
    address: int = 0
    storage_bytes: int = 0
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class OpCall:
    name: str
    inputs: tuple[Tensor, ...]
    outputs: tuple[Tensor, ...]
    attrs: dict[str, AttrValue] = field(default_factory=dict)
    kinds: dict[str, AttrKind] = field(default_factory=dict)
    """Each attribute's setter (a backend that rebuilds CANN's ``aclopAttr`` calls the same one)."""


_Q = struct.Struct(">q")
_D = struct.Struct(">d")


class _Reader:
    def __init__(self, tail: bytes) -> None:
        self.buf = memoryview(tail)
        self.pos = 0

    def word(self, what: str) -> int:
        if self.pos + 8 > len(self.buf):
            raise ContractError(
                f"operator message: {what} is missing (the tail ends at {self.pos} bytes)", field=what
            )
        (v,) = _Q.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def bounded(self, what: str, lo: int, hi: int) -> int:
        v = self.word(what)
        if not lo <= v <= hi:
            raise ContractError(f"operator message: {what} must be in {lo}..{hi}, got {v}", field=what)
        return v

    def double(self, what: str) -> float:
        bits = self.word(what)
        return float(_D.unpack(_Q.pack(bits))[0])

    def blob(self, what: str, limit: int) -> bytes:
        n = self.bounded(f"{what} length", 0, limit)
        end = self.pos + n
        if end > len(self.buf):
            raise ContractError(
                f"operator message: {what} has {n} bytes, the tail only {len(self.buf) - self.pos}",
                field=what,
            )
        data = bytes(self.buf[self.pos : end])
        self.pos += (n + 7) & ~7
        return data

    def text(self, what: str, limit: int) -> str:
        raw = self.blob(what, limit)
        try:
            return raw.decode("ascii")
        except UnicodeDecodeError:
            raise ContractError(f"operator message: {what} is not ASCII", field=what) from None


def _tensor(r: _Reader, what: str) -> Tensor:
    placement = r.bounded(f"{what}.placement", 0, 2)
    if placement == Placement.ABSENT:
        return Tensor(Placement.ABSENT)
    dtype = r.bounded(f"{what}.dtype", 0, 1 << 16)
    fmt = r.bounded(f"{what}.format", -1, 1 << 16)
    ndim = r.bounded(f"{what}.ndim", 0, MAX_DIMS)
    dims = tuple(r.bounded(f"{what}.dims[{i}]", 0, 1 << 48) for i in range(ndim))
    strides = tuple(r.bounded(f"{what}.strides[{i}]", -(1 << 48), 1 << 48) for i in range(ndim))
    offset = r.bounded(f"{what}.offset", 0, 1 << 48)
    if placement == Placement.DEVICE:
        address = r.word(f"{what}.address")
        storage = r.bounded(f"{what}.storage_bytes", 0, 1 << 62)
        return Tensor(Placement.DEVICE, dtype, fmt, dims, strides, offset, address, storage)
    data = r.blob(f"{what}.data", 1 << 30)
    return Tensor(Placement.HOST, dtype, fmt, dims, strides, offset, data=data)


def _attr_value(r: _Reader, kind: int, what: str) -> AttrValue:
    if kind in (AttrKind.BOOL,):
        return bool(r.word(what))
    if kind in (AttrKind.INT, AttrKind.DTYPE):
        return r.word(what)
    if kind == AttrKind.FLOAT:
        return r.double(what)
    if kind == AttrKind.STRING:
        return r.text(what, 1 << 20)
    n = r.bounded(f"{what} count", 0, MAX_LIST)
    if kind == AttrKind.LIST_BOOL:
        return [bool(r.word(f"{what}[{i}]")) for i in range(n)]
    if kind in (AttrKind.LIST_INT, AttrKind.LIST_DTYPE):
        return [r.word(f"{what}[{i}]") for i in range(n)]
    if kind == AttrKind.LIST_FLOAT:
        return [r.double(f"{what}[{i}]") for i in range(n)]
    if kind == AttrKind.LIST_STRING:
        return [r.text(f"{what}[{i}]", 1 << 16) for i in range(n)]
    out: list[AttrValue] = []
    for i in range(n):
        m = r.bounded(f"{what}[{i}] count", 0, MAX_LIST)
        out.append([r.word(f"{what}[{i}][{j}]") for j in range(m)])
    return out


def decode(tail: bytes, n_inputs: int, n_outputs: int, n_attrs: int) -> OpCall:
    """The operator in ``tail`` (ContractError naming the field for a malformed one)."""
    for what, n, hi in (
        ("n_inputs", n_inputs, MAX_TENSORS),
        ("n_outputs", n_outputs, MAX_TENSORS),
        ("n_attrs", n_attrs, MAX_ATTRS),
    ):
        if not 0 <= n <= hi:
            raise ContractError(f"operator message: {what} must be in 0..{hi}, got {n}", field=what)
    r = _Reader(tail)
    name = r.text("name", MAX_NAME)
    if not name:
        raise ContractError("operator message: the operator's name is empty", field="name")
    inputs = tuple(_tensor(r, f"{name}: inputs[{i}]") for i in range(n_inputs))
    outputs = tuple(_tensor(r, f"{name}: outputs[{i}]") for i in range(n_outputs))
    attrs: dict[str, AttrValue] = {}
    kinds: dict[str, AttrKind] = {}
    for i in range(n_attrs):
        key = r.text(f"{name}: attrs[{i}].name", MAX_NAME)
        kind = r.bounded(f"{name}: attrs[{i}].kind", 0, max(AttrKind))
        attrs[key] = _attr_value(r, kind, f"{name}: attr {key}")
        kinds[key] = AttrKind(kind)
    if r.pos != len(r.buf):
        raise ContractError(
            f"operator message {name}: {len(r.buf) - r.pos} bytes after the last attribute", field="tail"
        )
    for t in (*inputs, *outputs):
        if t.placement != Placement.ABSENT and len(t.strides) != len(t.dims):
            raise ContractError(
                f"operator message {name}: strides and dims differ in length", field="strides"
            )
    return OpCall(name, inputs, outputs, attrs, kinds)


def contiguous(dims: Sequence[int]) -> tuple[int, ...]:
    """The strides (in elements) of a C-contiguous tensor of ``dims``."""
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))

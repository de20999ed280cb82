"""FlexNPU's emulated model format: what an ``.fnm`` file holds, parsed and rendered (``docs/model-format.md``).

Pure; no I/O. The emulated aclserver backend executes such a file (real outputs from a
deterministic elementwise compute with a declared die cost); the C and Python clients parse its
header, which is also what ``MODEL_GET_DESC`` returns for any loaded model (the ascend backend
renders CANN's description of a real model in the same layout). ``python -m flexnpu_wire.modeltool``
writes files. Every error is a ``ModelFormatError`` naming the field.

Layout (little-endian; offsets in bytes)::

    0   magic "FNPUMDL\\0" | 8 version u32 | 12 header_bytes u32 (H, multiple of 64)
    16  weight_bytes u64 | 24 work_bytes u64 | 32 cost_us u32 | 36 cost_ns_per_element u32
    40  n_inputs u32 | 44 n_outputs u32 | 48 n_batch_gears u32 | 52 n_hw_gears u32 | 56 reserved u64
    64  tensor records (inputs, then outputs), then batch gears (u64 each), then hw gears (u64 h,
        u64 w each), zero padding up to H
    H   weights (weight_bytes)

A tensor record: name_len u16, name (UTF-8), data_type i32 (aclDataType), format i32
(aclFormat), ndims u32, size u64 (bytes at the largest gear), dims i64 x ndims (-1: a dynamic
dimension). An output record adds op u32, a u32, b u32, scale f64, bias f64. A file of this
format states sizes that follow from the dims (``check``); a description of a real CANN model
(the ascend backend's) states CANN's, and may use up to ``ACL_MAX_DIM_CNT`` dims and any type.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import IntEnum
from typing import Any

__all__ = [
    "DTYPE_SIZES",
    "DYNAMIC_TENSOR_NAME",
    "FORMAT_NCHW",
    "FORMAT_ND",
    "FORMAT_NHWC",
    "HEADER_ALIGN",
    "MAGIC",
    "MAX_DIMS",
    "MAX_GEARS",
    "MAX_NAME_BYTES",
    "MAX_TENSORS",
    "VERSION",
    "ModelFile",
    "ModelFormatError",
    "Op",
    "Output",
    "Tensor",
    "check",
    "dynamic_positions",
    "header_bytes",
    "parse",
    "parse_header",
    "render",
    "render_header",
    "tensors",
]

MAGIC = b"FNPUMDL\x00"
VERSION = 1
HEADER_ALIGN = 64
MAX_TENSORS = 256
MAX_DIMS = 8
"""Dims of a tensor the emulated backend computes with."""
MAX_DESC_DIMS = 128
"""Dims of a tensor in a description (CANN's ACL_MAX_DIM_CNT)."""
MAX_GEARS = 128
"""CANN's ACL_MAX_BATCH_NUM / ACL_MAX_HW_NUM."""
MAX_NAME_BYTES = 127
"""CANN's ACL_MAX_TENSOR_NAME_LEN (128) less the terminating NUL."""
MAX_HEADER_BYTES = 256 << 10
"""A header (and so a model description on the wire) is at most 256 KiB: it fits one reply frame."""
DYNAMIC_TENSOR_NAME = "ascend_mbatch_shape_data"
"""CANN's ACL_DYNAMIC_TENSOR_NAME: the input that carries the batch (or h, w) of one execution."""
FORMAT_NCHW, FORMAT_NHWC, FORMAT_ND = 0, 1, 2
DTYPE_SIZES = {0: 4, 1: 2, 2: 1, 3: 4, 4: 1, 6: 2, 7: 2, 8: 4, 9: 8, 10: 8, 11: 8, 12: 1}
"""aclDataType -> bytes per element, for the types the format computes with: FLOAT, FLOAT16, INT8,
INT32, UINT8, INT16, UINT16, UINT32, INT64, UINT64, DOUBLE, BOOL."""
_FIXED = struct.Struct("<8sIIQQIIIIIIQ")
_TENSOR = struct.Struct("<iiIQ")
_OUTPUT = struct.Struct("<IIIdd")
_U16, _U64, _I64 = struct.Struct("<H"), struct.Struct("<Q"), struct.Struct("<q")
_INT32_MAX = 2**31 - 1


class ModelFormatError(ValueError):
    """The bytes are not a valid model of this format; ``field`` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"model field {field}: {message}")
        self.field = field


class Op(IntEnum):
    """What an output computes from the inputs, elementwise (in double precision)."""

    COPY = 0
    """out = in[a]"""
    AFFINE = 1
    """out = in[a] * scale + bias"""
    ADD = 2
    """out = in[a] + in[b]"""
    MUL = 3
    """out = in[a] * in[b]"""
    ADD_WEIGHTS = 4
    """out = in[a] + w, w the weights read as the output's type, repeated"""


@dataclass(frozen=True, slots=True)
class Tensor:
    """One input or output: name, aclDataType, aclFormat and dims (-1: dynamic)."""

    name: str
    data_type: int
    format: int = FORMAT_ND
    dims: tuple[int, ...] = ()

    def elements(self, batch: int = 0, hw: tuple[int, int] = (0, 0)) -> int:
        """Element count with the dynamic dims filled in (0 for a dynamic tensor without them)."""
        return math.prod(self.shape(batch, hw)) if self.dims else 1

    def shape(self, batch: int = 0, hw: tuple[int, int] = (0, 0)) -> tuple[int, ...]:
        """The dims with each -1 filled: dims[0] by ``batch``, H and W by ``hw`` (0 when not given)."""
        h_pos, w_pos = _hw_positions(self)
        dims = list(self.dims)
        for i in dynamic_positions(self):
            if hw != (0, 0) and i in (h_pos, w_pos):
                dims[i] = hw[0] if i == h_pos else hw[1]
            else:
                dims[i] = batch
        return tuple(dims)

    def nbytes(self, batch: int = 0, hw: tuple[int, int] = (0, 0)) -> int:
        return self.elements(batch, hw) * DTYPE_SIZES.get(self.data_type, 1)


@dataclass(frozen=True, slots=True)
class Output:
    """An output tensor and the elementwise op that computes it."""

    tensor: Tensor
    op: Op = Op.COPY
    a: int = 0
    b: int = 0
    scale: float = 1.0
    bias: float = 0.0


@dataclass(frozen=True, slots=True)
class ModelFile:
    """A whole model (see the module docstring)."""

    inputs: tuple[Tensor, ...]
    outputs: tuple[Output, ...]
    weight_bytes: int = 0
    work_bytes: int = 0
    cost_us: int = 0
    cost_ns_per_element: int = 0
    batch_gears: tuple[int, ...] = ()
    hw_gears: tuple[tuple[int, int], ...] = ()
    weights: bytes = field(default=b"", repr=False)
    sizes: tuple[int, ...] = ()
    """Bytes of each tensor (inputs, then outputs) at the largest gear when they are not what the
    dims say (a real CANN model's description); empty: as the dims say."""

    @property
    def max_batch(self) -> int:
        return max(self.batch_gears, default=0)

    @property
    def max_hw(self) -> tuple[int, int]:
        return max(self.hw_gears, key=lambda g: g[0] * g[1], default=(0, 0))

    def input_size(self, index: int) -> int:
        """Bytes of input ``index`` at the largest gear (what aclmdlGetInputSizeByIndex answers)."""
        return self.sizes[index] if self.sizes else self.inputs[index].nbytes(self.max_batch, self.max_hw)

    def output_size(self, index: int) -> int:
        if self.sizes:
            return self.sizes[len(self.inputs) + index]
        return self.outputs[index].tensor.nbytes(self.max_batch, self.max_hw)

    def need(self, index: int, batch: int, hw: tuple[int, int]) -> int:
        """Bytes the buffer of tensor ``index`` (inputs, then outputs) needs for one execution at
        this gear (0 where a CANN model's description leaves it to CANN)."""
        t = tensors(self)[index]
        if not self.sizes:
            return t.nbytes(batch, hw)
        return 0 if dynamic_positions(t) else self.sizes[index]

    def cost_of(self, elements: int) -> int:
        """Die microseconds of one execution that writes ``elements`` output elements."""
        return self.cost_us + -(-self.cost_ns_per_element * elements // 1000)

    def dynamic_index(self) -> int | None:
        """Index of the dynamic-shape input (``DYNAMIC_TENSOR_NAME``), if the model has gears."""
        if not (self.batch_gears or self.hw_gears):
            return None
        names = [t.name for t in self.inputs]
        return names.index(DYNAMIC_TENSOR_NAME) if DYNAMIC_TENSOR_NAME in names else None


def dynamic_positions(tensor: Tensor) -> tuple[int, ...]:
    """Indexes of the -1 dims of ``tensor``."""
    return tuple(i for i, d in enumerate(tensor.dims) if d == -1)


def _hw_positions(tensor: Tensor) -> tuple[int, int]:
    return (2, 3) if tensor.format == FORMAT_NCHW else (1, 2)


def render_header(model: ModelFile) -> bytes:
    """The header section (everything before the weights), padded to ``HEADER_ALIGN``."""
    body = bytearray()
    for i, t in enumerate(model.inputs):
        body += _tensor(t, model.input_size(i))
    for i, o in enumerate(model.outputs):
        body += _tensor(o.tensor, model.output_size(i)) + _OUTPUT.pack(int(o.op), o.a, o.b, o.scale, o.bias)
    for g in model.batch_gears:
        body += _U64.pack(g)
    for h, w in model.hw_gears:
        body += _U64.pack(h) + _U64.pack(w)
    size = -(-(_FIXED.size + len(body)) // HEADER_ALIGN) * HEADER_ALIGN
    fixed = _FIXED.pack(
        MAGIC, VERSION, size, model.weight_bytes, model.work_bytes, model.cost_us, model.cost_ns_per_element,
        len(model.inputs), len(model.outputs), len(model.batch_gears), len(model.hw_gears), 0,
    )  # fmt: skip
    return (fixed + bytes(body)).ljust(size, b"\x00")


def render(model: ModelFile) -> bytes:
    """A whole file: the header, then ``weight_bytes`` of weights (``weights`` zero-padded)."""
    check(model)
    if len(model.weights) > model.weight_bytes:
        raise ModelFormatError(
            "weights", f"{len(model.weights)} bytes given, weight_bytes is {model.weight_bytes}"
        )
    return render_header(model) + model.weights.ljust(model.weight_bytes, b"\x00")


def header_bytes(data: bytes | bytearray | memoryview) -> int:
    """The size of the header section announced by ``data`` (at least its first 64 bytes)."""
    if len(data) < _FIXED.size:
        raise ModelFormatError("header", f"{len(data)} bytes are fewer than the {_FIXED.size}-byte header")
    magic, version, size = struct.unpack_from("<8sII", data, 0)
    if magic != MAGIC:
        raise ModelFormatError("magic", "not a FlexNPU model (the magic is not FNPUMDL)")
    if version != VERSION:
        raise ModelFormatError("version", f"version {version} is not supported (this reads {VERSION})")
    if size < _FIXED.size or size % HEADER_ALIGN or size > MAX_HEADER_BYTES:
        raise ModelFormatError(
            "header_bytes", f"{size} is not a multiple of {HEADER_ALIGN} in 64..{MAX_HEADER_BYTES}"
        )
    return int(size)


def parse_header(data: bytes | bytearray | memoryview) -> ModelFile:
    """The model a header section describes (without weights). Only the layout is checked: a
    description of a real CANN model need not be one the emulated backend could execute."""
    size = header_bytes(data)
    if len(data) < size:
        raise ModelFormatError("header_bytes", f"the header needs {size} bytes, {len(data)} given")
    view = memoryview(data)[:size]
    (_m, _v, _s, weight, work, cost, cost_el, n_in, n_out, n_batch, n_hw, _r) = _FIXED.unpack_from(view, 0)
    if n_in + n_out > MAX_TENSORS or n_out == 0:
        raise ModelFormatError(
            "n_outputs", f"{n_in} inputs and {n_out} outputs: 1..{MAX_TENSORS} tensors, at least one output"
        )
    if n_batch > MAX_GEARS or n_hw > MAX_GEARS:
        raise ModelFormatError("n_batch_gears", f"at most {MAX_GEARS} gears of each kind")
    reader = _Reader(view, _FIXED.size)
    sized = [reader.tensor(f"inputs[{i}]") for i in range(n_in)]
    inputs = tuple(t for t, _ in sized)
    outputs = []
    for i in range(n_out):
        tensor, size = reader.tensor(f"outputs[{i}]")
        sized.append((tensor, size))
        op, a, b, scale, bias = reader.unpack(_OUTPUT, f"outputs[{i}]")
        if op not in Op.__members__.values():
            raise ModelFormatError(f"outputs[{i}].op", f"unknown op {op}")
        outputs.append(Output(tensor, Op(op), a, b, scale, bias))
    batch = tuple(reader.unpack(_U64, "batch_gears")[0] for _ in range(n_batch))
    hw = tuple((reader.unpack(_U64, "hw_gears")[0], reader.unpack(_U64, "hw_gears")[0]) for _ in range(n_hw))
    model = ModelFile(inputs, tuple(outputs), weight, work, cost, cost_el, batch, hw)
    stated = tuple(size for _, size in sized)
    if stated != tuple(model.input_size(i) for i in range(n_in)) + tuple(
        model.output_size(i) for i in range(n_out)
    ):
        model = replace(model, sizes=stated)
    return model


def parse(data: bytes | bytearray | memoryview) -> ModelFile:
    """A whole file the emulated backend can execute: header and weights, checked (``check``)."""
    model = parse_header(data)
    check(model)
    size = header_bytes(data)
    if len(data) != size + model.weight_bytes:
        raise ModelFormatError(
            "weight_bytes",
            f"the file has {len(data) - size} bytes after the header, weight_bytes says {model.weight_bytes}",
        )
    return replace(model, weights=bytes(memoryview(data)[size:]))


def check(model: ModelFile) -> None:
    """Refuse a model the emulated backend could not execute exactly as declared."""
    if model.sizes:
        raise ModelFormatError("size", "a tensor's size is not what its dims and data type make")
    if model.batch_gears and model.hw_gears:
        raise ModelFormatError(
            "hw_gears", "a model has dynamic batch or dynamic height/width gears, not both"
        )
    if any(not 0 < g <= _INT32_MAX for g in model.batch_gears) or any(
        not (0 < h <= _INT32_MAX and 0 < w <= _INT32_MAX) for h, w in model.hw_gears
    ):
        raise ModelFormatError("batch_gears", "every gear must be in 1..2147483647")
    names = [t.name for t in model.inputs] + [o.tensor.name for o in model.outputs]
    if len(set(names)) != len(names):
        raise ModelFormatError("inputs", "tensor names must be unique")
    gears = bool(model.batch_gears or model.hw_gears)
    for i, t in enumerate(model.inputs):
        if (t.name == DYNAMIC_TENSOR_NAME) != (gears and i == len(model.inputs) - 1):
            raise ModelFormatError(
                f"inputs[{i}].name", f"with gears, the last input (and only it) is {DYNAMIC_TENSOR_NAME}"
            )
    if gears and not model.inputs:
        raise ModelFormatError("inputs", f"a model with gears needs its {DYNAMIC_TENSOR_NAME} input")
    dynamic = model.dynamic_index()
    if dynamic is not None:
        want = 1 if model.batch_gears else 2
        if model.inputs[dynamic] != Tensor(DYNAMIC_TENSOR_NAME, 9, FORMAT_ND, (want,)):
            raise ModelFormatError(
                f"inputs[{dynamic}]", f"{DYNAMIC_TENSOR_NAME} must be INT64, ND, dims [{want}]"
            )
    for where, t in [(f"inputs[{i}]", t) for i, t in enumerate(model.inputs)] + [
        (f"outputs[{i}]", o.tensor) for i, o in enumerate(model.outputs)
    ]:
        _check_tensor(model, where, t)
    for i, o in enumerate(model.outputs):
        _check_output(model, f"outputs[{i}]", o)


def _check_tensor(model: ModelFile, where: str, t: Tensor) -> None:
    if t.data_type not in DTYPE_SIZES:
        raise ModelFormatError(
            f"{where}.data_type", f"aclDataType {t.data_type} is not one this format computes with"
        )
    if len(t.dims) > MAX_DIMS or any(d < -1 or d == 0 for d in t.dims):
        raise ModelFormatError(f"{where}.dims", f"at most {MAX_DIMS} dims, each positive or -1 (dynamic)")
    dyn = dynamic_positions(t)
    if dyn and model.batch_gears and dyn != (0,):
        raise ModelFormatError(f"{where}.dims", "with batch gears only dims[0] may be -1")
    if dyn and model.hw_gears and (t.format not in (FORMAT_NCHW, FORMAT_NHWC) or dyn != _hw_positions(t)):
        raise ModelFormatError(
            f"{where}.dims", "with hw gears only H and W of an NCHW or NHWC tensor may be -1"
        )
    if dyn and not (model.batch_gears or model.hw_gears):
        raise ModelFormatError(f"{where}.dims", "a dynamic dim needs batch or hw gears")


def _check_output(model: ModelFile, where: str, o: Output) -> None:
    sources = [o.a, o.b] if o.op in (Op.ADD, Op.MUL) else [o.a]
    dynamic = model.dynamic_index()
    for name, idx in zip(("a", "b"), sources, strict=False):
        if not 0 <= idx < len(model.inputs) or idx == dynamic:
            raise ModelFormatError(f"{where}.{name}", f"input {idx} is not a data input of the model")
        src = model.inputs[idx]
        # at every gear: with dynamic dims, elements() without a gear is 0 for both tensors
        gears = [(b, (0, 0)) for b in model.batch_gears] + [(0, hw) for hw in model.hw_gears]
        if src.dims != o.tensor.dims and any(
            src.elements(*gear) != o.tensor.elements(*gear) for gear in gears or [(0, (0, 0))]
        ):
            raise ModelFormatError(
                f"{where}.dims", f"{o.tensor.name} must have as many elements as {src.name} at every gear"
            )
        if dynamic_positions(src) != dynamic_positions(o.tensor):
            raise ModelFormatError(f"{where}.dims", f"{o.tensor.name} and {src.name} must be dynamic alike")
    if o.op == Op.ADD_WEIGHTS and model.weight_bytes < DTYPE_SIZES[o.tensor.data_type]:
        raise ModelFormatError(f"{where}.op", "ADD_WEIGHTS needs at least one element of weights")
    if not (math.isfinite(o.scale) and math.isfinite(o.bias)):
        raise ModelFormatError(f"{where}.scale", "scale and bias must be finite")


def _tensor(t: Tensor, size: int) -> bytes:
    name = t.name.encode()
    if not 0 < len(name) <= MAX_NAME_BYTES:
        raise ModelFormatError("name", f"tensor names are 1..{MAX_NAME_BYTES} UTF-8 bytes, got {t.name!r}")
    if len(t.dims) > MAX_DESC_DIMS:
        raise ModelFormatError("dims", f"at most {MAX_DESC_DIMS} dims")
    return (
        _U16.pack(len(name)) + name + _TENSOR.pack(t.data_type, t.format, len(t.dims), size)
        + b"".join(_I64.pack(d) for d in t.dims)
    )  # fmt: skip


class _Reader:
    def __init__(self, view: memoryview, offset: int) -> None:
        self.view, self.offset = view, offset

    def unpack(self, s: struct.Struct, where: str) -> tuple[Any, ...]:
        if self.offset + s.size > len(self.view):
            raise ModelFormatError(where, "runs past header_bytes")
        values = s.unpack_from(self.view, self.offset)
        self.offset += s.size
        return values

    def tensor(self, where: str) -> tuple[Tensor, int]:
        (n,) = self.unpack(_U16, f"{where}.name")
        if not 0 < int(n) <= MAX_NAME_BYTES or self.offset + int(n) > len(self.view):
            raise ModelFormatError(
                f"{where}.name", f"name length {n} is not 1..{MAX_NAME_BYTES} or runs past the header"
            )
        try:
            name = bytes(self.view[self.offset : self.offset + int(n)]).decode()
        except UnicodeDecodeError:
            raise ModelFormatError(f"{where}.name", "is not UTF-8") from None
        self.offset += int(n)
        dtype, fmt, ndims, size = self.unpack(_TENSOR, where)
        if int(ndims) > MAX_DESC_DIMS:
            raise ModelFormatError(f"{where}.dims", f"{ndims} dims, at most {MAX_DESC_DIMS}")
        dims = tuple(int(self.unpack(_I64, f"{where}.dims")[0]) for _ in range(int(ndims)))
        return Tensor(name, int(dtype), int(fmt), dims), int(size)


def tensors(model: ModelFile) -> Sequence[Tensor]:
    """Every tensor of ``model``: inputs, then outputs."""
    return [*model.inputs, *(o.tensor for o in model.outputs)]

"""The aclnn functions (CANN's ``aclnnXxx``, named without ``GetWorkspaceSize``) over the same kernels.

How a call's parameters arrive (the share's ``libopapi.so`` sends them so: ``libascendcl/closure/nnopbase.c``
and the table ``libascendcl/api/aclnn_api.json``, which ``tests/unit/test_operators_aclnn.py`` checks against
``SPECS``):

- every tensor parameter the function only reads is an input, in parameter order; an absent optional
  one (``…Optional`` passed as NULL) is None; an ``aclTensorList``'s tensors are inputs in their order;
- every tensor the function writes is an output, in parameter order: ``out``, ``yOut``, ``indices``,
  … and, for an ``Inplace`` function, ``selfRef`` (which it also reads);
- every other parameter is an attribute under CANN's parameter name: ``aclScalar`` → its value (bool,
  int or float), ``int64_t``/``int8_t``/``int32_t``/``uint64_t`` and ``aclDataType`` → int, ``double``/``float``
  → float (sent as a C float),
  ``bool`` → bool, ``aclIntArray`` → list of ints, ``char *`` → str.

Kinds in ``SPECS``: ``tensor``, ``tensor?`` (optional), ``tensors`` (a list), ``out``, ``out?``, ``inout``
(``selfRef``), ``scalar``, ``int``, ``bool``, ``double``, ``intarray``, ``intarray?`` (absent: no attribute),
``string`` (a ``char *``), ``dtype``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from flexnpu_runtime.aclserver.operators import attention, elementwise, linalg, norms, reductions
from flexnpu_runtime.aclserver.operators.calls import (
    Array,
    Call,
    compute_dtype,
    dtype_name,
    from_bf16,
    numpy_dtype,
    store,
)
from flexnpu_runtime.aclserver.operators.creation import arange
from flexnpu_runtime.aclserver.operators.layout import concat, gather, strided_slice

__all__ = ["ACLNN", "KINDS", "SPECS", "Bound"]

KINDS = frozenset({"tensor", "tensor?", "tensors", "out", "out?", "inout", "scalar", "int", "bool", "double",
                   "intarray", "intarray?", "string", "dtype"})  # fmt: skip
TENSOR_IN = frozenset({"tensor", "tensor?", "tensors"})
TENSOR_OUT = frozenset({"out", "out?", "inout"})


@dataclass(frozen=True, slots=True)
class Bound:
    """A call read by CANN's parameter names: tensors by their input/output position, the rest as attributes."""

    call: Call
    params: tuple[tuple[str, str], ...]

    def _position(self, name: str) -> tuple[str, int]:
        n_in = sum(1 for _, k in self.params if k in ("tensor", "tensor?"))
        list_len = len(self.call.inputs) - n_in
        i_in = i_out = 0
        for pname, kind in self.params:
            if pname == name:
                return kind, (i_out if kind in TENSOR_OUT else i_in)
            if kind in TENSOR_OUT:
                i_out += 1
            elif kind == "tensors":
                i_in += list_len
            elif kind in TENSOR_IN:
                i_in += 1
        raise KeyError(name)  # a kernel asked for a parameter its spec lacks: a bug here, not bad input

    def t(self, name: str) -> Array:
        """A tensor the function reads (an ``inout`` one too, as float32 when bfloat16), required."""
        kind, i = self._position(name)
        if kind in TENSOR_OUT:
            return from_bf16(self.call.output(i, name))
        return self.call.input(i, name)

    def opt(self, name: str) -> Array | None:
        kind, i = self._position(name)
        if kind in TENSOR_OUT:
            return self.call.outputs[i] if i < len(self.call.outputs) else None
        return self.call.optional(i, name)

    def out(self, name: str) -> tuple[int, Array]:
        """A tensor the function writes: its output index and array."""
        _, i = self._position(name)
        return i, self.call.output(i, name)

    def tensors(self, name: str) -> list[Array]:
        _, start = self._position(name)
        n_in = sum(1 for _, k in self.params if k in ("tensor", "tensor?"))
        return [self.call.input(start + j, f"{name}[{j}]") for j in range(len(self.call.inputs) - n_in)]

    def store(self, name: str, value: Array | float | int | bool) -> None:
        i, array = self.out(name)
        store(self.call.op, i, array, np.asarray(value))


Kernel = Callable[[Bound], int]
SPECS: dict[str, tuple[tuple[tuple[str, str], ...], Kernel]] = {}
"""aclnn function -> (its parameters as (CANN name, kind), in order; its kernel)."""


def _spec(name: str, params: str, kernel: Kernel) -> None:
    parsed = tuple((p.split(":")[0], p.split(":")[1]) for p in params.split())
    assert all(kind in KINDS for _, kind in parsed), name
    SPECS[name] = (parsed, kernel)


def _n(value: float | int | bool) -> Array:
    return np.asarray(value)


# -- creation -------------------------------------------------------------------------------------


def _fill(value_of: Callable[[Bound], Array | float | int | bool]) -> Kernel:
    def kernel(b: Bound) -> int:
        _, self_ref = b.out("selfRef")
        b.store("selfRef", np.broadcast_to(np.asarray(value_of(b)).reshape(()), self_ref.shape))
        return 0

    return kernel


def _fill_tensor_value(b: Bound) -> Array:
    value = b.t("value")
    if value.size != 1:
        raise b.call.bad_input(f"value must hold one element, it has shape {list(value.shape)}")
    return value.reshape(())


_spec("aclnnInplaceOne", "selfRef:inout", _fill(lambda b: 1))
_spec("aclnnInplaceZero", "selfRef:inout", _fill(lambda b: 0))
_spec("aclnnInplaceFillScalar", "selfRef:inout value:scalar", _fill(lambda b: b.call.attr_number("value")))
_spec("aclnnInplaceFillTensor", "selfRef:inout value:tensor", _fill(_fill_tensor_value))


def _arange(b: Bound) -> int:
    start, end, step = (float(b.call.attr_number(n)) for n in ("start", "end", "step"))
    arange(b.call, start, end, step, b.out("out")[1])
    return 0


_spec("aclnnArange", "start:scalar end:scalar step:scalar out:out", _arange)


def _random(draw: Callable[[np.random.Generator, Bound, tuple[int, ...]], Array]) -> Kernel:
    """Fill ``selfRef`` from numpy's generator seeded with (seed, offset): the same call gives the same
    numbers, a new offset (torch_npu advances it per call) new ones; not CANN's sequence."""

    def kernel(b: Bound) -> int:
        _, self_ref = b.out("selfRef")
        seed, offset = b.call.attr_int("seed"), b.call.attr_int("offset")
        rng = np.random.default_rng([seed & (2**64 - 1), offset & (2**64 - 1)])
        b.store("selfRef", draw(rng, b, self_ref.shape))
        return 4 * self_ref.size

    return kernel


def _normal(rng: np.random.Generator, b: Bound, shape: tuple[int, ...]) -> Array:
    std = b.call.attr_float("std")
    if std < 0:
        raise b.call.bad_attr(f"std must not be negative, it is {std}")
    return rng.normal(b.call.attr_float("mean"), std, shape)


def _uniform(rng: np.random.Generator, b: Bound, shape: tuple[int, ...]) -> Array:
    low, high = b.call.attr_float("from"), b.call.attr_float("to")
    if not low <= high:
        raise b.call.bad_attr(f"from {low} is above to {high}")
    return rng.uniform(low, high, shape)


_spec("aclnnInplaceNormal", "selfRef:inout mean:double std:double seed:int offset:int", _random(_normal))
_spec("aclnnInplaceUniform", "selfRef:inout from:double to:double seed:int offset:int", _random(_uniform))

# -- arithmetic -----------------------------------------------------------------------------------

ARITH = {"Add": "Add", "Sub": "Sub", "Mul": "Mul", "Div": "RealDiv"}


def _arith(op: str, *, scalar_other: bool, alpha: bool, inplace: bool) -> Kernel:
    def kernel(b: Bound) -> int:
        a = b.t("selfRef" if inplace else "self")
        other = _n(b.call.attr_number("other")) if scalar_other else b.t("other")
        if alpha:
            factor = b.call.attr_number("alpha")
            if factor != 1:
                other = elementwise.binary("Mul", other, _n(factor), call=b.call)
        b.store("selfRef" if inplace else "out", elementwise.binary(ARITH[op], a, other, call=b.call))
        return a.size

    return kernel


for _op in ARITH:
    _alpha = " alpha:scalar" if _op in ("Add", "Sub") else ""
    _spec(f"aclnn{_op}", f"self:tensor other:tensor{_alpha} out:out",
          _arith(_op, scalar_other=False, alpha=bool(_alpha), inplace=False))  # fmt: skip
    _spec(f"aclnn{_op}s", f"self:tensor other:scalar{_alpha} out:out",
          _arith(_op, scalar_other=True, alpha=bool(_alpha), inplace=False))  # fmt: skip
    _spec(f"aclnnInplace{_op}", f"selfRef:inout other:tensor{_alpha}",
          _arith(_op, scalar_other=False, alpha=bool(_alpha), inplace=True))  # fmt: skip
    _spec(f"aclnnInplace{_op}s", f"selfRef:inout other:scalar{_alpha}",
          _arith(_op, scalar_other=True, alpha=bool(_alpha), inplace=True))  # fmt: skip


def _pow_tensor_scalar(b: Bound) -> int:
    x = b.t("self")
    b.store("out", elementwise.binary("Pow", x, _n(b.call.attr_number("exponent")), call=b.call))
    return x.size


_spec("aclnnPowTensorScalar", "self:tensor exponent:scalar out:out", _pow_tensor_scalar)

UNARY = {"Exp": "Exp", "Log": "Log", "Neg": "Neg", "Sqrt": "Sqrt", "Rsqrt": "Rsqrt", "Reciprocal": "Reciprocal",
         "Tanh": "Tanh", "Relu": "Relu", "Sigmoid": "Sigmoid", "LogicalNot": "LogicalNot", "Gelu": "Gelu"}  # fmt: skip


def _unary(op: str, *, inplace: str = "") -> Kernel:
    """``op`` of ``self`` into ``out``, or (``inplace``: the written parameter's name) into that tensor."""

    def kernel(b: Bound) -> int:
        x = b.t(inplace or "self")
        b.store(inplace or "out", elementwise.unary(op, x, call=b.call))
        return 8 * x.size

    return kernel


for _op, _aclop in UNARY.items():
    _spec(f"aclnn{_op}", "self:tensor out:out", _unary(_aclop))
    if _op != "Gelu":
        _ref = "self" if _op == "Sqrt" else "selfRef"  # CANN's aclnnInplaceSqrt names it self
        _spec(f"aclnnInplace{_op}", f"{_ref}:inout", _unary(_aclop, inplace=_ref))


def _silu(b: Bound) -> int:
    x = b.t("self")
    b.call.float_dtype(x, "self")
    value = x.astype(compute_dtype(x))
    b.store("out", value * elementwise.sigmoid(value))
    return 8 * x.size


_spec("aclnnSilu", "self:tensor out:out", _silu)


def _gelu_v2(b: Bound) -> int:
    x = b.t("x")
    b.call.float_dtype(x, "x")
    approximate = b.call.attr_int("approximate")
    if approximate not in (0, 1):
        raise b.call.bad_attr(f"approximate must be 0 (none) or 1 (tanh), it is {approximate}")
    b.store("y", elementwise.gelu(x.astype(compute_dtype(x)), tanh=approximate == 1))
    return 8 * x.size


_spec("aclnnGeluV2", "x:tensor approximate:int y:out", _gelu_v2)


def _binary(op: str, second: str) -> Kernel:
    def kernel(b: Bound) -> int:
        a = b.t("self")
        b.store("out", elementwise.binary(op, a, b.t(second), call=b.call))
        return a.size

    return kernel


for _name, _op in (("Maximum", "Maximum"), ("Minimum", "Minimum"), ("LogicalAnd", "LogicalAnd"),
                   ("LogicalOr", "LogicalOr")):  # fmt: skip
    _spec(f"aclnn{_name}", "self:tensor other:tensor out:out", _binary(_op, "other"))
_spec("aclnnPowTensorTensor", "self:tensor exponent:tensor out:out", _binary("Pow", "exponent"))


def _compare(op: str, *, scalar_other: bool) -> Kernel:
    def kernel(b: Bound) -> int:
        a = b.t("self")
        other = _n(b.call.attr_number("other")) if scalar_other else b.t("other")
        b.store("out", elementwise.binary(op, a, other, call=b.call))
        return a.size

    return kernel


for _name, _op in (("Eq", "Equal"), ("Ne", "NotEqual"), ("Lt", "Less"), ("Le", "LessEqual"), ("Gt", "Greater"),
                   ("Ge", "GreaterEqual")):  # fmt: skip
    _spec(f"aclnn{_name}Tensor", "self:tensor other:tensor out:out", _compare(_op, scalar_other=False))
    _spec(f"aclnn{_name}Scalar", "self:tensor other:scalar out:out", _compare(_op, scalar_other=True))


def _cast(b: Bound) -> int:
    x = b.t("self")
    _, out = b.out("out")
    wanted = numpy_dtype(b.call.attr_int("dtype"), op=b.call.op, field="dtype")
    if out.dtype != wanted:
        raise b.call.bad_attr(f"dtype is {dtype_name(wanted)}, out is {dtype_name(out.dtype)}")
    b.store("out", x)
    return x.size


_spec("aclnnCast", "self:tensor dtype:dtype out:out", _cast)


def _inplace_copy(b: Bound) -> int:
    _, dst = b.out("selfRef")
    src = b.t("src")
    try:
        value = np.broadcast_to(src, dst.shape)
    except ValueError:
        raise b.call.bad_input(
            f"src of shape {list(src.shape)} does not broadcast to {list(dst.shape)}"
        ) from None
    b.store("selfRef", value.copy() if np.shares_memory(value, dst) else value)
    return 0


_spec("aclnnInplaceCopy", "selfRef:inout src:tensor", _inplace_copy)

# -- matrix products ------------------------------------------------------------------------------


def _matmul(first: str, *, batched: bool) -> Kernel:
    def kernel(b: Bound) -> int:
        a, m = b.t(first), b.t("mat2")
        if not batched and (a.ndim > 2 or m.ndim > 2):
            value, flops = linalg.matmul(b.call, a, m, batched=True)
        else:
            value, flops = linalg.matmul(b.call, a, m, batched=batched)
        b.store("out", value)
        return flops

    return kernel


def _matmul_any(b: Bound) -> int:
    """aclnnMatmul: torch.matmul's rules (1-d operands are promoted and the added dim removed)."""
    a, m = b.t("self"), b.t("mat2")
    if a.ndim == 0 or m.ndim == 0:
        raise b.call.bad_input("aclnnMatmul needs tensors of at least one dimension")
    a2 = a[np.newaxis, :] if a.ndim == 1 else a
    m2 = m[:, np.newaxis] if m.ndim == 1 else m
    value, flops = linalg.matmul(b.call, a2, m2, batched=True)
    if a.ndim == 1:
        value = value[..., 0, :]
    if m.ndim == 1:
        value = value[..., 0]
    b.store("out", value)
    return flops


_spec("aclnnMatmul", "self:tensor mat2:tensor out:out cubeMathType:int", _matmul_any)
_spec("aclnnMm", "self:tensor mat2:tensor out:out cubeMathType:int", _matmul("self", batched=False))
_spec("aclnnBatchMatMul", "self:tensor mat2:tensor out:out cubeMathType:int", _matmul("self", batched=True))


def _addmm(first: str, second: str, *, batched: bool) -> Kernel:
    def kernel(b: Bound) -> int:
        bias = b.t("self")
        value, flops = linalg.matmul(b.call, b.t(first), b.t(second), batched=batched)
        beta, alpha = b.call.attr_number("beta"), b.call.attr_number("alpha")
        try:
            result = np.asarray(alpha) * value + np.asarray(beta) * bias.astype(value.dtype)
        except ValueError:
            raise b.call.bad_input(f"self of shape {list(bias.shape)} does not broadcast") from None
        b.store("out", result.astype(value.dtype))
        return flops + 2 * value.size

    return kernel


_spec("aclnnAddmm", "self:tensor mat1:tensor mat2:tensor beta:scalar alpha:scalar out:out cubeMathType:int",
      _addmm("mat1", "mat2", batched=False))  # fmt: skip
_spec("aclnnBaddbmm", "self:tensor batch1:tensor batch2:tensor beta:scalar alpha:scalar out:out cubeMathType:int",
      _addmm("batch1", "batch2", batched=True))  # fmt: skip

# -- normalisations -------------------------------------------------------------------------------


def _softmax(fn: Callable[[Array, tuple[int, ...]], Array], scalar: float) -> Kernel:
    """softmax or log-softmax of ``self`` along ``dim`` (a 0-d tensor gives ``scalar``)."""

    def kernel(b: Bound) -> int:
        x = b.t("self")
        b.call.float_dtype(x, "self")
        axis = b.call.axis(b.call.attr_int("dim"), x.ndim, "dim")
        b.store("out", fn(x, (axis,)) if x.ndim else np.full_like(x, scalar))
        return 8 * x.size

    return kernel


_spec("aclnnSoftmax", "self:tensor dim:int out:out", _softmax(norms.softmax, 1.0))
_spec("aclnnLogSoftmax", "self:tensor dim:int out:out", _softmax(norms.log_softmax, 0.0))


def _layer_norm(b: Bound) -> int:
    x = b.t("input")
    b.call.float_dtype(x, "input")
    shape = b.call.attr_ints("normalizedShape")
    begin = x.ndim - len(shape)
    if begin < 0 or list(x.shape[begin:]) != shape:
        raise b.call.bad_attr(f"normalizedShape {shape} is not the trailing shape of input {list(x.shape)}")
    weight, bias = b.opt("weightOptional"), b.opt("biasOptional")
    for name, w in (("weightOptional", weight), ("biasOptional", bias)):
        if w is not None and list(w.shape) != shape:
            raise b.call.bad_input(f"{name} has shape {list(w.shape)}, normalizedShape is {shape}")
    y, mean, rstd = norms.layer_norm(x, begin, weight, bias, b.call.attr_float("eps"))
    b.store("out", y)
    for name, stat in (("meanOutOptional", mean), ("rstdOutOptional", rstd)):
        array = b.opt(name)
        if array is not None:
            norms.store_stat(b.call, b.out(name)[0], array, stat)
    return 8 * x.size


_spec("aclnnLayerNorm", "input:tensor normalizedShape:intarray weightOptional:tensor? biasOptional:tensor? "
      "eps:double out:out meanOutOptional:out? rstdOutOptional:out?", _layer_norm)  # fmt: skip


def _rms_norm(b: Bound) -> int:
    x, gamma = b.t("x"), b.t("gamma")
    b.call.float_dtype(x, "x")
    begin = x.ndim - gamma.ndim
    if begin < 0 or gamma.shape != x.shape[begin:]:
        raise b.call.bad_input(f"gamma {list(gamma.shape)} must be the trailing dims of x {list(x.shape)}")
    y, rstd = norms.rms_norm(x, gamma, b.call.attr_float("epsilon"), begin)
    b.store("yOut", y)
    array = b.opt("rstdOut")
    if array is not None:
        norms.store_stat(b.call, b.out("rstdOut")[0], array, rstd)
    return 6 * x.size


_spec("aclnnRmsNorm", "x:tensor gamma:tensor epsilon:double yOut:out rstdOut:out?", _rms_norm)


def _flash_attention(b: Bound) -> int:
    call = b.call
    if call.attr_float("keepProb") != 1.0 or b.opt("dropMaskOptional") is not None:
        raise call.bad_attr("dropout (keepProb < 1, dropMaskOptional) is not supported")
    if b.opt("paddingMaskOptional") is not None or call.attr_ints("prefixOptional", []):
        raise call.bad_input("paddingMaskOptional and prefixOptional are not supported")
    mode = call.attr_int("sparseMode")
    if mode not in (0, 1, 2, 3):
        raise call.bad_attr(f"sparseMode {mode} is not supported (0, 1, 2, 3 are)")
    params: dict[str, int | float | str] = {
        "inputLayout": str(call.attrs.get("inputLayout", "")),
        "headNum": call.attr_int("headNum"),
        "scaleValue": call.attr_float("scaleValue"),
        "preTokens": call.attr_int("preTokens"),
        "nextTokens": call.attr_int("nextTokens"),
        "sparseMode": mode,
    }
    out, row_max, row_sum, flops = attention.flash_attention(
        call, b.t("query"), b.t("key"), b.t("value"), pse=b.opt("realShiftOptional"),
        mask=b.opt("attenMaskOptional"), params=params,
    )  # fmt: skip
    attention.store_stat(call, b.out("softmaxMaxOut")[0], b.out("softmaxMaxOut")[1], row_max)
    attention.store_stat(call, b.out("softmaxSumOut")[0], b.out("softmaxSumOut")[1], row_sum)
    b.store("attentionOutOut", out)
    return flops


_spec("aclnnFlashAttentionScore", "query:tensor key:tensor value:tensor realShiftOptional:tensor? "
      "dropMaskOptional:tensor? paddingMaskOptional:tensor? attenMaskOptional:tensor? prefixOptional:intarray? "
      "scaleValue:double keepProb:double preTokens:int nextTokens:int headNum:int inputLayout:string "
      "innerPrecise:int sparseMode:int softmaxMaxOut:out softmaxSumOut:out softmaxOutOut:out? "
      "attentionOutOut:out", _flash_attention)  # fmt: skip

# -- layout ---------------------------------------------------------------------------------------


def _embedding(b: Bound) -> int:
    weight, indices = b.t("weight"), b.t("indices")
    b.store("out", gather(b.call, weight, indices, 0))
    return 0


def _index_select(b: Bound) -> int:
    x, index = b.t("self"), b.t("index")
    if index.ndim > 1:
        raise b.call.bad_input(f"index must be 0-d or 1-d, it has shape {list(index.shape)}")
    b.store("out", gather(b.call, x, index.reshape(-1), b.call.attr_int("dim")))
    return 0


_spec("aclnnEmbedding", "weight:tensor indices:tensor out:out", _embedding)
_spec("aclnnIndexSelect", "self:tensor dim:int index:tensor out:out", _index_select)


def _cat(b: Bound) -> int:
    arrays = [a for a in b.tensors("tensors") if not (a.ndim == 1 and a.size == 0)]  # torch skips empty 1-d
    b.store("out", concat(b.call, arrays or b.tensors("tensors"), b.call.attr_int("dim")))
    return 0


_spec("aclnnCat", "tensors:tensors dim:int out:out", _cat)


def _slice(b: Bound) -> int:
    x = b.t("self")
    dim = b.call.axis(b.call.attr_int("dim"), x.ndim, "dim")
    step = b.call.attr_int("step")
    if step <= 0:
        raise b.call.bad_attr(f"step must be positive, it is {step}")
    begin, end, strides = [0] * x.ndim, list(x.shape), [1] * x.ndim
    begin[dim], end[dim], strides[dim] = b.call.attr_int("start"), b.call.attr_int("end"), step
    masks = {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0, "new_axis_mask": 0, "shrink_axis_mask": 0}
    b.store("out", strided_slice(b.call, x, begin, end, strides=strides, masks=masks))
    return 0


_spec("aclnnSlice", "self:tensor dim:int start:int end:int step:int out:out", _slice)


def _triangle(upper: bool, *, inplace: bool) -> Kernel:
    def kernel(b: Bound) -> int:
        x = b.t("selfRef" if inplace else "self")
        if x.ndim < 2:
            raise b.call.bad_input(f"self must have at least 2 dimensions, it has shape {list(x.shape)}")
        k = b.call.attr_int("diagonal")
        b.store("selfRef" if inplace else "out", np.triu(x, k) if upper else np.tril(x, k))
        return 0

    return kernel


for _name, _upper in (("Triu", True), ("Tril", False)):
    _spec(f"aclnn{_name}", "self:tensor diagonal:int out:out", _triangle(_upper, inplace=False))
    _spec(f"aclnnInplace{_name}", "selfRef:inout diagonal:int", _triangle(_upper, inplace=True))


def _permute(b: Bound) -> int:
    x, dims = b.t("self"), b.call.attr_ints("dims")
    if sorted(d % max(x.ndim, 1) for d in dims) != list(range(x.ndim)):
        raise b.call.bad_attr(f"dims {dims} is not a permutation of {x.ndim} dimensions")
    b.store("out", np.transpose(x, [d % x.ndim for d in dims]))
    return 0


def _expand(b: Bound) -> int:
    x, size = b.t("self"), b.call.attr_ints("size")
    shape = [x.shape[i - (len(size) - x.ndim)] if s == -1 else s for i, s in enumerate(size)]
    try:
        value = np.broadcast_to(x, shape)
    except (ValueError, IndexError):
        raise b.call.bad_attr(f"size {size} does not expand {list(x.shape)}") from None
    b.store("out", value)
    return 0


_spec("aclnnPermute", "self:tensor dims:intarray out:out", _permute)
_spec("aclnnExpand", "self:tensor size:intarray out:out", _expand)

# -- selection ------------------------------------------------------------------------------------


def _s_where(b: Bound) -> int:
    cond, x, y = b.t("condition"), b.t("self"), b.t("other")
    try:
        np.broadcast_shapes(cond.shape, x.shape, y.shape)
    except ValueError:
        raise b.call.bad_input("condition, self and other do not broadcast") from None
    b.store("out", np.where(cond.astype(bool), x, y))
    return x.size


def _masked_fill_scalar(b: Bound) -> int:
    x = b.t("selfRef")
    b.store("selfRef", elementwise.masked_fill(b.call, x, b.t("mask"), b.call.attr_number("value")))
    return x.size


def _masked_fill_tensor(b: Bound) -> int:
    x = b.t("selfRef")
    b.store("selfRef", elementwise.masked_fill(b.call, x, b.t("mask"), _fill_tensor_value(b)))
    return x.size


_spec("aclnnSWhere", "condition:tensor self:tensor other:tensor out:out", _s_where)
_spec("aclnnInplaceMaskedFillScalar", "selfRef:inout mask:tensor value:scalar", _masked_fill_scalar)
_spec("aclnnInplaceMaskedFillTensor", "selfRef:inout mask:tensor value:tensor", _masked_fill_tensor)

# -- reductions -----------------------------------------------------------------------------------


def _reduce(name: str, dims_param: str, keep_param: str) -> Kernel:
    def kernel(b: Bound) -> int:
        x = b.t("self")
        dims = b.call.attr_ints(dims_param)
        if not dims:  # aclnn: an empty dim list reduces every dim
            dims = list(range(x.ndim))
        value = reductions.reduce(b.call, name, x, dims, b.call.attr_bool(keep_param))
        i, out = b.out("out")
        reductions.store_reduced(b.call, i, out, value)
        return x.size

    return kernel


_spec("aclnnReduceSum", "self:tensor dims:intarray keepDims:bool dtype:dtype out:out",
      _reduce("ReduceSum", "dims", "keepDims"))  # fmt: skip
_spec("aclnnMean", "self:tensor dim:intarray keepDim:bool dtype:dtype out:out",
      _reduce("ReduceMean", "dim", "keepDim"))  # fmt: skip


def _max(b: Bound) -> int:
    x = b.t("self")
    if x.size == 0:
        raise b.call.bad_input("max of an empty tensor")
    i, out = b.out("out")
    reductions.store_reduced(b.call, i, out, np.max(x))
    return x.size


def _max_dim(b: Bound) -> int:
    x = b.t("self")
    values, index = reductions.max_along(
        b.call, x, b.call.attr_int("dim"), b.call.attr_bool("keepdim"), "dim"
    )
    for name, value in (("out", values), ("indices", index)):
        i, out = b.out(name)
        reductions.store_reduced(b.call, i, out, value)
    return x.size


def _argmax(b: Bound) -> int:
    x = b.t("self")
    _, index = reductions.max_along(b.call, x, b.call.attr_int("dim"), b.call.attr_bool("keepdim"), "dim")
    i, out = b.out("out")
    reductions.store_reduced(b.call, i, out, index)
    return x.size


_spec("aclnnMax", "self:tensor out:out", _max)
_spec("aclnnMaxDim", "self:tensor dim:int keepdim:bool out:out indices:out", _max_dim)
_spec("aclnnArgMax", "self:tensor dim:int keepdim:bool out:out", _argmax)


def _bind(params: tuple[tuple[str, str], ...], kernel: Kernel) -> Callable[[Call], int]:
    def run(call: Call) -> int:
        return kernel(Bound(call, params))

    return run


ACLNN: dict[str, Callable[[Call], int]] = {
    name: _bind(params, kernel) for name, (params, kernel) in SPECS.items()
}
"""aclnn kernels by function name; each returns its flop count."""

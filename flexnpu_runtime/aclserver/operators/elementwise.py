"""Elementwise kernels: arithmetic, comparisons, activations, casts and selection, with numpy broadcasting.

Each op computes in float32 for float16 inputs (float32 and float64 stay as they are, integers as
integers where the op keeps them), then ``calls.store`` converts into the output. GELU is the exact,
erf-based one (torch's default); ``erf`` is computed in float64 with a rational approximation whose
error is below 1.2e-7 (Numerical Recipes' ``erfc`` by Chebyshev fitting).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flexnpu_runtime.aclserver.operators.calls import (
    Array,
    Call,
    compute_dtype,
    dtype_name,
    numpy_dtype,
    store,
)

__all__ = ["ACLOP", "binary", "erf", "gelu", "sigmoid", "unary"]


def erf(x: Array) -> Array:
    """erf(x) in float64, |error| < 1.2e-7."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    poly = -z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 + t * (
        -0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 + t * (
            -0.82215223 + t * 0.17087277))))))))  # fmt: skip
    erfc = t * np.exp(poly)
    return np.where(x >= 0, 1.0 - erfc, erfc - 1.0)


def sigmoid(x: Array) -> Array:
    with np.errstate(over="ignore"):
        result: Array = 1.0 / (1.0 + np.exp(-x))
    return result


def gelu(x: Array, *, tanh: bool = False) -> Array:
    """GELU: exact (erf) by default, or its tanh approximation."""
    if tanh:
        inner: Array = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x * x * x)
        return (0.5 * x * (1.0 + np.tanh(inner))).astype(x.dtype)
    return (0.5 * x * (1.0 + erf(x * np.sqrt(0.5)))).astype(x.dtype)


def _rsqrt(x: Array) -> Array:
    with np.errstate(divide="ignore"):
        return 1.0 / np.sqrt(x)


def _reciprocal(x: Array) -> Array:
    with np.errstate(divide="ignore"):
        return 1.0 / x


UNARY: dict[str, Callable[[Array], Array]] = {
    "Neg": np.negative, "Exp": np.exp, "Log": np.log, "Sqrt": np.sqrt, "Rsqrt": _rsqrt, "Abs": np.abs,
    "Square": np.square, "Reciprocal": _reciprocal, "Tanh": np.tanh, "Sigmoid": sigmoid,
    "Relu": lambda x: np.maximum(x, 0).astype(x.dtype), "Gelu": gelu, "Erf": lambda x: erf(x).astype(x.dtype),
    "Sin": np.sin, "Cos": np.cos, "Floor": np.floor, "Ceil": np.ceil, "Sign": np.sign,
    "LogicalNot": np.logical_not, "Identity": lambda x: x,
}  # fmt: skip
"""Unary kernels by aclop name (each on the computed dtype)."""
FLOAT_UNARY = frozenset(
    {"Exp", "Log", "Sqrt", "Rsqrt", "Reciprocal", "Tanh", "Sigmoid", "Gelu", "Erf", "Sin", "Cos"}
)
"""Those that need a float input."""


def _true_divide(a: Array, b: Array) -> Array:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.true_divide(a, b)


def _floor_divide(a: Array, b: Array) -> Array:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.floor_divide(a, b)


BINARY: dict[str, Callable[[Array, Array], Array]] = {
    "Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "RealDiv": _true_divide, "Div": _true_divide,
    "FloorDiv": _floor_divide, "Maximum": np.maximum, "Minimum": np.minimum, "Pow": np.power,
    "Equal": np.equal, "NotEqual": np.not_equal, "Less": np.less, "LessEqual": np.less_equal,
    "Greater": np.greater, "GreaterEqual": np.greater_equal, "LogicalAnd": np.logical_and,
    "LogicalOr": np.logical_or,
}  # fmt: skip
"""Binary kernels by aclop name (broadcasting)."""


def unary(op: str, x: Array, *, call: Call) -> Array:
    """``op`` of ``x``, computed in float32 for float16 (and refused for non-floats where it needs floats)."""
    if op in FLOAT_UNARY:
        call.float_dtype(x, "input 0 (x)")
    value = x.astype(compute_dtype(x), copy=False)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return UNARY[op](value)


def binary(op: str, a: Array, b: Array, *, call: Call) -> Array:
    """``op`` of ``a`` and ``b`` broadcast together, or an error naming the shapes."""
    try:
        shape = np.broadcast_shapes(a.shape, b.shape)
    except ValueError:
        raise call.bad_input(f"input shapes {list(a.shape)} and {list(b.shape)} do not broadcast") from None
    del shape
    dtype = compute_dtype(a, b)
    with np.errstate(over="ignore", invalid="ignore"):
        return BINARY[op](a.astype(dtype, copy=False), b.astype(dtype, copy=False))


def _unary_kernel(name: str) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        x = call.input(0, "x")
        out = call.output(0, "y")
        store(call.op, 0, out, unary(name, x, call=call))
        return out.size * (8 if name in FLOAT_UNARY else 1)

    return kernel


def _binary_kernel(name: str) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        out = call.output(0, "y")
        store(call.op, 0, out, binary(name, call.input(0, "x1"), call.input(1, "x2"), call=call))
        return out.size

    return kernel


def _axpy_v2(call: Call) -> int:
    """AxpyV2(x1, x2, alpha): x1 + alpha * x2 (torch's ``add`` with ``alpha``)."""
    x1, x2, alpha = call.input(0, "x1"), call.input(1, "x2"), call.scalar(2, "alpha")
    out = call.output(0, "y")
    store(call.op, 0, out, binary("Add", x1, binary("Mul", x2, alpha, call=call), call=call))
    return 2 * out.size


def _swish(call: Call) -> int:
    """Swish(x), attribute ``scale``: x * sigmoid(scale * x) (torch's SiLU with scale 1)."""
    x = call.floats(0, "x")
    scale = call.attr_float("scale", 1.0)
    value = x.astype(compute_dtype(x))
    out = call.output(0, "y")
    store(call.op, 0, out, value * sigmoid(value * scale))
    return 8 * out.size


def _cast(call: Call) -> int:
    """Cast(x), attribute ``dst_type`` (an aclDataType): the output must have that dtype."""
    x = call.input(0, "x")
    out = call.output(0, "y")
    dst = call.attr_int("dst_type")
    wanted = numpy_dtype(dst, op=call.op, field="attribute 'dst_type'")
    if out.dtype != wanted:
        raise call.bad_attr(
            f"attribute 'dst_type' is {dtype_name(wanted)}, output 0 is {dtype_name(out.dtype)}"
        )
    store(call.op, 0, out, x)
    return out.size


def _select(call: Call) -> int:
    """Select(condition, x1, x2): x1 where condition, else x2 (torch's ``where``)."""
    cond, x1, x2 = call.input(0, "condition"), call.input(1, "x1"), call.input(2, "x2")
    try:
        np.broadcast_shapes(cond.shape, x1.shape, x2.shape)
    except ValueError:
        raise call.bad_input(
            f"shapes {list(cond.shape)}, {list(x1.shape)}, {list(x2.shape)} do not broadcast"
        ) from None
    out = call.output(0, "y")
    store(call.op, 0, out, np.where(cond.astype(bool), x1, x2))
    return out.size


def masked_fill(call: Call, x: Array, mask: Array, value: Array | float | int | bool) -> Array:
    """``x`` with ``value`` where ``mask`` (broadcast to ``x``'s shape)."""
    try:
        mask_b = np.broadcast_to(mask.astype(bool), x.shape)
    except ValueError:
        raise call.bad_input(
            f"mask of shape {list(mask.shape)} does not broadcast to {list(x.shape)}"
        ) from None
    return np.where(mask_b, np.asarray(value).astype(x.dtype), x)


def _masked_fill(call: Call) -> int:
    """MaskedFill(x, mask, value)."""
    x, mask, value = call.input(0, "x"), call.input(1, "mask"), call.scalar(2, "value")
    out = call.output(0, "y")
    store(call.op, 0, out, masked_fill(call, x, mask, value))
    return out.size


def _clip(call: Call) -> int:
    """ClipByValue/ClipByValueV2(x, clip_value_min, clip_value_max): torch's clamp."""
    x, low, high = call.input(0, "x"), call.input(1, "clip_value_min"), call.input(2, "clip_value_max")
    dtype = compute_dtype(x, low, high)
    value = np.minimum(np.maximum(x.astype(dtype), low.astype(dtype)), high.astype(dtype))
    store(call.op, 0, call.output(0, "y"), value)
    return 2 * x.size


ACLOP: dict[str, Callable[[Call], int]] = {
    "ClipByValue": _clip,
    "ClipByValueV2": _clip,
    **{name: _unary_kernel(name) for name in UNARY},
    **{name: _binary_kernel(name) for name in BINARY},
    "AxpyV2": _axpy_v2,
    "Swish": _swish,
    "Cast": _cast,
    "Select": _select,
    "MaskedFill": _masked_fill,
}
"""aclop kernels of this module; each returns its flop count."""

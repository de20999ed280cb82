"""Normalisations: SoftmaxV2/LogSoftmaxV2 (attribute ``axes``), LayerNorm (outputs y, mean, variance;
attributes ``begin_norm_axis``, ``begin_params_axis``, ``epsilon``) and RmsNorm (outputs y, rstd; attribute
``epsilon``). Statistics are computed in float64 and results written in the output's dtype; the
mean/variance/rstd outputs take the reduced axes kept as 1 (CANN's layout) or any shape of as many elements.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flexnpu_runtime.aclserver.operators.calls import Array, Call, store

__all__ = ["ACLOP", "layer_norm", "log_softmax", "rms_norm", "softmax"]


def softmax(x: Array, axes: tuple[int, ...]) -> Array:
    value = x.astype(np.float64)
    shifted = value - np.max(value, axis=axes, keepdims=True)
    e = np.exp(shifted)
    result: Array = e / np.sum(e, axis=axes, keepdims=True)
    return result


def log_softmax(x: Array, axes: tuple[int, ...]) -> Array:
    value = x.astype(np.float64)
    shifted = value - np.max(value, axis=axes, keepdims=True)
    result: Array = shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True))
    return result


def layer_norm(
    x: Array, begin: int, weight: Array | None, bias: Array | None, eps: float
) -> tuple[Array, Array, Array]:
    """(y, mean, rstd) over the axes from ``begin`` on; mean and rstd keep those axes as 1."""
    value = x.astype(np.float64)
    axes = tuple(range(begin, x.ndim))
    mean = np.mean(value, axis=axes, keepdims=True)
    var = np.mean(np.square(value - mean), axis=axes, keepdims=True)
    rstd = 1.0 / np.sqrt(var + eps)
    y = (value - mean) * rstd
    if weight is not None:
        y = y * weight.astype(np.float64)
    if bias is not None:
        y = y + bias.astype(np.float64)
    return y, mean, rstd


def rms_norm(x: Array, gamma: Array, eps: float, begin: int) -> tuple[Array, Array]:
    """(y, rstd) over the axes from ``begin`` on (those of ``gamma``)."""
    value = x.astype(np.float64)
    axes = tuple(range(begin, x.ndim))
    rstd = 1.0 / np.sqrt(np.mean(np.square(value), axis=axes, keepdims=True) + eps)
    return value * rstd * gamma.astype(np.float64), rstd


def _axes(call: Call, x: Array) -> tuple[int, ...]:
    axes = call.attr_ints("axes", [-1])
    if not axes:
        raise call.bad_attr("attribute 'axes' is empty")
    return tuple(sorted({call.axis(a, x.ndim, "attribute 'axes'") for a in axes}))


def _softmax_kernel(fn: Callable[[Array, tuple[int, ...]], Array]) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        x = call.floats(0, "x")
        out = call.output(0, "y")
        store(call.op, 0, out, fn(x, _axes(call, x)) if x.ndim else np.zeros_like(x))
        return 8 * x.size

    return kernel


def store_stat(call: Call, index: int, out: Array, value: Array) -> None:
    """A statistic (mean, variance, rstd) into an output of as many elements, whatever its shape."""
    if out.size != value.size:
        raise call.bad_input(f"output {index} has {out.size} elements, the statistic {value.size}")
    store(call.op, index, out, value.reshape(out.shape))


def _layer_norm(call: Call) -> int:
    """LayerNorm(x, gamma, beta) -> y, mean, variance."""
    x = call.floats(0, "x")
    gamma, beta = call.input(1, "gamma"), call.input(2, "beta")
    begin = call.axis(call.attr_int("begin_norm_axis"), x.ndim, "attribute 'begin_norm_axis'")
    if gamma.shape != x.shape[begin:] or beta.shape != x.shape[begin:]:
        raise call.bad_input(
            f"gamma {list(gamma.shape)} and beta {list(beta.shape)} must have shape {list(x.shape[begin:])}"
        )
    eps = call.attr_float("epsilon", 1e-7)
    y, mean, rstd = layer_norm(x, begin, gamma, beta, eps)
    store(call.op, 0, call.output(0, "y"), y)
    if len(call.outputs) > 1:
        store_stat(call, 1, call.output(1, "mean"), mean)
    if len(call.outputs) > 2:
        store_stat(call, 2, call.output(2, "variance"), 1.0 / np.square(rstd) - eps)
    return 8 * x.size


def _rms_norm(call: Call) -> int:
    """RmsNorm(x, gamma) -> y, rstd."""
    x = call.floats(0, "x")
    gamma = call.input(1, "gamma")
    begin = x.ndim - gamma.ndim
    if begin < 0 or gamma.shape != x.shape[begin:]:
        raise call.bad_input(f"gamma {list(gamma.shape)} must be the trailing dims of x {list(x.shape)}")
    y, rstd = rms_norm(x, gamma, call.attr_float("epsilon", 1e-6), begin)
    store(call.op, 0, call.output(0, "y"), y)
    if len(call.outputs) > 1:
        store_stat(call, 1, call.output(1, "rstd"), rstd)
    return 6 * x.size


ACLOP: dict[str, Callable[[Call], int]] = {
    "SoftmaxV2": _softmax_kernel(softmax),
    "LogSoftmaxV2": _softmax_kernel(log_softmax),
    "LayerNorm": _layer_norm,
    "RmsNorm": _rms_norm,
}
"""aclop kernels of this module; each returns its flop count."""

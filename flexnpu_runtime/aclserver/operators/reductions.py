"""Reductions: ReduceSum/ReduceMean/ReduceMax/ReduceMin (input ``axes`` on the host, attribute
``keep_dims``; empty axes reduce nothing, as CANN's TensorFlow-compatible ops), ArgMaxV2 (input
``dimension``) and ArgMaxWithValue (outputs indices, values; attributes ``dimension``, ``keep_dims``).
Sums and means of floats accumulate in float64 and are written in the output's dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flexnpu_runtime.aclserver.operators.calls import Array, Call, store

__all__ = ["ACLOP", "max_along", "reduce", "store_reduced"]

REDUCERS: dict[str, Callable[..., Array]] = {
    "ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max, "ReduceMin": np.min,
}  # fmt: skip


def reduce(call: Call, name: str, x: Array, axes: list[int], keep: bool) -> Array:
    """``x`` reduced by ``REDUCERS[name]`` over ``axes`` (checked against ``x``'s dims)."""
    dims = tuple(sorted({call.axis(a, x.ndim, "axes") for a in axes})) if x.ndim else ()
    if not dims:
        return x
    if name in ("ReduceMax", "ReduceMin") and any(x.shape[d] == 0 for d in dims):
        raise call.bad_input(f"cannot take {name[6:].lower()} over an empty dimension of {list(x.shape)}")
    value = x.astype(np.float64) if name in ("ReduceSum", "ReduceMean") and x.dtype.kind == "f" else x
    if name == "ReduceMean" and x.dtype.kind != "f":
        value = x.astype(np.float64)
    result: Array = REDUCERS[name](value, axis=dims, keepdims=keep)
    return result


def store_reduced(call: Call, index: int, out: Array, value: Array) -> None:
    """A reduction into its output: with or without the kept dims, as long as the elements match."""
    if out.size != np.size(value):
        raise call.bad_input(
            f"output {index} has shape {list(out.shape)}, the result {list(np.shape(value))}"
        )
    store(call.op, index, out, np.reshape(value, out.shape))


def _reduce_kernel(name: str) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        x = call.input(0, "x")
        value = reduce(call, name, x, call.ints(1, "axes"), call.attr_bool("keep_dims", False))
        store_reduced(call, 0, call.output(0, "y"), value)
        return x.size

    return kernel


def _argmax_v2(call: Call) -> int:
    """ArgMaxV2(x, dimension): the index of the first maximum along ``dimension``."""
    x = call.input(0, "x")
    axis = call.axis(call.one_int(1, "dimension"), x.ndim, "input 1 (dimension)")
    if x.ndim and x.shape[axis] == 0:
        raise call.bad_input("cannot take argmax over an empty dimension")
    value = np.argmax(x, axis=axis, keepdims=call.attr_bool("keep_dims", False)) if x.ndim else np.int64(0)
    store_reduced(call, 0, call.output(0, "y"), np.asarray(value))
    return x.size


def max_along(call: Call, x: Array, dim: int, keep: bool, field: str) -> tuple[Array, Array]:
    """(values, indices) of the first maximum along ``dim`` (checked: present and not empty)."""
    axis = call.axis(dim, x.ndim, field)
    if x.ndim == 0 or x.shape[axis] == 0:
        raise call.bad_input("cannot take the maximum over an empty or missing dimension")
    index = np.argmax(x, axis=axis, keepdims=True)
    values = np.take_along_axis(x, index, axis=axis)
    if not keep:
        index, values = np.squeeze(index, axis=axis), np.squeeze(values, axis=axis)
    return values, index


def _argmax_with_value(call: Call) -> int:
    """ArgMaxWithValue(x) -> indices, values along attribute ``dimension``."""
    x = call.input(0, "x")
    keep = call.attr_bool("keep_dims", False)
    values, index = max_along(call, x, call.attr_int("dimension"), keep, "attribute 'dimension'")
    store_reduced(call, 0, call.output(0, "indice"), index)
    store_reduced(call, 1, call.output(1, "values"), values)
    return x.size


def _cumsum(call: Call) -> int:
    """Cumsum(x, axis), attributes ``exclusive`` and ``reverse``."""
    x = call.input(0, "x")
    axis = call.axis(call.one_int(1, "axis"), x.ndim, "input 1 (axis)")
    value = x.astype(np.float64) if x.dtype.kind == "f" else x
    if x.ndim == 0:
        store_reduced(call, 0, call.output(0, "y"), value)
        return 1
    if call.attr_bool("reverse", False):
        value = np.flip(value, axis)
    total = np.cumsum(value, axis=axis)
    if call.attr_bool("exclusive", False):
        total = total - value
    if call.attr_bool("reverse", False):
        total = np.flip(total, axis)
    store(call.op, 0, call.output(0, "y"), total)
    return x.size


def _top_k(call: Call) -> int:
    """TopKV2(x, k) -> values, indices along attribute ``dim``, attributes ``largest`` and ``sorted``; ties
    keep the lower index first."""
    x = call.input(0, "x")
    axis = call.axis(call.attr_int("dim", -1), x.ndim, "attribute 'dim'")
    n = x.shape[axis] if x.ndim else 1
    k = call.one_int(1, "k")
    if not 0 <= k <= n:
        raise call.bad_input(f"k {k} is outside [0, {n}]")
    keys = -x if call.attr_bool("largest", True) else x
    order = np.argsort(keys, axis=axis, kind="stable") if x.ndim else np.zeros((), np.int64)
    index = np.take(order, np.arange(k), axis=axis) if x.ndim else order
    store(call.op, 0, call.output(0, "values"), np.take_along_axis(x, index, axis=axis) if x.ndim else x)
    store(call.op, 1, call.output(1, "indices"), index)
    return x.size * max(1, int(np.log2(max(n, 2))))


def _reduce_mean_d(call: Call) -> int:
    """ReduceMeanD(x), attributes ``axes`` and ``keep_dims``."""
    x = call.input(0, "x")
    value = reduce(call, "ReduceMean", x, call.attr_ints("axes"), call.attr_bool("keep_dims", False))
    store_reduced(call, 0, call.output(0, "y"), value)
    return x.size


def _deviation(*, std: bool | None) -> Callable[[Call], int]:
    """ReduceStdV2Update(x, mean; ``if_std``) and ReduceStdWithMean(x, mean; the std): the variance (or its root)
    over attribute ``dim`` about the given mean (broadcast to x), divided by n - ``correction`` (1 when
    ``unbiased`` and no correction is given, else 0)."""

    def kernel(call: Call) -> int:
        x, mean = call.floats(0, "x"), call.input(1, "mean")
        dims = tuple(
            sorted({call.axis(d, x.ndim, "attribute 'dim'") for d in call.attr_ints("dim")})
        ) or tuple(range(x.ndim))
        try:
            centred = x.astype(np.float64) - np.broadcast_to(mean, x.shape)
        except ValueError:
            raise call.bad_input(f"mean {list(mean.shape)} does not broadcast to x {list(x.shape)}") from None
        n = int(np.prod([x.shape[d] for d in dims], dtype=np.int64))
        correction = call.attr_int("correction", 1 if call.attr_bool("unbiased", True) else 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            var = np.sum(centred * centred, axis=dims, keepdims=call.attr_bool("keepdim", False)) / max(
                n - correction, 0
            )
        root = call.attr_bool("if_std", False) if std is None else std
        store_reduced(call, 0, call.output(0, "y"), np.sqrt(var) if root else var)
        return 3 * x.size

    return kernel


ACLOP: dict[str, Callable[[Call], int]] = {
    "ReduceMeanD": _reduce_mean_d,
    "ReduceStdV2Update": _deviation(std=None),
    "ReduceStdWithMean": _deviation(std=True),
    "Cumsum": _cumsum,
    "TopKV2": _top_k,
    **{name: _reduce_kernel(name) for name in REDUCERS},
    "ArgMaxV2": _argmax_v2,
    "ArgMaxWithValue": _argmax_with_value,
}
"""aclop kernels of this module; each returns its flop count."""

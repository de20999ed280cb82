"""Tensors made from values: Fill (input ``dims`` on the host, a ``value``), OnesLike, ZerosLike and
Range (inputs ``start``, ``limit``, ``delta``; element i is ``start + i·delta``, computed in float64)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from flexnpu_runtime.aclserver.operators.calls import Array, Call, store

__all__ = ["ACLOP", "arange"]


def _fill(call: Call) -> int:
    """Fill(dims, value) -> y of shape ``dims`` (a 0-d y comes with dims [1]: any shape of as many elements)."""
    dims, value = call.ints(0, "dims"), call.scalar(1, "value")
    out = call.output(0, "y")
    if list(out.shape) != dims and (any(d < 0 for d in dims) or math.prod(dims) != out.size):
        raise call.bad_input(f"input 0 (dims) {dims} does not fit output 0's shape {list(out.shape)}")
    store(call.op, 0, out, np.broadcast_to(value, out.shape))
    return 0


def _like(fill: int) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        x = call.input(0, "x")
        out = call.output(0, "y")
        store(call.op, 0, out, np.full(x.shape, fill))
        return 0

    return kernel


def arange(call: Call, start: float, limit: float, delta: float, out: Array) -> None:
    """``out`` (1-d) := start, start + delta, …, checking that its length is ceil((limit - start) / delta)."""
    if delta == 0 or not all(math.isfinite(v) for v in (start, limit, delta)):
        raise call.bad_input(f"start {start}, limit {limit}, delta {delta} do not make a range")
    n = max(0, math.ceil((limit - start) / delta))
    if out.ndim != 1 or out.shape[0] != n:
        raise call.bad_input(f"the range has {n} elements, output 0 has shape {list(out.shape)}")
    store(call.op, 0, out, start + np.arange(n, dtype=np.float64) * delta)


def _range(call: Call) -> int:
    """Range(start, limit, delta) -> y."""
    start, limit, delta = (float(call.scalar(i, name)) for i, name in enumerate(("start", "limit", "delta")))
    arange(call, start, limit, delta, call.output(0, "y"))
    return 0


ACLOP: dict[str, Callable[[Call], int]] = {
    "Fill": _fill,
    "OnesLike": _like(1),
    "ZerosLike": _like(0),
    "Range": _range,
}
"""aclop kernels of this module (0 flops: they only write)."""

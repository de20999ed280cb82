"""Matrix products: MatMul/MatMulV2 (2-d, attributes ``transpose_x1``/``transpose_x2``) and
BatchMatMul/BatchMatMulV2 (batched, broadcast batch dims, attributes ``adj_x1``/``adj_x2``), each with an
optional ``bias`` input; float16 is multiplied in float32, as the cube unit accumulates.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from flexnpu_runtime.aclserver.operators.calls import Array, Call, compute_dtype, store

__all__ = ["ACLOP", "matmul"]


def matmul(call: Call, a: Array, b: Array, *, batched: bool) -> tuple[Array, int]:
    """``a @ b`` (2-d, or batched with broadcast batch dims) and its flop count, or an error naming the shapes."""
    if a.dtype.kind not in "fiu" or b.dtype.kind not in "fiu":
        raise call.bad_input(f"dtypes {a.dtype.name} and {b.dtype.name} cannot be multiplied")
    if not batched and (a.ndim != 2 or b.ndim != 2):
        raise call.bad_input(f"inputs must be 2-d, they are {list(a.shape)} and {list(b.shape)}")
    if a.ndim < 1 or b.ndim < 1:
        raise call.bad_input("inputs must have at least one dimension")
    k_a = a.shape[-1]
    k_b = b.shape[-2] if b.ndim >= 2 else b.shape[0]
    if k_a != k_b:
        raise call.bad_input(f"shapes {list(a.shape)} and {list(b.shape)} do not match for a matrix product")
    try:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise call.bad_input(f"batch dims of {list(a.shape)} and {list(b.shape)} do not broadcast") from None
    dtype = compute_dtype(a, b)
    value = np.matmul(a.astype(dtype, copy=False), b.astype(dtype, copy=False))
    m = a.shape[-2] if a.ndim >= 2 else 1
    n = b.shape[-1] if b.ndim >= 2 else 1
    return value, 2 * int(np.prod(batch, dtype=np.int64)) * m * n * k_a


def _kernel(first: str, second: str, *, batched: bool) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        a, b = call.input(0, "x1"), call.input(1, "x2")
        if call.attr_bool(first, False):
            a = np.swapaxes(a, -1, -2)
        if call.attr_bool(second, False):
            b = np.swapaxes(b, -1, -2)
        value, flops = matmul(call, a, b, batched=batched)
        bias = call.optional(2, "bias")
        if bias is not None:
            try:
                value = value + bias.astype(value.dtype)
            except ValueError:
                raise call.bad_input(f"bias of shape {list(bias.shape)} does not broadcast") from None
        store(call.op, 0, call.output(0, "y"), value)
        return flops

    return kernel


ACLOP: dict[str, Callable[[Call], int]] = {
    "MatMul": _kernel("transpose_x1", "transpose_x2", batched=False),
    "MatMulV2": _kernel("transpose_x1", "transpose_x2", batched=False),
    "BatchMatMul": _kernel("adj_x1", "adj_x2", batched=True),
    "BatchMatMulV2": _kernel("adj_x1", "adj_x2", batched=True),
}
"""aclop kernels of this module; each returns its flop count."""

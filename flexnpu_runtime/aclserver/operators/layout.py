"""Copies and re-layouts: strided views (ViewCopy, AsStrided), Transpose, ConcatD, Pack, StridedSlice,
StridedSliceD, Slice, GatherV2 (torch's embedding and index_select), Triu/Tril, BroadcastTo and Tile.

ViewCopy and AsStrided address a tensor's storage by size, stride and offset in elements, as torch does:
their tensor inputs arrive as the whole contiguous buffer, and every element a view reaches is checked
to lie inside it before anything is read or written.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.lib.stride_tricks import as_strided

from flexnpu_runtime.aclserver.operators.calls import Array, Call, flat_view, store

__all__ = ["ACLOP", "concat", "gather", "strided_view"]


def strided_view(
    call: Call, buffer: Array, size: list[int], stride: list[int], *, offset: int, field: str
) -> Array:
    """The view of ``buffer``'s elements with ``size``, ``stride`` and ``offset`` (in elements), after checking
    that it stays inside ``buffer``."""
    flat = flat_view(buffer, op=call.op, field=field)
    if len(size) != len(stride):
        raise call.bad_input(f"{field}: size {size} and stride {stride} differ in length")
    if any(n < 0 for n in size) or any(s < 0 for s in stride) or offset < 0:
        raise call.bad_input(f"{field}: negative size, stride or offset ({size}, {stride}, {offset})")
    if 0 in size:
        return np.empty(size, dtype=buffer.dtype)
    last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
    if last >= flat.size:
        raise call.bad_input(
            f"{field}: the view (size {size}, stride {stride}, offset {offset}) reaches element {last} "
            f"of a buffer of {flat.size}"
        )
    item = flat.dtype.itemsize
    return as_strided(flat[offset:], shape=tuple(size), strides=tuple(s * item for s in stride))


def _operand_view(call: Call, buffer: Array, first: int, name: str) -> Array:
    """The view of ``buffer`` that inputs ``first`` … ``first + 2`` (size, stride, offset) describe."""
    size, stride = call.ints(first, f"{name}_size"), call.ints(first + 1, f"{name}_stride")
    return strided_view(
        call, buffer, size, stride, offset=call.one_int(first + 2, f"{name}_offset"), field=name
    )


def _view_copy(call: Call) -> int:
    """ViewCopy(dst, dst_size, dst_stride, dst_offset, src, src_size, src_stride, src_offset) -> dst."""
    target = _operand_view(call, call.output(0, "dst"), 1, "dst")
    source = _operand_view(call, call.input(4, "src"), 5, "src")
    try:
        value = np.broadcast_to(source, target.shape)
    except ValueError:
        raise call.bad_input(
            f"src view {list(source.shape)} does not fit dst view {list(target.shape)}"
        ) from None
    store(call.op, 0, target, value.copy())
    return 0


def _as_strided(call: Call) -> int:
    """AsStrided(x, size, stride, storage_offset) -> y."""
    x = call.input(0, "x")
    size, stride = call.ints(1, "size"), call.ints(2, "stride")
    view = strided_view(call, x, size, stride, offset=call.one_int(3, "storage_offset"), field="x")
    store(call.op, 0, call.output(0, "y"), view)
    return 0


def _transpose(call: Call) -> int:
    """Transpose(x, perm)."""
    x = call.input(0, "x")
    perm = call.ints(1, "perm")
    if sorted(perm) != list(range(x.ndim)):
        raise call.bad_input(f"input 1 (perm) {perm} is not a permutation of {x.ndim} dimensions")
    store(call.op, 0, call.output(0, "y"), np.transpose(x, perm))
    return 0


def concat(call: Call, arrays: list[Array], axis: int) -> Array:
    """``arrays`` joined along ``axis`` (checked), in the dtype numpy promotes them to."""
    if not arrays:
        raise call.bad_input("no tensors to concatenate")
    ndim = arrays[0].ndim
    dim = call.axis(axis, ndim, "concat dim")
    for i, a in enumerate(arrays):
        if (
            a.ndim != ndim
            or a.shape[:dim] + a.shape[dim + 1 :] != arrays[0].shape[:dim] + arrays[0].shape[dim + 1 :]
        ):
            raise call.bad_input(f"input {i} has shape {list(a.shape)}, input 0 {list(arrays[0].shape)}")
    return np.concatenate(arrays, axis=dim)


def _inputs(call: Call, count_attr: str) -> list[Array]:
    n = call.attr_int(count_attr, len(call.inputs))
    if n != len(call.inputs) or n < 1:
        raise call.bad_attr(f"attribute {count_attr!r} is {n}, the op has {len(call.inputs)} inputs")
    return [call.input(i, f"x{i}") for i in range(n)]


def _concat_d(call: Call) -> int:
    """ConcatD(x0 … xN-1), attributes ``N`` and ``concat_dim``."""
    store(call.op, 0, call.output(0, "y"), concat(call, _inputs(call, "N"), call.attr_int("concat_dim")))
    return 0


def _pack(call: Call) -> int:
    """Pack(x0 … xN-1), attributes ``N`` and ``axis``: torch's stack."""
    arrays = _inputs(call, "N")
    if any(a.shape != arrays[0].shape for a in arrays):
        raise call.bad_input(f"inputs differ in shape: {[list(a.shape) for a in arrays]}")
    axis = call.axis(call.attr_int("axis", 0), arrays[0].ndim + 1, "attribute 'axis'")
    store(call.op, 0, call.output(0, "y"), np.stack(arrays, axis=axis))
    return 0


def strided_slice(
    call: Call, x: Array, begin: list[int], end: list[int], *, strides: list[int], masks: dict[str, int]
) -> Array:
    """TensorFlow's strided slice: ``begin``/``end``/``strides`` per spec entry, with the five bit masks."""
    if not len(begin) == len(end) == len(strides):
        raise call.bad_input(f"begin {begin}, end {end} and strides {strides} differ in length")
    index: list[object] = []
    for i, (b, e, s) in enumerate(zip(begin, end, strides, strict=True)):
        bit = 1 << i
        if masks["ellipsis_mask"] & bit:
            index.append(Ellipsis)
        elif masks["new_axis_mask"] & bit:
            index.append(None)
        elif masks["shrink_axis_mask"] & bit:
            index.append(b)
        else:
            if s == 0:
                raise call.bad_input(f"stride {i} is 0")
            index.append(
                slice(None if masks["begin_mask"] & bit else b, None if masks["end_mask"] & bit else e, s)
            )
    try:
        result: Array = x[tuple(index)]  # type: ignore[arg-type]
        return result
    except IndexError as exc:
        raise call.bad_input(f"slice out of range: {exc}") from None


MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def _strided_slice(call: Call) -> int:
    """StridedSlice(x, begin, end, strides), the five mask attributes."""
    masks = {m: call.attr_int(m, 0) for m in MASKS}
    value = strided_slice(
        call,
        call.input(0, "x"),
        call.ints(1, "begin"),
        call.ints(2, "end"),
        strides=call.ints(3, "strides"),
        masks=masks,
    )
    store(call.op, 0, call.output(0, "y"), value)
    return 0


def _strided_slice_d(call: Call) -> int:
    """StridedSliceD(x), attributes ``begin``, ``end``, ``strides`` and the five masks."""
    masks = {m: call.attr_int(m, 0) for m in MASKS}
    begin, end = call.attr_ints("begin"), call.attr_ints("end")
    value = strided_slice(
        call, call.input(0, "x"), begin, end, strides=call.attr_ints("strides", [1] * len(begin)), masks=masks
    )
    store(call.op, 0, call.output(0, "y"), value)
    return 0


def _slice(call: Call) -> int:
    """Slice(x, offsets, size): size -1 reaches the end of its dimension."""
    x = call.input(0, "x")
    offsets, size = call.ints(1, "offsets"), call.ints(2, "size")
    if len(offsets) != x.ndim or len(size) != x.ndim:
        raise call.bad_input(f"offsets {offsets} and size {size} must have {x.ndim} entries")
    index = []
    for d, (o, n) in enumerate(zip(offsets, size, strict=True)):
        stop = x.shape[d] if n == -1 else o + n
        if o < 0 or n < -1 or stop > x.shape[d]:
            raise call.bad_input(f"dimension {d}: offset {o} size {n} is outside {x.shape[d]}")
        index.append(slice(o, stop))
    store(call.op, 0, call.output(0, "y"), x[tuple(index)])
    return 0


def gather(call: Call, x: Array, indices: Array, axis: int) -> Array:
    """``x``'s slices at ``indices`` along ``axis`` (negative indices count from the end; others are checked)."""
    if indices.dtype.kind not in "iu":
        raise call.bad_input(f"indices have dtype {indices.dtype.name}; integers are needed")
    dim = call.axis(axis, x.ndim, "axis")
    n = x.shape[dim] if x.ndim else 1
    if indices.size and (int(indices.min()) < -n or int(indices.max()) >= n):
        raise call.bad_input(f"an index is outside [{-n}, {n}) of dimension {dim}")
    return np.take(x, indices.astype(np.int64), axis=dim)


def _gather_v2(call: Call) -> int:
    """GatherV2(x, indices, axis), attribute ``batch_dims`` (0 only)."""
    if call.attr_int("batch_dims", 0) != 0:
        raise call.bad_attr("attribute 'batch_dims' other than 0 is not supported")
    axis = call.one_int(2, "axis")
    store(call.op, 0, call.output(0, "y"), gather(call, call.input(0, "x"), call.input(1, "indices"), axis))
    return 0


def _triangle(upper: bool) -> Callable[[Call], int]:
    def kernel(call: Call) -> int:
        x = call.input(0, "x")
        if x.ndim < 2:
            raise call.bad_input(f"input 0 (x) must have at least 2 dimensions, it has shape {list(x.shape)}")
        k = call.attr_int("diagonal", 0)
        store(call.op, 0, call.output(0, "y"), np.triu(x, k) if upper else np.tril(x, k))
        return 0

    return kernel


def _broadcast_to(call: Call) -> int:
    """BroadcastTo(x, shape)."""
    x, shape = call.input(0, "x"), call.ints(1, "shape")
    try:
        value = np.broadcast_to(x, shape)
    except ValueError:
        raise call.bad_input(f"shape {list(x.shape)} does not broadcast to {shape}") from None
    store(call.op, 0, call.output(0, "y"), value)
    return 0


def _tile(call: Call) -> int:
    """Tile(x, multiples)."""
    x, multiples = call.input(0, "x"), call.ints(1, "multiples")
    if len(multiples) < x.ndim or any(m < 0 for m in multiples):
        raise call.bad_input(f"multiples {multiples} do not fit {list(x.shape)}")
    store(call.op, 0, call.output(0, "y"), np.tile(x, multiples))
    return 0


def _index(call: Call) -> int:
    """Index(x, indexed_sizes, indexed_strides, indices0 …): torch's advanced indexing ``x[..., idx, ...]``;
    ``indexed_sizes`` has 1 for each dim an index tensor selects (in order), 0 for a dim taken whole."""
    x = call.input(0, "x")
    masks = call.ints(1, "indexed_sizes")
    if len(masks) > x.ndim or any(m not in (0, 1) for m in masks):
        raise call.bad_input(f"input 1 (indexed_sizes) {masks} does not fit {x.ndim} dims")
    indices = [call.input(3 + i, f"indices{i}") for i in range(len(call.inputs) - 3)]
    if sum(masks) != len(indices):
        raise call.bad_input(f"{sum(masks)} indexed dims but {len(indices)} index tensors")
    key: list[object] = []
    next_index = iter(indices)
    for d, m in enumerate(masks):
        if not m:
            key.append(slice(None))
            continue
        idx = next(next_index)
        if idx.dtype.kind not in "iub":
            raise call.bad_input(f"an index tensor has dtype {idx.dtype.name}")
        if (
            idx.dtype.kind in "iu"
            and idx.size
            and (int(idx.min()) < -x.shape[d] or int(idx.max()) >= x.shape[d])
        ):
            raise call.bad_input(f"an index is outside [{-x.shape[d]}, {x.shape[d]}) of dimension {d}")
        key.append(idx)
    try:
        value = x[tuple(key)]  # type: ignore[arg-type]
    except IndexError as exc:
        raise call.bad_input(f"indexing failed: {exc}") from None
    store(call.op, 0, call.output(0, "y"), value)
    return 0


def _reverse(call: Call) -> int:
    """ReverseV2(x, axis): torch's flip over the axes given."""
    x = call.input(0, "x")
    axes = tuple(sorted({call.axis(a, x.ndim, "input 1 (axis)") for a in call.ints(1, "axis")}))
    store(call.op, 0, call.output(0, "y"), np.flip(x, axes) if axes else x)
    return 0


def _repeat_interleave(call: Call) -> int:
    """RepeatInterleave(x, repeats), attribute ``axis``: each slice along ``axis`` repeated (one count, or one
    per slice)."""
    x = call.input(0, "x")
    repeats = call.ints(1, "repeats")
    axis = call.axis(call.attr_int("axis", 0), x.ndim, "attribute 'axis'")
    n = x.shape[axis] if x.ndim else 1
    if any(r < 0 for r in repeats) or len(repeats) not in (1, n):
        raise call.bad_input(f"input 1 (repeats) {repeats[:8]} does not fit {n} slices")
    store(
        call.op, 0, call.output(0, "y"), np.repeat(x, repeats if len(repeats) > 1 else repeats[0], axis=axis)
    )
    return 0


ACLOP: dict[str, Callable[[Call], int]] = {
    "Index": _index,
    "ReverseV2": _reverse,
    "RepeatInterleave": _repeat_interleave,
    "ViewCopy": _view_copy,
    "AsStrided": _as_strided,
    "Transpose": _transpose,
    "ConcatD": _concat_d,
    "Pack": _pack,
    "StridedSlice": _strided_slice,
    "StridedSliceD": _strided_slice_d,
    "Slice": _slice,
    "GatherV2": _gather_v2,
    "Triu": _triangle(upper=True),
    "Tril": _triangle(upper=False),
    "BroadcastTo": _broadcast_to,
    "Tile": _tile,
}
"""aclop kernels of this module (they move data and compute nothing: 0 flops)."""

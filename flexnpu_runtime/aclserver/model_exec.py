"""The emulated model compute: outputs from inputs, elementwise, exactly as docs/model-format.md says.

Pure computation over byte views (no I/O, no locks): every element is computed in double
precision from the inputs (and the weights, for ``ADD_WEIGHTS``), then converted to the output's
type — rounded toward zero and clamped to the type's range for integers, ``!= 0`` for booleans.
numpy is imported when the first model executes, so an aclserver that never runs a model stays
as small as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flexnpu_wire.modelfile import ModelFile, Op

if TYPE_CHECKING:
    import numpy as np

__all__ = ["NUMPY_TYPES", "run"]

NUMPY_TYPES = {0: "<f4", 1: "<f2", 2: "i1", 3: "<i4", 4: "u1", 6: "<i2", 7: "<u2", 8: "<u4", 9: "<i8", 10: "<u8",
               11: "<f8", 12: "?"}  # fmt: skip
"""aclDataType -> numpy dtype, little-endian (the format's DTYPE_SIZES, one entry each)."""


def run(
    model: ModelFile,
    inputs: list[memoryview],
    outputs: list[memoryview],
    weights: memoryview | None,
    *,
    batch: int = 0,
    hw: tuple[int, int] = (0, 0),
) -> int:
    """Compute every output of ``model`` into ``outputs``; return the output elements written."""
    import numpy

    np_: Any = numpy
    arrays = [
        _array(np_, view, t.data_type, t.elements(batch, hw))
        for view, t in zip(inputs, model.inputs, strict=True)
    ]
    written = 0
    for out, view in zip(model.outputs, outputs, strict=True):
        n = out.tensor.elements(batch, hw)
        a = arrays[out.a].astype(np_.float64)
        if out.op == Op.COPY:
            value = a
        elif out.op == Op.AFFINE:
            value = a * out.scale + out.bias
        elif out.op == Op.ADD:
            value = a + arrays[out.b].astype(np_.float64)
        elif out.op == Op.MUL:
            value = a * arrays[out.b].astype(np_.float64)
        else:  # ADD_WEIGHTS: the weights as the output's type, repeated over the elements
            dtype = np_.dtype(NUMPY_TYPES[out.tensor.data_type])
            assert weights is not None
            w = np_.frombuffer(weights, dtype=dtype, count=weights.nbytes // dtype.itemsize)
            value = a + np_.resize(w, n).astype(np_.float64)
        _store(np_, view, out.tensor.data_type, value)
        written += n
    return written


def _array(np_: Any, view: memoryview, data_type: int, count: int) -> np.ndarray[Any, Any]:
    array: np.ndarray[Any, Any] = np_.frombuffer(view, dtype=NUMPY_TYPES[data_type], count=count)
    return array


def _store(np_: Any, view: memoryview, data_type: int, value: np.ndarray[Any, Any]) -> None:
    dtype = np_.dtype(NUMPY_TYPES[data_type])
    target = np_.frombuffer(view, dtype=dtype, count=value.size)
    if dtype.kind == "b":
        target[:] = value != 0
    elif dtype.kind in "iu":
        info = np_.iinfo(dtype)
        target[:] = np_.clip(np_.trunc(np_.nan_to_num(value)), info.min, info.max).astype(dtype)
    else:
        target[:] = value.astype(dtype)

"""One op call as a kernel sees it: its arrays and attributes, read through checks that name the field.

A kernel never indexes ``inputs`` or ``attrs`` itself: ``Call.input(1, "x2")`` raises
``OperatorError(ACL_ERROR_OP_INPUT_NOT_MATCH, "MatMul: input 1 (x2) is missing")`` where a bare index
would raise ``IndexError``. ``store`` writes a result into an output (a view over device memory,
possibly strided) after checking its shape, converting to the output's dtype as CANN's kernels do
(floats to integers toward zero, anything to bool as ``!= 0``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from flexnpu_runtime.aclserver.operators.errors import (
    ACL_ERROR_OP_ATTR_NOT_MATCH,
    ACL_ERROR_OP_INPUT_NOT_MATCH,
    ACL_ERROR_OP_OUTPUT_NOT_MATCH,
    ACL_ERROR_UNSUPPORTED_DATA_TYPE,
    OperatorError,
)

__all__ = [
    "ACL_DTYPES",
    "BF16",
    "Array",
    "AttrValue",
    "Call",
    "compute_dtype",
    "dtype_name",
    "flat_view",
    "from_bf16",
    "numpy_dtype",
    "store",
    "to_bf16_bits",
]

Array = npt.NDArray[Any]
AttrValue = bool | int | float | str | list[bool] | list[int] | list[float] | list[str]

BF16: np.dtype[Any] = np.dtype([("bf16", "<u2")])
"""bfloat16 (``ACL_BF16`` = 27), which numpy lacks: its two bytes as a one-field structured dtype. A kernel
never sees it: ``Call`` hands bfloat16 operands over as float32 (exact) and ``store`` rounds results back to
the nearest even bfloat16."""
ACL_DTYPES: dict[int, str] = {0: "float32", 1: "float16", 2: "int8", 3: "int32", 4: "uint8", 6: "int16", 7: "uint16",
                              8: "uint32", 9: "int64", 10: "uint64", 11: "float64", 12: "bool", 27: "bf16"}  # fmt: skip
"""aclDataType numbers the kernels compute, and their numpy dtypes (``bf16``: ``BF16``)."""

FLOATS = frozenset({"float16", "float32", "float64"})
_MISSING: Any = object()


def numpy_dtype(acl: int, *, op: str, field: str) -> np.dtype[Any]:
    """The numpy dtype of an aclDataType number, or ``ACL_ERROR_UNSUPPORTED_DATA_TYPE`` naming the field."""
    name = ACL_DTYPES.get(acl)
    if name is None:
        raise OperatorError(
            ACL_ERROR_UNSUPPORTED_DATA_TYPE, f"{op}: {field}: aclDataType {acl} is not supported"
        )
    return BF16 if name == "bf16" else np.dtype(name)


def dtype_name(dtype: np.dtype[Any]) -> str:
    """A dtype's name for messages (``bfloat16`` for ``BF16``)."""
    return "bfloat16" if dtype == BF16 else dtype.name


def from_bf16(array: Array) -> Array:
    """A bfloat16 array as float32 (exact); any other array as it is."""
    if array.dtype != BF16:
        return array
    bits = array.view(np.uint16).astype(np.uint32) << 16
    result: Array = bits.view(np.float32)
    return result


def to_bf16_bits(value: Array) -> Array:
    """``value`` rounded to the nearest even bfloat16, as the uint16 bits (a NaN stays a quiet NaN)."""
    f32 = np.asarray(value, dtype=np.float32)
    bits = np.ascontiguousarray(f32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    result: Array = np.where(np.isnan(f32), ((bits >> 16) | 0x0040).astype(np.uint16), rounded)
    return result


def compute_dtype(*arrays: Array) -> np.dtype[Any]:
    """The dtype to compute in: numpy's promotion of the arrays, with float16 widened to float32."""
    dtype = np.result_type(*arrays)
    return np.dtype("float32") if dtype == np.float16 else dtype


def flat_view(array: Array, *, op: str, field: str) -> Array:
    """``array``'s memory as one contiguous 1-d view (never a copy), or an error naming the field."""
    if not array.flags.c_contiguous:
        raise OperatorError(ACL_ERROR_OP_INPUT_NOT_MATCH, f"{op}: {field} must be a contiguous buffer")
    return array.reshape(-1)


def store(op: str, index: int, out: Array, value: Array | np.generic | float | int | bool) -> None:
    """Write ``value`` into output ``index`` (its shape must be the output's, or one element into a 1-element
    output), converting to the output's dtype."""
    result = from_bf16(np.asarray(value))
    if result.shape != out.shape:
        if result.size == out.size == 1 or (result.size == out.size and result.ndim <= 1 and out.ndim <= 1):
            result = result.reshape(out.shape)
        else:
            raise OperatorError(
                ACL_ERROR_OP_OUTPUT_NOT_MATCH,
                f"{op}: output {index} has shape {list(out.shape)}, the result has {list(result.shape)}",
            )
    if out.dtype == BF16:
        with np.errstate(invalid="ignore", over="ignore"):
            np.copyto(out.view(np.uint16), to_bf16_bits(result))
        return
    if out.dtype == np.bool_ and result.dtype != np.bool_:
        result = result != 0
    elif out.dtype.kind in "iu" and result.dtype.kind == "f":
        result = np.trunc(result)
    with np.errstate(invalid="ignore", over="ignore"):
        np.copyto(out, result, casting="unsafe")


@dataclass(frozen=True, slots=True)
class Call:
    """An op's name, its inputs (None for an absent optional one), outputs and attributes."""

    op: str
    inputs: Sequence[Array | None]
    outputs: Sequence[Array | None]
    attrs: Mapping[str, AttrValue]

    # -- arrays -------------------------------------------------------------------------------------

    def input(self, index: int, name: str) -> Array:
        """Required input ``index`` (called ``name`` in the op's definition)."""
        array = self.optional(index, name)
        if array is None:
            raise OperatorError(ACL_ERROR_OP_INPUT_NOT_MATCH, f"{self.op}: input {index} ({name}) is missing")
        return array

    def optional(self, index: int, name: str) -> Array | None:
        """Input ``index``, or None when the call has no such input or passed None."""
        if index >= len(self.inputs):
            return None
        array = self.inputs[index]
        if array is not None and not isinstance(array, np.ndarray):
            raise OperatorError(
                ACL_ERROR_OP_INPUT_NOT_MATCH, f"{self.op}: input {index} ({name}) is not an array"
            )
        return None if array is None else from_bf16(array)

    def output(self, index: int, name: str) -> Array:
        """Required output ``index``, as it is (a bfloat16 one too: read it with ``from_bf16``)."""
        array = self.outputs[index] if index < len(self.outputs) else None
        if not isinstance(array, np.ndarray):
            raise OperatorError(
                ACL_ERROR_OP_OUTPUT_NOT_MATCH, f"{self.op}: output {index} ({name}) is missing"
            )
        return array

    def floats(self, index: int, name: str) -> Array:
        """Required input ``index``, which must be of a float dtype."""
        array = self.input(index, name)
        self.float_dtype(array, f"input {index} ({name})")
        return array

    def float_dtype(self, array: Array, field: str) -> None:
        """Refuse ``array`` unless its dtype is a float one."""
        if array.dtype.name not in FLOATS:
            raise OperatorError(
                ACL_ERROR_UNSUPPORTED_DATA_TYPE,
                f"{self.op}: {field} has dtype {array.dtype.name}; a float is needed",
            )

    def ints(self, index: int, name: str) -> list[int]:
        """Required host input ``index`` of integers (a shape, axes, a perm) as a list."""
        array = self.input(index, name)
        if array.dtype.kind not in "iu":
            raise OperatorError(
                ACL_ERROR_OP_INPUT_NOT_MATCH,
                f"{self.op}: input {index} ({name}) has dtype {array.dtype.name}; integers are needed",
            )
        return [int(v) for v in array.reshape(-1)]

    def one_int(self, index: int, name: str) -> int:
        """Required host input ``index`` holding exactly one integer (an axis, an offset, k)."""
        values = self.ints(index, name)
        if len(values) != 1:
            raise self.bad_input(f"input {index} ({name}) must hold one value, it holds {len(values)}")
        return values[0]

    def scalar(self, index: int, name: str) -> Array:
        """Required one-element input ``index`` (a scalar passed as a 0-d or 1-element tensor), as a 0-d array."""
        array = self.input(index, name)
        if array.size != 1:
            raise OperatorError(
                ACL_ERROR_OP_INPUT_NOT_MATCH,
                f"{self.op}: input {index} ({name}) must hold one element, it has shape {list(array.shape)}",
            )
        return array.reshape(())

    # -- attributes ---------------------------------------------------------------------------------

    def _attr(self, name: str, default: Any, kinds: tuple[type, ...], what: str) -> Any:
        if name not in self.attrs:
            if default is _MISSING:
                raise OperatorError(ACL_ERROR_OP_ATTR_NOT_MATCH, f"{self.op}: attribute {name!r} is missing")
            return default
        value = self.attrs[name]
        if not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool)):
            raise OperatorError(
                ACL_ERROR_OP_ATTR_NOT_MATCH,
                f"{self.op}: attribute {name!r} must be {what}, it is {value!r:.80}",
            )
        return value

    def attr_bool(self, name: str, default: bool = _MISSING) -> bool:
        return bool(self._attr(name, default, (bool,), "a bool"))

    def attr_int(self, name: str, default: int = _MISSING) -> int:
        return int(self._attr(name, default, (int,), "an int"))

    def attr_float(self, name: str, default: float = _MISSING) -> float:
        return float(self._attr(name, default, (int, float), "a number"))

    def attr_number(self, name: str, default: float | int | bool = _MISSING) -> float | int | bool:
        """A scalar that may be of any kind (an aclnn ``aclScalar``): bool, int or float as given."""
        value = self._attr(name, default, (bool, int, float), "a number")
        return value  # type: ignore[no-any-return]

    def attr_ints(self, name: str, default: list[int] = _MISSING) -> list[int]:
        value = self._attr(name, default, (list,), "a list of ints")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise OperatorError(
                ACL_ERROR_OP_ATTR_NOT_MATCH, f"{self.op}: attribute {name!r} must be a list of ints"
            )
        return list(value)

    # -- helpers ------------------------------------------------------------------------------------

    def axis(self, axis: int, ndim: int, field: str) -> int:
        """``axis`` (negative counts from the end) as an index below ``ndim``, or an error naming the field."""
        if not -max(ndim, 1) <= axis < max(ndim, 1):
            raise OperatorError(
                ACL_ERROR_OP_ATTR_NOT_MATCH,
                f"{self.op}: {field} {axis} is out of range for {ndim} dimensions",
            )
        return axis % max(ndim, 1)

    def bad_input(self, message: str) -> OperatorError:
        return OperatorError(ACL_ERROR_OP_INPUT_NOT_MATCH, f"{self.op}: {message}")

    def bad_attr(self, message: str) -> OperatorError:
        return OperatorError(ACL_ERROR_OP_ATTR_NOT_MATCH, f"{self.op}: {message}")

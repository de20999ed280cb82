"""The emulated operator set (placeholder with torch-ops' API until their branch merges; theirs wins).

``run(op, inputs, outputs, attrs) -> die ns`` computes ``op`` into ``outputs`` (numpy views over the
share's device memory) and returns its die time from the cost model below; ``OperatorError`` (an ACL
error number in ``code``, a message naming the op and the field) and ``UnknownOperator`` for an op the
set does not have. Here: ``OnesLike``, ``Add`` and ``MatMul`` (attributes ``transpose_x1``/``transpose_x2``).
Cost: 1 us of launch plus the bytes moved at 1 TB/s and the multiply-adds at 100 TFLOP/s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

__all__ = ["AttrValue", "OperatorError", "UnknownOperator", "known_ops", "run"]

AttrValue = bool | int | float | str | list[bool] | list[int] | list[float] | list[str]
ACL_ERROR_OP_INPUT_NOT_MATCH = 100021
ACL_ERROR_OP_NOT_FOUND = 100024


class OperatorError(Exception):
    """An op could not run; ``code`` is its ACL error number, ``message`` names the op and the field."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{message} [ACL {code}]")
        self.code = code
        self.message = message


class UnknownOperator(OperatorError):
    def __init__(self, op: str) -> None:
        super().__init__(
            ACL_ERROR_OP_NOT_FOUND, f"operator {op[:100]!r} is not in FlexNPU's emulated operator set"
        )
        self.op = op


def _input(op: str, inputs: Sequence[np.ndarray | None], i: int) -> np.ndarray:
    if i >= len(inputs) or inputs[i] is None:
        raise OperatorError(ACL_ERROR_OP_INPUT_NOT_MATCH, f"{op}: input {i} is missing")
    x = inputs[i]
    assert x is not None
    return x


def _cost(nbytes: int, flops: int) -> int:
    return 1000 + nbytes // 1000 + flops // 100_000


def run(
    op: str,
    inputs: Sequence[np.ndarray | None],
    outputs: Sequence[np.ndarray],
    attrs: Mapping[str, AttrValue],
) -> int:
    """Compute ``op`` into ``outputs``; its die time in ns."""
    if not outputs:
        raise OperatorError(100022, f"{op}: no output")
    out = outputs[0]
    flops = 0
    if op == "OnesLike":
        out[...] = 1
    elif op == "Add":
        np.add(_input(op, inputs, 0), _input(op, inputs, 1), out=out, casting="unsafe")
    elif op == "MatMul":
        a, b = _input(op, inputs, 0), _input(op, inputs, 1)
        a = a.T if attrs.get("transpose_x1") else a
        b = b.T if attrs.get("transpose_x2") else b
        np.matmul(a, b, out=out)
        flops = a.shape[0] * a.shape[1] * b.shape[1]
    else:
        raise UnknownOperator(op)
    nbytes = sum(x.nbytes for x in inputs if x is not None) + out.nbytes
    return _cost(nbytes, flops)


def known_ops() -> frozenset[str]:
    return frozenset({"OnesLike", "Add", "MatMul"})

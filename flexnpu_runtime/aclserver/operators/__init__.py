"""FlexNPU's emulated operator set: the kernels an aclserver runs for ``aclopCompileAndExecute`` and ``aclnn*``.

Pure numpy, no I/O. The aclserver (``dispatch`` of the op message) builds numpy views over the share's
device memory and host-resident inputs and calls::

    die_ns = operators.run(op, inputs, outputs, attrs)

``op`` is an aclop op type as torch_npu's ``OpCommand`` names it (``"MatMul"``, ``"SoftmaxV2"``, …) or an
aclnn function without ``GetWorkspaceSize`` (``"aclnnAdds"``); ``outputs`` are written in place (they may
be strided views); the return is the op's die time in ns (``cost.die_time_ns``). A failure raises
``OperatorError`` with CANN's error number and a sentence naming the op and the field; an op not in the
set raises ``UnknownOperator``. Nothing is written to any output before the kernel has checked its inputs
and computed its result, except by ops with several outputs, which write them in order.

How aclop inputs and attributes map, per op: the modules' docstrings (``elementwise``, ``linalg``, ``norms``,
``reductions``, ``layout``, ``creation``); aclnn parameters: ``aclnn``. docs/pytorch.md lists the set and
the cost model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from flexnpu_runtime.aclserver.operators import (
    aclnn,
    cost,
    creation,
    elementwise,
    layout,
    linalg,
    norms,
    reductions,
)
from flexnpu_runtime.aclserver.operators.calls import Array, AttrValue, Call
from flexnpu_runtime.aclserver.operators.errors import OperatorError, UnknownOperator

__all__ = ["AttrValue", "OperatorError", "UnknownOperator", "run"]

KERNELS: dict[str, Callable[[Call], int]] = {
    **elementwise.ACLOP,
    **linalg.ACLOP,
    **norms.ACLOP,
    **reductions.ACLOP,
    **layout.ACLOP,
    **creation.ACLOP,
    **aclnn.ACLNN,
}


def _nbytes(arrays: Sequence[Array | None]) -> int:
    return sum(a.nbytes for a in arrays if a is not None)


def run(
    op: str,
    inputs: Sequence[np.ndarray | None],
    outputs: Sequence[np.ndarray | None],
    attrs: Mapping[str, AttrValue],
) -> int:
    """Compute ``op`` into ``outputs``; return its die time in ns. Raises ``OperatorError``/``UnknownOperator``."""
    kernel = KERNELS.get(op)
    if kernel is None:
        raise UnknownOperator(op)
    flops = kernel(Call(op, inputs, outputs, attrs))
    return cost.die_time_ns(_nbytes(inputs) + _nbytes(outputs), flops)

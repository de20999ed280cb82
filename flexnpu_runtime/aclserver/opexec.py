"""Single operators of one session: the ``OPERATOR`` message, queued in stream order.

A client sends one message per operator (``libascendcl/src/op.c``: ``aclopCompileAndExecute``,
``aclopExecuteV2``, the aclnn launches of ``libopapi.so``) and waits for no reply. ``Operators.launch``
decodes it (``flexnpu_wire/opcall.py``), checks every device tensor against the session's allocations
and pins them, and queues a task on the stream. The task, on the device's worker, once a slice of the
die is granted (the emulated die is the host computing: ``streams._run_operator``), builds numpy views
over the share's device memory (dtype, dims, strides and offset from the message; host tensors from
their bytes) and calls the operator library (``operators.run``), which returns the modelled die time;
the die is held for the longer of that and the measured compute, through the same quota ledger as every
kernel, so the share's compute policy charges it. A backend with an ``execute_operator`` (the ascend
backend, ``ascend_ops.py``) runs the checked call on its device instead, in the same slice, and returns
the die time it took (so it is held once, while it runs). A failure — a malformed message, an unknown op
(named), a tensor outside the share, a dtype or shape the op refuses — becomes the stream's error: the
next synchronize of that stream (or of its device) returns it; the operators queued after it still run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from flexnpu_runtime.aclserver import operators
from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_wire import codes, opcall
from flexnpu_wire.errors import ContractError

if TYPE_CHECKING:
    from flexnpu_runtime.aclserver.backend import Allocation
    from flexnpu_runtime.aclserver.quota import QuotaBook
    from flexnpu_wire import framing

__all__ = ["DTYPES", "Operators"]

DTYPES: dict[int, str] = {0: "float32", 1: "float16", 2: "int8", 3: "int32", 4: "uint8", 6: "int16", 7: "uint16",
                          8: "uint32", 9: "int64", 10: "uint64", 11: "float64", 12: "bool"}  # fmt: skip
"""aclDataType numbers an operand may have, and their numpy dtypes."""
_UNSUPPORTED_DATA_TYPE = 100026
_ACL_BF16 = 27
_NS_PER_US = 1000


class Operators:
    """The ``OPERATOR`` op of one session (``launch``: never answered)."""

    def __init__(self, backend: Backend, book: QuotaBook, *, session_id: int, streams: Streams) -> None:
        self.backend = backend
        self.book = book
        self.session_id = session_id
        self.streams = streams
        self.launched = 0

    def launch(self, msg: framing.Message, *, initialized: bool) -> None:
        """Queue the operator in ``msg``; any failure is recorded as its stream's error."""
        ints = msg.ints
        stream_id = ints[0] if ints else 0
        try:
            if not initialized:
                raise AclFailure(codes.ACL_ERROR_UNINITIALIZE, "acl.init has not been called")
            if len(ints) != 4:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"OPERATOR takes 4 values, got {len(ints)}")
            try:
                call = opcall.decode(msg.tail, ints[1], ints[2], ints[3])
            except ContractError as exc:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, exc.message) from None
            stream = self.streams.stream(stream_id)
            uses = [self._allocation(call.name, f"inputs[{i}]", t) for i, t in enumerate(call.inputs)]
            uses += [self._allocation(call.name, f"outputs[{i}]", t) for i, t in enumerate(call.outputs)]
            task = Task(stream, 0, _no_completion, sticky=True)
            task.prepare = lambda: self._compute(call, stream.device)
            self.streams.wait_for_room()  # backpressure: the client's sends wait, no operator is dropped
            self.streams.submit(task, [a for a in uses if a is not None])
            self.launched += 1
        except AclFailure as exc:
            self.streams.record_error(stream_id, exc)

    # -- on the worker ------------------------------------------------------------------------------

    def _compute(self, call: opcall.OpCall, device: int) -> int:
        """Run the operator (views made now, in stream order); its die time in microseconds."""
        execute = getattr(self.backend, "execute_operator", None)
        if execute is not None:  # a backend that runs operators on its device (ascend: the host's CANN)
            return int(execute(call, device=device, owner=self.session_id))
        inputs = [self._array(call.name, f"inputs[{i}]", t) for i, t in enumerate(call.inputs)]
        outputs = [self._array(call.name, f"outputs[{i}]", t) for i, t in enumerate(call.outputs)]
        try:
            # an absent optional output stays in its place as None (aclnnLayerNorm's meanOutOptional):
            # the operator library finds each output by its position
            die_ns = operators.run(call.name, inputs, outputs, cast(Mapping[str, Any], call.attrs))
        except operators.OperatorError as exc:
            raise AclFailure(exc.code, exc.message) from None
        except (ValueError, TypeError, IndexError) as exc:  # a kernel's numpy refusal: the op's, not ours
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{call.name}: {exc}") from None
        return max(1, -(-int(die_ns) // _NS_PER_US))

    # -- views ---------------------------------------------------------------------------------------

    def _allocation(self, op: str, where: str, t: opcall.Tensor) -> Allocation | None:
        """The allocation a device tensor lies in, checked for its whole extent (AclFailure naming it)."""
        if t.placement != opcall.Placement.DEVICE:
            return None
        lo, hi = _extent(op, where, t)
        if hi == lo:
            return None
        if t.storage_bytes and hi > t.storage_bytes:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{op}: {where} reaches byte {hi} of its buffer, which has {t.storage_bytes}",
            )
        try:
            return self.book.find(t.address + lo, hi - lo, owner=self.session_id)
        except AclFailure as exc:
            raise AclFailure(exc.code, f"{op}: {where}: {exc.message}") from None

    def _array(self, op: str, where: str, t: opcall.Tensor) -> np.ndarray[Any, Any] | None:
        if t.placement == opcall.Placement.ABSENT:
            return None
        dtype = _dtype(op, where, t.dtype)
        size = dtype.itemsize
        if t.placement == opcall.Placement.HOST:
            count = 1
            for d in t.dims:
                count *= d
            if count * size > len(t.data):
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM,
                    f"{op}: {where} holds {len(t.data)} bytes, its {t.dims} {dtype.name} need {count * size}",
                )
            return np.frombuffer(t.data, dtype=dtype, count=count).reshape(t.dims)
        lo, hi = _extent(op, where, t)
        if hi == lo:
            return np.empty(t.dims, dtype=dtype)
        view = self.backend.device_view(t.address + lo, hi - lo, owner=self.session_id)
        return np.ndarray(
            t.dims,
            dtype=dtype,
            buffer=view,
            offset=t.offset * size - lo,
            strides=tuple(s * size for s in t.strides),
        )


def _no_completion() -> None:
    """An operator's results are written when it is computed, while it holds the die."""


def _dtype(op: str, where: str, acl: int) -> np.dtype[Any]:
    # numpy has no bfloat16: the operator library's two-byte stand-in (operators/calls.py)
    if acl == _ACL_BF16:
        return operators.calls.BF16
    name = DTYPES.get(acl)
    if name is None:
        raise AclFailure(_UNSUPPORTED_DATA_TYPE, f"{op}: {where}: aclDataType {acl} is not supported")
    return np.dtype(name)


def _extent(op: str, where: str, t: opcall.Tensor) -> tuple[int, int]:
    """The byte range [lo, hi) from ``t.address`` that the view touches ((0, 0) when it is empty)."""
    size = _dtype(op, where, t.dtype).itemsize
    if any(d == 0 for d in t.dims):
        return 0, 0
    first = last = t.offset
    for d, s in zip(t.dims, t.strides, strict=True):
        if s >= 0:
            last += (d - 1) * s
        else:
            first += (d - 1) * s
    if first < 0:
        raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{op}: {where} reaches before its address")
    return first * size, (last + 1) * size

"""Operators on the ascend backend: an ``OPERATOR`` message forwarded to the host's CANN.

NOT YET VERIFIED ON HARDWARE (tested against ``tests/c/cann_emulator.c``). The session layer decodes and
checks the message (``opexec.py``: every device tensor lies in the session's allocations, pinned) and, in
stream order on the device's worker, hands the ``OpCall`` to ``OperatorRuntime.execute``, which launches it
on the die's stream through one of two paths, both built with the runtime:

* **single operators** (any name not starting with ``aclnn``): CANN's aclop API (``ascend_aclop.py``:
  descriptors, data buffers and attributes rebuilt from the call, then ``aclopCompileAndExecute``).
* **aclnn** (``aclnnXxx``): the host's ``libopapi.so`` (``ascend_aclnn.py``: the function's C parameters in
  CANN's order, a workspace charged to the share's quota while the operator runs).

Both run on one CANN stream per device (``aclrtCreateStream``, made at the first operator), launched and
synchronized under the device's lock, so an operator's results are complete when its task completes and
the next one starts. The die time charged (returned to the worker) is what the launch and synchronize took.
A code CANN answers is passed to the program unchanged as the stream's error, with the operator named and
``aclGetRecentErrMsg``'s text. Kernel launches (``backend_ascend.py``) run on the same streams (``run``).
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from flexnpu_runtime.aclserver.ascend_aclnn import AclnnOperators, Workspace
from flexnpu_runtime.aclserver.ascend_aclop import SingleOperators
from flexnpu_runtime.aclserver.ascend_ctypes import PP, P, bind_operator_calls, checker
from flexnpu_wire import opcall

__all__ = ["OperatorRuntime"]

_STREAM_SIGS: dict[str, tuple[Any, list[Any]]] = {
    "aclrtCreateStream": (ctypes.c_int, [PP]),
    "aclrtSynchronizeStream": (ctypes.c_int, [P]),
    "aclrtDestroyStream": (ctypes.c_int, [P]),
}


class OperatorRuntime:
    """The CANN operator entry points of one host runtime and its operator streams, one per die."""

    def __init__(self, lib: ctypes.CDLL, path: str, errmsg: Callable[[], str]) -> None:
        self._check = checker(errmsg)
        self._fn = bind_operator_calls(lib, path, _STREAM_SIGS)
        self._single = SingleOperators(lib, path, self._check)
        self._aclnn = AclnnOperators(path, self._check)
        self._streams: dict[int, int] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()

    def execute(self, call: opcall.OpCall, *, phy: int, workspace: Workspace) -> int:
        """Run ``call`` on die ``phy``'s stream (the caller selected the die); its die microseconds."""

        def launch(stream: int, held: ExitStack) -> None:
            if call.name.startswith("aclnn"):
                self._aclnn.launch(call, stream, workspace, held)
            else:
                self._single.launch(call, stream, held)

        return self.run(phy, call.name, launch)

    def run(self, phy: int, what: str, launch: Callable[[int, ExitStack], None]) -> int:
        """``launch(stream, held)`` on die ``phy``'s stream, then its synchronize (what ``held`` keeps —
        CANN's objects, a workspace — is released after it); the die microseconds both took."""
        with self._lock(phy), ExitStack() as held:
            stream = self._stream(phy)
            start = time.monotonic()
            launch(stream, held)
            self._check(what, "aclrtSynchronizeStream", self._fn["aclrtSynchronizeStream"](stream))
            return max(1, round((time.monotonic() - start) * 1e6))

    def close(self, set_device: Callable[[int], None]) -> None:
        """Destroy the streams, each with its die current."""
        for phy, stream in self._streams.items():
            set_device(phy)
            self._fn["aclrtDestroyStream"](stream)
        self._streams.clear()

    def _lock(self, phy: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(phy, threading.Lock())

    def _stream(self, phy: int) -> int:
        stream = self._streams.get(phy)
        if stream is None:
            out = ctypes.c_void_p()
            self._check("operators", "aclrtCreateStream", self._fn["aclrtCreateStream"](ctypes.byref(out)))
            stream = self._streams[phy] = int(out.value or 0)
        return stream

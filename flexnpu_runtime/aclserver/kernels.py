"""Kernel binaries of one session (``aclrtBinaryLoadFromData``, ``aclrtBinaryGetFunction``, ``aclrtLaunchKernel``
with a function handle, and libruntime's ``rtDevBinaryRegister``/``rtFunctionRegister``/``rtKernelLaunch``).

The client ships a binary once per load, through the session's staging region into a model-bytes blob
(``MODEL_BYTES_OPEN``/``WRITE``: size-bounded, charged to the claim's ``hostMemory`` while it exists, as a
model's bytes); ``BINARY_LOAD`` hands it to the backend on the session's current device and drops the blob.
``BINARY_GET_FUNCTION`` looks a kernel up by name there; ``LAUNCH_FUNCTION`` queues one launch on the
stream, its arguments by value (at most ``MAX_ARGS`` bytes), run on the device's worker in stream order (a
failure is the stream's error, as an operator's). Binaries and functions are named to the client by small
numbers of this session.

Only a backend with the hooks ``load_binary``, ``binary_function``, ``launch_function`` and
``unload_binary`` serves them (the ascend backend: the host's CANN); on the emulated backend each call
answers ACL_ERROR_API_NOT_SUPPORT (200001) naming it.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any

from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_wire import codes
from flexnpu_wire.framing import Op

if TYPE_CHECKING:
    from collections.abc import Callable

    from flexnpu_runtime.aclserver.model_bytes import ModelBytes
    from flexnpu_wire import framing

__all__ = ["MAX_ARGS", "MAX_NAME", "Kernels"]

MAX_ARGS = 64 * 1024
"""The largest argument block a launch carries (CANN's own limit is lower for most kernels)."""
MAX_NAME = 256
_HOOKS = ("load_binary", "binary_function", "launch_function", "unload_binary")


class Kernels:
    """The kernel-binary ops of one session (``handlers``/``tail_handlers`` for the dispatcher)."""

    def __init__(
        self,
        backend: Backend,
        *,
        blobs: ModelBytes,
        streams: Streams,
        current: Callable[[], int],
    ) -> None:
        self.backend = backend
        self.blobs = blobs
        self.streams = streams
        self._current = current
        self._binaries: dict[int, tuple[int, Any]] = {}  # id -> (device, the backend's handle)
        self._functions: dict[int, tuple[int, int, Any]] = {}  # id -> (device, binary id, handle)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def handlers(self) -> dict[Op, Callable[[tuple[int, ...]], tuple[int, ...]]]:
        return {Op.BINARY_LOAD: self._load, Op.BINARY_UNLOAD: self._unload}

    def tail_handlers(self) -> dict[Op, Callable[[framing.Message], tuple[tuple[int, ...], bytes] | None]]:
        return {Op.BINARY_GET_FUNCTION: self._get_function, Op.LAUNCH_FUNCTION: self._launch}

    def _hook(self, what: str, name: str) -> Any:
        if not all(hasattr(self.backend, h) for h in _HOOKS):
            raise AclFailure(
                codes.ACL_ERROR_API_NOT_SUPPORT,
                f"{what}: kernel binaries run on the ascend backend only (this aclserver emulates the die)",
            )
        return getattr(self.backend, name)

    def _load(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        (blob_id,) = ints
        load = self._hook("aclrtBinaryLoadFromData", "load_binary")
        device = self._current()
        handle = load(device, self.blobs.get(blob_id).view)
        self.blobs.drop(
            self.blobs.take(blob_id)
        )  # the backend has the binary now (a refused load keeps the blob)
        with self._lock:
            binary = next(self._ids)
            self._binaries[binary] = (device, handle)
        return (binary,)

    def _get_function(self, msg: framing.Message) -> tuple[tuple[int, ...], bytes]:
        (binary,) = msg.ints
        lookup = self._hook("aclrtBinaryGetFunction", "binary_function")
        raw = bytes(msg.tail)
        if not 0 < len(raw) <= MAX_NAME or not raw.isascii() or b"\0" in raw:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"aclrtBinaryGetFunction: a kernel name of 1..{MAX_NAME} ASCII bytes",
            )
        device, handle = self._binary(binary, "aclrtBinaryGetFunction")
        func = lookup(device, handle, raw.decode())
        with self._lock:
            function = next(self._ids)
            self._functions[function] = (device, binary, func)
        return (function,), b""

    def _launch(self, msg: framing.Message) -> tuple[tuple[int, ...], bytes]:
        stream_id, function, block_dim = msg.ints
        launch = self._hook("aclrtLaunchKernel", "launch_function")
        args = bytes(msg.tail)
        if len(args) > MAX_ARGS or not 0 < block_dim < 1 << 32:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"aclrtLaunchKernel: {len(args)} argument bytes (at most {MAX_ARGS}), block dim {block_dim}",
            )
        with self._lock:
            entry = self._functions.get(function)
        if entry is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"aclrtLaunchKernel: {function} is not a function of this client",
            )
        device, _binary, func = entry
        stream = self.streams.stream(stream_id)
        if stream.device != device:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"aclrtLaunchKernel: the function is of device {device}, the stream of device {stream.device}",
            )
        task = Task(stream, 0, _ended, sticky=True)
        task.prepare = lambda: int(launch(device, func, block_dim, args))
        self.streams.wait_for_room()
        self.streams.submit(task, [])
        return (), b""

    def _unload(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        (binary,) = ints
        unload = self._hook("aclrtBinaryUnLoad", "unload_binary")
        device, handle = self._binary(binary, "aclrtBinaryUnLoad")
        self.streams.drain()  # its queued launches end first
        with self._lock:
            self._binaries.pop(binary, None)
            self._functions = {k: v for k, v in self._functions.items() if v[1] != binary}
        unload(device, handle)
        return ()

    def _binary(self, binary: int, what: str) -> tuple[int, Any]:
        with self._lock:
            entry = self._binaries.get(binary)
        if entry is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"{what}: {binary} is not a binary of this client"
            )
        return entry

    def close(self) -> None:
        """Unload every binary (the session's work was drained or cancelled)."""
        with self._lock:
            binaries, self._binaries, self._functions = list(self._binaries.values()), {}, {}
        unload = getattr(self.backend, "unload_binary", None)
        for device, handle in binaries:
            if unload is not None:
                try:
                    unload(device, handle)
                except AclFailure:
                    continue  # the host's CANN keeps it until the process ends; nothing else to do


def _ended() -> None:
    """A launch's results are written when it runs, before its die time is held."""

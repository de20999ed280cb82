"""One session's model bytes in flight: blobs the client fills before asking about or loading a model.

The aclserver cannot see the container's files, so the client sends a model's bytes: it opens a
blob of the model's size (charged to the claim's host-memory limit while it exists), writes it
in chunks from data-link host pointers (its staging region or a ``malloc_host`` buffer), then
asks for the blob's size or description (answered here), or loads it (``models.Models`` takes
the blob, which ends it). Every failure is an ``AclFailure`` and changes nothing.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable
from dataclasses import dataclass

from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.hostmem import HostBudget
from flexnpu_runtime.aclserver.memory import Memory
from flexnpu_wire import codes, modelfile
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

__all__ = ["MAX_BLOBS", "Blob", "HostCharge", "ModelBytes"]

MAX_BLOBS = 4
"""Model byte blobs one session may have open at once."""
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]
TailHandler = Callable[[protocol.Message], tuple[tuple[int, ...], bytes] | None]


@dataclass(slots=True, eq=False)
class Blob:
    size: int
    data: mmap.mmap
    view: memoryview


class HostCharge:
    """The session's model bookings against the claim's host-memory budget (none: unbounded)."""

    def __init__(self, host: HostBudget | None) -> None:
        self._host = host

    def reserve(self, size: int) -> None:
        if self._host is not None:
            self._host.reserve(size, buffer=False)

    def release(self, size: int) -> None:
        if self._host is not None:
            self._host.release(size, buffer=False)


class ModelBytes:
    """The blobs of one session (``handlers``/``tail_handlers`` for the dispatcher); thread-safe."""

    def __init__(self, backend: Backend, memory: Memory, charge: HostCharge) -> None:
        self.backend = backend
        self.memory = memory
        self.charge = charge
        self._lock = threading.Lock()
        self._blobs: dict[int, Blob] = {}
        self._next_blob = 1

    def handlers(self) -> dict[Op, Handler]:
        return {
            Op.MODEL_BYTES_OPEN: self._open,
            Op.MODEL_BYTES_WRITE: self._write,
            Op.MODEL_BYTES_CLOSE: self._close_blob,
            Op.MODEL_QUERY_SIZE: self._query_size,
        }

    def tail_handlers(self) -> dict[Op, TailHandler]:
        return {Op.MODEL_QUERY_DESC: self._query_desc}

    def _open(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        size = ints[0]
        if not 0 < size < 1 << 40:
            raise AclFailure(codes.ACL_ERROR_MODEL_SIZE_INVALID, f"model size {size} must be in 1..1Ti")
        with self._lock:
            if len(self._blobs) >= MAX_BLOBS:
                raise AclFailure(
                    codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
                    f"at most {MAX_BLOBS} models may be in flight at once",
                )
        self.charge.reserve(size)
        try:
            data = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, OverflowError) as exc:
            self.charge.release(size)
            raise AclFailure(
                codes.ACL_ERROR_BAD_ALLOC, f"cannot hold a model of {size} bytes: {exc}"
            ) from exc
        with self._lock:
            blob_id = self._next_blob
            self._next_blob += 1
            self._blobs[blob_id] = Blob(size, data, memoryview(data))
        return (blob_id,)

    def _write(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        blob_id, offset, host_ptr, count = ints
        blob = self.get(blob_id)
        if count < 0 or offset < 0 or offset + count > blob.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{count} bytes at offset {offset} run past the model's {blob.size} bytes",
            )
        region = self.memory.host_region(host_ptr, count)
        try:
            region.read_into(wire_datalink.split_host_ptr(host_ptr)[1], blob.view[offset : offset + count])
        except OSError as exc:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"reading the model from the data link failed: {exc}"
            ) from exc
        return ()

    def _close_blob(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        self.drop(self.take(ints[0]))
        return ()

    def _query_size(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        desc = self.backend.describe_model(self.get(ints[0]).view)
        return desc.work_bytes, desc.weight_bytes

    def _query_desc(self, msg: protocol.Message) -> tuple[tuple[int, ...], bytes]:
        return (), modelfile.render_header(self.backend.describe_model(self.get(msg.ints[0]).view))

    def get(self, blob_id: int) -> Blob:
        """The open blob ``blob_id`` (AclFailure if this session has none by that id)."""
        with self._lock:
            blob = self._blobs.get(blob_id)
        return _opened(blob, blob_id)

    def take(self, blob_id: int) -> Blob:
        """Take the open blob ``blob_id`` out of the session (``drop`` ends it)."""
        with self._lock:
            blob = self._blobs.pop(blob_id, None)
        return _opened(blob, blob_id)

    def drop(self, blob: Blob) -> None:
        """Unmap a blob taken out of the session and give its bytes back to the budget."""
        blob.view.release()
        blob.data.close()
        self.charge.release(blob.size)

    def close(self) -> None:
        """Drop every blob (the session ends)."""
        with self._lock:
            blobs, self._blobs = list(self._blobs.values()), {}
        for blob in blobs:
            self.drop(blob)


def _opened(blob: Blob | None, blob_id: int) -> Blob:
    if blob is None:
        raise AclFailure(
            codes.ACL_ERROR_INVALID_PARAM, f"model bytes {blob_id} were not opened by this client"
        )
    return blob

"""One session's models: their bytes in flight, load, description, execution and unload.

The aclserver cannot see the container's files, so the client sends a model's bytes: it opens a
blob of the model's size (charged to the claim's host-memory limit while it exists), writes it
in chunks from data-link host pointers (its staging region or a ``malloc_host`` buffer), then
asks for the blob's size or description, or loads it. A load takes the model's weight and work
memory from the device quota (207001 and a message when it does not fit) unless the caller
gives its own (``...WithMem``: pinned while the model is loaded); its description, which the
aclserver keeps while it is loaded, is charged to the claim's host-memory budget. An execution is a task on a
stream like a kernel (``streams.py``): it holds the die for the model's cost under the share's
policy, pins every buffer it reads or writes, then computes the outputs. Stream 0 means
synchronous (``aclmdlExecute``): when the session has nothing queued on the device, the session
thread runs it itself (``Streams.run_now``, no hand-off) and keeps serving the connection while
it waits (``pause``); otherwise it is queued and its reply is sent from the task's thread when it
ends. Either way the client's other threads are not held up and no thread waits idle for it.
Unload waits for the model's queued executions. Every failure is an ``AclFailure`` and changes
nothing.
"""

from __future__ import annotations

import mmap
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from flexnpu_runtime.aclserver.backend import AclFailure, Allocation, Backend, Buffer, LoadedModel
from flexnpu_runtime.aclserver.hostmem import HostBudget
from flexnpu_runtime.aclserver.ledger import Pause
from flexnpu_runtime.aclserver.memory import Memory
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_wire import codes, modelfile
from flexnpu_wire import datalink as wire_datalink
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

__all__ = ["MAX_BLOBS", "MAX_MODELS", "Link", "Models"]

MAX_BLOBS = 4
"""Model byte blobs one session may have open at once."""
MAX_MODELS = 256
"""Models one session may have loaded at once."""
DESC_COST_PER_HEADER_BYTE = 3
DESC_COST_FIXED = 4096
"""What a loaded model's description costs the aclserver, charged to the claim's host-memory
budget while it is loaded: the parsed description and its rendered header take about 2.7 bytes
per header byte (a 54 KiB header: 147 KiB), plus the records around them."""
_PAIR = struct.Struct(">qq")
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]
TailHandler = Callable[[protocol.Message], tuple[tuple[int, ...], bytes] | None]


@dataclass(slots=True, eq=False)
class _Blob:
    size: int
    data: mmap.mmap
    view: memoryview


@dataclass(slots=True, eq=False)
class _Model:
    loaded: LoadedModel
    header: bytes
    static_needs: tuple[int, ...]
    """Bytes each buffer needs when no gear is set (computed once)."""
    charged: int = 0
    """Host-memory budget bytes its description holds (``DESC_COST_*``)."""
    queued: int = 0
    idle: threading.Condition = field(default_factory=threading.Condition)


class Link(Protocol):
    """The connection a session answers on (the server's), as a synchronous execution needs it."""

    @property
    def pause(self) -> Pause:
        """How the session thread waits while it runs a synchronous execution itself (it keeps
        serving the connection meanwhile)."""
        ...

    def send_later(self, frame: bytes) -> None:
        """Send a reply frame from another thread (a synchronous execution's, when it ends)."""
        ...


def _needs(desc: modelfile.ModelFile, batch: int, hw: tuple[int, int]) -> tuple[int, ...]:
    return tuple(desc.need(i, batch, hw) for i in range(len(desc.inputs) + len(desc.outputs)))


class Models:
    """Models of one session (``handlers``/``tail_handlers`` for the dispatcher); thread-safe."""

    def __init__(
        self,
        backend: Backend,
        book: QuotaBook,
        *,
        session_id: int,
        memory: Memory,
        streams: Streams,
        host: HostBudget | None,
        current: Callable[[], int],
        link: Link | None,
    ) -> None:
        self.backend = backend
        self.book = book
        self.session_id = session_id
        self.memory = memory
        self.streams = streams
        self.host = host
        self._current = current
        self._lock = threading.Lock()
        self._blobs: dict[int, _Blob] = {}
        self._models: dict[int, _Model] = {}
        self._next_blob = 1
        self._next_model = 1
        self._sync_streams: dict[int, int] = {}
        self._link = link
        """None (no server): a synchronous execution is queued and waits in its handler."""
        self._running_now = False

    def handlers(self) -> dict[Op, Handler]:
        return {
            Op.MODEL_BYTES_OPEN: self._open,
            Op.MODEL_BYTES_WRITE: self._write,
            Op.MODEL_BYTES_CLOSE: self._close_blob,
            Op.MODEL_QUERY_SIZE: self._query_size,
            Op.MODEL_LOAD: self._load,
            Op.MODEL_UNLOAD: self._unload,
        }

    def tail_handlers(self) -> dict[Op, TailHandler]:
        return {
            Op.MODEL_QUERY_DESC: self._query_desc,
            Op.MODEL_GET_DESC: self._get_desc,
            Op.MODEL_EXECUTE: self._execute,
        }

    # -- bytes in flight -------------------------------------------------------------------------

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
        self._reserve(size)
        try:
            data = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        except (OSError, OverflowError) as exc:
            self._unreserve(size)
            raise AclFailure(
                codes.ACL_ERROR_BAD_ALLOC, f"cannot hold a model of {size} bytes: {exc}"
            ) from exc
        with self._lock:
            blob_id = self._next_blob
            self._next_blob += 1
            self._blobs[blob_id] = _Blob(size, data, memoryview(data))
        return (blob_id,)

    def _write(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        blob_id, offset, host_ptr, count = ints
        blob = self._blob(blob_id)
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
        self._drop_blob(self._take_blob(ints[0]))
        return ()

    def _query_size(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        desc = self.backend.describe_model(self._blob(ints[0]).view)
        return desc.work_bytes, desc.weight_bytes

    def _query_desc(self, msg: protocol.Message) -> tuple[tuple[int, ...], bytes]:
        return (), modelfile.render_header(self.backend.describe_model(self._blob(msg.ints[0]).view))

    # -- load and unload -------------------------------------------------------------------------

    def _load(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        blob_id, weight_ptr, weight_size, work_ptr, work_size = ints
        device = self._current()
        weight = self._caller_memory(weight_ptr, weight_size, "weight")
        work = self._caller_memory(work_ptr, work_size, "work")
        with self._lock:
            if len(self._models) >= MAX_MODELS:
                raise AclFailure(
                    codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
                    f"at most {MAX_MODELS} models may be loaded per client",
                )
        blob = self._blob(blob_id)
        desc = self.backend.describe_model(blob.view)
        header = modelfile.render_header(desc)
        charged = DESC_COST_FIXED + DESC_COST_PER_HEADER_BYTE * len(header)
        self._reserve(charged)
        pinned: tuple[Allocation, ...] = ()
        own: list[Allocation] = []
        try:
            pinned = self.book.pin([b.alloc for b in (weight, work) if b is not None])
            weight = self._model_memory(device, weight, desc.weight_bytes, "weight", own)
            work = self._model_memory(device, work, desc.work_bytes, "work", own)
            loaded = self.backend.load_model(device, blob.view, desc, weight=weight, work=work)
        except BaseException:
            for alloc in own:
                self.book.free(alloc.base)
            self.book.unpin(pinned)
            self._unreserve(charged)
            raise
        loaded.own, loaded.lent = own, list(pinned)
        self._drop_blob(self._take_blob(blob_id))
        with self._lock:
            model_id = self._next_model
            self._next_model += 1
            self._models[model_id] = _Model(loaded, header, _needs(loaded.desc, 0, (0, 0)), charged)
        return (model_id,)

    def _caller_memory(self, ptr: int, size: int, what: str) -> Buffer | None:
        if not ptr:
            return None
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"{what} memory of {size} bytes at {ptr:#x}")
        return Buffer(ptr, size, self.book.find(ptr, size, owner=self.session_id))

    def _model_memory(
        self, device: int, given: Buffer | None, need: int, what: str, own: list[Allocation]
    ) -> Buffer | None:
        """The caller's memory for the model (checked), else ``need`` bytes from the quota."""
        if given is not None:
            if given.alloc.device != device or given.size < need:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM,
                    f"the model needs {need} bytes of {what} memory on device {device};"
                    f" {given.size} bytes on device {given.alloc.device} were given",
                )
            return given
        if not need:
            return None
        try:
            ptr = self.backend.malloc(device, need, 0, owner=self.session_id)
        except AclFailure as exc:
            raise AclFailure(
                exc.code, f"loading the model: its {what} memory does not fit: {exc.message}"
            ) from None
        own.append(self.book.find(ptr, owner=self.session_id, exact=True))
        return Buffer(ptr, need, own[-1])

    def _get_desc(self, msg: protocol.Message) -> tuple[tuple[int, ...], bytes]:
        return (), self._model(msg.ints[0]).header

    def _unload(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        model = self._model(ints[0])
        with model.idle:
            while model.queued and not self.streams.cancelled.is_set():
                model.idle.wait(0.5)
        with self._lock:
            if self._models.get(ints[0]) is not model:
                raise AclFailure(codes.ACL_ERROR_INVALID_MODEL_ID, f"model {ints[0]} was unloaded meanwhile")
            del self._models[ints[0]]
        self._release(model)
        return ()

    def _release(self, model: _Model) -> None:
        loaded = model.loaded
        book = self.book
        try:
            self.backend.unload_model(loaded)
        finally:
            for alloc in loaded.own:
                if not alloc.freed:
                    book.free(alloc.base, owner=alloc.owner)
            book.unpin(loaded.lent)
            loaded.own, loaded.lent = [], []
            self._unreserve(model.charged)
            model.charged = 0

    # -- execution -------------------------------------------------------------------------------

    def _execute(self, msg: protocol.Message) -> tuple[tuple[int, ...], bytes] | None:
        """Queue an execution; a synchronous one is answered when it ends (None: no reply now)."""
        model_id, stream_id, n_in, n_out = msg.ints
        model = self._model(model_id)
        desc = model.loaded.desc
        if n_in != len(desc.inputs):
            raise AclFailure(
                codes.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                f"model {model_id} has {len(desc.inputs)} inputs, {n_in} given",
            )
        if n_out != len(desc.outputs):
            raise AclFailure(
                codes.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
                f"model {model_id} has {len(desc.outputs)} outputs, {n_out} given",
            )
        if len(msg.tail) != _PAIR.size * (n_in + n_out):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"the execute tail must hold {n_in + n_out} (pointer, size) pairs",
            )
        buffers = [self._buffer(*_PAIR.unpack_from(msg.tail, i * _PAIR.size)) for i in range(n_in + n_out)]
        inputs, outputs = buffers[:n_in], buffers[n_in:]
        batch, hw = self._dynamic_shape(desc, inputs)
        needs = model.static_needs if batch == 0 and hw == (0, 0) else _needs(desc, batch, hw)
        for i, (buf, need) in enumerate(zip(buffers, needs, strict=True)):
            if buf.size < need:
                tensor = modelfile.tensors(desc)[i]
                code = (
                    codes.ACL_ERROR_MODEL_INPUT_NOT_MATCH
                    if i < n_in
                    else codes.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH
                )
                raise AclFailure(code, f"{tensor.name} needs {need} bytes, its buffer has {buf.size}")
        try:
            cost_us, run = self.backend.execution(model.loaded, inputs, outputs, batch=batch, hw=hw)
        except AclFailure:
            raise
        except Exception as exc:  # the executor's error is the call's, never the session's end
            raise AclFailure(
                codes.ACL_ERROR_INTERNAL_ERROR, f"model {model_id} cannot be executed: {exc!r}"
            ) from exc
        sync = stream_id == 0
        stream = self.streams.stream(self._sync_stream(model.loaded.device) if sync else stream_id)
        if stream.device != model.loaded.device:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"model {model_id} is on device {model.loaded.device}, stream {stream_id:#x} on {stream.device}",
            )
        uses = [*model.loaded.own, *model.loaded.lent, *(b.alloc for b in buffers)]
        link = self._link if sync else None
        pause = link.pause if link is not None and not self._running_now else None
        if pause is not None:  # on this thread, if the device has nothing queued
            task = Task(stream, cost_us, run)
            with model.idle:
                model.queued += 1
            self._running_now = True
            try:
                ran = self.streams.run_now(task, uses, pause)
            finally:
                self._running_now = False
                self._executed(model)
            if ran:
                if task.error is not None:
                    raise task.error
                return (), b""
        reply_later = link.send_later if link is not None else None

        def ended() -> None:
            self._executed(model)
            if reply_later is not None:  # the synchronous call's reply, from the task's own thread
                err = task.error
                reply_later(
                    protocol.encode_reply(
                        msg.op,
                        msg.request_id,
                        err.code if err else 0,
                        tail=err.message.encode() if err else b"",
                    )
                )

        task = Task(stream, cost_us, run, then=ended)
        with model.idle:
            model.queued += 1
        try:
            self.streams.submit(task, uses)
        except BaseException:
            self._executed(model)
            raise
        if reply_later is not None:
            return None  # answered when the execution ends: no thread waits for it
        if sync:
            self.streams.wait(task.done.is_set)
            if task.error is not None:
                raise task.error
        return (), b""

    def _executed(self, model: _Model) -> None:
        with model.idle:
            model.queued -= 1
            model.idle.notify_all()

    def _buffer(self, ptr: int, size: int) -> Buffer:
        if size < 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"a dataset buffer of {size} bytes at {ptr:#x}")
        return Buffer(ptr, size, self.book.find(ptr, size, owner=self.session_id))

    def _dynamic_shape(self, desc: modelfile.ModelFile, inputs: list[Buffer]) -> tuple[int, tuple[int, int]]:
        """The batch or (h, w) of this execution, from the dynamic-shape input (0 / (0, 0): none)."""
        index = desc.dynamic_index()
        if index is None:
            return 0, (0, 0)
        raw = self.backend.peek(inputs[index].ptr, 16 if desc.hw_gears else 8, owner=self.session_id)
        if desc.batch_gears:
            (batch,) = struct.unpack_from("<Q", raw)
            if batch not in desc.batch_gears:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM,
                    f"batch {batch} is not one of the model's gears {list(desc.batch_gears)}"
                    " (aclmdlSetDynamicBatchSize sets it)",
                )
            return batch, (0, 0)
        h, w = struct.unpack_from("<QQ", raw)
        if (h, w) not in desc.hw_gears:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"height/width {h}x{w} is not one of the model's gears (aclmdlSetDynamicHWSize sets it)",
            )
        return 0, (h, w)

    def _sync_stream(self, device: int) -> int:
        stream_id = self._sync_streams.get(device)
        if stream_id is None or stream_id not in self.streams.streams:
            stream_id = self._sync_streams[device] = self.streams.create(device).stream_id
        return stream_id

    # -- lifecycle -------------------------------------------------------------------------------

    def close(self) -> None:
        """Unload every model and drop every blob (the session's work was drained or cancelled)."""
        with self._lock:
            models, self._models = list(self._models.values()), {}
            blobs, self._blobs = list(self._blobs.values()), {}
        for model in models:
            self._release(model)
        for blob in blobs:
            self._drop_blob(blob)
        self._sync_streams.clear()

    def _model(self, model_id: int) -> _Model:
        with self._lock:
            model = self._models.get(model_id)
        if model is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_MODEL_ID, f"model {model_id} is not loaded by this client"
            )
        return model

    def _blob(self, blob_id: int) -> _Blob:
        with self._lock:
            blob = self._blobs.get(blob_id)
        if blob is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"model bytes {blob_id} were not opened by this client"
            )
        return blob

    def _take_blob(self, blob_id: int) -> _Blob:
        with self._lock:
            blob = self._blobs.pop(blob_id, None)
        if blob is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"model bytes {blob_id} were not opened by this client"
            )
        return blob

    def blob_bytes(self, blob_id: int) -> memoryview:
        """The bytes of a blob this session wrote (another loader's: a kernel binary, ``kernels.py``)."""
        return self._blob(blob_id).view

    def consume_blob(self, blob_id: int) -> None:
        """Drop a blob another loader has used (its host memory returns to the claim's budget)."""
        self._drop_blob(self._take_blob(blob_id))

    def _drop_blob(self, blob: _Blob) -> None:
        blob.view.release()
        blob.data.close()
        self._unreserve(blob.size)

    def _reserve(self, size: int) -> None:
        if self.host is not None:
            self.host.reserve(size, buffer=False)

    def _unreserve(self, size: int) -> None:
        if self.host is not None:
            self.host.release(size, buffer=False)

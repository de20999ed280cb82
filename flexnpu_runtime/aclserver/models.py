"""One session's models: load, description, execution and unload (their bytes: ``model_bytes.py``).

The client sends a model's bytes first (``model_bytes.ModelBytes``), then loads them. A load
takes the model's weight and work memory from the device quota (207001 and a message when it
does not fit) unless the caller gives its own (``...WithMem``: pinned while the model is
loaded); its description, which the aclserver keeps while it is loaded, is charged to the
claim's host-memory budget. Executions (``model_runs.Executions``) are tasks on the session's
streams; unload waits for the model's queued executions. Every failure is an ``AclFailure`` and
changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flexnpu_runtime.aclserver.backend import AclFailure, Allocation, Backend, Buffer
from flexnpu_runtime.aclserver.hostmem import HostBudget
from flexnpu_runtime.aclserver.memory import Memory
from flexnpu_runtime.aclserver.model_bytes import HostCharge, ModelBytes
from flexnpu_runtime.aclserver.model_runs import Executions, Link, SessionModel
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_runtime.aclserver.streams import Streams
from flexnpu_wire import codes, modelfile
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

__all__ = ["DESC_COST_FIXED", "DESC_COST_PER_HEADER_BYTE", "MAX_MODELS", "Models"]

MAX_MODELS = 256
"""Models one session may have loaded at once."""
DESC_COST_PER_HEADER_BYTE = 3
DESC_COST_FIXED = 4096
"""What a loaded model's description costs the aclserver, charged to the claim's host-memory
budget while it is loaded: the parsed description and its rendered header take about 2.7 bytes
per header byte (a 54 KiB header: 147 KiB), plus the records around them."""
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]
TailHandler = Callable[[protocol.Message], tuple[tuple[int, ...], bytes] | None]


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
        self.streams = streams
        self._charge = HostCharge(host)
        self.blobs = ModelBytes(backend, memory, self._charge)
        self.executions = Executions(backend, book, session_id=session_id, streams=streams, link=link)
        self._current = current
        self._lock = threading.Lock()
        self._models: dict[int, SessionModel] = {}
        self._next_model = 1

    def handlers(self) -> dict[Op, Handler]:
        return {
            **self.blobs.handlers(),
            Op.MODEL_LOAD: self._load,
            Op.MODEL_UNLOAD: self._unload,
        }

    def tail_handlers(self) -> dict[Op, TailHandler]:
        return {
            **self.blobs.tail_handlers(),
            Op.MODEL_GET_DESC: self._get_desc,
            Op.MODEL_EXECUTE: self._execute,
        }

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
        blob = self.blobs.get(blob_id)
        desc = self.backend.describe_model(blob.view)
        header = modelfile.render_header(desc)
        charged = DESC_COST_FIXED + DESC_COST_PER_HEADER_BYTE * len(header)
        self._charge.reserve(charged)
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
            self._charge.release(charged)
            raise
        loaded.own, loaded.lent = own, list(pinned)
        self.blobs.drop(self.blobs.take(blob_id))
        with self._lock:
            model_id = self._next_model
            self._next_model += 1
            self._models[model_id] = SessionModel(loaded, header, charged)
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
        model.wait_idle(self.streams.cancelled)
        with self._lock:
            if self._models.get(ints[0]) is not model:
                raise AclFailure(codes.ACL_ERROR_INVALID_MODEL_ID, f"model {ints[0]} was unloaded meanwhile")
            del self._models[ints[0]]
        self._release(model)
        return ()

    def _release(self, model: SessionModel) -> None:
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
            self._charge.release(model.charged)
            model.charged = 0

    def _execute(self, msg: protocol.Message) -> tuple[tuple[int, ...], bytes] | None:
        return self.executions.execute(msg, self._model(msg.ints[0]))

    def close(self) -> None:
        """Unload every model and drop every blob (the session's work was drained or cancelled)."""
        with self._lock:
            models, self._models = list(self._models.values()), {}
        for model in models:
            self._release(model)
        self.blobs.close()
        self.executions.close()

    def _model(self, model_id: int) -> SessionModel:
        with self._lock:
            model = self._models.get(model_id)
        if model is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_MODEL_ID, f"model {model_id} is not loaded by this client"
            )
        return model

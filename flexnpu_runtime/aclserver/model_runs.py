"""One session's model executions: the call's checks, its dynamic-shape gear, and how it runs.

An execution is a task on a stream like a kernel (``streams.py``): it holds the die for the
model's cost under the share's policy, pins every buffer it reads or writes, then computes the
outputs. Its buffers are checked against the model's inputs and outputs; a model with a dynamic
batch or height/width input runs at the gear that input holds, which must be one of the model's
(``_dynamic_shape``). Stream 0 means synchronous (``aclmdlExecute``): when the session has
nothing queued on the device, the session thread runs it itself (``Streams.run_now``, no
hand-off) and keeps serving the connection while it waits (``Link.pause``); otherwise it is
queued and its reply is sent from the task's thread when it ends (``Link.send_later``). Either
way the client's other threads are not held up and no thread waits idle for it. Every failure is
an ``AclFailure`` and changes nothing.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass, field
from typing import Protocol

from flexnpu_runtime.aclserver.backend import AclFailure, Backend, Buffer, LoadedModel
from flexnpu_runtime.aclserver.ledger import Pause
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_wire import codes, modelfile
from flexnpu_wire import framing as protocol

__all__ = ["Executions", "Link", "SessionModel"]

_PAIR = struct.Struct(">qq")
_NO_HW = (0, 0)


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


@dataclass(slots=True, eq=False)
class SessionModel:
    """A model the session has loaded, as its executions and its unload see it."""

    loaded: LoadedModel
    header: bytes
    charged: int = 0
    """Host-memory budget bytes its description holds (``models.DESC_COST_*``)."""
    static_needs: tuple[int, ...] = field(init=False, default=())
    """Bytes each buffer needs when no gear is set (computed once)."""
    n_in: int = field(init=False, default=0)
    n_out: int = field(init=False, default=0)
    pairs: struct.Struct = field(init=False, default=_PAIR)
    """The execute tail of this model: one (pointer, size) pair per input and output."""
    dynamic: int | None = field(init=False, default=None)
    """Index of its dynamic-shape input (None: no gears)."""
    last: tuple[bytes, list[Buffer]] | None = field(init=False, default=None)
    """The last execute tail and the buffers found for it: a call with the same tail none of
    whose allocations was freed since has the same buffers (an allocation is never resized or
    given to another owner), without looking them up again."""
    queued: int = 0
    idle: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:  # what every execution checks against, worked out once
        desc = self.loaded.desc
        self.static_needs = _needs(desc, 0, (0, 0))
        self.n_in, self.n_out = len(desc.inputs), len(desc.outputs)
        self.pairs = struct.Struct(f">{2 * (self.n_in + self.n_out)}q")
        self.dynamic = desc.dynamic_index()

    def queue(self) -> None:
        with self.idle:
            self.queued += 1

    def executed(self) -> None:
        with self.idle:
            self.queued -= 1
            self.idle.notify_all()

    def wait_idle(self, cancelled: threading.Event) -> None:
        """Until none of its executions is queued (or the session's work is cancelled)."""
        with self.idle:
            while self.queued and not cancelled.is_set():
                self.idle.wait(0.5)


class Executions:
    """Executions of one session's models (``execute``, for ``models.Models``); thread-safe."""

    def __init__(
        self, backend: Backend, book: QuotaBook, *, session_id: int, streams: Streams, link: Link | None
    ) -> None:
        self.backend = backend
        self.book = book
        self.session_id = session_id
        self.streams = streams
        self._sync_streams: dict[int, int] = {}
        self._link = link
        """None (no server): a synchronous execution is queued and waits in its handler."""
        self._running_now = False

    def execute(self, msg: protocol.Message, model: SessionModel) -> tuple[tuple[int, ...], bytes] | None:
        """Queue an execution; a synchronous one is answered when it ends (None: no reply now)."""
        model_id, stream_id, n_in, n_out = msg.ints
        desc = model.loaded.desc
        if n_in != model.n_in:
            raise AclFailure(
                codes.ACL_ERROR_MODEL_INPUT_NOT_MATCH,
                f"model {model_id} has {model.n_in} inputs, {n_in} given",
            )
        if n_out != model.n_out:
            raise AclFailure(
                codes.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH,
                f"model {model_id} has {model.n_out} outputs, {n_out} given",
            )
        tail = msg.tail
        if len(tail) != model.pairs.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"the execute tail must hold {n_in + n_out} (pointer, size) pairs",
            )
        last = model.last
        if last is not None and last[0] == tail and not any(b.alloc.freed for b in last[1]):
            buffers = last[1]  # the same buffers as the last call, all still allocated: found then
        else:
            buffers = self._buffers(model, tail)
        inputs, outputs = buffers[:n_in], buffers[n_in:]
        if model.dynamic is None:
            batch, hw, needs = 0, _NO_HW, model.static_needs
        else:
            batch, hw = self._dynamic_shape(desc, inputs[model.dynamic])
            needs = model.static_needs if batch == 0 and hw == _NO_HW else _needs(desc, batch, hw)
        for i, buf in enumerate(buffers):
            if buf.size < needs[i]:
                tensor = modelfile.tensors(desc)[i]
                code = (
                    codes.ACL_ERROR_MODEL_INPUT_NOT_MATCH
                    if i < n_in
                    else codes.ACL_ERROR_MODEL_OUTPUT_NOT_MATCH
                )
                raise AclFailure(code, f"{tensor.name} needs {needs[i]} bytes, its buffer has {buf.size}")
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
        uses = [*model.loaded.own, *model.loaded.lent, *[b.alloc for b in buffers]]
        link = self._link if sync else None
        pause = link.pause if link is not None and not self._running_now else None
        if pause is not None:  # on this thread, if the device has nothing queued
            assert link is not None
            send, replied = link.send_later, [False]

            def reply_at_end() -> None:  # as the die time ends, before the bookkeeping after it
                send(_reply(msg, task.error))
                replied[0] = True

            task = Task(stream, cost_us, run, at_end=reply_at_end)
            model.queue()
            self._running_now = True
            try:
                ran = self.streams.run_now(task, uses, pause)
            finally:
                self._running_now = False
                model.executed()
            if ran:
                if replied[0]:
                    return None
                if task.error is not None:
                    raise task.error
                return (), b""
        reply_later = link.send_later if link is not None else None

        def ended() -> None:
            model.executed()
            if reply_later is not None:  # the synchronous call's reply, from the task's own thread
                reply_later(_reply(msg, task.error))

        task = Task(stream, cost_us, run, then=ended)
        model.queue()
        try:
            self.streams.submit(task, uses)
        except BaseException:
            model.executed()
            raise
        if reply_later is not None:
            return None  # answered when the execution ends: no thread waits for it
        if sync:
            self.streams.wait(lambda: task.finished)
            if task.error is not None:
                raise task.error
        return (), b""

    def _buffers(self, model: SessionModel, tail: bytes) -> list[Buffer]:
        """The allocations of the execute tail's (pointer, size) pairs (remembered for the next call)."""
        raw = model.pairs.unpack(tail)
        find, owner, buffers = self.book.find, self.session_id, []
        for i in range(0, len(raw), 2):
            ptr, size = raw[i], raw[i + 1]
            if size < 0:
                raise AclFailure(
                    codes.ACL_ERROR_INVALID_PARAM, f"a dataset buffer of {size} bytes at {ptr:#x}"
                )
            buffers.append(Buffer(ptr, size, find(ptr, size, owner=owner)))
        model.last = (tail, buffers)
        return buffers

    def _dynamic_shape(self, desc: modelfile.ModelFile, gear: Buffer) -> tuple[int, tuple[int, int]]:
        """The batch or (h, w) of this execution, from its dynamic-shape input ``gear``."""
        raw = self.backend.peek(gear.ptr, 16 if desc.hw_gears else 8, owner=self.session_id)
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

    def close(self) -> None:
        """Forget the synchronous streams (the session's streams are being destroyed)."""
        self._sync_streams.clear()


def _reply(msg: protocol.Message, err: AclFailure | None) -> bytes:
    """A synchronous execution's reply frame, sent by whoever ran it."""
    return protocol.encode_reply(
        msg.op, msg.request_id, err.code if err else 0, tail=err.message.encode() if err else b""
    )

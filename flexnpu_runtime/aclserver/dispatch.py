"""One connection's ACL session: the op table dispatch, init/finalize and the current device.

``Session.handle`` turns a request frame into a reply frame: it looks the op up in one table
built from the parts that own the calls — ``memory.Memory`` (device memory, host buffers,
copies), ``streams.Streams`` (streams, kernels, the task queue) — checks arity against the wire
op table (``flexnpu_wire/ops.py``) and that ``aclInit`` came first, and encodes what the handler
returns. Every failure is an ``AclFailure`` reply and changes nothing. Every allocation is tagged
with the session, so closing it (its client exited, even by SIGKILL) cancels its work and
releases exactly its memory, streams and regions; the other sessions keep theirs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from flexnpu_runtime.aclserver.backend import AclFailure, Backend
from flexnpu_runtime.aclserver.hostmem import HostBudget
from flexnpu_runtime.aclserver.kernels import Kernels
from flexnpu_runtime.aclserver.memory import Memory
from flexnpu_runtime.aclserver.model_runs import Link
from flexnpu_runtime.aclserver.models import Models
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_runtime.aclserver.streams import WAITING_OPS, Streams
from flexnpu_runtime.aclserver.vmm import VirtualMemory
from flexnpu_wire import codes, ops
from flexnpu_wire import framing as protocol
from flexnpu_wire.framing import Op

if TYPE_CHECKING:
    from flexnpu_runtime.aclserver.opexec import Operators

__all__ = ["WAITING_OPS", "FdReply", "Session"]

_session_ids = itertools.count(1 << 40)
_encode_reply = protocol.encode_reply
_MODEL_EXECUTE = int(Op.MODEL_EXECUTE)
_STAGING_FD = int(Op.STAGING_FD)
_OPERATOR = int(Op.OPERATOR)
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]
TailHandler = Callable[[protocol.Message], tuple[tuple[int, ...], bytes] | None]
"""An op whose request or reply carries a tail: the whole message in, (values, reply tail) out;
None: the reply is sent later (through the session's ``Link``)."""
FdHandler = Callable[[protocol.Message], tuple[tuple[int, ...], int]]
"""An op whose reply passes a file descriptor (unix socket only): (values, fd) out."""


class FdReply(NamedTuple):
    """A reply frame to send with one file descriptor (SCM_RIGHTS); the session keeps the fd."""

    frame: bytes
    fd: int


class Session:
    """ACL state of one connected client. ``handle`` turns a request frame into a reply frame.

    ``host`` is the claim's host-memory budget and ``sessions`` counts the claim's sessions (None:
    a session of its own); ``link`` is its connection (None: every call is answered by its handler)."""

    def __init__(
        self,
        backend: Backend,
        book: QuotaBook,
        *,
        shm_dir: str,
        staging_bytes: int,
        host: HostBudget | None = None,
        sessions: Callable[[], int] = lambda: 1,
        session_id: int = 0,
        client_pid: int = 0,
        unix: bool = False,
        link: Link | None = None,
    ) -> None:
        self.backend = backend
        self.book = book
        self._sessions = sessions
        self._link = link
        self.session_id = session_id or next(_session_ids)
        self.client_pid = client_pid
        self._closed = False
        self.initialized = False
        self.device: int | None = None
        self.memory = Memory(
            backend, book, session_id=self.session_id, shm_dir=shm_dir, staging_bytes=staging_bytes,
            host=host, current=self._current, device=lambda: self.device, unix=unix,
        )  # fmt: skip
        self.streams = Streams(backend, book, session_id=self.session_id, current=self._current)
        self.models = Models(
            backend, book, session_id=self.session_id, memory=self.memory, streams=self.streams,
            host=host, current=self._current, link=link,
        )  # fmt: skip
        self._backend, self._book = backend, book
        self._operators: Operators | None = None  # made at the first operator (numpy loads with it)
        self.vmm = VirtualMemory(backend, book, session_id=self.session_id)
        self.kernels = Kernels(backend, blobs=self.models.blobs, streams=self.streams, current=self._current)
        self.staging = self.memory.staging
        handlers: dict[Op, Handler] = {
            Op.INIT: self._init,
            Op.FINALIZE: self._finalize,
            Op.GET_DEVICE_COUNT: self._get_device_count,
            Op.SET_DEVICE: self._set_device,
            Op.RESET_DEVICE: self._reset_device,
            Op.GET_DEVICE: self._get_device,
            Op.GET_USAGE: self._get_usage,
            **self.memory.handlers(),
            **self.streams.handlers(),
            **self.models.handlers(),
            **self.vmm.handlers(),
            **self.kernels.handlers(),
        }
        tail_handlers: dict[Op, TailHandler] = {
            Op.MALLOC_HOST: self.memory.malloc_host,
            **self.models.tail_handlers(),
            **self.kernels.tail_handlers(),
        }
        # arity comes from the op table (flexnpu_wire/ops.py), the one definition of each layout
        self._handlers: dict[int, tuple[frozenset[int], Handler, bool]] = {
            int(op): (_arities(op), fn, op not in (Op.INIT, Op.FINALIZE)) for op, fn in handlers.items()
        }
        self._tail_handlers: dict[int, tuple[frozenset[int], TailHandler]] = {
            int(op): (_arities(op), fn) for op, fn in tail_handlers.items()
        }
        fd_handlers: dict[Op, FdHandler] = {
            Op.STAGING_FD: self.memory.staging_fd,
            Op.MALLOC_HOST_FD: self.memory.malloc_host_fd,
        }
        self._fd_handlers = {int(op): (_arities(op), fn) for op, fn in fd_handlers.items()}
        self._unanswered: dict[int, tuple[frozenset[int], Callable[[protocol.Message], None]]] = {
            _OPERATOR: (_arities(Op.OPERATOR), self._operator),
        }

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, msg: protocol.Message) -> bytes | FdReply | None:
        """Execute one request and return the encoded reply (never raises AclFailure); a reply
        that passes a file descriptor is an ``FdReply``; None: it is sent later, when its work
        ends (through the session's ``Link``)."""
        op, ints = msg.op, msg.ints
        unanswered = self._unanswered.get(op)
        if unanswered is not None:  # never answered: a failure is the stream's (opexec.py)
            unanswered[1](msg)
            return None
        try:
            entry = self._handlers.get(op)
            if entry is None:
                return self._handle_tail(msg)
            arities, handler, needs_init = entry
            if len(ints) not in arities:
                self._arity(msg, min(arities))
            if needs_init and not self.initialized:
                self._need_init()
            return _encode_reply(op, msg.request_id, 0, *handler(ints))
        except AclFailure as exc:
            return protocol.encode_reply(msg.op, msg.request_id, exc.code, tail=exc.message.encode())

    def _handle_tail(self, msg: protocol.Message) -> bytes | FdReply | None:
        entry = self._tail_handlers.get(msg.op)
        if entry is None:
            fd_entry = self._fd_handlers.get(msg.op)
            if fd_entry is None:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown op {msg.op}")
            if len(msg.ints) not in fd_entry[0]:
                self._arity(msg, min(fd_entry[0]))
            self._need_init() if msg.op != _STAGING_FD else None
            values, fd = fd_entry[1](msg)
            return FdReply(_encode_reply(msg.op, msg.request_id, 0, *values), fd)
        arities, handler = entry
        if len(msg.ints) not in arities:
            self._arity(msg, min(arities))
        self._need_init()
        result = handler(msg)
        if result is None:
            return None
        values, tail = result
        return _encode_reply(msg.op, msg.request_id, 0, *values, tail=tail)

    def would_block(self, msg: protocol.Message) -> bool:
        """True for a call that waits for queued work (a synchronize or destroy with kernels to
        wait for, a synchronous model execution, an unload): the server runs it off the session's
        thread, so the other threads of the client are not held up behind it."""
        if msg.op == _MODEL_EXECUTE:  # answered by its task when it ends, unless no server set that up
            return self._link is None and len(msg.ints) > 1 and msg.ints[1] == 0
        return msg.op in WAITING_OPS and self.streams.busy()

    def cancel(self) -> None:
        """Stop running and queued work and wake any call waiting on it (thread-safe)."""
        self.streams.cancel()

    def close(self) -> None:
        """Cancel work, free every allocation and remove every region file of this session."""
        if self._closed:
            return
        self._closed = True
        self.streams.close()
        self.kernels.close()
        self.models.close()
        self.memory.close()

    @property
    def operators(self) -> Operators:
        """The session's operator executor, made at its first operator: numpy and the operator library load
        only in an aclserver whose tenant runs operators (a zygote and a plain ACL program's aclserver stay lean)."""
        if self._operators is None:
            from flexnpu_runtime.aclserver.opexec import Operators

            self._operators = Operators(
                self._backend, self._book, session_id=self.session_id, streams=self.streams
            )
        return self._operators

    def _operator(self, msg: protocol.Message) -> None:
        self.operators.launch(msg, initialized=self.initialized)

    # -- lifecycle and devices -------------------------------------------------------------------

    def _init(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        if self.initialized:
            raise AclFailure(codes.ACL_ERROR_REPEAT_INITIALIZE, "acl.init was already called")
        self.initialized = True
        return ()

    def _finalize(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        if not self.initialized:
            raise AclFailure(codes.ACL_ERROR_REPEAT_FINALIZE, "acl.finalize without acl.init")
        self.streams.drain()
        self.kernels.close()
        self.models.close()
        self.streams.forget_streams()
        self.book.release_all(owner=self.session_id)
        self.memory.drop_host_buffers()
        self.initialized = False
        self.device = None
        return ()

    def _get_device_count(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        return (self.book.device_count(),)

    def _set_device(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        device, count = ints[0], self.book.device_count()
        if not 0 <= device < count:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_DEVICE,
                f"device {device} does not exist (this claim has 0..{count - 1})",
            )
        self.device = device
        return ()

    def _reset_device(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        self._set_device(ints)
        self.device = None
        return ()

    def _get_device(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        return (self._current(),)

    def _get_usage(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        device = ints[0]
        free, total = self.backend.mem_info(device)
        compute_us, compute_quota = self.book.compute_usage(device)
        return total - free, total, compute_us, compute_quota, self._sessions()

    # -- helpers ---------------------------------------------------------------------------------

    def _current(self) -> int:
        if self.device is None:
            raise AclFailure(codes.ACL_ERROR_INVALID_DEVICE, "no device is set; call set_device first")
        return self.device

    def _need_init(self) -> None:
        if not self.initialized:
            raise AclFailure(codes.ACL_ERROR_UNINITIALIZE, "acl.init has not been called")

    @staticmethod
    def _arity(msg: protocol.Message, n: int) -> None:
        if len(msg.ints) != n:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"op {msg.op} takes {n} values, got {len(msg.ints)}"
            )


def _arities(op: Op) -> frozenset[int]:
    row = ops.spec_of(op)
    assert row is not None, f"op {op!r} has no row in flexnpu_wire/ops.py"
    return frozenset(row.arities)

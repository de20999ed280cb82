"""The claim's sessions: what they share (``Claim``) and one connection's ACL state (``Session``).

``Claim`` is what every session of one aclserver shares: the backend (so the memory and compute
quota is the claim's, across sessions), the host-buffer budget in the claim's shm dir, and the
session limit (``max_sessions``). ``Session`` owns ACL call semantics for one connection:
init/finalize state, the current device, streams and their kernel queues (one worker thread
per device), its host regions of the data link, and argument validation (every failure is an
``AclFailure`` reply and changes nothing). Every allocation is tagged with its session, so
closing a session (its client exited, even by SIGKILL) cancels its kernels and releases exactly
its memory, streams and regions; the other sessions keep theirs.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dra_driver.aclserver import datalink, scheduling
from dra_driver.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, Backend
from flexnpu_wire import codes, ops
from flexnpu_wire import framing as protocol
from flexnpu_wire.datalink import (
    OFFSET_BITS,
    STAGING_REGION,
    host_ptr,
    is_host_ptr,
    region_name,
    split_host_ptr,
)
from flexnpu_wire.framing import Op
from flexnpu_wire.launch import AclServerSpec

__all__ = ["MAX_KERNEL_US", "Claim", "Session", "SessionRefused"]

MAX_KERNEL_US = 10_000_000
MAX_HOST_BUFFERS = 256
MAX_STREAMS = 1024
MAX_PENDING_KERNELS = 65_536
_ACL_ERROR_RT_NO_STREAM_RESOURCE = codes.ACL_ERROR_RT_NO_STREAM_RESOURCE
_PAGE = 4096
_ACL_ERROR_REPEAT_FINALIZE = codes.ACL_ERROR_REPEAT_FINALIZE
_STREAM_BASE = 0x5_0000_0000
_region_names = itertools.count(1)
_session_ids = itertools.count(1)
_MEM_ATTRS = frozenset(int(a) for a in codes.MemAttr)
_MALLOC_HOST = int(Op.MALLOC_HOST)
WAITING_OPS = frozenset({int(Op.SYNCHRONIZE_STREAM), int(Op.SYNCHRONIZE_DEVICE), int(Op.DESTROY_STREAM)})
_encode_reply = protocol.encode_reply
_MEMCPY_KINDS = frozenset(int(k) for k in codes.MemcpyKind)


class SessionRefused(Exception):
    """HELLO was valid but no session can be opened (the claim is at its session limit)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Claim:
    """What the sessions of one claim share; thread-safe."""

    def __init__(
        self,
        backend: Backend,
        spec: AclServerSpec,
        *,
        on_sessions_changed: Callable[[int], None] = lambda _n: None,
    ) -> None:
        self.backend = backend
        self.spec = spec
        self._lock = threading.Lock()
        self._sessions: dict[int, Session] = {}
        self._host_bytes = 0
        self._host_buffers = 0
        self._opening = 0
        self._on_change = on_sessions_changed

    def open_session(self, client_pid: int) -> Session:
        """A new session (SessionRefused at the limit; OSError if its staging region fails)."""
        with self._lock:
            if len(self._sessions) + self._opening >= self.spec.max_sessions:
                raise SessionRefused(
                    codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
                    f"the aclserver of claim {self.spec.claim_uid} already serves {len(self._sessions)}"
                    f" sessions, its limit (max_sessions {self.spec.max_sessions})",
                )
            session_id = next(_session_ids)
            self._opening += 1
        try:
            session = Session(
                self.backend,
                shm_dir=self.spec.shm_dir,
                staging_bytes=self.spec.staging_bytes,
                claim=self,
                session_id=session_id,
                client_pid=client_pid,
            )
        finally:
            with self._lock:
                self._opening -= 1
        with self._lock:
            self._sessions[session_id] = session
            count = len(self._sessions)
        self._on_change(count)
        return session

    def close_session(self, session: Session) -> None:
        """Release everything ``session`` holds (idempotent)."""
        session.close()
        with self._lock:
            gone = self._sessions.pop(session.session_id, None) is not None
            count = len(self._sessions)
        if gone:
            self._on_change(count)

    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def reserve_host(self, size: int) -> None:
        """Book ``size`` bytes of host buffers against the claim's memory quota (AclFailure if over)."""
        limit = sum(self.backend.mem_info(d)[1] for d in range(self.backend.device_count()))
        with self._lock:
            if self._host_bytes + size > limit or self._host_buffers >= MAX_HOST_BUFFERS:
                raise AclFailure(
                    codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                    f"host buffer of {size} bytes refused: {self._host_bytes} bytes in {self._host_buffers}"
                    f" host buffers already, the limit is {limit} bytes (the claim's memory quota)"
                    f" and {MAX_HOST_BUFFERS} buffers",
                )
            self._host_bytes += size
            self._host_buffers += 1

    def release_host(self, size: int) -> None:
        with self._lock:
            self._host_bytes -= size
            self._host_buffers -= 1


@dataclass(slots=True)
class _Stream:
    stream_id: int
    device: int
    pending: int = 0


@dataclass(slots=True)
class _Kernel:
    stream: _Stream
    duration_us: int
    tag: int
    out_ptr: int
    input_view: memoryview | None


@dataclass(slots=True)
class _Worker:
    """Runs one device's kernels in launch order."""

    device: int
    queue: deque[_Kernel] = field(default_factory=deque)
    thread: threading.Thread | None = None


class Session:
    """ACL state of one connected client. ``handle`` turns a request frame into a reply frame."""

    def __init__(
        self,
        backend: Backend,
        *,
        shm_dir: str,
        staging_bytes: int,
        claim: Claim | None = None,
        session_id: int = 0,
        client_pid: int = 0,
    ) -> None:
        self.backend = backend
        self.shm_dir = shm_dir
        self.claim = claim
        self.session_id = session_id or next(_session_ids)
        self.client_pid = client_pid
        self._closed = False
        self.initialized = False
        self.device: int | None = None
        self.regions: dict[int, datalink.Region] = {}
        self.streams: dict[int, _Stream] = {}
        self.kernels_done = 0
        self.kernel_us_done = 0
        self._next_region = 1
        self._next_stream = _STREAM_BASE
        self._workers: dict[int, _Worker] = {}
        self._cond = threading.Condition()
        self._cancel = threading.Event()
        self.staging = self._new_region("staging", staging_bytes, 0)
        handlers: dict[Op, Callable[[tuple[int, ...]], tuple[int, ...]]] = {
            Op.INIT: self._init,
            Op.FINALIZE: self._finalize,
            Op.GET_DEVICE_COUNT: self._get_device_count,
            Op.SET_DEVICE: self._set_device,
            Op.RESET_DEVICE: self._reset_device,
            Op.GET_DEVICE: self._get_device,
            Op.MALLOC: self._malloc,
            Op.FREE: self._free,
            Op.MEMCPY: self._memcpy,
            Op.MEMSET: self._memset,
            Op.GET_MEM_INFO: self._get_mem_info,
            Op.FREE_HOST: self._free_host,
            Op.CREATE_STREAM: self._create_stream,
            Op.DESTROY_STREAM: self._destroy_stream,
            Op.SYNCHRONIZE_STREAM: self._synchronize_stream,
            Op.SYNCHRONIZE_DEVICE: self._synchronize_device,
            Op.LAUNCH_KERNEL: self._launch_kernel,
            Op.GET_STATS: self._get_stats,
            Op.GET_USAGE: self._get_usage,
        }
        # arity comes from the op table (flexnpu_wire/ops.py), the one definition of each layout
        self._handlers: dict[
            int, tuple[frozenset[int], Callable[[tuple[int, ...]], tuple[int, ...]], bool]
        ] = {
            int(op): (frozenset(ops.spec_of(op).arities), fn, op not in (Op.INIT, Op.FINALIZE))  # type: ignore[union-attr]
            for op, fn in handlers.items()
        }

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, msg: protocol.Message) -> bytes:
        """Execute one request and return the encoded reply (never raises AclFailure)."""
        op, ints = msg.op, msg.ints
        try:
            entry = self._handlers.get(op)
            if entry is None:
                if op == _MALLOC_HOST:
                    self._need_init()
                    self._arity(msg, 1)
                    ptr, size, name = self._malloc_host(ints[0])
                    return _encode_reply(op, msg.request_id, 0, ptr, size, tail=name.encode())
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown op {op}")
            arities, handler, needs_init = entry
            if len(ints) not in arities:
                self._arity(msg, min(arities))
            if needs_init and not self.initialized:
                self._need_init()
            return _encode_reply(op, msg.request_id, 0, *handler(ints))
        except AclFailure as exc:
            return protocol.encode_reply(msg.op, msg.request_id, exc.code, tail=exc.message.encode())

    def would_block(self, msg: protocol.Message) -> bool:
        """True for a synchronize/destroy that has kernels to wait for: the server runs it off
        the session's thread, so the other threads of the client are not held up behind it."""
        if msg.op not in WAITING_OPS:
            return False
        with self._cond:
            return any(s.pending for s in self.streams.values())

    def cancel(self) -> None:
        """Stop running and queued kernels and wake any call waiting on them (thread-safe)."""
        self._cancel.set()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Cancel kernels, free every allocation and remove every region file of this session."""
        if self._closed:
            return
        self._closed = True
        self.cancel()
        for worker in list(self._workers.values()):
            if worker.thread is not None:
                worker.thread.join()
        self._workers.clear()
        self.streams.clear()
        self.backend.release_all(owner=self.session_id)
        for rid in list(self.regions):
            self._drop_region(rid)

    # -- lifecycle and devices -------------------------------------------------------------------

    def _init(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        if self.initialized:
            raise AclFailure(codes.ACL_ERROR_REPEAT_INITIALIZE, "acl.init was already called")
        self.initialized = True
        return ()

    def _finalize(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        if not self.initialized:
            raise AclFailure(_ACL_ERROR_REPEAT_FINALIZE, "acl.finalize without acl.init")
        self._drain_all()
        self.streams.clear()
        self.backend.release_all(owner=self.session_id)
        for rid in [r for r in self.regions if r != 0]:
            self._drop_region(rid)
        self.initialized = False
        self.device = None
        return ()

    def _get_device_count(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        return (self.backend.device_count(),)

    def _set_device(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        device = ints[0]
        if not 0 <= device < self.backend.device_count():
            raise AclFailure(
                codes.ACL_ERROR_INVALID_DEVICE,
                f"device {device} does not exist (this claim has 0..{self.backend.device_count() - 1})",
            )
        self.device = device
        return ()

    def _reset_device(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        self._set_device(ints)
        self.device = None
        return ()

    def _get_device(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        return (self._current(),)

    # -- memory ------------------------------------------------------------------------------------

    def _malloc(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        size, policy = ints
        return (self.backend.malloc(self._current(), size, policy, owner=self.session_id),)

    def _free(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        self.backend.free(ints[0], owner=self.session_id)
        return ()

    def _get_mem_info(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        if ints[0] not in _MEM_ATTRS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown memory attribute {ints[0]}")
        device = self.device
        return self.backend.mem_info(self._current() if device is None else device)

    def _memset(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        ptr, dst_max, value, count = ints
        if count < 0 or count > dst_max:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memset count {count} must be in 0..dst_max ({dst_max})"
            )
        self.backend.memset(ptr, value, count, owner=self.session_id)
        return ()

    def _memcpy(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        dst, dst_max, src, count, kind = ints[:5]
        # A chunk of a staged copy carries the span of the whole remaining copy as a 6th value:
        # the device side is checked for all of it up front, so a bad copy changes nothing.
        span = ints[5] if len(ints) > 5 else count
        if span < count:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy span {span} is shorter than count {count}"
            )
        if count < 0 or count > dst_max:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy count {count} must be in 0..dst_max ({dst_max})"
            )
        if kind not in _MEMCPY_KINDS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown memcpy kind {kind}")
        src_host, dst_host = is_host_ptr(src), is_host_ptr(dst)
        expected = {
            codes.MemcpyKind.HOST_TO_HOST: (True, True),
            codes.MemcpyKind.HOST_TO_DEVICE: (True, False),
            codes.MemcpyKind.DEVICE_TO_HOST: (False, True),
            codes.MemcpyKind.DEVICE_TO_DEVICE: (False, False),
        }.get(codes.MemcpyKind(kind), (src_host, dst_host))
        if expected != (src_host, dst_host):
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"memcpy kind {codes.MemcpyKind(kind).name} does not match the pointers given",
            )
        src_region = self._host_region(src, count) if src_host else None
        dst_region = self._host_region(dst, count) if dst_host else None
        if not getattr(self.backend, "host_addressable", True):  # device memory reached only by copies
            self.backend.memcpy_regions(  # type: ignore[attr-defined]
                dst=dst, src=src, count=count, span=span, dst_region=dst_region, src_region=src_region,
                owner=self.session_id,
            )  # fmt: skip
            return ()
        src_view = None if src_host else self.backend.device_view(src, span, owner=self.session_id)[:count]
        dst_view = None if dst_host else self.backend.device_view(dst, span, owner=self.session_id)[:count]
        try:
            if src_region is not None and dst_region is not None:
                buf = memoryview(bytearray(count))
                src_region.read_into(split_host_ptr(src)[1], buf)
                dst_region.write_from(split_host_ptr(dst)[1], buf)
            elif src_region is not None:
                assert dst_view is not None
                src_region.read_into(split_host_ptr(src)[1], dst_view)
            elif dst_region is not None:
                assert src_view is not None
                dst_region.write_from(split_host_ptr(dst)[1], src_view)
            else:
                assert dst_view is not None and src_view is not None
                dst_view[:] = src_view
        except OSError as exc:
            # the client truncated or broke its own region file: its copy fails, nothing else
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memcpy through the data link failed: {exc}"
            ) from exc
        return ()

    def _malloc_host(self, size: int) -> tuple[int, int, str]:
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc_host size must be positive, got {size}")
        if size >= 1 << OFFSET_BITS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc_host size {size} is too large")
        rounded = -(-size // _PAGE) * _PAGE
        # Host buffers live in the claim's shm dir: bound them, across every session of the
        # claim, by its memory quota.
        claim = self.claim
        if claim is not None:
            claim.reserve_host(rounded)
        rid = self._next_region
        try:
            region = self._new_region("host", rounded, rid)
        except OSError as exc:
            if claim is not None:
                claim.release_host(rounded)
            raise AclFailure(
                codes.ACL_ERROR_BAD_ALLOC, f"cannot create a host buffer of {size} bytes: {exc}"
            ) from exc
        self._next_region += 1
        return host_ptr(region.region_id), rounded, region.name

    def _free_host(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        ptr = ints[0]
        rid, offset = split_host_ptr(ptr) if is_host_ptr(ptr) else (-1, -1)
        if rid <= 0 or offset != 0 or rid not in self.regions:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} is not a host buffer of this client"
            )
        self._drop_region(rid)
        return ()

    def _drop_region(self, rid: int) -> None:
        region = self.regions.pop(rid)
        region.close()
        if rid != STAGING_REGION and self.claim is not None:
            self.claim.release_host(region.size)

    def _host_region(self, ptr: int, count: int) -> datalink.Region:
        rid, offset = split_host_ptr(ptr)
        region = self.regions.get(rid)
        if region is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"host pointer {ptr:#x} is not a buffer of this client"
            )
        if count < 0 or offset + count > region.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{count} bytes at host pointer {ptr:#x} run past its buffer ({region.size} bytes)",
            )
        return region

    # -- streams and kernels ---------------------------------------------------------------------

    def _create_stream(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        if len(self.streams) >= MAX_STREAMS:
            raise AclFailure(_ACL_ERROR_RT_NO_STREAM_RESOURCE, f"at most {MAX_STREAMS} streams per client")
        self._next_stream += 1
        stream = _Stream(self._next_stream, self._current())
        with self._cond:
            self.streams[stream.stream_id] = stream
        return (stream.stream_id,)

    def _destroy_stream(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream = self._stream(ints[0])
        self._wait(lambda: stream.pending == 0)
        with self._cond:
            self.streams.pop(stream.stream_id, None)
        return ()

    def _synchronize_stream(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream = self._stream(ints[0])
        self._wait(lambda: stream.pending == 0)
        return ()

    def _synchronize_device(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        device = self._current()
        self._wait(lambda: all(s.pending == 0 for s in self.streams.values() if s.device == device))
        return ()

    def _launch_kernel(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream_id, duration_us, tag, out_ptr, in_ptr, in_len = ints
        stream = self._stream(stream_id)
        if not 0 < duration_us <= MAX_KERNEL_US:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"kernel duration_us must be in 1..{MAX_KERNEL_US}, got {duration_us}",
            )
        if out_ptr:
            self.backend.device_view(out_ptr, KERNEL_RESULT_BYTES, owner=self.session_id)
        input_view = self.backend.device_view(in_ptr, in_len, owner=self.session_id) if in_ptr else None
        with self._cond:
            queued = sum(s.pending for s in self.streams.values())
        if queued >= MAX_PENDING_KERNELS:
            raise AclFailure(
                codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL, f"at most {MAX_PENDING_KERNELS} kernels may be queued"
            )
        kernel = _Kernel(stream, duration_us, tag, out_ptr, input_view)
        worker = self._workers.get(stream.device)
        if worker is None:
            worker = self._workers[stream.device] = _Worker(stream.device)
            worker.thread = threading.Thread(
                target=self._run_worker, args=(worker,), daemon=True, name=f"kernels-dev{stream.device}"
            )
            worker.thread.start()
        with self._cond:
            stream.pending += 1
            worker.queue.append(kernel)
            self._cond.notify_all()
        with self._cond:
            return (self.kernels_done + sum(s.pending for s in self.streams.values()),)

    def _get_stats(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        with self._cond:
            return self.kernels_done, self.kernel_us_done

    def _get_usage(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        device = ints[0]
        free, total = self.backend.mem_info(device)
        compute_us, compute_quota = self.backend.compute_usage(device)
        sessions = self.claim.session_count() if self.claim is not None else 1
        return total - free, total, compute_us, compute_quota, sessions

    def _run_worker(self, worker: _Worker) -> None:
        """Run the device's kernels slice by slice. While a slice runs, the next one (of this
        kernel or the next queued one) is booked just before the die frees, so a busy device
        loses no die time between slices. The host thread sleeps while the die is held."""
        booked: tuple[float, float] | None = None
        while True:
            with self._cond:
                while not worker.queue and not self._cancel.is_set():
                    self._cond.wait()
                if self._cancel.is_set():
                    for kernel in worker.queue:
                        kernel.stream.pending -= 1
                    worker.queue.clear()
                    self._cond.notify_all()
                    return
                kernel = worker.queue[0]
            remaining, used = kernel.duration_us, 0
            while remaining > 0:
                grant = booked or self.backend.acquire_slice(
                    worker.device, min(remaining, scheduling.SLICE_US), self._cancel
                )
                booked = None
                if grant is None:
                    break
                start, end = grant
                got = round((end - start) * 1e6)
                remaining -= got
                used += got
                nxt = self._next_want(worker, remaining)
                lookahead_at = end - scheduling.LOOKAHEAD_US / 1e6
                if nxt and not self._cancel.wait(max(0.0, lookahead_at - time.monotonic())):
                    booked = self.backend.acquire_slice(worker.device, nxt, self._cancel)
                if self._cancel.wait(max(0.0, end - time.monotonic())):
                    break
            if remaining > 0:
                continue  # cancelled: the top of the loop drains the queue
            self.backend.complete_kernel(
                out_ptr=kernel.out_ptr, tag=kernel.tag, input_view=kernel.input_view, owner=self.session_id
            )
            with self._cond:
                worker.queue.popleft()
                kernel.stream.pending -= 1
                self.kernels_done += 1
                self.kernel_us_done += used
                self._cond.notify_all()

    def _next_want(self, worker: _Worker, remaining: int) -> int:
        """Length of the slice to book next: the rest of this kernel, else the next queued kernel."""
        if remaining > 0:
            return min(remaining, scheduling.SLICE_US)
        with self._cond:
            return min(worker.queue[1].duration_us, scheduling.SLICE_US) if len(worker.queue) > 1 else 0

    # -- helpers ---------------------------------------------------------------------------------

    def _drain_all(self) -> None:
        self._wait(lambda: all(s.pending == 0 for s in self.streams.values()))

    def _wait(self, done: Callable[[], bool]) -> None:
        with self._cond:
            while not done() and not self._cancel.is_set():
                self._cond.wait(0.5)
        if self._cancel.is_set():
            raise AclFailure(
                codes.ACL_ERROR_INTERNAL_ERROR, "the aclserver is stopping; queued kernels were cancelled"
            )

    def _stream(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            raise AclFailure(codes.ACL_ERROR_INVALID_RESOURCE_HANDLE, f"stream {stream_id:#x} does not exist")
        return stream

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

    def _new_region(self, kind: str, size: int, rid: int) -> datalink.Region:
        name = region_name(kind, os.getpid(), next(_region_names))
        region = datalink.create_region(self.shm_dir, name, size, rid)
        self.regions[rid] = region
        return region

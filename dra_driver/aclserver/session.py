"""One authenticated client connection's ACL state and the op handlers.

Owns ACL call semantics on the server side: init/finalize state, the current device, streams
and their kernel queues (one worker thread per device), host regions of the data link, and
argument validation (every failure is an ``AclFailure`` reply and changes nothing). Closing a
session cancels queued kernels and releases every allocation and region it holds.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from dra_driver.aclserver import codes, datalink, protocol, scheduling
from dra_driver.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, Backend
from dra_driver.aclserver.protocol import Op

__all__ = ["MAX_KERNEL_US", "Session"]

MAX_KERNEL_US = 10_000_000
MAX_HOST_BUFFERS = 256
MAX_STREAMS = 1024
MAX_PENDING_KERNELS = 65_536
_ACL_ERROR_RT_NO_STREAM_RESOURCE = 207008
_PAGE = 4096
_ACL_ERROR_REPEAT_FINALIZE = 100037
_STREAM_BASE = 0x5_0000_0000
_region_names = itertools.count(1)


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

    def __init__(self, backend: Backend, *, shm_dir: str, staging_bytes: int) -> None:
        self.backend = backend
        self.shm_dir = shm_dir
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
        self._handlers: dict[int, tuple[int, Callable[[tuple[int, ...]], tuple[int, ...]]]] = {
            Op.INIT: (0, self._init),
            Op.FINALIZE: (0, self._finalize),
            Op.GET_DEVICE_COUNT: (0, self._get_device_count),
            Op.SET_DEVICE: (1, self._set_device),
            Op.RESET_DEVICE: (1, self._reset_device),
            Op.GET_DEVICE: (0, self._get_device),
            Op.MALLOC: (2, self._malloc),
            Op.FREE: (1, self._free),
            Op.MEMCPY: (5, self._memcpy),
            Op.MEMSET: (4, self._memset),
            Op.GET_MEM_INFO: (1, self._get_mem_info),
            Op.FREE_HOST: (1, self._free_host),
            Op.CREATE_STREAM: (0, self._create_stream),
            Op.DESTROY_STREAM: (1, self._destroy_stream),
            Op.SYNCHRONIZE_STREAM: (1, self._synchronize_stream),
            Op.SYNCHRONIZE_DEVICE: (0, self._synchronize_device),
            Op.LAUNCH_KERNEL: (6, self._launch_kernel),
            Op.GET_STATS: (0, self._get_stats),
        }

    # -- dispatch ---------------------------------------------------------------------------------

    def handle(self, msg: protocol.Message) -> bytes:
        """Execute one request and return the encoded reply (never raises AclFailure)."""
        try:
            if msg.op == Op.MALLOC_HOST:
                self._need_init()
                self._arity(msg, 1)
                ptr, size, name = self._malloc_host(msg.ints[0])
                return protocol.encode_reply(
                    msg.op, msg.request_id, codes.ACL_SUCCESS, ptr, size, tail=name.encode()
                )
            entry = self._handlers.get(msg.op)
            if entry is None:
                raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown op {msg.op}")
            arity, handler = entry
            if not (msg.op == Op.MEMCPY and len(msg.ints) == arity + 1):  # optional span, see _memcpy
                self._arity(msg, arity)
            if msg.op not in (Op.INIT, Op.FINALIZE):
                self._need_init()
            values = handler(msg.ints)
            return protocol.encode_reply(msg.op, msg.request_id, codes.ACL_SUCCESS, *values)
        except AclFailure as exc:
            return protocol.encode_reply(msg.op, msg.request_id, exc.code, tail=exc.message.encode())

    def cancel(self) -> None:
        """Stop running and queued kernels and wake any call waiting on them (thread-safe)."""
        self._cancel.set()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Cancel kernels, free every allocation and remove every region file of this session."""
        self.cancel()
        for worker in list(self._workers.values()):
            if worker.thread is not None:
                worker.thread.join()
        self._workers.clear()
        self.streams.clear()
        self.backend.release_all()
        for region in list(self.regions.values()):
            region.close()
        self.regions.clear()

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
        self.backend.release_all()
        for rid in [r for r in self.regions if r != 0]:
            self.regions.pop(rid).close()
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
        return (self.backend.malloc(self._current(), size, policy),)

    def _free(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        self.backend.free(ints[0])
        return ()

    def _get_mem_info(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        if ints[0] not in codes.MemAttr.__members__.values():
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown memory attribute {ints[0]}")
        return self.backend.mem_info(self._current())

    def _memset(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        ptr, dst_max, value, count = ints
        if count < 0 or count > dst_max:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"memset count {count} must be in 0..dst_max ({dst_max})"
            )
        self.backend.memset(ptr, value, count)
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
        if kind not in codes.MemcpyKind.__members__.values():
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"unknown memcpy kind {kind}")
        src_host, dst_host = datalink.is_host_ptr(src), datalink.is_host_ptr(dst)
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
        src_view = self._host_view(src, count) if src_host else self.backend.device_view(src, span)[:count]
        dst_view = self._host_view(dst, count) if dst_host else self.backend.device_view(dst, span)[:count]
        dst_view[:] = src_view
        return ()

    def _malloc_host(self, size: int) -> tuple[int, int, str]:
        if size <= 0:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc_host size must be positive, got {size}")
        if size >= 1 << datalink.OFFSET_BITS:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, f"malloc_host size {size} is too large")
        rounded = -(-size // _PAGE) * _PAGE
        # Host buffers live in the node's /dev/shm: bound them by the claim's memory quota so one
        # client cannot fill the tmpfs that other tenants share.
        limit = sum(self.backend.mem_info(d)[1] for d in range(self.backend.device_count()))
        in_use = sum(r.size for rid, r in self.regions.items() if rid != 0)
        if in_use + rounded > limit or len(self.regions) > MAX_HOST_BUFFERS:
            raise AclFailure(
                codes.ACL_ERROR_RT_MEMORY_ALLOCATION,
                f"host buffer of {size} bytes refused: {in_use} bytes in {len(self.regions) - 1} host buffers"
                f" already, the limit is {limit} bytes (the claim's memory quota) and {MAX_HOST_BUFFERS} buffers",
            )
        rid = self._next_region
        try:
            region = self._new_region("host", rounded, rid)
        except OSError as exc:
            raise AclFailure(
                codes.ACL_ERROR_BAD_ALLOC, f"cannot create a host buffer of {size} bytes: {exc}"
            ) from exc
        self._next_region += 1
        return datalink.host_ptr(region.region_id), rounded, region.name

    def _free_host(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        ptr = ints[0]
        rid, offset = datalink.split_host_ptr(ptr) if datalink.is_host_ptr(ptr) else (-1, -1)
        if rid <= 0 or offset != 0 or rid not in self.regions:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"pointer {ptr:#x} is not a host buffer of this client"
            )
        self.regions.pop(rid).close()
        return ()

    def _host_view(self, ptr: int, count: int) -> memoryview:
        rid, offset = datalink.split_host_ptr(ptr)
        region = self.regions.get(rid)
        if region is None:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM, f"host pointer {ptr:#x} is not a buffer of this client"
            )
        if offset + count > region.size:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"{count} bytes at host pointer {ptr:#x} run past its buffer ({region.size} bytes)",
            )
        return region.view[offset : offset + count]

    # -- streams and kernels ---------------------------------------------------------------------

    def _create_stream(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        if len(self.streams) >= MAX_STREAMS:
            raise AclFailure(_ACL_ERROR_RT_NO_STREAM_RESOURCE, f"at most {MAX_STREAMS} streams per client")
        self._next_stream += 1
        stream = _Stream(self._next_stream, self._current())
        self.streams[stream.stream_id] = stream
        return (stream.stream_id,)

    def _destroy_stream(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream = self._stream(ints[0])
        self._wait(lambda: stream.pending == 0)
        del self.streams[stream.stream_id]
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
            self.backend.device_view(out_ptr, KERNEL_RESULT_BYTES)
        input_view = self.backend.device_view(in_ptr, in_len) if in_ptr else None
        if sum(s.pending for s in self.streams.values()) >= MAX_PENDING_KERNELS:
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
        return (self.kernels_done + sum(s.pending for s in self.streams.values()),)

    def _get_stats(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        with self._cond:
            return self.kernels_done, self.kernel_us_done

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
            self.backend.complete_kernel(out_ptr=kernel.out_ptr, tag=kernel.tag, input_view=kernel.input_view)
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
        name = f"{kind}-{os.getpid()}-{next(_region_names)}.buf"
        region = datalink.create_region(self.shm_dir, name, size, rid)
        self.regions[rid] = region
        return region

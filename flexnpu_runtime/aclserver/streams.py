"""One session's streams and the work queued on them: kernels (and model executions) on the die.

Owns stream handles, one worker thread per device that runs the session's queued tasks in launch
order, a task run at once on the caller's thread when its device has nothing queued (``run_now``:
a synchronous model execution, with no hand-off to the worker), the bound on queued tasks,
synchronization, and cancellation. A task holds its die for ``duration_us`` — each slice granted
by the quota book from the die ledger, so compute quotas (fixed, elastic, best-effort) hold across
aclservers and for every kind of task alike — then runs its ``complete`` step (the kernel's
result, a model's outputs). An operator (a task with ``prepare``) is computed by the host while it
holds the die, for max(modelled, measured) (``_run_operator``). A thread that holds the die asks for
1 ns of timer slack, so its timed waits end when the slice does. What a task reads or writes is
pinned in the book while it is queued: a FREE meanwhile returns at once, but the bytes stay charged
until the task ends (``quota.py``).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from flexnpu_runtime.aclserver import proctitle, scheduling
from flexnpu_runtime.aclserver.backend import KERNEL_RESULT_BYTES, AclFailure, Allocation, Backend
from flexnpu_runtime.aclserver.ledger import Pause
from flexnpu_runtime.aclserver.quota import QuotaBook
from flexnpu_wire import codes
from flexnpu_wire.framing import Op

__all__ = ["MAX_KERNEL_US", "MAX_QUEUED_TASKS", "MAX_STREAMS", "WAITING_OPS", "Pause", "Streams", "Task"]

MAX_KERNEL_US = 10_000_000
MAX_STREAMS = 1024
MAX_QUEUED_TASKS = 1024
"""Tasks one session may have queued at once (over all its streams); one more gets 207005. Each
holds a few hundred bytes of the aclserver's own memory; what it uses is charged to the quota."""
WAITING_OPS = frozenset(
    {int(Op.SYNCHRONIZE_STREAM), int(Op.SYNCHRONIZE_DEVICE), int(Op.DESTROY_STREAM), int(Op.MODEL_UNLOAD),
     int(Op.MODEL_EXECUTE), int(Op.BINARY_UNLOAD)}
)  # fmt: skip
_STREAM_BASE = 0x5_0000_0000
_PR_SET_TIMERSLACK = 29
_precise = threading.local()
_DONE_LOCK = threading.Lock()
Handler = Callable[[tuple[int, ...]], tuple[int, ...]]


@dataclass(slots=True)
class _Stream:
    stream_id: int
    device: int
    pending: int = 0
    error: AclFailure | None = None
    """The first failure of a task queued without a reply (an operator), returned by the next
    synchronize of this stream or its device."""


_AT_ONCE_S = 1e-3
"""An operator's slice granted within this of its asking was not behind another share's: the slice it
ran in before is charged up to its start, so the time the ledger takes to grant it is not lost."""
_SPIN_S = 100e-6
"""The last part of a slice is waited out by yielding the CPU (``sched_yield``, well under a microsecond
when nothing else runs), not by a timed wait, which overshoots by 40 us at the median and more under
load; ``time.sleep(0)`` is a timed wait too (20 us)."""


def _hold_until(end: float, pause: Pause) -> bool:
    """Hold the die until ``end``; True if cancelled first."""
    rest = end - time.monotonic()
    if rest > _SPIN_S and pause.wait(rest - _SPIN_S):
        return True
    while time.monotonic() < end:
        os.sched_yield()  # releases the GIL: the process's other threads run meanwhile
    return pause.is_set()


def _complete(task: Task) -> None:
    try:
        task.complete()
    except AclFailure as exc:
        task.error = exc
    except Exception as exc:  # an executor's bug is the call's ACL error, never a dead worker
        task.error = AclFailure(codes.ACL_ERROR_INTERNAL_ERROR, f"the work failed: {exc!r}")


def _ended() -> None:
    """What a task's ``complete`` is once it ended: nothing."""


@dataclass(slots=True)
class Task:
    """Queued work: hold the die for ``duration_us``, then ``complete()``; ``pins`` are released
    when it ends either way."""

    stream: _Stream
    duration_us: int
    complete: Callable[[], None]
    pins: tuple[Allocation, ...] = ()
    error: AclFailure | None = None
    then: Callable[[], None] | None = None
    """Called once the task ended (ran, failed or was cancelled), after ``done`` is set."""
    prepare: Callable[[], int] | None = None
    """An operator: computed on the worker while it holds the die; returns its modelled die
    microseconds (the die is held for the longer of that and the compute); an AclFailure is the
    task's error (the compute's time is still charged)."""
    sticky: bool = False
    """Nobody waits for this task's reply: its failure becomes its stream's ``error``."""
    at_end: Callable[[], None] | None = None
    """Called on the thread that ran the task as soon as its die time is over (not if it was
    cancelled or held no die time), before its pins and counts are released: a synchronous
    call's reply goes out then."""
    finished: bool = False
    """It ended (ran, failed or was cancelled); ``done`` is the same as an event."""
    _done: threading.Event | None = None

    @property
    def done(self) -> threading.Event:
        """Set once the task ended; made when first asked for (most tasks are never waited on
        this way, and an Event costs a few microseconds to make)."""
        with _DONE_LOCK:
            if self._done is None:
                self._done = threading.Event()
                if self.finished:
                    self._done.set()
            return self._done

    def _set_done(self) -> None:
        with _DONE_LOCK:
            self.finished = True
            event = self._done
        if event is not None:
            event.set()


@dataclass(slots=True)
class _Worker:
    """Runs one device's tasks in launch order."""

    device: int
    queue: deque[Task] = field(default_factory=deque)
    thread: threading.Thread | None = None
    caller_runs: Task | None = None
    """The head of ``queue`` while ``run_now`` runs it on the caller's thread (the worker waits)."""
    booked: tuple[float, float] | None = None
    """A slice booked ahead for the head of ``queue`` (by whoever ran the task before it)."""
    held: tuple[float, float] | None = None
    """The slice an operator ran in, kept for the operator queued behind it (``_run_operator``)."""


class Streams:
    """Streams and queued work of one session (``handlers`` for the dispatcher); thread-safe."""

    def __init__(
        self, backend: Backend, book: QuotaBook, *, session_id: int, current: Callable[[], int]
    ) -> None:
        self.backend = backend
        self.book = book
        self.session_id = session_id
        self._current = current
        self.streams: dict[int, _Stream] = {}
        self.kernels_done = 0
        self.kernel_us_done = 0
        self._queued = 0
        self._next_stream = _STREAM_BASE
        self._workers: dict[int, _Worker] = {}
        self._cond = threading.Condition()
        self.cancelled = threading.Event()
        self._orphan_error: AclFailure | None = None

    def handlers(self) -> dict[Op, Handler]:
        return {
            Op.CREATE_STREAM: self._create_stream,
            Op.DESTROY_STREAM: self._destroy_stream,
            Op.SYNCHRONIZE_STREAM: self._synchronize_stream,
            Op.SYNCHRONIZE_DEVICE: self._synchronize_device,
            Op.LAUNCH_KERNEL: self._launch_kernel,
            Op.GET_STATS: self._get_stats,
        }

    def busy(self) -> bool:
        with self._cond:
            return any(s.pending for s in self.streams.values())

    # -- streams ---------------------------------------------------------------------------------

    def _create_stream(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        return (self.create(self._current()).stream_id,)

    def create(self, device: int) -> _Stream:
        with self._cond:
            if len(self.streams) >= MAX_STREAMS:
                raise AclFailure(
                    codes.ACL_ERROR_RT_NO_STREAM_RESOURCE, f"at most {MAX_STREAMS} streams per client"
                )
            self._next_stream += 1
            stream = self.streams[self._next_stream] = _Stream(self._next_stream, device)
        return stream

    def _destroy_stream(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream = self.stream(ints[0])
        self.wait(lambda: stream.pending == 0)
        with self._cond:
            self.streams.pop(stream.stream_id, None)
        return ()

    def _synchronize_stream(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream = self.stream(ints[0])
        self.wait(lambda: stream.pending == 0)
        self._raise_recorded([stream])
        return ()

    def _synchronize_device(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        device = self._current()
        self.wait(lambda: all(s.pending == 0 for s in self.streams.values() if s.device == device))
        with self._cond:
            mine = [s for s in self.streams.values() if s.device == device]
        self._raise_recorded(mine)
        return ()

    def record_error(self, stream_id: int, error: AclFailure) -> None:
        """Keep the failure of unanswered work for the next synchronize of its stream (of any
        stream, when the stream does not exist); the first failure wins until it is returned."""
        with self._cond:
            stream = self.streams.get(stream_id)
            if stream is not None:
                stream.error = stream.error or error
            else:
                self._orphan_error = self._orphan_error or error

    def _raise_recorded(self, streams: list[_Stream]) -> None:
        with self._cond:
            err, self._orphan_error = self._orphan_error, None
            for s in streams:
                if s.error is not None:
                    err, s.error = err or s.error, None
        if err is not None:
            raise err

    def stream(self, stream_id: int) -> _Stream:
        stream = self.streams.get(stream_id)
        if stream is None:
            raise AclFailure(codes.ACL_ERROR_INVALID_RESOURCE_HANDLE, f"stream {stream_id:#x} does not exist")
        return stream

    # -- kernels ---------------------------------------------------------------------------------

    def _launch_kernel(self, ints: tuple[int, ...]) -> tuple[int, ...]:
        stream_id, duration_us, tag, out_ptr, in_ptr, in_len = ints
        stream = self.stream(stream_id)
        if not 0 < duration_us <= MAX_KERNEL_US:
            raise AclFailure(
                codes.ACL_ERROR_INVALID_PARAM,
                f"kernel duration_us must be in 1..{MAX_KERNEL_US}, got {duration_us}",
            )
        backend, owner, book = self.backend, self.session_id, self.book
        used: list[Allocation] = []
        if out_ptr:
            backend.device_view(out_ptr, KERNEL_RESULT_BYTES, owner=owner)
            used.append(book.find(out_ptr, KERNEL_RESULT_BYTES, owner=owner))
        input_view = backend.device_view(in_ptr, in_len, owner=owner) if in_ptr else None
        if in_ptr:
            used.append(book.find(in_ptr, in_len, owner=owner))

        def complete() -> None:
            backend.complete_kernel(out_ptr=out_ptr, tag=tag, input_view=input_view, owner=owner)

        self.submit(Task(stream, duration_us, complete), used)
        with self._cond:
            return (self.kernels_done + self._queued,)

    def _get_stats(self, _ints: tuple[int, ...]) -> tuple[int, ...]:
        with self._cond:
            return self.kernels_done, self.kernel_us_done

    # -- the queue -------------------------------------------------------------------------------

    def submit(self, task: Task, uses: list[Allocation]) -> None:
        """Queue ``task`` behind its stream's earlier work, pinning what it uses."""
        self._admit(task, uses)
        device = task.stream.device
        with self._cond:
            worker = self._worker(device)
            if worker.thread is None:
                worker.thread = threading.Thread(
                    target=self._run_worker, args=(worker,), daemon=True, name=f"kernels-dev{device}"
                )
                worker.thread.start()
            task.stream.pending += 1
            worker.queue.append(task)
            self._cond.notify_all()

    def run_now(self, task: Task, uses: list[Allocation], pause: Pause) -> bool:
        """Run ``task`` on this thread if its device has nothing queued or running (False: the
        caller queues it instead); it holds the die exactly as a queued task does, waiting with
        ``pause``. True once it ended (``task.error`` tells how)."""
        with self._cond:  # checked and admitted at once: nothing can be queued in between
            worker = self._worker(task.stream.device)
            if worker.queue or self.cancelled.is_set():
                return False
            self._admit_locked(task, uses)
            task.stream.pending += 1
            worker.queue.append(task)
            worker.caller_runs = task
        used: int | None = None
        try:
            used = _run_task(self.book, self._cond, worker, task, pause)
        finally:
            if used is None and task.error is None:
                task.error = AclFailure(codes.ACL_ERROR_INTERNAL_ERROR, "cancelled: the session ended")
            # off the queue in the same hold of ``_cond`` as its counts: the worker may start what
            # was queued meanwhile once notified
            self._finish(task, ran=used is not None, used_us=used or 0, caller_of=worker)
        return True

    def _worker(self, device: int) -> _Worker:
        """The device's worker record (under ``_cond``); its thread starts with the first queued task."""
        worker = self._workers.get(device)
        if worker is None:
            worker = self._workers[device] = _Worker(device)
        return worker

    def _admit(self, task: Task, uses: list[Allocation]) -> None:
        """Count ``task`` against the queue bound and pin what it uses (AclFailure: neither)."""
        with self._cond:
            self._admit_locked(task, uses)

    def _admit_locked(self, task: Task, uses: list[Allocation]) -> None:
        """``_admit`` under ``_cond`` (the book's lock is taken inside it)."""
        if self._queued >= MAX_QUEUED_TASKS:
            raise AclFailure(
                codes.ACL_ERROR_RT_RESOURCE_ALLOC_FAIL,
                f"at most {MAX_QUEUED_TASKS} kernels and model executions may be queued per client",
            )
        task.pins = self.book.pin(uses)
        self._queued += 1

    def wait_for_room(self) -> None:
        """Wait until one more task may be queued (an unanswered operator waits for room rather than
        fail: its client gets no reply to be told, and the worker frees room by itself)."""
        self.wait(lambda: self._queued < MAX_QUEUED_TASKS)

    def drain(self) -> None:
        """Wait for every queued task of this session."""
        self.wait(lambda: self._queued == 0)

    def wait(self, done: Callable[[], bool]) -> None:
        with self._cond:
            while not done() and not self.cancelled.is_set():
                self._cond.wait(0.5)
        if self.cancelled.is_set():
            raise AclFailure(
                codes.ACL_ERROR_INTERNAL_ERROR, "the aclserver is stopping; queued kernels were cancelled"
            )

    def cancel(self) -> None:
        """Stop running and queued tasks and wake any call waiting on them (thread-safe)."""
        self.cancelled.set()
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        """Cancel, join the workers (every pin is released), forget the streams."""
        self.cancel()
        for worker in list(self._workers.values()):
            if worker.thread is not None:
                worker.thread.join()
        self._workers.clear()
        self.streams.clear()

    def forget_streams(self) -> None:
        with self._cond:
            self.streams.clear()

    def _finish(self, task: Task, *, ran: bool, used_us: int = 0, caller_of: _Worker | None = None) -> None:
        """``task`` ended; ``caller_of``: the worker whose queue it headed while this thread ran it
        (``run_now``), taken off that queue here."""
        # The work's closure holds views of the buffers it used: drop it before their memory may
        # go, so a freed buffer's bytes leave with its quota (not when this worker takes its next task).
        task.complete = _ended
        task.prepare = None
        task.at_end = None
        self.book.unpin(task.pins)
        task.pins = ()
        with self._cond:
            if caller_of is not None:
                caller_of.queue.popleft()
                caller_of.caller_runs = None
            if task.sticky and task.error is not None and task.stream.error is None:
                task.stream.error = task.error
            task.stream.pending -= 1
            self._queued -= 1
            if ran:
                self.kernels_done += 1
                self.kernel_us_done += used_us
            task._set_done()  # before the notify: a waiter on ``_cond`` sees it ended when it wakes
            self._cond.notify_all()
        then, task.then = task.then, None  # ``then`` may refer to the task: no cycle outlives it
        if then is not None:
            then()

    def _run_worker(self, worker: _Worker) -> None:
        """Run the device's queued tasks in launch order (not one ``run_now`` runs)."""
        cancel = self.cancelled
        while True:
            with self._cond:
                while (not worker.queue or worker.caller_runs is not None) and not cancel.is_set():
                    self._cond.wait()
                if cancel.is_set():
                    doomed = [t for t in worker.queue if t is not worker.caller_runs]
                    worker.queue = deque(t for t in worker.queue if t is worker.caller_runs)
                else:
                    doomed = []
                    task = worker.queue[0]
            if doomed or cancel.is_set():
                for t in doomed:
                    t.error = AclFailure(codes.ACL_ERROR_INTERNAL_ERROR, "cancelled: the session ended")
                    self._finish(t, ran=False)
                return
            used = _run_task(self.book, self._cond, worker, task, cancel)
            if used is None:
                continue  # cancelled: the top of the loop drains the queue
            with self._cond:
                worker.queue.popleft()
            self._finish(task, ran=True, used_us=used)


def _run_task(
    book: QuotaBook, cond: threading.Condition, worker: _Worker, task: Task, pause: Pause
) -> int | None:
    """Run ``task`` on the die; the die microseconds it used, or None if cancelled first."""
    if not getattr(_precise, "timers", False):  # once per thread: 1 ns of timer slack, not
        proctitle.prctl(_PR_SET_TIMERSLACK, 1)  # Linux's 50 us, so a slice's wait ends on time
        _precise.timers = True
    if task.prepare is not None:
        return _run_operator(book, cond, worker, task, pause)
    if worker.held is not None:  # an operator's slice not used up: the die frees now
        book.settle_slice(worker.device, worker.held, time.monotonic())
        worker.held = None
    return _hold(book, cond, worker, task, pause)


def _run_operator(
    book: QuotaBook, cond: threading.Condition, worker: _Worker, task: Task, pause: Pause
) -> int | None:
    """An operator holds the die while the host computes it (the emulated die is the host computing),
    for max(its modelled die time, the measured compute time).

    It runs in a slice granted as any other (or in what is left of the slice the operator before it
    ran in: operators queued back to back share slices). numpy cannot be cut off at a slice's end: the
    time an operator's compute runs past it is charged to the share (``QuotaBook.settle_slice``, carried
    as debt over the period), and what the last queued operator leaves of its slice is given back. A
    modelled time beyond the slice's end is held slice by slice afterwards, as a kernel's is."""
    held, worker.held = worker.held, None
    asked = time.monotonic()
    grant = held if held is not None and asked < held[1] else None
    if grant is None:
        grant = book.acquire_slice(worker.device, scheduling.SLICE_US, pause, ready_at=asked)
        if held is not None:  # used up: held to the new slice's start when granted at once (no gap)
            at_once = grant is not None and grant[0] - asked < _AT_ONCE_S
            book.settle_slice(worker.device, held, grant[0] if grant is not None and at_once else asked)
        if grant is None or _hold_until(grant[0], pause):
            return None
    prepare, task.prepare = task.prepare, None
    t0 = time.monotonic()
    modelled = 0
    try:
        modelled = prepare() if prepare is not None else 0
    except AclFailure as exc:
        task.error = exc
    except Exception as exc:  # an operator's bug is its ACL error, never a dead worker
        task.error = AclFailure(codes.ACL_ERROR_INTERNAL_ERROR, f"the operator failed: {exc!r}")
    busy = t0 + modelled / 1e6
    if busy > grant[1]:  # modelled beyond this slice: hold it to its end, the rest in slices of their own
        if _hold_until(grant[1], pause):
            return None
        now = time.monotonic()
        book.settle_slice(worker.device, grant, now)  # the compute's overrun, if it ran past the end
        task.duration_us = round((busy - now) * 1e6)
        rest = _hold(book, cond, worker, task, pause) if task.duration_us > 0 else 0
        return None if rest is None else round((now - t0) * 1e6) + rest
    if _hold_until(busy, pause):
        return None
    now = time.monotonic()
    with cond:
        more = len(worker.queue) > 1 and worker.queue[1].prepare is not None and worker.caller_runs is None
    if more:  # past its end too: the time to the next operator's start is the share's (the host's)
        worker.held = grant
    else:
        book.settle_slice(worker.device, grant, now)
    return max(1, round((now - t0) * 1e6))


def _hold(
    book: QuotaBook, cond: threading.Condition, worker: _Worker, task: Task, pause: Pause
) -> int | None:
    """Hold the die for ``task.duration_us`` slice by slice, then complete it; the die microseconds
    it used, or None if cancelled first.

    While a slice runs, the next one (of this task or the next queued kernel) is booked just before
    the die frees, so a busy device loses no die time between slices. The thread sleeps (``pause``)
    while the die is held."""
    remaining, used = task.duration_us, 0
    while remaining > 0:
        grant, worker.booked = worker.booked, None
        if grant is None:
            asked = time.monotonic()
            want = min(remaining, scheduling.SLICE_US)
            grant = book.acquire_slice(worker.device, want, pause, ready_at=None if used else asked)
        if grant is None:
            return None
        start, end = grant
        got = round((end - start) * 1e6)
        remaining -= got
        used += got
        if remaining <= 0:  # the die computes during its last slice: the result is ready at its end
            _complete(task)
        nxt = _next_want(cond, worker, remaining)
        lookahead_at = end - scheduling.LOOKAHEAD_US / 1e6
        if nxt and not pause.wait(max(0.0, lookahead_at - time.monotonic())):
            worker.booked = book.acquire_slice(
                worker.device, nxt, pause, ready_at=end if remaining <= 0 else None
            )
        while True:  # a latency-critical slice may go in before the end: it ends later then
            if _hold_until(end, pause):
                return None
            moved = book.confirm_slice(worker.device, grant)
            if moved is None or moved[1] <= end:
                break
            end = moved[1]
        if remaining <= 0 and task.at_end is not None:
            task.at_end()
    if not used:  # no die time at all (a model that declares none): only its result
        _complete(task)
    return used


def _next_want(cond: threading.Condition, worker: _Worker, remaining: int) -> int:
    """Length of the slice to book next: the rest of this task, else the next queued kernel's first
    (an operator's die time is known once it computed: its slice is asked for then)."""
    if remaining > 0:
        return min(remaining, scheduling.SLICE_US)
    with cond:
        return min(worker.queue[1].duration_us, scheduling.SLICE_US) if len(worker.queue) > 1 else 0

"""``Streams.run_now``: a task run on the caller's thread when its device has nothing queued.

Against the emulated backend in this process (a real die ledger file, real threads): the task
holds the die on the calling thread (with 1 ns of timer slack) and is charged like a queued one, the call refuses (and
keeps nothing) while the device has queued work, and a cancel mid-task ends it with an error
and releases what it pinned.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from flexnpu_runtime.aclserver.backend import AclFailure, Allocation
from flexnpu_runtime.aclserver.backend_emulated import EmulatedBackend
from flexnpu_runtime.aclserver.streams import Streams, Task
from flexnpu_testing import aclserver_harness
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import codes

OWNER = 1


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[EmulatedBackend]:
    spec = aclserver_harness.make_spec(
        tmp_path, shares=[aclserver_harness.share(0, memory=1 << 20)], ledger_dir=str(tmp_path)
    )
    be = EmulatedBackend(spec)
    try:
        yield be
    finally:
        be.close()


@pytest.fixture
def streams(backend: EmulatedBackend) -> Iterator[Streams]:
    s = Streams(backend, backend.book, session_id=OWNER, current=lambda: 0)
    try:
        yield s
    finally:
        s.close()


def buffer(backend: EmulatedBackend) -> Allocation:
    return backend.book.find(backend.malloc(0, 4096, 0, owner=OWNER), owner=OWNER)


def test_it_runs_on_the_calling_thread_and_is_charged_its_die_time(
    backend: EmulatedBackend, streams: Streams
) -> None:
    stream, buf = streams.create(0), buffer(backend)
    ran_on: list[int] = []
    task = Task(stream, 2_000, lambda: ran_on.append(threading.get_ident()))
    assert streams.run_now(task, [buf], threading.Event())
    assert ran_on == [threading.get_ident()] and task.error is None and task.done.is_set()
    assert (streams.kernels_done, streams.kernel_us_done) == (1, 2_000)
    assert backend.book.compute_usage(0)[0] == 2_000, "the die ledger granted it 2 ms"
    assert buf.pins == 0 and stream.pending == 0
    slack = Path(f"/proc/{threading.get_native_id()}/timerslack_ns").read_text()
    assert slack.strip() == "1", "the thread that held the die waits with 1 ns of timer slack"


@pytest.mark.parametrize("fails", [False, True], ids=["ok", "work-fails"])
def test_at_end_runs_once_when_the_die_time_is_over_before_pins_and_counts_go(
    backend: EmulatedBackend, streams: Streams, fails: bool
) -> None:
    """A synchronous call's reply goes out from ``at_end``: after the die time, with the task's
    outcome known, while what it used is still pinned and it is not yet counted as done."""
    stream, buf = streams.create(0), buffer(backend)
    seen: list[tuple[bool, int, int, bool, int]] = []

    def work() -> None:
        if fails:
            raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "bad input")

    task = Task(stream, 1_000, work)
    task.at_end = lambda: seen.append(
        (
            task.error is not None,
            buf.pins,
            streams.kernels_done,
            task.done.is_set(),
            backend.book.compute_usage(0)[0],
        )
    )
    assert streams.run_now(task, [buf], threading.Event())
    assert seen == [(fails, 1, 0, False, 1_000)]
    assert buf.pins == 0 and streams.kernels_done == 1 and task.done.is_set()


def test_at_end_is_not_called_for_a_cancelled_task(backend: EmulatedBackend, streams: Streams) -> None:
    stream, buf = streams.create(0), buffer(backend)
    called: list[bool] = []
    task = Task(stream, 5_000_000, lambda: None, at_end=lambda: called.append(True))
    canceller = threading.Thread(
        target=lambda: (wait_for(lambda: backend.book.compute_usage(0)[0] > 0, timeout=10), streams.cancel())
    )
    canceller.start()
    assert streams.run_now(task, [buf], streams.cancelled)
    canceller.join(10)
    assert called == [] and task.error is not None and "cancelled" in task.error.message


def test_it_refuses_while_the_device_has_queued_work_and_keeps_nothing(
    backend: EmulatedBackend, streams: Streams
) -> None:
    stream, buf = streams.create(0), buffer(backend)
    release = threading.Event()
    queued = Task(streams.create(0), 1, release.wait)
    streams.submit(queued, [buf])
    ran: list[bool] = []
    assert not streams.run_now(Task(stream, 1_000, lambda: ran.append(True)), [buf], threading.Event())
    assert not ran and buf.pins == 1 and stream.pending == 0, "only the queued task holds the buffer"
    release.set()
    queued.done.wait(10)
    wait_for(lambda: buf.pins == 0, timeout=10, what="the queued task's pin released")
    assert streams.run_now(Task(stream, 1_000, lambda: ran.append(True)), [buf], threading.Event())
    assert ran == [True]


def test_a_cancel_mid_task_ends_it_with_an_error_and_releases_its_pins(
    backend: EmulatedBackend, streams: Streams
) -> None:
    stream, buf = streams.create(0), buffer(backend)
    task = Task(stream, 5_000_000, lambda: pytest.fail("a cancelled task does not complete"))
    canceller = threading.Thread(
        target=lambda: (wait_for(lambda: backend.book.compute_usage(0)[0] > 0, timeout=10), streams.cancel())
    )
    canceller.start()
    assert streams.run_now(task, [buf], streams.cancelled)
    canceller.join(10)
    assert task.error is not None and "cancelled" in task.error.message
    assert buf.pins == 0 and stream.pending == 0 and streams.kernels_done == 0


def test_work_that_raises_is_the_call_s_acl_error_and_the_worker_keeps_running(
    backend: EmulatedBackend, streams: Streams
) -> None:
    """Issue 25 class 6: an executor error (here a ValueError, as numpy raised for a model whose
    sizes differ per batch) ends its task with an ACL error; the worker thread lives on, so the
    next task runs, a synchronize returns and the pins come back."""
    stream, buf = streams.create(0), buffer(backend)

    def broken() -> None:
        raise ValueError("cannot reshape array of size 1024 into shape (4,)")

    failing = Task(stream, 1, broken)
    streams.submit(failing, [buf])
    assert failing.done.wait(10), "the task ended"
    assert failing.error is not None and failing.error.code == codes.ACL_ERROR_INTERNAL_ERROR
    assert "cannot reshape" in failing.error.message
    after = Task(stream, 1, lambda: None)
    streams.submit(after, [buf])
    streams.drain()
    assert after.done.is_set() and after.error is None, "the same worker ran the next task"
    assert buf.pins == 0 and stream.pending == 0


def test_the_next_operator_computes_while_the_current_task_holds_the_die(
    backend: EmulatedBackend, streams: Streams
) -> None:
    """An operator's die time is known only once it computed: the worker computes the next queued
    one during the current task's last slice (after its result is complete), so that slice can be
    booked ahead; a failure computed ahead is that operator's error and holds no die time."""
    stream, buf = streams.create(0), buffer(backend)
    queued = threading.Event()
    first_completed: list[bool] = []
    first = Task(stream, 20_000, lambda: (queued.wait(10), first_completed.append(True)))
    seen: list[tuple[bool, bool]] = []

    def compute() -> int:
        seen.append((bool(first_completed), first.done.is_set()))
        return 1_000

    def fail() -> int:
        raise AclFailure(codes.ACL_ERROR_INVALID_PARAM, "MatMul: input 1 (x2) is missing")

    second, third, fourth = (Task(stream, 0, lambda: None, sticky=True) for _ in range(3))
    second.prepare, third.prepare = compute, fail
    fourth.prepare = lambda: 3_000
    for task in (first, second, third, fourth):
        streams.submit(task, [buf])
    queued.set()
    streams.drain()
    assert seen == [(True, False)], "computed after the first task's result, while it still held the die"
    assert third.error is not None and "x2" in third.error.message and stream.error is third.error
    assert fourth.error is None and fourth.done.is_set(), "the stream went on"
    assert streams.kernel_us_done == 24_000 and backend.book.compute_usage(0)[0] == 24_000
    assert buf.pins == 0 and stream.pending == 0

"""A synchronous model execution run by the session thread itself, against a real aclserver.

When a session has nothing queued on the device, ``aclmdlExecute`` holds the die on the session's
own thread (no hand-off to the device worker). These tests pin what that must not change: the
client's other threads are served meanwhile, a call that waits for the session's work waits for
this execution too, work queued before it runs first, work queued during it runs after it, and a
client that goes away mid-execution ends it at once (its memory comes back to the quota).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from flexnpu_client import Session
from flexnpu_testing import aclserver_harness
from flexnpu_testing.aclserver_harness import RunningAclServer
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from flexnpu_wire import modelfile as mf
from flexnpu_wire.ops import Op

QUOTA = 64 << 20
H2D = 1
LONG_US = 2_000_000
"""A model execution long enough that 150 small calls end well before it."""


def affine_model(cost_us: int) -> mf.ModelFile:
    """x (float32[4]) -> 2x + 1, holding the die for ``cost_us``."""
    t = mf.Tensor("x", 0, mf.FORMAT_ND, (4,))
    return mf.ModelFile(
        inputs=(t,), outputs=(mf.Output(mf.Tensor("y", 0, mf.FORMAT_ND, (4,)), mf.Op.AFFINE, 0, 0, 2.0, 1.0),),
        cost_us=cost_us, work_bytes=4096,
    )  # fmt: skip


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningAclServer]:
    work = tmp_path_factory.mktemp("model-sync")
    with aclserver_harness.running_aclserver(
        work, shares=[aclserver_harness.share(0, memory=QUOTA)], ledger_dir=str(work / "ledger")
    ) as srv:
        yield srv


@pytest.fixture
def session(server: RunningAclServer) -> Iterator[Session]:
    with Session.open(server.conf()) as s:
        s.init()
        s.set_device(0)
        yield s


class Model:
    """A loaded ``affine_model`` with its input (ones) and output buffers."""

    def __init__(self, s: Session, cost_us: int) -> None:
        self.s = s
        self.mid = s.load_model(mf.render(affine_model(cost_us)))
        self.x, self.y = s.malloc(16), s.malloc(16)
        s.memcpy(self.x, 16, np.ones(4, "<f4").tobytes(), 16, H2D)

    def execute(self, stream: int = 0) -> None:
        self.s.execute_model(self.mid, [(self.x, 16)], [(self.y, 16)], stream=stream)

    def output(self) -> list[float]:
        return np.frombuffer(self.s.copy_from_device(self.y, 16), "<f4").tolist()

    def unload(self) -> None:
        self.s.unload_model(self.mid)
        self.s.free(self.x)
        self.s.free(self.y)


def die_us(s: Session) -> int:
    """Die microseconds the share has been granted so far (the execution started once it grows)."""
    return s.call(Op.GET_USAGE, 0)[2]


def in_thread(fn: object) -> tuple[threading.Thread, threading.Event, list[BaseException]]:
    done, errors = threading.Event(), []

    def run() -> None:
        try:
            fn()  # type: ignore[operator]
        except BaseException as exc:
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, done, errors


def test_other_threads_are_served_while_a_synchronous_execution_holds_the_die(session: Session) -> None:
    s = session
    model = Model(s, LONG_US)
    before, used = s.stats()[0], die_us(s)
    runner, executed, errors = in_thread(model.execute)
    wait_for(lambda: die_us(s) > used, timeout=10, what="the execution started")
    results = []
    for _ in range(50):
        results.append(s.get_mem_info())
        ptr = s.malloc(4096)
        s.free(ptr)
    assert not executed.is_set(), "150 calls of another thread were answered while the execution ran"
    assert all(total == QUOTA for _free, total in results)
    runner.join(timeout=60)
    assert not errors, errors
    assert model.output() == [3.0] * 4
    assert s.stats()[0] == before + 1
    model.unload()


def test_a_synchronize_during_a_synchronous_execution_waits_for_it(session: Session) -> None:
    s = session
    model = Model(s, LONG_US)
    before, used = s.stats()[0], die_us(s)
    runner, _executed, errors = in_thread(model.execute)
    wait_for(lambda: die_us(s) > used, timeout=10, what="the execution started")
    s.synchronize_device()
    assert s.stats()[0] == before + 1, "synchronize_device returned only after the execution ended"
    runner.join(timeout=60)
    assert not errors, errors
    model.unload()


def test_work_queued_before_runs_first_and_work_queued_during_runs_after(session: Session) -> None:
    s = session
    model = Model(s, 300_000)
    stream = s.create_stream()
    before = s.stats()[0]
    s.launch_kernel(stream, 300_000)
    model.execute()  # queued behind the kernel: it cannot run on this thread first
    assert s.stats()[0] == before + 2, "the kernel launched before the execution ended before it"
    used = die_us(s)
    runner, executed, errors = in_thread(model.execute)
    wait_for(lambda: die_us(s) > used, timeout=10, what="the execution started")
    model.execute(stream)  # launched while the synchronous one runs: after it, in launch order
    s.synchronize_stream(stream)
    assert executed.is_set(), "the execution queued during the synchronous one ended after it"
    runner.join(timeout=60)
    assert not errors, errors
    assert s.stats()[0] == before + 4
    model.unload()


CLIENT = """
import sys
from flexnpu_client import Session
from flexnpu_wire import modelfile as mf
from flexnpu_wire.clientconf import load
sys.path.insert(0, sys.argv[2])
from test_aclserver_model_sync import affine_model
s = Session.open(load(sys.argv[1]))
s.init(); s.set_device(0)
mid = s.load_model(mf.render(affine_model(60_000_000)))
x, y = s.malloc(1 << 20), s.malloc(1 << 20)
print("executing", flush=True)
s.execute_model(mid, [(x, 16)], [(y, 16)])
"""


def test_a_client_killed_during_a_synchronous_execution_ends_it(
    server: RunningAclServer, tmp_path: Path
) -> None:
    (conf := tmp_path / "client.conf").write_text(clientconf.render(server.conf()))
    proc = subprocess.Popen(
        [sys.executable, "-c", CLIENT, str(conf), str(Path(__file__).parent)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    with Session.open(server.conf()) as observer:
        observer.init()
        observer.set_device(0)
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "executing"
            wait_for(lambda: observer.get_mem_info()[0] < QUOTA - (2 << 20), timeout=10, what="its buffers")
        finally:
            proc.kill()
            proc.wait(timeout=30)
        # the 60 s execution is cancelled: its model and buffers go back to the quota long before
        wait_for(
            lambda: observer.get_mem_info() == (QUOTA, QUOTA), timeout=20, what="the killed client's memory"
        )

"""Loops that cannot die silently: run_forever survives every exception; the verdict sees a stuck loop."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from dra_driver import liveness
from flexnpu_testing.waiting import wait_for


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    "exc",
    [
        pytest.param(OSError(30, "Read-only file system"), id="os-error"),
        pytest.param(KeyError("uid"), id="key-error"),
        pytest.param(RuntimeError("bug"), id="runtime-error"),
    ],
)
def test_run_forever_counts_and_goes_on_after_any_exception(exc: Exception) -> None:
    counted: list[str] = []
    live = liveness.Liveness(on_error=counted.append)
    live.register("loop", deadline=60)
    stop = threading.Event()
    calls: list[int] = []

    def iteration() -> float | None:
        calls.append(1)
        if len(calls) <= 2:
            raise exc
        if len(calls) >= 4:
            stop.set()
        return None

    t = threading.Thread(
        target=liveness.run_forever, args=(live, "loop", iteration, stop), kwargs={"max_backoff": 0.01}
    )
    t.start()
    t.join(timeout=30)
    assert not t.is_alive()
    assert len(calls) == 4 and counted == ["loop", "loop"]
    state = live.snapshot()["loop"]
    assert state.errors == 2 and state.passes == 4 and type(exc).__name__ in state.last_error
    assert state.done and live.verdict().healthy


def test_a_loop_that_stops_passing_makes_the_verdict_unhealthy() -> None:
    clock = _Clock()
    live = liveness.Liveness(clock=clock)
    live.register("reconciler", deadline=10)
    live.register("claim-watch", deadline=100)
    clock.now += 5
    live.passed("claim-watch")
    assert live.verdict().healthy
    clock.now += 6  # reconciler: 11 s since its last pass, deadline 10
    verdict = live.verdict()
    assert not verdict.healthy and verdict.stale == ("reconciler",)
    assert "reconciler: STALE" in verdict.text and "claim-watch: ok" in verdict.text
    live.passed("reconciler")
    assert live.verdict().healthy


def test_a_thread_that_dies_without_stop_stays_stale() -> None:
    """A BaseException (not caught by design) ends the thread; the loop is not marked finished."""
    clock = _Clock()
    live = liveness.Liveness(clock=clock)
    live.register("loop", deadline=1)
    stop = threading.Event()

    def iteration() -> float | None:
        raise SystemExit(1)

    with pytest.raises(SystemExit):
        liveness.run_forever(live, "loop", iteration, stop)
    clock.now += 2
    assert live.verdict().stale == ("loop",)


def test_backoff_waits_on_stop_not_sleep() -> None:
    live = liveness.Liveness()
    live.register("loop", deadline=60)
    stop = threading.Event()
    failures: list[int] = []

    def iteration() -> float | None:
        failures.append(1)
        raise ValueError("always")

    t = threading.Thread(
        target=liveness.run_forever, args=(live, "loop", iteration, stop), kwargs={"max_backoff": 60}
    )
    t.start()
    wait_for(lambda: len(failures) >= 2, what="a second attempt after the first backoff", timeout=10)
    stop.set()  # ends the (now 2 s) backoff at once
    t.join(timeout=5)
    assert not t.is_alive()


def test_healthz_answers_503_naming_the_stale_loop() -> None:
    import urllib.error
    import urllib.request

    from dra_driver.telemetry import Telemetry

    clock = _Clock()
    live = liveness.Liveness(clock=clock)
    live.register("reconciler", deadline=10)
    tel = Telemetry(node_name="n", driver_name="npu.flexnpu.io", metrics_port=0, metrics_host="127.0.0.1")
    tel.serve_health(lambda: (live.verdict().healthy, live.verdict().text), lambda: {"reconciler": 3.0})
    tel.start()
    try:
        url = f"http://127.0.0.1:{tel.port}"
        ok = urllib.request.urlopen(f"{url}/healthz", timeout=10)
        assert ok.status == 200 and b"reconciler: ok" in ok.read()
        clock.now += 11
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{url}/healthz", timeout=10)
        assert info.value.code == 503 and b"reconciler: STALE" in info.value.read()
        metrics = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
        assert "flexnpu_dra_loop_since_last_pass_seconds{" in metrics and 'loop="reconciler"' in metrics
    finally:
        tel.shutdown()


def test_loops_run_each_loop_until_one_stop_and_join_them() -> None:
    live = liveness.Liveness()
    loops = liveness.Loops(live)
    passes: list[str] = []
    ran = threading.Event()

    def iteration() -> float:
        passes.append("a")
        return 0.01

    def until_stopped(stop: threading.Event) -> None:
        ran.set()
        stop.wait()

    loops.loop("a", iteration, deadline=60)
    loops.thread("b", until_stopped, loops.stop)
    wait_for(lambda: passes.count("a") >= 2 and ran.is_set(), what="both threads running", timeout=10)
    assert live.snapshot()["a"].passes >= 2 and not live.snapshot()["a"].done
    loops.stop.set()
    loops.join(timeout=5)
    assert live.snapshot()["a"].done  # ended on purpose: not stale
    assert not any(t.is_alive() for t in threading.enumerate() if t.name in ("a", "b"))


_SIGNAL_WHILE_LOCKED = """
import os, signal, threading
from dra_driver.liveness import handle_signals
stop = threading.Event()
{install}
with stop._cond:  # what the main thread holds inside Event.set() and on the way in and out of wait()
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10_000):
        pass  # bytecodes: Python runs the handler here, the lock still held
print(stop.wait(10), flush=True)
"""


@pytest.mark.parametrize(
    ("install", "finishes"),
    [
        pytest.param("handle_signals(lambda _s: stop.set(), (signal.SIGTERM,))", True, id="handle_signals"),
        pytest.param(
            "signal.signal(signal.SIGTERM, lambda *_: stop.set())", False, id="a-plain-handler-hangs"
        ),
    ],
)
def test_a_signal_while_the_main_thread_holds_the_events_lock(install: str, finishes: bool) -> None:
    """A SIGTERM arriving while the main thread is inside the stop event's own lock still stops the
    process (run on a thread); a handler that sets the event itself waits for that lock for ever."""
    code = _SIGNAL_WHILE_LOCKED.format(install=install)
    try:
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=10, check=True
        )
    except subprocess.TimeoutExpired:
        assert not finishes, "the process hung on its own signal handler"
        return
    assert finishes and out.stdout.strip() == "True", out

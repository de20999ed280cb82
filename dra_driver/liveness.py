"""Loops that cannot die silently: every long-lived loop of the node reports each pass here.

A *loop* is a thread that works forever (the residual reconciler, the claim watch, the slice
publisher and its watch, rediscovery, the aclserver monitor, the health broadcaster). Each one
is run by :func:`run_forever`, which catches every exception of one iteration, logs it, counts it
(``flexnpu_dra_loop_errors_total{loop}`` through the ``on_error`` hook), backs off with a cap and
goes on. Each finished iteration, successful or not, is a *pass*: a loop that stops passing is
dead or stuck, which is what a liveness probe must see; an API outage is neither (its failures
are counted, the loop keeps passing).

:meth:`Liveness.verdict` is the probe: healthy while every registered loop passed within its
``deadline`` seconds. The node serves it as ``GET /healthz`` on the metrics port
(``dra_driver/telemetry/endpoint.py``) and ``flexnpu-dra probe`` asks it (``kubeletplugin/cli.py``).
:class:`Loops` starts a process's loops in threads and stops them with one event;
:func:`handle_signals` is how a process's SIGTERM/SIGINT reach that event.
This module does no I/O of its own.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType

log = logging.getLogger("flexnpu.liveness")

DEFAULT_MAX_BACKOFF = 30.0


@dataclass(slots=True)
class LoopState:
    """What one loop reported: its deadline, last pass, errors."""

    name: str
    deadline: float
    last_pass: float
    passes: int = 0
    errors: int = 0
    last_error: str = ""
    done: bool = False  # ended on purpose (stop): not stale


@dataclass(frozen=True, slots=True)
class Verdict:
    healthy: bool
    stale: tuple[str, ...]
    text: str


@dataclass
class Liveness:
    """The registry of loops; thread-safe.

    Usage::

        live = Liveness()
        loop = live.register("reconciler", deadline=150)
        threading.Thread(target=run_forever, args=(live, "reconciler", one_pass, stop)).start()
        live.verdict().healthy
    """

    clock: Callable[[], float] = time.monotonic
    on_error: Callable[[str], None] | None = None
    _loops: dict[str, LoopState] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, name: str, *, deadline: float) -> None:
        """Expect ``name`` to pass at least every ``deadline`` seconds from now on."""
        with self._lock:
            self._loops[name] = LoopState(name, deadline, self.clock())

    def passed(self, name: str) -> None:
        with self._lock:
            state = self._loops.get(name)
            if state is not None:
                state.last_pass = self.clock()
                state.passes += 1

    def failed(self, name: str, exc: BaseException) -> None:
        """Count an error of ``name`` (the iteration still counts as a pass)."""
        with self._lock:
            state = self._loops.get(name)
            if state is not None:
                state.errors += 1
                state.last_error = f"{type(exc).__name__}: {exc}"[:200]
        if self.on_error is not None:
            try:
                self.on_error(name)
            except Exception:  # a metrics problem must not end the loop that reports it
                log.exception("could not count an error of loop %s", name)

    def finished(self, name: str) -> None:
        with self._lock:
            state = self._loops.get(name)
            if state is not None:
                state.done = True

    def snapshot(self) -> dict[str, LoopState]:
        with self._lock:
            return {
                k: LoopState(**{f: getattr(v, f) for f in LoopState.__slots__})
                for k, v in self._loops.items()
            }

    def healthz(self) -> tuple[bool, str]:
        """The verdict as ``Telemetry.serve_health`` wants it: (healthy, text)."""
        verdict = self.verdict()
        return verdict.healthy, verdict.text

    def ages(self) -> dict[str, float]:
        """Seconds since each loop's last pass (the loop-age gauge)."""
        now = self.clock()
        return {name: now - state.last_pass for name, state in self.snapshot().items()}

    def verdict(self) -> Verdict:
        """Healthy while every loop passed within its deadline; the text names each loop's age."""
        now = self.clock()
        lines, stale = [], []
        for state in sorted(self.snapshot().values(), key=lambda s: s.name):
            age = now - state.last_pass
            bad = not state.done and age > state.deadline
            if bad:
                stale.append(state.name)
            lines.append(
                f"{state.name}: {'STALE' if bad else 'ok'} last pass {age:.1f}s ago (deadline {state.deadline:g}s), "
                f"{state.passes} passes, {state.errors} errors"
                + (f", last error: {state.last_error}" if state.last_error else "")
            )
        return Verdict(not stale, tuple(stale), "\n".join(lines) + "\n")


def run_forever(
    live: Liveness,
    name: str,
    iteration: Callable[[], float | None],
    stop: threading.Event,
    *,
    max_backoff: float = DEFAULT_MAX_BACKOFF,
    logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = log,
) -> None:
    """Call ``iteration`` until ``stop``; it returns the seconds to wait before the next one.

    ``None`` means "go again at once". An exception of any type is logged with its traceback,
    counted, and followed by a jittered exponential backoff (1 s doubling up to ``max_backoff``);
    a success resets the backoff. Every iteration ends with :meth:`Liveness.passed`.
    """
    backoff = 1.0
    try:
        while not stop.is_set():
            try:
                delay = iteration()
                backoff = 1.0
            except Exception as exc:
                live.failed(name, exc)
                logger.exception("loop %s: unexpected error; retrying in %.1fs", name, backoff)
                delay = backoff * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not crypto
                backoff = min(backoff * 2, max_backoff)
            live.passed(name)
            if delay:
                stop.wait(delay)
    finally:
        if stop.is_set():  # a thread that ends any other way stays registered and goes stale
            live.finished(name)


class Loops:
    """A process's loop threads: each started as a daemon thread, all stopped by :attr:`stop`, joined at the end."""

    def __init__(
        self, live: Liveness, *, logger: logging.Logger | logging.LoggerAdapter[logging.Logger] = log
    ) -> None:
        self.live = live
        self.logger = logger
        self.stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def loop(self, name: str, iteration: Callable[[], float | None], *, deadline: float) -> None:
        """Run ``iteration`` by :func:`run_forever` in a thread, registered with its ``deadline``."""
        self.live.register(name, deadline=deadline)
        self.thread(name, run_forever, self.live, name, iteration, self.stop, logger=self.logger)

    def thread(self, name: str, target: Callable[..., None], *args: object, **kwargs: object) -> None:
        """Run ``target(*args, **kwargs)`` in a daemon thread of its own (it watches :attr:`stop`)."""
        t = threading.Thread(target=target, args=args, kwargs=kwargs, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def join(self, timeout: float = 10.0) -> None:
        """Wait for each thread (after :attr:`stop` was set), at most ``timeout`` seconds each."""
        for t in self._threads:
            t.join(timeout=timeout)


def handle_signals(
    act: Callable[[int], None], signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
) -> None:
    """On each of ``signals``, run ``act(signum)`` on a thread of its own, never in the handler.

    Python runs a signal handler in the main thread between two bytecodes, also while that thread
    holds a lock: an ``Event``'s lock inside its ``set()`` or on the way in and out of ``wait()``. A
    handler that sets the same event (or stops anything that does) would then wait for a lock its
    own thread holds, for ever: a process that hangs on SIGTERM until it is killed. The thread
    waits for the lock like any other, and the handler returns at once.
    """

    def handler(signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=act, args=(signum,), name=f"signal-{signum}", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)

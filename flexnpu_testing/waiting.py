"""One way to wait in tests, demos and benchmarks: poll a condition with a deadline, never sleep blindly."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline (an assertion failure in a test)."""


def wait_for(
    cond: Callable[[], T], *, what: str = "condition", timeout: float = 20.0, interval: float = 0.02
) -> T:
    """Poll ``cond`` until it returns something truthy (and return it), or raise :class:`WaitTimeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)

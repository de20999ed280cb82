"""The ResourceSlice loops' retry: capped, jittered exponential backoff that a stop cuts short.

The controller's sync loop and its watch (``controller.py``, ``watch.py``) retry API trouble
(:func:`dra_kubeletplugin.errors.retryable`) the same way; each is told of every retry (the
controller keeps the last error, the liveness registry hears that the loop is alive).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import tenacity

from dra_kubeletplugin import errors

if TYPE_CHECKING:
    Log = logging.Logger | logging.LoggerAdapter[Any]

__all__ = ["retrying"]


def retrying(
    stop: threading.Event,
    what: str,
    *,
    max_backoff_seconds: float,
    log: Log,
    on_retry: Callable[[Exception], None],
) -> tenacity.Retrying:
    """Retry retryable API errors until ``stop``; ``on_retry(err)`` before each wait."""

    def before_sleep(state: tenacity.RetryCallState) -> None:
        outcome = state.outcome
        err = outcome.exception() if outcome is not None else None
        if isinstance(err, Exception):
            on_retry(err)
        delay = state.next_action.sleep if state.next_action else 0.0
        log.warning("%s failed (attempt %d), retrying in %.1fs: %s", what, state.attempt_number, delay, err)

    def sleep(seconds: float) -> None:
        stop.wait(seconds)  # a stop cuts the backoff short

    return tenacity.Retrying(
        retry=tenacity.retry_if_exception(errors.retryable),
        wait=tenacity.wait_random_exponential(multiplier=0.2, max=max_backoff_seconds),
        stop=lambda _state: stop.is_set(),
        sleep=sleep,
        before_sleep=before_sleep,
        reraise=True,
    )

"""The driver's one retry policy for operations that may succeed on a later try.

What is retried: only :class:`~dra_driver.errors.Unavailable` (a daemon socket that is down, an
API server that does not answer, a conflict); every other error is final at once. How: full-jitter
exponential backoff (``base`` seconds, doubling, capped at ``max_wait``), the last error re-raised
when the caller's ``stop`` says so. Callers choose only when to stop (a budget before the kubelet's
deadline, a stop event) and what to log; ``kubeletplugin/effects.py`` (daemon calls) uses it.
(The kubelet-plugin helper's slice controller has its own, on the helper's ``errors.retryable``.)
"""

from __future__ import annotations

from collections.abc import Callable

import tenacity

from dra_driver.errors import Unavailable

__all__ = ["RetryCallState", "policy"]

RetryCallState = tenacity.RetryCallState


def policy(
    *,
    stop: Callable[[tenacity.RetryCallState], bool],
    before_sleep: Callable[[tenacity.RetryCallState], None] | None = None,
    sleep: Callable[[float], None] | None = None,
    base: float = 0.1,
    max_wait: float = 2.0,
) -> tenacity.Retrying:
    """A :class:`tenacity.Retrying` that retries :class:`Unavailable` until ``stop`` is true."""
    extra: dict[str, Callable[[float], None]] = {} if sleep is None else {"sleep": sleep}
    return tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(Unavailable),
        wait=tenacity.wait_random_exponential(multiplier=base, max=max_wait),
        stop=stop,
        before_sleep=before_sleep,
        reraise=True,
        **extra,  # type: ignore[arg-type]
    )

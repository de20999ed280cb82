"""The node's readiness, written for the readiness probe: registered by the kubelet and the pool published.

The file's contract (path, format, reader) is ``dra_driver/readiness.py``; this module is its writer:
one :meth:`ReadinessWriter.iteration` every ``READINESS_PERIOD`` writes the state on every change,
and :meth:`ReadinessWriter.remove` drops the file when the instance stops.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Protocol

from dra_driver import readiness

__all__ = ["READINESS_PERIOD", "ReadinessWriter"]

log = logging.getLogger("flexnpu.node")

READINESS_PERIOD = 0.5


class Serving(Protocol):
    """The helper's view of it (``dra_kubeletplugin.Helper``)."""

    @property
    def registered(self) -> threading.Event: ...

    @property
    def published(self) -> threading.Event: ...


class ReadinessWriter:
    """Writes this instance's readiness file from the helper's two events."""

    def __init__(self, path: Path, helper: Serving) -> None:
        self.path = path
        self.helper = helper
        self._last: readiness.State | None = None

    def iteration(self) -> float:
        state = readiness.State(
            registered=self.helper.registered.is_set(),
            published=self.helper.published.is_set(),
            pid=os.getpid(),
        )
        if state != self._last:
            readiness.write(self.path, state)
            log.info("readiness: %s", "ready" if state.ready else f"not ready: {state.missing()}")
            self._last = state
        return READINESS_PERIOD

    def remove(self) -> None:
        readiness.remove(self.path)

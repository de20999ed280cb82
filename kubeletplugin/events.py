"""What happened on the node, for whoever subscribed: the node's modules tell each other through these.

A :class:`Signal` is a list of subscribers, called in the emitting thread in the order they
subscribed. A module subscribes in its own constructor (the publisher subscribes to
``claims_changed`` and ``order_changed``), so nobody patches a callback into another module after building it. A
subscriber that raises is logged with its traceback and the next one still runs: what the emitter
was doing (a kubelet call, a reconciler pass) is never failed by a listener.

:class:`NodeEvents` are the node's topics:

* ``claims_changed`` — the checkpoint's prepared claims may have changed: after every kubelet
  call (``kubeletplugin/prepare.py``), after the reconciler removed a claim, after each look of
  the aclserver watch (which also sees what ``flexnpu-smi`` did from another process).
* ``order_changed`` — the allocations on this node's pool changed, so the placement order of its
  devices may have (``kubeletplugin/ordering.py``): the publisher republishes if the pool differs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["NodeEvents", "Signal"]

log = logging.getLogger("flexnpu.node")


class Signal:
    """Subscribers of one topic; :meth:`emit` calls each (thread-safe)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._subscribers: tuple[Callable[[], None], ...] = ()
        self._lock = threading.Lock()

    def subscribe(self, subscriber: Callable[[], None]) -> None:
        with self._lock:
            self._subscribers = (*self._subscribers, subscriber)

    def emit(self) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber()
            except Exception:  # a listener's bug must not fail the emitter's work
                log.exception("a subscriber of %s failed", self.name)


class NodeEvents:
    """The node's topics (see the module docstring); one instance per node, built first."""

    def __init__(self) -> None:
        self.claims_changed = Signal("claims_changed")
        self.order_changed = Signal("order_changed")

"""The ResourceSlice controller's watch: list and watch this driver's slices on this node, and ask
for a sync whenever they stop matching what is to be published.

It keeps its own cache of the slices (relisting only after ``410 Gone``, resuming from the last
version seen after other errors, like client-go's reflector), retries API trouble with the loops'
backoff (``backoff.py``) and tells the liveness registry of its passes (loop ``publisher-watch``).
Whether the slices match is the controller's question (``differs``); a mismatch calls ``trigger``.
A kubelet wipe is so repaired within about a second.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from dra_kubeletplugin import errors
from dra_kubeletplugin.resourceslice.backoff import retrying

if TYPE_CHECKING:
    Log = logging.Logger | logging.LoggerAdapter[Any]

__all__ = ["LOOP_WATCH", "SliceWatch"]

JSON = dict[str, Any]
LOOP_WATCH = "publisher-watch"


class WatchClient(Protocol):
    def list_slices(self, *, driver: str, node: str) -> tuple[list[JSON], str]: ...
    def watch_slices(
        self, *, driver: str, node: str, resource_version: str, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[tuple[str, JSON]]: ...


class Observer(Protocol):
    def passed(self, name: str) -> None: ...
    def failed(self, name: str, exc: BaseException) -> None: ...


class SliceWatch:
    """Watches this node's slices of the driver; ``trigger()`` when ``differs(slices)``."""

    def __init__(
        self,
        kube: WatchClient,
        *,
        driver_name: str,
        node_name: str,
        log: Log,
        live: Observer,
        timeout_seconds: int,
        max_backoff_seconds: float,
        differs: Callable[[Iterable[JSON]], bool],
        trigger: Callable[[], None],
        on_retry: Callable[[Exception], None],
    ) -> None:
        self.kube = kube
        self.driver_name = driver_name
        self.node_name = node_name
        self.log = log
        self.live = live
        self.timeout_seconds = timeout_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.differs = differs
        self.trigger = trigger
        self.on_retry = on_retry

    def run(self, stop: threading.Event) -> None:
        """List+watch own slices until ``stop``; never raises."""
        state: JSON = {"rv": None, "cache": {}}
        while not stop.is_set():
            self.live.passed(LOOP_WATCH)
            try:
                retrying(
                    stop,
                    "ResourceSlice watch",
                    max_backoff_seconds=self.max_backoff_seconds,
                    log=self.log,
                    on_retry=self._retried,
                )(self._once, state, stop)
            except errors.PluginError as err:
                if stop.is_set():
                    return
                self.log.error("ResourceSlice watch failed: %s", err)
                stop.wait(self.max_backoff_seconds)
            except Exception as exc:
                self.live.failed(LOOP_WATCH, exc)
                self.log.exception("unexpected error in the ResourceSlice watch")
                stop.wait(self.max_backoff_seconds)

    def _retried(self, err: Exception) -> None:
        self.on_retry(err)
        self.live.passed(LOOP_WATCH)  # retrying is alive

    def _once(self, state: JSON, stop: threading.Event) -> None:
        cache: dict[str, JSON] = state["cache"]
        try:
            if state["rv"] is None:
                items, rv = self.kube.list_slices(driver=self.driver_name, node=self.node_name)
                cache.clear()
                cache.update({i["metadata"]["name"]: i for i in items})
                state["rv"] = rv
                self._check(cache.values())
            for kind, obj in self.kube.watch_slices(
                driver=self.driver_name,
                node=self.node_name,
                resource_version=state["rv"],
                timeout_seconds=self.timeout_seconds,
                stop=stop,
            ):
                meta = obj.get("metadata") or {}
                state["rv"] = meta.get("resourceVersion") or state["rv"]
                self.live.passed(LOOP_WATCH)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    cache.pop(meta.get("name", ""), None)
                else:
                    cache[meta.get("name", "")] = obj
                self._check(cache.values())
        except errors.Gone:
            # Only an expired resourceVersion forces a relist; after other errors the watch
            # resumes from the last version seen (like client-go's reflector).
            self.log.info("ResourceSlice watch expired (410 Gone); relisting")
            state["rv"] = None

    def _check(self, slices: Iterable[JSON]) -> None:
        if self.differs(slices):
            self.trigger()

"""The ResourceSlice controller: keeps a node's pools published, the Go helper's ``resourceslice`` controller.

It lists this driver's slices on this node, applies :mod:`~dra_kubeletplugin.resourceslice.sync`'s
plan (delete obsolete slices first, with uid + resourceVersion preconditions; update changed ones
in place; create missing ones with the index-prefixed ``generateName`` and the Node as controller
owner) and keeps it true with a watch on its own slices (``watch.py``), which repairs a kubelet wipe
within about a second. API errors are retried with capped, jittered exponential backoff; a loop that fails
logs, tells its :class:`LoopObserver`, backs off and goes on. It computes nothing about devices.

Differences from the Go helper, on purpose:

* Re-sync delay after a watch event is ~0.5 s, not 30 s. The kubelet deletes all of a node's
  slices when it starts (and 30 s after the plugin disconnects); for that whole delay the node has
  no devices and pods needing them are unschedulable. The Go helper's 30 s delay batches changes in
  big clusters with many pools per controller; here one process owns one node's pools, and an
  event only leads to a sync when the watched state differs from the desired one, so its own writes
  never cause write loops.
* A jittered periodic resync (``resync_seconds``) guards against missed events.
* Fields dropped by the API server (feature gates off) are reported once as
  :class:`~dra_kubeletplugin.errors.DroppedFieldsError`, then ignored in comparisons (no rewrite
  loop); the driver is expected to :meth:`SliceController.update` pools without them.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

from dra_kubeletplugin import errors
from dra_kubeletplugin.errors import DroppedFieldsError
from dra_kubeletplugin.resourceslice import pools
from dra_kubeletplugin.resourceslice.backoff import retrying
from dra_kubeletplugin.resourceslice.pools import DriverResources
from dra_kubeletplugin.resourceslice.sync import (
    PARTITIONABLE_FIELDS,
    Comparisons,
    Plan,
    SyncResult,
    dropped_fields,
    plan_pools,
)
from dra_kubeletplugin.resourceslice.watch import LOOP_WATCH, SliceWatch

if TYPE_CHECKING:
    Log = logging.Logger | logging.LoggerAdapter[Any]

__all__ = [
    "LIVENESS_CHUNK_SECONDS",
    "LOOP_PUBLISHER",
    "LOOP_WATCH",
    "LoopObserver",
    "SliceClient",
    "SliceController",
]

JSON = dict[str, Any]
LOOP_PUBLISHER = "publisher"
LIVENESS_CHUNK_SECONDS = 30.0
"""Longest idle wait between two liveness passes of the controller loop."""


class SliceClient(Protocol):
    """The API calls the controller makes (``dra_kubeletplugin.kubeapi.KubeClient`` has them)."""

    def get_node(self, name: str) -> JSON: ...
    def list_slices(self, *, driver: str, node: str) -> tuple[list[JSON], str]: ...
    def watch_slices(
        self, *, driver: str, node: str, resource_version: str, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[tuple[str, JSON]]: ...
    def create_slice(self, body: JSON) -> JSON: ...
    def update_slice(self, body: JSON) -> JSON: ...
    def delete_slice(self, name: str, *, uid: str, resource_version: str) -> None: ...


class LoopObserver(Protocol):
    """Told when a loop is registered, passes, fails or ends (a driver's liveness registry)."""

    def register(self, name: str, *, deadline: float) -> None: ...
    def passed(self, name: str) -> None: ...
    def failed(self, name: str, exc: BaseException) -> None: ...
    def finished(self, name: str) -> None: ...


class _NoObserver:
    def register(self, name: str, *, deadline: float) -> None:
        pass

    def passed(self, name: str) -> None:
        pass

    def failed(self, name: str, exc: BaseException) -> None:
        pass

    def finished(self, name: str) -> None:
        pass


class _Wakeup:
    """The controller loop's wake-up: set by :meth:`SliceController.trigger` (any thread, the watch
    too), cleared when a sync starts, broken by stop; idle waits are cut into liveness chunks."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending = False

    def set(self) -> None:
        with self._cond:
            self._pending = True
            self._cond.notify_all()

    def clear(self) -> None:
        with self._cond:
            self._pending = False

    def wake_on_stop(self, stop: threading.Event) -> None:
        """Run in a thread: a stop wakes the waiter at once."""
        stop.wait()
        with self._cond:
            self._cond.notify_all()

    def wait(self, stop: threading.Event, timeout: float | None, idle: Callable[[], None]) -> bool:
        """Block until set (True), ``timeout`` seconds or stop (False); ``idle()`` after each chunk."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                left = LIVENESS_CHUNK_SECONDS if deadline is None else deadline - time.monotonic()
                woke = self._cond.wait_for(
                    lambda: self._pending or stop.is_set(), timeout=min(left, LIVENESS_CHUNK_SECONDS)
                )
                if woke or (deadline is not None and time.monotonic() >= deadline):
                    return bool(woke) and not stop.is_set()
                idle()


class SliceController:
    """Keeps this node's ResourceSlices equal to the :class:`DriverResources` it was last given.

    Usage::

        ctl = SliceController(kube, driver_name="gpu.example.com", node_name="node1", log=log)
        ctl.update(DriverResources.single(Pool(name="node1", slices=[{"devices": [...]}])))
        threading.Thread(target=ctl.run, args=(stop,)).start()
        ctl.update(...)  # after an inventory or health change: the next sync writes the difference

    **Parameters:** ``kube`` (a :class:`SliceClient`; ``kubeapi.KubeClient`` is one),
    ``resync_seconds`` (periodic full sync, jittered ±10 %; 0 disables), ``debounce_seconds``
    (delay from a watch event or update to the sync), ``max_backoff_seconds`` (cap of the
    exponential retry delay), ``watch_timeout_seconds`` (server-side watch length),
    ``on_dropped_fields`` (called with :class:`DroppedFieldsError` before an immediate re-sync; it
    may :meth:`update` the resources without the dropped fields), ``live`` (a :class:`LoopObserver`
    told of the passes of the loop ``publisher`` and its watch ``publisher-watch``).
    """

    def __init__(
        self,
        kube: SliceClient,
        *,
        driver_name: str,
        node_name: str,
        log: Log,
        resources: DriverResources | None = None,
        resync_seconds: float = 600.0,
        debounce_seconds: float = 0.5,
        max_backoff_seconds: float = 30.0,
        watch_timeout_seconds: int = 300,
        on_dropped_fields: Callable[[DroppedFieldsError], None] | None = None,
        live: LoopObserver | None = None,
    ) -> None:
        self.kube = kube
        self.live: LoopObserver = live or _NoObserver()
        self.driver_name = driver_name
        self.node_name = node_name
        self._resources = resources or DriverResources()
        self._resources_lock = threading.Lock()
        self.log = log
        self.resync_seconds = resync_seconds
        self.debounce_seconds = debounce_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.on_dropped_fields = on_dropped_fields
        self.dropped: frozenset[str] = frozenset()
        self.last_result: SyncResult | None = None
        self.last_error: Exception | None = None
        self.syncs = 0
        self.published = threading.Event()
        """Set once a sync made every pool published as desired (a plugin's readiness)."""
        self._wakeup = _Wakeup()
        self._sync_lock = threading.Lock()
        self._comparisons = Comparisons()  # the sync's and the watch's: neither compares a slice twice
        self._watch = SliceWatch(
            kube,
            driver_name=driver_name,
            node_name=node_name,
            log=log,
            live=self.live,
            timeout_seconds=watch_timeout_seconds,
            max_backoff_seconds=max_backoff_seconds,
            differs=self._differs,
            trigger=self.trigger,
            on_retry=self._set_last_error,
        )

    # --- the desired state -----------------------------------------------------------------

    def update(self, resources: DriverResources) -> None:
        """Publish ``resources`` from now on (the Go helper's ``Controller.Update``); safe from any thread.

        Every pool is pre-validated first (:class:`~dra_kubeletplugin.resourceslice.pools.PoolInvalid`
        is raised and nothing changes); the sync itself runs in :meth:`run`. ``resources`` are taken
        as given and must not be changed afterwards (new content comes in a new update): comparisons
        of stored slices with them are remembered (:class:`~dra_kubeletplugin.resourceslice.sync.Comparisons`).
        """
        for pool in resources.pools.values():
            pools.validate(pool)
        with self._resources_lock:
            self._resources = resources
        self.trigger()

    @property
    def resources(self) -> DriverResources:
        with self._resources_lock:
            return self._resources

    # --- one sync ------------------------------------------------------------------------

    def sync(self) -> SyncResult:
        """Make the API match the resources once; no writes when it already does.

        Raises ``PoolInvalid`` for an invalid pool, :class:`DroppedFieldsError` when the server
        drops fields (remaining writes of this sync are skipped), and the retryable API errors
        (``Unreachable``, ``Conflict``, ...) for API trouble.
        """
        with self._sync_lock:
            resources = self.resources
            for pool in resources.pools.values():
                pools.validate(pool)
            existing, _ = self.kube.list_slices(driver=self.driver_name, node=self.node_name)
            plans = plan_pools(
                existing,
                resources,
                driver_name=self.driver_name,
                node_name=self.node_name,
                ignore=self.dropped,
                comparisons=self._comparisons,
            )
            result = SyncResult(generation=0)
            for plan in plans.values():
                result = self._apply(plan, result)
            self.syncs += 1
            self.last_result = result
            self.published.set()
            return result

    def withdraw(self) -> int:
        """Delete every slice of this driver on this node (a clean uninstall); how many went.
        Call it only once nothing publishes any more (:meth:`run` has returned)."""
        with self._sync_lock:
            existing, _ = self.kube.list_slices(driver=self.driver_name, node=self.node_name)
            for item in existing:
                meta = item["metadata"]
                self.kube.delete_slice(
                    meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"]
                )
            self.published.clear()
            return len(existing)

    def _apply(self, plan: Plan, before: SyncResult) -> SyncResult:
        deleted, updated, created = before.deleted, before.updated, before.created

        def progress() -> SyncResult:
            return SyncResult(max(plan.generation, before.generation), deleted, updated, created)

        for item in plan.delete:
            meta = item["metadata"]
            self.kube.delete_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])
            deleted += 1
            self.log.info("deleted obsolete ResourceSlice %s", meta["name"])
        for body in plan.update:
            try:
                stored = self.kube.update_slice(body)
            except errors.NotFound as err:  # deleted behind our back (kubelet wipe): relist and retry
                raise errors.Conflict(
                    f"ResourceSlice {body['metadata']['name']} vanished during the sync"
                ) from err
            updated += 1
            self.log.info(
                "updated ResourceSlice %s (generation %d)", body["metadata"]["name"], plan.generation
            )
            self._check_dropped(body, stored, progress())
        if plan.create:
            owner = self._owner_reference()
            for template in plan.create:
                body = {**template, "metadata": {**template["metadata"], "ownerReferences": [owner]}}
                stored = self.kube.create_slice(body)
                created += 1
                self.log.info(
                    "created ResourceSlice %s (generation %d)",
                    stored.get("metadata", {}).get("name", "?"),
                    plan.generation,
                )
                self._check_dropped(body, stored, progress())
        return progress()

    def _check_dropped(self, sent: JSON, stored: JSON, result: SyncResult) -> None:
        fields = dropped_fields(sent.get("spec") or {}, stored.get("spec") or {})
        if fields:
            self.dropped = self.dropped | set(fields)
            gates = (
                "DRAPartitionableDevices" if set(fields) & set(PARTITIONABLE_FIELDS) else "DRA feature gates"
            )
            err = DroppedFieldsError.make(fields, gates=gates)
            err.result = result
            raise err

    def _owner_reference(self) -> JSON:
        try:
            node = self.kube.get_node(self.node_name)
        except errors.NotFound as err:
            raise errors.ApiUnavailable(f"node {self.node_name} is not registered yet") from err
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node_name,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }

    # --- the loop ------------------------------------------------------------------------

    def trigger(self) -> None:
        """Ask for a sync soon; safe from any thread."""
        self._wakeup.set()

    def run(self, stop: threading.Event) -> None:
        """Sync now, then whenever the watch, :meth:`trigger` or the resync timer asks; until ``stop``.

        Never raises for API trouble: errors are logged and retried with capped exponential
        backoff with jitter.
        """
        self.live.register(LOOP_PUBLISHER, deadline=LIVENESS_CHUNK_SECONDS + self.max_backoff_seconds + 120)
        self.live.register(LOOP_WATCH, deadline=self.watch_timeout_seconds + 90)
        waker = threading.Thread(
            target=self._wakeup.wake_on_stop, args=(stop,), name="publisher-stop", daemon=True
        )
        watcher = threading.Thread(target=self._watch.run, args=(stop,), name="publisher-watch", daemon=True)
        waker.start()
        watcher.start()
        try:
            self._loop(stop)
        finally:
            if stop.is_set():  # ended on purpose; any other end leaves the loops to go stale
                self.live.finished(LOOP_PUBLISHER)
                self.live.finished(LOOP_WATCH)
            stop.set()
            watcher.join(timeout=5)
            waker.join(timeout=5)

    def _loop(self, stop: threading.Event) -> None:
        immediate = True
        while not stop.is_set():
            self.live.passed(LOOP_PUBLISHER)
            if not immediate:
                triggered = self._wait_for_work(stop)
                if stop.is_set():
                    return
                if triggered and stop.wait(self.debounce_seconds):
                    return  # debounce: coalesce a burst of events into one sync
            immediate = False
            self._wakeup.clear()
            try:
                result = self._sync_with_retry(stop)
            except DroppedFieldsError as err:
                self.last_error = err
                self.log.error("%s", err)
                if self.on_dropped_fields is not None:
                    self.on_dropped_fields(err)
                immediate = True
                continue
            except errors.PluginError as err:
                self.last_error = err
                self.log.error("ResourceSlice sync failed, waiting for a change or the resync: %s", err)
                continue
            except Exception as exc:  # a bug must not stop publishing for good
                self.live.failed(LOOP_PUBLISHER, exc)
                self.log.exception("unexpected error in ResourceSlice sync")
                stop.wait(self.max_backoff_seconds)
                continue
            if result is not None:
                self.last_error = None
                if result.writes:
                    self.log.info(
                        "ResourceSlices synced: generation %d, %d deleted, %d updated, %d created",
                        result.generation,
                        result.deleted,
                        result.updated,
                        result.created,
                    )

    def _wait_for_work(self, stop: threading.Event) -> bool:
        """Block until a trigger (True), the jittered resync timer or stop (False); alive meanwhile."""
        timeout = self.resync_seconds * random.uniform(0.9, 1.1) if self.resync_seconds > 0 else None  # noqa: S311
        return self._wakeup.wait(stop, timeout, lambda: self.live.passed(LOOP_PUBLISHER))  # idle, not dead

    def _sync_with_retry(self, stop: threading.Event) -> SyncResult | None:
        retry = retrying(
            stop,
            "ResourceSlice sync",
            max_backoff_seconds=self.max_backoff_seconds,
            log=self.log,
            on_retry=self._retried,
        )
        try:
            return retry(self.sync)
        except errors.PluginError as err:
            if stop.is_set() and errors.retryable(err):
                return None
            raise

    def _retried(self, err: Exception) -> None:
        self.last_error = err
        self.live.passed(LOOP_PUBLISHER)  # retrying is alive

    def _set_last_error(self, err: Exception) -> None:
        self.last_error = err

    def _differs(self, slices: Iterable[JSON]) -> bool:
        """Whether the watched slices differ from the desired pools (the watch then triggers a sync)."""
        plans = plan_pools(
            slices,
            self.resources,
            driver_name=self.driver_name,
            node_name=self.node_name,
            ignore=self.dropped,
            comparisons=self._comparisons,
        )
        return any(not plan.empty for plan in plans.values())

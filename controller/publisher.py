"""Publishes this node's pool as ResourceSlices and keeps it published.

Owns the ResourceSlice controller algorithm of the Go helper
(``k8s.io/dynamic-resource-allocation/resourceslice``): a pure planner,
:func:`plan_sync`, that compares the slices the API holds with the desired pool, and
:class:`SlicePublisher`, which lists, applies a plan (delete obsolete, update changed in place,
create missing) and keeps it true with a watch. It calls the API only through
:class:`controller.kube.Kube`, and computes nothing about devices (``dra_driver.slices`` does).

Differences from the Go helper, on purpose:

* Re-sync delay after a watch event is ~0.5 s, not 30 s. The kubelet deletes all of a node's
  slices when it starts (and 30 s after our plugin disconnects); for that whole delay the node
  has no devices and pods needing NPUs are unschedulable. The Go helper's 30 s delay batches
  changes in big clusters with many pools per controller; here one process owns one small pool,
  and an event only leads to a sync when the watched state differs from the desired one, so our
  own writes never cause write loops.
* A jittered periodic resync (``resync_seconds``) guards against missed events.
* Fields dropped by the API server (feature gates off) are reported once as
  :class:`DroppedFieldsError`, then ignored in comparisons (no rewrite loop); the caller is
  expected to fall back to ``use_counters=False`` and :meth:`SlicePublisher.trigger`.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Any

import tenacity

from controller.kube import Conflict, Gone, Kube, NotFound
from dra_driver import liveness, retrying, slices
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, Unavailable

JSON = dict[str, Any]
if TYPE_CHECKING:
    Log = logging.Logger | logging.LoggerAdapter[Any]

API_VERSION = "resource.k8s.io/v1"
GENERATE_NAME_MAX = 58
"""The API server truncates a generateName base to this many characters."""

# Fields whose loss on the server means a feature gate is off (Go helper's DroppedFieldsError).
PARTITIONABLE_FIELDS = ("sharedCounters", "consumesCounters", "perDeviceNodeSelection")
CONSUMABLE_FIELDS = ("allowMultipleAllocations", "requestPolicy")
DEVICE_FIELDS = ("consumesCounters", "allowMultipleAllocations", "taints", "bindingConditions")
LOOP_PUBLISHER = "publisher"
LOOP_WATCH = "publisher-watch"
LIVENESS_CHUNK_SECONDS = 30.0
"""Longest idle wait between two liveness passes of the publisher loop."""
_QUANTITY_KEYS = frozenset({"value", "default", "min", "max", "step"})
_QUANTITY = re.compile(r"^([+-]?[0-9.]+)(?:(e[+-]?[0-9]+)|([a-zA-Z]*))$")
_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


class DroppedFieldsError(InvalidInput):
    """The API server stored our slices without some fields (a feature gate is off).

    ``fields`` names them (e.g. ``sharedCounters``, ``consumesCounters``); ``result`` is what
    the interrupted sync did. Fall back to ``build_pool(..., use_counters=False)``.
    """

    default_code = ErrorCode.INVALID_CONFIG

    def __init__(self, fields: Sequence[str], result: SyncResult) -> None:
        self.fields = tuple(fields)
        self.result = result
        gates = "DRAPartitionableDevices" if set(fields) & set(PARTITIONABLE_FIELDS) else "DRA feature gates"
        super().__init__(
            f"the API server dropped {', '.join(self.fields)} from ResourceSlices; is {gates} enabled?",
            field="spec." + self.fields[0] if self.fields else None,
        )


@dataclass(frozen=True, slots=True)
class Plan:
    """What one sync does, in this order: delete, update, create."""

    generation: int
    delete: tuple[JSON, ...] = ()
    update: tuple[JSON, ...] = ()
    create: tuple[JSON, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.delete or self.update or self.create)


@dataclass(frozen=True, slots=True)
class SyncResult:
    generation: int
    deleted: int = 0
    updated: int = 0
    created: int = 0

    @property
    def writes(self) -> int:
        return self.deleted + self.updated + self.created


# --- pure planning -------------------------------------------------------------------------


def generate_name(index: int, *, driver_name: str, node_name: str) -> str:
    """``<index hex, ≥5 digits>-<driver>-<node>-`` (1.36+), as the API server will truncate it."""
    return f"{index:05x}-{driver_name}-{node_name}-"[:GENERATE_NAME_MAX]


def slice_index(name: str, *, driver_name: str, node_name: str) -> int | None:
    """The desired-slice index encoded in a slice name, or None if it has none."""
    head, sep, _ = name.partition("-")
    if not sep or len(head) < 5:
        return None
    try:
        index = int(head, 16)
    except ValueError:
        return None
    if not name.startswith(generate_name(index, driver_name=driver_name, node_name=node_name)):
        return None
    return index


def desired_spec(
    pool: slices.DesiredPool, index: int, *, driver_name: str, node_name: str, generation: int
) -> JSON:
    """The full ResourceSlice spec for desired slice ``index``."""
    return {
        "driver": driver_name,
        "pool": {"name": pool.name, "generation": generation, "resourceSliceCount": len(pool.slices)},
        "nodeName": node_name,
        **pool.slices[index],
    }


def plan_sync(
    existing: Iterable[JSON],
    desired: slices.DesiredPool,
    *,
    driver_name: str,
    node_name: str,
    ignore: Iterable[str] = (),
) -> Plan:
    """Compare the slices the API holds with the desired pool (the Go helper's sync, steps 1-6).

    ``existing`` are this driver's slices on this node as the server returned them. ``ignore``
    names fields the server is known to drop; they are left out of comparisons. Create bodies
    carry ``generateName`` but no ownerReferences (the publisher adds the Node's).
    """
    ignored = frozenset(ignore)
    items = sorted(existing, key=lambda s: str(s.get("metadata", {}).get("name", "")))
    current = max((_pool(s).get("generation", 0) or 0 for s in items), default=0)
    count = len(desired.slices)

    obsolete: list[JSON] = []
    matched: dict[int, JSON] = {}
    for item in items:
        pool = _pool(item)
        index = slice_index(item["metadata"]["name"], driver_name=driver_name, node_name=node_name)
        if (
            (pool.get("generation", 0) or 0) != current
            or pool.get("name") != desired.name
            or index is None
            or index >= count
            or index in matched
        ):
            obsolete.append(item)
        else:
            matched[index] = item

    def spec(index: int, generation: int) -> JSON:
        return desired_spec(
            desired, index, driver_name=driver_name, node_name=node_name, generation=generation
        )

    changed = [
        i
        for i, item in sorted(matched.items())
        if not specs_equal(item.get("spec") or {}, spec(i, current), ignored)
    ]
    missing = [i for i in range(count) if i not in matched]
    if desired.generation > current:
        generation = desired.generation
    elif missing or len(changed) > 1:
        generation = current + 1
    else:
        generation = current
    rewrite = sorted(matched) if generation != current else changed

    update = tuple(
        {**matched[i], "apiVersion": API_VERSION, "kind": "ResourceSlice", "spec": spec(i, generation)}
        for i in rewrite
    )
    create = tuple(
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"generateName": generate_name(i, driver_name=driver_name, node_name=node_name)},
            "spec": spec(i, generation),
        }
        for i in missing
    )
    return Plan(generation=generation, delete=tuple(obsolete), update=update, create=create)


def specs_equal(stored: Mapping[str, Any], wanted: Mapping[str, Any], ignore: Iterable[str] = ()) -> bool:
    """Semantic equality of two slice specs: quantities by value, empty == absent, order kept."""
    ignored = frozenset(ignore)
    return bool(_normal(stored, ignored) == _normal(wanted, ignored))


def dropped_fields(sent: Mapping[str, Any], stored: Mapping[str, Any]) -> tuple[str, ...]:
    """Fields present in the spec we sent but missing from what the server stored."""
    dropped: set[str] = set()
    for name in PARTITIONABLE_FIELDS:
        if sent.get(name) and not stored.get(name):
            dropped.add(name)
    stored_devices = {d.get("name"): d for d in stored.get("devices") or []}
    for device in sent.get("devices") or []:
        kept = stored_devices.get(device.get("name"), {})
        for name in DEVICE_FIELDS:
            if device.get(name) and not kept.get(name):
                dropped.add(name)
        kept_capacity = kept.get("capacity") or {}
        for cap, value in (device.get("capacity") or {}).items():
            if value.get("requestPolicy") and not (kept_capacity.get(cap) or {}).get("requestPolicy"):
                dropped.add("requestPolicy")
    return tuple(sorted(dropped))


def parse_quantity(text: str) -> Decimal:
    """A Kubernetes quantity string as a number (``"64Gi"``, ``"1e3"``, ``"100m"``)."""
    match = _QUANTITY.match(text.strip())
    if not match or (match.group(3) or "") not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    try:
        number = Decimal(match.group(1))
        if match.group(2):
            return number * (Decimal(10) ** int(match.group(2)[1:]))
        return number * _SUFFIX[match.group(3) or ""]
    except InvalidOperation as exc:
        raise ValueError(f"not a quantity: {text!r}") from exc


def _pool(item: Mapping[str, Any]) -> JSON:
    return dict((item.get("spec") or {}).get("pool") or {})


def _normal(value: Any, ignored: frozenset[str], key: str = "") -> Any:
    """Comparable form: no None/empty values, no ignored fields, quantities as numbers."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if k in ignored or (k == "timeAdded" and key == "taints"):
                continue  # the API server stamps a taint's timeAdded; ours never sets it
            n = _normal(v, ignored, k)
            if n is None or n in ({}, []):
                continue
            out[k] = n
        return out
    if isinstance(value, list):
        return [_normal(v, ignored, key) for v in value]
    if isinstance(value, str) and key in _QUANTITY_KEYS | {"validValues"}:
        try:
            return parse_quantity(value)
        except ValueError:
            return value
    return value


# --- the controller ------------------------------------------------------------------------


@dataclass
class _Signal:
    """A wake-up flag with the reason, shared by trigger(), the watch and stop."""

    cond: threading.Condition = field(default_factory=threading.Condition)
    pending: bool = False


class SlicePublisher:
    """Keeps this node's ResourceSlices equal to ``desired()``.

    Usage::

        pub = SlicePublisher(kube, driver_name=cfg.driver_name, node_name=cfg.node_name,
                             desired=lambda: slices.build_pool(inv, ...), log=log)
        threading.Thread(target=pub.run, args=(stop,)).start()
        pub.trigger()  # after an inventory or health change

    **Parameters:** ``resync_seconds`` (periodic full sync, jittered ±10 %; 0 disables),
    ``debounce_seconds`` (delay from a watch event or trigger to the sync), ``max_backoff_seconds``
    (cap of the exponential retry delay), ``watch_timeout_seconds`` (server-side watch length),
    ``on_dropped_fields`` (called with :class:`DroppedFieldsError` before an immediate re-sync),
    ``live`` (reports the passes of the loop ``publisher`` and its watch ``publisher-watch``).
    """

    def __init__(
        self,
        kube: Kube,
        *,
        driver_name: str,
        node_name: str,
        desired: Callable[[], slices.DesiredPool],
        log: Log,
        resync_seconds: float = 600.0,
        debounce_seconds: float = 0.5,
        max_backoff_seconds: float = 30.0,
        watch_timeout_seconds: int = 300,
        on_dropped_fields: Callable[[DroppedFieldsError], None] | None = None,
        live: liveness.Liveness | None = None,
    ) -> None:
        self.kube = kube
        self.live = live or liveness.Liveness()
        self.driver_name = driver_name
        self.node_name = node_name
        self.desired = desired
        self.log = log
        self.resync_seconds = resync_seconds
        self.debounce_seconds = debounce_seconds
        self.max_backoff_seconds = max_backoff_seconds
        self.watch_timeout_seconds = watch_timeout_seconds
        self.on_dropped_fields = on_dropped_fields
        self.dropped: frozenset[str] = frozenset()
        self.last_result: SyncResult | None = None
        self.last_error: FlexNPUError | None = None
        self.syncs = 0
        self.published = threading.Event()
        """Set once a sync made the whole pool published (the readiness of the node process)."""
        self._signal = _Signal()
        self._sync_lock = threading.Lock()

    # --- one sync ------------------------------------------------------------------------

    def sync(self) -> SyncResult:
        """Make the API match ``desired()`` once; no writes when it already does.

        Raises InvalidInput for an invalid desired pool, :class:`DroppedFieldsError` when the
        server drops fields (remaining writes of this sync are skipped), and Unavailable /
        Conflict for API trouble (retry).
        """
        with self._sync_lock:
            pool = self.desired()
            slices.validate_pool(pool)
            existing, _ = self.kube.list_slices(driver=self.driver_name, node=self.node_name)
            plan = plan_sync(
                existing, pool, driver_name=self.driver_name, node_name=self.node_name, ignore=self.dropped
            )
            result = self._apply(plan)
            self.syncs += 1
            self.last_result = result
            self.published.set()
            return result

    def withdraw(self) -> int:
        """Delete every slice of this driver on this node (a clean uninstall); how many went.
        Call it only once nothing publishes any more (the run loop has ended)."""
        with self._sync_lock:
            existing, _ = self.kube.list_slices(driver=self.driver_name, node=self.node_name)
            for item in existing:
                meta = item["metadata"]
                self.kube.delete_slice(
                    meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"]
                )
            self.published.clear()
            return len(existing)

    def _apply(self, plan: Plan) -> SyncResult:
        deleted = updated = created = 0

        def progress() -> SyncResult:
            return SyncResult(plan.generation, deleted, updated, created)

        for item in plan.delete:
            meta = item["metadata"]
            self.kube.delete_slice(meta["name"], uid=meta["uid"], resource_version=meta["resourceVersion"])
            deleted += 1
            self.log.info("deleted obsolete ResourceSlice %s", meta["name"])
        for body in plan.update:
            try:
                stored = self.kube.update_slice(body)
            except NotFound as err:  # deleted behind our back (kubelet wipe): relist and retry
                raise Conflict(f"ResourceSlice {body['metadata']['name']} vanished during the sync") from err
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
            raise DroppedFieldsError(fields, result)

    def _owner_reference(self) -> JSON:
        try:
            node = self.kube.get_node(self.node_name)
        except NotFound as err:
            raise Unavailable(f"node {self.node_name} is not registered yet", field="nodeName") from err
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "name": self.node_name,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }

    # --- the loop ------------------------------------------------------------------------

    def trigger(self) -> None:
        """Ask for a sync soon (inventory or health changed); safe from any thread."""
        with self._signal.cond:
            self._signal.pending = True
            self._signal.cond.notify_all()

    def run(self, stop: threading.Event) -> None:
        """Sync now, then whenever the watch, :meth:`trigger` or the resync timer asks; until ``stop``.

        Never raises for API trouble: errors are logged and retried with capped exponential
        backoff with jitter.
        """
        self.live.register(LOOP_PUBLISHER, deadline=LIVENESS_CHUNK_SECONDS + self.max_backoff_seconds + 120)
        self.live.register(LOOP_WATCH, deadline=self.watch_timeout_seconds + 90)
        waker = threading.Thread(target=self._wake_on_stop, args=(stop,), name="publisher-stop", daemon=True)
        watcher = threading.Thread(
            target=self._watch_forever, args=(stop,), name="publisher-watch", daemon=True
        )
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
            with self._signal.cond:
                self._signal.pending = False
            try:
                result = self._sync_with_retry(stop)
            except DroppedFieldsError as err:
                self.last_error = err
                self.log.error("%s", err)
                if self.on_dropped_fields is not None:
                    self.on_dropped_fields(err)
                immediate = True
                continue
            except FlexNPUError as err:
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
        """Block until a trigger (True), the resync timer or stop (False); alive meanwhile."""
        timeout = self.resync_seconds * random.uniform(0.9, 1.1) if self.resync_seconds > 0 else None  # noqa: S311
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._signal.cond:
            while True:
                left = LIVENESS_CHUNK_SECONDS if deadline is None else deadline - time.monotonic()
                woke = self._signal.cond.wait_for(
                    lambda: self._signal.pending or stop.is_set(), timeout=min(left, LIVENESS_CHUNK_SECONDS)
                )
                if woke or (deadline is not None and time.monotonic() >= deadline):
                    return bool(woke) and not stop.is_set()
                self.live.passed(LOOP_PUBLISHER)  # idle, not dead

    def _sync_with_retry(self, stop: threading.Event) -> SyncResult | None:
        retrying = self._retrying(stop, "ResourceSlice sync")
        try:
            return retrying(self.sync)
        except Unavailable:
            if stop.is_set():
                return None
            raise

    def _retrying(self, stop: threading.Event, what: str) -> tenacity.Retrying:
        def before_sleep(state: tenacity.RetryCallState) -> None:
            outcome = state.outcome
            err = outcome.exception() if outcome is not None else None
            if isinstance(err, FlexNPUError):
                self.last_error = err
            delay = state.next_action.sleep if state.next_action else 0.0
            self.live.passed(LOOP_WATCH if "watch" in what else LOOP_PUBLISHER)  # retrying is alive
            self.log.warning(
                "%s failed (attempt %d), retrying in %.1fs: %s", what, state.attempt_number, delay, err
            )

        return retrying.policy(
            stop=lambda _state: stop.is_set(),
            sleep=self._sleeper(stop),
            before_sleep=before_sleep,
            base=0.2,
            max_wait=self.max_backoff_seconds,
        )

    @staticmethod
    def _sleeper(stop: threading.Event) -> Callable[[float], None]:
        def sleep(seconds: float) -> None:
            stop.wait(seconds)  # a stop cuts the backoff short

        return sleep

    def _wake_on_stop(self, stop: threading.Event) -> None:
        stop.wait()
        with self._signal.cond:
            self._signal.cond.notify_all()

    # --- the watch -----------------------------------------------------------------------

    def _watch_forever(self, stop: threading.Event) -> None:
        """List+watch own slices; trigger a sync whenever they stop matching the desired pool."""
        state: JSON = {"rv": None, "cache": {}}
        while not stop.is_set():
            self.live.passed(LOOP_WATCH)
            try:
                self._retrying(stop, "ResourceSlice watch")(self._watch_once, state, stop)
            except FlexNPUError as err:
                if stop.is_set():
                    return
                self.log.error("ResourceSlice watch failed: %s", err)
                stop.wait(self.max_backoff_seconds)
            except Exception as exc:
                self.live.failed(LOOP_WATCH, exc)
                self.log.exception("unexpected error in the ResourceSlice watch")
                stop.wait(self.max_backoff_seconds)

    def _watch_once(self, state: JSON, stop: threading.Event) -> None:
        cache: dict[str, JSON] = state["cache"]
        try:
            if state["rv"] is None:
                items, rv = self.kube.list_slices(driver=self.driver_name, node=self.node_name)
                cache.clear()
                cache.update({i["metadata"]["name"]: i for i in items})
                state["rv"] = rv
                self._check(cache)
            for kind, obj in self.kube.watch_slices(
                driver=self.driver_name,
                node=self.node_name,
                resource_version=state["rv"],
                timeout_seconds=self.watch_timeout_seconds,
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
                self._check(cache)
        except Gone:
            # Only an expired resourceVersion forces a relist; after other errors the watch
            # resumes from the last version seen (like client-go's reflector).
            self.log.info("ResourceSlice watch expired (410 Gone); relisting")
            state["rv"] = None

    def _check(self, cache: Mapping[str, JSON]) -> None:
        """Trigger a sync when the watched slices differ from the desired pool."""
        try:
            pool = self.desired()
            plan = plan_sync(
                cache.values(),
                pool,
                driver_name=self.driver_name,
                node_name=self.node_name,
                ignore=self.dropped,
            )
        except FlexNPUError:
            self.trigger()  # let the sync report it
            return
        if not plan.empty:
            self.trigger()

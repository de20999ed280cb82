"""Watch-fed caches of what the scheduler allocated and what the nodes publish, for placement.

:class:`ClaimAllocations` keeps, per pool, the allocation results of this driver from a
list-then-watch of every ResourceClaim (``status.allocation`` naming the driver, and the pool
when one is given): the node orders its devices from it (``dra_driver/placement.py``), the
scheduler extender scores nodes from it (``controller/extender.py``). It is the scheduler's own
view — allocated, not only prepared — so a die filled a moment ago counts before the kubelet
prepares anything. A cache of one pool (the node's) drops the watch events that cannot change it
before they are decoded (:meth:`ClaimAllocations.unrelated`): every node sees every claim event.
:class:`DriverSlices` keeps every pool's ResourceSlices of the driver (the extender's die totals
per node).

Both run as a :func:`dra_driver.liveness.run_forever` loop: list, then watch from the list's
resourceVersion; a watch that ends is restarted from the last version seen; ``Gone`` (410) lists
again; other API errors back off (capped). After each change the ``on_change`` callback gets the
pools that changed on the watch's thread (it must be quick: the node's republish trigger only
sets a flag; the extender's recomputes the changed pools' scores). Reads are
from a snapshot under a lock; no read goes to the API.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from controller.kube import Gone, Kube
from dra_driver import liveness, placement
from dra_driver.errors import FlexNPUError
from dra_driver.placement import Allocated
from dra_kubeletplugin.resourceslice import pools

log = logging.getLogger("flexnpu.placement")

JSON = dict[str, Any]
WATCH_TIMEOUT_SECONDS = 300
MAX_BACKOFF = 30.0
LOOP_ALLOCATIONS = "allocation-watch"
LOOP_SLICES = "slice-watch"

OnChange = Callable[[frozenset[str]], None]


class _ListWatch:
    """One list-then-watch loop over a resource, feeding ``reset`` (the list) and ``apply`` (events)."""

    def __init__(
        self,
        *,
        name: str,
        list_fn: Callable[[], tuple[list[JSON], str]],
        watch_fn: Callable[[str, threading.Event], Iterator[tuple[str, JSON]]],
        reset: Callable[[list[JSON]], None],
        apply: Callable[[str, JSON], None],
        live: liveness.Liveness | None,
    ) -> None:
        self.name = name
        self._list, self._watch, self._reset, self._apply = list_fn, watch_fn, reset, apply
        self.live = live or liveness.Liveness()
        self.synced = threading.Event()
        self._rv = ""
        self._backoff = 1.0

    def run(self, stop: threading.Event) -> None:
        self.live.register(self.name, deadline=WATCH_TIMEOUT_SECONDS + 90)
        liveness.run_forever(self.live, self.name, lambda: self.once(stop), stop, logger=log)

    def once(self, stop: threading.Event) -> float | None:
        try:
            if not self._rv:
                items, self._rv = self._list()
                self._reset(items)
                self.synced.set()
            for kind, obj in self._watch(self._rv, stop):
                self._rv = str((obj.get("metadata") or {}).get("resourceVersion") or self._rv)
                self.live.passed(self.name)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    self._apply(kind, obj)
            self._backoff = 1.0
            return None
        except Gone:
            self._rv = ""  # events may have been missed: list again
            return None
        except FlexNPUError as err:
            delay = self._backoff
            self._backoff = min(delay * 2, MAX_BACKOFF)
            log.info("%s: %s; retrying in %.0fs", self.name, err, delay)
            return delay


class _Cache:
    """A cache fed by one list-then-watch loop: ``reset`` takes a list, ``apply`` one event."""

    _loop: _ListWatch

    def _watching(
        self,
        name: str,
        list_fn: Callable[[], tuple[list[JSON], str]],
        watch_fn: Callable[[str, threading.Event], Iterator[tuple[str, JSON]]],
        live: liveness.Liveness | None,
    ) -> None:
        self._loop = _ListWatch(
            name=name, list_fn=list_fn, watch_fn=watch_fn, reset=self.reset, apply=self.apply, live=live
        )

    @property
    def synced(self) -> threading.Event:
        """Set once the first list is in (until then the cache reads as empty)."""
        return self._loop.synced

    def run(self, stop: threading.Event) -> None:
        self._loop.run(stop)

    def reset(self, items: Iterable[JSON]) -> None:
        raise NotImplementedError

    def apply(self, kind: str, obj: JSON) -> None:
        raise NotImplementedError


class ClaimAllocations(_Cache):
    """Allocation results of ``driver`` per pool, from a watch of every ResourceClaim.

    Usage::

        cache = ClaimAllocations(kube, driver="npu.flexnpu.io", pool="node-1", on_change=trigger)
        threading.Thread(target=cache.run, args=(stop,), daemon=True).start()
        cache.results("node-1")
    """

    def __init__(
        self,
        kube: Kube,
        *,
        driver: str,
        pool: str | None = None,
        on_change: OnChange | None = None,
        live: liveness.Liveness | None = None,
    ) -> None:
        self.driver, self.pool = driver, pool
        self.on_change = on_change
        self._lock = threading.Lock()
        self._by_claim: dict[str, tuple[Allocated, ...]] = {}
        self._by_pool: dict[str, dict[str, tuple[Allocated, ...]]] = {}
        self._pool_token = _token(pool)
        self._tokens: dict[str, bytes | None] = {}  # counted claim -> its uid (or name) as a JSON string
        self.events = 0
        """Watch events decoded and applied."""
        self.skipped = 0
        """Watch events dropped undecoded by :meth:`unrelated`."""
        self._watching(
            LOOP_ALLOCATIONS,
            lambda: kube.list_claims(),  # noqa: PLW0108 - bound at call time (unit tests pass no API)
            lambda rv, stop: kube.watch_claims(
                resource_version=rv,
                timeout_seconds=WATCH_TIMEOUT_SECONDS,
                stop=stop,
                skip=self.unrelated if pool is not None else None,
            ),
            live,
        )

    def unrelated(self, line: bytes) -> bool:
        """Whether a raw claim watch event line cannot change this cache of one pool (decided undecoded).

        It cannot when the line spells neither this pool's name as a JSON string (so no allocation
        result in it names the pool) nor the uid of a claim counted here (so it is not the deletion
        or de-allocation of one), is no ``BOOKMARK`` or ``ERROR`` event, and holds no escape that
        could spell a name otherwise (``\\u``, ``\\/``). Anything else is decoded and applied:
        a doubt is full handling. Called on the watch's thread, the only one that changes what is
        counted (so the counted claims are those of every event before this one).
        """
        token = self._pool_token
        if token is None or token in line:
            return False
        for mark in _NOT_UNRELATED:
            if mark in line:
                return False
        for claim in self._tokens.values():
            if claim is None or claim in line:
                return False
        self.skipped += 1
        return True

    def results(self, pool: str) -> list[Allocated]:
        with self._lock:
            return [r for per_claim in self._by_pool.get(pool, {}).values() for r in per_claim]

    def pools(self) -> list[str]:
        with self._lock:
            return sorted(p for p, claims in self._by_pool.items() if claims)

    def reset(self, claims: Iterable[JSON]) -> None:
        """Replace everything with a fresh list (the first one, or after a 410)."""
        with self._lock:
            before = {p: dict(c) for p, c in self._by_pool.items()}
            self._by_claim.clear()
            self._by_pool.clear()
            self._tokens.clear()
            for claim in claims:
                self._set(_uid(claim), self._results(claim), claim)
            changed = frozenset(
                p for p in set(before) | set(self._by_pool) if before.get(p) != self._by_pool.get(p)
            )
        self._changed(changed)

    def apply(self, kind: str, claim: JSON) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        uid = _uid(claim)
        new = () if kind == "DELETED" else self._results(claim)
        with self._lock:
            self.events += 1
            old = self._by_claim.get(uid, ())
            if old == new:
                return
            self._set(uid, new, claim)
            changed = frozenset(r.pool for r in (*old, *new))
        self._changed(changed)

    def _results(self, claim: Mapping[str, Any]) -> tuple[Allocated, ...]:
        return tuple(placement.allocated_results([claim], driver=self.driver, pool=self.pool))

    def _set(self, uid: str, results: tuple[Allocated, ...], claim: Mapping[str, Any]) -> None:
        for r in self._by_claim.pop(uid, ()):
            self._by_pool.get(r.pool, {}).pop(uid, None)
        self._tokens.pop(uid, None)
        if results:
            self._by_claim[uid] = results
            self._tokens[uid] = _claim_token(claim)
            for r in results:
                per_pool = self._by_pool.setdefault(r.pool, {})
                per_pool[uid] = tuple(x for x in results if x.pool == r.pool)

    def _changed(self, pools_: frozenset[str]) -> None:
        if pools_ and self.on_change is not None:
            self.on_change(pools_)


class DriverSlices(_Cache):
    """Every pool's published ResourceSlices of ``driver`` (newest generation), from a watch."""

    def __init__(
        self,
        kube: Kube,
        *,
        driver: str,
        on_change: OnChange | None = None,
        live: liveness.Liveness | None = None,
    ) -> None:
        self.driver = driver
        self.on_change = on_change
        self._lock = threading.Lock()
        self._by_pool: dict[str, dict[str, JSON]] = {}  # pool -> slice name -> slice
        self._watching(
            LOOP_SLICES,
            lambda: kube.list_driver_slices(driver),
            lambda rv, stop: kube.watch_driver_slices(
                driver, resource_version=rv, timeout_seconds=WATCH_TIMEOUT_SECONDS, stop=stop
            ),
            live,
        )

    def reset(self, items: Iterable[JSON]) -> None:
        with self._lock:
            before = set(self._by_pool)
            self._by_pool = {}
            for s in items:
                self._by_pool.setdefault(_pool_of(s), {})[_name(s)] = s
            changed = frozenset(before | set(self._by_pool))
        if self.on_change is not None:
            self.on_change(changed)

    def apply(self, kind: str, obj: JSON) -> None:
        pool = _pool_of(obj)
        with self._lock:
            slices = self._by_pool.setdefault(pool, {})
            if kind == "DELETED":
                slices.pop(_name(obj), None)
                if not slices:
                    del self._by_pool[pool]
            else:
                slices[_name(obj)] = obj
        if self.on_change is not None:
            self.on_change(frozenset({pool}))

    def pool_names(self) -> list[str]:
        with self._lock:
            return sorted(self._by_pool)

    def pool(self, name: str) -> tuple[str, pools.Pool] | None:
        """(the node its slices name, the pool's newest-generation slices as a ``Pool``), or None
        when the pool has no node-local slice."""
        with self._lock:
            items = list(self._by_pool.get(name, {}).values())
        if not items:
            return None
        newest = max(int(s["spec"]["pool"].get("generation") or 0) for s in items)
        current = sorted(
            (s for s in items if int(s["spec"]["pool"].get("generation") or 0) == newest), key=_name
        )
        node = next((str(s["spec"]["nodeName"]) for s in current if s["spec"].get("nodeName")), "")
        if not node:
            return None
        specs = [{k: s["spec"][k] for k in ("devices", "sharedCounters") if k in s["spec"]} for s in current]
        return node, pools.Pool(name=name, slices=specs)


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _pool_of(obj: Mapping[str, Any]) -> str:
    return str(((obj.get("spec") or {}).get("pool") or {}).get("name", ""))


_NOT_UNRELATED = (b"\\u", b"\\/", b'"BOOKMARK"', b'"ERROR"')
"""Marks of a watch line :meth:`ClaimAllocations.unrelated` never drops: escapes that could spell a
name otherwise, and the events that are not a claim's."""


def _token(value: object) -> bytes | None:
    """``value`` as it stands in a JSON document (a string without escapes), or None when it is not
    such a string (a line is then never taken as unrelated to it)."""
    if not isinstance(value, str) or not value:
        return None
    token = json.dumps(value).encode()
    return None if b"\\" in token else token


def _claim_token(claim: Mapping[str, Any]) -> bytes | None:
    """What every watch event of this claim spells: its uid (its name when it has none, as :func:`_uid`)."""
    meta = claim.get("metadata") or {}
    return _token(meta.get("uid") if meta.get("uid") else meta.get("name"))


def _uid(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")

"""Fetching the claims of a prepare: fair between calls, bounded per call, fast for claims that cannot be served.

A prepare GETs every claim before the driver sees it (the Go helper does too), outside the call
serializer. Three things keep a flood of bogus or unknown claims from starving a real prepare:

* **A fair, bounded fetch pool** (:class:`FairFetcher`): every call gets its own lane; a few
  shared workers take one GET at a time from the lanes in turn (round-robin), and one lane has at
  most ``per_call`` GETs in flight. A call with one claim that arrives while others wait for
  thousands has its GET started within one round of the lanes, not after theirs.
* **A short negative cache** (:class:`NegativeCache`) keyed by the claim's UID, namespace and
  name. What the API proved can never change for that UID — no claim of that name exists
  (deletion is final and UIDs are never reused), or the claim of that name has another UID — is
  remembered for ``permanent_seconds``; a claim that exists but is not allocated, or not to this
  driver, only for ``transient_seconds`` (an allocation may still come). Answers that prove
  nothing (API trouble) are never cached.
* **The kubelet's deadline** bounds the wait: a claim whose GET has not started when the call's
  deadline passes gets a :class:`~dra_kubeletplugin.errors.ClaimRejected` (``Deadline``) at once.

:func:`check_claim` is the pure check of what came back (right UID, allocated, a device of this
driver). Nothing here knows what preparing means.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_kubeletplugin import errors
from dra_kubeletplugin.claims import ClaimRef, ResourceClaim
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected

__all__ = ["DEFAULT_WORKERS", "FairFetcher", "NegativeCache", "check_claim"]

DEFAULT_WORKERS = 4
"""GETs in flight at once for all calls together (the API server's load from this node)."""
DEFAULT_PER_CALL = 2
"""GETs in flight at once for one call."""
PERMANENT = frozenset({ClaimReason.NOT_FOUND, ClaimReason.REPLACED})
TRANSIENT = frozenset({ClaimReason.NOT_ALLOCATED, ClaimReason.NOT_THIS_DRIVER})

Fetched = ResourceClaim | Exception
ClaimGetter = Callable[[str, str], Mapping[str, Any]]


def check_claim(ref: ClaimRef, obj: Mapping[str, Any], *, driver_name: str) -> Fetched:
    """The claim if it is the one asked for, allocated, with a device of ``driver_name``; else why not. Pure."""
    meta = obj.get("metadata") or {}
    actual = meta.get("uid")
    if actual != ref.uid:
        return ClaimRejected.make(
            f"claim {ref.namespace}/{ref.name} got replaced: the API has UID {str(actual)[:64]!r}, "
            f"the kubelet asked for {ref.uid[:64]!r}",
            reason=ClaimReason.REPLACED,
            claim_uid=ref.uid,
            field="metadata.uid",
        )
    claim = ResourceClaim(ref=ref, obj=obj)
    if not isinstance((obj.get("status") or {}).get("allocation"), Mapping):
        return ClaimRejected.make(
            f"claim {ref.namespace}/{ref.name} is not allocated",
            reason=ClaimReason.NOT_ALLOCATED,
            claim_uid=ref.uid,
            field="status.allocation",
        )
    if not claim.results(driver_name):
        return ClaimRejected.make(
            f"claim {ref.namespace}/{ref.name} has no device of driver {driver_name} in its allocation",
            reason=ClaimReason.NOT_THIS_DRIVER,
            claim_uid=ref.uid,
            field="status.allocation.devices.results",
        )
    return claim


class NegativeCache:
    """Claims that cannot be served, remembered briefly so that asking again costs no GET.

    **Parameters:** ``permanent_seconds`` (proven for good: not found, replaced), ``transient_seconds``
    (not allocated, not this driver's), ``max_entries`` (oldest dropped first), ``clock``.
    """

    def __init__(
        self,
        *,
        permanent_seconds: float = 300.0,
        transient_seconds: float = 2.0,
        max_entries: int = 8192,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl = {True: permanent_seconds, False: transient_seconds}
        self._max = max_entries
        self._clock = clock
        self._lock = threading.Lock()
        self._entries: OrderedDict[ClaimRef, tuple[float, Exception]] = OrderedDict()
        self.hits = 0

    def get(self, ref: ClaimRef) -> Exception | None:
        with self._lock:
            found = self._entries.get(ref)
            if found is None:
                return None
            if found[0] <= self._clock():
                del self._entries[ref]
                return None
            self.hits += 1
            return found[1]

    def put(self, ref: ClaimRef, exc: Exception) -> None:
        """Remember ``exc`` for ``ref`` if it is worth remembering (see the module docstring)."""
        permanent = _reason(exc) in PERMANENT
        if not permanent and _reason(exc) not in TRANSIENT:
            return
        with self._lock:
            self._entries[ref] = (self._clock() + self._ttl[permanent], exc)
            self._entries.move_to_end(ref)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)


def _reason(exc: Exception) -> ClaimReason | None:
    if isinstance(exc, ClaimRejected):
        return exc.reason
    if isinstance(exc, errors.NotFound):  # get_claim raises it only when the API proved the claim gone
        return ClaimReason.NOT_FOUND
    return None


@dataclass(eq=False)
class _Lane:
    """One call's GETs: what is still to fetch, what is in flight, what came back."""

    pending: deque[ClaimRef]
    results: dict[str, Fetched] = field(default_factory=dict)
    inflight: int = 0
    closed: bool = False


class FairFetcher:
    """GETs the claims of every concurrent call on a few shared workers, one call's lane after another.

    Usage::

        fetcher = FairFetcher(kube.get_claim, driver_name="gpu.example.com")
        got = fetcher.fetch(refs, deadline=time.monotonic() + 40)   # uid -> ResourceClaim | Exception
        fetcher.close()

    **Parameters:** ``get_claim(namespace, name)`` (raises the helper's API errors), ``driver_name``,
    ``workers`` (GETs in flight for all calls), ``per_call`` (GETs in flight for one call), ``cache``.

    **Attributes:** ``started`` — the refs whose GET began, in order (bounded; for tests and
    diagnostics: it shows the lanes taking turns).
    """

    def __init__(
        self,
        get_claim: ClaimGetter,
        *,
        driver_name: str,
        workers: int = DEFAULT_WORKERS,
        per_call: int = DEFAULT_PER_CALL,
        cache: NegativeCache | None = None,
    ) -> None:
        if workers < 1 or per_call < 1:
            raise errors.InvalidArgument(f"workers ({workers}) and per_call ({per_call}) must be at least 1")
        self._get = get_claim
        self._driver = driver_name
        self._per_call = per_call
        self.cache = cache if cache is not None else NegativeCache()
        self._cond = threading.Condition()
        self._lanes: deque[_Lane] = deque()
        self._closed = False
        self.started: deque[ClaimRef] = deque(maxlen=65536)
        self._threads = [
            threading.Thread(target=self._work, name=f"claim-fetch-{i}", daemon=True) for i in range(workers)
        ]
        for t in self._threads:
            t.start()

    def fetch(self, refs: Sequence[ClaimRef], *, deadline: float | None = None) -> dict[str, Fetched]:
        """One result per ref UID: the checked claim, or the exception that says why not."""
        out: dict[str, Fetched] = {}
        todo: deque[ClaimRef] = deque()
        for ref in refs:
            cached = self.cache.get(ref)
            if cached is not None:
                out[ref.uid] = cached
            else:
                todo.append(ref)
        if not todo:
            return out
        lane = _Lane(pending=todo)
        with self._cond:
            if self._closed:
                raise errors.InvalidArgument("the claim fetcher is closed")
            self._lanes.append(lane)
            self._cond.notify_all()
            try:
                while lane.pending or lane.inflight:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._cond.wait(timeout=left)
            finally:
                lane.closed = True
                self._lanes.remove(lane)
            late = list(lane.pending) + [r for r in refs if r.uid not in lane.results and r.uid not in out]
        out.update(lane.results)
        for ref in late:
            out.setdefault(
                ref.uid,
                ClaimRejected.make(
                    "the kubelet's deadline for this call passed before the claim could be read",
                    reason=ClaimReason.DEADLINE,
                    claim_uid=ref.uid,
                ),
            )
        return out

    def close(self) -> None:
        """Stop the workers once their current GET returns (no new call is accepted)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _next(self) -> tuple[_Lane, ClaimRef] | None:
        """The next GET: the first lane in turn with work and room (under the condition's lock)."""
        for _ in range(len(self._lanes)):
            lane = self._lanes[0]
            self._lanes.rotate(-1)
            if lane.pending and lane.inflight < self._per_call:
                lane.inflight += 1
                return lane, lane.pending.popleft()
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._next()
                while job is None:
                    if self._closed:
                        return
                    self._cond.wait()
                    job = self._next()
                lane, ref = job
                self.started.append(ref)
            result = self._one(ref)
            with self._cond:
                lane.inflight -= 1
                if not lane.closed:
                    lane.results[ref.uid] = result
                self._cond.notify_all()

    def _one(self, ref: ClaimRef) -> Fetched:
        try:
            fetched = check_claim(ref, self._get(ref.namespace, ref.name), driver_name=self._driver)
        except Exception as exc:  # an API error is this claim's answer, never the call's
            fetched = exc
        if isinstance(fetched, Exception):
            self.cache.put(ref, fetched)
        return fetched

"""Residual reconciler: the node unprepares what no live claim owns, and sweeps orphans.

A prepared claim (a checkpoint entry) is *residual* when the API proves one of:

* the claim is gone: a ``Status`` 404 NotFound for this ResourceClaim's name (see
  :meth:`controller.kube.Kube.get_claim`: any other 404 proves nothing);
* the claim's UID changed (the same name recreated: a ResourceClaim of that name with another UID);
* its allocation no longer names this driver on this node's pool;
* it has had no consumer in ``status.reservedFor`` for longer than the grace period (a pod
  force-deleted: the kubelet never calls unprepare).

Doubt keeps things. An answer that proves nothing (:class:`~controller.kube.Ambiguous`: a 404
that is not a NotFound Status, an empty, malformed or foreign 200; a 5xx; 403) keeps that claim
and the pass goes on with the others; the claim is asked about again after a backoff. When the
API server does not answer at all (:class:`~controller.kube.Unreachable`) the pass stops before
removing anything. While the checkpoint store says it cannot be trusted (``store.trusted`` is
false: a damaged checkpoint whose ownership is not rebuilt yet), nothing is removed at all.

Entries left in ``PrepareStarted``/``UnprepareStarted`` by a crash are rolled back (the kubelet
prepares again if it still wants the claim). Then the orphan sweep removes what no entry owns.

Cost follows the node, not the cluster: the claim watch starts from a ``limit=1`` list (a
resourceVersion, not the cluster's claims) and decides whether an event matters from
:class:`ClaimIndex`, an in-memory map of this node's claims that is reloaded from the store only
when the store changed on disk (one ``stat`` per event). Passes run at start, on watch events
about this node's claims, and periodically with jitter. :meth:`Reconciler.plan` is the dry run.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from controller.kube import Gone, Kube, NotFound, Unreachable
from dra_driver import liveness, logs, sweep
from dra_driver.checkpoint import Checkpoint, CheckpointStore, ClaimEntry, ClaimState
from dra_driver.errors import FlexNPUError
from dra_driver.telemetry import Telemetry

log = logging.getLogger("flexnpu.cleanup")

RECENT_NS = 100_000_000
"""A store file changed less than this long ago (ns) is read again at the next event."""
MIN_PASS_INTERVAL = 0.5
"""Seconds between two passes at least, so a burst of watch events makes one pass."""
MAX_BACKOFF = 30.0
"""Cap of the retry delay after a pass with doubt or an unreachable API."""
WATCH_TIMEOUT_SECONDS = 300
LOOP_RECONCILER = "reconciler"
LOOP_CLAIM_WATCH = "claim-watch"


class ClaimOwner(Protocol):
    """What the reconciler needs of the code that prepares claims (kubeletplugin/prepare.py)."""

    store: CheckpointStore

    def locked(self) -> AbstractContextManager[Checkpoint]: ...

    def unprepare_uid(self, uid: str, clog: logs.ClaimLogger) -> bool: ...

    def settle_interrupted(self) -> list[str]: ...


def residual_reason(
    uid: str, claim: Mapping[str, Any] | None, *, driver_name: str, pool_name: str
) -> str | None:
    """Why claim ``uid`` is residual given the API's proven view of it (None: it is not). Pure.

    ``claim`` is None only when the API proved the claim absent (a NotFound Status for its name).
    """
    if claim is None:
        return "the claim no longer exists"
    current = (claim.get("metadata") or {}).get("uid")
    if not current:  # Kube.get_claim never returns this; callers passing raw events might
        return None
    if current != uid:
        return f"the claim was replaced (now UID {current})"
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return "the claim is no longer allocated"
    results = (allocation.get("devices") or {}).get("results") or []
    ours = [r for r in results if r.get("driver") == driver_name and r.get("pool") == pool_name]
    if not ours:
        return "the claim's allocation no longer names this node"
    return None


def has_consumer(claim: Mapping[str, Any]) -> bool:
    return bool((claim.get("status") or {}).get("reservedFor"))


@dataclass(frozen=True, slots=True)
class Residual:
    uid: str
    namespace: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True)
class Doubt:
    """A claim kept because the API's answer about it proved nothing."""

    uid: str
    namespace: str
    name: str
    why: str


@dataclass(slots=True)
class Findings:
    residuals: list[Residual] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    orphans: list[sweep.Orphan] = field(default_factory=list)
    doubts: list[Doubt] = field(default_factory=list)
    untrusted: bool = False
    errors: list[str] = field(default_factory=list)  # removals that failed; retried next pass


@dataclass(frozen=True, slots=True)
class IndexedClaim:
    uid: str
    namespace: str
    name: str
    state: str


class ClaimIndex:
    """This node's claims, in memory: by UID and by namespace/name.

    Reloaded from the store only when its file changed (size, mtime or inode), so deciding
    whether one of the cluster's claim events concerns this node costs a ``stat`` and two dict
    lookups, never a checkpoint decode.
    """

    def __init__(self, load: Callable[[], Mapping[str, ClaimEntry]], path: Path | None) -> None:
        self._load = load
        self._path = path
        self._lock = threading.Lock()
        self._token: tuple[int, int, int] | None = None
        self._by_uid: dict[str, IndexedClaim] = {}
        self._by_name: dict[tuple[str, str], str] = {}
        self.reloads = 0

    def refresh(self, entries: Mapping[str, ClaimEntry] | None = None, *, force: bool = False) -> None:
        """Reload from ``entries`` (or the store) when given, forced, or the store changed."""
        token = self._stat()
        with self._lock:
            if entries is None and not force and token is not None and token == self._token:
                return
        fresh = entries if entries is not None else self._load()
        if token is not None and time.time_ns() - token[2] < RECENT_NS:
            token = None  # changed within a timestamp tick: a second change may not move mtime
        by_uid = {uid: IndexedClaim(uid, e.namespace, e.name, str(e.state)) for uid, e in fresh.items()}
        with self._lock:
            self._token = token
            self._by_uid = by_uid
            self._by_name = {(c.namespace, c.name): uid for uid, c in by_uid.items()}
            self.reloads += 1

    def get(self, uid: str) -> IndexedClaim | None:
        return self._by_uid.get(uid)

    def uid_of(self, namespace: str, name: str) -> str | None:
        return self._by_name.get((namespace, name))

    def __len__(self) -> int:
        return len(self._by_uid)

    def _stat(self) -> tuple[int, int, int] | None:
        if self._path is None:
            return None
        try:
            st = os.stat(self._path)
        except OSError:
            return (0, 0, 0)  # no file yet: an empty store; a change makes it appear
        return (st.st_ino, st.st_size, st.st_mtime_ns)


class Reconciler:
    """Compares the checkpoint with the API and the node; removes residuals and orphans."""

    def __init__(
        self,
        *,
        kube: Kube,
        preparer: ClaimOwner,
        driver_name: str,
        node_name: str,
        pool_name: str,
        places: sweep.SweepPlaces,
        daemon: sweep.DaemonView | None = None,
        grace_seconds: float = 300.0,
        period_seconds: float = 60.0,
        telemetry: Telemetry | None = None,
        live: liveness.Liveness | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.preparer = preparer
        self.driver_name = driver_name
        self.node_name = node_name
        self.pool_name = pool_name
        self.places = places
        self.daemon = daemon
        self.grace_seconds = grace_seconds
        self.period_seconds = period_seconds
        self.telemetry = telemetry or Telemetry(node_name=node_name, driver_name=driver_name, enabled=False)
        self.live = live or liveness.Liveness()
        self.clock = clock
        self.index = ClaimIndex(self._entries, getattr(preparer.store, "path", None))
        self._unreserved_since: dict[str, float] = {}
        self._wake = threading.Event()
        self._reported_doubts: tuple[str, ...] = ()
        self._backoff = 1.0
        self._watch_backoff = 1.0
        self.passes = 0
        self.last_error: FlexNPUError | None = None
        self.last_findings: Findings | None = None

    # -- the store, through its public face ----------------------------------------------------

    def _entries(self) -> dict[str, ClaimEntry]:
        entries = getattr(self.preparer.store, "entries", None)  # the per-claim store's snapshot
        return dict(entries()) if callable(entries) else dict(self.preparer.store.read().claims)

    def _trusted(self) -> bool:
        """False while the store says its state is damaged and ownership is not rebuilt."""
        return bool(getattr(self.preparer.store, "trusted", True))

    # -- one pass ---------------------------------------------------------------------------

    def plan(self) -> Findings:
        """What a pass would remove (the dry run).

        Raises :class:`~controller.kube.Unreachable` when the API server does not answer; an
        ambiguous answer about one claim is a :class:`Doubt` and the others are still judged.
        """
        findings = Findings(untrusted=not self._trusted())
        entries = self._entries()
        self.index.refresh(entries)
        now = self.clock()
        for entry in entries.values():
            if entry.state != ClaimState.PREPARE_COMPLETED:
                findings.interrupted.append(entry.uid)
                continue
            try:
                claim: Mapping[str, Any] | None = self.kube.get_claim(entry.namespace, entry.name)
            except NotFound:
                claim = None
            except Unreachable:
                raise
            except FlexNPUError as err:  # Ambiguous, 5xx, 403, 429, ...: this claim stays
                findings.doubts.append(Doubt(entry.uid, entry.namespace, entry.name, str(err)))
                continue
            reason = residual_reason(entry.uid, claim, driver_name=self.driver_name, pool_name=self.pool_name)
            if reason is None and claim is not None:
                if has_consumer(claim):
                    self._unreserved_since.pop(entry.uid, None)
                else:
                    since = self._unreserved_since.setdefault(entry.uid, now)
                    if now - since >= self.grace_seconds:
                        reason = f"no consumer in reservedFor for {now - since:.0f}s"
            if reason:
                findings.residuals.append(Residual(entry.uid, entry.namespace, entry.name, reason))
        for gone in set(self._unreserved_since) - set(entries):
            self._unreserved_since.pop(gone, None)
        if not findings.untrusted:
            with self.preparer.locked() as cp:
                findings.orphans = sweep.find(set(cp.claims), self.places, self.daemon)
        return findings

    def reconcile_once(self) -> Findings:
        """Remove proven residual claims, roll back interrupted ones, sweep orphans.

        Removes nothing while the store is untrusted; raises
        :class:`~controller.kube.Unreachable` (nothing removed) when the API does not answer.
        """
        findings = self.plan()
        self.last_findings = findings
        for d in findings.doubts:
            logs.claim_logger(d.uid, d.namespace, d.name).warning(
                "kept: the API's answer about the claim proves nothing (%s); asking again later", d.why
            )
        if findings.untrusted:
            doubts = tuple(getattr(self.preparer.store, "doubts", list)())
            log.error(
                "the checkpoint store is not trusted (damaged state, ownership not rebuilt): "
                "the reconciler and the orphan sweep remove nothing until it is: %s",
                "; ".join(doubts) or "?",
            )
            if doubts != self._reported_doubts:  # one Node Event per distinct doubt, not one per pass
                self._reported_doubts = doubts
                self._event(
                    "checkpoint not trusted, nothing is removed until `flexnpu-smi adopt` or `discard`: "
                    + "; ".join(doubts)[:800],
                    reason="FlexNPUCheckpointUntrusted",
                )
            self.passes += 1
            return findings
        self._reported_doubts = ()
        for r in findings.residuals:
            try:
                self.remove_claim(r)
            except Exception as exc:  # one claim's failure must not stop the others' cleanup
                clog = logs.claim_logger(r.uid, r.namespace, r.name)
                self._failed(findings, f"unprepare residual claim {r.uid}", exc, clog)
        if findings.interrupted:
            for uid in self.preparer.settle_interrupted():
                log.warning("rolled back claim %s left half-done by a crash", uid)
        with self.preparer.locked() as cp:
            for orphan in sweep.find(set(cp.claims), self.places, self.daemon):
                self.telemetry.residual_found(orphan.kind)
                try:
                    sweep.remove(orphan, self.daemon, self.places)
                except Exception as exc:  # a read-only CDI dir, a daemon error: the rest still goes
                    self._failed(findings, f"remove orphan {orphan.describe()}", exc, log)
                    continue
                self.telemetry.residual_removed(orphan.kind)
                log.warning("removed orphan %s", orphan.describe())
                self._event(f"removed orphan {orphan.describe()}")
        self.index.refresh(force=True)
        self.passes += 1
        return findings

    def remove_claim(self, r: Residual) -> bool:
        """Unprepare one claim as a residual: log, count, unprepare, post the Node Event.

        What every pass does for each residual, and what ``flexnpu-smi unregister`` does for one
        claim. Returns whether the claim was prepared here. Raises what the unprepare raises.
        """
        clog = logs.claim_logger(r.uid, r.namespace, r.name)
        clog.warning("residual claim: %s; unpreparing it", r.reason)
        self.telemetry.residual_found("claim")
        found = self.preparer.unprepare_uid(r.uid, clog)
        self._unreserved_since.pop(r.uid, None)
        self.telemetry.residual_removed("claim")
        self._event(f"unprepared residual claim {r.namespace}/{r.name} ({r.uid}): {r.reason}")
        return found

    def _failed(
        self, findings: Findings, what: str, exc: BaseException, logger: logging.Logger | logs.ClaimLogger
    ) -> None:
        findings.errors.append(f"{what}: {type(exc).__name__}: {exc}")
        self.live.failed(LOOP_RECONCILER, exc)
        logger.error("could not %s (%s: %s); kept for the next pass", what, type(exc).__name__, exc)

    def _event(self, message: str, *, reason: str = "FlexNPUResidualRemoved") -> None:
        try:
            self.kube.create_event(
                involved={"apiVersion": "v1", "kind": "Node", "name": self.node_name, "namespace": "default"},
                reason=reason,
                message=message,
                event_type="Warning",
                host=self.node_name,
            )
        except FlexNPUError as err:
            log.info("could not post event (%s): %s", err, message)

    # -- the loops ----------------------------------------------------------------------------

    def trigger(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """A pass at start, on watch events about claims prepared here, and periodically with jitter.

        Neither loop can die: any exception of a pass or a watch is logged, counted and retried
        with backoff (:func:`dra_driver.liveness.run_forever`).
        """
        self.live.register(LOOP_RECONCILER, deadline=self.period_seconds * 1.2 + MAX_BACKOFF + 120)
        self.live.register(LOOP_CLAIM_WATCH, deadline=WATCH_TIMEOUT_SECONDS + 90)
        watch_state: dict[str, str] = {"rv": ""}
        watcher = threading.Thread(
            target=liveness.run_forever,
            args=(self.live, LOOP_CLAIM_WATCH, lambda: self._watch_once(watch_state, stop), stop),
            kwargs={"logger": log},
            name="claim-watch",
            daemon=True,
        )
        watcher.start()
        liveness.run_forever(self.live, LOOP_RECONCILER, lambda: self._pass_then_wait(stop), stop, logger=log)
        watcher.join(timeout=5)

    def _pass_then_wait(self, stop: threading.Event) -> None:
        """One pass, then wait for a trigger or the next period (shorter after doubt)."""
        try:
            findings = self.reconcile_once()
            self.last_error = None
            if findings.doubts or findings.untrusted or findings.errors:
                delay = self._backoff
                self._backoff = min(self._backoff * 2, MAX_BACKOFF)
            else:
                self._backoff = 1.0
                delay = self.period_seconds * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not crypto
        except FlexNPUError as err:
            self.last_error = err
            log.warning("reconcile pass stopped, nothing removed (%s); retrying in %.0fs", err, self._backoff)
            delay = self._backoff
            self._backoff = min(self._backoff * 2, MAX_BACKOFF)
        self._wake.wait(delay)
        stop.wait(MIN_PASS_INTERVAL)  # coalesce bursts of events into one pass
        self._wake.clear()

    def event_matters(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Whether a claim watch event can make a claim prepared here residual.

        The node's own status writes and every claim of other nodes do not: the answer comes from
        :class:`ClaimIndex` (a ``stat`` and dict lookups), never from decoding the checkpoint.
        """
        meta = obj.get("metadata") or {}
        namespace, name, uid = (
            str(meta.get("namespace", "")),
            str(meta.get("name", "")),
            str(meta.get("uid", "")),
        )
        self.index.refresh()
        mine = self.index.get(uid)
        if mine is None:  # a claim of another node, or this node's name recreated with a new UID
            return self.index.uid_of(namespace, name) is not None
        if kind == "DELETED":
            return True
        reason = residual_reason(uid, obj, driver_name=self.driver_name, pool_name=self.pool_name)
        return reason is not None or not has_consumer(obj)

    def _watch_once(self, state: dict[str, str], stop: threading.Event) -> float | None:
        """One claim watch, from the last resourceVersion seen (a ``limit=1`` list first)."""
        try:
            if not state["rv"]:
                state["rv"] = self.kube.claims_resource_version()
            for kind, obj in self._events(state, stop):
                if kind != "BOOKMARK" and self.event_matters(kind, obj):
                    self.trigger()
            self._watch_backoff = 1.0
            return None
        except Gone:
            state["rv"] = ""
            self.trigger()  # events may have been missed: look again
            return None
        except FlexNPUError as err:
            delay = self._watch_backoff
            self._watch_backoff = min(delay * 2, MAX_BACKOFF)
            log.debug("claim watch failed (%s); retrying in %.0fs", err, delay)
            return delay

    def _events(
        self, state: dict[str, str], stop: threading.Event
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        for kind, obj in self.kube.watch_claims(
            resource_version=state["rv"], timeout_seconds=WATCH_TIMEOUT_SECONDS, stop=stop
        ):
            state["rv"] = str((obj.get("metadata") or {}).get("resourceVersion") or state["rv"])
            self.live.passed(LOOP_CLAIM_WATCH)  # a live stream is a live loop
            yield kind, obj

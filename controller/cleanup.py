"""Residual reconciler: the node unprepares what no live claim owns, and sweeps orphans.

A prepared claim (a checkpoint entry) is *residual* when the API says one of:

* the claim is gone (deleted while the node process was down, or its pod was force-deleted
  and the claim with it);
* the claim's UID changed (the same name recreated);
* its allocation no longer names this driver on this node's pool;
* it has had no consumer in ``status.reservedFor`` for longer than the grace period (a pod
  force-deleted: the kubelet never calls unprepare).

Entries left in ``PrepareStarted``/``UnprepareStarted`` by a crash are rolled back (the kubelet
prepares again if it still wants the claim). Then the orphan sweep removes what no entry owns.

Never delete on doubt: if the API cannot be read, the pass stops and nothing is removed; it
is retried with backoff. Passes run at start, on claim watch events for claims this node
prepared, and periodically with jitter. :meth:`Reconciler.plan` is the dry run.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from controller.kube import Gone, Kube, NotFound
from dra_driver import logs, sweep
from dra_driver.checkpoint import ClaimEntry, ClaimState
from dra_driver.errors import FlexNPUError
from dra_driver.telemetry import Telemetry

log = logging.getLogger("flexnpu.cleanup")

MIN_PASS_INTERVAL = 0.5
"""Seconds between two passes at least, so a burst of watch events makes one pass."""


def residual_reason(
    entry: ClaimEntry, claim: Mapping[str, Any] | None, *, driver_name: str, pool_name: str
) -> str | None:
    """Why ``entry`` is residual given the API's view of its claim (None: it is not). Pure."""
    if claim is None:
        return "the claim no longer exists"
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != entry.uid:
        return f"the claim was replaced (now UID {uid})"
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


@dataclass(slots=True)
class Findings:
    residuals: list[Residual] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    orphans: list[sweep.Orphan] = field(default_factory=list)


class Reconciler:
    """Compares the checkpoint with the API and the node; removes residuals and orphans."""

    def __init__(
        self,
        *,
        kube: Kube,
        preparer: Any,  # kubeletplugin.prepare.Preparer (kept loose to avoid an import cycle)
        driver_name: str,
        node_name: str,
        pool_name: str,
        places: sweep.SweepPlaces,
        grace_seconds: float = 300.0,
        period_seconds: float = 60.0,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = kube
        self.preparer = preparer
        self.driver_name = driver_name
        self.node_name = node_name
        self.pool_name = pool_name
        self.places = places
        self.grace_seconds = grace_seconds
        self.period_seconds = period_seconds
        self.telemetry = telemetry or Telemetry(node_name=node_name, driver_name=driver_name, enabled=False)
        self.clock = clock
        self._unreserved_since: dict[str, float] = {}
        self._wake = threading.Event()
        self.passes = 0
        self.last_error: FlexNPUError | None = None

    # -- one pass ---------------------------------------------------------------------------

    def plan(self) -> Findings:
        """What a pass would remove (the dry run). Raises if the API cannot be read."""
        findings = Findings()
        self.preparer.store.check_trusted()  # damaged state is never "nothing prepared": remove nothing
        entries = self.preparer.store.read().claims
        now = self.clock()
        for entry in entries.values():
            if entry.state != ClaimState.PREPARE_COMPLETED:
                findings.interrupted.append(entry.uid)
                continue
            try:
                claim: Mapping[str, Any] | None = self.kube.get_claim(entry.namespace, entry.name)
            except NotFound:
                claim = None
            reason = residual_reason(entry, claim, driver_name=self.driver_name, pool_name=self.pool_name)
            if reason is None and claim is not None:
                if has_consumer(claim):
                    self._unreserved_since.pop(entry.uid, None)
                else:
                    since = self._unreserved_since.setdefault(entry.uid, now)
                    if now - since >= self.grace_seconds:
                        reason = f"no consumer in reservedFor for {now - since:.0f}s"
            if reason:
                findings.residuals.append(Residual(entry.uid, entry.namespace, entry.name, reason))
        with self.preparer.locked() as cp:
            findings.orphans = sweep.find(set(cp.claims), self.places, self.preparer.daemon)
        return findings

    def reconcile_once(self) -> Findings:
        """Remove residual claims, roll back interrupted ones, sweep orphans."""
        findings = self.plan()  # raises on API doubt: nothing is removed
        for r in findings.residuals:
            clog = logs.claim_logger(r.uid, r.namespace, r.name)
            clog.warning("residual claim: %s; unpreparing it", r.reason)
            self.telemetry.residual_found("claim")
            self.preparer.unprepare_uid(r.uid, clog)
            self._unreserved_since.pop(r.uid, None)
            self.telemetry.residual_removed("claim")
            self._event(f"unprepared residual claim {r.namespace}/{r.name} ({r.uid}): {r.reason}")
        if findings.interrupted:
            for uid in self.preparer.settle_interrupted():
                log.warning("rolled back claim %s left half-done by a crash", uid)
        with self.preparer.locked() as cp:
            for orphan in sweep.find(set(cp.claims), self.places, self.preparer.daemon):
                self.telemetry.residual_found(orphan.kind)
                sweep.remove(orphan, self.preparer.daemon)
                self.telemetry.residual_removed(orphan.kind)
                log.warning("removed orphan %s", orphan.describe())
                self._event(f"removed orphan {orphan.describe()}")
        self.passes += 1
        return findings

    def _event(self, message: str) -> None:
        try:
            self.kube.create_event(
                involved={"apiVersion": "v1", "kind": "Node", "name": self.node_name, "namespace": "default"},
                reason="FlexNPUResidualRemoved",
                message=message,
                event_type="Warning",
                host=self.node_name,
            )
        except FlexNPUError as err:
            log.info("could not post event (%s): %s", err, message)

    # -- the loop -----------------------------------------------------------------------------

    def trigger(self) -> None:
        self._wake.set()

    def run(self, stop: threading.Event) -> None:
        """A pass at start, on watch events about claims prepared here, and periodically with jitter."""
        watcher = threading.Thread(target=self._watch_loop, args=(stop,), name="claim-watch", daemon=True)
        watcher.start()
        backoff = 1.0
        while not stop.is_set():
            try:
                self.reconcile_once()
                self.last_error = None
                backoff = 1.0
                delay = self.period_seconds * random.uniform(0.8, 1.2)  # noqa: S311 - jitter, not crypto
            except FlexNPUError as err:
                self.last_error = err
                log.warning("reconcile pass stopped, nothing removed (%s); retrying in %.0fs", err, backoff)
                delay = backoff
                backoff = min(backoff * 2, 30.0)
            self._wake.wait(delay)
            stop.wait(MIN_PASS_INTERVAL)  # coalesce bursts of events into one pass
            self._wake.clear()
        watcher.join(timeout=5)

    def _event_matters(self, kind: str, obj: Mapping[str, Any]) -> bool:
        """Only events that can make a claim prepared here residual start a pass.

        The node's own status writes, and every claim of other nodes, do not: a pass per event
        would GET every prepared claim for every status write (quadratic in busy nodes).
        """
        meta = obj.get("metadata") or {}
        entries = self.preparer.store.read().claims
        if kind == "DELETED":
            return any(
                e.namespace == meta.get("namespace") and e.name == meta.get("name") for e in entries.values()
            )
        entry = entries.get(str(meta.get("uid")))
        if entry is None:  # maybe the same name recreated with a new UID
            return any(
                e.namespace == meta.get("namespace") and e.name == meta.get("name") for e in entries.values()
            )
        reason = residual_reason(entry, obj, driver_name=self.driver_name, pool_name=self.pool_name)
        return reason is not None or not has_consumer(obj)

    def _watch_loop(self, stop: threading.Event) -> None:
        backoff = 1.0
        rv = ""
        while not stop.is_set():
            try:
                if not rv:
                    _, rv = self.kube.list_claims()
                for kind, obj in self.kube.watch_claims(resource_version=rv, timeout_seconds=300, stop=stop):
                    meta = obj.get("metadata") or {}
                    rv = str(meta.get("resourceVersion") or rv)
                    if kind == "BOOKMARK":
                        continue
                    if self._event_matters(kind, obj):
                        self.trigger()
                backoff = 1.0
            except Gone:
                rv = ""
            except FlexNPUError as err:
                log.debug("claim watch failed (%s); retrying in %.0fs", err, backoff)
                stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

"""Prepare and unprepare claims: the one place that decides what a kubelet call does to a claim.

The claim as the helper fetched it (``dra_kubeletplugin``: right UID, allocated, a device of this
driver) → under the claim's own lock, its whole plan decided in one call (pure,
``dra_driver/plan.py``'s ``plan_prepare``) under the checkpoint lock, where a new prepare records
``PrepareStarted`` with every planned effect (``dra_driver/render.py``'s ``intent``) in the same
step (so the conflict check and the vNPU IDs hold) → the decided step executed once
(``kubeletplugin/execute.py``: each effect made in order by ``kubeletplugin/effects.py``, daemon
Register, ``client.conf``, CDI spec, all rendered once by ``dra_driver/render.py``;
``PrepareCompleted`` recorded; the claim status written, best effort; or an unfinished entry
undone, and the claim decided again in the same loop). Unprepare (``kubeletplugin/unprepare.py``) records
``UnprepareStarted``, undoes the effects newest first and drops the entry. Each recorded step is
one ``CheckpointStore.update``; daemon retries run under the claim lock only. Effects are
idempotent, so a crash anywhere converges; a prepare that fails part-way, for any reason, rolls
back. One bad claim never fails the batch (``kubeletplugin/batch.py``: claim by claim, with the
call's deadline).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_driver import checkpoint, logs, render
from dra_driver.checkpoint import (
    CheckpointStore,
    ClaimEntry,
    ClaimLockHandle,
    ClaimState,
    EffectKind,
)
from dra_driver.claims import claim_error
from dra_driver.daemon_api.values import RegisterResult
from dra_driver.devices import Inventory
from dra_driver.plan import ClaimPlan, NodeFacts, PreparePlan, Step, plan_prepare
from dra_driver.telemetry import Telemetry
from dra_driver.vnpu import Vnpu
from dra_kubeletplugin.claims import ClaimRef, PrepareResult, ResourceClaim
from kubeletplugin import batch, effects
from kubeletplugin.effects import Daemon, PrepareSettings, StatusWriter
from kubeletplugin.events import NodeEvents
from kubeletplugin.execute import Executor, New
from kubeletplugin.hardsplit import HardVnpus
from kubeletplugin.unprepare import Unpreparer

__all__ = ["CONTAINER_CONF", "CONTAINER_SHM", "Daemon", "PrepareSettings", "Preparer", "StatusWriter"]

CONTAINER_CONF = render.CONTAINER_CONF
CONTAINER_SHM = render.CONTAINER_SHM
DAEMON = EffectKind.DAEMON_REGISTRATION


class Preparer:
    """Prepares fetched claims and unprepares claim references on top of the checkpoint (``kubeletplugin/driver.py`` calls it)."""

    def __init__(
        self,
        *,
        settings: PrepareSettings,
        store: CheckpointStore,
        inventory: Callable[[], Inventory],
        daemon: Daemon | None = None,
        status: StatusWriter | None = None,
        telemetry: Telemetry | None = None,
        hard: HardVnpus | None = None,
        events: NodeEvents | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.inventory = inventory
        self.daemon = daemon
        self.status = status
        self.hard = hard
        self.effects = effects.Effects(settings=settings, daemon=daemon, status=status, hard=hard)
        self.undo = Unpreparer(store, self.effects)
        self.executor = Executor(
            store=store, effects=self.effects, undo=self.undo, inventory=inventory, layout=settings.layout
        )
        self.telemetry = telemetry or Telemetry(
            node_name=settings.pool_name, driver_name=settings.driver_name, enabled=False
        )
        self.events = events or NodeEvents()
        """``claims_changed`` is emitted after each kubelet call (the publisher subscribes)."""

    # -- kubelet calls ---------------------------------------------------------------------

    def prepare(self, claims: Sequence[ResourceClaim]) -> dict[str, PrepareResult]:
        by_uid = {c.uid: c for c in claims}

        def one(ref: ClaimRef, clog: logs.ClaimLogger) -> PrepareResult:
            result = self._prepare_one(by_uid[ref.uid], clog)
            clog.info("prepared %d device(s)", len(result.devices))
            return result

        out = batch.each_claim(
            "prepare",
            [c.ref for c in claims],
            one,
            lambda err: PrepareResult(error=err),
            telemetry=self.telemetry,
        )
        self._call_done()
        return out

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        def one(ref: ClaimRef, clog: logs.ClaimLogger) -> str:
            removed = self.unprepare_uid(ref.uid, clog)
            clog.info("unprepared" if removed else "unprepare: claim not prepared here (nothing to do)")
            return ""

        out = batch.each_claim("unprepare", claims, one, lambda err: err, telemetry=self.telemetry)
        self._call_done()
        return out

    def _call_done(self) -> None:
        """After a kubelet call (each claim run by ``kubeletplugin/batch.py``): the prepared-vNPU
        gauge (vNPUs / whole dies per die, ``flexnpu_dra_prepared_vnpus``), then ``claims_changed``."""
        self.telemetry.set_prepared_vnpus(checkpoint.prepared_per_die(self.store.entries().values()))
        self.events.claims_changed.emit()

    # -- prepare ---------------------------------------------------------------------------

    def _prepare_one(self, claim: ResourceClaim, clog: logs.ClaimLogger) -> PrepareResult:
        uid = claim.ref.uid
        with self.store.claim_locks.hold(uid, timeout=self.effects.lock_budget()) as lock:
            try:
                return self._prepare_locked(claim, lock, clog)
            except Exception:
                if self.store.get(uid) is None:
                    lock.drop = True  # refused or not recorded: no entry, so no lock file either
                raise

    def _prepare_locked(
        self, claim: ResourceClaim, lock: ClaimLockHandle, clog: logs.ClaimLogger
    ) -> PrepareResult:
        """One decision (under the checkpoint lock, recording a new prepare's intent in the same
        step), then one execution of the step it decided (``kubeletplugin/execute.py``). An unfinished
        entry is undone by that execution and the claim decided again: a new prepare, or its refusal."""
        uid = claim.ref.uid
        failed: ClaimPlan | None = None  # the devices a failure's status names: the first decision's
        while True:
            try:
                decided, new = self._decide(claim)
                failed = decided.plan if failed is None else failed
                if decided.refused is not None and decided.step != Step.WITHDRAWN:
                    raise decided.refused
                devices = self.executor.carry_out(decided, new, lock, clog)
                if devices is not None:  # else an unfinished entry was undone: decide again
                    return PrepareResult(devices=devices)
            except Exception as exc:
                if failed is None:
                    raise  # the claim was not decided: the error names no device status to write
                err = claim_error(exc, uid, log=clog)
                self.effects.write_failure(failed, err, clog)
                if err is exc:
                    raise
                raise err from exc

    def _decide(self, claim: ResourceClaim) -> tuple[PreparePlan, New | None]:
        """The claim's whole plan, decided against every checkpoint entry under the checkpoint lock;
        for a new prepare, its token and its intent (every planned effect, ``dra_driver/render.py``),
        recorded in that same step."""
        s, uid, node = self.settings, claim.ref.uid, self._node()
        decided = PreparePlan(Step.NOTHING, ClaimPlan(ref=claim.ref, devices=(), configs=()))
        new: New | None = None

        def decide(entries: Mapping[str, ClaimEntry]) -> ClaimEntry | None:
            nonlocal decided, new
            decided = plan_prepare(claim.obj, ref=claim.ref, node=node, entries=entries, existing=self._vnpus)
            if decided.step != Step.NEW or decided.refused is not None:
                return entries.get(uid)  # unchanged
            token = secrets.token_hex(32)
            new = (token, render.intent(decided.plan, decided.dies, layout=s.layout, token=token))
            return new[1]

        try:
            self.store.update(uid, decide)  # a new prepare's intent is on disk before any effect
        except Exception as not_recorded:
            if not decided.plan.devices:
                raise  # the claim could not be read as this node's: no device status to write
            return replace(decided, refused=not_recorded), None
        return decided, new

    def _node(self) -> NodeFacts:
        s = self.settings
        return NodeFacts(
            s.driver_name,
            s.pool_name,
            self.inventory(),
            s.host_memory,
            lambda: effects.client_library(s.layout),
        )

    def _vnpus(self) -> list[Vnpu]:
        """The vNPUs on the node (a new prepare's IDs avoid them)."""
        return list(self.hard.manager.list()) if self.hard is not None else []

    # -- claim status ------------------------------------------------------------------------

    def heal(
        self, uid: str, clog: logs.ClaimLogger, *, get_claim: Callable[[str, str], Mapping[str, Any]]
    ) -> RegisterResult | None:
        """Register a prepared share claim again from its checkpoint record (its aclserver is gone
        for good): same token, quota and endpoints. None when the claim is busy, no longer
        prepared, or its ``client.conf`` is gone (a reboot emptied the run dir: the kubelet's repeat
        prepare restores what its pods still need). If its old TCP port was taken meanwhile, the
        claim is prepared again as the kubelet would, from the claim ``get_claim(namespace, name)``
        returns (``client.conf``, CDI spec and record follow the new port; a running container keeps
        the unix socket, which never moves)."""
        try:
            with self.store.claim_locks.hold(uid, timeout=0):
                entry = self.store.get(uid)
                if entry is None or entry.state != ClaimState.PREPARE_COMPLETED or entry.registration is None:
                    return None
                if not all(
                    (Path(e.ref) / "client.conf").is_file() for e in entry.effect(EffectKind.CLIENT_CONF)
                ):
                    return None
                rec = entry.registration
                result = self.effects.register_recorded(entry, clog)
                if rec.endpoints == result.endpoints:
                    if rec.pid != result.pid:
                        self.store.update(
                            uid, lambda _: entry.with_details(DAEMON, replace(rec, pid=result.pid))
                        )
                    return result
                clog.warning(
                    "the aclserver's TCP port moved to %d; writing the claim's files again",
                    result.endpoints.tcp_port,
                )
                decided = plan_prepare(
                    get_claim(entry.namespace, entry.name),
                    ref=ClaimRef(entry.namespace, uid, entry.name),
                    node=self._node(),
                    entries=self.store.entries(),
                    existing=self._vnpus,
                )
                if decided.refused is not None:
                    raise decided.refused
                self.executor.repeat(entry, decided.plan, clog)
                return result
        except checkpoint.ClaimBusy:
            return None  # a prepare or unprepare of it is in flight: the next look decides

    def set_ready(self, uid: str, ready: bool, reason: str, message: str) -> bool:
        """Write the recorded device status with a new Ready condition; whether it was written."""
        entry = self.store.get(uid)
        if entry is None or entry.state != ClaimState.PREPARE_COMPLETED:
            return False
        return self.effects.set_ready(entry, ready=ready, reason=reason, message=message)

    # -- for the reconciler and operator tools ------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[checkpoint.Checkpoint]:
        """The checkpoint, with every recorded step (in any process) held off."""
        with self.store.locked() as cp:
            yield cp

    # -- unprepare (kubeletplugin/unprepare.py) -------------------------------------------------

    def unprepare_uid(self, uid: str, clog: logs.ClaimLogger) -> bool:
        """Unprepare one claim (a kubelet call, a residual claim); whether it was prepared here."""
        return self.undo.unprepare_uid(uid, clog)

    def settle_interrupted(self) -> list[str]:
        """Roll back entries a crash left half-done; their UIDs (``Unpreparer.settle_interrupted``)."""
        return self.undo.settle_interrupted()

"""Prepare and unprepare claims: the only place that sequences side effects.

Order, always: GET the claim → plan and resolve shares (pure, ``dra_driver/plan.py``) → under
the claim's own lock: record the intent (``PrepareStarted`` with every planned effect, after
the conflict check, in one checkpoint step) → make each effect in order (register shares with
the daemon, which starts the aclserver; write ``client.conf``; write the CDI spec — what they
write is rendered once by ``dra_driver/render.py``) → record ``PrepareCompleted`` with the
device status → write the claim's device status (best effort). Unprepare records
``UnprepareStarted``, undoes the recorded effects in reverse order and drops the entry.

Each recorded step is one :meth:`CheckpointStore.update` under the timed checkpoint lock; the
daemon's network retries run outside it, under the claim lock only. A crash anywhere leaves a
checkpoint entry from which the next prepare or unprepare of the claim (or the reconciler)
converges, because each effect is idempotent (``kubeletplugin/effects.py``). A prepare that
fails part-way, for any reason, rolls back what it made, so nothing half-prepared remains.

Each claim gets its own result; one bad claim never fails the batch.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar

from dra_driver import checkpoint, failpoints, logs, paths, render
from dra_driver.checkpoint import CheckpointStore, ClaimEntry, ClaimLockHandle, ClaimState, Effect, EffectKind
from dra_driver.claims import ClaimRef, ClaimResult, PreparedDevice, claim_error
from dra_driver.devices import Inventory
from dra_driver.errors import FlexNPUError
from dra_driver.plan import ClaimPlan, check_conflicts, plan_claim, resolve_shares
from dra_driver.telemetry import Telemetry
from kubeletplugin.effects import (
    PREPARE_POINT,
    Daemon,
    Effects,
    Job,
    PrepareSettings,
    StatusWriter,
    client_library,
    now,
)

__all__ = ["CONTAINER_CONF", "CONTAINER_SHM", "Daemon", "PrepareSettings", "Preparer", "StatusWriter"]

log = logging.getLogger("flexnpu.prepare")

ClaimGetter = Callable[[str, str], Mapping[str, Any]]

CONTAINER_CONF = render.CONTAINER_CONF
CONTAINER_SHM = render.CONTAINER_SHM
DAEMON = EffectKind.DAEMON_REGISTRATION
T = TypeVar("T")


class Preparer:
    """Implements :class:`dra_driver.claims.ClaimPreparer` on top of the checkpoint."""

    def __init__(
        self,
        *,
        settings: PrepareSettings,
        store: CheckpointStore,
        get_claim: ClaimGetter,
        inventory: Callable[[], Inventory],
        daemon: Daemon | None = None,
        status: StatusWriter | None = None,
        telemetry: Telemetry | None = None,
        claim_lock_timeout: float | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.get_claim = get_claim
        self.inventory = inventory
        self.daemon = daemon
        self.status = status
        self.effects = Effects(settings=settings, daemon=daemon, status=status)
        self.telemetry = telemetry or Telemetry(
            node_name=settings.pool_name, driver_name=settings.driver_name, enabled=False
        )
        # long enough for another call of the same claim to finish its daemon retries
        self.claim_lock_timeout = claim_lock_timeout or settings.daemon_retry_seconds + 15.0

    # -- kubelet calls ---------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        def one(ref: ClaimRef, clog: logs.ClaimLogger) -> ClaimResult:
            result = self._prepare_one(ref, clog)
            clog.info("prepared %d device(s)", len(result.devices))
            return result

        return self._each("prepare", claims, one, lambda err: ClaimResult(error=err))

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        def one(ref: ClaimRef, clog: logs.ClaimLogger) -> str:
            paths.check_uid(ref.uid)
            removed = self.unprepare_uid(ref.uid, clog)
            clog.info("unprepared" if removed else "unprepare: claim not prepared here (nothing to do)")
            return ""

        return self._each("unprepare", claims, one, lambda err: err)

    def _each(
        self,
        verb: Literal["prepare", "unprepare"],
        claims: Sequence[ClaimRef],
        one: Callable[[ClaimRef, logs.ClaimLogger], T],
        failed: Callable[[str], T],
    ) -> dict[str, T]:
        """Run ``one`` per claim: each claim gets its own result, one bad claim never fails the batch."""
        out: dict[str, T] = {}
        for ref in claims:
            clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
            with self.telemetry.operation(
                verb, claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
            ) as rec:
                try:
                    out[ref.uid] = one(ref, clog)
                except Exception as exc:  # a bug must not fail the other claims of the batch
                    err = claim_error(exc, ref.uid, log=clog)
                    clog.warning("%s failed: %s", verb, err)
                    rec.fail(err.code)
                    out[ref.uid] = failed(str(err))
        self._report_prepared()
        return out

    def _report_prepared(self) -> None:
        """Prepared vNPUs / whole dies per die, for the ``flexnpu_dra_prepared_vnpus`` gauge."""
        self.telemetry.set_prepared_vnpus(checkpoint.prepared_per_die(self.store.entries().values()))

    # -- prepare ---------------------------------------------------------------------------

    def _prepare_one(self, ref: ClaimRef, clog: logs.ClaimLogger) -> ClaimResult:
        paths.check_ref(ref.uid, ref.namespace, ref.name)
        claim = self.get_claim(ref.namespace, ref.name)
        s = self.settings
        base = plan_claim(
            claim, ref=ref, driver_name=s.driver_name, pool_name=s.pool_name, inventory=self.inventory()
        )
        if not base.devices:
            return ClaimResult(devices=())  # only other drivers' results: nothing to do here
        try:
            plan = resolve_shares(base)  # validates quotas and opaque config before any effect
            if plan.shares:  # and that the chosen interposition is possible on this node
                render.interposition_plan(plan, s.layout, client_library(s.layout))
            with self.store.claim_locks.hold(ref.uid, timeout=self.claim_lock_timeout) as lock:
                entry = self.store.get(ref.uid)
                if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                    return ClaimResult(devices=self._repeat(entry, plan, clog))
                if entry is not None:
                    clog.info("finishing an interrupted %s before preparing again", entry.state)
                    self._undo_all(entry, clog)
                    self.store.update(ref.uid, lambda _: None)
                return ClaimResult(devices=self._prepare_new(plan, lock, clog))
        except Exception as exc:
            err = claim_error(exc, ref.uid, log=clog)
            docs = render.failure_status(
                base, driver_name=s.driver_name, reason=str(err.code), message=str(err), now=now()
            )
            self.effects.write_status(ref, docs, clog)
            if err is exc:
                raise
            raise err from exc

    def _prepare_new(
        self, plan: ClaimPlan, lock: ClaimLockHandle, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...]:
        uid = plan.ref.uid
        job = Job(plan=plan, token=secrets.token_hex(32), layout=self.settings.layout)
        intent = ClaimEntry(
            uid=uid,
            namespace=plan.ref.namespace,
            name=plan.ref.name,
            state=ClaimState.PREPARE_STARTED,
            dies=checkpoint.die_records(plan),
            effects=self.effects.planned(job),
        )

        def record_intent(entries: Mapping[str, ClaimEntry]) -> ClaimEntry:
            check_conflicts(plan, checkpoint.held_dies(entries, but=uid))
            return intent

        self.store.update(uid, record_intent)  # the intent is on disk before any effect
        failpoints.hit("prepare-after-intent")
        try:
            for eff in intent.effects:
                self.effects.do(eff, job, clog)
                failpoints.hit(PREPARE_POINT[eff.kind])
            r = job.rendered
            done = replace(intent, state=ClaimState.PREPARE_COMPLETED, devices=r.devices).with_effect(
                Effect(EffectKind.CLAIM_STATUS, uid, checkpoint.StatusRecord(r.status))
            )
            if (reg := job.registration) is not None:
                rec = checkpoint.Registration(job.token, plan.shares, reg.endpoints, reg.pid)
                done = done.with_details(DAEMON, rec)
            self.store.update(uid, lambda _: done)
        except Exception:
            clog.warning("prepare failed part-way; rolling back")
            self._rollback(intent, job, lock, clog)
            raise
        failpoints.hit("prepare-after-complete")
        self.effects.write_status(plan.ref, r.status, clog)
        return r.devices

    def _rollback(self, intent: ClaimEntry, job: Job, lock: ClaimLockHandle, clog: logs.ClaimLogger) -> None:
        entry = intent
        try:
            if job.plan.shares and job.registration is None:
                # The daemon never confirmed the registration. Ask once to undo it; if the daemon
                # is unreachable, the orphan sweep removes whatever it may have started, since no
                # checkpoint entry owns it.
                self.effects.forget_registration(intent.uid, clog)
                entry = replace(intent, effects=tuple(e for e in intent.effects if e.kind != DAEMON))
            self._undo_all(entry, clog)
            self.store.update(intent.uid, lambda _: None)
            lock.drop = True
        except FlexNPUError as undo_err:  # keep the entry: the reconciler finishes the job
            clog.error("rollback incomplete, left for the reconciler: %s", undo_err)

    def _repeat(
        self, entry: ClaimEntry, plan: ClaimPlan, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...]:
        """Repeat prepare of a completed claim: put back what is missing, refresh the status."""
        rec = entry.registration
        job = Job(plan=plan, token=rec.token if rec else "", layout=self.settings.layout)
        self.effects.ensure(entry, job, clog)
        docs = job.rendered.status
        new = entry.with_effect(Effect(EffectKind.CLAIM_STATUS, entry.uid)).with_details(
            EffectKind.CLAIM_STATUS, checkpoint.StatusRecord(docs)
        )
        if rec is not None and job.registration is not None and rec.endpoints != job.registration.endpoints:
            new = new.with_details(
                DAEMON, replace(rec, endpoints=job.registration.endpoints, pid=job.registration.pid)
            )
        self.store.update(entry.uid, lambda _: new)
        self.effects.write_status(plan.ref, docs, clog)
        return entry.devices

    # -- claim status ------------------------------------------------------------------------

    def set_ready(self, uid: str, ready: bool, reason: str, message: str) -> bool:
        """Rewrite the claim's device status with a new Ready condition (aclserver down or back);
        whether a status was written. Uses the device status recorded at prepare."""
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

    def settle_interrupted(self) -> list[str]:
        """Roll back entries a crash left in PrepareStarted/UnprepareStarted; their UIDs.

        An entry whose claim lock is held belongs to a call in flight (in this or another
        process) and is left alone. An effect that cannot be undone now (daemon down) keeps the
        entry for the next pass.
        """
        done: list[str] = []
        for uid, entry in self.store.entries().items():
            if entry.state == ClaimState.PREPARE_COMPLETED or self.store.claim_locks.busy(uid):
                continue
            clog = logs.claim_logger(uid, entry.namespace, entry.name)
            try:
                with self.store.claim_locks.hold(uid, timeout=0) as lock:
                    current = self.store.get(uid)
                    if current is None or current.state == ClaimState.PREPARE_COMPLETED:
                        continue
                    self._undo_all(current, clog)
                    self.store.update(uid, lambda _: None)
                    lock.drop = True
                    done.append(uid)
            except checkpoint.ClaimBusy:
                continue
            except FlexNPUError as err:
                clog.warning("cannot roll back yet: %s", err)
        return done

    # -- unprepare -------------------------------------------------------------------------

    def unprepare_uid(self, uid: str, clog: logs.ClaimLogger) -> bool:
        with self.store.claim_locks.hold(uid, timeout=self.claim_lock_timeout) as lock:
            entry = self.store.update(uid, checkpoint.set_state(uid, ClaimState.UNPREPARE_STARTED))
            if entry is None:
                lock.drop = True
                return False
            failpoints.hit("unprepare-after-intent")
            self._undo_all(entry, clog)
            self.store.update(uid, lambda _: None)
            lock.drop = True
            return True

    def _undo_all(self, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        """Undo every recorded effect, newest first. Raises (keeping the entry) if one cannot be undone."""
        for eff in reversed(entry.effects):
            self.effects.undo(entry, eff, clog)
            failpoints.hit(f"unprepare-after-{eff.kind}")

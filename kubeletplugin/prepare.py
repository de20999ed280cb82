"""Prepare and unprepare claims: the only place that sequences side effects (dra-example-driver's ``state.go``).

The claim as the helper fetched it (``dra_kubeletplugin``: right UID, allocated, a device of this
driver) → plan and resolve shares (pure, ``dra_driver/plan.py``) → under the claim's own
lock: record ``PrepareStarted`` with every planned effect (conflict check in the same step) →
make each effect in order (``kubeletplugin/effects.py``: daemon Register, ``client.conf``, CDI
spec, all rendered once by ``dra_driver/render.py``) → record ``PrepareCompleted`` → write the
claim status (best effort). Unprepare records ``UnprepareStarted``, undoes the effects newest
first and drops the entry. Each recorded step is one ``CheckpointStore.update``; daemon retries
run under the claim lock only. Effects are idempotent, so a crash anywhere converges; a prepare
that fails part-way, for any reason, rolls back. One bad claim never fails the batch.
"""

from __future__ import annotations

import contextlib
import contextvars
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from dra_driver import checkpoint, failpoints, logs, paths, render
from dra_driver.checkpoint import CheckpointStore, ClaimEntry, ClaimLockHandle, ClaimState, Effect, EffectKind
from dra_driver.claims import claim_error
from dra_driver.daemon_api.values import RegisterResult
from dra_driver.devices import Inventory
from dra_driver.errors import FlexNPUError, Unavailable
from dra_driver.plan import (
    ClaimPlan,
    assign_vnpus,
    check_conflicts,
    check_device_policies,
    missing_vnpus,
    plan_claim,
    recorded_vnpus,
    resolve_shares,
)
from dra_driver.telemetry import Telemetry
from dra_kubeletplugin.claims import CALL_DEADLINE, ClaimRef, PreparedDevice, PrepareResult, ResourceClaim
from kubeletplugin import effects
from kubeletplugin.effects import Daemon, PrepareSettings, StatusWriter
from kubeletplugin.events import NodeEvents
from kubeletplugin.hardsplit import HardVnpus

__all__ = ["CONTAINER_CONF", "CONTAINER_SHM", "Daemon", "PrepareSettings", "Preparer", "StatusWriter"]

CONTAINER_CONF = render.CONTAINER_CONF
CONTAINER_SHM = render.CONTAINER_SHM
DAEMON = EffectKind.DAEMON_REGISTRATION
T = TypeVar("T")
UNPREPARE_WORKERS = 8


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

        return self._each("prepare", [c.ref for c in claims], one, lambda err: PrepareResult(error=err))

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        def one(ref: ClaimRef, clog: logs.ClaimLogger) -> str:
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
        """``one`` per claim, each its own result (one bad claim never fails the batch). Unprepares
        run side by side (own claim locks); prepares in order, so conflicts resolve in the kubelet's."""

        deadline = CALL_DEADLINE.get()

        def run(ref: ClaimRef) -> T:
            clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
            with self.telemetry.operation(
                verb, claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
            ) as rec:
                try:
                    paths.check_ref(
                        ref.uid, ref.namespace, ref.name
                    ) if verb == "prepare" else paths.check_uid(ref.uid)
                    if deadline is not None and time.monotonic() >= deadline:
                        raise Unavailable(f"not started: the kubelet's deadline for this {verb} call passed")
                    return one(ref, clog)
                except Exception as exc:  # a bug must not fail the other claims of the batch
                    err = claim_error(exc, ref.uid, log=clog)
                    clog.warning("%s failed: %s", verb, err)
                    rec.fail(err.code)
                    return failed(str(err))

        if verb == "unprepare" and len(claims) > 1:
            with ThreadPoolExecutor(
                min(UNPREPARE_WORKERS, len(claims)), thread_name_prefix="unprepare"
            ) as pool:
                # each worker runs in a copy of this call's context: the deadline travels with it
                runs = [pool.submit(contextvars.copy_context().run, run, ref) for ref in claims]
                out = {ref.uid: r.result() for ref, r in zip(claims, runs, strict=True)}
        else:
            out = {ref.uid: run(ref) for ref in claims}
        self._report_prepared()
        self.events.claims_changed.emit()
        return out

    def _report_prepared(self) -> None:
        """Prepared vNPUs / whole dies per die, for the ``flexnpu_dra_prepared_vnpus`` gauge."""
        self.telemetry.set_prepared_vnpus(checkpoint.prepared_per_die(self.store.entries().values()))

    # -- prepare ---------------------------------------------------------------------------

    def _prepare_one(self, claim: ResourceClaim, clog: logs.ClaimLogger) -> PrepareResult:
        ref = claim.ref
        s = self.settings
        base = plan_claim(
            claim.obj, ref=ref, driver_name=s.driver_name, pool_name=s.pool_name, inventory=self.inventory()
        )
        if not base.devices:
            return PrepareResult(devices=())  # only other drivers' results: nothing to do here
        try:
            plan = resolve_shares(base)  # validates quotas and opaque config before any effect
            if plan.shares:  # and that the chosen interposition is possible on this node
                render.interposition_plan(plan, s.layout, effects.client_library(s.layout))
            with self.store.claim_locks.hold(ref.uid, timeout=self.effects.lock_budget()) as lock:
                entry = self.store.get(ref.uid)
                if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                    missing = missing_vnpus(
                        plan, entry.vnpu_records
                    )  # an earlier adopt's entry: not as the die
                    if not missing:
                        return PrepareResult(devices=self._repeat(entry, plan, clog))
                    clog.warning("the entry records no vNPU for %s; preparing the claim again", missing)
                if entry is not None:
                    clog.info("undoing the recorded %s before preparing again", entry.state)
                    self._undo_all(entry, clog)
                    self.store.update(ref.uid, lambda _: None)
                return PrepareResult(devices=self._prepare_new(plan, lock, clog))
        except Exception as exc:
            err = claim_error(exc, ref.uid, log=clog)
            docs = render.failure_status(
                base, driver_name=s.driver_name, reason=str(err.code), message=str(err), now=effects.now()
            )
            self.effects.write_status(ref, docs, clog)
            if err is exc:
                raise
            raise err from exc

    def _prepare_new(
        self, plan: ClaimPlan, lock: ClaimLockHandle, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...]:
        uid = plan.ref.uid
        job = self.effects.job(plan, secrets.token_hex(32))
        existing = self.hard.manager.list() if self.hard is not None and plan.hard_results() else ()

        def intent_of(job: effects.Job) -> ClaimEntry:
            return ClaimEntry(
                uid=uid,
                namespace=plan.ref.namespace,
                name=plan.ref.name,
                state=ClaimState.PREPARE_STARTED,
                dies=checkpoint.die_records(job.plan),
                effects=self.effects.planned(job),
            )

        intent = intent_of(job)

        def record_intent(entries: Mapping[str, ClaimEntry]) -> ClaimEntry:
            nonlocal intent
            check_device_policies(plan)  # a new prepare's config agrees with its share device
            check_conflicts(plan, checkpoint.held_dies(entries, but=uid))
            if plan.hard_results():  # vNPU IDs are chosen under the lock, against every recorded one
                recorded = [r for other in entries.values() for r in other.vnpu_records]
                job.plan = assign_vnpus(
                    plan, recorded=recorded, existing=existing, inventory=self.inventory()
                )
                intent = intent_of(job)
            return intent

        try:
            self.store.update(uid, record_intent)  # the intent is on disk before any effect
        except Exception:
            lock.drop = True  # refused or not recorded: no entry, so no lock file either
            raise
        failpoints.hit("prepare-after-intent")
        try:
            for eff in intent.effects:
                self.effects.do(eff, job, clog)
                failpoints.hit(effects.PREPARE_POINT[eff.kind])
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

    def _rollback(
        self, intent: ClaimEntry, job: effects.Job, lock: ClaimLockHandle, clog: logs.ClaimLogger
    ) -> None:
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
        plan = recorded_vnpus(plan, entry.vnpu_records, inventory=self.inventory())
        job = self.effects.job(plan, rec.token if rec else "")
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
                ref = ClaimRef(entry.namespace, uid, entry.name)
                base = plan_claim(
                    get_claim(entry.namespace, entry.name),
                    ref=ref,
                    driver_name=self.settings.driver_name,
                    pool_name=self.settings.pool_name,
                    inventory=self.inventory(),
                )
                self._repeat(entry, resolve_shares(base), clog)
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

    def settle_interrupted(self) -> list[str]:
        """Roll back entries a crash left half-done; their UIDs. A held claim lock means a call in
        flight (any process): left alone. An effect that cannot be undone now keeps the entry."""
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
        with self.store.claim_locks.hold(uid, timeout=self.effects.lock_budget()) as lock:
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

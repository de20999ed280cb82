"""Executing the prepare step a decision chose: the one place that makes a prepare's side effects.

``kubeletplugin/prepare.py`` decides the step under the claim's lock (``dra_driver/plan.py``'s
``plan_prepare``; a new prepare's intent, planned by ``dra_driver/render.py``, recorded in the same
checkpoint step); this module executes it, once: nothing, an answer from a withdrawn die's record,
a repeat prepare of the recorded entry (put back what is missing, refresh the record) or a new
prepare's effects in order (``kubeletplugin/effects.py``) and its completion recorded, then, for
either, the claim's status written, here only; or, for an unfinished entry (redo), its effects
undone and the entry dropped (``kubeletplugin/unprepare.py``), so that the claim is decided again.
A new prepare that fails part-way rolls back (``kubeletplugin/unprepare.py``) and writes no status
(the preparer writes the failure's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from dra_driver import checkpoint, failpoints, logs
from dra_driver.checkpoint import CheckpointStore, ClaimEntry, ClaimLockHandle, ClaimState, Effect, EffectKind
from dra_driver.devices import Inventory
from dra_driver.errors import StateError
from dra_driver.plan import ClaimPlan, PreparePlan, Step
from dra_driver.render import JSON, NodeLayout
from dra_kubeletplugin.claims import PreparedDevice
from kubeletplugin import effects
from kubeletplugin.unprepare import Unpreparer

__all__ = ["Executor", "New"]

DAEMON = EffectKind.DAEMON_REGISTRATION

New = tuple[str, ClaimEntry]
"""A new prepare as decided: the claim's token and its recorded intent (``PrepareStarted``)."""

Prepared = tuple[tuple[PreparedDevice, ...], tuple[JSON, ...]]
"""What a prepare made: the claim's devices and the device status to write to it."""


class Executor:
    """Executes decided prepare steps on top of the checkpoint ``store`` with the node's ``effects``."""

    def __init__(
        self,
        *,
        store: CheckpointStore,
        effects: effects.Effects,
        undo: Unpreparer,
        inventory: Callable[[], Inventory],
        layout: NodeLayout,
    ) -> None:
        self.store = store
        self.effects = effects
        self.undo = undo
        self.inventory = inventory
        self.layout = layout

    def carry_out(
        self, decided: PreparePlan, new: New | None, lock: ClaimLockHandle, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...] | None:
        """What the decided step does: nothing, an answer from a withdrawn die's record, a repeat
        prepare of the recorded entry or a new prepare's effects (``new``: its token and intent),
        either then writing the claim's status; or, for an unfinished entry, undoing it (None: the
        claim is to be decided again)."""
        uid = decided.plan.ref.uid
        if decided.step == Step.NOTHING:
            return ()
        if decided.step == Step.WITHDRAWN:
            return self._repeat_on_withdrawn(decided, uid, clog)
        entry = self.store.get(uid)
        if decided.step == Step.REPEAT and entry is not None:
            devices, status = self._repeat(entry, decided.plan, clog)
        elif new is not None:  # Step.NEW: its intent is recorded
            devices, status = self._prepare_new(decided.plan, new, lock, clog)
        elif decided.step == Step.REDO and entry is not None:
            if decided.missing:
                clog.warning(
                    "the entry records no vNPU for %s; preparing the claim again", list(decided.missing)
                )
            clog.info("undoing the recorded %s before preparing again", entry.state)
            self.undo.take_back(entry, clog)  # no entry now: a new prepare, or its refusal
            return None
        else:  # REPEAT or REDO of an entry gone under the claim lock: never
            raise StateError(
                f"the checkpoint entry changed under the claim lock ({decided.step})", claim_uid=uid
            )
        self.effects.write_status(decided.plan.ref, status, clog)
        return devices

    def repeat(
        self, entry: ClaimEntry, plan: ClaimPlan, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...]:
        """Repeat prepare of a completed claim outside a kubelet call (its aclserver's port moved):
        put back what is missing, refresh the status."""
        devices, status = self._repeat(entry, plan, clog)
        self.effects.write_status(plan.ref, status, clog)
        return devices

    def _prepare_new(
        self, plan: ClaimPlan, new: New, lock: ClaimLockHandle, clog: logs.ClaimLogger
    ) -> Prepared:
        """Make every effect of the recorded intent in order, then record the completion."""
        token, intent = new
        job, uid = self._job(plan, token), plan.ref.uid
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
            self.undo.rollback(intent, job, lock, clog)
            raise
        failpoints.hit("prepare-after-complete")
        return r.devices, r.status

    def _repeat(self, entry: ClaimEntry, plan: ClaimPlan, clog: logs.ClaimLogger) -> Prepared:
        """Put back what a restart or a reboot lost and record the refreshed status and endpoints."""
        rec = entry.registration
        job = self._job(plan, rec.token if rec else "")
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
        return entry.devices, docs

    def _job(self, plan: ClaimPlan, token: str) -> effects.Job:
        """A prepare of ``plan`` on this node (its layout and client library)."""
        return effects.Job(plan=plan, token=token, layout=self.layout)

    def _repeat_on_withdrawn(
        self, decided: PreparePlan, uid: str, clog: logs.ClaimLogger
    ) -> tuple[PreparedDevice, ...]:
        """The kubelet's repeat prepare of a completed claim one of whose dies this node no longer
        publishes (a changed inventory withdrew it while the claim holds it; the plan found its entry
        records exactly the claim's allocated devices): answered from the checkpoint, nothing removed,
        so that its pod can restart, if every file it made is still there; else the plan's refusal
        (DeviceNotFound) stands."""
        entry = self.store.get(uid)
        if entry is None or not all(
            p.is_file()
            for p in [Path(e.ref) for e in entry.effect(EffectKind.CDI_SPEC)]
            + [Path(e.ref) / "client.conf" for e in entry.effect(EffectKind.CLIENT_CONF)]
        ):
            raise decided.refused or StateError("the claim's prepared files are gone", claim_uid=uid)
        known = {d.phy_id for d in self.inventory().dies}
        gone = sorted({d.phy for d in entry.dies} - known)
        clog.warning(
            "die(s) %s no longer published on this node; the claim holds them still: its repeat prepare"
            " answers from its checkpoint (nothing removed)",
            gone,
        )
        return entry.devices

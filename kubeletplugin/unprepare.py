"""Taking a claim's effects back, newest first: the kubelet's unprepare, a residual claim, a prepare
that failed part-way, and what a crash left half-done.

Each undo is recorded as a prepare is (``UnprepareStarted``, then the entry dropped, each one
``CheckpointStore.update``) under the claim's own lock; an effect that cannot be undone now keeps
the entry, so the reconciler (``controller/cleanup.py``) finishes the job. The preparer
(``kubeletplugin/prepare.py``) owns one :class:`Unpreparer`; the execution of a decided step
(``kubeletplugin/execute.py``) hands it an unfinished entry to undo before the claim is decided
again, and a new prepare's rollback.
"""

from __future__ import annotations

from dataclasses import replace

from dra_driver import checkpoint, failpoints, logs
from dra_driver.checkpoint import CheckpointStore, ClaimEntry, ClaimLockHandle, ClaimState, EffectKind
from dra_driver.errors import FlexNPUError
from kubeletplugin.effects import Effects, Job

__all__ = ["Unpreparer"]

DAEMON = EffectKind.DAEMON_REGISTRATION


class Unpreparer:
    """Undoes recorded effects on top of the checkpoint ``store`` with the node's ``effects``."""

    def __init__(self, store: CheckpointStore, effects: Effects) -> None:
        self.store = store
        self.effects = effects

    def rollback(self, intent: ClaimEntry, job: Job, lock: ClaimLockHandle, clog: logs.ClaimLogger) -> None:
        """Undo a prepare that failed part-way (its recorded ``intent``); the entry stays if an
        effect cannot be undone now."""
        entry = intent
        try:
            if job.plan.shares and job.registration is None:
                # The daemon never confirmed the registration. Ask once to undo it; if the daemon
                # is unreachable, the orphan sweep removes whatever it may have started, since no
                # checkpoint entry owns it.
                self.effects.forget_registration(intent.uid, clog)
                entry = replace(intent, effects=tuple(e for e in intent.effects if e.kind != DAEMON))
            self.take_back(entry, clog)
            lock.drop = True
        except FlexNPUError as undo_err:  # keep the entry: the reconciler finishes the job
            clog.error("rollback incomplete, left for the reconciler: %s", undo_err)

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
                    self.take_back(current, clog)
                    lock.drop = True
                    done.append(uid)
            except checkpoint.ClaimBusy:
                continue
            except FlexNPUError as err:
                clog.warning("cannot roll back yet: %s", err)
        return done

    def unprepare_uid(self, uid: str, clog: logs.ClaimLogger) -> bool:
        """Unprepare claim ``uid``; whether it was prepared here."""
        with self.store.claim_locks.hold(uid, timeout=self.effects.lock_budget()) as lock:
            entry = self.store.update(uid, checkpoint.set_state(uid, ClaimState.UNPREPARE_STARTED))
            if entry is None:
                lock.drop = True
                return False
            failpoints.hit("unprepare-after-intent")
            self.take_back(entry, clog)
            lock.drop = True
            return True

    def take_back(self, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        """Undo every recorded effect, newest first, then drop the claim's entry. Raises (keeping the
        entry) if one cannot be undone."""
        for eff in reversed(entry.effects):
            self.effects.undo(entry, eff, clog)
            failpoints.hit(f"unprepare-after-{eff.kind}")
        self.store.update(entry.uid, lambda _: None)

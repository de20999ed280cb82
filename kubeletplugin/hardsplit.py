"""The hard-vNPU effect of a prepare: make, repeat and undo one vNPU (touches the world).

``kubeletplugin/effects.py`` calls these for its ``hard-vnpu`` effect kind, after
``kubeletplugin/prepare.py`` recorded the effect (the :class:`~dra_driver.vnpu.planning.HardVnpu`
as a dict) in the checkpoint; every recorded vNPU is read back by
:func:`dra_driver.vnpu.planning.parse_record`. Order inside :meth:`HardVnpus.do`: the driver's ledger
(``dra_driver/vnpu/ownership.py``) first, then the prerequisite check, then the create; so every
vNPU that may exist is owned on disk before it can exist. :meth:`HardVnpus.undo` destroys it
(absent is fine; in use by a container is an error that keeps the entry) and then forgets it in
the ledger. :meth:`HardVnpus.ensure` makes it again after a reboot that dropped it.

An ID that turned out to be taken by a vNPU made outside the driver (``VnpuIdInUse``) is never
destroyed by the undo: the ledger only names vNPUs this driver made, and undo skips a vNPU whose
template differs from the recorded one.

:func:`adopted_vnpus` gives ``flexnpu-smi adopt`` (``kubeletplugin/adopt.py``) the vNPUs a claim
whose record was lost holds, from the ledger and the live vNPU list. Choosing vNPU IDs and reading
them back from a record is planning: ``dra_driver/plan.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import logs
from dra_driver.devices import Die, Inventory
from dra_driver.errors import ErrorCode, FlexNPUError, StateError
from dra_driver.plan import ClaimPlan
from dra_driver.vnpu import Vnpu, VnpuManager, check_template, ownership, planning

__all__ = ["HardVnpus", "adopted_vnpus"]


def adopted_vnpus(
    plan: ClaimPlan, manager: VnpuManager, state_dir: Path, *, inventory: Inventory
) -> ClaimPlan:
    """The plan with the vNPUs the evidence (ledger, live vNPUs) says the claim holds; StateError
    naming the template device the evidence does not explain."""
    if not plan.hard_results():
        return plan
    vnpus = planning.from_evidence(
        plan.hard_results(),
        ledger=ownership.load(state_dir),
        live=manager.list(),
        inventory=inventory,
        claim_uid=plan.ref.uid,
    )
    return plan.with_vnpus(vnpus)


@dataclass(frozen=True)
class HardVnpus:
    """Makes and removes the vNPUs recorded in the checkpoint (details of a hard-vnpu effect)."""

    manager: VnpuManager
    inventory: Callable[[], Inventory]
    state_dir: Path

    def do(self, rec: Mapping[str, Any], claim_uid: str, clog: logs.ClaimLogger) -> Vnpu:
        die, template_name, vnpu_id = self._target(rec, claim_uid)
        template = check_template(die, template_name, self.inventory())
        self.manager.check_prerequisites(die)
        if ownership.load(self.state_dir) is None:
            raise ownership.unreadable(claim_uid, "no vNPU is made until it can")
        ownership.add(self.state_dir, vnpu_id, claim_uid)
        try:
            made = self.manager.create(die, template, vnpu_id)
        except FlexNPUError as err:
            if err.code == ErrorCode.VNPU_ID_IN_USE:
                ownership.remove(self.state_dir, vnpu_id)  # someone else's vNPU: not ours to destroy
            err.for_claim(claim_uid)
            raise
        clog.info("made vNPU %d (%s) on die %d", vnpu_id, template.name, die.phy_id)
        return made

    def ensure(self, rec: Mapping[str, Any], claim_uid: str, clog: logs.ClaimLogger) -> None:
        """Repeat prepare: make the vNPU again if it is gone (a reboot without vNPU recovery)."""
        _, template_name, vnpu_id = self._target(rec, claim_uid)
        present = next((v for v in self.manager.list() if v.vnpu_id == vnpu_id), None)
        if present is None:
            clog.info("vNPU %d is gone (reboot?); making it again", vnpu_id)
            self.do(rec, claim_uid, clog)
        elif present.template != template_name:
            raise StateError(
                f"vNPU {vnpu_id} exists as {present.template}, but this claim recorded {template_name}",
                code=ErrorCode.VNPU_ID_IN_USE,
                claim_uid=claim_uid,
                field="vnpuID",
            )

    def undo(self, rec: Mapping[str, Any], claim_uid: str, clog: logs.ClaimLogger) -> None:
        die, template_name, vnpu_id = self._target(rec, claim_uid)
        book = ownership.load(self.state_dir)
        if book is None:
            raise ownership.unreadable(claim_uid, "the vNPU is kept until it can")
        present = next((v for v in self.manager.list() if v.vnpu_id == vnpu_id), None)
        ours = book.get(vnpu_id) == claim_uid
        if present is not None and ours and present.template == template_name:
            if present.in_use:
                raise StateError(
                    f"vNPU {vnpu_id} is still used by a container; not destroyed yet",
                    code=ErrorCode.DEVICE_BUSY,
                    claim_uid=claim_uid,
                    field="vnpuID",
                )
            self.manager.destroy(die, vnpu_id)
            clog.info("destroyed vNPU %d (%s) on die %d", vnpu_id, template_name, die.phy_id)
        elif present is not None:
            clog.warning("vNPU %d is not the one this claim made; left alone", vnpu_id)
        if ours:
            ownership.remove(self.state_dir, vnpu_id)

    def _target(self, rec: Mapping[str, Any], claim_uid: str) -> tuple[Die, str, int]:
        r = planning.parse_record(rec, inventory=self.inventory(), claim_uid=claim_uid)
        return r.die, r.template, r.vnpu_id

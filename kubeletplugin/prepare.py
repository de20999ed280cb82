"""Prepare and unprepare claims: the only place that sequences side effects.

Order, always: GET the claim (outside the lock) → plan (pure) → under the checkpoint lock:
record the intent (``PrepareStarted`` with every planned effect) → make the effects →
record ``PrepareCompleted`` with the devices returned to the kubelet. Unprepare records
``UnprepareStarted``, undoes the recorded effects in reverse order and drops the entry.
A crash anywhere leaves a checkpoint entry from which the next prepare or unprepare of the
claim converges, because each effect is idempotent.

Each claim gets its own result; one bad claim never fails the batch.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_driver import cdi, logs, paths
from dra_driver.checkpoint import CheckpointStore, ClaimEntry, ClaimState, Effect
from dra_driver.claims import ClaimRef, ClaimResult, PreparedDevice
from dra_driver.devices import DieMode, Inventory
from dra_driver.discovery import node_files
from dra_driver.errors import ErrorCode, FlexNPUError, StateError
from dra_driver.plan import ClaimPlan, plan_claim

log = logging.getLogger("flexnpu.prepare")

ClaimGetter = Callable[[str, str], Mapping[str, Any]]


@dataclass(frozen=True, slots=True)
class PrepareSettings:
    driver_name: str
    pool_name: str
    cdi_dir: Path
    cdi_kind: cdi.Kind
    device_root: Path


class Preparer:
    """Implements :class:`dra_driver.claims.ClaimPreparer` on top of the checkpoint."""

    def __init__(
        self,
        *,
        settings: PrepareSettings,
        store: CheckpointStore,
        get_claim: ClaimGetter,
        inventory: Callable[[], Inventory],
    ) -> None:
        self.settings = settings
        self.store = store
        self.get_claim = get_claim
        self.inventory = inventory
        self._lock = threading.Lock()

    # -- kubelet calls ---------------------------------------------------------------------

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]:
        results: dict[str, ClaimResult] = {}
        for ref in claims:
            clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
            try:
                results[ref.uid] = self._prepare_one(ref, clog)
                clog.info("prepared %d device(s)", len(results[ref.uid].devices))
            except FlexNPUError as err:
                err.for_claim(ref.uid)
                clog.warning("prepare failed: %s", err)
                results[ref.uid] = ClaimResult(error=str(err))
            except Exception as exc:  # a bug must not fail the other claims of the batch
                clog.exception("prepare failed with an internal error")
                results[ref.uid] = ClaimResult(error=f"claim {ref.uid}: internal error: {exc!r}")
        return results

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        out: dict[str, str] = {}
        for ref in claims:
            clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
            try:
                paths.check_uid(ref.uid)
                removed = self.unprepare_uid(ref.uid, clog)
                clog.info("unprepared" if removed else "unprepare: claim not prepared here (nothing to do)")
                out[ref.uid] = ""
            except FlexNPUError as err:
                err.for_claim(ref.uid)
                clog.warning("unprepare failed: %s", err)
                out[ref.uid] = str(err)
            except Exception as exc:
                clog.exception("unprepare failed with an internal error")
                out[ref.uid] = f"claim {ref.uid}: internal error: {exc!r}"
        return out

    # -- prepare ---------------------------------------------------------------------------

    def _prepare_one(self, ref: ClaimRef, clog: logs.ClaimLogger) -> ClaimResult:
        paths.check_uid(ref.uid)
        paths.check_namespace(ref.namespace, claim_uid=ref.uid)
        paths.check_name(ref.name, claim_uid=ref.uid)
        claim = self.get_claim(ref.namespace, ref.name)  # outside the lock, like the Go helper
        plan = plan_claim(
            claim,
            ref=ref,
            driver_name=self.settings.driver_name,
            pool_name=self.settings.pool_name,
            inventory=self.inventory(),
        )
        if not plan.devices:
            return ClaimResult(devices=())  # only other drivers' results: nothing to do here
        with self._lock, self.store.transaction() as cp:
            entry = cp.claims.get(ref.uid)
            if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
                self._ensure_effects(plan, entry, clog)
                return ClaimResult(devices=tuple(_device_from_json(d) for d in entry.devices))
            if entry is not None and entry.state == ClaimState.UNPREPARE_STARTED:
                clog.info("finishing an interrupted unprepare before preparing again")
                self._undo_effects(entry, clog)
                entry = None
            self._check_conflicts(plan, cp.claims.values())
            spec_file = cdi.spec_path(self.settings.cdi_dir, self.settings.cdi_kind, ref.uid)
            entry = ClaimEntry(
                uid=ref.uid,
                namespace=ref.namespace,
                name=ref.name,
                state=ClaimState.PREPARE_STARTED,
                dies=[
                    {"phy": d.die.phy_id, "mode": str(d.mode), "device": d.device, "shareID": d.share_id}
                    for d in plan.devices
                ],
                effects=[Effect("cdi-spec", str(spec_file))],
            )
            self.store.put(cp, entry)  # the intent is on disk before any effect
            devices = self._make_effects(plan, spec_file)
            entry.devices = [_device_to_json(d) for d in devices]
            entry.state = ClaimState.PREPARE_COMPLETED
            self.store.put(cp, entry)
            return ClaimResult(devices=tuple(devices))

    def _check_conflicts(self, plan: ClaimPlan, entries: Any) -> None:
        """The node is the last line of defence against one die in two unrelated claims."""
        for d in plan.devices:
            for other in entries:
                if other.uid == plan.ref.uid:
                    continue
                for od in other.dies:
                    if od.get("phy") != d.die.phy_id:
                        continue
                    if d.mode == DieMode.WHOLE or od.get("mode") == str(DieMode.WHOLE):
                        raise StateError(
                            f"die {d.die.phy_id} ({d.device}) is already prepared "
                            f"{'exclusively' if od.get('mode') == 'whole' else 'as shares'} for claim "
                            f"{other.namespace}/{other.name} ({other.uid})",
                            code=ErrorCode.DEVICE_BUSY,
                            claim_uid=plan.ref.uid,
                            field="status.allocation.devices.results",
                        )

    def build_spec(self, plan: ClaimPlan) -> tuple[cdi.Spec, list[PreparedDevice]]:
        """The claim's CDI spec and kubelet devices (deterministic from the plan)."""
        s = self.settings
        cdi_devices: list[cdi.CDIDevice] = []
        prepared: list[PreparedDevice] = []
        for d in plan.devices:
            name = cdi.device_name(plan.ref.uid, d.device if not d.share_id else f"{d.device}-{d.share_id}")
            cdi_devices.append(
                cdi.CDIDevice(
                    name=name, edits=cdi.whole_die_edits([d.die.device_node], device_root=s.device_root)
                )
            )
            prepared.append(
                PreparedDevice(
                    request_names=(d.request_name,),
                    pool=d.pool,
                    device=d.device,
                    cdi_device_ids=(cdi.qualified_id(s.cdi_kind, name),),
                    share_id=d.share_id,
                )
            )
        shared = cdi.shared_edits(
            node_files.SHARED_DEVICE_NODES,
            [p for p in node_files.DRIVER_MOUNTS if Path(cdi.host_path(s.device_root, p)).exists()],
            device_root=s.device_root,
            env={
                "FLEXNPU_CLAIM_UID": plan.ref.uid,
                "FLEXNPU_PHYSICAL_IDS": ",".join(str(d.die.phy_id) for d in plan.devices),
            },
        )
        return cdi.Spec(kind=s.cdi_kind, devices=tuple(cdi_devices), edits=shared), prepared

    def _make_effects(self, plan: ClaimPlan, spec_file: Path) -> list[PreparedDevice]:
        spec, prepared = self.build_spec(plan)
        written = cdi.write_spec(self.settings.cdi_dir, spec, plan.ref.uid)
        assert written == spec_file
        return prepared

    def _ensure_effects(self, plan: ClaimPlan, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        """Repeat prepare (kubelet restart, node reboot): put back what a tmpfs lost."""
        for eff in entry.effect("cdi-spec"):
            if not Path(eff.ref).exists():
                clog.info("CDI spec %s is missing (reboot?); writing it again", eff.ref)
                self._make_effects(plan, Path(eff.ref))

    # -- unprepare -------------------------------------------------------------------------

    def unprepare_uid(self, uid: str, clog: logs.ClaimLogger) -> bool:
        with self._lock, self.store.transaction() as cp:
            entry = cp.claims.get(uid)
            if entry is None:
                return False
            entry.state = ClaimState.UNPREPARE_STARTED
            self.store.put(cp, entry)
            self._undo_effects(entry, clog)
            del cp.claims[uid]
            self.store.save(cp)
            return True

    def _undo_effects(self, entry: ClaimEntry, clog: logs.ClaimLogger) -> None:
        for eff in reversed(entry.effects):
            if eff.kind == "cdi-spec":
                if cdi.remove_spec(Path(eff.ref)):
                    clog.debug("removed CDI spec %s", eff.ref)
            else:
                raise StateError(
                    f"unknown effect kind {eff.kind!r} in the checkpoint",
                    code=ErrorCode.CHECKPOINT_CORRUPT,
                    claim_uid=entry.uid,
                    field="effects",
                )


def _device_to_json(d: PreparedDevice) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "requestNames": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiDeviceIDs": list(d.cdi_device_ids),
    }
    if d.share_id is not None:
        doc["shareID"] = d.share_id
    return doc


def _device_from_json(doc: Mapping[str, Any]) -> PreparedDevice:
    return PreparedDevice(
        request_names=tuple(doc.get("requestNames") or ()),
        pool=str(doc["pool"]),
        device=str(doc["device"]),
        cdi_device_ids=tuple(doc.get("cdiDeviceIDs") or ()),
        share_id=doc.get("shareID"),
    )

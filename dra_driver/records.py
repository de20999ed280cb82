"""The node's typed records of what it prepared: claim entries, their effects, dies and registrations.

Frozen dataclasses with their JSON codecs; a change is a new record (``dataclasses.replace``),
written by :meth:`dra_driver.checkpoint.CheckpointStore.update` as one :data:`Mutation`. Pure:
no I/O. The on-disk formats and the store are in ``dra_driver/checkpoint/``.

A new effect kind (for example a hard-split vNPU) is one :class:`EffectKind` member, an
optional details type registered in ``_DETAILS`` below, and its do/undo in
``kubeletplugin/effects.py``.

Planning's conflict stage is here too (``dra_driver/plan.py`` calls it for a new prepare):
:func:`check_conflicts` holds a claim's plan against the dies other entries hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Protocol

from dra_driver.daemon_api.values import Endpoints
from dra_driver.devices import AllocatedDevice, DieMode
from dra_driver.errors import ErrorCode, StateError, quote
from dra_kubeletplugin.claims import ClaimRef, PreparedDevice
from flexnpu_wire.shares import Share

JSON = dict[str, Any]


class ClaimState(StrEnum):
    PREPARE_STARTED = "PrepareStarted"
    PREPARE_COMPLETED = "PrepareCompleted"
    UNPREPARE_STARTED = "UnprepareStarted"


class EffectKind(StrEnum):
    """Side effects of a prepare, in the order they are made (undone in reverse)."""

    HARD_VNPU = "hard-vnpu"  # ref: the vNPU ID; details: HardVnpuRecord (dra_driver/vnpu)
    DAEMON_REGISTRATION = "daemon-registration"  # ref: claim UID; details: Registration
    CLIENT_CONF = "client-conf"  # ref: the claim's client.conf directory
    CDI_SPEC = "cdi-spec"  # ref: the spec file
    CLAIM_STATUS = "claim-status"  # ref: claim UID; details: StatusRecord


@dataclass(frozen=True, slots=True)
class Registration:
    """What the daemon was asked for (token, shares) and, once it answered, where the aclserver is."""

    token: str
    shares: tuple[Share, ...]
    endpoints: Endpoints | None = None
    pid: int | None = None

    def to_json(self) -> JSON:
        doc: JSON = {"token": self.token, "shares": [s.to_dict() for s in self.shares]}
        if self.endpoints is not None:
            doc["endpoints"] = self.endpoints.to_dict()
        if self.pid is not None:
            doc["pid"] = self.pid
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Registration:
        ep = doc.get("endpoints")
        pid = doc.get("pid")
        return cls(
            token=str(doc["token"]),
            shares=tuple(Share.from_dict(s) for s in doc.get("shares") or ()),
            endpoints=Endpoints.from_dict(ep) if isinstance(ep, Mapping) else None,
            pid=int(pid) if pid is not None else None,
        )


@dataclass(frozen=True, slots=True)
class StatusRecord:
    """The device status documents last written to the claim (Kubernetes JSON, kept as written)."""

    devices: tuple[JSON, ...] = ()

    def to_json(self) -> JSON:
        return {"devices": list(self.devices)} if self.devices else {}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> StatusRecord:
        devices = doc.get("devices") or ()
        if not isinstance(devices, list) or not all(isinstance(d, dict) for d in devices):
            raise TypeError("claim-status devices must be a list of objects")
        return cls(devices=tuple(devices))


@dataclass(frozen=True, slots=True)
class HardVnpuRecord:
    """A hard-split vNPU the claim gets (``HardVnpu.to_dict`` of ``dra_driver/vnpu/planning.py``)."""

    vnpu: Mapping[str, Any]

    def to_json(self) -> JSON:
        return dict(self.vnpu)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> HardVnpuRecord:
        for key in ("vnpuID", "phy", "template"):
            if key not in doc:
                raise TypeError(f"hard-vnpu details need {key!r}")
        return cls(vnpu=dict(doc))


EffectDetails = Registration | StatusRecord | HardVnpuRecord
_DETAILS: dict[EffectKind, Callable[[Mapping[str, Any]], EffectDetails]] = {
    EffectKind.HARD_VNPU: HardVnpuRecord.from_json,
    EffectKind.DAEMON_REGISTRATION: Registration.from_json,
    EffectKind.CLAIM_STATUS: StatusRecord.from_json,
}


@dataclass(frozen=True, slots=True)
class Effect:
    """One side effect made (or about to be made) for a claim; ``ref`` identifies it."""

    kind: EffectKind
    ref: str
    details: EffectDetails | None = None

    def to_json(self) -> JSON:
        return {
            "kind": str(self.kind),
            "ref": self.ref,
            "details": self.details.to_json() if self.details else {},
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Effect:
        kind = EffectKind(doc["kind"])
        raw = doc.get("details") or {}
        if not isinstance(raw, Mapping):
            raise TypeError(f"details of effect {kind} must be an object")
        decode = _DETAILS.get(kind)
        return cls(kind=kind, ref=str(doc["ref"]), details=decode(raw) if decode else None)


@dataclass(frozen=True, slots=True)
class DieRecord:
    """Which die a claim holds and how (the conflict check reads these)."""

    phy: int
    mode: DieMode
    device: str
    share_id: str | None = None
    policy: str | None = None  # soft shares only

    def to_json(self) -> JSON:
        doc: JSON = {"phy": self.phy, "mode": str(self.mode), "device": self.device, "shareID": self.share_id}
        if self.policy is not None:
            doc["policy"] = self.policy
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> DieRecord:
        policy = doc.get("policy")
        share_id = doc.get("shareID")
        return cls(
            phy=int(doc["phy"]),
            mode=DieMode(doc["mode"]),
            device=str(doc.get("device") or ""),
            share_id=str(share_id) if share_id else None,
            policy=str(policy) if policy is not None else None,
        )


def device_to_json(d: PreparedDevice) -> JSON:
    doc: JSON = {
        "requestNames": list(d.request_names),
        "pool": d.pool,
        "device": d.device,
        "cdiDeviceIDs": list(d.cdi_device_ids),
    }
    if d.share_id is not None:
        doc["shareID"] = d.share_id
    return doc


def device_from_json(doc: Mapping[str, Any]) -> PreparedDevice:
    share_id = doc.get("shareID")
    return PreparedDevice(
        request_names=tuple(str(r) for r in doc.get("requestNames") or ()),
        pool=str(doc["pool"]),
        device=str(doc["device"]),
        cdi_device_ids=tuple(str(i) for i in doc.get("cdiDeviceIDs") or ()),
        share_id=str(share_id) if share_id is not None else None,
    )


@dataclass(frozen=True, slots=True)
class ClaimEntry:
    uid: str
    namespace: str
    name: str
    state: ClaimState
    devices: tuple[PreparedDevice, ...] = ()  # prepared devices (kubelet view)
    effects: tuple[Effect, ...] = ()
    dies: tuple[DieRecord, ...] = ()
    updated_at: float = 0.0

    def to_json(self) -> JSON:
        return {
            "uid": self.uid,
            "namespace": self.namespace,
            "name": self.name,
            "state": str(self.state),
            "devices": [device_to_json(d) for d in self.devices],
            "effects": [e.to_json() for e in self.effects],
            "dies": [d.to_json() for d in self.dies],
            "updatedAt": self.updated_at,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ClaimEntry:
        return cls(
            uid=str(doc["uid"]),
            namespace=str(doc["namespace"]),
            name=str(doc["name"]),
            state=ClaimState(doc["state"]),
            devices=tuple(device_from_json(d) for d in doc.get("devices") or ()),
            effects=tuple(Effect.from_json(e) for e in doc.get("effects") or ()),
            dies=tuple(DieRecord.from_json(d) for d in doc.get("dies") or ()),
            updated_at=float(doc.get("updatedAt") or 0.0),
        )

    def effect(self, kind: str) -> list[Effect]:
        return [e for e in self.effects if e.kind == kind]

    @property
    def registration(self) -> Registration | None:
        """The details of the daemon-registration effect, if the claim has shares."""
        for e in self.effects:
            if e.kind == EffectKind.DAEMON_REGISTRATION and isinstance(e.details, Registration):
                return e.details
        return None

    @property
    def status_docs(self) -> tuple[JSON, ...]:
        for e in self.effects:
            if e.kind == EffectKind.CLAIM_STATUS and isinstance(e.details, StatusRecord):
                return e.details.devices
        return ()

    @property
    def vnpu_records(self) -> tuple[Mapping[str, Any], ...]:
        """The hard-split vNPUs the claim recorded (``HardVnpu.to_dict``), in effect order."""
        return tuple(dict(e.details.vnpu) for e in self.effects if isinstance(e.details, HardVnpuRecord))

    def with_details(self, kind: EffectKind, details: EffectDetails) -> ClaimEntry:
        """A copy with the details of every effect of ``kind`` replaced."""
        return replace(
            self, effects=tuple(replace(e, details=details) if e.kind == kind else e for e in self.effects)
        )

    def with_effect(self, effect: Effect) -> ClaimEntry:
        """A copy with ``effect`` appended (unless one of the same kind and ref is recorded)."""
        if any(e.kind == effect.kind and e.ref == effect.ref for e in self.effects):
            return self
        return replace(self, effects=(*self.effects, effect))


@dataclass(frozen=True, slots=True)
class HeldDie:
    """A die another claim holds on this node (from its checkpoint entry), for the conflict check."""

    phy: int
    mode: DieMode
    policy: str | None
    namespace: str
    name: str
    uid: str


def held_dies(entries: Mapping[str, ClaimEntry], *, but: str) -> list[HeldDie]:
    """Every die the entries other than ``but`` hold, for :func:`check_conflicts`."""
    return [
        HeldDie(phy=d.phy, mode=d.mode, policy=d.policy, namespace=e.namespace, name=e.name, uid=e.uid)
        for e in entries.values()
        if e.uid != but
        for d in e.dies
    ]


class PlannedDies(Protocol):
    """What the conflict check reads of a claim's plan (``dra_driver.plan.ClaimPlan``)."""

    @property
    def ref(self) -> ClaimRef: ...
    @property
    def devices(self) -> Sequence[AllocatedDevice]: ...
    @property
    def shares(self) -> tuple[Share, ...]: ...


def check_conflicts(plan: PlannedDies, held: Iterable[HeldDie]) -> None:
    """Refuse a plan that collides with what other claims hold: one die is whole XOR shared,
    one policy per die (also within the claim)."""
    uid = plan.ref.uid
    shares = plan.shares
    policies = {s.die_phy_id: s.policy for s in shares}
    held = list(held)
    for d in plan.devices:
        for other in held:
            if other.phy != d.die.phy_id:
                continue
            if DieMode.WHOLE in (d.mode, other.mode) or {d.mode, other.mode} == {DieMode.SOFT, DieMode.HARD}:
                raise StateError(
                    f"die {d.die.phy_id} ({d.device}) is already prepared "
                    f"{'exclusively' if other.mode == DieMode.WHOLE else 'as shares'} for claim "
                    f"{other.namespace}/{other.name} ({other.uid})",
                    code=ErrorCode.DEVICE_BUSY,
                    claim_uid=uid,
                    field="status.allocation.devices.results",
                )
            mine, theirs = policies.get(d.die.phy_id), other.policy
            if mine and theirs and mine != theirs:
                raise StateError(
                    f"die {d.die.phy_id} runs shares with policy {quote(theirs)} (claim "
                    f"{other.namespace}/{other.name}); this claim asks for {quote(mine)}",
                    code=ErrorCode.POLICY_CONFLICT,
                    claim_uid=uid,
                    field="config.opaque.parameters.policy",
                )
    whole = {d.die.phy_id for d in plan.devices if d.mode == DieMode.WHOLE}
    for d in plan.devices:
        if d.mode != DieMode.WHOLE and d.die.phy_id in whole:
            raise StateError(
                f"this claim asks for die {d.die.phy_id} whole and for a share of it ({d.device}); "
                "a die is either exclusive or shared",
                code=ErrorCode.DEVICE_BUSY,
                claim_uid=uid,
                field="status.allocation.devices.results",
            )
    for a in shares:
        for b in shares:
            if a.die_phy_id == b.die_phy_id and a.policy != b.policy:
                raise StateError(
                    f"two shares of die {a.die_phy_id} in this claim ask for policies {quote(a.policy)} and {quote(b.policy)}",
                    code=ErrorCode.POLICY_CONFLICT,
                    claim_uid=uid,
                    field="config.opaque.parameters.policy",
                )


Mutation = Callable[[Mapping[str, ClaimEntry]], ClaimEntry | None]
"""Given every entry (read under the lock), the claim's new entry, or None to drop it."""


def prepared_per_die(entries: Iterable[ClaimEntry]) -> dict[tuple[int, str], int]:
    """(die, mode) -> how many prepared vNPUs / whole dies, over completed entries."""
    counts: dict[tuple[int, str], int] = {}
    for entry in entries:
        if entry.state == ClaimState.PREPARE_COMPLETED:
            for d in entry.dies:
                counts[(d.phy, str(d.mode))] = counts.get((d.phy, str(d.mode)), 0) + 1
    return counts


def share_policies(entries: Iterable[ClaimEntry]) -> dict[int, str]:
    """Die -> the policy its prepared shares run (any recorded entry holds the die's policy)."""
    out: dict[int, str] = {}
    for entry in sorted(entries, key=lambda e: e.uid):
        for d in entry.dies:
            if d.mode == DieMode.SOFT and d.policy:
                out.setdefault(d.phy, d.policy)
    return out


def set_state(uid: str, state: ClaimState) -> Mutation:
    """A mutation that moves claim ``uid`` to ``state`` (and leaves a missing entry missing)."""

    def mutate(entries: Mapping[str, ClaimEntry]) -> ClaimEntry | None:
        cur = entries.get(uid)
        return replace(cur, state=state) if cur is not None else None

    return mutate

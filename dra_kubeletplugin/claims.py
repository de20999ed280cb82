"""What crosses the kubelet boundary, typed: claim references, fetched claims, results, health, and the driver's interface.

The kubelet names claims by namespace, UID and name (:class:`ClaimRef`). For a prepare the
helper fetches each claim from the API and checks it (right UID, allocated, a device of this
driver), then hands the driver :class:`ResourceClaim` objects; the driver answers one
:class:`PrepareResult` per claim UID. For an unprepare the driver gets the references only (the
claim may already be deleted). This module is pure data plus the :class:`DRAPlugin` and
:class:`HealthSource` protocols a driver implements; it imports no grpc and no protobuf.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "CALL_DEADLINE",
    "CLAIM_UID_RE",
    "DNS_LABEL_RE",
    "DNS_SUBDOMAIN_RE",
    "ClaimErrorHook",
    "ClaimRef",
    "DRAPlugin",
    "DeviceHealthReport",
    "HealthSource",
    "PrepareResult",
    "PreparedDevice",
    "ResourceClaim",
    "strip_subrequest",
]

CLAIM_UID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,62}$")
"""The one claim-UID rule: letters, digits and '-', at most 63, starting with a letter or digit.

The API server gives every object, a ResourceClaim too, a UID when it creates it: a random RFC 4122
UUID, 36 characters of lowercase hex digits and dashes (apimachinery's ``uuid.NewUUID``); the kubelet
passes it on unchanged. The rule admits every such UID (and the 32-hex-digit UIDs the kubelet
derives for static pods), nothing with '.', '/', '_' or a space, so a UID is always one safe path
component and one DNS label. The node checks it once, where the kubelet's reference comes in
(``claimbatch.claim_problem``); the layers inside (the preparer, the CDI and ``client.conf`` paths)
take the reference as checked. The host runtime's daemon applies the same rule on its own wire
(``dra_driver/paths.py``'s ``UID_RE``)."""
DNS_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
"""A namespace (RFC 1123 label)."""
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
"""A claim name (RFC 1123 subdomain, at most 253 characters)."""

CALL_DEADLINE: ContextVar[float | None] = ContextVar("dra_kubeletplugin_call_deadline", default=None)
"""``time.monotonic()`` by which the kubelet's current call must be answered (None: no deadline).

Set by the helper around each driver call; a driver starts no claim and no retry that would
outlive it.
"""


def strip_subrequest(name: str) -> str:
    """``"req/sub"`` -> ``"req"``: the kubelet matches top-level request names."""
    return name.split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends for one claim: namespace, UID and name (all required)."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ResourceClaim as the API returned it (wire JSON in ``obj``), checked by the helper.

    ``obj["metadata"]["uid"]`` is the UID the kubelet asked for, ``status.allocation`` is set and
    holds at least one device result of this driver. Use :meth:`results` and :meth:`config` for
    this driver's part: the allocation lists every driver's devices.
    """

    ref: ClaimRef
    obj: Mapping[str, Any]

    @property
    def uid(self) -> str:
        return self.ref.uid

    @property
    def namespace(self) -> str:
        return self.ref.namespace

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def allocation(self) -> Mapping[str, Any]:
        return (self.obj.get("status") or {}).get("allocation") or {}

    def results(self, driver_name: str) -> list[Mapping[str, Any]]:
        """``status.allocation.devices.results`` of ``driver_name``, in order."""
        devices = self.allocation.get("devices") or {}
        return [
            r
            for r in devices.get("results") or []
            if isinstance(r, Mapping) and r.get("driver") == driver_name
        ]

    def config(self, driver_name: str) -> list[Mapping[str, Any]]:
        """``status.allocation.devices.config`` entries whose opaque config is for ``driver_name``."""
        devices = self.allocation.get("devices") or {}
        return [
            c
            for c in devices.get("config") or []
            if isinstance(c, Mapping) and (c.get("opaque") or {}).get("driver") == driver_name
        ]


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One prepared device of a claim, as returned to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class PrepareResult:
    """The outcome for one claim: devices, or a non-empty error (never both)."""

    devices: tuple[PreparedDevice, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True)
class DeviceHealthReport:
    """Health of one published device, for the kubelet's DRA health stream."""

    pool: str
    device: str
    healthy: bool | None  # None = unknown
    message: str = ""


class DRAPlugin(Protocol):
    """What a driver implements; the helper calls it (the Go helper's ``DRAPlugin`` interface).

    Both methods return one entry per claim UID they were given and never raise for one bad claim
    (a raised exception fails the kubelet's whole call with a gRPC status). Calls are serialised by
    the helper unless it was started with ``serialize=False``.
    """

    def prepare_resource_claims(self, claims: Sequence[ResourceClaim]) -> Mapping[str, PrepareResult]: ...

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        """Claim UID -> error text ("" on success). Claims never prepared here succeed."""
        ...


class ClaimErrorHook(Protocol):
    """Optional on a :class:`DRAPlugin`: ``claim_error(verb, ref, exc) -> str``.

    Called for each claim the helper does not hand to the driver (a malformed reference, a claim
    the API proved gone, one not allocated to this driver, API trouble, the kubelet's deadline);
    ``exc`` is a :class:`~dra_kubeletplugin.errors.ClaimRejected` or the API error. The driver
    returns the error text the kubelet gets for that claim (and may count or log it). Without the
    hook the text is ``str(exc)``.
    """

    def claim_error(self, verb: str, ref: ClaimRef, exc: Exception) -> str: ...


class HealthSource(Protocol):
    """Current health of every published device (the full set each time)."""

    def device_health(self) -> list[DeviceHealthReport]: ...

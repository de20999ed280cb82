"""Types that cross the kubelet boundary: claim references and per-claim results.

``kubeletplugin/`` converts generated protobuf messages to and from these, so the domain
core never sees protobuf types.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dra_driver.errors import ErrorCode, FlexNPUError, StateError

QUOTE_MAX = 200
"""At most this many characters of any input (or of an unknown exception's text) in an error."""


@dataclass(frozen=True, slots=True)
class ClaimRef:
    """What the kubelet sends for one claim: namespace, UID and name (all required)."""

    namespace: str
    uid: str
    name: str


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    """One prepared device of a claim, as returned to the kubelet."""

    request_names: tuple[str, ...]
    pool: str
    device: str
    cdi_device_ids: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimResult:
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


class ClaimPreparer(Protocol):
    """What the kubelet face calls. One result per claim UID, always; never raises for one bad claim."""

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, ClaimResult]: ...

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str]:
        """Return claim UID -> error text ("" on success). Unknown claims succeed."""
        ...


class HealthSource(Protocol):
    """Current health of every published device (the full set each time)."""

    def device_health(self) -> list[DeviceHealthReport]: ...


def claim_error(
    exc: Exception, claim_uid: str, *, log: logging.LoggerAdapter[logging.Logger]
) -> FlexNPUError:
    """The per-claim error for ``exc``: a driver error as is, with the claim named; anything else
    is a bug, logged with its traceback and reported as ``Internal`` naming the claim."""
    if isinstance(exc, FlexNPUError):
        return exc.for_claim(claim_uid)
    log.error("internal error", exc_info=exc)
    text = f"{type(exc).__name__}: {exc}"
    return StateError(f"internal error: {text[:QUOTE_MAX]}", code=ErrorCode.INTERNAL, claim_uid=claim_uid)

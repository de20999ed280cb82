"""The driver the kubelet-plugin helper calls (dra-example-driver's ``driver.go``): thin, every claim its own result.

:class:`NpuDriver` implements ``dra_kubeletplugin.DRAPlugin`` on top of the :class:`~kubeletplugin.prepare.Preparer`
(``state.go``: the sequencing of effects) and the helper's ``claim_error`` hook: a claim the helper
did not hand over (a malformed reference, a claim the API proved gone or replaced, one not
allocated to this driver, API trouble, the kubelet's deadline) gets the driver's error text with
its stable code, is logged with the claim's UID and counted like any failed prepare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from dra_driver import logs
from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from dra_driver.telemetry import Telemetry
from dra_kubeletplugin.claims import ClaimRef, PrepareResult, ResourceClaim
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected
from kubeletplugin.prepare import Preparer

__all__ = ["NpuDriver", "driver_error"]

_BY_REASON: dict[ClaimReason, tuple[type[FlexNPUError], ErrorCode]] = {
    ClaimReason.MALFORMED: (
        InvalidInput,
        ErrorCode.INVALID_PATH,
    ),  # a UID, namespace or name no path may hold
    ClaimReason.NOT_FOUND: (InvalidInput, ErrorCode.CLAIM_NOT_FOUND),
    ClaimReason.REPLACED: (StateError, ErrorCode.CLAIM_REPLACED),
    ClaimReason.NOT_ALLOCATED: (StateError, ErrorCode.CLAIM_NOT_ALLOCATED),
    ClaimReason.NOT_THIS_DRIVER: (StateError, ErrorCode.CLAIM_NOT_ALLOCATED),
    ClaimReason.UNAVAILABLE: (Unavailable, ErrorCode.API_UNAVAILABLE),
    ClaimReason.DEADLINE: (Unavailable, ErrorCode.API_UNAVAILABLE),
}


def driver_error(exc: Exception, ref: ClaimRef) -> FlexNPUError:
    """The driver error (with its stable code, naming the claim) for what the helper hit on one claim. Pure."""
    if isinstance(exc, FlexNPUError):  # the API client's errors are the driver's (controller/kube.py)
        return exc.for_claim(ref.uid)
    if isinstance(exc, ClaimRejected):
        cls, code = _BY_REASON[exc.reason]
        return cls(exc.message or str(exc), code=code, claim_uid=ref.uid or None, field=exc.field or None)
    return StateError(
        f"internal error: {type(exc).__name__}: {exc}", code=ErrorCode.INTERNAL, claim_uid=ref.uid
    )


class NpuDriver:
    """``dra_kubeletplugin.DRAPlugin`` for NPUs: prepare/unprepare through the :class:`Preparer`."""

    def __init__(self, preparer: Preparer, *, telemetry: Telemetry) -> None:
        self.preparer = preparer
        self.telemetry = telemetry

    def prepare_resource_claims(self, claims: Sequence[ResourceClaim]) -> Mapping[str, PrepareResult]:
        return self.preparer.prepare(claims)

    def unprepare_resource_claims(self, claims: Sequence[ClaimRef]) -> Mapping[str, str]:
        return self.preparer.unprepare(claims)

    def claim_error(self, verb: str, ref: ClaimRef, exc: Exception) -> str:
        """The helper's hook for a claim it did not hand over: log, count, and the kubelet's text."""
        err = driver_error(exc, ref)
        clog = logs.claim_logger(ref.uid or "-", ref.namespace, ref.name)
        op: Literal["prepare", "unprepare"] = "unprepare" if verb == "unprepare" else "prepare"
        with self.telemetry.operation(
            op, claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
        ) as rec:
            rec.fail(err.code)
        clog.warning("%s failed: %s", verb, err)
        return str(err)

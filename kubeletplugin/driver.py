"""The driver the kubelet-plugin helper calls (dra-example-driver's ``driver.go``): thin, every claim its own result.

:class:`NpuDriver` implements ``dra_kubeletplugin.DRAPlugin`` on top of the :class:`~kubeletplugin.prepare.Preparer`
(``state.go``: the sequencing of effects) and the helper's ``claim_error`` hook: a claim the helper
did not hand over gets the driver's error text with its stable code (the one rule,
``dra_driver/claims.py``), is logged with the claim's UID and counted like any failed prepare.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from controller import kube
from dra_driver import logs
from dra_driver.claims import claim_error
from dra_driver.telemetry import Telemetry
from dra_kubeletplugin.claims import ClaimRef, PrepareResult, ResourceClaim
from dra_kubeletplugin.errors import ApiError
from kubeletplugin.prepare import Preparer

__all__ = ["NpuDriver"]


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
        clog = logs.claim_logger(ref.uid or "-", ref.namespace, ref.name)
        if isinstance(exc, ApiError) and type(exc) in kube.DRIVER_ERRORS:  # the helper's claim GET failed
            exc = kube.driver_error(exc)  # the driver's error for it, mapped once (same text and code)
        err = claim_error(exc, ref.uid, log=clog)
        op: Literal["prepare", "unprepare"] = "unprepare" if verb == "unprepare" else "prepare"
        with self.telemetry.operation(
            op, claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
        ) as rec:
            rec.fail(err.code)
        clog.warning("%s failed: %s", verb, err)
        return str(err)

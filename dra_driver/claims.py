"""The driver's side of the kubelet boundary: the one per-claim error rule; the boundary's types are the helper's.

:func:`claim_error` turns whatever failed one claim into the driver error the kubelet sees for that
claim, with its stable code, naming the claim: a driver error as it is; what the helper hit before
handing the claim over (a :class:`~dra_kubeletplugin.errors.ClaimRejected`: a malformed reference,
a claim the API proved gone or replaced, one not allocated to this driver, API trouble, the
kubelet's deadline) by its reason; anything else is a bug, reported as ``Internal``. The preparer
(a claim's prepare or unprepare) and the driver's hook for the claims the helper kept
(``kubeletplugin/driver.py``) both use it. The types that cross the boundary (claim references,
fetched claims, results, health reports, the call deadline) are ``dra_kubeletplugin.claims``.
"""

from __future__ import annotations

import logging

from dra_driver.errors import QUOTE_MAX, ErrorCode, FlexNPUError, InvalidInput, StateError, Unavailable
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected

__all__ = ["claim_error"]

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


def claim_error(
    exc: Exception, claim_uid: str, *, log: logging.LoggerAdapter[logging.Logger] | None = None
) -> FlexNPUError:
    """The per-claim driver error for ``exc`` (see the module docstring); a bug is logged with its
    traceback on ``log``."""
    if isinstance(exc, FlexNPUError):  # the API client's errors, mapped to the driver's (controller/kube.py)
        return exc.for_claim(claim_uid)
    if isinstance(exc, ClaimRejected):
        cls, code = _BY_REASON[exc.reason]
        return cls(exc.message or str(exc), code=code, claim_uid=claim_uid or None, field=exc.field or None)
    if log is not None:
        log.error("internal error", exc_info=exc)
    text = f"{type(exc).__name__}: {exc}"
    return StateError(f"internal error: {text[:QUOTE_MAX]}", code=ErrorCode.INTERNAL, claim_uid=claim_uid)

"""The driver's side of the kubelet boundary: the per-claim error rule; the boundary's types are the helper's.

:func:`claim_error` turns whatever a claim's prepare or unprepare raised into the driver error the
kubelet sees for that claim. The types that cross the boundary (claim references, fetched claims,
results, health reports, the call deadline) are ``dra_kubeletplugin.claims``.
"""

from __future__ import annotations

import logging

from dra_driver.errors import QUOTE_MAX, ErrorCode, FlexNPUError, StateError

__all__ = ["claim_error"]


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

"""One kubelet call, claim by claim: each claim its own result, one bad claim never fails the batch.

:func:`each_claim` runs the per-claim work of a prepare or unprepare call: it stops before a
claim once the kubelet's deadline for the call passed (the helper's ``CALL_DEADLINE``), logs with
the claim's UID (its reference was checked once, where the kubelet's call came in:
``dra_kubeletplugin/claimbatch.py``), counts the
operation (``Telemetry.operation``) and turns any failure into the claim's error text with its
stable code (``dra_driver/claims.py``). Unprepares run side by side (each holds its own claim
lock), each worker in a copy of the call's context, so the deadline travels with it; prepares run
in the kubelet's order, so conflicts between them resolve in that order.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Literal, TypeVar

from dra_driver import logs
from dra_driver.claims import claim_error
from dra_driver.errors import Unavailable
from dra_driver.telemetry import Telemetry
from dra_kubeletplugin.claims import CALL_DEADLINE, ClaimRef

__all__ = ["UNPREPARE_WORKERS", "each_claim"]

T = TypeVar("T")
UNPREPARE_WORKERS = 8


def each_claim(
    verb: Literal["prepare", "unprepare"],
    claims: Sequence[ClaimRef],
    one: Callable[[ClaimRef, logs.ClaimLogger], T],
    failed: Callable[[str], T],
    *,
    telemetry: Telemetry,
) -> dict[str, T]:
    """``one`` per claim, keyed by UID; a claim that fails gets ``failed(error text)``."""
    deadline = CALL_DEADLINE.get()

    def run(ref: ClaimRef) -> T:
        clog = logs.claim_logger(ref.uid, ref.namespace, ref.name)
        with telemetry.operation(
            verb, claim_uid=ref.uid or "-", namespace=ref.namespace, name=ref.name
        ) as rec:
            try:
                if deadline is not None and time.monotonic() >= deadline:
                    raise Unavailable(f"not started: the kubelet's deadline for this {verb} call passed")
                return one(ref, clog)
            except Exception as exc:  # a bug must not fail the other claims of the batch
                err = claim_error(exc, ref.uid, log=clog)
                clog.warning("%s failed: %s", verb, err)
                rec.fail(err.code)
                return failed(str(err))

    if verb == "unprepare" and len(claims) > 1:
        with ThreadPoolExecutor(min(UNPREPARE_WORKERS, len(claims)), thread_name_prefix="unprepare") as pool:
            runs = [pool.submit(contextvars.copy_context().run, run, ref) for ref in claims]
            return {ref.uid: r.result() for ref, r in zip(claims, runs, strict=True)}
    return {ref.uid: run(ref) for ref in claims}

"""The version-neutral half of a DRAPlugin call: check claims, call the preparer, complete results.

``dra_v1`` and ``dra_v1beta1`` decode their protobuf claims into :class:`ClaimRef`, hand them
to :class:`BatchRunner` and encode what it returns. This module imports no grpc and no
protobuf; it owns the kubelet's per-call rules:

* every requested claim UID gets exactly one result (missing ones are filled with an error,
  results for UIDs that were not asked for are dropped);
* a claim with an empty ``uid``/``namespace``/``name`` gets its own error naming the field,
  the others are still processed;
* request names lose their ``/subrequest`` suffix (the kubelet matches top-level names);
* calls are serialised through a :class:`~kubeletplugin.serialize.CallSerializer`;
* the kubelet's deadline for the call is handed to the preparer (``claims.CALL_DEADLINE``).

Exceptions from the preparer propagate; the servicers turn them into a gRPC status.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from dra_driver import plan
from dra_driver.claims import CALL_DEADLINE, ClaimPreparer, ClaimRef, ClaimResult, PreparedDevice
from dra_driver.errors import InvalidInput
from dra_driver.logs import claim_logger
from kubeletplugin.serialize import CallSerializer

MISSING_PREPARE = "driver returned no prepare result for this claim"
MISSING_UNPREPARE = "driver returned no unprepare result for this claim"


@dataclass(frozen=True, slots=True)
class CheckedClaims:
    """Claims split into those to pass on and per-UID errors for malformed ones."""

    valid: tuple[ClaimRef, ...]
    errors: dict[str, str]
    requested: tuple[str, ...]  # every requested UID once, in request order


def strip_subrequests(names: Iterable[str]) -> tuple[str, ...]:
    """``("req/sub", "req", "b")`` -> ``("req", "b")``: top-level names, deduplicated, order kept."""
    out: dict[str, None] = {}
    for name in names:
        out.setdefault(plan.strip_subrequest(name), None)
    return tuple(out)


def claim_error(ref: ClaimRef) -> str:
    """The error for a malformed claim reference, or "" when namespace, uid and name are all set."""
    for field in ("uid", "namespace", "name"):
        if not getattr(ref, field):
            return str(
                InvalidInput(
                    f"the kubelet sent a claim with an empty {field}",
                    claim_uid=ref.uid,
                    field=f"claim.{field}",
                )
            )
    return ""


def check_claims(refs: Sequence[ClaimRef]) -> CheckedClaims:
    """Split ``refs`` into valid claims (first occurrence of each UID) and per-UID errors."""
    valid: dict[str, ClaimRef] = {}
    errors: dict[str, str] = {}
    requested: dict[str, None] = {}
    for ref in refs:
        requested.setdefault(ref.uid, None)
        if ref.uid in valid or ref.uid in errors:
            continue
        error = claim_error(ref)
        if error:
            errors[ref.uid] = error
        else:
            valid[ref.uid] = ref
    return CheckedClaims(valid=tuple(valid.values()), errors=errors, requested=tuple(requested))


def complete_prepare(checked: CheckedClaims, results: Mapping[str, ClaimResult]) -> dict[str, ClaimResult]:
    """One normalised result per requested UID: validation errors, preparer results, fillers."""
    out: dict[str, ClaimResult] = {}
    for uid in checked.requested:
        if uid in checked.errors:
            out[uid] = ClaimResult(error=checked.errors[uid])
        elif uid in results:
            out[uid] = normalise_result(results[uid])
        else:
            out[uid] = ClaimResult(error=str(InvalidInput(MISSING_PREPARE, claim_uid=uid)))
    return out


def complete_unprepare(checked: CheckedClaims, results: Mapping[str, str]) -> dict[str, str]:
    """One error string per requested UID ("" = released)."""
    out: dict[str, str] = {}
    for uid in checked.requested:
        if uid in checked.errors:
            out[uid] = checked.errors[uid]
        elif uid in results:
            out[uid] = results[uid]
        else:
            out[uid] = str(InvalidInput(MISSING_UNPREPARE, claim_uid=uid))
    return out


def normalise_result(result: ClaimResult) -> ClaimResult:
    """Drop devices of a failed claim and strip sub-request suffixes from request names."""
    if result.error:
        return ClaimResult(error=result.error)
    return ClaimResult(devices=tuple(_normalise_device(d) for d in result.devices))


class BatchRunner:
    """Runs one kubelet batch against a :class:`ClaimPreparer`, serialised.

    **Parameters:**

    * ``preparer`` — the domain object that prepares and unprepares claims.
    * ``serializer`` — held around every preparer call (in-process lock, optional flock).
    """

    def __init__(self, preparer: ClaimPreparer, *, serializer: CallSerializer) -> None:
        self._preparer = preparer
        self._serializer = serializer

    def prepare(self, refs: Sequence[ClaimRef], *, deadline: float | None = None) -> dict[str, ClaimResult]:
        """Prepare ``refs``; return one result per requested UID. Preparer exceptions propagate.

        ``deadline`` (``time.monotonic()``) is the kubelet's: no claim or retry starts that outlives it.
        """
        checked = check_claims(refs)
        results: dict[str, ClaimResult] = {}
        if checked.valid:
            with self._serializer, _deadline(deadline):
                results = self._preparer.prepare(checked.valid)
        _log_unexpected(checked, results, "prepare")
        completed = complete_prepare(checked, results)
        for uid, result in completed.items():
            if result.error:
                claim_logger(uid).warning("prepare failed: %s", result.error)
            else:
                claim_logger(uid).info("prepared %d device(s)", len(result.devices))
        return completed

    def unprepare(self, refs: Sequence[ClaimRef], *, deadline: float | None = None) -> dict[str, str]:
        """Unprepare ``refs``; return UID -> error ("" = released). Preparer exceptions propagate."""
        checked = check_claims(refs)
        results: dict[str, str] = {}
        if checked.valid:
            with self._serializer, _deadline(deadline):
                results = self._preparer.unprepare(checked.valid)
        _log_unexpected(checked, results, "unprepare")
        completed = complete_unprepare(checked, results)
        for uid, error in completed.items():
            if error:
                claim_logger(uid).warning("unprepare failed: %s", error)
            else:
                claim_logger(uid).info("unprepared")
        return completed


@contextlib.contextmanager
def _deadline(deadline: float | None) -> Iterator[None]:
    token = CALL_DEADLINE.set(deadline)
    try:
        yield
    finally:
        CALL_DEADLINE.reset(token)


def _normalise_device(device: PreparedDevice) -> PreparedDevice:
    return replace(device, request_names=strip_subrequests(device.request_names))


def _log_unexpected(checked: CheckedClaims, results: Mapping[str, object], verb: str) -> None:
    wanted = {ref.uid for ref in checked.valid}
    for uid in sorted(set(results) - wanted):
        claim_logger(uid).warning(
            "driver returned a %s result for a claim the kubelet did not send; dropped", verb
        )
    for uid in sorted(wanted - set(results)):
        claim_logger(uid).error("driver returned no %s result for this claim", verb)

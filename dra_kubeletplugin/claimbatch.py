"""The version-neutral half of a DRAPlugin call: check refs, fetch claims, serialise, call the driver, complete results.

``dra_v1`` and ``dra_v1beta1`` decode their protobuf claims into :class:`ClaimRef`, hand them to
:class:`BatchRunner` and encode what it returns. This module imports no grpc and no protobuf; it
owns the kubelet's per-call rules:

* every requested claim UID gets exactly one result (missing ones are filled with an error,
  results for UIDs that were not asked for are dropped);
* a reference with an empty or impossible ``uid``/``namespace``/``name`` gets its own error naming
  the field at once (no API call), the others are still processed;
* prepare fetches each claim first (``fetch.py``: fair between calls, a negative cache, bounded
  by the kubelet's deadline) and hands the driver only claims that are the one asked for,
  allocated, with a device of this driver; the others get their error without the driver — but a
  claim whose allocation has no device of this driver is prepared with no devices (as the Go
  helper's drivers answer it: there is nothing to do here), also without the driver;
* the driver is called under the call serializer (``serialize.py``), whose wait is bounded by the
  kubelet's deadline, with :data:`~dra_kubeletplugin.claims.CALL_DEADLINE` set;
* request names lose their ``/subrequest`` suffix (the kubelet matches top-level names).

A claim the helper does not hand to the driver gets the text of the driver's optional
``claim_error(verb, ref, exc)`` hook, else ``str(exc)``. Exceptions from the driver propagate;
the servicers turn them into a gRPC status.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace

from dra_kubeletplugin.claims import (
    CALL_DEADLINE,
    CLAIM_UID_RE,
    DNS_LABEL_RE,
    DNS_SUBDOMAIN_RE,
    ClaimRef,
    DRAPlugin,
    PreparedDevice,
    PrepareResult,
    ResourceClaim,
    strip_subrequest,
)
from dra_kubeletplugin.errors import ClaimReason, ClaimRejected
from dra_kubeletplugin.fetch import FairFetcher
from dra_kubeletplugin.serialize import CallSerializer, TurnMissed

__all__ = ["BatchRunner", "CheckedClaims", "check_claims", "claim_problem", "strip_subrequests"]

MISSING_PREPARE = "driver returned no prepare result for this claim"
MISSING_UNPREPARE = "driver returned no unprepare result for this claim"

_log = logging.getLogger("dra_kubeletplugin.claims")


@dataclass(frozen=True, slots=True)
class CheckedClaims:
    """References split into those to serve and per-UID rejections for malformed ones."""

    valid: tuple[ClaimRef, ...]
    rejected: dict[str, ClaimRejected]
    requested: tuple[ClaimRef, ...]  # every requested UID once (first reference), in request order


def strip_subrequests(names: Iterable[str]) -> tuple[str, ...]:
    """``("req/sub", "req", "b")`` -> ``("req", "b")``: top-level names, deduplicated, order kept."""
    out: dict[str, None] = {}
    for name in names:
        out.setdefault(strip_subrequest(name), None)
    return tuple(out)


def claim_problem(ref: ClaimRef) -> ClaimRejected | None:
    """Why the kubelet's reference cannot name a claim (None: it can). Pure; no API call."""
    for field, value, rule, what in (
        ("uid", ref.uid, CLAIM_UID_RE, "a claim UID (letters, digits and '-', at most 63)"),
        ("namespace", ref.namespace, DNS_LABEL_RE, "a DNS label"),
        ("name", ref.name, DNS_SUBDOMAIN_RE, "a DNS subdomain"),
    ):
        if not value:
            message = f"the kubelet sent a claim with an empty {field}"
        elif len(value) > 253 or not rule.match(value):
            message = f"the kubelet sent a claim whose {field} {value[:64]!r} is not {what}"
        else:
            continue
        return ClaimRejected.make(
            message,
            reason=ClaimReason.MALFORMED,
            claim_uid=ref.uid if field != "uid" else "",
            field=f"claim.{field}",
        )
    return None


def check_claims(refs: Sequence[ClaimRef]) -> CheckedClaims:
    """Split ``refs`` into valid references (first occurrence of each UID) and per-UID rejections."""
    valid: dict[str, ClaimRef] = {}
    rejected: dict[str, ClaimRejected] = {}
    requested: dict[str, ClaimRef] = {}
    for ref in refs:
        requested.setdefault(ref.uid, ref)
        if ref.uid in valid or ref.uid in rejected:
            continue
        problem = claim_problem(ref)
        if problem is not None:
            rejected[ref.uid] = problem
        else:
            valid[ref.uid] = ref
    return CheckedClaims(valid=tuple(valid.values()), rejected=rejected, requested=tuple(requested.values()))


def normalise_result(result: PrepareResult) -> PrepareResult:
    """Drop devices of a failed claim and strip sub-request suffixes from request names."""
    if result.error:
        return PrepareResult(error=result.error)
    return PrepareResult(devices=tuple(_normalise_device(d) for d in result.devices))


class BatchRunner:
    """Runs one kubelet batch against a :class:`~dra_kubeletplugin.claims.DRAPlugin`.

    **Parameters:**

    * ``plugin`` — the driver.
    * ``fetcher`` — fetches and checks claims for a prepare (None: prepare is refused per claim).
    * ``serializer`` — held around every driver call (in-process lock, optional flock).
    """

    def __init__(self, plugin: DRAPlugin, *, fetcher: FairFetcher | None, serializer: CallSerializer) -> None:
        self._plugin = plugin
        self._fetcher = fetcher
        self._serializer = serializer

    def prepare(self, refs: Sequence[ClaimRef], *, deadline: float | None = None) -> dict[str, PrepareResult]:
        """Prepare ``refs``; one result per requested UID. Driver exceptions propagate.

        ``deadline`` (``time.monotonic()``) is the kubelet's: no fetch, turn or claim outlives it.
        """
        checked = check_claims(refs)
        failed: dict[str, Exception] = dict(checked.rejected)
        claims: list[ResourceClaim] = []
        if checked.valid:
            fetched = (
                self._fetcher.fetch(checked.valid, deadline=deadline)
                if self._fetcher is not None
                else {
                    r.uid: _missing(r, "the plugin was started without an API client") for r in checked.valid
                }
            )
            for ref in checked.valid:
                got = fetched[ref.uid]
                if isinstance(got, ResourceClaim):
                    claims.append(got)
                else:
                    failed[ref.uid] = got
        results: Mapping[str, PrepareResult] = {}
        if claims:
            try:
                with self._serializer.hold(deadline), _deadline(deadline):
                    results = self._plugin.prepare_resource_claims(claims)
            except TurnMissed as exc:
                failed.update({c.uid: _missed(c.ref, exc) for c in claims})
        _log_unexpected({c.uid for c in claims if c.uid not in failed}, results, "prepare")
        out: dict[str, PrepareResult] = {}
        for ref in checked.requested:
            if _nothing_here(failed.get(ref.uid)):
                out[ref.uid] = PrepareResult()
            elif ref.uid in failed:
                out[ref.uid] = PrepareResult(error=self._error("prepare", ref, failed[ref.uid]))
            elif ref.uid in results:
                out[ref.uid] = normalise_result(results[ref.uid])
            else:
                out[ref.uid] = PrepareResult(
                    error=self._error("prepare", ref, _missing(ref, MISSING_PREPARE))
                )
        return out

    def unprepare(self, refs: Sequence[ClaimRef], *, deadline: float | None = None) -> dict[str, str]:
        """Unprepare ``refs`` (no API call: the claim may be gone); UID -> error ("" = released)."""
        checked = check_claims(refs)
        failed: dict[str, Exception] = dict(checked.rejected)
        results: Mapping[str, str] = {}
        if checked.valid:
            try:
                with self._serializer.hold(deadline), _deadline(deadline):
                    results = self._plugin.unprepare_resource_claims(list(checked.valid))
            except TurnMissed as exc:
                failed.update({r.uid: _missed(r, exc) for r in checked.valid})
        _log_unexpected({r.uid for r in checked.valid if r.uid not in failed}, results, "unprepare")
        out: dict[str, str] = {}
        for ref in checked.requested:
            if ref.uid in failed:
                out[ref.uid] = self._error("unprepare", ref, failed[ref.uid])
            elif ref.uid in results:
                out[ref.uid] = results[ref.uid]
            else:
                out[ref.uid] = self._error("unprepare", ref, _missing(ref, MISSING_UNPREPARE))
        return out

    def _error(self, verb: str, ref: ClaimRef, exc: Exception) -> str:
        """The kubelet's error text for a claim the driver did not answer: the driver's hook, or ``str``."""
        hook = getattr(self._plugin, "claim_error", None)
        if hook is None:
            return str(exc)
        return str(hook(verb, ref, exc))


@contextlib.contextmanager
def _deadline(deadline: float | None) -> Iterator[None]:
    token = CALL_DEADLINE.set(deadline)
    try:
        yield
    finally:
        CALL_DEADLINE.reset(token)


def _nothing_here(exc: Exception | None) -> bool:
    """The claim is allocated, to other drivers only: prepared, with no devices of this one."""
    return isinstance(exc, ClaimRejected) and exc.reason == ClaimReason.NOT_THIS_DRIVER


def _missed(ref: ClaimRef, exc: TurnMissed) -> ClaimRejected:
    return ClaimRejected.make(f"not started: {exc}", reason=ClaimReason.DEADLINE, claim_uid=ref.uid)


def _missing(ref: ClaimRef, message: str) -> Exception:
    return ClaimRejected.make(message, reason=ClaimReason.UNAVAILABLE, claim_uid=ref.uid)


def _normalise_device(device: PreparedDevice) -> PreparedDevice:
    return replace(device, request_names=strip_subrequests(device.request_names))


def _log_unexpected(wanted: set[str], results: Mapping[str, object], verb: str) -> None:
    for uid in sorted(set(results) - wanted):
        _log.warning(
            "claim %s: the driver returned a %s result for a claim it was not given; dropped", uid, verb
        )
    for uid in sorted(wanted - set(results)):
        _log.error("claim %s: the driver returned no %s result for this claim", uid, verb)

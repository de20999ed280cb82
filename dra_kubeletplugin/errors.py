"""The helper's exceptions, grouped by how a caller reacts::

    PluginError                  anything the helper raises
    ├── InvalidArgument          permanent: bad options, a bad pool, a bad claim reference
    │   └── DroppedFieldsError   the API server stored slices without some fields (a gate is off)
    ├── ClaimRejected            one claim the helper will not hand to the driver (``reason`` says why)
    └── ApiError                 the Kubernetes API answered badly (``kubeapi.py`` translates)
        ├── NotFound             404 with a NotFound Status (``kind``/``name``/``group`` from it)
        │   └── ClaimNotFound    ... proving that the ResourceClaim asked for does not exist
        ├── Rejected             another 4xx: the request is wrong; asking again will not help
        │   └── BadKubeconfig    the kubeconfig (or the in-cluster service account) cannot be loaded
        └── ApiUnavailable       ask again later: 5xx, 429
            ├── Unreachable      no answer: refused, reset, timed out, 503
            ├── Ambiguous        an answer that proves nothing (a 404 without a Status, a foreign 200)
            ├── Conflict         409: a precondition failed or the object exists
            ├── Gone             410: the resourceVersion is too old; relist
            └── Forbidden        401/403: RBAC may be fixed while we retry

The helper raises and catches these classes only; a driver that wants its own errors maps these
once at its own API boundary (``controller/kube.py`` does, by one table). :func:`retryable` is the one rule for
"try again later"; ``statuses.py`` maps them to gRPC status codes.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

__all__ = [
    "Ambiguous",
    "ApiError",
    "ApiUnavailable",
    "BadKubeconfig",
    "ClaimNotFound",
    "ClaimReason",
    "ClaimRejected",
    "Conflict",
    "DroppedFieldsError",
    "Forbidden",
    "Gone",
    "InvalidArgument",
    "NotFound",
    "PluginError",
    "Rejected",
    "Unreachable",
    "retryable",
]


class PluginError(Exception):
    """Base of the helper's errors. ``str(err)`` is a full sentence."""

    retry: bool = False
    """Whether asking again later can succeed."""


class InvalidArgument(PluginError):
    """Permanent: the options, the pool or a claim reference are malformed."""


class ClaimReason(StrEnum):
    """Why the helper did not hand a claim to the driver (stable, for error tables and metrics)."""

    MALFORMED = "Malformed"  # the kubelet's reference has an empty or impossible uid, namespace or name
    NOT_FOUND = "NotFound"  # the API proved that no claim with that name exists
    REPLACED = "Replaced"  # the claim of that name has another UID
    NOT_ALLOCATED = "NotAllocated"  # status.allocation is missing
    NOT_THIS_DRIVER = "NotThisDriver"  # the allocation has no device of this driver
    UNAVAILABLE = "Unavailable"  # the claim could not be read (API trouble); the kubelet retries
    DEADLINE = "Deadline"  # the kubelet's deadline passed before the claim could be served


class ClaimRejected(PluginError):
    """One claim the helper will not hand to the driver; ``reason``, ``claim_uid`` and ``field`` say why."""

    reason: ClaimReason = ClaimReason.MALFORMED
    claim_uid: str = ""
    field: str = ""
    message: str = ""
    """The sentence without the claim and field (``str(err)`` has both)."""

    @classmethod
    def make(cls, message: str, *, reason: ClaimReason, claim_uid: str, field: str = "") -> ClaimRejected:
        where = f"claim {claim_uid or '-'}" + (f", field {field}" if field else "")
        err = cls(f"{where}: {message}")
        err.reason, err.claim_uid, err.field, err.message = reason, claim_uid, field, message
        err.retry = reason in (ClaimReason.UNAVAILABLE, ClaimReason.DEADLINE)
        return err


class DroppedFieldsError(InvalidArgument):
    """The API server stored our slices without some fields (a feature gate is off).

    ``fields`` names them (e.g. ``sharedCounters``, ``consumesCounters``); publish the pool without
    them (the driver decides how: one mode per device, no counters).
    """

    fields: tuple[str, ...] = ()
    result: Any = None
    """What the interrupted sync did (a ``resourceslice.sync.SyncResult``)."""

    @classmethod
    def make(cls, fields: tuple[str, ...], *, gates: str) -> DroppedFieldsError:
        err = cls(f"the API server dropped {', '.join(fields)} from ResourceSlices; is {gates} enabled?")
        err.fields = fields
        return err


class ApiError(PluginError):
    """The Kubernetes API server refused or did not answer a request."""


class NotFound(ApiError):
    """404 with a ``Status`` body of reason NotFound; what it names is in ``kind``/``name``/``group``."""

    kind: str = ""
    name: str = ""
    group: str = ""

    def proves(self, *, kind: str, name: str, group: str) -> bool:
        """Whether this 404 says that object ``group``/``kind`` ``name`` does not exist."""
        return self.kind == kind and self.name == name and self.group == group

    def set_details(self, details: dict[str, Any]) -> None:
        self.kind = str(details.get("kind") or "")
        self.name = str(details.get("name") or "")
        self.group = str(details.get("group") or "")


class ClaimNotFound(NotFound):
    """The API proved that the ResourceClaim asked for does not exist (``KubeClient.get_claim``)."""


class Rejected(ApiError):
    """Another 4xx (or a broken kubeconfig): the request itself is wrong."""


class BadKubeconfig(Rejected):
    """The kubeconfig (or the in-cluster service account) cannot be loaded."""


class ApiUnavailable(ApiError):
    """The API server may answer later (5xx, 429)."""

    retry = True


class Unreachable(ApiUnavailable):
    """No answer: connection refused or reset, a timeout, or 503."""


class Ambiguous(ApiUnavailable):
    """An answer that proves nothing about the object: keep everything and ask again later."""


class Conflict(ApiUnavailable):
    """409: a resourceVersion or UID precondition failed, or the object exists; re-read and retry."""


class Gone(ApiUnavailable):
    """410: the watch or list resourceVersion is too old; relist."""


class Forbidden(ApiUnavailable):
    """401/403: not allowed (yet); RBAC may be fixed while we retry."""


def retryable(exc: BaseException) -> bool:
    """The helper's one rule for "try again later": its own retryable errors, and any exception that
    says so with a true ``retry`` attribute (how a driver's own error classes opt in)."""
    return bool(getattr(exc, "retry", False)) and isinstance(exc, Exception)

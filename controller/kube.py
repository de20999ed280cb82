"""The node's Kubernetes API module: the helper's REST client plus the calls only this driver makes.

:class:`Kube` is :class:`dra_kubeletplugin.kubeapi.KubeClient` (nodes, ResourceSlices, claim GETs,
the REST plumbing and the one translation of client exceptions) with the driver's own calls added:
listing and watching every ResourceClaim (the residual reconciler), patching claim status, and
Events. It imports no ``kubernetes`` module itself: ``dra_kubeletplugin/kubeapi.py`` is the only one that does.

The errors it raises are the driver's (:mod:`dra_driver.errors`, with stable codes) and, at the
same time, the helper's (:mod:`dra_kubeletplugin.errors`), so both sides catch them by their own
classes::

    FlexNPUError
    ├── InvalidInput            400, 422, other 4xx (Rejected), bad kubeconfig (BadKubeconfig)
    │   └── NotFound            404 with a Status body whose reason is NotFound
    │       └── ClaimNotFound   ... naming the ResourceClaim asked for (code ClaimNotFound)
    └── Unavailable             retry
        ├── ServerError         500, 502, 504, 429
        ├── Unreachable         connection refused / reset, timeouts, 503
        ├── Ambiguous           an answer that proves nothing: a 404 that is not a NotFound
        │                       Status, an empty, malformed or foreign-kind 200
        ├── Conflict            409 (also failed delete preconditions)
        ├── Gone                410: the resource version is too old; relist
        └── Forbidden           401, 403 (RBAC may be fixed while we retry)

Absence is proven, never assumed (see :meth:`~dra_kubeletplugin.kubeapi.KubeClient.get_claim`).
Add new API calls here as methods (claims, events, taints).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from dra_driver.errors import ErrorCode, InvalidInput, Unavailable
from dra_kubeletplugin import errors as api
from dra_kubeletplugin import kubeapi
from dra_kubeletplugin.kubeapi import (
    CORE,
    RESOURCE,
    ErrorKinds,
    KubeClient,
    claim_answer_problem,
    claim_path,
    segment,
)

__all__ = [
    "Ambiguous",
    "BadKubeconfig",
    "ClaimNotFound",
    "Conflict",
    "Forbidden",
    "Gone",
    "Kube",
    "NotFound",
    "Rejected",
    "ServerError",
    "Unreachable",
    "boundary",
    "claim_answer_problem",
    "translate",
]

JSON = dict[str, Any]


class NotFound(InvalidInput, api.NotFound):
    """404 with a ``Status`` body of reason NotFound; ``kind``/``name``/``group`` from its details."""

    default_code = ErrorCode.INVALID_ARGUMENT


class ClaimNotFound(NotFound):
    """The API proved that the ResourceClaim asked for does not exist."""

    default_code = ErrorCode.CLAIM_NOT_FOUND


class Rejected(InvalidInput, api.Rejected):
    """Another 4xx: the request itself is wrong."""


class BadKubeconfig(InvalidInput, api.Rejected):
    """The kubeconfig (or the in-cluster service account) cannot be loaded."""

    default_code = ErrorCode.INVALID_CONFIG

    def __init__(self, message: str) -> None:
        super().__init__(message, field="kubeconfig")


class ServerError(Unavailable, api.ApiUnavailable):
    """429 or a 5xx: the server may answer later."""


class Unreachable(Unavailable, api.Unreachable):
    """The API server did not answer (connection refused or reset, timeout)."""


class Ambiguous(Unavailable, api.Ambiguous):
    """An answer that proves nothing about the object; keep everything and ask again later."""


class Conflict(Unavailable, api.Conflict):
    """409: a resourceVersion / UID precondition failed or the object exists; re-read and retry."""

    default_code = ErrorCode.API_CONFLICT


class Gone(Unavailable, api.Gone):
    """410: the watch or list resourceVersion is too old; relist."""


class Forbidden(Unavailable, api.Forbidden):
    """401/403: not allowed (yet); retry with backoff, RBAC may be fixed meanwhile."""


KINDS = ErrorKinds(
    not_found=NotFound,
    claim_not_found=ClaimNotFound,
    rejected=Rejected,
    invalid_config=BadKubeconfig,
    unavailable=ServerError,
    unreachable=Unreachable,
    ambiguous=Ambiguous,
    conflict=Conflict,
    gone=Gone,
    forbidden=Forbidden,
)
"""The driver's classes for each kind of API failure."""

translate = functools.partial(kubeapi.translate, kinds=KINDS)
"""The driver error for one client-library exception: ``translate(exc, what=...)``."""


def boundary(what: str) -> contextlib.AbstractContextManager[None]:
    """Translate any client exception raised inside into a driver error."""
    return kubeapi.boundary(what, KINDS)


class Kube(KubeClient):
    """The helper's REST client with the driver's error classes and its own calls.

    Usage::

        kube = Kube.from_config(cfg.kubeconfig)
        items, rv = kube.list_slices(driver="npu.flexnpu.io", node="node1")
    """

    errors = KINDS

    # --- ResourceClaims ------------------------------------------------------------------

    def list_claims(self) -> tuple[list[JSON], str]:
        """All ResourceClaims in all namespaces (paged), and the list's resourceVersion."""
        return self._list_all("list resourceclaims", f"{RESOURCE}/resourceclaims", {})

    def claims_resource_version(self) -> str:
        """A resourceVersion to start a claim watch from: a ``limit=1`` list, not the cluster's claims."""
        page = self._call(
            "list resourceclaims (limit=1)", "GET", f"{RESOURCE}/resourceclaims", query={"limit": 1}
        )
        rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
        if not rv:
            raise Ambiguous("list resourceclaims (limit=1): the answer carries no resourceVersion")
        return rv

    def watch_claims(
        self, *, resource_version: str, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[tuple[str, JSON]]:
        """Watch events of ResourceClaims in all namespaces (same contract as :meth:`watch_slices`)."""
        return self._watch(
            "watch resourceclaims",
            f"{RESOURCE}/resourceclaims",
            stop=stop,
            timeout_seconds=timeout_seconds,
            query={"resourceVersion": resource_version},
        )

    def patch_claim_status(
        self,
        namespace: str,
        name: str,
        patch: JSON,
        *,
        field_manager: str,
        content_type: str = "application/merge-patch+json",
        force: bool | None = None,
    ) -> JSON:
        """Patch ``status`` (merge patch by default; ``application/apply-patch+yaml`` for SSA)."""
        query: JSON = {"fieldManager": field_manager}
        if force is not None:
            query["force"] = "true" if force else "false"
        return self._call(
            f"patch resourceclaim {namespace}/{name} status",
            "PATCH",
            claim_path(namespace, name) + "/status",
            query=query,
            body=patch,
            content_type=content_type,
        )

    # --- ResourceSlices of every node (the scheduler extender) -------------------------------

    def list_driver_slices(self, driver: str) -> tuple[list[JSON], str]:
        """Every ResourceSlice of ``driver``, on any node (paged), and the list's resourceVersion."""
        return self._list_all(
            "list resourceslices", f"{RESOURCE}/resourceslices", {"fieldSelector": f"spec.driver={driver}"}
        )

    def watch_driver_slices(
        self, driver: str, *, resource_version: str, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[tuple[str, JSON]]:
        """Watch events of every ResourceSlice of ``driver`` (same contract as :meth:`watch_slices`)."""
        return self._watch(
            "watch resourceslices",
            f"{RESOURCE}/resourceslices",
            stop=stop,
            timeout_seconds=timeout_seconds,
            query={"fieldSelector": f"spec.driver={driver}", "resourceVersion": resource_version},
        )

    # --- Events --------------------------------------------------------------------------

    def create_event(
        self,
        *,
        involved: JSON,
        reason: str,
        message: str,
        event_type: str = "Normal",
        component: str = "flexnpu-dra",
        host: str = "",
    ) -> JSON:
        """A core/v1 Event about ``involved`` ({apiVersion, kind, name, namespace, uid})."""
        namespace = involved.get("namespace") or "default"
        body: JSON = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved.get('name', 'flexnpu')}.", "namespace": namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": event_type,
            "source": {"component": component, **({"host": host} if host else {})},
            "count": 1,
        }
        return self._call(
            f"create event {reason}", "POST", f"{CORE}/namespaces/{segment(namespace)}/events", body=body
        )

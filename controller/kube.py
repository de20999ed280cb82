"""The node's Kubernetes API module: the helper's REST client plus the calls only this driver makes.

:class:`Kube` is :class:`dra_kubeletplugin.kubeapi.KubeClient` (nodes, ResourceSlices, claim GETs,
the REST plumbing and the one translation of client exceptions) with the driver's own calls added:
listing and watching every ResourceClaim (the residual reconciler), patching claim status, and
Events. It imports no ``kubernetes`` module itself: ``dra_kubeletplugin/kubeapi.py`` is the only one that does.

The errors it raises are the driver's only (:mod:`dra_driver.errors`, with stable codes): the helper
underneath raises its own (:mod:`dra_kubeletplugin.errors`), and every public method of :class:`Kube`
maps them once, by one table (:data:`DRIVER_ERRORS`), at this boundary. The helper itself is handed
:meth:`Kube.for_helper`, a plain ``KubeClient`` on the same connection, so it sees its own errors::

    helper (dra_kubeletplugin.errors)      driver (here; FlexNPUError)
    ApiError
    ├── NotFound                        -> InvalidInput / NotFound        404 with a NotFound Status
    │   └── ClaimNotFound               ->   NotFound / ClaimNotFound     ... naming the claim asked for
    ├── Rejected                        -> InvalidInput / Rejected        400, 422, other 4xx
    │   └── BadKubeconfig               -> InvalidInput / BadKubeconfig   bad kubeconfig (InvalidConfig)
    └── ApiUnavailable                  -> Unavailable / ServerError      500, 502, 504, 429 (retry)
        ├── Unreachable                 -> Unavailable / Unreachable      refused / reset, timeouts, 503
        ├── Ambiguous                   -> Unavailable / Ambiguous        a 404 that is not a NotFound
        │                                                                 Status, an empty or foreign 200
        ├── Conflict                    -> Unavailable / Conflict         409 (APIConflict)
        ├── Gone                        -> Unavailable / Gone             410: relist
        └── Forbidden                   -> Unavailable / Forbidden        401, 403 (RBAC may be fixed)

Absence is proven, never assumed (see :meth:`~dra_kubeletplugin.kubeapi.KubeClient.get_claim`).
Add new API calls here as methods (claims, events, taints).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, Unavailable
from dra_kubeletplugin import errors as api
from dra_kubeletplugin.kubeapi import (
    CORE,
    RESOURCE,
    KubeClient,
    claim_answer_problem,
    claim_path,
    segment,
)

__all__ = [
    "DRIVER_ERRORS",
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
    "claim_answer_problem",
    "driver_error",
]

JSON = dict[str, Any]


class NotFound(InvalidInput):
    """404 with a ``Status`` body of reason NotFound; ``kind``/``name``/``group`` from its details."""

    default_code = ErrorCode.INVALID_ARGUMENT
    kind: str = ""
    name: str = ""
    group: str = ""


class ClaimNotFound(NotFound):
    """The API proved that the ResourceClaim asked for does not exist."""

    default_code = ErrorCode.CLAIM_NOT_FOUND


class Rejected(InvalidInput):
    """Another 4xx: the request itself is wrong."""


class BadKubeconfig(InvalidInput):
    """The kubeconfig (or the in-cluster service account) cannot be loaded."""

    default_code = ErrorCode.INVALID_CONFIG

    def __init__(self, message: str) -> None:
        super().__init__(message, field="kubeconfig")


class ServerError(Unavailable):
    """429 or a 5xx: the server may answer later."""

    retry = True  # the helper's ``errors.retryable`` rule, for errors that reach it through the driver


class Unreachable(Unavailable):
    """The API server did not answer (connection refused or reset, timeout)."""

    retry = True


class Ambiguous(Unavailable):
    """An answer that proves nothing about the object; keep everything and ask again later."""

    retry = True


class Conflict(Unavailable):
    """409: a resourceVersion / UID precondition failed or the object exists; re-read and retry."""

    default_code = ErrorCode.API_CONFLICT
    retry = True


class Gone(Unavailable):
    """410: the watch or list resourceVersion is too old; relist."""

    retry = True


class Forbidden(Unavailable):
    """401/403: not allowed (yet); retry with backoff, RBAC may be fixed meanwhile."""

    retry = True


DRIVER_ERRORS: dict[type[api.ApiError], type[FlexNPUError]] = {
    api.ClaimNotFound: ClaimNotFound,
    api.NotFound: NotFound,
    api.BadKubeconfig: BadKubeconfig,
    api.Rejected: Rejected,
    api.Unreachable: Unreachable,
    api.Ambiguous: Ambiguous,
    api.Conflict: Conflict,
    api.Gone: Gone,
    api.Forbidden: Forbidden,
    api.ApiUnavailable: ServerError,
}
"""The one kube -> driver mapping: the helper's API error class -> the driver's (nearest class wins)."""


def driver_error(err: api.ApiError) -> FlexNPUError:
    """The driver error for one helper API error (same message; ``kind``/``name``/``group`` kept)."""
    cls: type[FlexNPUError] = Rejected
    for klass in type(err).__mro__:
        if klass in DRIVER_ERRORS:
            cls = DRIVER_ERRORS[klass]
            break
    mapped = cls(str(err))
    if isinstance(err, api.NotFound) and isinstance(mapped, NotFound):
        mapped.kind, mapped.name, mapped.group = err.kind, err.name, err.group
    return mapped


@contextlib.contextmanager
def mapped() -> Iterator[None]:
    """Raise the driver error for any helper API error raised inside.

    The driver error takes the helper error's place in the chain: its ``__cause__`` is what the
    helper's was (the client-library exception), or the helper error when that had none.
    """
    try:
        yield
    except api.ApiError as err:
        raise driver_error(err) from (err.__cause__ if err.__cause__ is not None else err)


def _mapped_iter(events: Iterator[tuple[str, JSON]]) -> Iterator[tuple[str, JSON]]:
    with mapped():
        yield from events


class Kube(KubeClient):
    """The helper's REST client with the driver's error classes and its own calls.

    Usage::

        kube = Kube.from_config(cfg.kubeconfig)
        items, rv = kube.list_slices(driver="npu.flexnpu.io", node="node1")
    """

    def for_helper(self) -> KubeClient:
        """A plain ``KubeClient`` on this connection, raising the helper's errors, for the helper.

        (:attr:`api_client` is the helper's own property, not mapped here: it raises the helper's
        ``BadKubeconfig``, which :meth:`connect` maps for the driver.)
        """
        return KubeClient(connect=lambda: self.api_client, request_timeout=self.request_timeout)

    # --- the helper's calls, with the driver's errors -----------------------------------------

    def connect(self) -> None:
        with mapped():
            super().connect()

    def get_node(self, name: str) -> JSON:
        with mapped():
            return super().get_node(name)

    def list_slices(self, *, driver: str, node: str) -> tuple[list[JSON], str]:
        with mapped():
            return super().list_slices(driver=driver, node=node)

    def watch_slices(
        self, *, driver: str, node: str, resource_version: str, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[tuple[str, JSON]]:
        return _mapped_iter(
            super().watch_slices(
                driver=driver,
                node=node,
                resource_version=resource_version,
                timeout_seconds=timeout_seconds,
                stop=stop,
            )
        )

    def create_slice(self, body: JSON) -> JSON:
        with mapped():
            return super().create_slice(body)

    def update_slice(self, body: JSON) -> JSON:
        with mapped():
            return super().update_slice(body)

    def delete_slice(self, name: str, *, uid: str, resource_version: str) -> None:
        with mapped():
            super().delete_slice(name, uid=uid, resource_version=resource_version)

    def get_claim(self, namespace: str, name: str) -> JSON:
        with mapped():
            return super().get_claim(namespace, name)

    # --- ResourceClaims ------------------------------------------------------------------

    def list_claims(self) -> tuple[list[JSON], str]:
        """All ResourceClaims in all namespaces (paged), and the list's resourceVersion."""
        with mapped():
            return self._list_all("list resourceclaims", f"{RESOURCE}/resourceclaims", {})

    def claims_resource_version(self) -> str:
        """A resourceVersion to start a claim watch from: a ``limit=1`` list, not the cluster's claims."""
        with mapped():
            page = self._call(
                "list resourceclaims (limit=1)", "GET", f"{RESOURCE}/resourceclaims", query={"limit": 1}
            )
        rv = str((page.get("metadata") or {}).get("resourceVersion") or "")
        if not rv:
            raise Ambiguous("list resourceclaims (limit=1): the answer carries no resourceVersion")
        return rv

    def watch_claims(
        self,
        *,
        resource_version: str,
        timeout_seconds: int,
        stop: threading.Event,
        skip: Callable[[bytes], bool] | None = None,
    ) -> Iterator[tuple[str, JSON]]:
        """Watch events of ResourceClaims in all namespaces (same contract as :meth:`watch_slices`).
        ``skip``: raw event lines the caller knows cannot matter to it, dropped undecoded (see
        :meth:`~dra_kubeletplugin.kubeapi.KubeClient._watch`)."""
        return _mapped_iter(
            self._watch(
                "watch resourceclaims",
                f"{RESOURCE}/resourceclaims",
                stop=stop,
                timeout_seconds=timeout_seconds,
                query={"resourceVersion": resource_version},
                skip=skip,
            )
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
        with mapped():
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
        with mapped():
            return self._list_all(
                "list resourceslices",
                f"{RESOURCE}/resourceslices",
                {"fieldSelector": f"spec.driver={driver}"},
            )

    def watch_driver_slices(
        self, driver: str, *, resource_version: str, timeout_seconds: int, stop: threading.Event
    ) -> Iterator[tuple[str, JSON]]:
        """Watch events of every ResourceSlice of ``driver`` (same contract as :meth:`watch_slices`)."""
        return _mapped_iter(
            self._watch(
                "watch resourceslices",
                f"{RESOURCE}/resourceslices",
                stop=stop,
                timeout_seconds=timeout_seconds,
                query={"fieldSelector": f"spec.driver={driver}", "resourceVersion": resource_version},
            )
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
        with mapped():
            return self._call(
                f"create event {reason}", "POST", f"{CORE}/namespaces/{segment(namespace)}/events", body=body
            )

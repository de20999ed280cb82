"""The only module that talks to the Kubernetes API, for the whole project.

Uses the official ``kubernetes`` client (37.x) for configuration, authentication and the
connection pool, and deals in plain dicts: bodies go out as wire JSON (camelCase) and responses
come back JSON-decoded, so callers never depend on pydantic model quirks (``StrictStr``
quantities, ``extra="forbid"``, snake_case ``to_dict``) and fields this client does not know
pass through unchanged. Requests are made by REST path through ``ApiClient.param_serialize`` and
``call_api`` (see :class:`Kube`); the generated API classes are never built.

Every ``kubernetes`` / ``urllib3`` / socket exception is translated here, with
``raise ... from exc``, into :mod:`dra_driver.errors` (see :func:`translate`)::

    FlexNPUError
    ├── InvalidInput            400, 422, other 4xx, bad kubeconfig
    │   └── NotFound            404 with a Status body whose reason is NotFound
    └── Unavailable             retry: 500, 502, 504, 429
        ├── Unreachable         connection refused / reset, timeouts, 503
        ├── Ambiguous           an answer that proves nothing: a 404 that is not a NotFound
        │                       Status, an empty, malformed or foreign-kind 200
        ├── Conflict            409 (also failed delete preconditions)
        ├── Gone                410: the resource version is too old; relist
        └── Forbidden           401, 403 (RBAC may be fixed while we retry)

Absence is proven, never assumed: :meth:`Kube.get_claim` raises :class:`NotFound` only for a
Status 404 that names the claim's kind and name, and returns only a ResourceClaim with the
asked-for name, namespace and a UID; every other answer is :class:`Ambiguous` (keep, retry).

Add new API calls here as methods (claims, events, taints); nothing else imports ``kubernetes``.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

from dra_driver.errors import ErrorCode, FlexNPUError, InvalidInput, Unavailable

JSON = dict[str, Any]

CORE = "/api/v1"
RESOURCE = "/apis/resource.k8s.io/v1"
DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds for one non-watch request (connect and read)."""


class NotFound(InvalidInput):
    """404 with a ``Status`` body of reason NotFound; ``kind``/``name``/``group`` from its details."""

    default_code = ErrorCode.INVALID_ARGUMENT

    def __init__(
        self, message: str, *, code: ErrorCode | None = None, details: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(message, code=code)
        details = details or {}
        self.kind = str(details.get("kind") or "")
        self.name = str(details.get("name") or "")
        self.group = str(details.get("group") or "")

    def proves(self, *, kind: str, name: str, group: str) -> bool:
        """Whether this 404 says that object ``group``/``kind`` ``name`` does not exist."""
        return self.kind == kind and self.name == name and self.group == group


class Unreachable(Unavailable):
    """The API server did not answer (connection refused or reset, timeout)."""


class Ambiguous(Unavailable):
    """An answer that proves nothing about the object; keep everything and ask again later."""


class Conflict(Unavailable):
    """409: a resourceVersion / UID precondition failed or the object exists; re-read and retry."""

    default_code = ErrorCode.API_CONFLICT


class Gone(Unavailable):
    """410: the watch or list resourceVersion is too old; relist."""


class Forbidden(Unavailable):
    """401/403: not allowed (yet); retry with backoff, RBAC may be fixed meanwhile."""


def translate(exc: BaseException, *, what: str) -> FlexNPUError:
    """The driver error for one client-library exception; ``what`` names the request."""
    if isinstance(exc, FlexNPUError):
        return exc
    import urllib3
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{what}: HTTP {status} {_status_message(exc)}".rstrip()
        if status == 0:
            return Unreachable(f"{what}: {exc.reason}")
        if status == 404:
            body = _status_body(exc)
            if body is None or body.get("reason") != "NotFound":
                return Ambiguous(f"{what}: HTTP 404 without a NotFound Status body: {_excerpt(exc.body)}")
            return NotFound(message, details=body.get("details") or {})
        if status == 409:
            return Conflict(message)
        if status == 410:
            return Gone(message)
        if status in (401, 403):
            return Forbidden(message)
        if status == 503:  # the server says it is not serving at all: asking again now is pointless
            return Unreachable(message)
        if status == 429 or status >= 500:
            return Unavailable(message)
        return InvalidInput(message)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return Unreachable(f"{what}: API server unreachable: {exc}")
    if isinstance(exc, ConfigException):
        return InvalidInput(f"{what}: {exc}", code=ErrorCode.INVALID_CONFIG, field="kubeconfig")
    if isinstance(exc, ValueError):  # undecodable JSON from the server
        return Ambiguous(f"{what}: bad response from the API server: {exc}")
    return FlexNPUError(f"{what}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def boundary(what: str) -> Iterator[None]:
    """Translate any client exception raised inside into a driver error."""
    try:
        yield
    except FlexNPUError:
        raise
    except Exception as exc:
        if not isinstance(exc, _client_errors()):
            raise
        raise translate(exc, what=what) from exc


def _client_errors() -> tuple[type[BaseException], ...]:
    """What :func:`boundary` translates (imported when an error happens, not at start-up)."""
    import urllib3
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    return (ApiException, urllib3.exceptions.HTTPError, OSError, ConfigException, ValueError)


class Kube:
    """REST access to the API server with dicts in and out.

    Usage::

        kube = Kube.from_config(cfg.kubeconfig)
        items, rv = kube.list_slices(driver="npu.flexnpu.io", node="node1")

    Requests go through the official ``ApiClient`` (its configuration, authentication, TLS and
    connection pool) by REST path, not through the generated ``CoreV1Api``/``ResourceV1Api``
    classes: building those imports some 300 pydantic models (about 1 s at start, see
    bench/bench_startup.py) that a node that deals in plain dicts never uses.

    **Parameters:** ``api_client`` (an official ``ApiClient``), ``request_timeout`` (seconds per
    non-watch request).
    """

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        connect: Callable[[], client.ApiClient] | None = None,
    ) -> None:
        if api_client is None and connect is None:
            raise ValueError("Kube needs an api_client or a connect function")
        self._api_client = api_client
        self._connect = connect
        self._connect_lock = threading.Lock()
        self.request_timeout = request_timeout

    @property
    def api_client(self) -> client.ApiClient:
        """The official ``ApiClient``; built on first use for :meth:`deferred` clients."""
        if self._api_client is None:
            with self._connect_lock:
                if self._api_client is None:
                    assert self._connect is not None
                    with boundary("load kubeconfig"):
                        self._api_client = self._connect()
        return self._api_client

    @classmethod
    def from_config(cls, kubeconfig: str | None) -> Kube:
        """From a kubeconfig file, or the in-cluster service account when ``kubeconfig`` is None."""
        kube = cls.deferred(kubeconfig)
        kube.connect()
        return kube

    @classmethod
    def deferred(cls, kubeconfig: str | None) -> Kube:
        """Like :meth:`from_config`, but ``kubernetes`` is imported and the config loaded on first use.

        The node process registers with the kubelet first and connects right after
        (:meth:`connect`): importing the client costs more than the rest of start-up.
        """
        return cls(connect=lambda: _load_client(kubeconfig))

    def connect(self) -> None:
        """Import the client and load the configuration now; raises InvalidInput on a bad kubeconfig."""
        _ = self.api_client

    @classmethod
    def offline(cls) -> Kube:
        """A client with no API server behind it: every call fails fast with :class:`Unavailable`."""
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = "http://127.0.0.1:1"  # nothing listens on port 1: connection refused
        configuration.retries = 0
        return cls(client.ApiClient(configuration), request_timeout=2.0)

    def close(self) -> None:
        if self._api_client is not None:
            self._api_client.close()  # type: ignore[no-untyped-call]

    # --- nodes --------------------------------------------------------------------------

    def get_node(self, name: str) -> JSON:
        return self._call(f"get node {name}", "GET", f"{CORE}/nodes/{_seg(name)}")

    # --- ResourceSlices ------------------------------------------------------------------

    def list_slices(self, *, driver: str, node: str) -> tuple[list[JSON], str]:
        """All slices of ``driver`` on ``node`` (paged), and the list's resourceVersion."""
        return self._list_all(
            "list resourceslices",
            f"{RESOURCE}/resourceslices",
            {"fieldSelector": _slice_selector(driver, node)},
        )

    def watch_slices(
        self,
        *,
        driver: str,
        node: str,
        resource_version: str,
        timeout_seconds: int,
        stop: threading.Event,
    ) -> Iterator[tuple[str, JSON]]:
        """Watch events ``(type, object)`` of ``driver``'s slices on ``node``.

        Types are ADDED, MODIFIED, DELETED and BOOKMARK (the object then holds only
        ``metadata.resourceVersion``). Ends when the server closes the watch (after
        ``timeout_seconds``) or soon after ``stop`` is set. Raises :class:`Gone` when the
        resource version is too old (410, as an HTTP status or an ERROR event).
        """
        return self._watch(
            "watch resourceslices",
            f"{RESOURCE}/resourceslices",
            stop=stop,
            timeout_seconds=timeout_seconds,
            query={"fieldSelector": _slice_selector(driver, node), "resourceVersion": resource_version},
        )

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

    def create_slice(self, body: JSON) -> JSON:
        return self._call("create resourceslice", "POST", f"{RESOURCE}/resourceslices", body=body)

    def update_slice(self, body: JSON) -> JSON:
        name = body["metadata"]["name"]
        return self._call(
            f"update resourceslice {name}", "PUT", f"{RESOURCE}/resourceslices/{_seg(name)}", body=body
        )

    def delete_slice(self, name: str, *, uid: str, resource_version: str) -> None:
        """Delete with uid + resourceVersion preconditions; a slice already gone is fine."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        with contextlib.suppress(NotFound):
            self._call(
                f"delete resourceslice {name}", "DELETE", f"{RESOURCE}/resourceslices/{_seg(name)}", body=body
            )

    # --- ResourceClaims ------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> JSON:
        """The claim, proven: :class:`NotFound` only when the server says this claim does not exist.

        A 404 about another kind or name, and a 200 that is not this ResourceClaim with a UID, raise
        :class:`Ambiguous`; :class:`Unreachable` and the other :class:`Unavailable` errors as usual.
        """
        what = f"get resourceclaim {namespace}/{name}"
        try:
            claim = self._call(what, "GET", _claim_path(namespace, name))
        except NotFound as err:
            if not err.proves(kind="resourceclaims", name=name, group="resource.k8s.io"):
                raise Ambiguous(
                    f"{what}: HTTP 404 about {err.group or 'core'}/{err.kind} {err.name!r}, not this claim"
                ) from err
            raise NotFound(
                err.message,
                code=ErrorCode.CLAIM_NOT_FOUND,
                details={"kind": err.kind, "name": err.name, "group": err.group},
            ) from err
        problem = claim_answer_problem(claim, namespace=namespace, name=name)
        if problem:
            raise Ambiguous(f"{what}: {problem}")
        return claim

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
            _claim_path(namespace, name) + "/status",
            query=query,
            body=patch,
            content_type=content_type,
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
            f"create event {reason}", "POST", f"{CORE}/namespaces/{_seg(namespace)}/events", body=body
        )

    # --- plumbing ------------------------------------------------------------------------

    def _list_all(self, what: str, path: str, query: JSON) -> tuple[list[JSON], str]:
        items: list[JSON] = []
        token: str | None = None
        while True:
            page = self._call(
                what, "GET", path, query={**query, "limit": 500, **({"continue": token} if token else {})}
            )
            items += page.get("items") or []
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, str(meta.get("resourceVersion", ""))

    def _watch(
        self,
        what: str,
        path: str,
        *,
        stop: threading.Event,
        timeout_seconds: int,
        query: JSON,
    ) -> Iterator[tuple[str, JSON]]:
        resp = self._open(
            what,
            "GET",
            path,
            query={
                **query,
                "watch": "true",
                "allowWatchBookmarks": "true",
                "timeoutSeconds": timeout_seconds,
            },
            timeout=(self.request_timeout, timeout_seconds + self.request_timeout),
        )
        done = threading.Event()
        interrupter = threading.Thread(
            target=_interrupt_on_stop, args=(resp, stop, done), name="watch-interrupter", daemon=True
        )
        interrupter.start()
        try:
            with boundary(what):
                for line in resp:
                    if stop.is_set():
                        return
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = str(event.get("type", "")), event.get("object") or {}
                    if kind == "ERROR":
                        from kubernetes.client.exceptions import ApiException

                        code = int(obj.get("code") or 0)
                        err = ApiException(status=code, reason=obj.get("reason"))
                        err.body = json.dumps(obj)
                        raise translate(err, what=what) from None
                    yield kind, obj
        except FlexNPUError:
            if stop.is_set():
                return
            raise
        finally:
            done.set()
            resp.release_conn()

    def _call(
        self,
        what: str,
        method: str | Callable[..., Any],
        path: Any = None,
        *args: Any,
        query: JSON | None = None,
        body: Any = None,
        content_type: str = "application/json",
        **kwargs: Any,
    ) -> JSON:
        """One request; the decoded JSON object of a 2xx answer.

        ``method`` is an HTTP verb and ``path`` a REST path. (A generated API method, with its
        arguments after it, still works, for code written against the typed classes; it builds
        them on first use, see :attr:`_resource`.)
        """
        with boundary(what):
            if callable(method):
                resp = self._open_typed(
                    method, *(() if path is None else (path,)), *args, body=body, **kwargs
                )
            else:
                resp = self._open(what, method, str(path), query=query, body=body, content_type=content_type)
            try:
                data = resp.data
            finally:
                resp.release_conn()
            decoded = json.loads(data) if data else {}
            if not isinstance(decoded, dict):
                raise ValueError(f"expected a JSON object, got {type(decoded).__name__}")
            return decoded

    @property
    def _core(self) -> Any:
        """The generated ``CoreV1Api``, built on first use (slow: prefer REST paths with :meth:`_call`)."""
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    @property
    def _resource(self) -> Any:
        """The generated ``ResourceV1Api``, built on first use (slow: prefer REST paths)."""
        from kubernetes import client

        return client.ResourceV1Api(self.api_client)

    def _open_typed(self, method: Callable[..., Any], *args: Any, body: Any = None, **kwargs: Any) -> Any:
        """Call a generated API method without its pydantic validation; the raw urllib3 response."""
        function = getattr(method, "raw_function", None)
        owner = getattr(method, "__self__", None)
        call = (lambda *a, **k: function(owner, *a, **k)) if function and owner else method
        if body is not None:
            kwargs["body"] = body
        return call(*args, _preload_content=False, _request_timeout=self.request_timeout, **kwargs)  # type: ignore[no-untyped-call]

    def _open(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: JSON | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        """Send one request through the ApiClient; the raw urllib3 response of a 2xx answer."""
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        with boundary(what):
            request = self.api_client.param_serialize(
                method,
                path,
                query_params=[(k, v) for k, v in (query or {}).items() if v not in (None, "")],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            resp = self.api_client.call_api(
                *request, _request_timeout=timeout if timeout is not None else self.request_timeout
            )
            if not 200 <= resp.status <= 299:
                from kubernetes.client.exceptions import ApiException

                resp.read()  # type: ignore[no-untyped-call]
                raise ApiException.from_response(http_resp=resp, body=None, data=None)
            return resp.response


def claim_answer_problem(claim: Mapping[str, Any], *, namespace: str, name: str) -> str | None:
    """Why a 200 answer to a claim GET is not that claim (None: it is). Pure."""
    if not claim:
        return "HTTP 200 with an empty body or an empty object"
    if claim.get("kind") != "ResourceClaim" or not str(claim.get("apiVersion", "")).startswith(
        "resource.k8s.io/"
    ):
        return f"HTTP 200 with a {_excerpt(claim.get('apiVersion'))} {_excerpt(claim.get('kind'))}, not a ResourceClaim"
    meta = claim.get("metadata")
    if not isinstance(meta, Mapping):
        return "HTTP 200 with a ResourceClaim without metadata"
    uid = meta.get("uid")
    if not isinstance(uid, str) or not uid:
        return "HTTP 200 with a ResourceClaim without a UID"
    if meta.get("name") != name or meta.get("namespace") != namespace:
        return f"HTTP 200 with ResourceClaim {_excerpt(meta.get('namespace'))}/{_excerpt(meta.get('name'))}"
    return None


def _load_client(kubeconfig: str | None) -> client.ApiClient:
    from kubernetes import client, config

    if kubeconfig:
        api_client: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api_client
    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    return client.ApiClient(configuration)


def _seg(value: str) -> str:
    """One path segment, percent-encoded (names come from the API, never trusted as paths)."""
    return urllib.parse.quote(value, safe="")


def _claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE}/namespaces/{_seg(namespace)}/resourceclaims/{_seg(name)}"


def _slice_selector(driver: str, node: str) -> str:
    return f"spec.driver={driver},spec.nodeName={node}"


def _status_body(exc: ApiException) -> JSON | None:
    """The ``Status`` object of an error answer, or None when the body is not one."""
    try:
        body = json.loads(exc.body or "")
    except (ValueError, TypeError):
        return None
    if not isinstance(body, dict) or body.get("kind") != "Status" or body.get("apiVersion") != "v1":
        return None
    return body


def _excerpt(value: object, limit: int = 80) -> str:
    """At most ``limit`` characters of a value from the server, for error messages."""
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "…"


def _status_message(exc: ApiException) -> str:
    try:
        status = json.loads(exc.body or "")
        return str(status.get("message") or exc.reason or "")
    except (ValueError, AttributeError):
        return str(exc.reason or "")


def _interrupt_on_stop(resp: Any, stop: threading.Event, done: threading.Event) -> None:
    """Unblock a watch read when ``stop`` is set (``HTTPResponse.shutdown``, urllib3 >= 2.3)."""
    while not done.is_set():
        if stop.wait(1.0):  # a wake-up a second per open watch, not five
            with contextlib.suppress(Exception):
                resp.shutdown()
            return

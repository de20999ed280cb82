"""REST access to the Kubernetes API for the helper (and for a driver that builds on it): dicts in and out.

Uses the official ``kubernetes`` client (37.x) only for configuration, authentication and the
connection pool; requests go by REST path through ``ApiClient.param_serialize`` and ``call_api``
(see :class:`KubeClient`), bodies go out as wire JSON and come back JSON-decoded, so no pydantic
model is built and fields the client does not know pass through unchanged.

Every ``kubernetes`` / ``urllib3`` / socket exception is translated here, with ``raise ... from exc``,
into the classes of :mod:`dra_kubeletplugin.errors`, and only those (a driver maps them to its own
errors at its own boundary, once)::

    400, 422, other 4xx, bad kubeconfig        Rejected (BadKubeconfig for a kubeconfig)
    404 with a NotFound Status                  NotFound (kind, name, group from its details;
                                                ClaimNotFound from get_claim)
    404 otherwise, an empty/foreign 200         Ambiguous
    409 / 410 / 401, 403 / 503 and no answer    Conflict / Gone / Forbidden / Unreachable
    429, other 5xx                              ApiUnavailable

Absence is proven, never assumed: :meth:`KubeClient.get_claim` raises ``NotFound`` only for a Status
404 that names the claim's kind and name, and returns only a ResourceClaim with the asked-for name,
namespace and a UID; every other answer is ``Ambiguous`` (keep, retry). This module imports
nothing of any driver.
"""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Self

from dra_kubeletplugin import errors

if TYPE_CHECKING:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

__all__ = [
    "CORE",
    "RESOURCE",
    "KubeClient",
    "boundary",
    "claim_answer_problem",
    "claim_path",
    "segment",
    "translate",
]

JSON = dict[str, Any]

CORE = "/api/v1"
RESOURCE = "/apis/resource.k8s.io/v1"
DEFAULT_REQUEST_TIMEOUT = 30.0
"""Seconds for one non-watch request (connect and read)."""


def translate(exc: BaseException, *, what: str) -> Exception:
    """The helper error for one client-library exception; ``what`` names the request."""
    if isinstance(exc, errors.PluginError):
        return exc
    import urllib3
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        message = f"{what}: HTTP {status} {_status_message(exc)}".rstrip()
        if status == 0:
            return errors.Unreachable(f"{what}: {exc.reason}")
        if status == 404:
            body = _status_body(exc)
            if body is None or body.get("reason") != "NotFound":
                return errors.Ambiguous(
                    f"{what}: HTTP 404 without a NotFound Status body: {_excerpt(exc.body)}"
                )
            err = errors.NotFound(message)
            err.set_details(dict(body.get("details") or {}))
            return err
        if status == 409:
            return errors.Conflict(message)
        if status == 410:
            return errors.Gone(message)
        if status in (401, 403):
            return errors.Forbidden(message)
        if status == 503:  # the server says it is not serving at all: asking again now is pointless
            return errors.Unreachable(message)
        if status == 429 or status >= 500:
            return errors.ApiUnavailable(message)
        return errors.Rejected(message)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return errors.Unreachable(f"{what}: API server unreachable: {exc}")
    if isinstance(exc, ConfigException):
        return errors.BadKubeconfig(f"{what}: {exc}")
    if isinstance(exc, ValueError):  # undecodable JSON from the server
        return errors.Ambiguous(f"{what}: bad response from the API server: {exc}")
    return errors.Rejected(f"{what}: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def boundary(what: str) -> Iterator[None]:
    """Translate any client exception raised inside into a helper error."""
    try:
        yield
    except errors.PluginError:
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


class KubeClient:
    """REST access to the API server with dicts in and out: what the helper calls.

    Usage::

        kube = KubeClient.from_config(None)          # in-cluster; or a kubeconfig path
        claim = kube.get_claim("ns", "claim-a")
        items, rv = kube.list_slices(driver="gpu.example.com", node="node1")

    Requests go through the official ``ApiClient`` (its configuration, authentication, TLS and
    connection pool) by REST path, not through the generated ``CoreV1Api``/``ResourceV1Api``
    classes: building those imports some 300 pydantic models (about 1 s at start) that code dealing
    in plain dicts never uses. Subclass it for more calls (``_call``, ``_list_all``, ``_watch``); it
    raises the helper's errors only.

    **Parameters:** ``api_client`` (an official ``ApiClient``), ``request_timeout`` (seconds per
    non-watch request), ``connect`` (builds the ``ApiClient`` on first use instead).
    """

    def __init__(
        self,
        api_client: client.ApiClient | None = None,
        *,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        connect: Callable[[], client.ApiClient] | None = None,
    ) -> None:
        if api_client is None and connect is None:
            raise ValueError("KubeClient needs an api_client or a connect function")
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
    def from_config(cls, kubeconfig: str | None) -> Self:
        """From a kubeconfig file, or the in-cluster service account when ``kubeconfig`` is None."""
        kube = cls.deferred(kubeconfig)
        kube.connect()
        return kube

    @classmethod
    def deferred(cls, kubeconfig: str | None) -> Self:
        """Like :meth:`from_config`, but ``kubernetes`` is imported and the config loaded on first use.

        A kubelet plugin registers with the kubelet first and connects right after
        (:meth:`connect`): importing the client costs more than the rest of start-up.
        """
        return cls(connect=lambda: _load_client(kubeconfig))

    def connect(self) -> None:
        """Import the client and load the configuration now; raises ``BadKubeconfig`` on a bad kubeconfig."""
        _ = self.api_client

    @classmethod
    def offline(cls) -> Self:
        """A client with no API server behind it: every call fails fast with ``Unreachable``."""
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
        return self._call(f"get node {name}", "GET", f"{CORE}/nodes/{segment(name)}")

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
        ``timeout_seconds``) or soon after ``stop`` is set. Raises ``Gone`` when the resource
        version is too old (410, as an HTTP status or an ERROR event).
        """
        return self._watch(
            "watch resourceslices",
            f"{RESOURCE}/resourceslices",
            stop=stop,
            timeout_seconds=timeout_seconds,
            query={"fieldSelector": _slice_selector(driver, node), "resourceVersion": resource_version},
        )

    def create_slice(self, body: JSON) -> JSON:
        return self._call("create resourceslice", "POST", f"{RESOURCE}/resourceslices", body=body)

    def update_slice(self, body: JSON) -> JSON:
        name = body["metadata"]["name"]
        return self._call(
            f"update resourceslice {name}", "PUT", f"{RESOURCE}/resourceslices/{segment(name)}", body=body
        )

    def delete_slice(self, name: str, *, uid: str, resource_version: str) -> None:
        """Delete with uid + resourceVersion preconditions; a slice already gone is fine."""
        body = {"preconditions": {"uid": uid, "resourceVersion": resource_version}}
        with contextlib.suppress(errors.NotFound):
            self._call(
                f"delete resourceslice {name}",
                "DELETE",
                f"{RESOURCE}/resourceslices/{segment(name)}",
                body=body,
            )

    # --- ResourceClaims ------------------------------------------------------------------

    def get_claim(self, namespace: str, name: str) -> JSON:
        """The claim, proven: ``ClaimNotFound`` only when the server says this claim does not exist.

        A 404 about another kind or name, and a 200 that is not this ResourceClaim with a UID, raise
        ``Ambiguous``; ``Unreachable`` and the other ``ApiUnavailable`` errors as usual.
        """
        what = f"get resourceclaim {namespace}/{name}"
        try:
            claim = self._call(what, "GET", claim_path(namespace, name))
        except errors.NotFound as err:
            if not err.proves(kind="resourceclaims", name=name, group="resource.k8s.io"):
                raise errors.Ambiguous(
                    f"{what}: HTTP 404 about {err.group or 'core'}/{err.kind} {err.name!r}, not this claim"
                ) from err
            proven = errors.ClaimNotFound(_message(err))
            proven.set_details({"kind": err.kind, "name": err.name, "group": err.group})
            raise proven from err
        problem = claim_answer_problem(claim, namespace=namespace, name=name)
        if problem:
            raise errors.Ambiguous(f"{what}: {problem}")
        return claim

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
        skip: Callable[[bytes], bool] | None = None,
    ) -> Iterator[tuple[str, JSON]]:
        """Events ``(type, object)`` of one watch request, decoded line by line.

        ``skip(line)``, when given, is asked about each raw event line before it is decoded: True
        means the caller knows the event cannot matter to it (it must answer False for anything it
        is not sure of), and the line is dropped undecoded. So that the caller can resume from the
        newest version all the same, a stream that ends normally after skipped lines yields one
        last ``BOOKMARK`` carrying the resourceVersion of the last line skipped.
        """
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
                skipped = b""  # the last line skipped since the last event yielded
                for line in resp:
                    if stop.is_set():
                        return
                    if not line.strip():
                        continue
                    if skip is not None and skip(line):
                        skipped = line
                        continue
                    skipped = b""
                    event = json.loads(line)
                    kind, obj = str(event.get("type", "")), event.get("object") or {}
                    if kind == "ERROR":
                        from kubernetes.client.exceptions import ApiException

                        code = int(obj.get("code") or 0)
                        err = ApiException(status=code, reason=obj.get("reason"))
                        err.body = json.dumps(obj)
                        raise translate(err, what=what) from None
                    yield kind, obj
                if skipped and not stop.is_set() and (rv := _resource_version(skipped)):
                    yield "BOOKMARK", {"metadata": {"resourceVersion": rv}}
        except errors.PluginError:
            if stop.is_set():
                return
            raise
        finally:
            done.set()
            resp.release_conn()

    def _call(
        self,
        what: str,
        method: str,
        path: str,
        *,
        query: JSON | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> JSON:
        """One request (``method`` an HTTP verb, ``path`` a REST path); the decoded JSON object of a 2xx answer."""
        with boundary(what):
            resp = self._open(what, method, path, query=query, body=body, content_type=content_type)
            try:
                data = resp.data
            finally:
                resp.release_conn()
            decoded = json.loads(data) if data else {}
            if not isinstance(decoded, dict):
                raise ValueError(f"expected a JSON object, got {type(decoded).__name__}")
            return decoded

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


def segment(value: str) -> str:
    """One path segment, percent-encoded (names come from the API, never trusted as paths)."""
    return urllib.parse.quote(value, safe="")


def _message(err: BaseException) -> str:
    """The message of an error without the decorations a driver's class may add to ``str``."""
    return str(getattr(err, "message", "") or err)


def claim_path(namespace: str, name: str) -> str:
    return f"{RESOURCE}/namespaces/{segment(namespace)}/resourceclaims/{segment(name)}"


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


def _resource_version(line: bytes) -> str:
    """``object.metadata.resourceVersion`` of a raw watch event line; "" when it has none."""
    try:
        event = json.loads(line)
        version = event["object"]["metadata"]["resourceVersion"]
    except (ValueError, TypeError, KeyError):
        return ""
    return version if isinstance(version, str) else ""


def _interrupt_on_stop(resp: Any, stop: threading.Event, done: threading.Event) -> None:
    """Unblock a watch read when ``stop`` is set (``HTTPResponse.shutdown``, urllib3 >= 2.3)."""
    while not done.is_set():
        if stop.wait(1.0):  # a wake-up a second per open watch, not five
            with contextlib.suppress(Exception):
                resp.shutdown()
            return

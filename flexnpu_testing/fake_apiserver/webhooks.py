"""Validating admission webhooks, called the way kube-apiserver calls them.

For a CREATE or UPDATE of an object, every ``ValidatingWebhookConfiguration`` in the store is
consulted: a webhook whose ``rules`` match (group, version, operation, resource) and whose
``matchConditions`` (CEL, evaluated with ``cel-python``) all hold gets an ``admission.k8s.io/v1``
``AdmissionReview`` POSTed over HTTPS, verified against its ``caBundle`` for the server name
``<service>.<namespace>.svc`` (or its ``url``'s host), within ``timeoutSeconds``. A denial answers
the client with the webhook's status code and ``admission webhook "<name>" denied the request:
<message>``; a webhook that cannot be called fails the write when ``failurePolicy: Fail`` and is
skipped when ``Ignore``.

A Service has no endpoints here: :meth:`Webhooks.route_service` (a test hook) says which local
address serves it. ``namespaceSelector``/``objectSelector`` and ``matchPolicy`` are not evaluated;
``scope`` is.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import ssl
import uuid
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from flexnpu_testing.fake_apiserver.resources import APIError, Obj, Resource

KEY = "validatingwebhookconfigurations.admissionregistration.k8s.io"


class Webhooks:
    """The admission step of the fake's writes: ``check(...)`` raises :class:`APIError` on a denial."""

    def __init__(self, configurations: Callable[[], list[Obj]]) -> None:
        self._configurations = configurations
        self._routes: dict[tuple[str, str, int], tuple[str, int]] = {}

    def route_service(self, namespace: str, name: str, port: int, *, to: tuple[str, int]) -> None:
        """Test hook: the Service ``namespace/name:port`` is served at the local address ``to``."""
        self._routes[(namespace, name, port)] = to

    def check(self, res: Resource, operation: str, obj: Obj, old: Obj | None, *, user: str = "admin") -> None:
        for config in self._configurations():
            for hook in config.get("webhooks") or []:
                if _matches(hook, res, operation) and _conditions_hold(hook, res, operation, obj, old):
                    self._call(hook, res, operation, obj, old, user=user)

    def _call(
        self, hook: Obj, res: Resource, operation: str, obj: Obj, old: Obj | None, *, user: str
    ) -> None:
        meta = obj.get("metadata") or {}
        request_uid = str(uuid.uuid4())
        review: Obj = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": request_uid,
                "kind": {"group": res.group, "version": res.version, "kind": res.kind},
                "resource": {"group": res.group, "version": res.version, "resource": res.plural},
                "requestKind": {"group": res.group, "version": res.version, "kind": res.kind},
                "requestResource": {"group": res.group, "version": res.version, "resource": res.plural},
                "name": meta.get("name", ""),
                "namespace": meta.get("namespace", ""),
                "operation": operation,
                "userInfo": {"username": user},
                "object": obj,
                "oldObject": old,
                "dryRun": False,
                "options": {"apiVersion": "meta.k8s.io/v1", "kind": f"{operation.title()}Options"},
            },
        }
        name = hook["name"]
        try:
            answer = self._post(hook, review)
            response = answer["response"]
            if response.get("uid") != request_uid:
                raise ValueError(f"expected response.uid={request_uid!r}, got {response.get('uid')!r}")
        except (OSError, ValueError, KeyError, TypeError, http.client.HTTPException) as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return
            raise APIError(
                500, "InternalError", f'Internal error occurred: failed calling webhook "{name}": {exc}'
            ) from exc
        if response.get("allowed") is True:
            return
        status = response.get("status") or {}
        code = int(status.get("code") or 403)
        message = (
            f'admission webhook "{name}" denied the request: {status.get("message", "without explanation")}'
        )
        raise APIError(code, status.get("reason") or "Forbidden", message)

    def _post(self, hook: Obj, review: Obj) -> Obj:
        client = hook.get("clientConfig") or {}
        if client.get("url"):
            url = urlsplit(client["url"])
            host, port, server_name, path = url.hostname or "", url.port or 443, url.hostname or "", url.path
        else:
            svc = client["service"]
            port = int(svc.get("port", 443))
            route = self._routes.get((svc["namespace"], svc["name"], port))
            if route is None:
                raise OSError(f'no endpoints available for service "{svc["namespace"]}/{svc["name"]}"')
            host, port = route
            server_name, path = f"{svc['name']}.{svc['namespace']}.svc", svc.get("path", "/")
        context = ssl.create_default_context(cadata=base64.b64decode(client["caBundle"]).decode())
        conn = _Connection(
            host,
            port,
            server_name=server_name,
            context=context,
            timeout=float(hook.get("timeoutSeconds", 10)),
        )
        try:
            body = json.dumps(review).encode()
            conn.request("POST", path or "/", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise ValueError(f"the webhook answered {resp.status}: {data[:200]!r}")
        answer = json.loads(data)
        if not isinstance(answer, Mapping) or answer.get("kind") != "AdmissionReview":
            raise ValueError("the webhook's answer is not an AdmissionReview")
        return dict(answer)


class _Connection(http.client.HTTPSConnection):
    """HTTPS to an address, verifying the certificate for another name (the Service's DNS name)."""

    def __init__(
        self, host: str, port: int, *, server_name: str, context: ssl.SSLContext, timeout: float
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name
        self._tls = context

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(raw, server_hostname=self._server_name)


def _matches(hook: Obj, res: Resource, operation: str) -> bool:
    for rule in hook.get("rules") or []:
        if (
            _in(res.group, rule.get("apiGroups"))
            and _in(res.version, rule.get("apiVersions"))
            and _in(operation, rule.get("operations"))
            and _in(res.plural, rule.get("resources"))
            and rule.get("scope", "*") in ("*", "Namespaced" if res.namespaced else "Cluster")
        ):
            return True
    return False


def _in(value: str, allowed: Any) -> bool:
    return bool(allowed) and ("*" in allowed or value in allowed)


def _conditions_hold(hook: Obj, res: Resource, operation: str, obj: Obj, old: Obj | None) -> bool:
    conditions = hook.get("matchConditions") or []
    if not conditions:
        return True
    import celpy  # the test extra cel-python: CEL as the API server evaluates it
    from celpy.adapter import json_to_cel

    env = celpy.Environment()
    activation = {
        "object": json_to_cel(obj),
        "oldObject": json_to_cel(old),
        "request": json_to_cel(
            {
                "operation": operation,
                "resource": {"group": res.group, "version": res.version, "resource": res.plural},
            }
        ),
    }
    for cond in conditions:
        result = env.program(env.compile(cond["expression"])).evaluate(activation)
        if isinstance(result, Exception) or not isinstance(result, celpy.celtypes.BoolType):
            if hook.get("failurePolicy", "Fail") == "Ignore":
                return False
            raise APIError(
                500, "InternalError", f'matchCondition {cond["name"]!r} of "{hook["name"]}": {result!r}'
            )
        if not result:
            return False
    return True

"""Bad VnpuConfigs are refused at ``kubectl apply``: the chart's webhook Deployment command and environment run as
a real ``flexnpu-dra webhook`` process with the chart's Helm-made certificate, the chart's
ValidatingWebhookConfiguration is stored in the fake API server, which calls the webhook as kube-apiserver does
(AdmissionReview v1 over HTTPS, verified against the caBundle for the Service's name, matchConditions in CEL)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.rest import ApiException

from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.waiting import wait_for
from tests.helmchart import RELEASE, render_chart

NS = "ml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Webhook:
    def __init__(self, docs: list[dict[str, Any]], tmp: Path) -> None:
        by_kind = {
            d["kind"]: d for d in docs if d["metadata"]["name"].endswith("-webhook") or d["kind"] == "Secret"
        }
        self.secret, self.config = by_kind["Secret"], by_kind["ValidatingWebhookConfiguration"]
        deploy = by_kind["Deployment"]
        (self.container,) = deploy["spec"]["template"]["spec"]["containers"]
        self.ca = base64.b64decode(self.secret["data"]["ca.crt"]).decode()
        self.tmp = tmp
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        tls = self.tmp / "tls"
        tls.mkdir(exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            (tls / name).write_bytes(base64.b64decode(self.secret["data"][name]))
        env = {e["name"]: e["value"] for e in self.container["env"]}
        env = {k: v.replace("/etc/flexnpu/webhook-tls", str(tls)) for k, v in env.items()}
        env |= {"FLEXNPU_WEBHOOK_PORT": str(self.port), "FLEXNPU_WEBHOOK_HOST": "127.0.0.1"}
        command = self.container["command"]
        assert command == ["flexnpu-dra", "webhook"]
        exe = Path(sys.executable).parent / command[0]
        self.proc = subprocess.Popen(
            [str(exe), *command[1:]], env={**os.environ, **env}, start_new_session=True
        )
        wait_for(lambda: self.get("/readyz") == 200, what="the webhook ready", timeout=30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        self.proc = None

    def _conn(self) -> http.client.HTTPSConnection:
        ctx = ssl.create_default_context(cadata=self.ca)
        ctx.check_hostname = False  # the certificate names the Service; this is the readiness probe's view
        return http.client.HTTPSConnection("127.0.0.1", self.port, timeout=5, context=ctx)

    def get(self, path: str) -> int:
        conn = self._conn()
        try:
            conn.request("GET", path)
            return conn.getresponse().status
        except OSError:
            return -1
        finally:
            conn.close()

    def post(self, body: bytes) -> tuple[int, str]:
        conn = self._conn()
        try:
            conn.request("POST", "/validate", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            return resp.status, resp.read().decode()
        finally:
            conn.close()


@pytest.fixture
def cluster(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[tuple[FakeAPIServer, k8s.ApiClient, Webhook]]:
    """The chart's webhook behind a fake API server; chart values by indirect parametrization."""
    webhook = Webhook(render_chart(getattr(request, "param", None)), tmp_path)
    webhook.start()
    with FakeAPIServer() as srv:
        api = srv.api_client()
        k8s.AdmissionregistrationV1Api(api).create_validating_webhook_configuration(webhook.config)
        svc = webhook.config["webhooks"][0]["clientConfig"]["service"]
        assert svc["namespace"] == RELEASE["Namespace"]
        srv.route_service(svc["namespace"], svc["name"], svc["port"], to=("127.0.0.1", webhook.port))
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": NS}})
        try:
            yield srv, api, webhook
        finally:
            webhook.stop()


def claim(name: str, params: Any, *, driver: str = "npu.flexnpu.io", memory: str = "256Mi") -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "vnpu",
                        "exactly": {
                            "deviceClassName": "vnpu.flexnpu.io",
                            "capacity": {"requests": {"memory": memory, "compute": "20"}},
                        },
                    }
                ],
                "config": [{"opaque": {"driver": driver, "parameters": params}}],
            }
        },
    }


def vnpu(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", **fields}


def status_message(err: ApiException) -> str:
    return str(json.loads(err.body)["message"])


def refused(api: k8s.ApiClient, body: dict[str, Any], *, template: bool = False) -> ApiException:
    res = k8s.ResourceV1Api(api)
    with pytest.raises(ApiException) as err:
        if template:
            res.create_namespaced_resource_claim_template(NS, body)
        else:
            res.create_namespaced_resource_claim(NS, body)
    return err.value


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        pytest.param(vnpu(polcy="fixed"), "parameters.polcy", "unknown field 'polcy'", id="misspelled-field"),
        pytest.param(
            vnpu(policy="greedy"), "parameters.policy", "unknown value 'greedy'", id="unknown-policy"
        ),
        pytest.param(vnpu(vnpus=3), "capacity.requests.memory", "does not divide into 3 vNPUs", id="vnpus"),
        pytest.param(vnpu(hostMemory="1Pi"), "parameters.hostMemory", "must be 1Mi..1Ti", id="host-memory"),
        pytest.param(  # issue 25 class 2: the tenant chose its own host-memory bound
            vnpu(hostMemory="1Ti"),
            "parameters.hostMemory",
            "asks for '1Ti' of host memory; the most is 512Mi for a share of 256Mi",
            id="host-memory-over-the-nodes-bound",
        ),
        pytest.param(
            vnpu(policy="fixed"),
            "parameters.policy",
            "(the DeviceClass vnpu-fixed.flexnpu.io)",
            id="policy-not-the-classes",
        ),
    ],
)
def test_bad_configs_are_refused_at_apply(
    cluster: tuple[FakeAPIServer, k8s.ApiClient, Webhook], params: dict[str, Any], field: str, message: str
) -> None:
    _srv, api, _hook = cluster
    err = refused(api, claim("bad", params))
    assert err.status == 422, err.body
    assert (
        'admission webhook "vnpuconfig.npu.flexnpu.io" denied the request: ResourceClaim ml/bad: field'
        in status_message(err)
    )
    assert field in status_message(err) and message in status_message(err)
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "bad-t", "namespace": NS},
        "spec": {"spec": claim("x", params)["spec"]},
    }
    err = refused(api, template, template=True)
    assert err.status == 422 and "ResourceClaimTemplate ml/bad-t: field spec.spec.devices." in status_message(
        err
    )
    assert k8s.ResourceV1Api(api).list_namespaced_resource_claim(NS).items == []


def test_good_and_foreign_claims_are_stored(
    cluster: tuple[FakeAPIServer, k8s.ApiClient, Webhook],
) -> None:
    _srv, api, _hook = cluster
    res = k8s.ResourceV1Api(api)
    res.create_namespaced_resource_claim(NS, claim("good", vnpu(policy="elastic", vnpus=2)))
    res.create_namespaced_resource_claim(NS, claim("foreign", {"whatever": True}, driver="gpu.example.com"))
    assert {c.metadata.name for c in res.list_namespaced_resource_claim(NS).items} == {"good", "foreign"}


@pytest.mark.parametrize(
    "cluster", [pytest.param({"webhook": {"failurePolicy": "Fail"}}, id="failurePolicy-Fail")], indirect=True
)
def test_webhook_down_with_fail_refuses_only_this_drivers_claims(
    cluster: tuple[FakeAPIServer, k8s.ApiClient, Webhook],
) -> None:
    _srv, api, hook = cluster
    hook.stop()
    err = refused(api, claim("unchecked", vnpu(policy="fixed")))
    assert err.status == 500 and 'failed calling webhook "vnpuconfig.npu.flexnpu.io"' in status_message(err)
    # another driver's claim never reaches the webhook (matchConditions), so it does not wait for it
    k8s.ResourceV1Api(api).create_namespaced_resource_claim(
        NS, claim("foreign", {"x": 1}, driver="gpu.example.com")
    )


def test_webhook_down_by_default_lets_claims_through_for_prepare_to_check(
    cluster: tuple[FakeAPIServer, k8s.ApiClient, Webhook],
) -> None:
    """The chart's default failurePolicy is Ignore: a webhook that is not up yet (just installed) or down
    does not refuse good claims; prepare checks every config again."""
    _srv, api, hook = cluster
    assert hook.config["webhooks"][0]["failurePolicy"] == "Ignore"
    hook.stop()
    made = k8s.ResourceV1Api(api).create_namespaced_resource_claim(
        NS, claim("unchecked", vnpu(policy="fixed"))
    )
    assert made.metadata.name == "unchecked"


@pytest.mark.parametrize(
    ("body", "status"),
    [
        pytest.param(b"{not json", 400, id="not-json"),
        pytest.param(b'{"kind": "Pod"}', 400, id="not-a-review"),
        pytest.param(b'{"kind": "AdmissionReview", "request": {}}', 400, id="no-uid"),
    ],
)
def test_malformed_reviews_get_400_and_the_webhook_goes_on(
    cluster: tuple[FakeAPIServer, k8s.ApiClient, Webhook], body: bytes, status: int
) -> None:
    _srv, api, hook = cluster
    code, text = hook.post(body)
    assert code == status and "malformed AdmissionReview" in text
    assert refused(api, claim("bad", vnpu(polcy="x"))).status == 422


def test_idle_and_slow_connections_do_not_stop_the_webhook(
    cluster: tuple[FakeAPIServer, k8s.ApiClient, Webhook],
) -> None:
    """Issue 25 class 5: one idle TCP connection held the accept thread in its TLS handshake, so with
    the default Ignore bad claims were stored unchecked (with Fail, good ones were refused)."""
    _srv, api, hook = cluster
    idle = [socket.create_connection(("127.0.0.1", hook.port)) for _ in range(3)]
    slow = socket.create_connection(("127.0.0.1", hook.port))
    slow.sendall(b"\x16\x03\x01")  # the first bytes of a ClientHello, and then nothing
    try:
        err = refused(api, claim("bad", vnpu(polcy="x")))
        assert err.status == 422 and "unknown field 'polcy'" in status_message(err)
        assert hook.get("/readyz") == 200
        # the idle connections are closed at the handshake deadline, not held for ever
        for conn in idle:
            conn.settimeout(30)
            assert conn.recv(1) == b""
    finally:
        for conn in [*idle, slow]:
            conn.close()
    assert k8s.ResourceV1Api(api).list_namespaced_resource_claim(NS).items == []

"""Fixtures of the helper's own tests: a fake API server with real claims. No NPU code (``short_tmp``: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_kubeletplugin.claims import ClaimRef
from dra_kubeletplugin.kubeapi import KubeClient
from flexnpu_testing.fake_apiserver import FakeAPIServer

DRIVER = "gpu.example.com"
NODE = "node-a"
NAMESPACE = "ns"

ClaimMaker = Callable[..., ClaimRef]


@pytest.fixture
def api(tmp_path: Path) -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        core = client.CoreV1Api(srv.api_client())
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield srv


@pytest.fixture
def kubeconfig(api: FakeAPIServer, tmp_path: Path) -> Path:
    return api.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def kube(kubeconfig: Path) -> Iterator[KubeClient]:
    k = KubeClient.from_config(str(kubeconfig))
    yield k
    k.close()


def claim_body(
    name: str, *, devices: list[tuple[str, str]] | None, namespace: str = NAMESPACE
) -> dict[str, Any]:
    """A ResourceClaim; ``devices`` are (driver, device) results of its allocation (None: not allocated)."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "req", "exactly": {"deviceClassName": "example"}}]}},
    }
    if devices is not None:
        results = [{"request": "req", "driver": d, "pool": NODE, "device": dev} for d, dev in devices]
        body["status"] = {"allocation": {"devices": {"results": results}}}
    return body


@pytest.fixture
def make_claim(api: FakeAPIServer) -> ClaimMaker:
    """``make_claim(name, devices=[(driver, device)], namespace=...)`` stores a claim; its reference."""

    def make(
        name: str, *, devices: list[tuple[str, str]] | None = None, namespace: str = NAMESPACE
    ) -> ClaimRef:
        wanted = [(DRIVER, "dev-0")] if devices is None else devices
        stored = api.put_object(
            "resourceclaims", claim_body(name, devices=wanted if wanted else None, namespace=namespace)
        )
        return ClaimRef(namespace=namespace, uid=stored["metadata"]["uid"], name=name)

    return make

"""Extended-resource requests (KEP-5004) through the fake API server, the scheduler stand-in and a real node process.

A pod that asks ``resources.limits: {flexnpu.io/npu: N}`` gets N whole dies: the stand-in creates the special claim the
way kube-scheduler 1.36 does (flexnpu_testing/extended_resources.py), and the node prepares it like any other
claim. The whole-die DeviceClass is the one the Helm chart renders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from flexnpu_testing import extended_resources
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node
from tests.unit.test_manifests import chart_values, render_chart


def install_chart_classes(node: Node, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Replace the fixture's DeviceClasses with the chart's; returns the whole-die class."""
    res = node.resource
    for doc in render_chart(chart_values(overrides)):
        if doc["kind"] != "DeviceClass":
            continue
        try:
            res.delete_device_class(doc["metadata"]["name"])
        except ApiException as exc:
            if exc.status != 404:
                raise
        res.create_device_class(doc)
    raw = res.read_device_class("npu.flexnpu.io", _preload_content=False)
    whole: dict[str, Any] = json.loads(raw.data)
    return whole


def create_pod(node: Node, name: str, limits: dict[str, str], *, containers: int = 1) -> dict[str, Any]:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {"name": f"ctr{i}", "image": "busybox", "resources": {"limits": limits}}
                for i in range(containers)
            ]
        },
    }
    core: Any = node.api_core()
    raw = core.create_namespaced_pod(NAMESPACE, body, _preload_content=False)
    pod: dict[str, Any] = json.loads(raw.data)
    return pod


def read_pod(node: Node, name: str) -> dict[str, Any]:
    raw = node.api_core().read_namespaced_pod(name, NAMESPACE, _preload_content=False)
    pod: dict[str, Any] = json.loads(raw.data)
    return pod


def claims(node: Node) -> list[dict[str, Any]]:
    raw = node.resource.list_namespaced_resource_claim(NAMESPACE, _preload_content=False)
    items: list[dict[str, Any]] = json.loads(raw.data)["items"]
    return items


def davinci_paths(spec_path: Path) -> list[str]:
    spec = json.loads(spec_path.read_text())
    nodes = [d["path"] for dev in spec["devices"] for d in dev["containerEdits"].get("deviceNodes") or []]
    nodes += [d["path"] for d in spec.get("containerEdits", {}).get("deviceNodes") or []]
    return sorted(p for p in nodes if p.startswith("/dev/davinci") and p[len("/dev/davinci") :].isdigit())


def test_pod_gets_a_whole_die_through_the_special_claim(node: Node) -> None:
    whole = install_chart_classes(node)
    assert whole["spec"]["extendedResourceName"] == "flexnpu.io/npu"
    wait_for(node.devices, what="published devices")
    pod = create_pod(node, "trainer", {"flexnpu.io/npu": "1"})

    claim = node.scheduler.schedule_pod(NAMESPACE, "trainer", NODE)
    assert claim is not None
    meta = claim["metadata"]
    assert meta["name"].startswith("trainer-extended-resources-")
    assert len(meta["name"]) == len("trainer-extended-resources-") + 5
    assert meta["annotations"] == {extended_resources.CLAIM_ANNOTATION: "true"}
    (owner,) = meta["ownerReferences"]
    assert owner == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "trainer",
        "uid": pod["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    assert claim["spec"]["devices"]["requests"] == [
        {
            "name": "container-0-request-0",
            "exactly": {"deviceClassName": "npu.flexnpu.io", "allocationMode": "ExactCount", "count": 1},
        }
    ]
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "container-0-request-0" and result["device"].startswith("npu-")
    assert "shareID" not in result
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "trainer", "uid": pod["metadata"]["uid"]}
    ]
    status = read_pod(node, "trainer")["status"]["extendedResourceClaimStatus"]
    assert status == {
        "resourceClaimName": meta["name"],
        "requestMappings": [
            {
                "containerName": "ctr0",
                "resourceName": "flexnpu.io/npu",
                "requestName": "container-0-request-0",
            }
        ],
    }

    # The kubelet prepares the claim the pod status names, like any other claim.
    refs = extended_resources.pod_claim_refs(node.api.api_client(), NAMESPACE, "trainer")
    assert [(r.name, r.uid) for r in refs] == [(meta["name"], meta["uid"])]
    assert node.kubelet is not None
    res = node.kubelet.prepare(refs)[meta["uid"]]
    assert res.error == ""
    (dev,) = res.devices
    assert dev.device == result["device"] and dev.request_names == ("container-0-request-0",)
    (spec_path,) = [p for p in node.cdi_specs() if meta["uid"] in p.name]
    phy = result["device"].removeprefix("npu-")
    assert davinci_paths(spec_path) == [f"/dev/davinci{phy}"]
    for cdi_id in dev.cdi_device_ids:
        assert cdi_id.startswith("flexnpu.io/vnpu=")
    stored = next(c for c in claims(node) if c["metadata"]["uid"] == meta["uid"])
    (devstatus,) = stored["status"]["devices"]
    assert devstatus["driver"] == DRIVER and devstatus["device"] == result["device"]

    # Asking again gives the same claim, not a second one.
    again = node.scheduler.schedule_pod(NAMESPACE, "trainer", NODE)
    assert again is not None and again["metadata"]["uid"] == meta["uid"]
    assert len(claims(node)) == 1

    # Pod gone: the kubelet unprepares, the garbage collector deletes the claim the pod owned.
    assert node.kubelet.unprepare(refs) == {meta["uid"]: ""}
    assert not spec_path.exists()
    node.api_core().delete_namespaced_pod("trainer", NAMESPACE)
    assert claims(node) == []


def test_count_spreads_over_distinct_dies_and_refusal_leaves_no_claim(node: Node) -> None:
    install_chart_classes(node)
    wait_for(node.devices, what="published devices")
    create_pod(node, "two", {"flexnpu.io/npu": "2"})
    claim = node.scheduler.schedule_pod(NAMESPACE, "two", NODE)
    assert claim is not None
    devices = [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]]
    assert sorted(devices) == ["npu-0", "npu-1"]  # the A3 module's two dies
    refs = extended_resources.pod_claim_refs(node.api.api_client(), NAMESPACE, "two")
    assert node.kubelet is not None
    (res,) = node.kubelet.prepare(refs).values()
    assert res.error == "" and sorted(d.device for d in res.devices) == devices

    # Both dies are taken: a third pod stays pending, and no claim of it is left behind.
    create_pod(node, "late", {"flexnpu.io/npu": "1"})
    with pytest.raises(Unschedulable):
        node.scheduler.schedule_pod(NAMESPACE, "late", NODE)
    assert [c["metadata"]["name"] for c in claims(node)] == [claim["metadata"]["name"]]
    assert "extendedResourceClaimStatus" not in read_pod(node, "late")["status"]


def test_implicit_name_per_container_and_device_plugin_nodes(node: Node) -> None:
    install_chart_classes(node, {"deviceClasses.extendedResourceName": "huawei.com/Ascend910"})
    wait_for(node.devices, what="published devices")
    # Two containers asking the class's implicit name: one request per container.
    implicit = extended_resources.IMPLICIT_PREFIX + "npu.flexnpu.io"
    create_pod(node, "implicit", {implicit: "1"}, containers=2)
    claim = node.scheduler.schedule_pod(NAMESPACE, "implicit", NODE)
    assert claim is not None
    assert [r["name"] for r in claim["spec"]["devices"]["requests"]] == [
        "container-0-request-0",
        "container-1-request-0",
    ]
    mappings = read_pod(node, "implicit")["status"]["extendedResourceClaimStatus"]["requestMappings"]
    assert [(m["containerName"], m["resourceName"]) for m in mappings] == [
        ("ctr0", implicit),
        ("ctr1", implicit),
    ]
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len({r["device"] for r in results}) == 2

    # A node whose device plugin advertises the migrated name keeps serving it: no claim is made.
    core: Any = node.api_core()
    core.patch_node_status(NODE, {"status": {"allocatable": {"huawei.com/Ascend910": "8"}}})
    create_pod(node, "legacy", {"huawei.com/Ascend910": "1"})
    assert node.scheduler.schedule_pod(NAMESPACE, "legacy", NODE) is None
    # A pod with no extended resource at all gets no claim either.
    create_pod(node, "plain", {"cpu": "1"})
    assert node.scheduler.schedule_pod(NAMESPACE, "plain", NODE) is None
    assert len(claims(node)) == 1


@pytest.mark.parametrize(
    "bad", ["npu", "kubernetes.io/npu", "requests.flexnpu.io/npu", "flexnpu.io/bad name"]
)
def test_api_server_refuses_a_bad_extended_resource_name(api: FakeAPIServer, bad: str) -> None:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "bad.flexnpu.io"},
        "spec": {"extendedResourceName": bad},
    }
    with pytest.raises(ApiException) as err:
        client.ResourceV1Api(api.api_client()).create_device_class(body)
    assert err.value.status == 422
    assert "spec.extendedResourceName" in json.loads(err.value.body)["message"]

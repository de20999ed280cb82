"""Extended-resource requests served by DRA (KEP-5004, ``DRAExtendedResource``), as kube-scheduler 1.36 does them.

A DeviceClass with ``spec.extendedResourceName: flexnpu.io/npu`` lets a pod ask ``resources.limits:
{flexnpu.io/npu: 1}`` without writing a claim. Every class also answers to its implicit name
``deviceclass.resource.kubernetes.io/<class>``. For such a pod the scheduler (as measured on a real v1.36
kube-scheduler):

* creates one ResourceClaim in the pod's namespace, ``generateName: <pod>-extended-resources-``, annotated
  ``resource.kubernetes.io/extended-resource-claim: "true"``, owned by the pod (controller, blockOwnerDeletion), with
  one ``exactly`` request per (container, extended resource) named ``container-<i>-request-<j>``, ``count`` the
  quantity asked;
* allocates and reserves it for the pod;
* records ``pod.status.extendedResourceClaimStatus`` (``resourceClaimName``, ``requestMappings`` of
  ``containerName`` / ``resourceName`` / ``requestName``).

The kubelet then prepares that claim like any other (:func:`pod_claim_refs` lists what it would send). A resource
that the node advertises in ``status.allocatable`` comes from a device plugin and is left to it, which is how a
cluster migrates node by node from the Ascend device plugin's ``huawei.com/Ascend910``.

Differences on purpose: the real scheduler allocates in memory and creates the claim only at PreBind; this stand-in
creates it first (``SchedulerSim`` allocates stored claims) and deletes it again when the allocation fails, so a
failed attempt leaves nothing behind. Containers are numbered init containers first, then regular ones; the driver
does not depend on the request names. The pod is not bound (the fake API server has no ``pods/binding``).

Usage::

    sim = SchedulerSim(srv.api_client(), "npu.flexnpu.io")
    claim = extended_resources.schedule_pod(sim, "demo", "pod0", "node-1")   # None: the pod asks for none
    refs = extended_resources.pod_claim_refs(srv.api_client(), "demo", "pod0")
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import kubernetes.client
from kubernetes.client.exceptions import ApiException

from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.fake_apiserver.quantities import parse_quantity
from flexnpu_testing.fake_apiserver.validation import is_extended_resource_name, validate_device_class

if TYPE_CHECKING:
    from flexnpu_testing.scheduler import SchedulerSim

__all__ = [
    "CLAIM_ANNOTATION",
    "IMPLICIT_PREFIX",
    "ExtendedClaim",
    "build_claim",
    "class_by_resource",
    "is_extended_resource_name",
    "pod_claim_refs",
    "schedule_pod",
    "validate_device_class",
]

Obj = dict[str, Any]
CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"


@dataclass(frozen=True, slots=True)
class ExtendedClaim:
    """The claim to create for a pod and the mappings to record in its status (pure output of build_claim)."""

    body: Obj
    request_mappings: tuple[Obj, ...]


# ---- pure


def class_by_resource(classes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Extended resource name -> DeviceClass name.

    Explicit names: the class created last wins; at the same creation time the lexicographically first name
    (``DeviceClassSpec.extendedResourceName`` in the API reference). Every class also has its implicit name.
    """
    out: dict[str, str] = {}
    chosen: dict[str, tuple[str, str]] = {}  # resource -> (creationTimestamp, class)
    for cls in classes:
        meta = cls.get("metadata") or {}
        name = str(meta.get("name", ""))
        out[IMPLICIT_PREFIX + name] = name
        explicit = (cls.get("spec") or {}).get("extendedResourceName")
        if not explicit:
            continue
        created = str(meta.get("creationTimestamp") or "")
        prev = chosen.get(explicit)
        if prev is None or created > prev[0] or (created == prev[0] and name < prev[1]):
            chosen[explicit] = (created, name)
    out.update({res: cls for res, (_, cls) in chosen.items()})
    return out


def _count(value: object, where: str) -> int:
    amount, _ = parse_quantity(value)
    if amount.denominator != 1 or amount < 0:
        raise ValueError(f"{where}: extended resource quantity {value!r} must be a whole number")
    return int(amount)


def build_claim(
    pod: Mapping[str, Any], classes: Mapping[str, str], allocatable: Mapping[str, Any]
) -> ExtendedClaim | None:
    """The special claim for ``pod``, or None when none of its containers asks a DRA-served extended resource.

    ``classes`` is :func:`class_by_resource`'s map; ``allocatable`` the node's ``status.allocatable``
    (resources found there belong to a device plugin).
    """
    meta = pod["metadata"]
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    requests: list[Obj] = []
    mappings: list[Obj] = []
    for index, ctr in enumerate(containers):
        resources = ctr.get("resources") or {}
        wanted = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
        served = sorted(r for r in wanted if r in classes and r not in allocatable)
        for j, res in enumerate(served):
            count = _count(wanted[res], f"pod {meta.get('namespace')}/{meta['name']} container {ctr['name']}")
            if count == 0:
                continue
            request_name = f"container-{index}-request-{j}"
            requests.append(
                {
                    "name": request_name,
                    "exactly": {
                        "deviceClassName": classes[res],
                        "allocationMode": "ExactCount",
                        "count": count,
                    },
                }
            )
            mappings.append({"containerName": ctr["name"], "resourceName": res, "requestName": request_name})
    if not requests:
        return None
    body: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "generateName": f"{meta['name']}-extended-resources-",
            "namespace": meta["namespace"],
            "annotations": {CLAIM_ANNOTATION: "true"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": meta["name"],
                    "uid": meta["uid"],
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {"devices": {"requests": requests}},
    }
    return ExtendedClaim(body, tuple(mappings))


# ---- effects (through the official client only, like SchedulerSim)


def _dict(api_client: kubernetes.client.ApiClient, model: Any) -> Obj:
    out: Obj = api_client.sanitize_for_serialization(model)  # type: ignore[no-untyped-call]
    return out


def schedule_pod(sim: SchedulerSim, namespace: str, pod_name: str, node_name: str) -> Obj | None:
    """Create, allocate and reserve the pod's extended-resource claim and record it in the pod's status.

    Returns the stored claim, or None when the pod asks for no DRA-served extended resource. A pod that already
    has ``status.extendedResourceClaimStatus`` gets its existing claim back. Raises ``Unschedulable`` (and leaves
    no claim) when the node cannot satisfy it.
    """
    api_client = sim.api_client
    core = kubernetes.client.CoreV1Api(api_client)
    resource = kubernetes.client.ResourceV1Api(api_client)
    pod = _dict(api_client, core.read_namespaced_pod(pod_name, namespace))
    done = (pod.get("status") or {}).get("extendedResourceClaimStatus")
    if done:
        return _dict(
            api_client, resource.read_namespaced_resource_claim(done["resourceClaimName"], namespace)
        )
    classes = class_by_resource(_dict(api_client, c) for c in resource.list_device_class().items)
    node = _dict(api_client, core.read_node(node_name))
    wanted = build_claim(pod, classes, (node.get("status") or {}).get("allocatable") or {})
    if wanted is None:
        return None
    model = kubernetes.client.ResourceV1ResourceClaim.from_dict(wanted.body)
    assert model is not None
    created = _dict(api_client, resource.create_namespaced_resource_claim(namespace, model))
    claim_name = created["metadata"]["name"]
    consumer = {"resource": "pods", "name": pod_name, "uid": pod["metadata"]["uid"]}
    try:
        claim = sim.allocate(namespace, claim_name, node_name, reserved_for=[consumer])
    except BaseException:
        resource.delete_namespaced_resource_claim(claim_name, namespace)
        raise
    status = {
        "extendedResourceClaimStatus": {
            "resourceClaimName": claim_name,
            "requestMappings": [dict(m) for m in wanted.request_mappings],
        }
    }
    core.patch_namespaced_pod_status(pod_name, namespace, {"status": status})
    return claim


def pod_claim_refs(api_client: kubernetes.client.ApiClient, namespace: str, pod_name: str) -> list[ClaimRef]:
    """The claims the kubelet prepares for a pod: its ``spec.resourceClaims`` and its extended-resource claim."""
    core = kubernetes.client.CoreV1Api(api_client)
    resource = kubernetes.client.ResourceV1Api(api_client)
    pod = _dict(api_client, core.read_namespaced_pod(pod_name, namespace))
    status = pod.get("status") or {}
    generated = {s["name"]: s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []}
    names: list[str] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry["name"])
        if name:
            names.append(name)
    extended = status.get("extendedResourceClaimStatus")
    if extended:
        names.append(extended["resourceClaimName"])
    refs = []
    for name in names:
        try:
            claim = _dict(api_client, resource.read_namespaced_resource_claim(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                continue  # not created yet: the kubelet waits for it
            raise
        refs.append(ClaimRef(namespace, claim["metadata"]["uid"], name))
    return refs

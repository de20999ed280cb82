"""Admission checks of VnpuConfig (dra_driver/admission.py): the same messages as prepare, naming the object
and the field the user wrote; other drivers' configs, other kinds and DELETEs pass untouched."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver import admission
from dra_driver.errors import InvalidInput

DRIVER = "npu.flexnpu.io"
SHARES = ("vnpu.flexnpu.io=elastic", "vnpu-fixed.flexnpu.io=fixed", "vnpu-any.flexnpu.io")


def claim(
    params: dict[str, Any] | None = None, *, memory: str = "256Mi", compute: str = "20", **extra: Any
) -> dict[str, Any]:
    config = [] if params is None else [{"opaque": {"driver": DRIVER, "parameters": params}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "vnpu",
                        "exactly": {
                            "deviceClassName": "vnpu.flexnpu.io",
                            "capacity": {"requests": {"memory": memory, "compute": compute}},
                        },
                    }
                ],
                "config": config,
                **extra,
            }
        },
    }


def vnpu_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", **fields}


def review_of(
    obj: dict[str, Any], *, kind: str = "ResourceClaim", operation: str = "CREATE"
) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": kind},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": kind.lower() + "s"},
            "namespace": "ml",
            "name": obj["metadata"].get("name", ""),
            "operation": operation,
            "object": obj,
        },
    }


def answer(obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
    out = admission.review(review_of(obj, **kw), driver_name=DRIVER, share_classes=SHARES)
    assert out["kind"] == "AdmissionReview" and out["apiVersion"] == "admission.k8s.io/v1"
    assert out["response"]["uid"] == "705ab4f5-6393-11e8-b7cc-42010a800002"
    return out["response"]


FIELD = "spec.devices.config[0].opaque.parameters"
DENIED = [
    pytest.param(claim(vnpu_config(polcy="fixed")), f"{FIELD}.polcy", "unknown field 'polcy'", id="misspelled-field"),
    pytest.param(claim(vnpu_config(policy="greedy")), f"{FIELD}.policy", "unknown value 'greedy'", id="unknown-policy"),
    pytest.param(claim(vnpu_config(vnpus=3)), "spec.devices.requests[0].exactly.capacity.requests.memory",
                 "memory 256Mi does not divide into 3 vNPUs of whole 128Mi steps", id="vnpus-not-dividing-memory"),
    pytest.param(claim(vnpu_config(vnpus=2), compute="25"), "spec.devices.requests[0].exactly.capacity.requests.compute",
                 "compute 25% does not divide into 2 vNPUs", id="vnpus-not-dividing-compute"),
    pytest.param(claim(vnpu_config(hostMemory="lots")), f"{FIELD}.hostMemory", "is not a whole quantity", id="bad-host-memory"),
    pytest.param(claim(vnpu_config(hostMemory="2Ti")), f"{FIELD}.hostMemory", "must be 1Mi..1Ti", id="host-memory-too-big"),
    pytest.param(claim(vnpu_config(vnpus="2")), f"{FIELD}.vnpus", "must be a whole number", id="vnpus-wrong-type"),
    # issue 25 class 2: the tenant chose its own host-memory bound (1Ti on a 128 MiB share was stored)
    pytest.param(claim(vnpu_config(hostMemory="1Ti"), memory="128Mi"), f"{FIELD}.hostMemory",
                 "asks for '1Ti' of host memory; the most is 256Mi for a share of 128Mi", id="host-memory-1Ti-on-128Mi"),
    pytest.param(claim(vnpu_config(hostMemory="257Mi"), memory="128Mi"), f"{FIELD}.hostMemory",
                 "the node allows 2x the share's device memory, at most 65536Mi", id="host-memory-just-over-the-ratio"),
    pytest.param(claim({"kind": "VnpuConfig", "policy": "fixed"}), f"{FIELD}.apiVersion", "apiVersion must be", id="no-api-version"),
    pytest.param(claim(["policy"]), FIELD, "parameters must be a VnpuConfig object", id="parameters-not-an-object"),  # type: ignore[arg-type]
]  # fmt: skip


@pytest.mark.parametrize(("obj", "field", "message"), DENIED)
def test_denied_with_the_prepare_message(obj: dict[str, Any], field: str, message: str) -> None:
    response = answer(obj)
    assert response["allowed"] is False
    status = response["status"]
    assert status["code"] == 422 and status["reason"] == "Invalid"
    assert status["message"].startswith(f"ResourceClaim ml/train: field {field}: "), status["message"]
    assert message in status["message"] and "[" in status["message"]  # the stable code, as prepare gives it


def test_the_message_is_the_one_prepare_gives() -> None:
    """The same decoder: prepare's error for the same parameters, with the claim's field path."""
    from dra_driver import sharing

    params = vnpu_config(polcy="fixed")
    with pytest.raises(InvalidInput) as prepare_err:
        sharing.decode(params, claim_uid="", where="status.allocation.devices.config[0].opaque.parameters")
    message = answer(claim(params))["status"]["message"]
    assert prepare_err.value.message in message and str(prepare_err.value.code) in message


ALLOWED = [
    pytest.param(claim(vnpu_config(policy="elastic", isolation="memory-only")), id="valid-config"),
    pytest.param(claim(vnpu_config(vnpus=2)), id="vnpus-dividing"),
    pytest.param(claim(vnpu_config(hostMemory="256Mi"), memory="128Mi"), id="host-memory-at-the-ratio"),
    pytest.param(claim(vnpu_config(hostMemory="64Mi"), memory="128Mi"), id="host-memory-below-the-share"),
    pytest.param(claim(vnpu_config(vnpus=2), memory="200Mi"), id="memory-rounded-up-to-the-step"),
    pytest.param(claim(None), id="no-config"),
    pytest.param(
        {**claim(None), "spec": {"devices": {"requests": [], "config": [{"opaque": {"driver": "gpu.example.com", "parameters": {"x": 1}}}]}}},
        id="other-drivers-config",
    ),
]  # fmt: skip


@pytest.mark.parametrize("obj", ALLOWED)
def test_allowed(obj: dict[str, Any]) -> None:
    response = answer(obj)
    assert response == {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "allowed": True}


def test_templates_are_checked_at_their_own_path() -> None:
    inner = claim(vnpu_config(policy="greedy"))
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {"spec": inner["spec"]},
    }
    status = answer(template, kind="ResourceClaimTemplate")["status"]
    assert status["message"].startswith(
        "ResourceClaimTemplate ml/t: field spec.spec.devices.config[0].opaque.parameters.policy:"
    )


def test_config_for_one_request_applies_to_it_only() -> None:
    obj = claim(None)
    obj["spec"]["devices"]["requests"].append(
        copy.deepcopy(obj["spec"]["devices"]["requests"][0]) | {"name": "other"}
    )
    obj["spec"]["devices"]["requests"][1]["exactly"]["capacity"]["requests"]["memory"] = "384Mi"
    obj["spec"]["devices"]["config"] = [
        {"requests": ["vnpu"], "opaque": {"driver": DRIVER, "parameters": vnpu_config(vnpus=2)}}
    ]
    assert answer(obj)["allowed"] is True  # 'other' (384Mi, not divisible by 2 steps) gets no vnpus
    obj["spec"]["devices"]["config"][0]["requests"] = ["other"]
    assert "spec.devices.requests[1]" in answer(obj)["status"]["message"]
    obj["spec"]["devices"]["config"][0]["requests"] = ["missing"]
    assert "names no request of this claim" in answer(obj)["status"]["message"]


def test_first_available_subrequests_are_checked() -> None:
    obj = claim(vnpu_config(vnpus=3))
    req = obj["spec"]["devices"]["requests"][0]
    req["firstAvailable"] = [{"name": "big", **req.pop("exactly")}]
    message = answer(obj)["status"]["message"]
    assert "spec.devices.requests[0].firstAvailable[0].capacity.requests.memory" in message


@pytest.mark.parametrize(
    ("kind", "operation"),
    [pytest.param("ResourceClaim", "DELETE", id="delete"), pytest.param("Pod", "CREATE", id="other-kind")],
)
def test_not_looked_at(kind: str, operation: str) -> None:
    assert answer(claim(vnpu_config(polcy="x")), kind=kind, operation=operation)["allowed"] is True


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(None, id="null"),
        pytest.param({"kind": "Pod"}, id="not-a-review"),
        pytest.param({"kind": "AdmissionReview", "request": {"uid": ""}}, id="no-uid"),
    ],
)
def test_malformed_reviews_raise(doc: Any) -> None:
    with pytest.raises(InvalidInput):
        admission.review(doc, driver_name=DRIVER, share_classes=SHARES)


@pytest.mark.parametrize(
    ("cls", "policy", "allowed"),
    [
        pytest.param("vnpu.flexnpu.io", "fixed", False, id="fixed-on-the-elastic-class"),
        pytest.param("vnpu-fixed.flexnpu.io", "fixed", True, id="fixed-on-the-fixed-class"),
        pytest.param("vnpu-fixed.flexnpu.io", None, True, id="no-policy-named"),
        pytest.param("vnpu-any.flexnpu.io", "best-effort", True, id="class-without-a-known-policy"),
    ],
)
def test_the_policy_must_be_the_classes(cls: str, policy: str | None, allowed: bool) -> None:
    obj = claim(vnpu_config(**({"policy": policy} if policy else {})))
    obj["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = cls
    response = answer(obj)
    assert response["allowed"] is allowed
    if not allowed:
        message = response["status"]["message"]
        assert f"field {FIELD}.policy: policy 'fixed' does not agree with the DeviceClass" in message
        assert "(the DeviceClass vnpu-fixed.flexnpu.io)" in message


def test_a_bad_share_class_policy_is_refused() -> None:
    with pytest.raises(InvalidInput, match="unknown policy"):
        admission.parse_share_classes(["vnpu.flexnpu.io=greedy"])


@pytest.mark.parametrize(
    ("ratio", "cap", "memory", "asked", "allowed"),
    [
        pytest.param(1.0, 64 << 30, "512Mi", "512Mi", True, id="ratio-1-allows-the-device-memory"),
        pytest.param(1.0, 64 << 30, "512Mi", "513Mi", False, id="ratio-1-refuses-more"),
        pytest.param(8.0, 1 << 30, "512Mi", "1Gi", True, id="cap-reached"),
        pytest.param(8.0, 1 << 30, "512Mi", "1025Mi", False, id="cap-over"),
        pytest.param(8.0, 1 << 30, "4Gi", "4Gi", True, id="a-share-over-the-cap-keeps-its-own-memory"),
    ],
)
def test_the_node_sets_the_host_memory_bound(
    ratio: float, cap: int, memory: str, asked: str, allowed: bool
) -> None:
    from dra_driver import sharing

    out = admission.review(
        review_of(claim(vnpu_config(hostMemory=asked), memory=memory)),
        driver_name=DRIVER,
        share_classes=SHARES,
        host_memory=sharing.HostMemoryBound(ratio=ratio, cap_bytes=cap),
    )["response"]
    assert out["allowed"] is allowed, out
    if not allowed:
        assert out["status"]["message"].startswith(f"ResourceClaim ml/train: field {FIELD}.hostMemory: ")

"""The pure half of the extended-resource stand-in: which class serves a name, and the claim built for a pod."""

from __future__ import annotations

from typing import Any

import pytest

from flexnpu_testing import extended_resources as er


def cls(name: str, ern: str | None = None, created: str = "2026-12-01T00:00:00Z") -> dict[str, Any]:
    spec = {"extendedResourceName": ern} if ern else {}
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": spec}


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u-1"},
        "spec": {"initContainers": list(init), "containers": list(containers)},
    }


def ctr(name: str, limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"name": name, "resources": {"limits": dict(limits or {})}}


def test_class_by_resource_explicit_implicit_and_ties() -> None:
    got = er.class_by_resource(
        [
            cls("a", "x.io/npu", "2026-12-01T00:00:01Z"),
            cls("b", "x.io/npu", "2026-12-01T00:00:02Z"),  # created later: wins
            cls("d", "y.io/npu"),
            cls("c", "y.io/npu"),  # same time: lexicographically first wins
            cls("e"),
        ]
    )
    assert got["x.io/npu"] == "b" and got["y.io/npu"] == "c"
    assert {k: v for k, v in got.items() if k.startswith(er.IMPLICIT_PREFIX)} == {
        er.IMPLICIT_PREFIX + n: n for n in "abdce"
    }


def test_build_claim_numbers_requests_and_skips_device_plugin_resources() -> None:
    classes = {"x.io/npu": "npu.x.io", "y.io/acc": "acc.y.io"}
    p = pod(
        ctr("main", {"x.io/npu": "2", "y.io/acc": "1", "cpu": "1"}),
        ctr("side", {"x.io/npu": "0"}),
        init=(ctr("setup", {"y.io/acc": "1"}),),
    )
    built = er.build_claim(p, classes, allocatable={"cpu": "8"})
    assert built is not None
    meta = built.body["metadata"]
    assert meta["generateName"] == "p-extended-resources-" and meta["namespace"] == "ns"
    assert meta["annotations"] == {er.CLAIM_ANNOTATION: "true"}
    assert meta["ownerReferences"][0]["uid"] == "u-1" and meta["ownerReferences"][0]["controller"] is True
    reqs = [
        (r["name"], r["exactly"]["deviceClassName"], r["exactly"]["count"])
        for r in built.body["spec"]["devices"]["requests"]
    ]
    assert reqs == [
        ("container-0-request-0", "acc.y.io", 1),  # init containers first
        ("container-1-request-0", "npu.x.io", 2),
        ("container-1-request-1", "acc.y.io", 1),
    ]
    assert [m["containerName"] for m in built.request_mappings] == ["setup", "main", "main"]
    # The node's device plugin serves y.io/acc: only x.io/npu is left to DRA.
    again = er.build_claim(p, classes, allocatable={"y.io/acc": "4"})
    assert again is not None
    assert [r["name"] for r in again.body["spec"]["devices"]["requests"]] == ["container-1-request-0"]
    assert er.build_claim(pod(ctr("c", {"cpu": "1"})), classes, {}) is None


def test_fractional_quantity_is_refused_naming_the_container() -> None:
    p = pod(ctr("c", {"x.io/npu": "500m"}))
    with pytest.raises(ValueError, match="pod ns/p container c"):
        er.build_claim(p, {"x.io/npu": "k"}, {})


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("flexnpu.io/npu", True),
        ("huawei.com/Ascend910", True),
        ("npu", False),
        ("kubernetes.io/npu", False),
        ("deviceclass.resource.kubernetes.io/npu.flexnpu.io", False),
        ("requests.x.io/npu", False),
        ("X.io/npu", False),
        ("x.io/", False),
    ],
)
def test_extended_resource_name_validation(name: str, ok: bool) -> None:
    assert er.is_extended_resource_name(name) is ok
    errors = er.validate_device_class({"spec": {"extendedResourceName": name}})
    assert (errors == []) is ok
    if not ok:
        assert errors[0][0] == "spec.extendedResourceName" and name in errors[0][1]

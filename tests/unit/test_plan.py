"""Claim planning: which of a claim's results this node prepares, and the errors it refuses with."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_driver.devices import Die, DieMode, Inventory
from dra_driver.errors import ErrorCode, FlexNPUError
from dra_driver.plan import plan_claim, resolve_shares
from dra_driver.records import check_conflicts
from dra_driver.sharing import configs_for
from dra_kubeletplugin.claims import ClaimRef, strip_subrequest

DRIVER = "npu.flexnpu.io"
UID = "0b7d7a5c-1111-2222-3333-444455556666"
REF = ClaimRef(namespace="ns", uid=UID, name="c1")


def _die(phy: int) -> Die:
    return Die(
        vdie_id=f"{phy:08X}-00000000-00000000-00000000-00000000",
        model="910B3",
        card_id=phy,
        chip_id=0,
        phy_id=phy,
        logic_id=phy,
        pci_bus_id=f"0000:{phy + 1:02x}:00.0",
        numa_node=0,
        memory_mib=65536,
        aicore=20,
        aicpu=7,
    )


INVENTORY = Inventory(dies=(_die(0), _die(1)))


def _claim(results: list[dict[str, Any]], config: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"uid": UID, "name": "c1", "namespace": "ns"},
        "status": {"allocation": {"devices": {"results": results, "config": config or []}}},
    }


def _res(
    device: str, request: str = "npu", driver: str = DRIVER, pool: str = "node1", **kw: Any
) -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device, **kw}


def _plan(claim: dict[str, Any]):  # type: ignore[no-untyped-def]
    return plan_claim(claim, ref=REF, driver_name=DRIVER, pool_name="node1", inventory=INVENTORY)


def test_whole_die_plan() -> None:
    plan = _plan(_claim([_res("npu-1", request="npu/fast")]))
    (dev,) = plan.devices
    assert (dev.device, dev.die.phy_id, dev.mode, dev.request_name) == ("npu-1", 1, DieMode.WHOLE, "npu")


def test_share_plan_keeps_share_id_and_capacity() -> None:
    plan = _plan(
        _claim([_res("vnpu-0", shareID="abc", consumedCapacity={"memory": "128Mi", "compute": "10"})])
    )
    (dev,) = plan.devices
    assert (dev.mode, dev.share_id, dict(dev.consumed_capacity)) == (
        DieMode.SOFT,
        "abc",
        {"memory": "128Mi", "compute": "10"},
    )


def test_other_drivers_results_are_ignored() -> None:
    plan = _plan(_claim([_res("gpu-0", driver="gpu.example.com", pool="other")]))
    assert plan.devices == ()


def test_configs_for_request_class_before_claim() -> None:
    cfg = [
        {"source": "FromClaim", "requests": ["npu"], "opaque": {"driver": DRIVER, "parameters": {"a": 2}}},
        {"source": "FromClass", "requests": [], "opaque": {"driver": DRIVER, "parameters": {"a": 1}}},
        {"source": "FromClaim", "requests": [], "opaque": {"driver": "other.io", "parameters": {"a": 3}}},
        {"source": "FromClaim", "requests": ["other"], "opaque": {"driver": DRIVER, "parameters": {"a": 4}}},
    ]
    plan = _plan(_claim([_res("npu-0")], cfg))
    assert [c.parameters["a"] for c in configs_for(plan.configs, "npu")] == [1, 2]


def _unallocated() -> dict[str, Any]:
    c = _claim([])
    del c["status"]["allocation"]
    return c


def _replaced() -> dict[str, Any]:
    c = _claim([_res("npu-0")])
    c["metadata"]["uid"] = "another-uid"
    return c


@pytest.mark.parametrize(
    ("claim", "code", "field"),
    [
        pytest.param(_unallocated(), ErrorCode.CLAIM_NOT_ALLOCATED, "status.allocation", id="unallocated"),
        pytest.param(_replaced(), ErrorCode.CLAIM_REPLACED, "metadata.uid", id="uid-replaced"),
        pytest.param(
            _claim([_res("npu-7")]),
            ErrorCode.DEVICE_NOT_FOUND,
            "status.allocation.devices.results[0].device",
            id="unknown-device",
        ),
        pytest.param(
            _claim([_res("npu-0", pool="node2")]),
            ErrorCode.DEVICE_NOT_FOUND,
            "status.allocation.devices.results[0].pool",
            id="other-pool",
        ),
        pytest.param(
            _claim([_res("npu-0")], [{"opaque": {"driver": DRIVER, "parameters": "x"}}]),
            ErrorCode.INVALID_OPAQUE_CONFIG,
            "status.allocation.devices.config[0].opaque.parameters",
            id="opaque-not-object",
        ),
        pytest.param(
            _claim([_res("npu-0")], [{"requests": 5, "opaque": {"driver": DRIVER, "parameters": {}}}]),
            ErrorCode.INVALID_OPAQUE_CONFIG,
            "status.allocation.devices.config[0].requests",
            id="requests-not-a-list",
        ),
        pytest.param(
            _claim([_res("npu-0")], {"oops": 1}),  # type: ignore[arg-type]
            ErrorCode.INVALID_OPAQUE_CONFIG,
            "status.allocation.devices.config",
            id="config-not-a-list",
        ),
        pytest.param(
            {"metadata": {"uid": UID}, "status": {"allocation": {"devices": {"results": "npu-0"}}}},
            ErrorCode.INVALID_ARGUMENT,
            "status.allocation.devices.results",
            id="results-a-string",
        ),
        pytest.param(
            _claim([_res(7)]),  # type: ignore[arg-type]
            ErrorCode.INVALID_ARGUMENT,
            "status.allocation.devices.results[0].device",
            id="device-not-a-string",
        ),
    ],
)
def test_bad_claims(claim: dict[str, Any], code: ErrorCode, field: str) -> None:
    with pytest.raises(FlexNPUError) as info:
        _plan(copy.deepcopy(claim))
    assert (info.value.code, info.value.field, info.value.claim_uid) == (code, field, UID)


@pytest.mark.parametrize(("req", "top"), [("a", "a"), ("a/b", "a"), ("a/b/c", "a")])
def test_strip_subrequest(req: str, top: str) -> None:
    assert strip_subrequest(req) == top


def test_error_quotes_at_most_200_characters_of_input() -> None:
    with pytest.raises(FlexNPUError) as info:
        _plan(_claim([_res("npu-" + "9" * 1_000_000)]))
    assert len(str(info.value)) < 600 and "more characters" in str(info.value)


def test_a_whole_die_and_a_share_of_it_in_one_claim_are_refused() -> None:
    plan = resolve_shares(
        _plan(
            _claim(
                [
                    _res("npu-0", request="whole"),
                    _res(
                        "vnpu-0",
                        request="share",
                        shareID="s",
                        consumedCapacity={"memory": "128Mi", "compute": "1"},
                    ),
                ]
            )
        )
    )
    with pytest.raises(FlexNPUError) as info:
        check_conflicts(plan, [])
    assert info.value.code == ErrorCode.DEVICE_BUSY and "whole and for a share" in str(info.value)


@pytest.mark.parametrize(
    ("params", "host"),
    [
        pytest.param({}, (0, 0), id="default-each-its-quota"),
        pytest.param({"hostMemory": "3Gi"}, (1536 << 20, 1536 << 20), id="split-over-vnpus"),
    ],
)
def test_host_memory_reaches_each_share(params: dict[str, Any], host: tuple[int, ...]) -> None:
    cfg = [
        {
            "source": "FromClaim",
            "requests": [],
            "opaque": {
                "driver": DRIVER,
                "parameters": {
                    "apiVersion": "npu.flexnpu.io/v1alpha1",
                    "kind": "VnpuConfig",
                    "vnpus": 2,
                    **params,
                },
            },
        }
    ]
    plan = resolve_shares(
        _plan(_claim([_res("vnpu-0", shareID="s", consumedCapacity={"memory": "1Gi", "compute": "20"})], cfg))
    )
    assert tuple(s.host_memory_bytes for s in plan.shares) == host
    assert sum(s.host_memory_limit for s in plan.shares) == (sum(host) or 1 << 30)

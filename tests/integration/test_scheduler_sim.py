"""SchedulerSim against the fake apiserver: exclusive dies, consumable capacity, shared counters, config."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.scheduler import SchedulerSim, Unschedulable

DRIVER = "npu.flexnpu.io"
NS = "team-a"
NODE = "node-a"
GiB = 1024


@pytest.fixture
def env() -> Iterator[tuple[client.ResourceV1Api, SchedulerSim]]:
    with FakeAPIServer() as srv:
        api_client = srv.api_client()
        client.CoreV1Api(api_client).create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        api = client.ResourceV1Api(api_client)
        for name, mode, config in (
            ("npu.flexnpu.io", "whole", None),
            (
                "vnpu.flexnpu.io",
                "soft",
                {"driver": DRIVER, "parameters": {"kind": "VNPUConfig", "policy": "fixed"}},
            ),
        ):
            spec: dict[str, Any] = {
                "selectors": [
                    {
                        "cel": {
                            "expression": f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "{mode}"'
                        }
                    }
                ]
            }
            if config:
                spec["config"] = [{"opaque": config}]
            api.create_device_class(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": name},
                    "spec": spec,
                }
            )
        yield api, SchedulerSim(api_client, DRIVER)
        api_client.close()


def whole(name: str, *, counters: bool = False) -> dict[str, Any]:
    dev: dict[str, Any] = {"name": name, "attributes": {"mode": {"string": "whole"}}}
    if counters:
        dev["consumesCounters"] = [{"counterSet": "die-0", "counters": {"exclusive": {"value": "1"}}}]
    return dev


def soft(name: str, *, counters: bool = False) -> dict[str, Any]:
    dev: dict[str, Any] = {
        "name": name,
        "attributes": {"mode": {"string": "soft"}},
        "allowMultipleAllocations": True,
        "capacity": {
            "memory": {
                "value": "16Gi",
                "requestPolicy": {"default": "128Mi", "validRange": {"min": "128Mi", "step": "128Mi"}},
            },
            "compute": {
                "value": "100",
                "requestPolicy": {"default": "1", "validRange": {"min": "1", "max": "100", "step": "1"}},
            },
        },
    }
    if counters:
        dev["consumesCounters"] = [{"counterSet": "die-0", "counters": {"exclusive": {"value": "1"}}}]
    return dev


def publish(api: client.ResourceV1Api, devices: list[dict[str, Any]], *, counters: bool = False) -> None:
    count = 2 if counters else 1
    pool = {"name": NODE, "generation": 1, "resourceSliceCount": count}
    meta = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
    api.create_resource_slice(
        {
            **meta,
            "metadata": {"name": "s-devices"},
            "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, "devices": devices},
        }
    )
    if counters:
        shared = [{"name": "die-0", "counters": {"exclusive": {"value": "1"}}}]
        api.create_resource_slice(
            {
                **meta,
                "metadata": {"name": "s-counters"},
                "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, "sharedCounters": shared},
            }
        )


def publish_counters(
    api: client.ResourceV1Api, devices: list[dict[str, Any]], counter_sets: dict[str, dict[str, Any]]
) -> None:
    pool = {"name": NODE, "generation": 1, "resourceSliceCount": 2}
    meta = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice"}
    api.create_resource_slice(
        {
            **meta,
            "metadata": {"name": "s-devices"},
            "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, "devices": devices},
        }
    )
    shared = [{"name": n, "counters": c} for n, c in counter_sets.items()]
    api.create_resource_slice(
        {
            **meta,
            "metadata": {"name": "s-counters"},
            "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, "sharedCounters": shared},
        }
    )


def create_claim(api: client.ResourceV1Api, name: str, requests: list[dict[str, Any]]) -> None:
    api.create_namespaced_resource_claim(
        NS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": requests}},
        },
    )


def make_claim(
    api: client.ResourceV1Api,
    name: str,
    device_class: str,
    *,
    count: int = 1,
    capacity: dict[str, str] | None = None,
    config: list[dict[str, Any]] | None = None,
) -> None:
    exactly: dict[str, Any] = {"deviceClassName": device_class, "count": count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    devices: dict[str, Any] = {"requests": [{"name": "npu", "exactly": exactly}]}
    if config:
        devices["config"] = config
    api.create_namespaced_resource_claim(
        NS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": devices},
        },
    )


def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = claim["status"]["allocation"]["devices"]["results"]
    return out


def test_whole_die_is_exclusive(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [whole("die-0"), whole("die-1")])
    for name in ("a", "b", "c"):
        make_claim(api, name, "npu.flexnpu.io")
    pod = {"resource": "pods", "name": "pod-a", "uid": "uid-a"}
    a = sim.allocate(NS, "a", NODE, reserved_for=[pod])
    b = sim.allocate(NS, "b", NODE)
    assert [r["device"] for r in results(a)] == ["die-0"]
    assert [r["device"] for r in results(b)] == ["die-1"]
    assert "shareID" not in results(a)[0]
    assert a["status"]["reservedFor"] == [pod]
    assert a["status"]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [
        NODE
    ]
    with pytest.raises(Unschedulable, match="0 of 1 distinct device"):
        sim.allocate(NS, "c", NODE)
    assert api.read_namespaced_resource_claim("c", NS).status is None
    sim.deallocate(NS, "a")
    assert [r["device"] for r in results(sim.allocate(NS, "c", NODE))] == ["die-0"]


def test_count_two_takes_two_dies(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [whole("die-0"), whole("die-1")])
    make_claim(api, "pair", "npu.flexnpu.io", count=2)
    assert [r["device"] for r in results(sim.allocate(NS, "pair", NODE))] == ["die-0", "die-1"]


def test_two_shares_on_one_soft_device_with_capacity_accounting(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, [soft("die-0-soft")])
    make_claim(api, "s1", "vnpu.flexnpu.io", capacity={"memory": "8000Mi", "compute": "30"})
    make_claim(api, "s2", "vnpu.flexnpu.io", capacity={"memory": "8Gi", "compute": "70"})
    make_claim(api, "s3", "vnpu.flexnpu.io", capacity={"memory": "128Mi"})
    r1 = results(sim.allocate(NS, "s1", NODE))[0]
    r2 = results(sim.allocate(NS, "s2", NODE))[0]
    assert r1["device"] == r2["device"] == "die-0-soft"
    assert re.fullmatch(r"[0-9a-f-]{36}", r1["shareID"]) and r1["shareID"] != r2["shareID"]
    assert r1["consumedCapacity"] == {"memory": "8064Mi", "compute": "30"}  # rounded up to 128Mi steps
    assert r2["consumedCapacity"] == {"memory": "8Gi", "compute": "70"}
    with pytest.raises(Unschedulable):  # 16256Mi of 16Gi used, and compute 100 of 100
        sim.allocate(NS, "s3", NODE)
    sim.deallocate(NS, "s2")
    assert results(sim.allocate(NS, "s3", NODE))[0]["consumedCapacity"] == {"memory": "128Mi", "compute": "1"}


def test_share_larger_than_the_range_max_is_unschedulable(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, [soft("die-0-soft")])
    make_claim(api, "big", "vnpu.flexnpu.io", capacity={"compute": "101"})
    with pytest.raises(Unschedulable):
        sim.allocate(NS, "big", NODE)


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param(("whole", "npu.flexnpu.io"), ("share", "vnpu.flexnpu.io"), id="whole-blocks-share"),
        pytest.param(("share", "vnpu.flexnpu.io"), ("whole", "npu.flexnpu.io"), id="share-blocks-whole"),
    ],
)
def test_shared_counters_exclude_whole_and_shares(
    env: tuple[client.ResourceV1Api, SchedulerSim], first: tuple[str, str], second: tuple[str, str]
) -> None:
    api, sim = env
    publish(api, [whole("die-0", counters=True), soft("die-0-soft", counters=True)], counters=True)
    make_claim(api, first[0], first[1], capacity={"memory": "1Gi"} if first[0] == "share" else None)
    make_claim(api, second[0], second[1], capacity={"memory": "1Gi"} if second[0] == "share" else None)
    sim.allocate(NS, first[0], NODE)
    with pytest.raises(Unschedulable):
        sim.allocate(NS, second[0], NODE)
    sim.deallocate(NS, first[0])
    sim.allocate(NS, second[0], NODE)


def test_earlier_shares_charge_the_counters_once(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    """The driver's token model: a die's memory counter, a 1-byte token per share device."""
    api, sim = env
    total = str(16 * 1024**3)
    soft_dev = {
        **soft("die-0-soft"),
        "consumesCounters": [{"counterSet": "die-0", "counters": {"memory": {"value": "1"}}}],
    }
    whole_dev = {
        **whole("die-0"),
        "consumesCounters": [{"counterSet": "die-0", "counters": {"memory": {"value": total}}}],
    }
    publish_counters(api, [whole_dev, soft_dev], {"die-0": {"memory": {"value": total}}})
    for n in ("s1", "s2", "s3"):
        make_claim(api, n, "vnpu.flexnpu.io", capacity={"memory": "1Gi"})
        assert results(sim.allocate(NS, n, NODE))[0]["device"] == "die-0-soft"
    make_claim(api, "w", "npu.flexnpu.io")
    with pytest.raises(Unschedulable):  # 1 byte of the counter is in use, however many shares
        sim.allocate(NS, "w", NODE)


def test_a_device_with_shares_is_not_charged_again(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    """v1.36 ``allocateDevice``: a multi-allocatable device whose capacity is in use skips the counter
    check (``skipCounterCheck``, kubernetes#134103): its counters were charged with its first share."""
    api, sim = env
    publish(api, [whole("die-0", counters=True), soft("die-0-soft", counters=True)], counters=True)
    for n in ("s1", "s2", "s3"):
        make_claim(api, n, "vnpu.flexnpu.io", capacity={"memory": "1Gi"})
    sim.allocate(NS, "s1", NODE)  # the set holds 1 and s1's device uses it
    assert results(sim.allocate(NS, "s2", NODE))[0]["device"] == "die-0-soft"
    assert results(sim.allocate(NS, "s3", NODE))[0]["device"] == "die-0-soft"
    make_claim(api, "w", "npu.flexnpu.io")
    with pytest.raises(Unschedulable):
        sim.allocate(NS, "w", NODE)


def test_a_device_charges_its_counters_for_its_first_share(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    """The first share of a multi-allocatable device is checked: a set used up by another device refuses it."""
    api, sim = env
    dev = lambda name: {  # noqa: E731
        **soft(name),
        "attributes": {"mode": {"string": "soft"}, "policy": {"string": name[-1]}},
        "consumesCounters": [{"counterSet": "die-0", "counters": {"mode": {"value": "1"}}}],
    }
    publish_counters(api, [dev("die-0-a"), dev("die-0-b")], {"die-0": {"mode": {"value": "1"}}})
    make_claim(api, "s1", "vnpu.flexnpu.io", capacity={"memory": "1Gi"})
    only_b = {"cel": {"expression": f'device.attributes["{DRIVER}"].policy == "b"'}}
    create_claim(
        api, "s2", [{"name": "npu", "exactly": {"deviceClassName": "vnpu.flexnpu.io", "selectors": [only_b]}}]
    )
    assert results(sim.allocate(NS, "s1", NODE))[0]["device"] == "die-0-a"
    with pytest.raises(Unschedulable):
        sim.allocate(NS, "s2", NODE)


def test_count_two_never_lands_twice_on_one_shared_device(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, [soft("die-0-soft")])
    make_claim(api, "pair", "vnpu.flexnpu.io", count=2, capacity={"memory": "128Mi"})
    with pytest.raises(Unschedulable, match="1 of 2 distinct device"):
        sim.allocate(NS, "pair", NODE)


def test_count_two_spreads_over_two_shared_devices(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [soft("die-0-soft"), soft("die-1-soft")])
    make_claim(api, "pair", "vnpu.flexnpu.io", count=2, capacity={"memory": "128Mi"})
    assert [r["device"] for r in results(sim.allocate(NS, "pair", NODE))] == ["die-0-soft", "die-1-soft"]


def test_two_requests_may_share_one_device(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [soft("die-0-soft")])
    requests = [
        {
            "name": name,
            "exactly": {"deviceClassName": "vnpu.flexnpu.io", "capacity": {"requests": {"compute": pct}}},
        }
        for name, pct in (("a", "30"), ("b", "70"))
    ]
    create_claim(api, "two", requests)
    a, b = results(sim.allocate(NS, "two", NODE))
    assert a["device"] == b["device"] == "die-0-soft"
    assert (a["request"], b["request"]) == ("a", "b")
    assert a["shareID"] != b["shareID"]
    assert (a["consumedCapacity"]["compute"], b["consumedCapacity"]["compute"]) == ("30", "70")


def test_two_requests_on_one_device_charge_its_counters_once(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    """The second request skips the counter check: the device has capacity in use by the first
    (the allocator's ``allocatingCapacity``), so both land on it though its set holds only 1."""
    api, sim = env
    dev = lambda name, cset: {  # noqa: E731
        **soft(name),
        "consumesCounters": [{"counterSet": cset, "counters": {"shares": {"value": "1"}}}],
    }
    publish_counters(
        api,
        [dev("die-0-soft", "die-0"), dev("die-1-soft", "die-1")],
        {"die-0": {"shares": {"value": "1"}}, "die-1": {"shares": {"value": "1"}}},
    )
    requests = [{"name": n, "exactly": {"deviceClassName": "vnpu.flexnpu.io"}} for n in ("a", "b")]
    create_claim(api, "two", requests)
    assert [r["device"] for r in results(sim.allocate(NS, "two", NODE))] == ["die-0-soft", "die-0-soft"]


def test_backtracks_when_a_later_request_needs_the_device_an_earlier_one_took(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    devs = [
        {**whole(f"die-{i}"), "attributes": {"mode": {"string": "whole"}, "idx": {"int": i}}} for i in (0, 1)
    ]
    publish(api, devs)
    requests = [
        {"name": "any", "exactly": {"deviceClassName": "npu.flexnpu.io"}},
        {
            "name": "first",
            "exactly": {
                "deviceClassName": "npu.flexnpu.io",
                "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].idx == 0'}}],
            },
        },
    ]
    create_claim(api, "bt", requests)
    assert [(r["request"], r["device"]) for r in results(sim.allocate(NS, "bt", NODE))] == [
        ("any", "die-1"),
        ("first", "die-0"),
    ]


def test_an_incomplete_pool_is_not_used(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    pool = {"name": NODE, "generation": 1, "resourceSliceCount": 2}
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "s-a"},
        "spec": {"driver": DRIVER, "nodeName": NODE, "pool": pool, "devices": [whole("die-0")]},
    }
    api.create_resource_slice(body)
    make_claim(api, "w", "npu.flexnpu.io")
    with pytest.raises(Unschedulable):  # one of two slices seen
        sim.allocate(NS, "w", NODE)
    api.create_resource_slice(
        {**body, "metadata": {"name": "s-b"}, "spec": {**body["spec"], "devices": [whole("die-1")]}}
    )
    assert results(sim.allocate(NS, "w", NODE))[0]["device"] == "die-0"


def test_capacity_request_is_a_minimum_on_an_exclusive_device(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    small = {**whole("die-0"), "capacity": {"memory": {"value": "32Gi"}}}
    big = {**whole("die-1"), "capacity": {"memory": {"value": "64Gi"}}}
    publish(api, [small, big])
    make_claim(api, "w", "npu.flexnpu.io", capacity={"memory": "48Gi"})
    (r,) = results(sim.allocate(NS, "w", NODE))
    assert r["device"] == "die-1" and "shareID" not in r and "consumedCapacity" not in r


def test_config_from_class_then_claim(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [soft("die-0-soft")])
    claim_cfg = {
        "requests": ["npu"],
        "opaque": {"driver": DRIVER, "parameters": {"kind": "VNPUConfig", "policy": "elastic"}},
    }
    make_claim(api, "cfg", "vnpu.flexnpu.io", config=[claim_cfg])
    config = sim.allocate(NS, "cfg", NODE)["status"]["allocation"]["devices"]["config"]
    assert config == [
        {
            "source": "FromClass",
            "requests": ["npu"],
            "opaque": {"driver": DRIVER, "parameters": {"kind": "VNPUConfig", "policy": "fixed"}},
        },
        {"source": "FromClaim", "requests": ["npu"], "opaque": claim_cfg["opaque"]},
    ]


def test_unsupported_cel_is_not_implemented(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [whole("die-0")])
    api.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "fancy"},
            "spec": {
                "selectors": [{"cel": {"expression": 'device.capacity["x"].memory >= quantity("1Gi")'}}]
            },
        }
    )
    make_claim(api, "f", "fancy")
    with pytest.raises(NotImplementedError, match="only supports"):
        sim.allocate(NS, "f", NODE)


def test_allocated_claim_only_gains_reservations(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, [whole("die-0"), whole("die-1")])
    make_claim(api, "a", "npu.flexnpu.io")
    first = sim.allocate(NS, "a", NODE, reserved_for=[{"resource": "pods", "name": "p1", "uid": "u1"}])
    second = sim.allocate(NS, "a", NODE, reserved_for=[{"resource": "pods", "name": "p2", "uid": "u2"}])
    assert results(first) == results(second)
    assert [r["uid"] for r in second["status"]["reservedFor"]] == ["u1", "u2"]
    cleared = sim.deallocate(NS, "a")
    assert "allocation" not in (cleared.get("status") or {})


def test_first_available_falls_back_to_the_next_subrequest(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, [whole("die-0"), soft("die-1-soft")])
    make_claim(api, "taken", "npu.flexnpu.io")
    sim.allocate(NS, "taken", NODE)
    requests = [
        {
            "name": "npu",
            "firstAvailable": [
                {"name": "whole", "deviceClassName": "npu.flexnpu.io"},
                {
                    "name": "share",
                    "deviceClassName": "vnpu.flexnpu.io",
                    "capacity": {"requests": {"memory": "1Gi"}},
                },
            ],
        }
    ]
    api.create_namespaced_resource_claim(
        NS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "fa"},
            "spec": {"devices": {"requests": requests}},
        },
    )
    (result,) = results(sim.allocate(NS, "fa", NODE))
    assert (result["request"], result["device"]) == ("npu/share", "die-1-soft")


@pytest.mark.parametrize(
    ("tolerations", "expected"),
    [
        pytest.param(None, "die-1", id="tainted-die-skipped"),
        pytest.param([{"key": "flexnpu.io/unhealthy", "operator": "Exists"}], "die-0", id="tolerated"),
    ],
)
def test_tainted_devices_need_a_toleration(
    env: tuple[client.ResourceV1Api, SchedulerSim], tolerations: list[dict[str, str]] | None, expected: str
) -> None:
    api, sim = env
    tainted = {
        **whole("die-0"),
        "taints": [{"key": "flexnpu.io/unhealthy", "value": "true", "effect": "NoSchedule"}],
    }
    publish(api, [tainted, whole("die-1")])
    exactly: dict[str, Any] = {"deviceClassName": "npu.flexnpu.io"}
    if tolerations:
        exactly["tolerations"] = tolerations
    api.create_namespaced_resource_claim(
        NS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "t"},
            "spec": {"devices": {"requests": [{"name": "npu", "exactly": exactly}]}},
        },
    )
    (result,) = results(sim.allocate(NS, "t", NODE))
    assert result["device"] == expected
    assert result.get("tolerations") == tolerations  # copied into the result, as the allocator does


def _publish_pool(api: client.ResourceV1Api, pool: Any) -> None:
    for i, fragment in enumerate(pool.slices):
        api.create_resource_slice(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"{i:05x}-{DRIVER}-{NODE}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": NODE,
                    "pool": {"name": NODE, "generation": 1, "resourceSliceCount": len(pool.slices)},
                    **fragment,
                },
            }
        )


def test_the_share_after_the_per_die_limit_stays_pending(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    """The published ``shares`` capacity (63 by default) stops the scheduler, not prepare."""
    from dra_driver import slices
    from dra_driver.devices import Die, DieMode, Inventory

    api, sim = env
    die = Die(
        vdie_id="00000000-00000000-00000000-00000000-00000000",
        model="910B3",
        card_id=0,
        chip_id=0,
        phy_id=0,
        logic_id=0,
        pci_bus_id="0000:01:00.0",
        numa_node=0,
        memory_mib=65536,
        aicore=20,
        aicpu=7,
    )
    pool = slices.build_pool(
        Inventory(dies=(die,)), driver_name=DRIVER, node_name=NODE, mode_of=lambda d: DieMode.BOTH
    )
    _publish_pool(api, pool)
    for i in range(64):  # 64 x 128Mi and 64 x 1 % fit the die: only the share limit says no
        make_claim(api, f"s{i}", "vnpu.flexnpu.io", capacity={"memory": "128Mi"})
    for i in range(63):
        (r,) = results(sim.allocate(NS, f"s{i}", NODE))
        assert r["device"] == "vnpu-0" and r["consumedCapacity"]["shares"] == "1"
    with pytest.raises(Unschedulable, match="0 of 1 distinct device"):
        sim.allocate(NS, "s63", NODE)
    sim.deallocate(NS, "s0")
    assert results(sim.allocate(NS, "s63", NODE))[0]["device"] == "vnpu-0"


def test_a_share_cannot_ask_for_more_than_one_share_slot(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    dev = soft("die-0-soft")
    dev["capacity"]["shares"] = {"value": "63", "requestPolicy": {"default": "1", "validValues": ["1"]}}
    publish(api, [dev])
    make_claim(api, "greedy", "vnpu.flexnpu.io", capacity={"shares": "2"})
    with pytest.raises(Unschedulable):
        sim.allocate(NS, "greedy", NODE)


def test_an_overdrawn_pool_fits_nothing_that_consumes_counters(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    """Counters shrank under an allocation (a republished smaller die): v1.36 refuses every device."""
    api, sim = env
    dev = lambda name, cset: {  # noqa: E731
        **whole(name),
        "consumesCounters": [{"counterSet": cset, "counters": {"memory": {"value": "2"}}}],
    }
    publish_counters(
        api,
        [dev("die-0", "die-0"), dev("die-1", "die-1")],
        {"die-0": {"memory": {"value": "2"}}, "die-1": {"memory": {"value": "2"}}},
    )
    make_claim(api, "a", "npu.flexnpu.io")
    make_claim(api, "b", "npu.flexnpu.io")
    assert results(sim.allocate(NS, "a", NODE))[0]["device"] == "die-0"
    counters = api.read_resource_slice("s-counters")
    counters.spec.shared_counters[0].counters["memory"].value = "1"  # die-0 now overdrawn
    api.replace_resource_slice("s-counters", counters)
    with pytest.raises(Unschedulable):  # die-1 has room, but the pool has an overdrawn counter
        sim.allocate(NS, "b", NODE)

"""Hard-split templates through the fake API server and the v1.36 scheduler stand-in.

The pool is what ``dra_driver.slices.build_pool`` publishes in modes ``hard`` and ``all``; the
scheduler alone must keep every combination within a die.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from dra_driver import slices
from dra_driver.devices import Die, DieMode, Inventory
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.scheduler import SchedulerSim, Unschedulable

DRIVER = "npu.flexnpu.io"
NS = "team-h"
NODE = "node-h"
CLASSES = {
    "npu.flexnpu.io": "whole",
    "vnpu.flexnpu.io": "soft",
    "vnpu-fixed.flexnpu.io": "soft-fixed",
    "vnpu-template.flexnpu.io": "hard",
}


def _die(phy: int, model: str = "910B3", **kw: Any) -> Die:
    return Die(
        vdie_id=f"{phy:08X}-00000000-00000000-00000000-00000000",
        model=model,
        card_id=kw.pop("card_id", phy),
        chip_id=kw.pop("chip_id", 0),
        phy_id=phy,
        logic_id=phy,
        pci_bus_id=f"0000:{phy + 1:02x}:00.0",
        numa_node=0,
        memory_mib=65536,
        aicore=kw.pop("aicore", 20),
        aicpu=7,
        **kw,
    )


@pytest.fixture
def env() -> Iterator[tuple[client.ResourceV1Api, SchedulerSim]]:
    with FakeAPIServer() as srv:
        api_client = srv.api_client()
        client.CoreV1Api(api_client).create_namespace(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
        )
        api = client.ResourceV1Api(api_client)
        for name, mode in CLASSES.items():
            expr = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "{mode}"'
            api.create_device_class(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": expr}}]},
                }
            )
        yield api, SchedulerSim(api_client, DRIVER)
        api_client.close()


def publish(api: client.ResourceV1Api, inventory: Inventory, mode: DieMode) -> slices.DesiredPool:
    pool = slices.build_pool(inventory, driver_name=DRIVER, node_name=NODE, mode_of=lambda d: mode)
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
    return pool


def claim(api: client.ResourceV1Api, name: str, cls: str, *, template: str = "", memory: str = "") -> None:
    exactly: dict[str, Any] = {"deviceClassName": cls}
    if template:
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].template == "{template}"'}}
        ]
    if memory:
        exactly["capacity"] = {"requests": {"memory": memory}}
    api.create_namespaced_resource_claim(
        NS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "npu", "exactly": exactly}]}},
        },
    )


def device(sim: SchedulerSim, name: str) -> str:
    (result,) = sim.allocate(NS, name, NODE)["status"]["allocation"]["devices"]["results"]
    out: str = result["device"]
    return out


def pending(sim: SchedulerSim, name: str) -> bool:
    try:
        sim.allocate(NS, name, NODE)
    except Unschedulable:
        return True
    return False


def test_two_vir10_fill_a_910b3(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0),)), DieMode.ALL)
    for name, cls, tmpl in (
        ("a", "vnpu-template.flexnpu.io", "vir10_3c_32g"),
        ("b", "vnpu-template.flexnpu.io", "vir10_3c_32g"),
        ("c", "vnpu-template.flexnpu.io", "vir10_3c_32g"),
        ("small", "vnpu-template.flexnpu.io", "vir05_1c_16g"),
        ("whole", "npu.flexnpu.io", ""),
    ):
        claim(api, name, cls, template=tmpl)
    claim(api, "share", "vnpu.flexnpu.io", memory="1Gi")
    assert (device(sim, "a"), device(sim, "b")) == ("npu-0-vir10-3c-32g-0", "npu-0-vir10-3c-32g-1")
    assert all(pending(sim, n) for n in ("c", "small", "whole", "share"))
    sim.deallocate(NS, "b")
    assert device(sim, "small") == "npu-0-vir05-1c-16g-0"  # 10 + 5 AI Cores, 32 + 16 GB
    assert pending(sim, "c")


def test_a_whole_die_waits_while_a_template_lives(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0),)), DieMode.ALL)
    claim(api, "t", "vnpu-template.flexnpu.io", template="vir05_1c_16g")
    claim(api, "whole", "npu.flexnpu.io")
    device(sim, "t")
    assert pending(sim, "whole")
    sim.deallocate(NS, "t")
    assert device(sim, "whole") == "npu-0"
    assert pending(sim, "t")  # and the other way round


def test_shares_and_templates_alternate_on_a_die(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0),)), DieMode.ALL)
    for n in ("s1", "s2", "s3"):
        claim(api, n, "vnpu.flexnpu.io", memory="1Gi")
    claim(api, "t", "vnpu-template.flexnpu.io", template="vir05_1c_16g")
    assert device(sim, "s1") == device(sim, "s2") == "vnpu-0"  # shares pile up
    assert pending(sim, "t")
    for n in ("s1", "s2"):
        sim.deallocate(NS, n)
    assert device(sim, "t") == "npu-0-vir05-1c-16g-0"
    assert pending(sim, "s3")


def test_a_die_with_templates_takes_no_share_and_the_reverse_on_two_dies(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    """The ``vnpus`` counter: a template on die 1 sends shares to die 0; shares there keep templates on 1."""
    api, sim = env
    publish(api, Inventory(dies=(_die(0), _die(1))), DieMode.ALL)
    claim(api, "t1", "vnpu-template.flexnpu.io", template="vir05_1c_16g")
    assert device(sim, "t1") == "npu-1-vir05-1c-16g-0"
    for n in ("s1", "s2", "s3"):
        claim(api, n, "vnpu.flexnpu.io", memory="1Gi")
        assert device(sim, n) == "vnpu-0"  # die 1 holds a template
    claim(api, "t2", "vnpu-template.flexnpu.io", template="vir05_1c_16g")
    assert device(sim, "t2") == "npu-1-vir05-1c-16g-1"  # die 0 holds shares
    claim(api, "w", "npu.flexnpu.io")
    assert pending(sim, "w")  # neither die is free
    for n in ("t1", "t2"):
        sim.deallocate(NS, n)
    assert device(sim, "w") == "npu-1"


def test_one_share_policy_per_die_through_the_counter(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0),)), DieMode.ALL)
    claim(api, "elastic", "vnpu.flexnpu.io", memory="1Gi")
    claim(api, "fixed", "vnpu-fixed.flexnpu.io", memory="1Gi")
    assert device(sim, "elastic") == "vnpu-0"
    assert pending(sim, "fixed")  # no taint published here: the die's vnpus counter is at 0
    sim.deallocate(NS, "elastic")
    assert device(sim, "fixed") == "vnpu-0-fixed"


def test_two_share_requests_of_one_claim_share_a_device(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0),)), DieMode.ALL)
    share = {"deviceClassName": "vnpu.flexnpu.io", "capacity": {"requests": {"memory": "1Gi"}}}
    _claim_with(api, "pair", [{"name": "a", "exactly": share}, {"name": "b", "exactly": share}], [])
    results = sim.allocate(NS, "pair", NODE)["status"]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["vnpu-0", "vnpu-0"]
    claim(api, "t", "vnpu-template.flexnpu.io", template="vir05_1c_16g")
    assert pending(sim, "t")


def test_templates_use_the_next_die_when_one_is_full(env: tuple[client.ResourceV1Api, SchedulerSim]) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0), _die(1))), DieMode.HARD)
    names = [f"t{i}" for i in range(5)]
    for n in names:
        claim(api, n, "vnpu-template.flexnpu.io", template="vir10_3c_32g")
    got = [device(sim, n) for n in names[:4]]
    # templates fill dies from the highest physical ID down, one die at a time
    assert got == [
        "npu-1-vir10-3c-32g-0",
        "npu-1-vir10-3c-32g-1",
        "npu-0-vir10-3c-32g-0",
        "npu-0-vir10-3c-32g-1",
    ]
    assert pending(sim, names[4])


def test_sixteen_a3_dies_with_all_templates_are_accepted(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    dies = tuple(
        _die(p, "Ascend910", aicore=24, card_id=p // 2, chip_id=p % 2, die_index=p % 2, npu_name="9392")
        for p in range(16)
    )
    pool = publish(api, Inventory(dies=dies), DieMode.ALL)
    stored = [s.to_dict() for s in api.list_resource_slice().items]
    assert len(stored) == len(pool.slices) == 5
    names = sorted(d.name for s in api.list_resource_slice().items for d in s.spec.devices or [])
    assert names == sorted(pool.device_names) and len(names) == 16 * 10  # whole, 3 share devices, 6 templates
    claim(api, "t", "vnpu-template.flexnpu.io", template="vir12_3c_32g")
    assert device(sim, "t") == "npu-15-vir12-3c-32g-0"
    assert json.dumps(pool.slices)  # serialisable as published


def test_the_api_server_rejects_a_counter_set_over_32_counters(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, _ = env
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "too-many"},
        "spec": {
            "driver": DRIVER,
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "sharedCounters": [{"name": "die-0", "counters": {f"t{k}": {"value": "1"} for k in range(33)}}],
        },
    }
    with pytest.raises(client.exceptions.ApiException) as info:
        api.create_resource_slice(body)
    assert info.value.status == 422 and "at most 32" in info.value.body


def _claim_with(
    api: client.ResourceV1Api, name: str, requests: list[dict[str, Any]], constraints: list[dict[str, Any]]
) -> None:
    api.create_namespaced_resource_claim(
        NS,
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"devices": {"requests": requests, "constraints": constraints}},
        },
    )


def _template(name: str, template: str) -> dict[str, Any]:
    expr = f'device.attributes["{DRIVER}"].template == "{template}"'
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "vnpu-template.flexnpu.io",
            "selectors": [{"cel": {"expression": expr}}],
        },
    }


def test_match_attribute_puts_two_templates_on_one_die(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0), _die(1))), DieMode.HARD)
    claim(api, "filler", "vnpu-template.flexnpu.io", template="vir10_3c_32g")
    assert device(sim, "filler") == "npu-1-vir10-3c-32g-0"  # die 1 has 10 AI Cores left
    requests = [_template("big", "vir10_3c_32g"), _template("small", "vir05_1c_16g")]
    _claim_with(api, "pair", requests, [{"matchAttribute": f"{DRIVER}/phyID"}])
    results = sim.allocate(NS, "pair", NODE)["status"]["allocation"]["devices"]["results"]
    # first fit puts "big" on die 1 (10 AI Cores left), where "small" no longer fits; the
    # constraint makes the search go back and put both on die 0
    assert [r["device"] for r in results] == ["npu-0-vir10-3c-32g-0", "npu-0-vir05-1c-16g-0"]


def test_distinct_attribute_spreads_one_request_over_dies(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0), _die(1))), DieMode.HARD)
    two = _template("two", "vir05_1c_16g")
    two["exactly"]["count"] = 2
    _claim_with(api, "spread", [two], [{"distinctAttribute": f"{DRIVER}/phyID"}])
    results = sim.allocate(NS, "spread", NODE)["status"]["allocation"]["devices"]["results"]
    assert [r["device"] for r in results] == ["npu-1-vir05-1c-16g-0", "npu-0-vir05-1c-16g-0"]
    _claim_with(
        api,
        "three",
        [{**two, "exactly": {**two["exactly"], "count": 3}}],
        [{"distinctAttribute": f"{DRIVER}/phyID"}],
    )
    assert pending(sim, "three")


def test_allocation_mode_all_takes_every_matching_device(
    env: tuple[client.ResourceV1Api, SchedulerSim],
) -> None:
    api, sim = env
    publish(api, Inventory(dies=(_die(0), _die(1))), DieMode.HARD)
    every = _template("every", "vir10_3c_32g")
    every["exactly"]["allocationMode"] = "All"
    _claim_with(api, "all", [every], [])
    results = sim.allocate(NS, "all", NODE)["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == [
        f"npu-{p}-vir10-3c-32g-{i}" for p in (0, 1) for i in (0, 1)
    ]
    _claim_with(api, "again", [every], [])
    assert pending(sim, "again")  # every matching device is taken

"""The NPU pool as the helper's slice controller publishes it: modes from the inventory, and the counters that
make the scheduler itself keep whole-die and share claims of one die apart."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from controller.kube import Kube
from dra_driver import slices
from dra_driver.devices import Die, DieMode, Health, Inventory
from dra_kubeletplugin.resourceslice.controller import SliceController
from dra_kubeletplugin.resourceslice.pools import DriverResources
from flexnpu_testing.fake_apiserver import FakeAPIServer

DRIVER = "npu.flexnpu.io"


def _die(phy: int, health: Health = Health.HEALTHY) -> Die:
    return Die(
        vdie_id=f"{phy:08X}-00000000-00000000-00000000-00000000",
        model="910B3",
        card_id=phy,
        chip_id=0,
        phy_id=phy,
        logic_id=phy,
        pci_bus_id=f"0000:{phy % 256:02x}:00.0",
        numa_node=0,
        memory_mib=65536,
        aicore=20,
        aicpu=7,
        health=health,
    )


def _inventory(n: int) -> Inventory:
    return Inventory(dies=tuple(_die(i) for i in range(n)), driver_version="25.5.0")


@dataclass
class Node:
    server: FakeAPIServer
    kube: Kube
    name: str
    inventory: Inventory

    def publisher(self) -> SliceController:
        pool = slices.build_pool(self.inventory, driver_name=DRIVER, node_name=self.name)
        return SliceController(
            self.kube.for_helper(),  # the helper sees its own errors, as on a node
            driver_name=DRIVER,
            node_name=self.name,
            resources=DriverResources.single(pool),
            log=logging.getLogger("test.publisher"),
        )

    def stored(self) -> list[dict[str, Any]]:
        items, _ = self.kube.list_slices(driver=DRIVER, node=self.name)
        return sorted(items, key=lambda s: s["metadata"]["name"])


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    with FakeAPIServer() as server:
        name = f"node-{uuid.uuid4().hex[:8]}"
        client.CoreV1Api(server.api_client()).create_node(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}
        )
        kube = Kube.from_config(str(server.write_kubeconfig(tmp_path / "kubeconfig")))
        yield Node(server=server, kube=kube, name=name, inventory=_inventory(2))
        kube.close()


def test_node_modes_from_inventory(node: Node) -> None:
    node.inventory = replace(_inventory(2), die_modes={0: DieMode.WHOLE, 1: DieMode.SOFT})
    node.publisher().sync()
    names = [d["name"] for s in node.stored() for d in s["spec"].get("devices", [])]
    assert names == ["npu-0", "vnpu-1", "vnpu-1-fixed", "vnpu-1-best-effort"]


@pytest.mark.parametrize(
    ("first", "second"),
    [
        pytest.param("npu.flexnpu.io", "vnpu.flexnpu.io", id="whole-blocks-share"),
        pytest.param("vnpu.flexnpu.io", "npu.flexnpu.io", id="share-blocks-whole"),
    ],
)
def test_published_both_mode_keeps_whole_and_shares_apart(node: Node, first: str, second: str) -> None:
    """The published counters make a (simulated) first-fit allocator exclude whole vs. shares."""
    from flexnpu_testing.scheduler import SchedulerSim, Unschedulable

    node.inventory = _inventory(1)  # one die, published as npu-0 + vnpu-0 sharing die-0
    node.publisher().sync()
    api_client = node.server.api_client()
    client.CoreV1Api(api_client).create_namespace(
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "t"}}
    )
    api = client.ResourceV1Api(api_client)
    for cls, mode in (("npu.flexnpu.io", "whole"), ("vnpu.flexnpu.io", "soft")):
        expression = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "{mode}"'
        api.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": cls},
                "spec": {"selectors": [{"cel": {"expression": expression}}]},
            }
        )
    for name, cls in (("first", first), ("second", second), ("third", "vnpu.flexnpu.io")):
        request: dict[str, Any] = {"deviceClassName": cls}
        if cls == "vnpu.flexnpu.io":
            request["capacity"] = {"requests": {"memory": "1Gi"}}
        api.create_namespaced_resource_claim(
            "t",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "npu", "exactly": request}]}},
            },
        )
    sim = SchedulerSim(api_client, DRIVER)
    sim.allocate("t", "first", node.name)
    with pytest.raises(Unschedulable):
        sim.allocate("t", "second", node.name)
    if first == "vnpu.flexnpu.io":  # shares still fit next to shares
        sim.allocate("t", "third", node.name)
        sim.deallocate("t", "third")
    sim.deallocate("t", "first")
    sim.allocate("t", "second", node.name)
    api_client.close()

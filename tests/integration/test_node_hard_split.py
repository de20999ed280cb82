"""Hard-split vNPUs through the real node process (mode ``all``) and the kubelet simulator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.discovery import emulated
from dra_driver.vnpu import check_template
from dra_driver.vnpu.emulated import EmulatedVnpus
from tests.integration.conftest import DRIVER, INVENTORIES, Node, wait_for

HARD_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "hard"'
INVENTORY = "eight-910b4.yaml"


@pytest.fixture
def hard_node(node_factory: Callable[..., Node]) -> Callable[..., Node]:
    def make(**env: str) -> Node:
        n = node_factory(INVENTORY, FLEXNPU_DEFAULT_MODE="all", **env)
        n.resource.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "vnpu-template.flexnpu.io"},
                "spec": {"selectors": [{"cel": {"expression": HARD_CEL}}]},
            }
        )
        return n

    return make


def template_request(template: str, name: str = "vnpu") -> dict[str, Any]:
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "vnpu-template.flexnpu.io",
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].template == "{template}"'}}],
        },
    }


def test_all_mode_publishes_templates_next_to_whole_and_soft(hard_node: Callable[..., Node]) -> None:
    node = hard_node().start()
    devices = wait_for("published devices", node.devices)
    names = {d["name"] for d in devices}
    assert {"npu-0", "vnpu-0", "npu-0-vir10-3c-16g-0", "npu-0-vir10-3c-16g-1", "npu-7-vir05-1c-8g-3"} <= names
    sets = {c["name"]: c["counters"] for s in node.slices() for c in s["spec"].get("sharedCounters") or []}
    assert sets["die-0"]["aicore"] == {"value": "20"} and sets["die-0"]["vnpus"] == {"value": "8"}


def test_a_die_with_a_vnpu_made_outside_the_driver_is_published_without_it(
    hard_node: Callable[..., Node],
) -> None:
    node = hard_node()
    inv = emulated.load_inventory(INVENTORIES / INVENTORY)
    die = inv.by_phy_id(3)
    assert die is not None
    EmulatedVnpus(node.dirs["devroot"], inv).create(
        die, check_template(die, "vir10_3c_16g", inv), 3 * 16 + 100
    )
    node.start()
    devices = wait_for("published devices", node.devices)
    names = {d["name"] for d in devices}
    assert "npu-3" not in names and "vnpu-3" not in names and "npu-2" in names
    sets = {c["name"]: c["counters"] for s in node.slices() for c in s["spec"].get("sharedCounters") or []}
    assert sets["die-3"]["aicore"] == {"value": "10"} and sets["die-3"]["vnpus"] == {"value": "7"}
    assert "was not made by this driver" in node.log()

"""The hard-split example folders do what their READMEs promise (see ``test_examples.py``).

Each example's claims are created in the fake API server, allocated by the scheduler stand-in
against the slices the real node process publishes in mode ``all``, and prepared through the
kubelet simulator; the vNPUs are checked in the emulated driver's state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.discovery import emulated
from dra_driver.vnpu.emulated import EmulatedVnpus
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, INVENTORIES, NODE, Node
from tests.integration.test_examples import Example

HARD_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "hard"'


@pytest.fixture
def all_node(node_factory: Callable[..., Node]) -> Node:
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="all", FLEXNPU_DAEMON_RETRY_SECONDS="2")
    n.resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "vnpu-template.flexnpu.io"},
            "spec": {"selectors": [{"cel": {"expression": HARD_CEL}}]},
        }
    )
    n.start()
    wait_for(n.devices, what="published devices")
    return n


def _vnpus(node: Node) -> list[Any]:
    inv = emulated.load_inventory(INVENTORIES / "eight-910b4.yaml")
    return list(EmulatedVnpus(node.dirs["devroot"], inv).list())


def _device(alloc: dict[str, Any]) -> str:
    (result,) = alloc["status"]["allocation"]["devices"]["results"]
    out: str = result["device"]
    return out


def test_hard_split(all_node: Node) -> None:
    ex = Example(all_node, "hard-split")
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    device = _device(ex.allocate(claim.name))
    assert device.startswith("npu-") and "-vir10-3c-16g-" in device
    res = ex.prepare(claim.name)
    (vnpu,) = _vnpus(all_node)
    assert vnpu.template == "vir10_3c_16g"
    assert f"FLEXNPU_VNPU_IDS={vnpu.vnpu_id}" in ex.cdi_env(claim.name)
    assert f"FLEXNPU_TEMPLATES={vnpu.template}" in ex.cdi_env(claim.name)
    (status,) = wait_for(lambda: ex.stored(claim.name)["status"].get("devices"), what="claim status")
    assert status["data"]["template"] == "vir10_3c_16g" and status["data"]["vnpuID"] == vnpu.vnpu_id
    assert res.devices[0].device == device
    ex.release(claim.name)
    assert _vnpus(all_node) == []


def test_whole_soft_hard(all_node: Node) -> None:
    ex = Example(all_node, "whole-soft-hard")
    claims = ex.pod_claims()
    assert sorted(claims) == [
        "pod-hard-a-vnpu",
        "pod-hard-b-vnpu",
        "pod-share-a-vnpu",
        "pod-share-b-vnpu",
        "pod-whole-npu",
    ]
    got = {}
    for name, claim in claims.items():
        ex.create(claim)
        got[name] = _device(ex.allocate(name))
    die = {name: int(dev.split("-")[1]) for name, dev in got.items()}
    assert got["pod-whole-npu"] == f"npu-{die['pod-whole-npu']}"
    assert got["pod-share-a-vnpu"] == got["pod-share-b-vnpu"] == f"vnpu-{die['pod-share-a-vnpu']}"
    assert die["pod-hard-a-vnpu"] == die["pod-hard-b-vnpu"]
    assert len({die["pod-whole-npu"], die["pod-share-a-vnpu"], die["pod-hard-a-vnpu"]}) == 3  # three dies
    for name in claims:
        ex.prepare(name)
    assert sorted(v.template for v in _vnpus(all_node)) == ["vir10_3c_16g", "vir10_3c_16g"]
    # a second whole-die claim for the die with the templates stays pending
    hard_die = die["pod-hard-a-vnpu"]
    all_node.create_claim(
        "pinned",
        [
            {
                "name": "npu",
                "exactly": {
                    "deviceClassName": "npu.flexnpu.io",
                    "selectors": [
                        {"cel": {"expression": f'device.attributes["{DRIVER}"].phyID == {hard_die}'}}
                    ],
                },
            }
        ],
    )
    with pytest.raises(Unschedulable):
        all_node.scheduler.allocate("team-a", "pinned", NODE)
    for name in claims:
        ex.release(name)
    assert _vnpus(all_node) == []

"""Podman as the CDI consumer of a hard-split vNPU prepared by the real node process (mode all).

The container gets the vNPU's node (host ``vdavinci<id>`` as ``/dev/davinci<id>``) and the shared
Ascend nodes, and nothing of the physical die; after unprepare the vNPU and its spec are gone.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from dra_driver.discovery import emulated
from dra_driver.vnpu.emulated import EmulatedVnpus
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.podman import Podman
from flexnpu_testing.waiting import wait_for
from tests.e2e.test_podman_cdi import CHAR_NULL, probe_script, run_ok
from tests.integration.conftest import DRIVER, INVENTORIES, NAMESPACE, NODE, Node

pytestmark = [pytest.mark.podman, pytest.mark.root]

HARD_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "hard"'


def test_node_prepared_hard_vnpu_runs_in_podman(podman: Podman, node_factory: Callable[..., Node]) -> None:
    node = node_factory("eight-910b4.yaml", FLEXNPU_DEFAULT_MODE="all")
    node.resource.create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "vnpu-template.flexnpu.io"},
            "spec": {"selectors": [{"cel": {"expression": HARD_CEL}}]},
        }
    )
    node.start()
    wait_for(node.devices, what="published devices")
    request = {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu-template.flexnpu.io",
            "selectors": [
                {"cel": {"expression": f'device.attributes["{DRIVER}"].template == "vir05_1c_8g"'}}
            ],
        },
    }
    uid = node.create_claim("e2e-hard", [request])
    node.scheduler.allocate(NAMESPACE, "e2e-hard", NODE)
    ref = ClaimRef(NAMESPACE, uid, "e2e-hard")
    assert node.kubelet is not None
    result = node.kubelet.prepare([ref])[uid]
    assert result.error == "", result.error
    inv = emulated.load_inventory(INVENTORIES / "eight-910b4.yaml")
    (vnpu,) = EmulatedVnpus(node.dirs["devroot"], inv).list()
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]
    paths = [f"/dev/davinci{vnpu.vnpu_id}", f"/dev/davinci{vnpu.phy_id}", "/dev/davinci_manager"]
    probe = run_ok(podman, cdi_ids, node.dirs["cdi"], probe_script(paths))
    assert probe.nodes == {
        f"/dev/davinci{vnpu.vnpu_id}": CHAR_NULL,
        f"/dev/davinci{vnpu.phy_id}": "absent",
        "/dev/davinci_manager": CHAR_NULL,
    }
    assert probe.env["FLEXNPU_VNPU_IDS"] == str(vnpu.vnpu_id)
    assert probe.env["FLEXNPU_TEMPLATES"] == "vir05_1c_8g"
    assert node.kubelet.unprepare([ref]) == {uid: ""}
    assert EmulatedVnpus(node.dirs["devroot"], inv).list() == () and node.cdi_specs() == []

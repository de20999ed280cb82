"""A changed inventory is served or refused as one, with real processes and no restart: the inventory file under a
running node process and flexnpu-daemon grows from 2 dies to 4 (one of them for hard-split templates) and a mode
changes; the new dies are published only once the daemon serves them, their emulated device nodes exist and the
vNPU manager knows them, and a share, a whole die and a template on the new dies prepare. A die that disappears
is withdrawn from the pool while the share prepared on it keeps its aclserver and unprepares normally."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from dra_driver.daemon_api.client import DaemonClient
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing import fake_npu_smi
from flexnpu_testing.daemon import DaemonProc
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node

SAMPLES = Path(__file__).resolve().parents[1] / "data" / "npu-smi"


def write_inventory(path: Path, modes: list[str] | dict[int, str]) -> None:
    cards = dict(enumerate(modes)) if isinstance(modes, list) else modes
    doc = {
        "driverVersion": "24.1.rc3",
        "firmwareVersion": "7.5.0.1.129",
        "chips": [{"model": "910B4", "card": c, "mode": m} for c, m in sorted(cards.items())],
    }
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)  # as the kubelet swaps a ConfigMap volume: atomically


def on_die(phy: int, cls: str, **extra: Any) -> dict[str, Any]:
    sel = f'device.attributes["{DRIVER}"].phyID == {phy}'
    if "template" in extra:
        sel += f' && device.attributes["{DRIVER}"].template == "{extra.pop("template")}"'
    return {
        "name": "r",
        "exactly": {"deviceClassName": cls, "selectors": [{"cel": {"expression": sel}}], **extra},
    }


@pytest.fixture
def changing(node_factory: Callable[..., Node], short_tmp: Path) -> Iterator[tuple[Node, DaemonProc, Path]]:
    inventory = short_tmp / "inventory.yaml"
    write_inventory(inventory, ["both", "soft"])
    daemon = DaemonProc(extra=("--inventory", str(inventory), "--rediscover-seconds", "0.3")).start()
    node = node_factory(
        FLEXNPU_INVENTORY=str(inventory),
        FLEXNPU_DAEMON_SOCKET=str(daemon.socket),
        FLEXNPU_SHM_DIR=str(daemon.shm_root),
        FLEXNPU_DEVICE_ROOT=str(short_tmp / "devroot-built"),
        FLEXNPU_BUILD_DEVICE_ROOT="true",
        FLEXNPU_REDISCOVER_SECONDS="0.2",
    )
    node.daemon = daemon
    client.ResourceV1Api(node.api.api_client()).create_device_class(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": "vnpu-template.flexnpu.io"},
            "spec": {"selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].mode == "hard"'}}]},
        }
    )
    try:
        yield node.start(), daemon, inventory
    finally:
        node.stop()
        daemon.cleanup()  # its aclservers outlive a stopped daemon by design: end them and their cgroups


def device_names(node: Node) -> set[str]:
    return {d["name"] for d in node.devices()}


def prepare(node: Node, name: str, request: dict[str, Any]) -> str:
    uid = node.create_claim(name, [request])
    node.scheduler.allocate(NAMESPACE, name, NODE)
    assert node.kubelet is not None
    result = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid]
    assert result.error == "", result.error + "\n" + node.log()[-6000:]
    return uid


def test_new_dies_are_served_without_restarts(changing: tuple[Node, DaemonProc, Path]) -> None:
    node, daemon, inventory = changing
    wait_for(lambda: {"npu-0", "vnpu-0", "vnpu-1"} <= device_names(node), what="the first pool")
    assert not any(n.startswith(("npu-2", "vnpu-2", "npu-3")) for n in device_names(node))
    pid = node.proc.pid if node.proc else 0

    write_inventory(inventory, ["both", "whole", "both", "hard"])
    wait_for(
        lambda: (
            {"npu-0", "npu-1", "npu-2", "vnpu-2"} <= (names := device_names(node))
            and any(n.startswith("npu-3-vir") for n in names)
            and "vnpu-1" not in names
        ),
        what="the grown pool",
        timeout=30,
    )
    with DaemonClient(daemon.socket, timeout=5) as c:
        assert set(c.health().die_ids) == {0, 1, 2, 3}  # published only what the daemon serves
    log = node.log()
    assert "inventory changed: dies added [2, 3]; die 1 mode soft -> whole" in log
    assert "vNPU manager is started" in log

    share = prepare(
        node,
        "share-2",
        on_die(2, "vnpu.flexnpu.io", capacity={"requests": {"memory": "256Mi", "compute": "10"}}),
    )
    prepare(node, "whole-1", on_die(1, "npu.flexnpu.io"))  # its device node was built while running
    prepare(node, "tmpl-3", on_die(3, "vnpu-template.flexnpu.io", template="vir05_1c_8g"))
    assert node.proc is not None and node.proc.pid == pid  # no restart

    # die 2 goes while its share is prepared: withdrawn from the pool, the aclserver stays, unprepare works
    write_inventory(inventory, {0: "both", 1: "whole", 3: "hard"})
    wait_for(
        lambda: "vnpu-2" not in device_names(node) and device_names(node), what="die 2 withdrawn", timeout=30
    )
    with DaemonClient(daemon.socket, timeout=5) as c:
        assert share in {e.entity_id for e in c.list()}
    assert node.kubelet is not None
    assert node.kubelet.unprepare([ClaimRef(NAMESPACE, share, "share-2")]) == {share: ""}
    assert node.stop(signal.SIGTERM) == 0


def test_a_mode_only_change_is_logged_truthfully(changing: tuple[Node, DaemonProc, Path]) -> None:
    node, _daemon, inventory = changing
    wait_for(lambda: "vnpu-1" in device_names(node), what="the first pool")
    write_inventory(inventory, ["both", "whole"])
    wait_for(
        lambda: "npu-1" in device_names(node) and "vnpu-1" not in device_names(node),
        what="die 1 whole",
        timeout=30,
    )
    assert "inventory changed: die 1 mode soft -> whole" in node.log()
    assert "inventory changed (dies [])" not in node.log()


def test_a_real_nodes_npu_smi_change_follows_the_same_path(
    node_factory: Callable[..., Node], short_tmp: Path
) -> None:
    """No inventory file: the node process and the daemon ask (a fake) npu-smi, whose answer changes from a
    two-die 310P3 card to eight 910B4 chips (recorded outputs, tests/data/npu-smi)."""
    home, root = short_tmp / "smi", short_tmp / "smi-root"
    exe = fake_npu_smi.install(home, device_root=root, samples=SAMPLES / "310p3-duo")
    before = {d.phy_id for d in fake_npu_smi._inventory(fake_npu_smi._config(home)).dies}
    daemon = DaemonProc(
        extra=("--inventory", "", "--npu-smi", str(exe), "--rediscover-seconds", "0.3")
    ).start()
    node = node_factory(
        FLEXNPU_INVENTORY="",
        FLEXNPU_NPU_SMI=str(exe),
        FLEXNPU_DAEMON_SOCKET=str(daemon.socket),
        FLEXNPU_SHM_DIR=str(daemon.shm_root),
        FLEXNPU_REDISCOVER_SECONDS="0.2",
    )
    try:
        node.start()
        wait_for(lambda: {f"vnpu-{p}" for p in before} <= device_names(node), what="the first pool")
        fake_npu_smi.install(
            home, device_root=root, samples=SAMPLES / "a2-8x910b4"
        )  # the node's answer changes
        after = {d.phy_id for d in fake_npu_smi._inventory(fake_npu_smi._config(home)).dies}
        new = max(after - before)
        wait_for(
            lambda: {f"vnpu-{p}" for p in after} <= device_names(node),
            what="the new dies published",
            timeout=30,
        )
        with DaemonClient(daemon.socket, timeout=5) as c:
            assert set(c.health().die_ids) == after
        assert "inventory changed: dies added" in node.log()
        prepare(node, "share-new", on_die(new, "vnpu.flexnpu.io", capacity={"requests": {"memory": "256Mi"}}))
    finally:
        node.stop()
        daemon.cleanup()  # its aclservers outlive a stopped daemon by design: end them and their cgroups

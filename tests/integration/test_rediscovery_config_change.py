"""A config change publishes only what the node serves (issue 25, class 12), with real processes.

On a real cluster the kubelet updates a ConfigMap volume in each pod on its own schedule: after a
``helm upgrade`` that changes the emulated inventory (8 dies, mode ``all``), the plugin may read
the new file, or start with it (a rolling update), while flexnpu-daemon still serves the old one.
Reported: the plugin published 128 devices on 8 dies within 2 s, and a template claim the
scheduler put on die 7 failed prepare with ``DeviceNotFound`` "die 7 is not on this node (known
dies: 0, 1)". Here the node process and the daemon read two inventory files, changed apart.

Also: the kubelet's repeat prepare of a live claim whose die was withdrawn succeeds from the
checkpoint (nothing removed), so its pod can restart.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from dra_driver.daemon_api.client import DaemonClient
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.daemon import DaemonProc
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, Node
from tests.integration.test_rediscovery import on_die, prepare, write_inventory

TEMPLATE_CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": "vnpu-template.flexnpu.io"},
    "spec": {"selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].mode == "hard"'}}]},
}
TWO = ["both", "both"]
EIGHT_ALL = ["all"] * 8


def phys(node: Node) -> set[int]:
    """The dies the node's published devices are on."""
    return {int(d["attributes"]["phyID"]["int"]) for d in node.devices()}


@pytest.fixture
def apart(
    node_factory: Callable[..., Node], short_tmp: Path
) -> Iterator[tuple[Callable[..., Node], DaemonProc, Path, Path]]:
    """A daemon on its own inventory file (2 dies) and a node-making function on another."""
    node_file, daemon_file = short_tmp / "node-inventory.yaml", short_tmp / "daemon-inventory.yaml"
    write_inventory(daemon_file, TWO)
    daemon = DaemonProc(extra=("--inventory", str(daemon_file), "--rediscover-seconds", "0.3")).start()

    def make() -> Node:
        node = node_factory(
            FLEXNPU_INVENTORY=str(node_file),
            FLEXNPU_DAEMON_SOCKET=str(daemon.socket),
            FLEXNPU_SHM_DIR=str(daemon.shm_root),
            FLEXNPU_DEVICE_ROOT=str(short_tmp / "devroot-built"),
            FLEXNPU_BUILD_DEVICE_ROOT="true",
            FLEXNPU_REDISCOVER_SECONDS="0.2",
        )
        with contextlib.suppress(client.ApiException):  # as the chart makes it; once per API server
            client.ResourceV1Api(node.api.api_client()).create_device_class(TEMPLATE_CLASS)
        return node

    try:
        yield make, daemon, node_file, daemon_file
    finally:
        daemon.cleanup()  # its aclservers outlive a stopped daemon by design: end them and their cgroups


def test_a_node_started_on_a_newer_inventory_than_the_daemons_publishes_only_what_the_daemon_serves(
    apart: tuple[Callable[..., Node], DaemonProc, Path, Path],
) -> None:
    """The rolling update's new plugin pod reads the 8-die file first; the daemon still serves 2 dies."""
    make, daemon, node_file, daemon_file = apart
    write_inventory(node_file, EIGHT_ALL)
    node = make().start()
    assert phys(node) == {0, 1}, sorted(phys(node))  # the first publication already held the others back
    assert "not published yet: flexnpu-daemon does not serve them yet" in node.log()
    write_inventory(daemon_file, EIGHT_ALL)  # the daemon pod's volume catches up
    wait_for(
        lambda: phys(node) == set(range(8)),
        what="all 8 dies published once the daemon serves them",
        timeout=30,
    )
    with DaemonClient(daemon.socket, timeout=5) as c:
        assert set(c.health().die_ids) == set(range(8))
    prepare(node, "tmpl-7", on_die(7, "vnpu-template.flexnpu.io", template="vir05_1c_8g"))
    prepare(
        node,
        "share-6",
        on_die(6, "vnpu.flexnpu.io", capacity={"requests": {"memory": "256Mi", "compute": "10"}}),
    )


def test_a_running_node_whose_inventory_grows_first_waits_for_the_daemon(
    apart: tuple[Callable[..., Node], DaemonProc, Path, Path],
) -> None:
    make, _daemon, node_file, daemon_file = apart
    write_inventory(node_file, TWO)
    node = make().start()
    wait_for(lambda: phys(node) == {0, 1}, what="the first pool")
    write_inventory(node_file, EIGHT_ALL)  # the plugin pod's volume is updated first
    wait_for(
        lambda: "die(s) [2, 3, 4, 5, 6, 7] not published yet" in node.log(),
        what="the new dies held back",
        timeout=30,
    )
    assert phys(node) == {0, 1}
    write_inventory(daemon_file, EIGHT_ALL)
    wait_for(lambda: phys(node) == set(range(8)), what="all 8 dies published", timeout=30)
    prepare(node, "tmpl-7", on_die(7, "vnpu-template.flexnpu.io", template="vir05_1c_8g"))


def test_the_repeat_prepare_of_a_live_claim_whose_die_was_withdrawn_succeeds(
    apart: tuple[Callable[..., Node], DaemonProc, Path, Path],
) -> None:
    """The kubelet prepares a claim again whenever its pod restarts: with the die withdrawn from the
    inventory the claim's aclserver still serves it, so the repeat prepare answers from the checkpoint."""
    make, daemon, node_file, daemon_file = apart
    write_inventory(node_file, ["both", "both", "both"])
    write_inventory(daemon_file, ["both", "both", "both"])
    node = make().start()
    wait_for(lambda: 2 in phys(node), what="die 2 published")
    uid = prepare(
        node,
        "share-2",
        on_die(2, "vnpu.flexnpu.io", capacity={"requests": {"memory": "256Mi", "compute": "10"}}),
    )
    assert node.kubelet is not None
    ref = ClaimRef(NAMESPACE, uid, "share-2")
    first = node.kubelet.prepare([ref])[uid]
    write_inventory(node_file, TWO)  # die 2 goes (a withdrawn die, a changed ConfigMap)
    write_inventory(daemon_file, TWO)
    wait_for(lambda: 2 not in phys(node) and phys(node), what="die 2 withdrawn", timeout=30)
    again = node.kubelet.prepare([ref])[uid]
    assert again.error == "", again.error
    assert again == first
    with DaemonClient(daemon.socket, timeout=5) as c:
        assert uid in {e.entity_id for e in c.list()}  # nothing removed
    assert node.kubelet.unprepare([ref]) == {uid: ""}

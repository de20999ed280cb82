"""``flexnpu-smi uninstall`` after the node process and the daemon stopped: it refuses while a claim is prepared,
lists what it would remove without --yes, then removes the driver's leftovers (ledgers, client library copy,
daemon registry, emulated device root, serialize.lock, readiness records, the control link, the node's slices)
and nothing else. Real node process, daemon, netlink (root), the fake API server."""

from __future__ import annotations

import signal
from collections.abc import Callable

from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import share_request, smi


def link_exists(name: str) -> bool:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return bool(ipr.link_lookup(ifname=name))


def test_uninstall_refuses_then_lists_then_removes(node_factory: Callable[..., Node]) -> None:
    node = node_factory(daemon=True, FLEXNPU_POD_UID="33333333-3333-4333-8333-333333333333").start()
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("train", [share_request()])
    node.scheduler.allocate(NAMESPACE, "train", NODE)
    assert node.kubelet is not None
    assert node.kubelet.prepare([ClaimRef(NAMESPACE, uid, "train")])[uid].error == ""
    # leftovers a real node has: the client library copy, a ledger, the serialize lock, a daemon registry
    state = node.dirs["state"]
    (state / "client").mkdir()
    (state / "client" / "libascendcl.so").write_bytes(b"\x7fELF")
    (state / "daemon").mkdir()
    (state / "daemon" / "registry.json").write_text("{}")
    outside = node.root / "outside.txt"
    outside.write_text("keep me")
    (state / "client" / "link-out").symlink_to(outside)  # a symlink is removed, its target kept

    refused = smi(node, "uninstall", "--yes")
    assert refused.returncode == 1 and f"refusing: claim {uid} is prepared" in refused.stdout
    assert (state / "client").exists()

    assert node.kubelet.unprepare([ClaimRef(NAMESPACE, uid, "train")]) == {uid: ""}
    link = node.env["FLEXNPU_CONTROL_LINK"]
    node.stop(signal.SIGKILL)  # not a clean stop: its slices and link stay behind
    assert node.slices() and link_exists(link)
    assert node.daemon is not None
    node.daemon.stop()

    dry = smi(node, "uninstall")
    assert (
        dry.returncode == 1 and "flexnpu-daemon does not answer" in dry.stdout
    )  # doubt: it may run aclservers
    dry = smi(node, "uninstall", "--force")
    assert dry.returncode == 0 and "dry run: nothing removed" in dry.stdout
    assert f"would remove client library copy: {state / 'client'}" in dry.stdout
    assert (state / "client").exists() and node.slices()

    done = smi(node, "uninstall", "--yes", "--force")
    assert done.returncode == 0, done.stdout + done.stderr
    for gone in (state / "client", state / "daemon", node.dirs["run"] / "plugins", node.dirs["devroot"]):
        assert not gone.exists(), (gone, done.stdout)
    assert not (node.dirs["plugins"] / "npu.flexnpu.io" / "serialize.lock").exists()
    assert not (node.dirs["shm"] / ".ledger").exists()
    assert not link_exists(link)
    assert node.slices() == []
    assert outside.read_text() == "keep me"
    again = smi(node, "uninstall", "--yes", "--force")
    assert again.returncode == 0 and "already absent: client library copy" in again.stdout

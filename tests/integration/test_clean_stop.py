"""A clean stop (SIGTERM) of the node process: the last instance on the node withdraws its slices at once and
removes the control link when nothing is prepared; a rolling update's old instance leaves both to the surge pod;
a prepared claim keeps the link. Real node processes, a real daemon, real netlink (root), the fake API server."""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Callable

from dra_kubeletplugin.claims import ClaimRef
from dra_kubeletplugin.registration import other_instances
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node

WHOLE = {"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}


def link_exists(node: Node) -> bool:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        return bool(ipr.link_lookup(ifname=node.env["FLEXNPU_CONTROL_LINK"]))


def test_last_instance_withdraws_slices_and_the_idle_link(node_factory: Callable[..., Node]) -> None:
    node = node_factory(daemon=True).start()
    wait_for(node.devices, what="published devices")
    assert link_exists(node)
    assert node.stop(signal.SIGTERM) == 0
    assert node.slices() == []  # at once, not 30 s later by the kubelet
    assert not link_exists(node), node.log()[-3000:]
    assert "withdrew" in node.log() and "removed the control link" in node.log()


def test_a_prepared_claim_keeps_the_link(node_factory: Callable[..., Node]) -> None:
    node = node_factory(daemon=True).start()
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("whole", [WHOLE])
    node.scheduler.allocate(NAMESPACE, "whole", NODE)
    assert node.kubelet is not None
    assert node.kubelet.prepare([ClaimRef(NAMESPACE, uid, "whole")])[uid].error == ""
    assert node.stop(signal.SIGTERM) == 0
    assert node.slices() == []
    assert link_exists(node), "the link went while a claim is prepared"


def test_daemon_unreachable_keeps_the_link(node_factory: Callable[..., Node]) -> None:
    node = node_factory().start()  # names a daemon socket nobody serves
    wait_for(node.devices, what="published devices")
    assert node.stop(signal.SIGTERM) == 0
    assert link_exists(node) and "cannot prove nothing is prepared" in node.log()


def test_rolling_update_keeps_the_slices(node_factory: Callable[..., Node]) -> None:
    old = node_factory(FLEXNPU_POD_UID="11111111-1111-4111-8111-111111111111").start()
    wait_for(old.devices, what="published devices")
    new = dataclasses.replace(
        old,
        env={**old.env, "FLEXNPU_POD_UID": "22222222-2222-4222-8222-222222222222"},
        log_file=old.root / "node-new.log",
        proc=None,
        kubelet=None,
    )
    new.start()
    old_endpoint = str(old.dirs["plugins"] / DRIVER / "dra-11111111-1111-4111-8111-111111111111.sock")
    wait_for(
        lambda: other_instances(old.dirs["registry"], DRIVER, old_endpoint), what="the surge instance serving"
    )
    assert old.stop(signal.SIGTERM) == 0
    assert old.devices(), f"the surge pod serves: the slices must stay\n{old.log()[-3000:]}"
    assert "other instance(s) serve this node" in old.log()
    assert link_exists(old)
    assert new.stop(signal.SIGTERM) == 0
    assert new.slices() == []

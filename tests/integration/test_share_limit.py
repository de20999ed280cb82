"""One per-die limit, seen identically by the scheduler and the node: one aclserver = one slot.

A ``vnpus: 16`` claim is one share request (one ``shares`` unit in the scheduler) served by one
aclserver with 16 vNPUs (16 ledger entries, one slot). On one die, through the scheduler stand-in
(it charges consumable capacity as the v1.36 allocator does), the real node process, the real
daemon and 63 real aclservers: every one of 63 such claims prepares, the 64th stays Pending.
The die is an emulated one with 128 GiB, so that memory (63 x 2 GiB) is not what runs out, and
the shares are ``memory-only`` with the default 1 % compute, so that compute is not either.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dra_driver.sharing import API_VERSION
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_runtime.aclserver import ledger
from flexnpu_runtime.daemon.launch_spec import LEDGER_DIR_NAME
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.scheduler import Unschedulable
from flexnpu_testing.waiting import wait_for
from flexnpu_wire.launch import DEFAULT_MAX_SHARES_PER_DIE
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node, make_node
from tests.integration.daemon_harness import DaemonProc
from tests.integration.lifecycle_helpers import pod_ref, share_request

pytestmark = pytest.mark.timeout(900)

INVENTORY = """\
chips:
  - {model: 910B3, card: 0, phyId: 0, memoryMiB: 131072, mode: soft}
"""
VNPUS = 16
CONFIG = [
    {
        "opaque": {
            "driver": DRIVER,
            "parameters": {
                "apiVersion": API_VERSION,
                "kind": "VnpuConfig",
                "vnpus": VNPUS,
                "isolation": "memory-only",
            },
        }
    }
]


@pytest.fixture
def big_die(api: FakeAPIServer, short_tmp: Path) -> Iterator[Node]:
    inventory = short_tmp / "one-big-die.yaml"
    inventory.write_text(INVENTORY)
    daemon = DaemonProc(extra=("--inventory", str(inventory))).start()
    node = make_node(
        api,
        short_tmp / "n",
        str(inventory),
        FLEXNPU_DAEMON_SOCKET=str(daemon.socket),
        FLEXNPU_SHM_DIR=str(daemon.shm_root),
        FLEXNPU_DEFAULT_MODE="soft",
    )
    node.daemon = daemon
    try:
        node.start()
        wait_for(node.devices, what="published devices")
        yield node
    finally:
        node.stop()
        daemon.cleanup()


def _claim(node: Node, i: int) -> ClaimRef:
    name = f"sixteen-{i}"
    uid = node.create_claim(name, [share_request(memory="2Gi", compute="1")], CONFIG)
    return ClaimRef(NAMESPACE, uid, name)


def test_63_claims_of_16_vnpus_fill_a_die_and_the_64th_stays_pending(big_die: Node) -> None:
    n = big_die
    assert n.kubelet is not None and n.daemon is not None
    refs = [_claim(n, i) for i in range(DEFAULT_MAX_SHARES_PER_DIE)]
    for ref in refs:
        n.scheduler.allocate(NAMESPACE, ref.name, NODE, reserved_for=[pod_ref(f"pod-{ref.name}")])
        res = n.kubelet.prepare([ref])[ref.uid]
        assert res.error == "", res.error
    last = _claim(n, DEFAULT_MAX_SHARES_PER_DIE)
    with pytest.raises(Unschedulable):
        n.scheduler.allocate(NAMESPACE, last.name, NODE)  # the scheduler's shares capacity is used up
    # the node counts what the scheduler counted: 63 aclservers, each with its 16 vNPUs on die 0
    entries = ledger.read_entries(str(n.daemon.shm_root / LEDGER_DIR_NAME), 0)
    assert len({e.pid for e in entries}) == DEFAULT_MAX_SHARES_PER_DIE
    assert len(entries) == DEFAULT_MAX_SHARES_PER_DIE * VNPUS
    assert len(n.daemon.aclserver_pids()) == DEFAULT_MAX_SHARES_PER_DIE
    # one goes, and the waiting claim fits again, on the scheduler's side and on the node's
    assert n.kubelet.unprepare([refs[0]]) == {refs[0].uid: ""}
    n.scheduler.deallocate(NAMESPACE, refs[0].name)
    n.scheduler.allocate(NAMESPACE, last.name, NODE, reserved_for=[pod_ref(f"pod-{last.name}")])
    assert n.kubelet.prepare([last])[last.uid].error == ""
    rest = [*refs[1:], last]
    assert n.kubelet.unprepare(rest) == {r.uid: "" for r in rest}
    wait_for(
        lambda: not n.daemon.aclserver_pids() if n.daemon else False, timeout=60, what="every aclserver gone"
    )

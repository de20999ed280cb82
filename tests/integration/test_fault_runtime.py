"""Runtime faults: crashed daemon and aclservers, claims that vanish while the node cannot see,
an API outage, and concurrent or repeated kubelet calls. Each ends on a clean node
(:func:`assert_clean`) with the surviving claims still served.

Real processes throughout: the node process, flexnpu-daemon, aclservers and a fake API server.
The API outage lasts :data:`OUTAGE_SECONDS` (60 s, as the requirement says); set
``FLEXNPU_TEST_OUTAGE_SECONDS`` to run it shorter locally.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dra_driver import wirefiles
from dra_driver.daemon_api.values import EntityInfo
from dra_kubeletplugin.claims import ClaimRef
from dra_kubeletplugin.claims import PrepareResult as ClaimResult
from flexnpu_client.session import Session
from flexnpu_testing.kubelet import KubeletSimulator, PluginHandle
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node
from tests.integration.lifecycle_helpers import (
    assert_clean,
    assert_share_works,
    checkpoint_uids,
    claim_doc,
    pod_ref,
    share_request,
)

OUTAGE_SECONDS = float(os.environ.get("FLEXNPU_TEST_OUTAGE_SECONDS", "60"))
RACE_ROUNDS = int(os.environ.get("FLEXNPU_TEST_RACE_ROUNDS", "6"))

RECONCILER_ENV = {
    "FLEXNPU_DEFAULT_MODE": "both",
    "FLEXNPU_RECONCILE_PERIOD_SECONDS": "1",
    "FLEXNPU_RESIDUAL_GRACE_SECONDS": "2",
}


@pytest.fixture
def fnode(node_factory: Callable[..., Node]) -> Node:
    """A node with a real daemon and a fast reconciler (1 s period, 2 s reservation grace)."""
    n = node_factory(daemon=True, **RECONCILER_ENV).start()
    wait_for(n.devices, what="published devices")
    return n


def _kubelet(node: Node) -> PluginHandle:
    assert node.kubelet is not None
    return node.kubelet


def _create_allocated(node: Node, name: str) -> ClaimRef:
    """Create a one-share claim and allocate it on the node, reserved for a pod."""
    uid = node.create_claim(name, [share_request()])
    node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[pod_ref(name)])
    return ClaimRef(NAMESPACE, uid, name)


def _prepare(node: Node, name: str, handle: PluginHandle | None = None) -> tuple[ClaimRef, ClaimResult]:
    """Create, allocate (reserved for a pod) and prepare a one-share claim."""
    ref = _create_allocated(node, name)
    res = (handle or _kubelet(node)).prepare([ref])[ref.uid]
    assert res.error == "", res.error
    return ref, res


def _entities(node: Node) -> dict[str, EntityInfo]:
    assert node.daemon is not None
    with node.daemon.client(timeout=10) as c:
        return {e.entity_id: e for e in c.list()}


def _ready(node: Node, name: str) -> tuple[str, str] | None:
    """(status, reason) of the Ready condition of the claim's first device, if any."""
    devices = (claim_doc(node, name).get("status") or {}).get("devices") or []
    for cond in devices[0].get("conditions") or [] if devices else []:
        if cond["type"] == "Ready":
            return str(cond["status"]), str(cond["reason"])
    return None


def _host_conf(node: Node, uid: str) -> clientconf.ClientConf:
    """The claim's client.conf with container paths mapped to the host (as test_node_soft_split)."""
    conf = wirefiles.load_client_conf(node.dirs["run"] / "claims" / uid / "client.conf")
    spec = json.loads(next(p for p in node.cdi_specs() if uid in p.name).read_text())
    shm_host = next(
        m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == "/dev/shm/flexnpu"
    )
    unix = str(Path(shm_host) / Path(conf.endpoints.unix).name) if conf.endpoints.unix else None
    return dataclasses.replace(
        conf, shm_dir=shm_host, endpoints=clientconf.Endpoints(unix=unix, tcp=conf.endpoints.tcp)
    )


def _unreserve(node: Node, name: str) -> None:
    """Drop every consumer, as the resourceclaim controller does once the pod is gone."""
    patch = [{"op": "replace", "path": "/status/reservedFor", "value": []}]  # a JSON patch: SMP merges lists
    node.resource.patch_namespaced_resource_claim_status(name, NAMESPACE, patch)
    assert not (claim_doc(node, name).get("status") or {}).get("reservedFor")


def _delete(node: Node, name: str) -> None:
    node.resource.delete_namespaced_resource_claim(name, NAMESPACE)
    wait_for(lambda: name not in _claim_names(node), what=f"claim {name} gone")


def _claim_names(node: Node) -> set[str]:
    raw: Any = node.resource.list_namespaced_resource_claim(NAMESPACE, _preload_content=False)
    return {c["metadata"]["name"] for c in json.loads(raw.data)["items"]}


@contextmanager
def _paused(node: Node) -> Iterator[None]:
    """SIGSTOP the node process for the block: API changes made meanwhile reach it all at once."""
    assert node.proc is not None
    node.proc.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        node.proc.send_signal(signal.SIGCONT)


def _holds_for(seconds: float, check: Callable[[], None], interval: float = 0.5) -> None:
    """Run ``check`` every ``interval`` seconds for ``seconds`` (a scenario's duration, not a wait)."""
    end = time.monotonic() + seconds
    tick = threading.Event()
    while True:
        check()
        left = end - time.monotonic()
        if left <= 0:
            return
        tick.wait(min(interval, left))


# -- 1. the daemon crashes ------------------------------------------------------------------


def test_daemon_sigkilled_readopts_live_aclservers(fnode: Node) -> None:
    a, _ = _prepare(fnode, "a")
    b, _ = _prepare(fnode, "b")
    assert fnode.daemon is not None
    before = {uid: e.pid for uid, e in _entities(fnode).items()}
    assert set(before) == {a.uid, b.uid}

    fnode.daemon.stop(signal.SIGKILL)
    assert sorted(fnode.daemon.aclserver_pids()) == sorted(before.values())  # they outlive the daemon
    fnode.daemon.start()

    after = _entities(fnode)
    assert {uid: e.pid for uid, e in after.items()} == before  # re-adopted, same pids
    assert all(str(e.state) == "Running" for e in after.values())
    assert assert_share_works(fnode, a.uid) == before[a.uid]
    assert assert_share_works(fnode, b.uid) == before[b.uid]
    assert _kubelet(fnode).unprepare([b]) == {b.uid: ""}
    assert_clean(fnode, {a.uid})
    assert assert_share_works(fnode, a.uid) == before[a.uid]
    assert _kubelet(fnode).unprepare([a]) == {a.uid: ""}
    assert_clean(fnode, set())


# -- 2. an aclserver crashes ----------------------------------------------------------------


def _ready_condition(node: Node, name: str) -> dict[str, Any]:
    devices = (claim_doc(node, name).get("status") or {}).get("devices") or []
    return next(c for c in devices[0]["conditions"] if c["type"] == "Ready")


def _healed(node: Node, name: str, uid: str, *, was: int) -> EntityInfo:
    """Wait until the claim serves again as another aclserver and its status says so."""
    cond = wait_for(
        lambda: (c := _ready_condition(node, name))["reason"] == "AclserverRestarted" and c,
        what="Ready=True AclserverRestarted",
        timeout=60,
    )
    assert cond["status"] == "True" and "device memory was lost" in cond["message"], cond
    healed = _entities(node)[uid]
    assert str(healed.state) == "Running" and healed.pid != was
    return healed


def test_aclserver_killed_restarted_once_then_down_then_healed(fnode: Node) -> None:
    a, _ = _prepare(fnode, "a")
    first = _entities(fnode)[a.uid]
    wait_for(lambda: _ready(fnode, "a") == ("True", "Prepared"), what="Ready=True after prepare")
    conf_before = (fnode.dirs["run"] / "claims" / a.uid / "client.conf").read_text()

    # first kill: the daemon restarts it (default --max-restarts 1) on the same endpoints
    os.killpg(first.pid, signal.SIGKILL)
    second = wait_for(
        lambda: (e := _entities(fnode).get(a.uid)) and str(e.state) == "Running" and e.pid != first.pid and e,
        what="aclserver restarted",
    )
    assert second.restarts == 1
    assert second.endpoints == first.endpoints
    assert assert_share_works(fnode, a.uid) == second.pid
    wait_for(lambda: (_ready(fnode, "a") or ("",))[0] == "True", what="Ready=True again")
    with Session.open(_host_conf(fnode, a.uid), timeout=5) as s:  # client.conf still right
        s.init()

    # second kill: past the daemon's budget. The claim says so, then the node registers the share
    # again from its checkpoint record: same token and endpoints, so the same client.conf works.
    os.killpg(second.pid, signal.SIGKILL)
    wait_for(
        lambda: _ready(fnode, "a") == ("False", "AclserverDown"), what="Ready=False AclserverDown", timeout=30
    )
    healed = _healed(fnode, "a", a.uid, was=second.pid)
    assert healed.endpoints == first.endpoints
    assert (fnode.dirs["run"] / "claims" / a.uid / "client.conf").read_text() == conf_before
    for prefer in ("unix", "tcp"):
        with Session.open(_host_conf(fnode, a.uid), prefer=prefer, timeout=5) as s:
            s.init()  # the tenant's next aclInit works; its device memory is gone, the whole quota free
            s.set_device(0)
            free, total = s.get_mem_info()
            assert free == total
    assert "aclserver gone for good" in fnode.log()
    assert _kubelet(fnode).unprepare([a]) == {a.uid: ""}
    assert_clean(fnode, set())


def test_share_healed_when_the_daemon_lost_its_aclserver(fnode: Node) -> None:
    """A daemon pod deleted where aclservers cannot outlive it: the new daemon finds the aclserver
    dead and drops its entry; the node registers the share again from its checkpoint record."""
    a, _ = _prepare(fnode, "a")
    b, _ = _prepare(fnode, "b")
    before = _entities(fnode)
    wait_for(lambda: _ready(fnode, "a") == ("True", "Prepared"), what="Ready=True after prepare")
    conf_before = (fnode.dirs["run"] / "claims" / a.uid / "client.conf").read_text()
    with Session.open(_host_conf(fnode, a.uid)) as s:
        s.init()
        s.set_device(0)
        s.malloc(64 * 1024 * 1024)
    assert fnode.daemon is not None
    fnode.daemon.stop(signal.SIGKILL)
    os.killpg(before[a.uid].pid, signal.SIGKILL)  # gone with the daemon's pod
    wait_for(lambda: before[a.uid].pid not in fnode.daemon.aclserver_pids(), what="aclserver gone")
    fnode.daemon.start()
    assert "removed Running entry" in fnode.daemon.log()
    healed = _healed(fnode, "a", a.uid, was=before[a.uid].pid)
    assert healed.endpoints.unix_socket == before[a.uid].endpoints.unix_socket
    assert (fnode.dirs["run"] / "claims" / a.uid / "client.conf").read_text() == conf_before
    with Session.open(_host_conf(fnode, a.uid)) as s:
        s.init()
        s.set_device(0)
        assert s.get_mem_info()[0] == s.get_mem_info()[1]  # the old allocation went with the old aclserver
    assert _entities(fnode)[b.uid].pid == before[b.uid].pid  # the other share was re-adopted, not touched
    assert _kubelet(fnode).unprepare([a, b]) == {a.uid: "", b.uid: ""}
    assert_clean(fnode, set())


# -- 3-6. claims that vanish where the node cannot see ---------------------------------------


def test_claim_deleted_while_node_down_is_removed_at_start(fnode: Node) -> None:
    a, _ = _prepare(fnode, "a")
    b, _ = _prepare(fnode, "b")
    pid_a = assert_share_works(fnode, a.uid)
    fnode.stop()
    _delete(fnode, "b")
    fnode.start()
    wait_for(lambda: b.uid not in checkpoint_uids(fnode), what="B removed by the reconciler")
    assert_clean(fnode, {a.uid})
    assert assert_share_works(fnode, a.uid) == pid_a
    assert "residual claim: the claim no longer exists" in fnode.log()


def test_force_deleted_pod_claim_removed_after_grace(fnode: Node) -> None:
    a, _ = _prepare(fnode, "a")
    b, _ = _prepare(fnode, "b")
    pid_a = assert_share_works(fnode, a.uid)
    _unreserve(fnode, "b")  # the pod is gone; the kubelet never calls unprepare
    wait_for(lambda: b.uid not in checkpoint_uids(fnode), what="B removed after the grace", timeout=30)
    assert "residual claim: no consumer in reservedFor" in fnode.log()
    # the pass that removed B judged A too (prepared earlier, reserved throughout): kept
    assert_clean(fnode, {a.uid})
    assert assert_share_works(fnode, a.uid) == pid_a
    assert (claim_doc(fnode, "a")["status"]).get("reservedFor")


def test_claim_recreated_with_new_uid_is_replaced(fnode: Node) -> None:
    a, _ = _prepare(fnode, "a")
    old, _ = _prepare(fnode, "b")
    with _paused(fnode):  # both changes land before the node looks again
        _delete(fnode, "b")
        new = _create_allocated(fnode, "b")
    assert new.uid != old.uid
    wait_for(lambda: old.uid not in checkpoint_uids(fnode), what="old B removed", timeout=30)
    assert f"residual claim: the claim was replaced (now UID {new.uid})" in fnode.log()
    assert_clean(fnode, {a.uid})
    res = _kubelet(fnode).prepare([new])[new.uid]
    assert res.error == "", res.error
    assert_clean(fnode, {a.uid, new.uid})
    assert assert_share_works(fnode, new.uid) > 0 and assert_share_works(fnode, a.uid) > 0


def test_api_outage_removes_nothing_then_converges(fnode: Node) -> None:
    a, _ = _prepare(fnode, "a")
    b, _ = _prepare(fnode, "b")
    pid_a, pid_b = assert_share_works(fnode, a.uid), assert_share_works(fnode, b.uid)
    with _paused(fnode):  # B's deletion is never seen before the outage starts
        _delete(fnode, "b")
        fnode.api.set_down(True)
    try:

        def both_kept() -> None:
            assert checkpoint_uids(fnode) == {a.uid, b.uid}
            assert assert_share_works(fnode, a.uid) == pid_a
            assert assert_share_works(fnode, b.uid) == pid_b

        _holds_for(OUTAGE_SECONDS, both_kept)  # the whole outage: nothing removed, both served
        assert "reconcile pass stopped, nothing removed" in fnode.log()
    finally:
        fnode.api.set_down(False)
    wait_for(lambda: b.uid not in checkpoint_uids(fnode), what="B removed after the outage", timeout=45)
    assert_clean(fnode, {a.uid})
    assert assert_share_works(fnode, a.uid) == pid_a


# -- 7. concurrent and repeated kubelet calls -------------------------------------------------


def _state_of(node: Node, ref: ClaimRef) -> str:
    """ "prepared" with every effect present, or "clean" with none; fails on anything in between."""
    if ref.uid in checkpoint_uids(node):
        assert_clean(node, {ref.uid})
        assert_share_works(node, ref.uid)
        status = claim_doc(node, ref.name).get("status") or {}
        assert status.get("devices"), "prepared claim has no device status"
        return "prepared"
    assert_clean(node, set())
    status = claim_doc(node, ref.name).get("status") or {}
    assert not status.get("devices"), f"unprepared claim still shows device status {status['devices']}"
    return "clean"


def _race(ref: ClaimRef, preparer: PluginHandle, unpreparer: PluginHandle) -> list[str]:
    """Prepare and unprepare ``ref`` at once, each on its own channel; the per-claim errors."""
    go = threading.Barrier(2)
    errors: list[str] = []

    def prepare() -> None:
        go.wait(timeout=10)
        errors.append(preparer.prepare([ref])[ref.uid].error)

    def unprepare() -> None:
        go.wait(timeout=10)
        errors.append(unpreparer.unprepare([ref])[ref.uid])

    threads = [threading.Thread(target=prepare), threading.Thread(target=unprepare)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a kubelet call hung"
    return [e for e in errors if e]


def test_concurrent_prepare_and_unprepare_converge(fnode: Node) -> None:
    ref = _create_allocated(fnode, "race")
    preparer, unpreparer = (KubeletSimulator(fnode.dirs["registry"]).wait_for_plugin(DRIVER) for _ in "ab")
    seen: list[str] = []
    try:
        for rnd in range(RACE_ROUNDS):
            if rnd % 2:  # odd rounds race from a prepared claim (repeat prepare vs unprepare)
                assert preparer.prepare([ref])[ref.uid].error == ""
            assert _race(ref, preparer, unpreparer) == []
            seen.append(_state_of(fnode, ref))
            assert unpreparer.unprepare([ref]) == {ref.uid: ""}  # the next round starts clean
            assert _state_of(fnode, ref) == "clean"
    finally:
        preparer.close()
        unpreparer.close()
    print(f"end states over {RACE_ROUNDS} rounds: {seen}")


def test_rolling_update_two_instances_share_state(node_factory: Callable[..., Node], short_tmp: Path) -> None:
    old = node_factory(daemon=True, FLEXNPU_POD_UID="pod-old", **RECONCILER_ENV).start()
    wait_for(old.devices, what="published devices")
    # the new instance: same state, CDI, run and plugin dirs, its own sockets (another pod UID);
    # its kubelet handle is registered through a view of the registry holding only its socket
    view = short_tmp / "reg-new"
    view.mkdir()
    (view / f"{DRIVER}-reg.sock").symlink_to(old.dirs["registry"] / f"{DRIVER}-pod-new-reg.sock")
    new = Node(
        api=old.api,
        root=old.root,
        dirs={**old.dirs, "registry": view},
        env={**old.env, "FLEXNPU_POD_UID": "pod-new"},
        log_file=old.root / "node-new.log",
        daemon=old.daemon,
    )
    try:
        x, _ = _prepare(old, "x")
        new.start()
        y, _ = _prepare(new, "y")
        assert _kubelet(new).unprepare([x]) == {x.uid: ""}
        assert_clean(old, {y.uid})
        assert assert_share_works(old, y.uid) > 0
        assert old.stop() == 0  # the old pod ends; the new one keeps serving
        plugin_dir, registry = old.dirs["plugins"] / DRIVER, old.dirs["registry"]
        assert not (plugin_dir / "dra-pod-old.sock").exists()  # it removed only its own sockets
        assert not (registry / f"{DRIVER}-pod-old-reg.sock").exists()
        assert (plugin_dir / "dra-pod-new.sock").exists() and (
            registry / f"{DRIVER}-pod-new-reg.sock"
        ).exists()
        z, _ = _prepare(new, "z")
        assert _kubelet(new).unprepare([y]) == {y.uid: ""}
        assert_clean(new, {z.uid})
        assert _kubelet(new).unprepare([z]) == {z.uid: ""}
        assert_clean(new, set())
    finally:
        new.stop()


def test_kubelet_restart_prepares_again_same_devices(fnode: Node) -> None:
    a, first = _prepare(fnode, "a")
    pid = assert_share_works(fnode, a.uid)
    _kubelet(fnode).close()  # the kubelet restarts: a new registration and channel
    fnode.kubelet = KubeletSimulator(fnode.dirs["registry"]).wait_for_plugin(DRIVER)
    again = _kubelet(fnode).prepare([a])[a.uid]
    assert again.error == ""
    assert again.devices == first.devices  # same devices, CDI IDs and share IDs
    assert fnode.daemon is not None and fnode.daemon.aclserver_pids() == [pid]  # no second aclserver
    assert _entities(fnode)[a.uid].pid == pid
    assert_clean(fnode, {a.uid})
    assert _kubelet(fnode).unprepare([a]) == {a.uid: ""}
    assert_clean(fnode, set())

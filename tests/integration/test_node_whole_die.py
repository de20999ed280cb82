"""The real node process against the fake API server and the kubelet simulator: whole dies."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from typing import Any

import pytest

from dra_driver.checkpoint import CheckpointStore
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node

WHOLE = [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]


def _checkpoint(node: Node) -> dict[str, Any]:
    return CheckpointStore(node.dirs["state"] / "checkpoint.json").read().claims


def test_slices_published_with_die_attributes(node: Node) -> None:
    devices = wait_for(node.devices, what="published devices")
    names = sorted(d["name"] for d in devices)
    shares = [f"vnpu-{p}{s}" for p in (0, 1) for s in ("", "-best-effort", "-fixed")]
    assert names == ["npu-0", "npu-1", *shares]  # default mode "both": whole, a share device per policy
    (s,) = [s for s in node.slices() if s["spec"].get("devices")]
    counters = [c for s in node.slices() for c in s["spec"].get("sharedCounters") or []]
    assert sorted(c["name"] for c in counters) == ["die-0", "die-1"]
    assert s["spec"]["pool"]["name"] == NODE
    assert s["metadata"]["ownerReferences"][0]["kind"] == "Node"
    whole = next(d for d in devices if d["name"] == "npu-0")
    attrs = whole["attributes"]
    assert attrs["model"] == {"string": "Ascend910"}
    assert "resource.kubernetes.io/pciBusID" in attrs
    assert whole["capacity"]["memory"]["value"] == str(65536 * 1024 * 1024)
    assert attrs["mode"] == {"string": "whole"}


def test_prepare_and_unprepare_whole_die(node: Node) -> None:
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("c1", WHOLE)
    alloc = node.scheduler.allocate(NAMESPACE, "c1", NODE)
    device = alloc["status"]["allocation"]["devices"]["results"][0]["device"]
    ref = ClaimRef(NAMESPACE, uid, "c1")
    assert node.kubelet is not None
    result = node.kubelet.prepare([ref])[uid]
    assert result.error == ""
    (dev,) = result.devices
    assert (dev.pool, dev.device, dev.request_names) == (NODE, device, ("npu",))
    (cdi_id,) = dev.cdi_device_ids
    assert cdi_id == f"flexnpu.io/vnpu={uid}-{device}"
    (spec_file,) = node.cdi_specs()
    spec = json.loads(spec_file.read_text())
    phy = int(device.split("-")[1])
    nodes = spec["devices"][0]["containerEdits"]["deviceNodes"]
    assert nodes == [
        {
            "path": f"/dev/davinci{phy}",
            "hostPath": str(node.dirs["devroot"] / f"dev/davinci{phy}"),
            "permissions": "rw",
        }
    ]
    shared = [n["path"] for n in spec["containerEdits"]["deviceNodes"]]
    assert "/dev/davinci_manager" in shared
    assert _checkpoint(node)[uid].state == "PrepareCompleted"

    # idempotent, as after a kubelet restart
    assert node.kubelet.prepare([ref])[uid] == result

    assert node.kubelet.unprepare([ref]) == {uid: ""}
    assert node.cdi_specs() == []
    assert _checkpoint(node) == {}
    assert node.kubelet.unprepare([ref]) == {uid: ""}  # unknown claim: success


def test_die_prepared_for_another_claim_is_refused(node: Node) -> None:
    """The node is the last line of defence when the API says two claims own one die."""
    wait_for(node.devices, what="published devices")
    uid1 = node.create_claim("c1", WHOLE)
    alloc = node.scheduler.allocate(NAMESPACE, "c1", NODE)
    uid2 = node.create_claim("c2", WHOLE)
    # write a conflicting allocation by hand, as a buggy scheduler would
    body = {"status": {"allocation": alloc["status"]["allocation"]}}
    node.resource.patch_namespaced_resource_claim_status("c2", NAMESPACE, body)
    assert node.kubelet is not None
    ok = node.kubelet.prepare([ClaimRef(NAMESPACE, uid1, "c1")])[uid1]
    assert ok.error == ""
    bad = node.kubelet.prepare([ClaimRef(NAMESPACE, uid2, "c2")])[uid2]
    assert "DeviceBusy" in bad.error and uid2 in bad.error
    assert len(node.cdi_specs()) == 1


def _alloc_results(node: Node, name: str, results: list[dict[str, Any]]) -> None:
    body = {"status": {"allocation": {"devices": {"results": results, "config": []}}}}
    node.resource.patch_namespaced_resource_claim_status(name, NAMESPACE, body)


@pytest.mark.parametrize(
    ("setup", "expect"),
    [
        pytest.param("unallocated", "ClaimNotAllocated", id="unallocated"),
        pytest.param("replaced", "ClaimReplaced", id="uid-replaced"),
        pytest.param("unknown-device", "DeviceNotFound", id="device-not-on-node"),
        pytest.param("missing", "not found", id="claim-deleted"),
    ],
)
def test_bad_claims_get_per_claim_errors(node: Node, setup: str, expect: str) -> None:
    """Each bad claim gets its own error naming it; a good claim in the same call is prepared."""
    wait_for(node.devices, what="published devices")
    good_uid = node.create_claim("good", WHOLE)
    node.scheduler.allocate(NAMESPACE, "good", NODE)
    uid = node.create_claim("bad", WHOLE)
    if setup == "replaced":
        node.resource.delete_namespaced_resource_claim("bad", NAMESPACE)
        node.create_claim("bad", WHOLE)
        node.scheduler.allocate(NAMESPACE, "bad", NODE)
    elif setup == "unknown-device":
        _alloc_results(node, "bad", [{"request": "npu", "driver": DRIVER, "pool": NODE, "device": "npu-9"}])
    elif setup == "missing":
        node.resource.delete_namespaced_resource_claim("bad", NAMESPACE)
    assert node.kubelet is not None
    results = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, "bad"), ClaimRef(NAMESPACE, good_uid, "good")])
    assert expect.lower() in results[uid].error.lower(), results[uid].error
    assert uid in results[uid].error
    assert results[good_uid].error == "" and len(results[good_uid].devices) == 1


def test_only_other_drivers_results_is_success_without_devices(node: Node) -> None:
    wait_for(node.devices, what="published devices")
    uid = node.create_claim("gpu", WHOLE)
    _alloc_results(
        node, "gpu", [{"request": "npu", "driver": "gpu.example.com", "pool": "x", "device": "gpu-0"}]
    )
    assert node.kubelet is not None
    res = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, "gpu")])[uid]
    assert (res.error, res.devices) == ("", ())
    assert node.cdi_specs() == []


@pytest.mark.parametrize(
    "ref",
    [
        pytest.param(ClaimRef(NAMESPACE, "../../etc", "c"), id="uid-dotdot"),
        pytest.param(ClaimRef(NAMESPACE, "a/b", "c"), id="uid-slash"),
        pytest.param(ClaimRef("../x", "abc", "c"), id="namespace-dotdot"),
        pytest.param(ClaimRef(NAMESPACE, "abc", "../c"), id="name-dotdot"),
    ],
)
def test_names_that_would_escape_a_directory_are_refused(node: Node, ref: ClaimRef) -> None:
    assert node.kubelet is not None
    res = node.kubelet.prepare([ref])[ref.uid]
    assert "InvalidPath" in res.error
    assert node.cdi_specs() == [] and _checkpoint(node) == {}  # nothing prepared, nothing written
    assert (
        node.kubelet.unprepare([ref])[ref.uid] == ""
        or "InvalidPath" in node.kubelet.unprepare([ref])[ref.uid]
    )


def test_corrupt_checkpoint_at_start_is_kept_and_node_serves(node_factory: Callable[..., Node]) -> None:
    n = node_factory()
    (n.dirs["state"] / "checkpoint.json").write_text('{"version": 1, "checksum": "x", "data": {"cla')
    n.start()
    try:
        wait_for(n.devices, what="published devices")
        copies = list(n.dirs["state"].glob("checkpoint.json.corrupt-*"))
        assert len(copies) == 1 and copies[0].read_text().startswith('{"version": 1')
        assert "CheckpointCorrupt" in n.log()
        uid = n.create_claim("c1", WHOLE)
        n.scheduler.allocate(NAMESPACE, "c1", NODE)
        assert n.kubelet is not None
        assert n.kubelet.prepare([ClaimRef(NAMESPACE, uid, "c1")])[uid].error == ""
    finally:
        n.stop()


def test_sigterm_removes_sockets_and_keeps_prepared_claims(node_factory: Callable[..., Node]) -> None:
    n = node_factory().start()
    wait_for(n.devices, what="published devices")
    uid = n.create_claim("c1", WHOLE)
    n.scheduler.allocate(NAMESPACE, "c1", NODE)
    assert n.kubelet is not None
    first = n.kubelet.prepare([ClaimRef(NAMESPACE, uid, "c1")])[uid]
    assert n.stop(signal.SIGTERM) == 0
    assert list(n.dirs["registry"].iterdir()) == []
    assert list(n.dirs["plugins"].rglob("*.sock")) == []
    assert len(n.cdi_specs()) == 1  # a restart of the plugin does not disturb prepared claims
    n.start()
    try:
        assert n.kubelet is not None
        assert n.kubelet.prepare([ClaimRef(NAMESPACE, uid, "c1")])[uid] == first
    finally:
        n.stop()

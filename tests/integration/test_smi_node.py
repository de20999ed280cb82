"""flexnpu-smi on a node: info with pods and residuals, cleanup --dry-run, cleanup, unregister -u."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from dra_driver.checkpoint import CheckpointStore
from dra_driver.daemon_api.values import RegisterRequest
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import NAMESPACE, NODE, Node
from tests.integration.daemon_harness import share
from tests.integration.lifecycle_helpers import smi

POD = {"resource": "pods", "name": "p1", "uid": "9a9a9a9a-0000-4000-8000-000000000001"}
SHARE = [
    {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu.flexnpu.io",
            "capacity": {"requests": {"memory": "256Mi", "compute": "10"}},
        },
    }
]


def _prepare(node: Node, name: str) -> str:
    uid = node.create_claim(name, SHARE)
    node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[{**POD, "name": f"pod-{name}"}])
    assert node.kubelet is not None
    assert node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid].error == ""
    return uid


def _rows(node: Node) -> dict[str, dict[str, Any]]:
    res = smi(node, "info", "--json")
    assert res.returncode == 0, res.stderr
    return {r["CLAIM UID"]: r for r in json.loads(res.stdout)["rows"]}


def test_info_cleanup_and_unregister(node_factory: Callable[..., Node]) -> None:
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both").start()
    wait_for(n.devices, what="published devices")
    keep = _prepare(n, "keep")
    gone = _prepare(n, "gone")
    drop = _prepare(n, "drop")
    n.stop()  # the node process is down: nothing reconciles behind the tool's back
    n.resource.delete_namespaced_resource_claim("gone", NAMESPACE)
    assert n.daemon is not None
    orphan = "0f0f0f0f-0000-4000-8000-00000000000f"
    with n.daemon.client() as d:
        d.register(
            RegisterRequest(
                claim_uid=orphan, namespace="x", name="y", token="ab" * 32, shares=(share(die=6),)
            )
        )

    rows = _rows(n)
    assert rows[keep]["RESIDUAL"] == "no" and rows[keep]["PODS"] == "pods/pod-keep"
    assert rows[keep]["ACLSERVER"].endswith("Running")
    assert rows[keep]["ENDPOINT"].startswith("169.254.213.1:") and rows[keep]["MEM(MiB) USED/QUOTA"].endswith(
        "/256"
    )
    assert rows[gone]["RESIDUAL"].startswith("yes: the claim no longer exists")
    assert rows[orphan]["RESIDUAL"].startswith("yes: orphan aclserver")

    dry = smi(n, "cleanup", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert [r["uid"] for r in plan["residualClaims"]] == [gone]
    assert {(o["kind"], o["uid"]) for o in plan["orphans"]} == {("aclserver", orphan)}
    assert set(_rows(n)) == {keep, gone, drop, orphan}  # a dry run removes nothing

    done = smi(n, "cleanup")
    assert done.returncode == 0, done.stderr
    assert f"removed residual claim {NAMESPACE}/gone ({gone})" in done.stdout
    assert set(_rows(n)) == {keep, drop}
    events = json.loads(n.api_core().list_namespaced_event("default", _preload_content=False).data)["items"]
    messages = [e["message"] for e in events if e["reason"] == "FlexNPUResidualRemoved"]
    assert any(gone in m for m in messages) and any(orphan in m and "aclserver" in m for m in messages)

    unreg = smi(n, "unregister", "-u", drop)
    assert unreg.returncode == 0 and "unprepared claim" in unreg.stdout
    assert set(CheckpointStore(n.dirs["state"] / "checkpoint.json").read().claims) == {keep}
    assert not [p for p in n.cdi_specs() if drop in p.name]
    missing = smi(n, "unregister", "-u", "00000000-0000-4000-8000-000000000000")
    assert missing.returncode == 1 and "no claim or vNPU" in missing.stderr


def test_info_without_api_marks_api_columns_unknown(node_factory: Callable[..., Node]) -> None:
    n = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both").start()
    wait_for(n.devices, what="published devices")
    uid = _prepare(n, "c1")
    n.api.set_down(True)
    try:
        rows = _rows(n)
        assert rows[uid]["PODS"] == "?" and rows[uid]["RESIDUAL"].startswith("?")
        refused = smi(n, "cleanup")
        assert refused.returncode == 3  # never delete on doubt
        assert uid in CheckpointStore(n.dirs["state"] / "checkpoint.json").read().claims
    finally:
        n.api.set_down(False)
    assert n.daemon is not None
    n.daemon.stop()
    no_daemon = smi(n, "info")
    assert no_daemon.returncode == 3 and "aclserver columns unknown" in no_daemon.stderr
    assert uid in no_daemon.stdout  # what the node itself knows is still shown
    assert "placement policy: binpack" in no_daemon.stdout

"""The ``interposition`` field through the real node process and daemon: ``preload`` on a node
without the client library fails that claim's prepare naming the field, leaves nothing behind
and the node keeps serving other claims; ``auto`` there prepares a share without injection."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dra_driver import interposition
from dra_driver.sharing import API_VERSION
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing.waiting import wait_for
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node


def _request() -> dict[str, Any]:
    return {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu.flexnpu.io",
            "count": 1,
            "capacity": {"requests": {"memory": "256Mi", "compute": "10"}},
        },
    }


def _config(mode: str) -> list[dict[str, Any]]:
    params = {"apiVersion": API_VERSION, "kind": "VnpuConfig", "interposition": mode}
    return [{"opaque": {"driver": DRIVER, "parameters": params}}]


@pytest.fixture
def bare_node(node_factory: Callable[..., Node], tmp_path: Path) -> Node:
    """A node whose --client-library does not exist."""
    missing = tmp_path / "no-such-dir" / "libascendcl.so"
    node = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_CLIENT_LIBRARY=str(missing)).start()
    wait_for(node.devices, what="published devices")
    return node


def _prepare(node: Node, name: str, mode: str) -> tuple[str, Any]:
    uid = node.create_claim(name, [_request()], _config(mode))
    node.scheduler.allocate(NAMESPACE, name, NODE)
    assert node.kubelet is not None
    return uid, node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid]


def test_preload_without_the_library_fails_cleanly_and_auto_still_works(bare_node: Node) -> None:
    uid, result = _prepare(bare_node, "wants-preload", "preload")
    assert "interposition" in result.error and "libascendcl.so" in result.error, result.error
    assert uid in result.error
    assert not [p for p in bare_node.cdi_specs() if uid in p.name]
    assert not (bare_node.dirs["run"] / "claims" / uid).exists()
    assert bare_node.daemon is not None
    wait_for(lambda: not bare_node.daemon.aclserver_pids(), what="the refused claim's aclserver stopped")  # type: ignore[union-attr]

    uid2, ok = _prepare(bare_node, "auto-here", "auto")
    assert ok.error == "", ok.error
    (spec_file,) = [p for p in bare_node.cdi_specs() if uid2 in p.name]
    spec = json.loads(spec_file.read_text())
    paths = [m["containerPath"] for m in spec["containerEdits"]["mounts"]]
    assert interposition.CONTAINER_PRELOAD not in paths and "/etc/flexnpu/client.conf" in paths
    assert not any(e.startswith("FLEXNPU_INTERPOSITION=") for e in spec["containerEdits"]["env"])

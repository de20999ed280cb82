"""Shared checks for the fault suite: "nothing residual" and "the surviving claims still work".

:func:`assert_clean` is the one definition of a clean node used by every fault test: the
checkpoint holds exactly the surviving claims, and no CDI spec, client.conf dir, aclserver or
shm dir exists for any other claim. It polls until the node converges or the deadline passes
(an aclserver's process group may need a moment to be reaped), then fails naming what is left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from dra_driver import wirefiles
from dra_driver.checkpoint import CheckpointStore
from tests.integration.conftest import NAMESPACE, Node
from tests.integration.daemon_harness import hello_tcp


def checkpoint_uids(node: Node) -> set[str]:
    """UIDs of the claims in the node's checkpoint (any state)."""
    return set(CheckpointStore(node.dirs["state"] / "checkpoint.json").read().claims)


def residuals(node: Node, surviving: Collection[str]) -> list[str]:
    """Everything on the node that contradicts "only ``surviving`` are prepared" ([] when clean)."""
    keep = set(surviving)
    out: list[str] = []
    uids = checkpoint_uids(node)
    if uids != keep:
        out.append(f"checkpoint claims {sorted(uids)} != surviving {sorted(keep)}")
    out += [f"CDI spec {p.name}" for p in node.cdi_specs() if not any(u in p.name for u in keep)]
    claims_dir = node.dirs["run"] / "claims"
    if claims_dir.is_dir():
        out += [f"client.conf dir {d}" for d in claims_dir.iterdir() if d.name not in keep]
    if node.daemon is not None:
        with node.daemon.client(timeout=10) as c:
            entities = c.list()
        out += [f"aclserver entity {e.entity_id} pid {e.pid}" for e in entities if e.entity_id not in keep]
        serving = {e.pid for e in entities if e.entity_id in keep and str(e.state) == "Running"}
        stray = set(node.daemon.aclserver_pids()) - serving
        out += [f"aclserver process {pid} owned by no surviving claim" for pid in sorted(stray)]
        shm = node.daemon.shm_root
        out += [
            f"shm dir {d}"
            for d in (shm.iterdir() if shm.is_dir() else [])
            if d.is_dir() and not d.name.startswith(".") and d.name not in keep
        ]
    return out


def assert_clean(node: Node, surviving_uids: Collection[str], timeout: float = 10.0) -> None:
    """Wait (up to ``timeout``) until nothing but ``surviving_uids`` is on the node; fail naming the rest."""
    deadline = time.monotonic() + timeout
    while True:
        left = residuals(node, surviving_uids)
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                "residual state on the node:\n  " + "\n  ".join(left) + f"\n{node.log()[-4000:]}"
            )
        time.sleep(0.05)


def assert_share_works(node: Node, uid: str) -> int:
    """A prepared share's CDI spec exists and its aclserver answers HELLO with the claim's token on
    its TCP endpoint; the pid (the aclserver tells it only after HELLO)."""
    assert any(uid in p.name for p in node.cdi_specs()), f"no CDI spec for claim {uid}"
    conf = wirefiles.load_client_conf(node.dirs["run"] / "claims" / uid / "client.conf")
    host, port = conf.endpoints.tcp_address or ("", 0)
    assert port, f"claim {uid}: client.conf has no TCP endpoint"
    return hello_tcp(host, port, conf.token)


def share_request(name: str = "vnpu", memory: str = "256Mi", compute: str = "10") -> dict[str, Any]:
    """One soft-split share request (vnpu.flexnpu.io)."""
    return {
        "name": name,
        "exactly": {
            "deviceClassName": "vnpu.flexnpu.io",
            "count": 1,
            "capacity": {"requests": {"memory": memory, "compute": compute}},
        },
    }


def pod_ref(name: str) -> dict[str, str]:
    """A reservedFor entry for a (fictitious) pod, so the reconciler sees a consumer."""
    return {
        "resource": "pods",
        "name": name,
        "uid": f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}",
    }


def claim_doc(node: Node, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    """The stored claim as a camelCase dict."""
    raw: Any = node.resource.read_namespaced_resource_claim(name, namespace, _preload_content=False)
    doc: dict[str, Any] = json.loads(raw.data)
    return doc


def conf_path(node: Node, uid: str) -> Path:
    return node.dirs["run"] / "claims" / uid / "client.conf"


def smi(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    """``flexnpu-smi`` with the node's environment, as an operator on that node runs it."""
    return subprocess.run(
        [sys.executable, "-m", "kubeletplugin.smi", *args],
        env=node.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )

"""``flexnpu-dra demo``: a local node with emulated NPUs walks claims through their lifecycle.

Everything is real except the control plane: a fake Kubernetes API server (speaking the real
REST/watch protocol), a scheduler stand-in that writes allocations like kube-scheduler, and a
kubelet simulator that registers the plugin and calls it over the real gRPC sockets. The node
process runs as a real subprocess, exactly as the DaemonSet runs it. The demo checks each step,
exits non-zero if one fails, and leaves no files or processes behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.checkpoint import CheckpointStore
from dra_driver.claims import ClaimRef

NODE = "demo-node"
NAMESPACE = "demo"
INVENTORY = (
    Path(__file__).resolve().parents[1] / "dra_driver" / "testing" / "inventories" / "two-chip-910b3.yaml"
)
DEVICE_CLASSES = {
    "npu.flexnpu.io": 'device.driver == "npu.flexnpu.io" && device.attributes["npu.flexnpu.io"].mode == "whole"',
    "vnpu.flexnpu.io": 'device.driver == "npu.flexnpu.io" && device.attributes["npu.flexnpu.io"].mode == "soft"',
}


class DemoFailed(Exception):
    pass


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _step(title: str) -> None:
    _say(f"\n=== {title}")


def _wait(what: str, cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)  # polling a condition with a deadline


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise DemoFailed(what)
    _say(f"  ok: {what}")


@contextlib.contextmanager
def _node_process(env: dict[str, str], log_file: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log_file.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "kubeletplugin.cli", "plugin"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def run(*, keep: bool = False) -> int:
    from kubernetes import client

    from dra_driver import discovery
    from dra_driver.testing.devroot import build_device_root
    from dra_driver.testing.fake_apiserver import FakeAPIServer

    tmp = Path(tempfile.mkdtemp(prefix="flexnpu-demo-", dir="/tmp"))
    dirs = {k: tmp / k for k in ("registry", "plugins", "state", "run", "shm", "cdi", "root")}
    for d in dirs.values():
        d.mkdir()
    code = 1
    try:
        with FakeAPIServer() as api:
            kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
            core = client.CoreV1Api(api.api_client())
            resource = client.ResourceV1Api(api.api_client())
            core.create_node(client.V1Node(metadata=client.V1ObjectMeta(name=NODE)))
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
            for name, cel in DEVICE_CLASSES.items():
                selector = client.V1DeviceSelector(cel=client.V1CELDeviceSelector(expression=cel))
                resource.create_device_class(
                    client.V1DeviceClass(
                        metadata=client.V1ObjectMeta(name=name),
                        spec=client.V1DeviceClassSpec(selectors=[selector]),
                    )
                )
            inventory = discovery.from_config(inventory=INVENTORY, npu_smi="npu-smi").discover()
            build_device_root(dirs["root"], inventory)
            env = dict(os.environ)
            env.update(
                {
                    "FLEXNPU_NODE_NAME": NODE,
                    "FLEXNPU_KUBECONFIG": str(kubeconfig),
                    "FLEXNPU_INVENTORY": str(INVENTORY),
                    "FLEXNPU_KUBELET_REGISTRY_DIR": str(dirs["registry"]),
                    "FLEXNPU_KUBELET_PLUGINS_DIR": str(dirs["plugins"]),
                    "FLEXNPU_STATE_DIR": str(dirs["state"]),
                    "FLEXNPU_RUN_DIR": str(dirs["run"]),
                    "FLEXNPU_SHM_DIR": str(dirs["shm"]),
                    "FLEXNPU_CDI_DIR": str(dirs["cdi"]),
                    "FLEXNPU_DEVICE_ROOT": str(dirs["root"]),
                }
            )
            _step(f"node process: {len(inventory.dies)} emulated dies from {INVENTORY.name}")
            with _node_process(env, tmp / "node.log") as proc:
                try:
                    _walk(api, resource, dirs, proc)
                    code = 0
                except Exception:
                    _say("\n--- node process log (tail) ---")
                    _say("\n".join((tmp / "node.log").read_text(errors="replace").splitlines()[-40:]))
                    raise
            _step("shutdown")
            _check(proc.returncode == 0, f"node process exited cleanly (rc={proc.returncode})")
            _check(
                not any(dirs["registry"].iterdir()) and not list(dirs["plugins"].rglob("*.sock")),
                "registration and DRA sockets removed",
            )
    except DemoFailed as err:
        _say(f"\nDEMO FAILED: {err}")
        code = 1
    finally:
        if keep:
            _say(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if code == 0:
        _say("\nDemo finished: every step checked, nothing left behind.")
    return code


def _walk(api: Any, resource: Any, dirs: dict[str, Path], proc: subprocess.Popen[bytes]) -> None:
    from dra_driver.testing.kubelet import KubeletSimulator
    from dra_driver.testing.scheduler import SchedulerSim

    kubelet = KubeletSimulator(dirs["registry"])
    handle = kubelet.wait_for_plugin(DEFAULT_DRIVER_NAME, timeout=30)
    _check(True, f"kubelet registered {handle.info.name} at {handle.info.endpoint} ({handle.service})")

    _step("published ResourceSlices")

    def own_slices() -> list[dict[str, Any]]:
        raw = resource.list_resource_slice(
            field_selector=f"spec.driver={DEFAULT_DRIVER_NAME},spec.nodeName={NODE}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(raw.data)["items"]
        return items if any(s["spec"].get("devices") for s in items) else []

    slices = _wait("the node's ResourceSlices", own_slices)
    for s in slices:
        spec = s["spec"]
        names = [d["name"] for d in spec.get("devices") or []]
        _say(
            f"  {s['metadata']['name']}: pool {spec['pool']['name']} gen {spec['pool']['generation']} devices {names}"
        )
        for d in (spec.get("devices") or [])[:1]:
            attrs = {k: next(iter(v.values())) for k, v in d.get("attributes", {}).items()}
            caps = {k: v["value"] for k, v in d.get("capacity", {}).items()}
            _say(f"    {d['name']}: {attrs}")
            _say(f"    capacity: {caps}")

    _step("a pod's ResourceClaim for one whole die (npu.flexnpu.io)")
    claim_body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "whole-die", "namespace": NAMESPACE},
        "spec": {
            "devices": {"requests": [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]}
        },
    }
    created = json.loads(
        resource.create_namespaced_resource_claim(NAMESPACE, claim_body, _preload_content=False).data
    )
    uid = created["metadata"]["uid"]
    sched = SchedulerSim(api.api_client(), DEFAULT_DRIVER_NAME)
    pod_ref = {"resource": "pods", "name": "demo-pod", "uid": "11111111-2222-3333-4444-555555555555"}
    allocated = sched.allocate(NAMESPACE, "whole-die", NODE, reserved_for=[pod_ref])
    results = allocated["status"]["allocation"]["devices"]["results"]
    _say(f"  scheduler allocated: {[(r['pool'], r['device']) for r in results]}")

    _step("kubelet: NodePrepareResources")
    ref = ClaimRef(namespace=NAMESPACE, uid=uid, name="whole-die")
    res = handle.prepare([ref])[uid]
    _check(not res.error, f"prepared without error {res.error!r}")
    cdi_ids = [i for d in res.devices for i in d.cdi_device_ids]
    _say(f"  CDI device IDs: {cdi_ids}")
    specs = list(dirs["cdi"].glob("*.json"))
    _check(
        len(specs) == 1 and uid in specs[0].name, f"one CDI spec written: {specs[0].name if specs else None}"
    )
    _say(specs[0].read_text())

    _step("flexnpu-smi info (the node's checkpoint)")
    store = CheckpointStore(dirs["state"] / "checkpoint.json")
    for entry in store.read().claims.values():
        _say(
            f"  {entry.uid}  {entry.namespace}/{entry.name}  {entry.state}  dies={[d['phy'] for d in entry.dies]}"
        )

    _step("idempotent: the kubelet restarts and prepares again")
    again = handle.prepare([ref])[uid]
    _check(again == res, "same devices and CDI IDs")

    _step("kubelet: NodeUnprepareResources")
    errs = handle.unprepare([ref])
    _check(errs == {uid: ""}, "unprepared")
    _check(not list(dirs["cdi"].glob("*.json")), "CDI spec removed")
    _check(store.read().claims == {}, "checkpoint empty")
    _check(handle.unprepare([ref]) == {uid: ""}, "unprepare again is a no-op")
    sched.deallocate(NAMESPACE, "whole-die")
    resource.delete_namespaced_resource_claim("whole-die", NAMESPACE)
    handle.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)

"""The demo (``scripts/demo.sh``, ``python -m flexnpu_testing.demo``): a local node with emulated NPUs walks claims through their lifecycle.

Everything is real except the control plane: a fake Kubernetes API server (speaking the real
REST/watch protocol), a scheduler stand-in that writes allocations like kube-scheduler, and a
kubelet simulator that registers the plugin and calls it over the real gRPC sockets. The node
process runs as a real subprocess, exactly as the DaemonSet runs it. The demo checks each step,
exits non-zero if one fails, and leaves no files or processes behind.

It lives with the test doubles it drives (``flexnpu_testing/``), outside the production import
graph and every wheel; ``flexnpu-dra demo`` only prints how to run it from a clone.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.checkpoint import CheckpointStore
from dra_kubeletplugin.claims import ClaimRef

NODE = "demo-node"
NAMESPACE = "demo"
INVENTORY = Path(__file__).resolve().parent / "inventories" / "two-chip-910b3.yaml"
DEVICE_CLASSES = {
    "npu.flexnpu.io": 'device.driver == "npu.flexnpu.io" && device.attributes["npu.flexnpu.io"].mode == "whole"',
    "vnpu.flexnpu.io": 'device.driver == "npu.flexnpu.io" && device.attributes["npu.flexnpu.io"].mode == "soft"',
    "vnpu-fixed.flexnpu.io": (
        'device.driver == "npu.flexnpu.io" && device.attributes["npu.flexnpu.io"].mode == "soft-fixed"'
    ),
}


class DemoFailed(Exception):
    pass


def _say(msg: str = "") -> None:
    print(msg, flush=True)


def _step(title: str) -> None:
    _say(f"\n=== {title}")


def _wait(what: str, cond: Callable[[], Any], timeout: float = 20.0) -> Any:
    from flexnpu_testing.waiting import WaitTimeout, wait_for

    try:
        return wait_for(cond, what=what, timeout=timeout, interval=0.05)
    except WaitTimeout as err:
        raise DemoFailed(str(err)) from None


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


@contextlib.contextmanager
def _daemon_process(
    env: dict[str, str], dirs: dict[str, Path], shm_root: Path, log_file: Path
) -> Iterator[None]:
    from dra_driver.daemon_api.client import DaemonClient
    from flexnpu_testing.daemon import remove_cgroups

    sock = dirs["run"] / "daemon.sock"
    cgroup_parent = f"flexnpu-demo-{shm_root.name}"  # the demo's own, removed at the end
    argv = [
        sys.executable, "-m", "flexnpu_runtime.daemon.main", "--socket", str(sock),
        "--state-dir", str(dirs["state"] / "daemon"), "--run-dir", str(dirs["run"] / "daemon"),
        "--shm-root", str(shm_root), "--inventory", env["FLEXNPU_INVENTORY"], "--cgroup-parent", cgroup_parent,
    ]  # fmt: skip
    with log_file.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)

    def healthy() -> bool:
        if proc.poll() is not None:
            raise DemoFailed(f"flexnpu-daemon exited with {proc.returncode}: {log_file.read_text()[-2000:]}")
        if not sock.exists():
            return False
        with DaemonClient(sock, timeout=2.0) as c:
            try:
                return c.health().ok
            except Exception:
                return False

    try:
        _wait("flexnpu-daemon", healthy)
        yield
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        remove_cgroups(cgroup_parent)


def run(*, keep: bool = False) -> int:
    from kubernetes import client

    from dra_driver import discovery
    from flexnpu_testing import clibrary
    from flexnpu_testing.devroot import build_device_root
    from flexnpu_testing.fake_apiserver import FakeAPIServer

    tmp = Path(tempfile.mkdtemp(prefix="flexnpu-demo-", dir="/tmp"))
    dirs = {k: tmp / k for k in ("registry", "plugins", "state", "run", "cdi", "root")}
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
            shm_root = Path(tempfile.mkdtemp(prefix="flexnpu-demo-", dir="/dev/shm"))
            link = f"fxdemo{os.getpid() % 100000}" if os.geteuid() == 0 else ""
            env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
            env.update(
                {
                    "FLEXNPU_NODE_NAME": NODE,
                    "FLEXNPU_KUBECONFIG": str(kubeconfig),
                    "FLEXNPU_INVENTORY": str(INVENTORY),
                    "FLEXNPU_KUBELET_REGISTRY_DIR": str(dirs["registry"]),
                    "FLEXNPU_KUBELET_PLUGINS_DIR": str(dirs["plugins"]),
                    "FLEXNPU_STATE_DIR": str(dirs["state"]),
                    "FLEXNPU_RUN_DIR": str(dirs["run"]),
                    "FLEXNPU_CDI_DIR": str(dirs["cdi"]),
                    "FLEXNPU_DEVICE_ROOT": str(dirs["root"]),
                    "FLEXNPU_SHM_DIR": str(shm_root),
                    "FLEXNPU_DAEMON_SOCKET": str(dirs["run"] / "daemon.sock"),
                    "FLEXNPU_CONTROL_LINK": link,
                    # FlexNPU's C client, injected into share containers (dra_driver/interposition.py)
                    "FLEXNPU_CLIENT_LIBRARY": str(clibrary.build_library()),
                }
            )
            _step(
                f"flexnpu-daemon and the node process: {len(inventory.dies)} emulated dies from {INVENTORY.name}"
            )
            try:
                with (
                    _daemon_process(env, dirs, shm_root, tmp / "daemon.log"),
                    _node_process(env, tmp / "node.log") as proc,
                ):
                    try:
                        _walk(api, resource, dirs, proc, env)
                        code = 0
                    except Exception:
                        for log_name in ("node.log", "daemon.log"):
                            _say(f"\n--- {log_name} (tail) ---")
                            _say("\n".join((tmp / log_name).read_text(errors="replace").splitlines()[-30:]))
                        raise
            finally:
                shutil.rmtree(shm_root, ignore_errors=True)
                if link:
                    from dra_driver import netlink

                    netlink.remove_link(link)
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


def _walk(
    api: Any, resource: Any, dirs: dict[str, Path], proc: subprocess.Popen[bytes], env: dict[str, str]
) -> None:
    from flexnpu_testing.kubelet import KubeletSimulator
    from flexnpu_testing.scheduler import SchedulerSim

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
            f"  {entry.uid}  {entry.namespace}/{entry.name}  {entry.state}  dies={[d.phy for d in entry.dies]}"
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

    _soft_walk(api, resource, dirs, handle, sched=sched, env=env)
    handle.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=15)


def _soft_walk(
    api: Any, resource: Any, dirs: dict[str, Path], handle: Any, *, sched: Any, env: dict[str, str]
) -> None:
    import dataclasses

    from dra_driver import wirefiles
    from flexnpu_client.errors import AclError
    from flexnpu_client.session import Session
    from flexnpu_wire import clientconf
    from flexnpu_wire.codes import ACL_ERROR_RT_MEMORY_ALLOCATION

    _step(
        "a pod's ResourceClaim for a vNPU share (vnpu-fixed.flexnpu.io): 1 GiB and 25 % of a die, policy fixed"
    )
    claim_body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "vnpu-share", "namespace": NAMESPACE},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "vnpu",
                        "exactly": {
                            "deviceClassName": "vnpu-fixed.flexnpu.io",
                            "capacity": {"requests": {"memory": "1Gi", "compute": "25"}},
                        },
                    }
                ],
                "config": [
                    {
                        "opaque": {
                            "driver": DEFAULT_DRIVER_NAME,
                            "parameters": {
                                "apiVersion": "npu.flexnpu.io/v1alpha1",
                                "kind": "VnpuConfig",
                                "policy": "fixed",
                            },
                        }
                    }
                ],
            }
        },
    }
    created = json.loads(
        resource.create_namespaced_resource_claim(NAMESPACE, claim_body, _preload_content=False).data
    )
    uid = created["metadata"]["uid"]
    pod_ref = {"resource": "pods", "name": "share-pod", "uid": "22222222-3333-4444-5555-666666666666"}
    allocated = sched.allocate(NAMESPACE, "vnpu-share", NODE, reserved_for=[pod_ref])
    (result,) = allocated["status"]["allocation"]["devices"]["results"]
    _say(
        f"  scheduler allocated {result['device']} shareID {result['shareID']} consumed {result['consumedCapacity']}"
    )

    _step("kubelet: NodePrepareResources (the daemon starts the share's aclserver)")
    ref = ClaimRef(namespace=NAMESPACE, uid=uid, name="vnpu-share")
    res = handle.prepare([ref])[uid]
    _check(not res.error, f"prepared without error {res.error!r}")
    (dev,) = res.devices
    _say(f"  device {dev.device} share {dev.share_id} CDI IDs {list(dev.cdi_device_ids)}")
    spec_file = next(p for p in dirs["cdi"].glob("*.json") if uid in p.name)
    spec = json.loads(spec_file.read_text())
    _say(json.dumps(spec["containerEdits"], indent=2))
    conf_file = dirs["run"] / "claims" / uid / "client.conf"
    conf = wirefiles.load_client_conf(conf_file)
    _say(
        f"  client.conf (mounted read-only at /etc/flexnpu/client.conf): endpoints {conf.endpoints}, shares {conf.shares}"
    )

    _step("kubectl describe resourceclaim vnpu-share (status.devices)")
    claim = json.loads(
        resource.read_namespaced_resource_claim("vnpu-share", NAMESPACE, _preload_content=False).data
    )
    for st in claim["status"].get("devices", []):
        cond = st["conditions"][0]
        _say(
            f"  {st['driver']}/{st['pool']}/{st['device']} share {st.get('shareID')}: {cond['type']}={cond['status']} ({cond['reason']})"
        )
        _say(f"    data: {st['data']}")
        if st.get("networkData"):
            _say(f"    networkData: {st['networkData']}")
    _check(claim["status"]["devices"][0]["conditions"][0]["status"] == "True", "claim status says Ready")

    _step("flexnpu-smi info")
    smi = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.smi", "info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    _say(smi.stdout.rstrip() or smi.stderr.rstrip())
    _check(smi.returncode == 0 and uid in smi.stdout, "flexnpu-smi lists the share")

    _step("a client uses the vNPU: allocations within the quota succeed, beyond it fail with 207001")
    shm_host = next(
        m["hostPath"] for m in spec["containerEdits"]["mounts"] if m["containerPath"] == "/dev/shm/flexnpu"
    )
    unix = str(Path(shm_host) / Path(conf.endpoints.unix).name) if conf.endpoints.unix else None
    host_conf = dataclasses.replace(
        conf, shm_dir=shm_host, endpoints=clientconf.Endpoints(unix=unix, tcp=conf.endpoints.tcp)
    )
    with Session.open(host_conf) as s:
        s.init()
        s.set_device(0)
        free, total = s.get_mem_info()
        _say(f"  get_mem_info: free {free >> 20} MiB, total {total >> 20} MiB (the quota)")
        ptr = s.malloc(768 << 20)
        _check(True, "malloc 768 MiB within the 1 GiB quota")
        s.copy_to_device(ptr, b"flexnpu" * 1024)
        _check(s.copy_from_device(ptr, 7) == b"flexnpu", "memcpy through the shared-memory data link")
        try:
            s.malloc(512 << 20)
        except AclError as err:
            _check(err.ret == ACL_ERROR_RT_MEMORY_ALLOCATION, f"malloc 512 MiB more refused: {err}")
        else:
            raise DemoFailed("an allocation over the quota succeeded")
        s.free(ptr)

    _c_client_walk(spec, host_conf, dirs["run"].parent / "c-app")

    _step("kubelet: NodeUnprepareResources")
    _check(handle.unprepare([ref]) == {uid: ""}, "unprepared")
    _check(not list(dirs["cdi"].glob("*.json")), "CDI spec removed")
    _check(not conf_file.parent.exists(), "client.conf removed")
    _check(not Path(shm_host).exists(), "shared-memory directory removed")
    claim = json.loads(
        resource.read_namespaced_resource_claim("vnpu-share", NAMESPACE, _preload_content=False).data
    )
    _check(not claim["status"].get("devices"), "claim status cleared")
    smi = subprocess.run(
        [sys.executable, "-m", "kubeletplugin.smi", "info"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    _check(smi.returncode == 0 and uid not in smi.stdout, "flexnpu-smi: nothing prepared, no aclserver left")
    sched.deallocate(NAMESPACE, "vnpu-share")
    resource.delete_namespaced_resource_claim("vnpu-share", NAMESPACE)


def _c_client_walk(spec: dict[str, Any], host_conf: Any, work: Path) -> None:
    """An unmodified C ACL program uses the share through the C client the CDI spec injects.

    The program declares the ACL functions itself and is linked with ``-lascendcl`` against a
    stub library (no FlexNPU header or library path). In a container the spec's
    ``/etc/ld.so.preload`` mount loads FlexNPU's ``libascendcl.so`` first; here on the host
    ``LD_PRELOAD`` of the same mounted file does what that mount does.
    """
    from dra_driver import interposition
    from flexnpu_testing import clibrary
    from flexnpu_wire import clientconf

    _step(
        "an unmodified C ACL program (built against a stub libascendcl) uses the vNPU through the injected shim"
    )
    mounts = {m["containerPath"]: m["hostPath"] for m in spec["containerEdits"]["mounts"]}
    _check(
        interposition.CONTAINER_LIBRARY in mounts and interposition.CONTAINER_PRELOAD in mounts,
        f"the CDI spec mounts {interposition.CONTAINER_LIBRARY} and {interposition.CONTAINER_PRELOAD}",
    )
    c_dir = clibrary.REPO / "tests" / "c"
    stub = clibrary.compile_program(
        c_dir / "stub_ascendcl.c",
        include_acl_headers=False,
        extra_flags=["-shared", "-fPIC", "-Wl,-soname,libascendcl.so"],
        out_dir=work / "stub",
    )
    stub_lib = stub.with_name("libascendcl.so")
    stub.rename(stub_lib)
    app = clibrary.compile_program(
        c_dir / "unmodified_app.c", include_acl_headers=False, link_library=stub_lib, out_dir=work
    )
    conf_file = work / "client.conf"
    conf_file.write_text(clientconf.render(host_conf))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "FLEXNPU_CONF": str(conf_file),
        "LD_PRELOAD": mounts[interposition.CONTAINER_LIBRARY],
    }
    quota = host_conf.shares[0].memory_bytes
    res = subprocess.run(
        [str(app), str(quota), "1"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    values = {
        k: v
        for k, _, v in (
            line[4:].partition(" ") for line in res.stdout.splitlines() if line.startswith("val ")
        )
    }
    _say(
        "  "
        + "\n  ".join(line for line in res.stdout.splitlines() if not line.startswith("val over_quota_msg"))
    )
    _check(
        values.get("provider") == mounts[interposition.CONTAINER_LIBRARY],
        "aclInit resolves to FlexNPU's libascendcl.so",
    )
    _check(values.get("total") == str(quota), "aclrtGetMemInfo total is the claim's quota")
    _check(values.get("over_quota_code") == "207001", "aclrtMalloc beyond the quota returns 207001")
    _check(
        res.returncode == 0, "every check of the C program passed (memcpy both ways through the data link)"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m flexnpu_testing.demo [--keep]`` from the repository's root."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m flexnpu_testing.demo", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory for inspection")
    return run(keep=parser.parse_args(argv).keep)


if __name__ == "__main__":
    sys.exit(main())

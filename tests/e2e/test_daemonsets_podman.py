"""The chart's two DaemonSets, run in podman exactly as rendered, on a node rooted in a temp directory.

The chart is rendered with ``emulated.enabled`` (a node without NPUs), the image built by scripts/build-image.sh,
``kubeletDir`` and every other host directory under the temp root, and a control link of its own. Each container
runs with exactly its command, environment, mounts (with their propagation) and security context
(tests/e2e/podspec.py), with the in-cluster API config the kubelet would give it (TLS in front of the fake API
server). Then, from the host side, like a kubelet: the registration socket appears, both readiness probes pass,
the kubelet simulator registers the plugin, and a whole-die claim and a vNPU share claim are prepared (the share
through the daemon's aclserver, used from the host over its unix socket); a rolling update replaces the plugin
pod while the share's session stays up, and the new instance unprepares both claims.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from kubernetes import client

from dra_driver import interposition, netlink, wirefiles
from dra_driver.daemon_api.values import EntityState
from flexnpu_client.session import Session
from flexnpu_runtime.daemon import processes
from flexnpu_testing.daemon import existing_cgroups, remove_cgroups
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.kubelet import KubeletSimulator
from flexnpu_testing.scheduler import SchedulerSim
from flexnpu_testing.waiting import wait_for
from flexnpu_wire import clientconf
from tests.e2e import image as img
from tests.e2e import podspec
from tests.e2e.tlsproxy import TLSProxy, make_certificate
from tests.integration.conftest import DRIVER, NAMESPACE, NODE
from tests.unit.test_manifests import RELEASE, chart_values, render_chart

pytestmark = [pytest.mark.root, pytest.mark.podman, pytest.mark.timeout(img.BUILD_TIMEOUT + 600)]

MI = 1024 * 1024


@pytest.fixture
def built(built_image: img.Built) -> img.Built:
    return built_image


@dataclasses.dataclass
class Cluster:
    api: FakeAPIServer
    node: podspec.NodeRoot
    docs: dict[str, dict[str, Any]]
    configmaps: dict[str, dict[str, Any]]
    link: str
    cgroup_parent: str


@pytest.fixture
def cluster(built: img.Built, api: FakeAPIServer, short_tmp: Path) -> Iterator[Cluster]:
    root = short_tmp / "n"
    certs = short_tmp / "certs"
    certs.mkdir()
    cert, key = make_certificate(certs)
    sa_dir = podspec.write_service_account(short_tmp / "sa", cert.read_bytes(), RELEASE["Namespace"])
    link = f"fxs{uuid.uuid4().hex[:8]}"
    cgroup_parent = f"flexnpu-e2e-{uuid.uuid4().hex[:8]}"  # this test's own, so no other daemon's is touched
    repo, tag = built.image.rsplit(":", 1)
    values = chart_values(
        {
            "emulated.enabled": True,
            "image.repository": repo,
            "image.tag": tag,
            "image.pullPolicy": "Never",
            "kubeletDir": str(root / "kubelet"),
            "plugin.controlLink": {"name": link, "cidr": "169.254.213.1/24"},
            "plugin.metricsPort": _free_port(),  # host network: not the default, which may be taken here
            "daemon.cgroupParent": cgroup_parent,
        }
    )
    docs = {f"{d['kind']}/{d['metadata']['name']}": d for d in render_chart(values)}
    configmaps = {d["metadata"]["name"]: d for d in docs.values() if d["kind"] == "ConfigMap"}
    # What a node has before the driver is installed: the kubelet's registry, its /proc, and /dev/shm as a
    # *private* tmpfs (a host without systemd): no host prerequisite is made here. The daemon pod's init
    # container makes the shm root a shared mount in the host's namespace, so the claim tmpfs mounts reach it.
    (root / "kubelet" / "plugins_registry").mkdir(parents=True)
    shm = root / "dev" / "shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "fx-node-shm", str(shm)], check=True)
    subprocess.run(["mount", "--make-private", str(shm)], check=True)
    (root / "proc").mkdir()
    subprocess.run(["mount", "-t", "proc", "fx-node-proc", str(root / "proc")], check=True)
    # The node's cgroup file system is the host's own (the daemon pod mounts it from the host).
    cgroup_fs = root / "sys" / "fs" / "cgroup"
    cgroup_fs.mkdir(parents=True)
    subprocess.run(["mount", "--rbind", "/sys/fs/cgroup", str(cgroup_fs)], check=True)
    subprocess.run(["mount", "--make-rprivate", str(cgroup_fs)], check=True)
    backend = urlsplit(api.url)
    try:
        with TLSProxy(cert, key, (backend.hostname or "127.0.0.1", backend.port or 80)) as proxy:
            node = podspec.NodeRoot(root, NODE, "127.0.0.1", proxy.port, sa_dir)
            try:
                yield Cluster(api, node, docs, configmaps, link, cgroup_parent)
            finally:
                netlink.remove_link(link)
    finally:
        podspec.unmount_under(root)
        remove_cgroups(cgroup_parent)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(cluster: Cluster, name: str, pods: list[podspec.RunningPod]) -> podspec.RunningPod:
    pod = podspec.start_pod(
        cluster.docs[f"DaemonSet/{name}"], cluster.node, cluster.configmaps, namespace=RELEASE["Namespace"]
    )
    pods.append(pod)
    return pod


def remove_pods(pods: list[podspec.RunningPod]) -> None:
    """Print each container's log (shown by pytest when the test failed), then remove the pods."""
    for pod in pods:
        for container in pod.containers:
            print(f"==== {pod.name}/{container}\n{pod.logs(container)[-6000:]}")
        pod.remove()


def wait_ready(pod: podspec.RunningPod, container: str, timeout: float = 90) -> str:
    last: list[str] = []

    def ready() -> bool:
        if not pod.running(container):
            raise AssertionError(f"{container} exited:\n{pod.logs(container)[-4000:]}")
        proc = pod.exec_probe(container, "readinessProbe")
        last[:] = [proc.stdout + proc.stderr]
        return proc.returncode == 0

    wait_for(ready, what=f"{container} readiness probe", timeout=timeout)
    return last[0]


def create_claim(api: FakeAPIServer, name: str, request: dict[str, Any]) -> str:
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
    }
    raw = client.ResourceV1Api(api.api_client()).create_namespaced_resource_claim(
        NAMESPACE, body, _preload_content=False
    )
    uid: str = json.loads(raw.data)["metadata"]["uid"]
    return uid


def published(api: FakeAPIServer) -> list[dict[str, Any]]:
    raw = client.ResourceV1Api(api.api_client()).list_resource_slice(
        field_selector=f"spec.nodeName={NODE}", _preload_content=False
    )
    return [d for s in json.loads(raw.data)["items"] for d in s["spec"].get("devices") or []]


SHARE_REQUEST = {
    "name": "vnpu",
    "exactly": {
        "deviceClassName": "vnpu.flexnpu.io",
        "capacity": {"requests": {"memory": "256Mi", "compute": "20"}},
    },
}


def host_conf(cluster: Cluster, share_uid: str) -> Path:
    """The share's client.conf as the host sees it (the claim's shm dir under the node root, unix socket only)."""
    root = cluster.node.root
    conf = wirefiles.load_client_conf(root / "var/run/flexnpu/claims" / share_uid / "client.conf")
    host_shm = cluster.node.host(f"/dev/shm/flexnpu/{share_uid}")
    assert conf.endpoints.unix is not None
    mapped = dataclasses.replace(
        conf,
        shm_dir=str(host_shm),
        endpoints=clientconf.Endpoints(unix=str(host_shm / Path(conf.endpoints.unix).name), tcp=None),
    )
    path = root / f"host-client-{share_uid}.conf"
    path.write_text(clientconf.render(mapped))
    return path


def test_daemonsets_run_as_rendered_and_serve_prepares(cluster: Cluster) -> None:
    from dra_kubeletplugin.claims import ClaimRef

    root = cluster.node.root
    pods: list[podspec.RunningPod] = []
    try:
        daemon = start(cluster, "flexnpu-daemon", pods)
        assert "answers on /var/run/flexnpu/daemon.sock" in wait_ready(daemon, "daemon")
        plugin = start(cluster, "flexnpu-dra-plugin", pods)
        reg = root / "kubelet" / "plugins_registry" / f"{DRIVER}-{plugin.uid}-reg.sock"
        wait_for(reg.exists, what="registration socket on the host side", timeout=60)
        assert stat.S_ISSOCK(reg.stat().st_mode)
        # The kubelet's plugin watcher registers the new socket; only then is the plugin ready (with its pool).
        kubelet = KubeletSimulator(root / "kubelet" / "plugins_registry").wait_for_plugin(DRIVER, timeout=30)
        assert f"plugin {DRIVER} answers" in wait_ready(plugin, "plugin")
        # Liveness: every loop of the node process passed recently (/healthz on the metrics port).
        live = plugin.exec_probe("plugin", "livenessProbe")
        assert live.returncode == 0, live.stdout + live.stderr
        live = daemon.exec_probe("daemon", "livenessProbe")
        assert live.returncode == 0, live.stdout + live.stderr
        wait_for(lambda: len(published(cluster.api)) >= 2, what="published devices", timeout=60)
        # The plugin built the emulated device root itself (--build-device-root), with real device nodes.
        devroot = root / "var/lib/flexnpu/devroot"
        assert stat.S_ISCHR((devroot / "dev/davinci0").stat().st_mode)
        assert (devroot / "usr/local/Ascend/driver/version.info").is_file()

        assert kubelet.info.endpoint == str(root / "kubelet" / "plugins" / DRIVER / f"dra-{plugin.uid}.sock")
        sim = SchedulerSim(cluster.api.api_client(), DRIVER)
        consumer = {"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}
        whole_uid = create_claim(
            cluster.api, "whole", {"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}
        )
        share_uid = create_claim(cluster.api, "share", SHARE_REQUEST)
        sim.allocate(NAMESPACE, "whole", NODE, reserved_for=[consumer])
        sim.allocate(NAMESPACE, "share", NODE, reserved_for=[consumer])
        refs = [ClaimRef(NAMESPACE, whole_uid, "whole"), ClaimRef(NAMESPACE, share_uid, "share")]
        results = kubelet.prepare(refs)
        assert {uid: r.error for uid, r in results.items()} == {whole_uid: "", share_uid: ""}

        cdi = root / "var/run/cdi"
        specs = {p.name: json.loads(p.read_text()) for p in cdi.glob("*.json")}
        (whole_spec,) = [s for n, s in specs.items() if whole_uid in n]
        nodes = [d for dev in whole_spec["devices"] for d in dev["containerEdits"].get("deviceNodes") or []]
        nodes += whole_spec.get("containerEdits", {}).get("deviceNodes") or []
        for dn in nodes:
            # Every host path the spec names exists on the node (here: under the temp root).
            assert cluster.node.host(dn.get("hostPath") or dn["path"]).exists(), dn

        # The share's spec injects the C client library from where the init container put it on the host.
        (share_spec,) = [s for n, s in specs.items() if share_uid in n]
        lib_mounts = [
            m
            for m in share_spec.get("containerEdits", {}).get("mounts") or []
            if m["hostPath"].startswith("/var/lib/flexnpu/client/")
        ]
        assert {m["containerPath"] for m in lib_mounts} == {
            "/usr/lib/flexnpu/libascendcl.so",
            *(f"/usr/lib/flexnpu/{n}" for n in interposition.CLOSURE_LIBRARIES),
            "/etc/ld.so.preload",
        }
        for m in lib_mounts:
            assert (
                m["hostPath"].startswith("/var/lib/flexnpu/client/")
                and cluster.node.host(m["hostPath"]).is_file()
            )
        # The share is served by an aclserver the daemon container started, in the claim's own tmpfs, which
        # reached the host side (Bidirectional on the root the init container made shared); use it from the host.
        assert podspec.is_mount(cluster.node.host("/dev/shm/flexnpu"))
        assert podspec.is_mount(cluster.node.host(f"/dev/shm/flexnpu/{share_uid}"))
        conf_path = root / "var/run/flexnpu/claims" / share_uid / "client.conf"
        conf = wirefiles.load_client_conf(conf_path)
        assert [(s.memory_bytes, s.compute_percent) for s in conf.shares] == [(256 * MI, 20)]
        with Session.open(host_conf(cluster, share_uid)) as session:
            session.init()
            session.set_device(0)
            assert session.get_mem_info()[1] == 256 * MI
            ptr = session.malloc(16 * MI)

            # Rolling update (maxSurge 1): a second plugin pod registers on its own sockets, the first one
            # goes; the share's aclserver and this session are not disturbed, and the new instance unprepares.
            kubelet.close()
            plugin2 = start(cluster, "flexnpu-dra-plugin", pods)
            reg2 = root / "kubelet" / "plugins_registry" / f"{DRIVER}-{plugin2.uid}-reg.sock"
            wait_for(reg2.exists, what="the new instance's registration socket", timeout=60)
            watcher = KubeletSimulator(root / "kubelet" / "plugins_registry")
            registered2 = watcher._register(
                reg2, DRIVER, time.monotonic() + 30
            )  # the kubelet registers each socket
            wait_ready(plugin2, "plugin")
            registered2.close()
            plugin.stop()
            assert not plugin.running("plugin") and not reg.exists()
            assert "Traceback" not in plugin.logs("plugin"), plugin.logs("plugin")[-4000:]
            assert session.get_mem_info()[0] == 240 * MI  # same aclserver, same allocation
            # The new instance took over the metrics port the old one held: its liveness probe passes.
            wait_for(
                lambda: plugin2.exec_probe("plugin", "livenessProbe").returncode == 0,
                what="the new instance's liveness (metrics port taken over)",
                timeout=60,
            )
            session.free(ptr)
        kubelet = KubeletSimulator(root / "kubelet" / "plugins_registry").wait_for_plugin(DRIVER, timeout=30)
        assert kubelet.info.endpoint.endswith(f"dra-{plugin2.uid}.sock")

        assert kubelet.unprepare(refs) == {whole_uid: "", share_uid: ""}
        assert list(cdi.glob("*.json")) == []
        assert not conf_path.exists()
        assert not podspec.is_mount(cluster.node.host(f"/dev/shm/flexnpu/{share_uid}"))
        kubelet.close()

        # SIGTERM, as the kubelet sends: both exit cleanly.
        for pod, container in ((plugin2, "plugin"), (daemon, "daemon")):
            pod.stop()
            assert not pod.running(container)
            assert "Traceback" not in pod.logs(container), pod.logs(container)[-4000:]
        assert not reg2.exists()
    finally:
        remove_pods(pods)


class CallLoop:
    """A client that keeps calling its share (``get_mem_info``) from a thread, counting what fails."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.calls = 0
        self.failures: list[str] = []
        self.free = -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="call-loop", daemon=True)

    def __enter__(self) -> CallLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.free = self.session.get_mem_info()[0]
                self.calls += 1
            except Exception as err:  # recorded, never raised: the test asserts on the record
                self.failures.append(f"{type(err).__name__}: {err}")
            self._stop.wait(0.005)  # pacing of the client's own calls, not a synchronisation

    def served_since(self, mark: int) -> bool:
        return self.calls > mark


def test_daemon_container_restarts_leave_the_share_serving(cluster: Cluster) -> None:
    """The chart's daemon container stopped and started again, then its init SIGKILLed and the container
    started again, while a client keeps calling its share: no call fails, the aclserver is the same process
    in its own cgroup outside the container, the quota and the allocation stay, and the new daemon re-adopts it."""
    from dra_driver.daemon_api.client import DaemonClient
    from dra_kubeletplugin.claims import ClaimRef

    root = cluster.node.root
    pods: list[podspec.RunningPod] = []
    try:
        daemon = start(cluster, "flexnpu-daemon", pods)
        assert "cgroups: cgroup" in wait_ready(daemon, "daemon")
        plugin = start(cluster, "flexnpu-dra-plugin", pods)
        # The kubelet registers the plugin; only then is it ready (readiness means serving).
        kubelet = KubeletSimulator(root / "kubelet" / "plugins_registry").wait_for_plugin(DRIVER, timeout=30)
        wait_ready(plugin, "plugin")
        wait_for(lambda: len(published(cluster.api)) >= 2, what="published devices", timeout=60)
        consumer = {"resource": "pods", "name": "p", "uid": str(uuid.uuid4())}
        share_uid = create_claim(cluster.api, "share", SHARE_REQUEST)
        SchedulerSim(cluster.api.api_client(), DRIVER).allocate(
            NAMESPACE, "share", NODE, reserved_for=[consumer]
        )
        ref = ClaimRef(NAMESPACE, share_uid, "share")
        assert kubelet.prepare([ref])[share_uid].error == ""
        daemon_api = DaemonClient(root / "var/run/flexnpu/daemon.sock", timeout=10)
        [ent] = daemon_api.list(probe=True)
        pid = ent.pid
        st = processes.stat(pid)
        assert st is not None
        started = st.start_time
        assert ent.cgroup == f"{cluster.cgroup_parent}/aclserver-{share_uid}"
        assert f"/{ent.cgroup}" in Path(f"/proc/{pid}/cgroup").read_text()
        assert daemon.init_pid("daemon") not in (0, pid)

        with Session.open(host_conf(cluster, share_uid)) as session:
            session.init()
            session.set_device(0)
            ptr = session.malloc(16 * MI)
            with CallLoop(session) as calls:
                wait_for(lambda: calls.free == 240 * MI, what="the client calling", timeout=30)
                for how in ("stop", "kill -9 of the container's init"):
                    if how == "stop":
                        daemon.stop()  # SIGTERM, as the kubelet sends; the runtime then kills what is in its cgroup
                    else:
                        os.kill(daemon.init_pid("daemon"), signal.SIGKILL)
                    wait_for(
                        lambda: not daemon.running("daemon"),
                        what=f"daemon container gone after {how}",
                        timeout=60,
                    )
                    if (
                        how == "stop"
                    ):  # it handled the SIGTERM itself (no SIGKILL by the runtime after its timeout)
                        assert daemon.logs("daemon").count("received SIGTERM") == 1
                    mark = calls.calls
                    wait_for(
                        lambda m=mark: calls.served_since(m),
                        what=f"the share served with no daemon ({how})",
                        timeout=30,
                    )
                    assert processes.is_alive(pid, started), f"aclserver pid {pid} died with {how}"
                    daemon.start_again("daemon")
                    wait_ready(daemon, "daemon")
                    [again] = daemon_api.list(probe=True)
                    assert (again.pid, again.state, again.restarts) == (pid, EntityState.RUNNING, 0), how
                    assert "re-adopted aclserver pid" in daemon.logs("daemon")
                    mark = calls.calls
                    wait_for(lambda m=mark: calls.served_since(m), what=f"calls after {how}", timeout=30)
            assert calls.failures == []
            assert session.get_mem_info() == (240 * MI, 256 * MI)  # the quota and the allocation stayed
            session.free(ptr)
        daemon_api.close()
        assert kubelet.unprepare([ref]) == {share_uid: ""}
        wait_for(lambda: not processes.is_alive(pid, started), what="aclserver gone", timeout=30)
        left = existing_cgroups(cluster.cgroup_parent, Path("/sys/fs/cgroup"))
        assert left is not None and left.claims() == set()  # the claim's cgroup went with it
        kubelet.close()
        for pod, container in ((plugin, "plugin"), (daemon, "daemon")):
            pod.stop()
            assert "Traceback" not in pod.logs(container), pod.logs(container)[-4000:]
    finally:
        remove_pods(pods)

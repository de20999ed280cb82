"""Real-process fixtures: a fake API server, the node process as a subprocess, a kubelet simulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from dra_driver import discovery, netlink, readiness
from flexnpu_testing.devroot import build_device_root
from flexnpu_testing.fake_apiserver import FakeAPIServer
from flexnpu_testing.kubelet import KubeletSimulator, PluginHandle
from flexnpu_testing.scheduler import SchedulerSim
from flexnpu_testing.waiting import wait_for
from tests.integration.daemon_harness import DaemonProc

REPO = Path(__file__).resolve().parents[2]
INVENTORIES = REPO / "flexnpu_testing" / "inventories"
DRIVER = "npu.flexnpu.io"
NODE = "node-a"
NAMESPACE = "team-a"
WHOLE_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "whole"'
SOFT_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "soft"'
CLASSES = {  # as the chart makes them (manifests/helm/flexnpu-dra-driver/templates/deviceclasses.yaml)
    "npu.flexnpu.io": WHOLE_CEL,
    "vnpu.flexnpu.io": SOFT_CEL,  # elastic shares, the default policy
    "vnpu-fixed.flexnpu.io": SOFT_CEL.replace('"soft"', '"soft-fixed"'),
    "vnpu-best-effort.flexnpu.io": SOFT_CEL.replace('"soft"', '"soft-best-effort"'),
}


@pytest.fixture
def api() -> Iterator[FakeAPIServer]:
    with FakeAPIServer() as srv:
        core = client.CoreV1Api(srv.api_client())
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        res = client.ResourceV1Api(srv.api_client())
        for name, cel in CLASSES.items():
            res.create_device_class(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": name},
                    "spec": {"selectors": [{"cel": {"expression": cel}}]},
                }
            )
        yield srv


@dataclass
class Node:
    """A running node process and the handles a test needs around it."""

    api: FakeAPIServer
    root: Path
    dirs: dict[str, Path]
    env: dict[str, str]
    log_file: Path
    proc: subprocess.Popen[bytes] | None = None
    kubelet: PluginHandle | None = None
    extra_args: list[str] = field(default_factory=list)
    daemon: DaemonProc | None = None

    @property
    def resource(self) -> client.ResourceV1Api:
        return client.ResourceV1Api(self.api.api_client())

    def api_core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api.api_client())

    @property
    def scheduler(self) -> SchedulerSim:
        return SchedulerSim(self.api.api_client(), DRIVER)

    def start(self) -> Node:
        with self.log_file.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubeletplugin.cli", "plugin", *self.extra_args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.kubelet = KubeletSimulator(self.dirs["registry"]).wait_for_plugin(DRIVER, timeout=30)
        if not getattr(self.api, "_down", False):  # as the kubelet marks it Ready: its pool is published
            path = readiness.path_for(self.dirs["run"], self.env.get("FLEXNPU_POD_UID") or None)
            wait_for(
                lambda: (st := readiness.read(path)) is not None and st.published,
                what="the node's pool published",
            )
        return self

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.kubelet:
            self.kubelet.close()
            self.kubelet = None
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        return rc

    def log(self) -> str:
        return self.log_file.read_text(errors="replace")

    def slices(self) -> list[dict[str, Any]]:
        raw = self.resource.list_resource_slice(
            field_selector=f"spec.driver={DRIVER},spec.nodeName={NODE}", _preload_content=False
        )
        items: list[dict[str, Any]] = json.loads(raw.data)["items"]
        return items

    def devices(self) -> list[dict[str, Any]]:
        """Devices of the node's pool, once the pool is complete (all its slices published), else []."""
        slices = self.slices()
        if not slices or len(slices) != slices[0]["spec"]["pool"]["resourceSliceCount"]:
            return []  # like the scheduler, ignore an incomplete pool
        if len({s["spec"]["pool"]["generation"] for s in slices}) != 1:
            return []
        return [d for s in slices for d in s["spec"].get("devices") or []]

    def create_claim(
        self, name: str, requests: list[dict[str, Any]], config: list[dict[str, Any]] | None = None
    ) -> str:
        body: dict[str, Any] = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": requests, **({"config": config} if config else {})}},
        }
        raw = self.resource.create_namespaced_resource_claim(NAMESPACE, body, _preload_content=False)
        uid: str = json.loads(raw.data)["metadata"]["uid"]
        return uid

    def cdi_specs(self) -> list[Path]:
        return sorted(self.dirs["cdi"].glob("*.json"))


def make_node(
    api: FakeAPIServer, root: Path, inventory: str = "a3-one-module.yaml", **env_extra: str
) -> Node:
    dirs = {k: root / k for k in ("registry", "plugins", "state", "run", "shm", "cdi", "devroot")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    inv_path = INVENTORIES / inventory
    build_device_root(
        dirs["devroot"], discovery.from_config(inventory=inv_path, npu_smi="npu-smi").discover()
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXNPU_")}
    env.update(
        {
            "FLEXNPU_NODE_NAME": NODE,
            "FLEXNPU_KUBECONFIG": str(api.write_kubeconfig(root / "kubeconfig")),
            "FLEXNPU_INVENTORY": str(inv_path),
            "FLEXNPU_KUBELET_REGISTRY_DIR": str(dirs["registry"]),
            "FLEXNPU_KUBELET_PLUGINS_DIR": str(dirs["plugins"]),
            "FLEXNPU_STATE_DIR": str(dirs["state"]),
            "FLEXNPU_RUN_DIR": str(dirs["run"]),
            "FLEXNPU_SHM_DIR": str(dirs["shm"]),
            "FLEXNPU_CDI_DIR": str(dirs["cdi"]),
            "FLEXNPU_DEVICE_ROOT": str(dirs["devroot"]),
            "FLEXNPU_LOG_LEVEL": "DEBUG",
            "FLEXNPU_CONTROL_LINK": f"fx{abs(hash(str(root))) % 10**10}",
        }
    )
    env.update(env_extra)
    return Node(api=api, root=root, dirs=dirs, env=env, log_file=root / "node.log")


@pytest.fixture
def node_factory(api: FakeAPIServer, short_tmp: Path) -> Iterator[Callable[..., Node]]:
    """Make (not start) nodes; every one is stopped and its control link removed at teardown."""
    made: list[Node] = []

    daemons: list[DaemonProc] = []

    def factory(inventory: str = "a3-one-module.yaml", *, daemon: bool = False, **env_extra: str) -> Node:
        if daemon:
            d = DaemonProc().start()  # serves the eight-910b4 inventory
            daemons.append(d)
            inventory = "eight-910b4.yaml"
            env_extra = {
                "FLEXNPU_DAEMON_SOCKET": str(d.socket),
                "FLEXNPU_SHM_DIR": str(d.shm_root),
                **env_extra,
            }
        n = make_node(api, short_tmp / f"n{len(made)}", inventory, **env_extra)
        n.daemon = daemons[-1] if daemon else None
        made.append(n)
        return n

    yield factory
    for n in made:
        n.stop()
        if n.env.get("FLEXNPU_CONTROL_LINK", "").startswith("fx"):  # only links the tests named
            netlink.remove_link(n.env["FLEXNPU_CONTROL_LINK"])
    for d in daemons:
        d.cleanup()


@pytest.fixture
def node(node_factory: Callable[..., Node]) -> Node:
    return node_factory().start()


MakeDaemon = Callable[..., DaemonProc]


@pytest.fixture
def make_daemon() -> Iterator[MakeDaemon]:
    """Real daemons on temp dirs (``DaemonProc``); each removed at the end, the last made first (a
    later instance on the same node would restart what an earlier one's cleanup kills)."""
    made: list[DaemonProc] = []

    def make(
        *,
        command: str | None = None,
        extra: tuple[str, ...] = (),
        start: bool = True,
        same_node_as: DaemonProc | None = None,
    ) -> DaemonProc:
        d = DaemonProc(command=command, extra=extra, same_node_as=same_node_as)
        made.append(d)
        return d.start() if start else d

    yield make
    for d in reversed(made):
        d.cleanup()

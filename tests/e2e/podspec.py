"""Run a rendered DaemonSet's pod the way a kubelet would, with podman, on a "node" rooted in a temp directory.

What is translated, field by field (anything else in a container spec raises, so the chart cannot grow a field
this runner silently ignores):

* ``command`` + ``args`` -> the process (the image has no ENTRYPOINT); ``env`` with ``value`` (``$(VAR)``
  expanded from earlier entries, as the kubelet does) and ``valueFrom.fieldRef`` (``spec.nodeName``,
  ``metadata.uid``, ``metadata.name``, ``metadata.namespace``), plus what the kubelet injects:
  ``KUBERNETES_SERVICE_HOST``/``PORT`` and, unless ``automountServiceAccountToken: false``, the service-account
  token directory;
* ``volumeMounts`` of ``hostPath`` (host side moved under the node root unless already inside it; ``Directory``
  and ``File`` must exist, ``DirectoryOrCreate`` is made), ``configMap`` (its data as files, read-only) and
  ``emptyDir`` volumes; ``readOnly``; ``mountPropagation`` (None -> rprivate, HostToContainer -> rslave,
  Bidirectional -> rshared);
* ``securityContext``: ``privileged``, ``runAsUser``/``runAsGroup``, ``capabilities`` (drop/add),
  ``allowPrivilegeEscalation: false`` (no-new-privileges), ``readOnlyRootFilesystem``;
* pod ``hostNetwork`` (``--network=host``; otherwise no network);
* init containers, in order, each to completion before the containers start;
* exec probes, run with ``podman exec`` in the container's environment.

Scheduling fields (priority, tolerations, node selectors), resources and DNS policy do not change what runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.e2e import image as img

Obj = dict[str, Any]

_CONTAINER_KEYS = {
    "name",
    "image",
    "imagePullPolicy",
    "command",
    "args",
    "env",
    "securityContext",
    "readinessProbe",
    "livenessProbe",
    "resources",
    "volumeMounts",
    "ports",
}
_PROPAGATION = {None: "rprivate", "None": "rprivate", "HostToContainer": "rslave", "Bidirectional": "rshared"}
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass
class NodeRoot:
    """A node's file system under ``root``, and the in-cluster API endpoint its pods get."""

    root: Path
    node_name: str
    api_host: str
    api_port: int
    sa_dir: Path  # token, ca.crt, namespace

    def host(self, path: str) -> Path:
        p = Path(path)
        return p if p.is_relative_to(self.root) else self.root / path.lstrip("/")


@dataclass
class RunningPod:
    name: str
    uid: str
    containers: dict[str, str] = field(default_factory=dict)  # container name -> podman name
    specs: dict[str, Obj] = field(default_factory=dict)

    def exec_probe(self, container: str, probe: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        command = self.specs[container][probe]["exec"]["command"]
        return subprocess.run(
            ["podman", "exec", self.containers[container], *command],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def logs(self, container: str) -> str:
        proc = subprocess.run(
            ["podman", "logs", self.containers[container]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return proc.stdout + proc.stderr

    def running(self, container: str) -> bool:
        proc = subprocess.run(
            ["podman", "inspect", "--format", "{{.State.Running}}", self.containers[container]],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        return proc.stdout.strip() == "true"

    def stop(self, timeout: int = 20) -> None:
        for name in self.containers.values():
            subprocess.run(
                ["podman", "stop", "-t", str(timeout), name], capture_output=True, timeout=120, check=False
            )

    def remove(self) -> None:
        for name in self.containers.values():
            subprocess.run(["podman", "rm", "-f", name], capture_output=True, timeout=120, check=False)


def expand_env(container: Obj, pod_meta: Mapping[str, str], node_name: str) -> dict[str, str]:
    """The container's environment as the kubelet computes it (pure)."""
    fields = {
        "spec.nodeName": node_name,
        "metadata.uid": pod_meta["uid"],
        "metadata.name": pod_meta["name"],
        "metadata.namespace": pod_meta["namespace"],
    }
    out: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "valueFrom" in entry:
            ref = entry["valueFrom"]["fieldRef"]["fieldPath"]
            out[entry["name"]] = fields[ref]
        else:
            value = str(entry.get("value", ""))
            out[entry["name"]] = _VAR.sub(lambda m: out.get(m.group(1), m.group(0)), value)
    return out


def podman_args(
    pod: Obj, container: Obj, node: NodeRoot, pod_meta: Mapping[str, str], podman_name: str
) -> list[str]:
    """``podman run`` arguments for one container of ``pod`` (makes the host directories it needs)."""
    unknown = set(container) - _CONTAINER_KEYS
    if unknown:
        raise NotImplementedError(
            f"container {container['name']}: fields {sorted(unknown)} are not translated"
        )
    spec = pod["spec"]
    args = ["run", "-d", "--name", podman_name, "--pull=never", *img.RUN_FLAGS]
    args.append("--network=host" if spec.get("hostNetwork") else "--network=none")
    env = {
        "KUBERNETES_SERVICE_HOST": node.api_host,
        "KUBERNETES_SERVICE_PORT": str(node.api_port),
        **expand_env(container, pod_meta, node.node_name),
    }
    args += [f"--env={k}={v}" for k, v in env.items()]
    sc = container.get("securityContext") or {}
    if sc.get("privileged"):
        args.append("--privileged")
    if "runAsUser" in sc:
        args.append(f"--user={sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}")
    caps = sc.get("capabilities") or {}
    args += [f"--cap-drop={c.lower()}" for c in caps.get("drop") or []]
    args += [f"--cap-add={c}" for c in caps.get("add") or []]
    if sc.get("allowPrivilegeEscalation") is False:
        args.append("--security-opt=no-new-privileges")
    if sc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    volumes = {v["name"]: v for v in spec.get("volumes") or []}
    pod_dir = node.root / "pods" / pod_meta["uid"]
    for mount in container.get("volumeMounts") or []:
        vol = volumes[mount["name"]]
        read_only = bool(mount.get("readOnly"))
        if "hostPath" in vol:
            src = node.host(vol["hostPath"]["path"])
            kind = vol["hostPath"].get("type", "")
            if kind == "DirectoryOrCreate":
                src.mkdir(parents=True, exist_ok=True)
            elif kind == "Directory" and not src.is_dir():
                raise FileNotFoundError(f"hostPath {vol['hostPath']['path']} ({src}) is not a directory")
            elif kind == "File" and not src.is_file():
                raise FileNotFoundError(f"hostPath {vol['hostPath']['path']} ({src}) is not a file")
        elif "configMap" in vol:
            src = pod_dir / "configmaps" / vol["name"]
            read_only = True
        elif "emptyDir" in vol:
            src = pod_dir / "empty" / vol["name"]
            src.mkdir(parents=True, exist_ok=True)
        else:
            raise NotImplementedError(f"volume {vol['name']}: only hostPath, configMap and emptyDir")
        opts = [_PROPAGATION[mount.get("mountPropagation")]]
        if read_only:
            opts.append("ro")
        args.append(f"--volume={src}:{mount['mountPath']}:{','.join(opts)}")
    if spec.get("automountServiceAccountToken", True) is not False:
        args.append(f"--volume={node.sa_dir}:/var/run/secrets/kubernetes.io/serviceaccount:ro")
    image = container["image"]
    return [*args, image, *(container.get("command") or []), *(container.get("args") or [])]


def materialize_configmaps(pod: Obj, configmaps: Mapping[str, Obj], pod_dir: Path) -> None:
    for vol in pod["spec"].get("volumes") or []:
        if "configMap" not in vol:
            continue
        data = configmaps[vol["configMap"]["name"]].get("data") or {}
        target = pod_dir / "configmaps" / vol["name"]
        target.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (target / key).write_text(text)


def start_pod(daemonset: Obj, node: NodeRoot, configmaps: Mapping[str, Obj], *, namespace: str) -> RunningPod:
    """Start the DaemonSet's pod: its init containers in order, each to completion, then every container."""
    pod = daemonset["spec"]["template"]
    meta = {"name": f"{daemonset['metadata']['name']}-{uuid.uuid4().hex[:5]}", "namespace": namespace}
    meta["uid"] = str(uuid.uuid4())
    running = RunningPod(meta["name"], meta["uid"])
    materialize_configmaps(pod, configmaps, node.root / "pods" / meta["uid"])
    for init in pod["spec"].get("initContainers") or []:  # in order, each to completion, as the kubelet does
        podman_name = f"{meta['name']}-init-{init['name']}"
        argv = podman_args(pod, init, node, meta, podman_name)
        argv = ["run", "--rm", *argv[argv.index("-d") + 1 :]]  # foreground: wait for it
        proc = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"init container {init['name']} failed (rc {proc.returncode}): {proc.stderr}")
    for ctr in pod["spec"]["containers"]:
        podman_name = f"{meta['name']}-{ctr['name']}"
        argv = podman_args(pod, ctr, node, meta, podman_name)
        running.containers[ctr["name"]] = podman_name
        running.specs[ctr["name"]] = ctr
        proc = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=120, check=False)
        if proc.returncode != 0:
            running.remove()
            raise RuntimeError(f"podman run {podman_name} failed: {proc.stderr}")
    return running


def write_service_account(directory: Path, ca_pem: bytes, namespace: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "token").write_text("test-token")  # projected tokens end without a newline
    (directory / "ca.crt").write_bytes(ca_pem)
    (directory / "namespace").write_text(namespace)
    for p in directory.iterdir():
        os.chmod(p, 0o644)
    return directory


def _mount_points() -> list[str]:
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        points.append(point)
    return points


def is_mount(path: Path) -> bool:
    return str(path) in _mount_points()


def unmount_under(root: Path) -> None:
    """Lazily unmount everything at or below ``root``, deepest first (what a node's reboot would drop)."""
    for point in sorted((p for p in _mount_points() if Path(p).is_relative_to(root)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, timeout=30, check=False)

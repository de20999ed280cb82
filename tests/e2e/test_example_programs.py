"""The example folders whose Pod runs a program do what their README promises.

Each example's claim is created from its template, allocated and prepared through the real node
process and daemon (``--client-library`` pointing at the built libascendcl.so). The Pod's ConfigMap
volumes are projected into the container's root file system as the kubelet would (each key of
``binaryData`` a file at the mount path), and the Pod's own command runs in podman with only the
claim's CDI device. The rootfs is the busybox one plus the host's Python (a stand-in for
``python:3.11-slim``, which has nothing of FlexNPU in it either). Its output must be the README's
"Expected output" block: for ``model-inference`` the model's real outputs, which the emulated
aclserver computes from the input.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Callable
from typing import Any

import pytest

from flexnpu_testing import clibrary
from flexnpu_testing.podman import Podman
from flexnpu_testing.waiting import wait_for
from tests.e2e.conftest import podman_unavailable
from tests.integration.conftest import REPO, Node
from tests.integration.test_examples import Example

pytestmark = [pytest.mark.podman, pytest.mark.root]


def _expected_output(folder: str) -> list[str]:
    readme = (REPO / "manifests" / "examples" / folder / "README.md").read_text()
    section = readme.split("## Expected output", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).strip().splitlines()


def _project_configmaps(ex: Example, pod: dict[str, Any], podman: Podman) -> None:
    """The kubelet's projection of each ConfigMap volume of the Pod's container into the rootfs."""
    (ctr,) = pod["spec"]["containers"]
    configmaps = {d["metadata"]["name"]: d for d in ex.docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for mount in ctr.get("volumeMounts", []):
        cm = configmaps[volumes[mount["name"]]["configMap"]["name"]]
        target = podman.rootfs / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        for key, data in cm.get("binaryData", {}).items():
            (target / key).write_bytes(base64.b64decode(data))


@pytest.mark.parametrize("folder", ["unmodified-acl-app", "model-inference"])
def test_example_program(folder: str, node_factory: Callable[..., Node], podman: Podman) -> None:
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    node = node_factory(daemon=True, FLEXNPU_CLIENT_LIBRARY=str(clibrary.build_library())).start()
    wait_for(node.devices, what="published devices")
    ex = Example(node, folder)
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    ex.allocate(claim.name)
    result = ex.prepare(claim.name)
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]

    python = clibrary.install_python(podman.rootfs)
    (podman.rootfs / "usr" / "bin" / "python3").symlink_to(python.rsplit("/", 1)[1])
    (pod,) = [d for d in ex.docs if d["kind"] == "Pod"]
    _project_configmaps(ex, pod, podman)
    (ctr,) = pod["spec"]["containers"]
    command = shlex.join([*ctr["command"], *ctr["args"]])
    res = podman.run(cdi_ids=cdi_ids, cdi_spec_dir=node.dirs["cdi"], command=command, timeout=60)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert res.stdout.strip().splitlines() == _expected_output(folder)

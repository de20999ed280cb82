"""manifests/examples/model-inference does what its README promises.

The example's claim is created from its template, allocated and prepared through the real node
process and daemon (``--client-library`` pointing at the built libascendcl.so). The Pod's
ConfigMap volume is projected into the container's root file system as the kubelet would (the
model's bytes from ``binaryData`` at the mount path), and the Pod's own command runs in podman with
only the claim's CDI device: a stand-in for ``python:3.11-slim`` (busybox plus the host's Python,
nothing of FlexNPU). Its output must be the README's "Expected output" block, which holds the
model's real outputs: the emulated aclserver computes them from the input.
"""

from __future__ import annotations

import base64
import re
import shlex
from collections.abc import Callable

import pytest

from flexnpu_testing import clibrary
from flexnpu_testing.podman import Podman
from flexnpu_testing.waiting import wait_for
from tests.e2e.conftest import podman_unavailable
from tests.integration.conftest import REPO, Node
from tests.integration.test_examples import Example

pytestmark = [pytest.mark.podman, pytest.mark.root]

FOLDER = REPO / "manifests" / "examples" / "model-inference"


def _expected_output() -> list[str]:
    readme = (FOLDER / "README.md").read_text()
    section = readme.split("## Expected output", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).strip().splitlines()


def test_model_inference_example(node_factory: Callable[..., Node], podman: Podman) -> None:
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    node = node_factory(daemon=True, FLEXNPU_CLIENT_LIBRARY=str(clibrary.build_library())).start()
    wait_for(node.devices, what="published devices")
    ex = Example(node, "model-inference")
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    ex.allocate(claim.name)
    result = ex.prepare(claim.name)
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]

    python = clibrary.install_python(podman.rootfs)
    (podman.rootfs / "usr" / "bin" / "python3").symlink_to(python.rsplit("/", 1)[1])
    (pod,) = [d for d in ex.docs if d["kind"] == "Pod"]
    (ctr,) = pod["spec"]["containers"]
    configmaps = {d["metadata"]["name"]: d for d in ex.docs if d["kind"] == "ConfigMap"}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    for mount in ctr["volumeMounts"]:  # the kubelet's projection of each ConfigMap volume
        cm = configmaps[volumes[mount["name"]]["configMap"]["name"]]
        target = podman.rootfs / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        for key, data in cm.get("binaryData", {}).items():
            (target / key).write_bytes(base64.b64decode(data))
    command = shlex.join([*ctr["command"], *ctr["args"]])
    res = podman.run(cdi_ids=cdi_ids, cdi_spec_dir=node.dirs["cdi"], command=command, timeout=60)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert res.stdout.strip().splitlines() == _expected_output()

"""manifests/examples/unmodified-acl-app does what its README promises.

The example's claim is created from its template, allocated and prepared through the real node
process (``--client-library`` pointing at the built shim). Then the Pod's own command runs in
podman with only the claim's CDI device. The rootfs is the busybox one plus the host's Python
(a stand-in for ``python:3.11-slim``, which has no FlexNPU in it either). Its output must be the
README's "Expected output" block.
"""

from __future__ import annotations

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

FOLDER = REPO / "manifests" / "examples" / "unmodified-acl-app"


def _expected_output() -> list[str]:
    readme = (FOLDER / "README.md").read_text()
    section = readme.split("## Expected output", 1)[1]
    block = re.search(r"```\n(.*?)```", section, re.S)
    assert block is not None
    return block.group(1).strip().splitlines()


def test_unmodified_acl_app_example(node_factory: Callable[..., Node], podman: Podman) -> None:
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    node = node_factory(daemon=True, FLEXNPU_CLIENT_LIBRARY=str(clibrary.build_library())).start()
    wait_for(node.devices, what="published devices")
    ex = Example(node, "unmodified-acl-app")
    (claim,) = ex.pod_claims().values()
    ex.create(claim)
    ex.allocate(claim.name)
    result = ex.prepare(claim.name)
    cdi_ids = [i for d in result.devices for i in d.cdi_device_ids]

    python = clibrary.install_python(podman.rootfs)
    (podman.rootfs / "usr" / "bin" / "python3").symlink_to(python.rsplit("/", 1)[1])
    (pod,) = [d for d in ex.docs if d["kind"] == "Pod"]
    (ctr,) = pod["spec"]["containers"]
    command = shlex.join([*ctr["command"], *ctr["args"]])
    res = podman.run(cdi_ids=cdi_ids, cdi_spec_dir=node.dirs["cdi"], command=command, timeout=60)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    assert res.stdout.strip().splitlines() == _expected_output()

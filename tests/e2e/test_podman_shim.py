"""Unmodified ACL programs use a soft share through the injected libascendcl.so (issue 11 item 2).

The node process and daemon prepare a 256 MiB share claim with ``--client-library`` pointing at
the built shim; the share's CDI spec mounts it and an ``/etc/ld.so.preload`` naming it
(``dra_driver/interposition.py``). The container image (a busybox rootfs plus the host's
dynamic loader and libc) holds:

* ``/app/unmodified_app``: a C program built with CANN-style declarations and ``-lascendcl``
  against a stub library, with no FlexNPU header or library path;
* that stub at the CANN path ``/usr/local/Ascend/ascend-toolkit/latest/lib64/libascendcl.so``
  (an image that ships CANN);
* ``/app/acl_ctypes.py`` and a Python interpreter: ``ctypes.CDLL("libascendcl.so")``.

The test adds no environment variable or mount: the container gets only the claim's CDI device.
The same image run without the device gets the stub (or no library at all), so the shim comes
from CDI alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from dra_driver import interposition
from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing import clibrary
from flexnpu_testing.podman import Podman
from flexnpu_testing.waiting import wait_for
from tests.e2e.conftest import podman_unavailable
from tests.e2e.test_podman_share import sections
from tests.integration.conftest import NAMESPACE, NODE, Node

REPO = Path(__file__).resolve().parents[2]
C_DIR = REPO / "tests" / "c"
MIB = 1 << 20
MEMORY = 256 * MIB
CANN_LIB_DIR = "/usr/local/Ascend/ascend-toolkit/latest/lib64"


@dataclass
class ShimShare:
    node: Node
    ref: ClaimRef
    cdi_ids: list[str]
    spec: dict[str, object]


def _prepare(
    node: Node, name: str, config: list[dict[str, object]] | None = None, count: int = 1
) -> ShimShare:
    request = {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu.flexnpu.io",
            "count": count,
            "capacity": {"requests": {"memory": "256Mi", "compute": "30"}},
        },
    }
    uid = node.create_claim(name, [request], config)
    node.scheduler.allocate(NAMESPACE, name, NODE)
    ref = ClaimRef(NAMESPACE, uid, name)
    assert node.kubelet is not None
    result = node.kubelet.prepare([ref])[uid]
    assert result.error == "", result.error
    (spec_file,) = [p for p in node.cdi_specs() if uid in p.name]
    return ShimShare(
        node, ref, [i for d in result.devices for i in d.cdi_device_ids], json.loads(spec_file.read_text())
    )


@pytest.fixture
def shim_node(node_factory: Callable[..., Node]) -> Node:
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    library = clibrary.build_library()
    node = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_CLIENT_LIBRARY=str(library)).start()
    wait_for(node.devices, what="published devices")
    return node


def _image(podman: Podman, tmp_path: Path) -> str:
    """Turn the podman instance's busybox rootfs into an ACL application image; returns the python path."""
    stub = clibrary.compile_program(
        C_DIR / "stub_ascendcl.c",
        include_acl_headers=False,
        extra_flags=["-shared", "-fPIC", "-Wl,-soname,libascendcl.so"],
        out_dir=tmp_path / "stub",
    )
    stub_lib = stub.with_name("libascendcl.so")
    stub.rename(stub_lib)
    app = clibrary.compile_program(
        C_DIR / "unmodified_app.c",
        include_acl_headers=False,
        link_library=stub_lib,
        rpath=False,
        out_dir=tmp_path,
    )
    root = podman.rootfs
    clibrary.install_elf(root, app, "/app/unmodified_app")
    clibrary.install_elf(root, stub_lib, f"{CANN_LIB_DIR}/libascendcl.so")
    (root / "app" / "acl_ctypes.py").write_text((C_DIR / "acl_ctypes.py").read_text())
    return clibrary.install_python(root)


def _script(python: str) -> str:
    return "\n".join(
        [
            f'echo "@@plain"; /app/unmodified_app {MEMORY} 1; echo "rc=$?"',
            f'echo "@@cann-path"; LD_LIBRARY_PATH={CANN_LIB_DIR} /app/unmodified_app {MEMORY} 1; echo "rc=$?"',
            f'echo "@@ctypes"; {python} -S -I /app/acl_ctypes.py {MEMORY} 1; echo "rc=$?"',
            'echo "@@env"; env | grep -c ^LD_ ; echo "FLEXNPU_INTERPOSITION=$FLEXNPU_INTERPOSITION"',
        ]
    )


def _values(text: str) -> dict[str, str]:
    return {
        k: v for k, _, v in (line[4:].partition(" ") for line in text.splitlines() if line.startswith("val "))
    }


@pytest.mark.podman
@pytest.mark.root
def test_unmodified_programs_use_the_share_through_the_injected_shim(
    shim_node: Node, podman: Podman, tmp_path: Path
) -> None:
    share = _prepare(shim_node, "shim-auto")
    mounts = {m["containerPath"]: m["hostPath"] for m in share.spec["containerEdits"]["mounts"]}  # type: ignore[index]
    assert mounts[interposition.CONTAINER_LIBRARY] == str(clibrary.library_path())
    assert mounts[interposition.CONTAINER_PRELOAD] == str(clibrary.library_path().with_name("ld.so.preload"))
    python = _image(podman, tmp_path)

    res = podman.run(
        cdi_ids=share.cdi_ids, cdi_spec_dir=shim_node.dirs["cdi"], command=_script(python), timeout=60
    )
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}\n{res.stderr}"
    seen = sections(res.stdout)
    for case in ("plain", "cann-path"):
        out = seen[case]
        assert out.endswith("rc=0"), f"{case}:\n{out}\n{res.stderr}"
        v = _values(out)
        assert v["provider"] == interposition.CONTAINER_LIBRARY, v
        assert v["device_count"] == "1" and int(v["total"]) == MEMORY
        assert v["over_quota_code"] == "207001" and "exceeds the memory quota" in v["over_quota_msg"], v
    ctypes_out = seen["ctypes"]
    assert ctypes_out.endswith("rc=0"), f"{ctypes_out}\n{res.stderr}"
    v = _values(ctypes_out)
    assert int(v["total"]) == MEMORY and v["over_quota_code"] == "207001", v
    assert seen["env"].splitlines() == ["0", "FLEXNPU_INTERPOSITION=preload"]  # no LD_* variable was added

    # The same image without the claim's device: no shim (the stub, or no library at all).
    bare = podman.run(cdi_ids=[], cdi_spec_dir=shim_node.dirs["cdi"], command=_script(python), timeout=60)
    seen = sections(bare.stdout)
    assert "rc=127" in seen["plain"], seen["plain"]  # libascendcl.so not found by the loader
    assert _values(seen["cann-path"])["provider"] == f"{CANN_LIB_DIR}/libascendcl.so"
    assert "FAIL aclInit stub CANN library" in seen["cann-path"]
    assert "OSError" in bare.stderr and "libascendcl.so" in bare.stderr


@pytest.mark.podman
@pytest.mark.root
def test_device_count_is_the_claims_vnpus(shim_node: Node, podman: Podman, tmp_path: Path) -> None:
    share = _prepare(shim_node, "shim-pair", count=2)
    _image(podman, tmp_path)
    res = podman.run(
        cdi_ids=share.cdi_ids,
        cdi_spec_dir=shim_node.dirs["cdi"],
        command=f"/app/unmodified_app {MEMORY} 2",
        timeout=60,
    )
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    v = _values(res.stdout)
    assert v["device_count"] == "2" and int(v["total"]) == MEMORY, v


@pytest.mark.podman
@pytest.mark.root
def test_c_scenarios_in_the_container(shim_node: Node, podman: Podman, tmp_path: Path) -> None:
    """tests/c/acl_check.c in the container through the injected shim (its RUNPATH names a host
    directory the container does not have): quota, copies both ways with content checked,
    streams, events and kernels, bad arguments, fork."""
    share = _prepare(shim_node, "shim-scenarios")
    _image(podman, tmp_path)
    check = clibrary.compile_program(C_DIR / "acl_check.c", link_library=clibrary.build_library())
    clibrary.install_elf(podman.rootfs, check, "/app/acl_check")
    runs = [f"quota {MEMORY} 1", f"memcpy {16 * MIB}", "streams 20000", "badargs", "fork", "threads 4"]
    script = "\n".join(f'echo "@@{r.split()[0]}"; /app/acl_check {r}; echo "rc=$?"' for r in runs)
    res = podman.run(cdi_ids=share.cdi_ids, cdi_spec_dir=shim_node.dirs["cdi"], command=script, timeout=120)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    seen = sections(res.stdout)
    for r in runs:
        out = seen[r.split()[0]]
        assert out.endswith("rc=0") and "FAIL" not in out, f"{r}:\n{out}"
    assert _values(seen["quota"])["over_quota_code"] == "207001"


def test_interposition_none_leaves_the_container_alone(shim_node: Node) -> None:
    params = {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", "interposition": "none"}
    share = _prepare(shim_node, "shim-none", [{"opaque": {"driver": "npu.flexnpu.io", "parameters": params}}])
    paths = [m["containerPath"] for m in share.spec["containerEdits"]["mounts"]]  # type: ignore[index]
    assert interposition.CONTAINER_PRELOAD not in paths and interposition.CONTAINER_LIBRARY not in paths
    assert "/etc/flexnpu/client.conf" in paths


@pytest.mark.podman
@pytest.mark.root
def test_two_processes_at_once_share_the_quota(shim_node: Node, podman: Podman, tmp_path: Path) -> None:
    """Needs the multi-session aclserver: while one process of the container holds 192 MiB of the
    256 MiB claim, another one's 128 MiB allocation is refused with 207001 and sees 64 MiB free."""
    share = _prepare(shim_node, "shim-two")
    _image(podman, tmp_path)
    check = clibrary.compile_program(C_DIR / "acl_check.c", link_library=clibrary.build_library())
    clibrary.install_elf(podman.rootfs, check, "/app/acl_check")
    script = "\n".join(
        [
            "mkfifo /tmp/f",
            f"/app/acl_check hold {192 * MIB} < /tmp/f > /tmp/a 2>&1 &",
            "exec 3>/tmp/f",
            "i=0; until grep -q '^held' /tmp/a || [ $i -gt 5000 ]; do i=$((i+1)); usleep 2000; done",
            f"/app/acl_check hold {128 * MIB} < /dev/null > /tmp/b 2>&1",
            "exec 3>&-",
            "wait",
            'echo "@@a"; cat /tmp/a; echo "@@b"; cat /tmp/b',
        ]
    )
    res = podman.run(cdi_ids=share.cdi_ids, cdi_spec_dir=shim_node.dirs["cdi"], command=script, timeout=60)
    seen = sections(res.stdout)
    first, second = _values(seen["a"]), _values(seen["b"])
    assert first.get("hold_code") == "0", seen["a"]
    assert second.get("hold_code") == "207001", seen["b"]
    assert int(second["hold_free"]) == MEMORY - 192 * MIB and int(second["hold_total"]) == MEMORY, second
    assert "failures 0" in seen["a"], seen["a"]

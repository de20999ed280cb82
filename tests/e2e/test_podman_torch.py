"""An unmodified PyTorch program runs on a share in podman (issue 24, "Done when").

The node process and daemon prepare a 512 MiB share with the built client library and its closure
(``dra_driver/interposition.py``); the container gets only the claim's CDI device. Its rootfs is busybox
plus the system Python; the test venv (``scripts/torch-venv.sh``: torch 2.13.0's CPU build, torch-npu
2.13.0) and the system stdlib are bind-mounted read-only. ``tests/e2e/torch_program.py`` — ones, add,
matmul, a 2-layer MLP and a GPT-style block against CPU torch, ``mem_get_info``, a tensor beyond the
share — runs four times in one container: in an image without CANN and with a stand-in CANN directory
(every library torch_npu loads, each failing loudly when called) on ``LD_LIBRARY_PATH``, each with
the default allocator and with ``PYTORCH_NPU_ALLOC_CONF=expandable_segments:True``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
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
MIB = 1 << 20
MEMORY = 512 * MIB
CANN_LIB_DIR = "/usr/local/Ascend/ascend-toolkit/latest/lib64"
STANDINS = (
    "libopapi.so",
    "libnnopbase.so",
    "libhccl.so",
    "libacl_op_compiler.so",
    "libruntime.so",
    "libprofapi.so",
    "libge_runner.so",
    "libgraph.so",
    "libacl_tdt_channel.so",
)
"""CANN's libraries torch_npu links or dlopens, besides libascendcl.so (tests/c/stub_ascendcl.c)."""
MAX_ABS_ERR = 1e-4
RUNS = {
    "plain": "",
    "plain-expandable": "PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
    "cann": f"LD_LIBRARY_PATH={CANN_LIB_DIR}",
    "cann-expandable": f"LD_LIBRARY_PATH={CANN_LIB_DIR} PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
}


@pytest.fixture(scope="module")
def torch_venv() -> Path:
    """The cached test venv (made by scripts/test.sh; made here too when the test runs alone)."""
    res = subprocess.run(
        ["bash", str(REPO / "scripts" / "torch-venv.sh")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert res.returncode == 0, f"scripts/torch-venv.sh failed:\n{res.stderr[-4000:]}"
    return Path(res.stdout.strip().splitlines()[-1])


@pytest.fixture
def torch_node(node_factory: Callable[..., Node]) -> Node:
    reason = Podman.ensure_available()
    if reason is not None:
        podman_unavailable(reason)
    library = clibrary.build_library()
    node = node_factory(daemon=True, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_CLIENT_LIBRARY=str(library)).start()
    wait_for(node.devices, what="published devices")
    return node


def _prepare(node: Node, name: str) -> tuple[list[str], dict[str, object]]:
    request = {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu.flexnpu.io",
            "count": 1,
            "capacity": {"requests": {"memory": f"{MEMORY // MIB}Mi", "compute": "50"}},
        },
    }
    uid = node.create_claim(name, [request], None)
    node.scheduler.allocate(NAMESPACE, name, NODE)
    assert node.kubelet is not None
    result = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid]
    assert result.error == "", result.error
    (spec_file,) = [p for p in node.cdi_specs() if uid in p.name]
    return [i for d in result.devices for i in d.cdi_device_ids], json.loads(spec_file.read_text())


def _system_libraries(venv: Path) -> set[Path]:
    """The host libraries (outside the venv) that Python's extension modules, torch, torch_npu and numpy
    load; libraries CANN would provide resolve to nothing here and come from the share."""
    stdlib = Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")
    site = next(venv.glob("lib/python3*/site-packages"))
    objects = [*stdlib.glob("lib-dynload/*.so")]
    for pkg in ("torch", "torch_npu", "numpy", "numpy.libs", "yaml", "_yaml"):
        objects += (site / pkg).rglob("*.so*") if (site / pkg).is_dir() else []
    found: set[Path] = set()
    for obj in objects:
        for lib in clibrary.shared_libraries(obj):
            if not lib.resolve().is_relative_to(venv):
                found.add(lib)
    return found


def _image(podman: Podman, venv: Path, tmp_path: Path) -> None:
    """busybox + the system Python and the host libraries torch needs + the program + a stand-in CANN."""
    root = podman.rootfs
    python = Path("/usr/bin/python3").resolve()
    clibrary.install_elf(root, python, "/usr/bin/python3")
    for lib in _system_libraries(venv):
        target = root / str(lib).lstrip("/")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(lib.read_bytes())
    (root / "app").mkdir(exist_ok=True)
    (root / "app" / "torch_program.py").write_text((REPO / "tests" / "e2e" / "torch_program.py").read_text())
    (root / "tmp").mkdir(exist_ok=True)
    cann = root / CANN_LIB_DIR.lstrip("/")
    cann.mkdir(parents=True, exist_ok=True)
    stub = clibrary.compile_program(
        REPO / "tests" / "c" / "stub_ascendcl.c",
        include_acl_headers=False,
        extra_flags=["-shared", "-fPIC", "-Wl,-soname,libascendcl.so"],
        out_dir=tmp_path / "stub",
    )
    (cann / "libascendcl.so").write_bytes(stub.read_bytes())
    for name in STANDINS:
        lib = clibrary.compile_program(
            REPO / "tests" / "c" / "stub_cann_library.c",
            include_acl_headers=False,
            extra_flags=["-shared", "-fPIC", f"-Wl,-soname,{name}", f'-DSTANDIN="{name}"'],
            out_dir=tmp_path / name.removesuffix(".so"),
        )
        (cann / name).write_bytes(lib.read_bytes())


def _script(venv: Path) -> str:
    lines = []
    for name, env in RUNS.items():
        lines.append(
            f'echo "@@{name}"; env HOME=/tmp {env} {venv}/bin/python /app/torch_program.py 2>&1; echo "rc=$?"'
        )
    return "\n".join(lines)


@pytest.mark.podman
@pytest.mark.root
def test_an_unmodified_pytorch_program_runs_on_a_share(
    torch_node: Node, podman: Podman, torch_venv: Path, tmp_path: Path
) -> None:
    cdi_ids, spec = _prepare(torch_node, "torch")
    mounts = {m["containerPath"] for m in spec["containerEdits"]["mounts"]}  # type: ignore[index]
    assert {f"/usr/lib/flexnpu/{n}" for n in interposition.CLOSURE_LIBRARIES} <= mounts
    _image(podman, torch_venv, tmp_path)
    stdlib = f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    res = podman.run(
        cdi_ids=cdi_ids,
        cdi_spec_dir=torch_node.dirs["cdi"],
        command=_script(torch_venv),
        timeout=600,
        read_only=[str(torch_venv), stdlib],
    )
    seen = sections(res.stdout)
    for name in RUNS:
        out = seen.get(name, "")
        assert out.endswith("rc=0"), f"{name}:\n{out[-6000:]}\n{res.stderr[-2000:]}"
        assert "stand-in CANN" not in out, f"{name} reached a stand-in CANN library:\n{out[-4000:]}"
        (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        got = json.loads(line.removeprefix("RESULT "))
        assert got["available"] and got["device_count"] == 1, (name, got)
        for check in ("ones", "add", "matmul", "mlp", "gpt", "after_oom"):
            assert got[check] <= MAX_ABS_ERR, (name, check, got)
        assert got["mem_total"] == MEMORY and 0 < got["mem_free"] <= MEMORY, (name, got)
        assert got["oom"].startswith("OutOfMemoryError: NPU out of memory"), (name, got["oom"])

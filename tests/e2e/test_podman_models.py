"""An unmodified inference program runs on a share in podman, given only the claim's CDI device.

``tests/c/samples/model_inference.cpp`` (the classification sample's shape: sizes, load,
description, datasets, N executions with outputs checked, unload) is installed in a busybox
image with FlexNPU's emulated-format models; the real node process and daemon prepare the
claims and the container gets nothing but the claim's CDI device (the injected libascendcl.so
reaches the aclserver through the claim's shm dir). It is held to the share's memory (a model
larger than the share fails at load with 207001) and, as two fixed 30/70 tenants on one die,
to its compute quota: the die time the aclservers granted them (their own accounting, read from
the host) splits 30/70 within 3 points.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dra_kubeletplugin.claims import ClaimRef
from flexnpu_testing import clibrary
from flexnpu_testing.podman import Podman
from flexnpu_testing.waiting import wait_for
from flexnpu_wire.ops import Op
from tests.c import sample_models
from tests.e2e.test_podman_share import sections
from tests.e2e.test_podman_shim import shim_node  # noqa: F401 - the fixture: node, daemon, client library
from tests.integration.conftest import NAMESPACE, NODE, Node
from tests.integration.test_node_soft_split import _host_session

pytestmark = [pytest.mark.podman, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20
DRIVER = "npu.flexnpu.io"


@pytest.fixture
def model_node(shim_node: Node) -> Node:  # noqa: F811 - the fixture imported above
    """The node process and daemon, publishing devices, with the built libascendcl.so as the client library."""
    return shim_node


def _prepare(
    node: Node, name: str, *, compute: int, phy: int, memory: str = "256Mi"
) -> tuple[str, list[str]]:
    request: dict[str, Any] = {
        "name": "vnpu",
        "exactly": {
            "deviceClassName": "vnpu-fixed.flexnpu.io",
            "count": 1,
            "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].phyID == {phy}'}}],
            "capacity": {"requests": {"memory": memory, "compute": str(compute)}},
        },
    }
    params = {"apiVersion": "npu.flexnpu.io/v1alpha1", "kind": "VnpuConfig", "policy": "fixed"}
    uid = node.create_claim(name, [request], [{"opaque": {"driver": DRIVER, "parameters": params}}])
    node.scheduler.allocate(NAMESPACE, name, NODE)
    assert node.kubelet is not None
    result = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid]
    assert result.error == "", result.error
    return uid, [i for d in result.devices for i in d.cdi_device_ids]


def _phy(node: Node) -> int:
    dev = next(d for d in node.devices() if d["name"].startswith("vnpu-"))
    return int(dev["attributes"]["phyID"]["int"])


def _image(podman: Podman, tmp_path: Path) -> None:
    """The sample at /app/model_inference (its libascendcl comes only from the claim's CDI device)
    and the models it runs at /app/*.fnm."""
    exe = clibrary.compile_program(
        REPO / "tests" / "c" / "samples" / "model_inference.cpp", link_library=clibrary.build_library()
    )
    clibrary.install_elf(podman.rootfs, exe, "/app/model_inference")
    app = podman.rootfs / "app"
    sample_models.write(app / "classifier.fnm", sample_models.classifier())
    sample_models.write(app / "too-big.fnm", sample_models.classifier(work_bytes=256 * MIB))
    sample_models.write(app / "tenant.fnm", sample_models.classifier(cost_us=20_000))


def _values(text: str) -> dict[str, str]:
    return {
        k: v for k, _, v in (line[4:].partition(" ") for line in text.splitlines() if line.startswith("val "))
    }


def test_the_inference_sample_runs_in_a_container_held_to_the_share(
    model_node: Node, podman: Podman, tmp_path: Path
) -> None:
    _uid, cdi_ids = _prepare(model_node, "infer", compute=30, phy=_phy(model_node))
    _image(podman, tmp_path)
    runs = {
        "withmem": "infer /app/classifier.fnm 5 withmem sync",
        "file-async": "infer /app/classifier.fnm 5 file async",
        "config": "infer /app/classifier.fnm 2 config sync",
        "too-big": "load /app/too-big.fnm",
    }
    script = "\n".join(f'echo "@@{k}"; /app/model_inference {v}; echo "rc=$?"' for k, v in runs.items())
    res = podman.run(cdi_ids=cdi_ids, cdi_spec_dir=model_node.dirs["cdi"], command=script, timeout=120)
    assert res.returncode == 0, f"{res.stdout}\n{res.stderr}"
    seen = sections(res.stdout)
    model = sample_models.classifier()
    for name in ("withmem", "file-async", "config"):
        out = seen[name]
        assert out.endswith("rc=0") and "[INFO] 0 failed" in out, f"{name}:\n{out}"
        v = _values(out)
        n = 2 if name == "config" else 5
        assert v["executions"] == str(n) and int(v["checked"]) == n * model.inputs[0].elements(), v
        assert float(v["out1_sum"]) == pytest.approx(sample_models.expected_out1_sum(model, n - 1), rel=1e-6)
    big = _values(seen["too-big"])
    assert big["load_code"] == "207001" and "exceeds the memory quota" in big["load_msg"], seen["too-big"]


def test_two_fixed_tenants_in_containers_get_30_and_70_percent(
    model_node: Node, podman: Podman, tmp_path: Path
) -> None:
    phy = _phy(model_node)
    claims = [_prepare(model_node, f"tenant-{q}", compute=q, phy=phy) for q in (30, 70)]
    _image(podman, tmp_path)
    results: dict[int, Any] = {}

    def tenant(i: int, cdi_ids: list[str]) -> None:
        results[i] = podman.run(
            cdi_ids=cdi_ids, cdi_spec_dir=model_node.dirs["cdi"],
            command="/app/model_inference tenant /app/tenant.fnm 9", timeout=120,
        )  # fmt: skip

    threads = [threading.Thread(target=tenant, args=(i, ids)) for i, (_uid, ids) in enumerate(claims)]
    for t in threads:
        t.start()
    try:
        sessions = [_host_session(model_node, uid) for uid, _ids in claims]
        try:
            for s in sessions:
                s.init()
            used = [lambda s=s: s.call(Op.GET_USAGE, 0)[2] for s in sessions]  # type: ignore[misc]
            wait_for(lambda: all(u() > 0 for u in used), what="both tenants executing", timeout=60)
            window = threading.Event()
            window.wait(1.0)  # warm-up, then the measurement window: neither synchronises anything
            start, t0 = [u() for u in used], time.monotonic()
            window.wait(4.0)
            end, t1 = [u() for u in used], time.monotonic()
        finally:
            for s in sessions:
                s.close()
    finally:
        for t in threads:
            t.join(180)
    for i, res in results.items():
        assert res.returncode == 0 and "[INFO] 0 failed" in res.stdout, (
            f"tenant {i}: {res.stdout}\n{res.stderr}"
        )
    used_us = [e - s for s, e in zip(start, end, strict=True)]
    split = [u / sum(used_us) for u in used_us]
    assert abs(split[0] - 0.30) <= 0.03 and abs(split[1] - 0.70) <= 0.03, split
    of_window = [u / 1e6 / (t1 - t0) for u in used_us]
    assert of_window[0] >= 0.20 and of_window[1] >= 0.60 and sum(of_window) <= 1.01, of_window

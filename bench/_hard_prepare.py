"""The node-level half of ``bench/bench_hard.py``: hard vNPU prepare/unprepare against whole-die.

A fake API server, the real node process in mode ``all`` (eight emulated 910B4 dies, the
emulated vNPU backend) and the kubelet simulator over the DRA gRPC socket; the scheduler
stand-in allocates before the clock starts. Each round prepares and unprepares one whole-die
claim and one ``vir10_3c_16g`` claim, alternating which goes first, so both see the same load.
"""

from __future__ import annotations

import contextlib
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import _node
from _node import cluster, ms, pct

from dra_kubeletplugin.claims import ClaimRef
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, Node

HARD_CEL = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].mode == "hard"'
WHOLE = {"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}
HARD = {
    "name": "vnpu",
    "exactly": {
        "deviceClassName": "vnpu-template.flexnpu.io",
        "selectors": [{"cel": {"expression": f'device.attributes["{DRIVER}"].template == "vir10_3c_16g"'}}],
    },
}


def cycle(node: Node, request: dict[str, Any], seq: int) -> tuple[float, float]:
    name = f"b{seq}"
    uid = node.create_claim(name, [request])
    node.scheduler.allocate(
        NAMESPACE, name, NODE, reserved_for=[{"resource": "pods", "name": name, "uid": str(uuid.uuid4())}]
    )
    ref = ClaimRef(NAMESPACE, uid, name)
    kubelet = node.kubelet
    assert kubelet is not None
    t0 = time.perf_counter()
    res = kubelet.prepare([ref])[ref.uid]
    prep = time.perf_counter() - t0
    if res.error:
        raise SystemExit(f"prepare failed: {res.error}")
    t0 = time.perf_counter()
    out = kubelet.unprepare([ref])
    unprep = time.perf_counter() - t0
    if out != {ref.uid: ""}:
        raise SystemExit(f"unprepare failed: {out}")
    node.scheduler.deallocate(NAMESPACE, name)
    node.resource.delete_namespaced_resource_claim(name, NAMESPACE)
    return prep, unprep


def run(n: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="bh", dir="/tmp"))
    times: dict[str, tuple[list[float], list[float]]] = {"whole": ([], []), "hard": ([], [])}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, root, True)
        node = stack.enter_context(
            cluster(
                root,
                classes=(*_node.CLASSES, ("vnpu-template.flexnpu.io", HARD_CEL)),
                with_daemon=False,
                FLEXNPU_DEFAULT_MODE="all",
                FLEXNPU_LOG_LEVEL="INFO",
            )
        )
        cycle(node, WHOLE, 0)  # warm-up, not measured
        cycle(node, HARD, 1)
        for i in range(n):
            order = (("whole", WHOLE), ("hard", HARD)) if i % 2 == 0 else (("hard", HARD), ("whole", WHOLE))
            for kind, request in order:
                p, u = cycle(node, request, 10 + 2 * i + (kind == "hard"))
                times[kind][0].append(p)
                times[kind][1].append(u)
    print(f"prepare/unprepare through the kubelet simulator, {n} rounds each, interleaved")
    for kind, (prep, unprep) in times.items():
        print(
            f"  {kind:<5} prepare p50 {ms(statistics.median(prep))} p99 {ms(pct(prep, 0.99))}"
            f"   unprepare p50 {ms(statistics.median(unprep))} p99 {ms(pct(unprep, 0.99))}"
        )
    for i, what in enumerate(("prepare", "unprepare")):
        ratio = statistics.median(times["hard"][i]) / statistics.median(times["whole"][i])
        print(f"  hard / whole, {what:<9} p50: {ratio:4.2f}x (goal <= 1.5x)")

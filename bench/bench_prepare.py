"""Benchmark: NodePrepareResources / NodeUnprepareResources end to end, through the real processes.

Same building blocks as the integration tests: a fake Kubernetes API server, the real
flexnpu-daemon (eight emulated 910B4 dies), the real node process (``both`` mode) and the
kubelet simulator over the DRA gRPC socket; the scheduler simulator allocates. Measured, each
from the kubelet's gRPC call to its reply (allocation is done before the clock starts):

* prepare of one soft-split share claim (256 MiB, 10 %): GET claim, checkpoint, daemon
  Register (which starts the claim's aclserver and waits until it serves), client.conf, CDI
  spec, claim status. Targets: p50 <= 200 ms, p99 <= 500 ms.
* unprepare of that claim (daemon Unregister stops the aclserver). Target: p50 <= 100 ms.
* baseline: prepare / unprepare of a whole-die claim (no daemon, no aclserver), to show what
  the aclserver costs.
* 32 share claims prepared back to back (one kubelet call each, as the kubelet does for 32
  pods), and the same 32 in one batched call: total time.

Everything it creates (processes, sockets, links, temp dirs) is removed at the end.

    .venv/bin/python bench/bench_prepare.py [-n 40] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _node import cluster, ms, pct  # noqa: E402

from dra_kubeletplugin.claims import ClaimRef  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    NAMESPACE,
    NODE,
    Node,
    wait_for,
)

SHARE = {
    "name": "vnpu",
    "exactly": {
        "deviceClassName": "vnpu.flexnpu.io",
        "capacity": {"requests": {"memory": "256Mi", "compute": "10"}},
    },
}
SMALL_SHARE = {
    "name": "vnpu",
    "exactly": {
        "deviceClassName": "vnpu.flexnpu.io",
        "capacity": {"requests": {"memory": "128Mi", "compute": "1"}},
    },
}
WHOLE = {"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}


class Claims:
    """Create/allocate/release claims around the timed kubelet calls."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.res: Any = node.resource
        self.seq = 0

    def make(self, request: dict[str, Any]) -> ClaimRef:
        self.seq += 1
        name = f"b{self.seq}"
        uid = self.node.create_claim(name, [request])
        pod = {"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}
        self.node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[pod])
        return ClaimRef(NAMESPACE, uid, name)

    def drop(self, ref: ClaimRef) -> None:
        self.node.scheduler.deallocate(NAMESPACE, ref.name)
        self.res.delete_namespaced_resource_claim(ref.name, NAMESPACE)


def prepare_cycle(
    node: Node, claims: Claims, request: dict[str, Any], n: int
) -> tuple[list[float], list[float]]:
    kubelet = node.kubelet
    assert kubelet is not None and node.daemon is not None
    prep: list[float] = []
    unprep: list[float] = []
    for _ in range(n):
        ref = claims.make(request)
        t0 = time.perf_counter()
        res = kubelet.prepare([ref])[ref.uid]
        prep.append(time.perf_counter() - t0)
        if res.error:
            raise SystemExit(f"prepare failed: {res.error}")
        t0 = time.perf_counter()
        out = kubelet.unprepare([ref])
        unprep.append(time.perf_counter() - t0)
        if out != {ref.uid: ""}:
            raise SystemExit(f"unprepare failed: {out}")
        claims.drop(ref)
        wait_for(lambda: not node.daemon.aclserver_pids(), what="aclservers gone", timeout=30)  # type: ignore[union-attr]
    return prep, unprep


def back_to_back(node: Node, claims: Claims, count: int, *, batched: bool) -> float:
    kubelet = node.kubelet
    assert kubelet is not None and node.daemon is not None
    refs = [claims.make(SMALL_SHARE) for _ in range(count)]
    t0 = time.perf_counter()
    each: list[float] = []
    if batched:
        results = kubelet.prepare(refs)
    else:
        results = {}
        for ref in refs:
            t1 = time.perf_counter()
            results.update(kubelet.prepare([ref]))
            each.append(time.perf_counter() - t1)
    total = time.perf_counter() - t0
    if each:
        quarter = max(1, count // 4)
        print(
            f"  back to back, per claim: first {quarter} p50 {ms(statistics.median(each[:quarter]))},"
            f" last {quarter} p50 {ms(statistics.median(each[-quarter:]))}"
        )
    bad = {uid: r.error for uid, r in results.items() if r.error}
    if bad or len(results) != count:
        raise SystemExit(f"back-to-back prepare failed: {bad}")
    if len(node.daemon.aclserver_pids()) != count:
        raise SystemExit(f"expected {count} aclservers, found {len(node.daemon.aclserver_pids())}")
    out = kubelet.unprepare(refs)
    if any(out.values()):
        raise SystemExit(f"unprepare failed: {out}")
    for ref in refs:
        claims.drop(ref)
    wait_for(lambda: not node.daemon.aclserver_pids(), what="aclservers gone", timeout=60)  # type: ignore[union-attr]
    return total


def summary(name: str, values: list[float]) -> dict[str, float]:
    p50, p99 = statistics.median(values), pct(values, 0.99)
    print(
        f"{name:<28} n={len(values):3d}  p50 {ms(p50)}  p99 {ms(p99)}  min {ms(min(values))}  max {ms(max(values))}"
    )
    return {"p50_ms": round(p50 * 1000, 2), "p99_ms": round(p99 * 1000, 2), "n": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=40, help="prepare/unprepare cycles per kind (default 40)")
    parser.add_argument("--batch", type=int, default=32, help="claims prepared back to back (default 32)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fxb", dir="/tmp"))
    figures: dict[str, Any] = {}
    try:
        with cluster(root, FLEXNPU_DEFAULT_MODE="both", FLEXNPU_LOG_LEVEL="INFO") as node:
            claims = Claims(node)
            prepare_cycle(node, claims, SHARE, 3)  # warm-up: imports, zygote, gRPC channels
            prepare_cycle(node, claims, WHOLE, 3)
            share_prep, share_unprep = prepare_cycle(node, claims, SHARE, args.n)
            whole_prep, whole_unprep = prepare_cycle(node, claims, WHOLE, args.n)
            print(f"prepare/unprepare through the kubelet simulator, {args.n} cycles each")
            figures["share_prepare"] = summary("share prepare (aclserver)", share_prep)
            figures["share_unprepare"] = summary("share unprepare", share_unprep)
            figures["whole_prepare"] = summary("whole-die prepare", whole_prep)
            figures["whole_unprepare"] = summary("whole-die unprepare", whole_unprep)
            cost = statistics.median(share_prep) - statistics.median(whole_prep)
            print(f"aclserver start cost (p50 share - p50 whole): {ms(cost)}")
            seq = back_to_back(node, claims, args.batch, batched=False)
            batch = back_to_back(node, claims, args.batch, batched=True)
            print(
                f"{args.batch} share claims back to back: {ms(seq)} total ({ms(seq / args.batch)} per claim);"
                f" one batched call: {ms(batch)} total"
            )
            figures["back_to_back_total_ms"] = round(seq * 1000, 1)
            figures["batched_total_ms"] = round(batch * 1000, 1)
            p50, p99 = figures["share_prepare"]["p50_ms"], figures["share_prepare"]["p99_ms"]
            un50 = figures["share_unprepare"]["p50_ms"]
            print(
                f"targets: share prepare p50 {p50} ms (<= 200) {'OK' if p50 <= 200 else 'MISSED'}, "
                f"p99 {p99} ms (<= 500) {'OK' if p99 <= 500 else 'MISSED'}; "
                f"unprepare p50 {un50} ms (<= 100) {'OK' if un50 <= 100 else 'MISSED'}"
            )
            if args.json:
                print(json.dumps(figures))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

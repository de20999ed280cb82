"""Benchmark: does a claim's prepare and unprepare cost grow with what the node already holds?

Real processes, as in the integration tests: a fake Kubernetes API server, the real
flexnpu-daemon and node process on 16 emulated 910B4 dies, the kubelet simulator over the DRA
gRPC socket. For each level N (default 1, 8, 32, 64, 128 share claims already prepared and
held), ``-k`` cycles of prepare + unprepare of one more share claim are timed from the kubelet's
call to its reply, and the node process's CPU (utime + stime from ``/proc``) is read around
them. Printed per level: prepare and unprepare p50 / p99, node and daemon CPU per cycle, the
checkpoint's size on disk, node and daemon RSS, total aclserver PSS.

Each level also times ``-k`` cycles of a whole-die claim on a 17th die (no daemon, no aclserver),
interleaved in blocks with the share cycles: the node's own path, without the daemon's cost.

The baseline (N = 1) is measured first and again after the largest level has been released,
and the ratios use the mean of the two, so drift of the machine during the run shows as a
difference between them instead of landing in the ratios. At the largest level, every held
claim is unprepared in one batched kubelet call (goal: 128 claims in <= 2 s).

Goals (issue 10): p50 at N = 128 within 1.3x of N = 1, node CPU per cycle within 1.5x, share
prepare p50 <= 50 ms and p99 <= 150 ms at N = 128. Printed, never asserted.

    .venv/bin/python bench/bench_scale.py [-k 20] [--levels 1,8,32,64,128] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _node import cluster, pct  # noqa: E402

from dra_kubeletplugin.claims import ClaimRef  # noqa: E402
from flexnpu_testing.waiting import wait_for  # noqa: E402
from tests.integration.conftest import NAMESPACE, NODE, Node  # noqa: E402

WHOLE = {"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}
SHARE = {
    "name": "vnpu",
    "exactly": {
        "deviceClassName": "vnpu.flexnpu.io",
        "capacity": {"requests": {"memory": "128Mi", "compute": "1"}},
    },
}
TICK = os.sysconf("SC_CLK_TCK")
DIES = 16


def inventory_file(root: Path) -> Path:
    path = root / "sixteen-910b4.yaml"
    chips = "\n".join(f"  - {{model: 910B4, card: {i}, numaNode: {i // 8}}}" for i in range(DIES))
    chips += f"\n  - {{model: 910B4, card: {DIES}, numaNode: 1, mode: whole}}"  # the node-only baseline
    path.write_text(f'driverVersion: "24.1.rc3"\nfirmwareVersion: "7.5.0.1.129"\nchips:\n{chips}\n')
    return path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pss_mib(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
    return total / 1024


def tree_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


class Claims:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.res: Any = node.resource
        self.seq = 0

    def make(self, request: dict[str, Any] = SHARE) -> ClaimRef:
        self.seq += 1
        name = f"s{self.seq}"
        uid = self.node.create_claim(name, [request])
        pod = {"resource": "pods", "name": f"pod-{name}", "uid": str(uuid.uuid4())}
        self.node.scheduler.allocate(NAMESPACE, name, NODE, reserved_for=[pod])
        return ClaimRef(NAMESPACE, uid, name)

    def drop(self, ref: ClaimRef) -> None:
        self.node.scheduler.deallocate(NAMESPACE, ref.name)
        self.res.delete_namespaced_resource_claim(ref.name, NAMESPACE)


@dataclass
class Level:
    n: int
    prepare: list[float]
    unprepare: list[float]
    node_cpu: float  # seconds per cycle
    daemon_cpu: float
    state_bytes: int
    node_rss: float
    daemon_rss: float
    aclserver_pss: float
    whole_prepare: list[float]
    whole_unprepare: list[float]
    whole_node_cpu: float

    def figures(self) -> dict[str, float]:
        return {
            "n": self.n,
            "prepare_p50_ms": round(statistics.median(self.prepare) * 1000, 1),
            "prepare_p99_ms": round(pct(self.prepare, 0.99) * 1000, 1),
            "unprepare_p50_ms": round(statistics.median(self.unprepare) * 1000, 1),
            "unprepare_p99_ms": round(pct(self.unprepare, 0.99) * 1000, 1),
            "node_cpu_ms_per_cycle": round(self.node_cpu * 1000, 1),
            "daemon_cpu_ms_per_cycle": round(self.daemon_cpu * 1000, 1),
            "state_kib": round(self.state_bytes / 1024, 1),
            "node_rss_mib": round(self.node_rss, 1),
            "daemon_rss_mib": round(self.daemon_rss, 1),
            "aclserver_pss_mib": round(self.aclserver_pss, 1),
            "whole_prepare_p50_ms": round(statistics.median(self.whole_prepare) * 1000, 1),
            "whole_prepare_p99_ms": round(pct(self.whole_prepare, 0.99) * 1000, 1),
            "whole_unprepare_p50_ms": round(statistics.median(self.whole_unprepare) * 1000, 1),
            "whole_node_cpu_ms_per_cycle": round(self.whole_node_cpu * 1000, 1),
        }


def cycles_of(node: Node, claims: Claims, request: dict[str, Any], n: int) -> tuple[list[float], list[float]]:
    """``n`` prepare + unprepare cycles, each of a fresh claim made and released outside the clock."""
    kubelet = node.kubelet
    assert kubelet is not None
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
    return prep, unprep


def measure(node: Node, claims: Claims, n_held: int, cycles: int) -> Level:
    """Share cycles and whole-die cycles (no daemon: the node's own path), interleaved in blocks.

    CPU includes the node's reaction to the claim's API events (made outside the clock)."""
    daemon = node.daemon
    assert daemon is not None and node.proc is not None and daemon.proc is not None
    node_pid, daemon_pid = node.proc.pid, daemon.proc.pid
    prep: list[float] = []
    unprep: list[float] = []
    wprep: list[float] = []
    wunprep: list[float] = []
    cpu = dcpu = wcpu = 0.0
    for _ in range(2):
        c0, d0 = cpu_seconds(node_pid), cpu_seconds(daemon_pid)
        p, u = cycles_of(node, claims, SHARE, max(cycles // 2, 1))
        c1, d1 = cpu_seconds(node_pid), cpu_seconds(daemon_pid)
        wp, wu = cycles_of(node, claims, WHOLE, max(cycles // 2, 1))
        c2 = cpu_seconds(node_pid)
        prep += p
        unprep += u
        wprep += wp
        wunprep += wu
        cpu += c1 - c0
        dcpu += d1 - d0
        wcpu += c2 - c1
    n = len(prep)
    level = Level(
        n=n_held,
        prepare=prep,
        unprepare=unprep,
        node_cpu=cpu / n,
        daemon_cpu=dcpu / n,
        state_bytes=tree_bytes(node.dirs["state"] / "checkpoint.json"),
        node_rss=rss_mib(node_pid),
        daemon_rss=rss_mib(daemon_pid),
        aclserver_pss=pss_mib(daemon.aclserver_pids()),
        whole_prepare=wprep,
        whole_unprepare=wunprep,
        whole_node_cpu=wcpu / len(wprep),
    )
    return level


def hold(node: Node, claims: Claims, held: list[ClaimRef], n: int) -> None:
    """Prepare claims (in kubelet batches of 16) until ``n`` are held."""
    assert node.kubelet is not None
    while len(held) < n:
        refs = [claims.make() for _ in range(min(16, n - len(held)))]
        out = node.kubelet.prepare(refs)
        bad = {u: r.error for u, r in out.items() if r.error}
        if bad:
            raise SystemExit(f"prepare of held claims failed: {bad}")
        held.extend(refs)


def release_all(node: Node, claims: Claims, held: list[ClaimRef]) -> float:
    assert node.kubelet is not None and node.daemon is not None
    t0 = time.perf_counter()
    out = node.kubelet.unprepare(held)
    took = time.perf_counter() - t0
    if any(out.values()):
        raise SystemExit(f"batched unprepare failed: {out}")
    for ref in held:
        claims.drop(ref)
    held.clear()
    wait_for(lambda: not node.daemon.aclserver_pids(), what="aclservers gone", timeout=120)  # type: ignore[union-attr]
    return took


def show(level: Level, base: Level | None) -> None:
    f = level.figures()
    line = (
        f"N={level.n:4d}  prepare p50 {f['prepare_p50_ms']:6.1f} p99 {f['prepare_p99_ms']:6.1f} ms  "
        f"unprepare p50 {f['unprepare_p50_ms']:6.1f} p99 {f['unprepare_p99_ms']:6.1f} ms  "
        f"node CPU {f['node_cpu_ms_per_cycle']:6.1f} ms/cycle  daemon CPU {f['daemon_cpu_ms_per_cycle']:5.1f}  "
        f"state {f['state_kib']:7.1f} KiB  RSS node {f['node_rss_mib']:5.1f} daemon {f['daemon_rss_mib']:5.1f} MiB  "
        f"aclserver PSS {f['aclserver_pss_mib']:7.1f} MiB\n"
        f"        whole die (node only, no daemon): prepare p50 {f['whole_prepare_p50_ms']:6.1f} "
        f"p99 {f['whole_prepare_p99_ms']:6.1f} ms  unprepare p50 {f['whole_unprepare_p50_ms']:6.1f} ms  "
        f"node CPU {f['whole_node_cpu_ms_per_cycle']:5.1f} ms/cycle"
    )
    if base is not None:
        b = base.figures()
        line += (
            f"  x{f['prepare_p50_ms'] / b['prepare_p50_ms']:.2f} prepare,"
            f" x{f['node_cpu_ms_per_cycle'] / max(b['node_cpu_ms_per_cycle'], 0.1):.2f} CPU;"
            f" whole die x{f['whole_prepare_p50_ms'] / b['whole_prepare_p50_ms']:.2f} prepare,"
            f" x{f['whole_node_cpu_ms_per_cycle'] / max(b['whole_node_cpu_ms_per_cycle'], 0.1):.2f} CPU"
        )
    print(line, flush=True)


def mean_level(a: Level, b: Level) -> Level:
    return Level(
        n=a.n,
        prepare=a.prepare + b.prepare,
        unprepare=a.unprepare + b.unprepare,
        node_cpu=(a.node_cpu + b.node_cpu) / 2,
        daemon_cpu=(a.daemon_cpu + b.daemon_cpu) / 2,
        state_bytes=a.state_bytes,
        node_rss=a.node_rss,
        daemon_rss=a.daemon_rss,
        aclserver_pss=a.aclserver_pss,
        whole_prepare=a.whole_prepare + b.whole_prepare,
        whole_unprepare=a.whole_unprepare + b.whole_unprepare,
        whole_node_cpu=(a.whole_node_cpu + b.whole_node_cpu) / 2,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", type=int, default=20, help="prepare+unprepare cycles per level (default 20)")
    parser.add_argument("--levels", default="1,8,32,64,128", help="claims held (default 1,8,32,64,128)")
    parser.add_argument("--json", action="store_true", help="also print the figures as one JSON line")
    args = parser.parse_args()
    levels = sorted({int(x) for x in args.levels.split(",")})
    root = Path(tempfile.mkdtemp(prefix="fxs", dir="/tmp"))
    out: dict[str, Any] = {"levels": []}
    try:
        inv = inventory_file(root)
        with cluster(
            root,
            inventory=str(inv),
            daemon_args=("--inventory", str(inv)),
            published_timeout=60,
            FLEXNPU_DEFAULT_MODE="soft",  # the last die is whole (inventory)
            FLEXNPU_LOG_LEVEL="WARNING",
        ) as node:
            claims = Claims(node)
            held: list[ClaimRef] = []
            measure(node, claims, 0, 3)  # warm-up: imports, zygote, gRPC channels
            print(
                f"{args.k} prepare+unprepare cycles of one 128 MiB / 1 % share per level, {DIES} emulated dies"
            )
            hold(node, claims, held, levels[0])
            before = measure(node, claims, levels[0], args.k)
            show(before, None)
            results = [before]
            for n in levels[1:]:
                hold(node, claims, held, n)
                level = measure(node, claims, n, args.k)
                results.append(level)
                show(level, before)
            top = len(held)
            batched = release_all(node, claims, held)
            print(
                f"batched unprepare of {top} claims in one kubelet call: {batched * 1000:.0f} ms (goal <= 2000 ms)"
            )
            hold(node, claims, held, levels[0])
            after = measure(node, claims, levels[0], args.k)
            print("baseline again after the ramp (drift check):")
            show(after, before)
            base = mean_level(before, after)
            print("ratios against the mean of the two baselines:")
            for level in results[1:]:
                show(level, base)
            last = results[-1].figures()
            b = base.figures()
            print(
                f"goals at N={last['n']}: prepare p50 x{last['prepare_p50_ms'] / b['prepare_p50_ms']:.2f} (<= 1.3), "
                f"CPU x{last['node_cpu_ms_per_cycle'] / max(b['node_cpu_ms_per_cycle'], 0.1):.2f} (<= 1.5), "
                f"p50 {last['prepare_p50_ms']} ms (<= 50), p99 {last['prepare_p99_ms']} ms (<= 150), "
                f"batched unprepare {batched * 1000:.0f} ms (<= 2000)"
            )
            release_all(node, claims, held)
            out["levels"] = [r.figures() for r in results]
            out["baseline_after"] = after.figures()
            out["batched_unprepare_ms"] = round(batched * 1000, 1)
            out["batched_unprepare_claims"] = top
            if args.json:
                print(json.dumps(out))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

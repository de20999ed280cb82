"""Benchmark: placement policies (issue 27) on 8 nodes x 8 dies, and what the extender costs.

No real kube-scheduler binary is available here: the scheduler is the fake one
(``flexnpu_testing/cluster.py`` choosing nodes as kube-scheduler does, with HTTPS extender calls,
over ``flexnpu_testing/scheduler.py``'s allocator that charges as v1.36 does). Each node runs the
node process's real publishing parts (``flexnpu_testing/placement_cluster.py``: the pool, the
helper's ResourceSlice controller, the die-level ordering and its claim watch) against the fake
API server; the extender (``flexnpu-dra extender``, ``controller/extender.py``) runs as its own process, over HTTPS. Arrivals
are in real time (200 ms and 500 ms, not scaled down).

Scenarios (``--only`` picks some):

* ``today``: no extender, no reordering (the static order): 64 share pods of 25 % compute
  arriving one per 200 ms. The "before" picture.
* ``binpack``: extender + ordering, binpack: the same 64 pods (goal: <= 16 dies on <= 2 nodes),
  then 48 whole-die pods (goal: all fit).
* ``spread``: extender + ordering, spread: 24 share pods of one set one per 200 ms (goal: the
  first 8 on 8 distinct nodes, all 24 on 24 distinct dies); then on a fresh cluster 8 pods pinned
  to one node one per 500 ms (goal: 8 distinct dies).
* ``burst``: 64 share pods created at once, both policies: dies and nodes used against the ideal.
* ``down``: the extender stopped: 16 pods still schedule (kube-scheduler ignores a failed prioritize).
* ``throughput``: 240 pods on 40 nodes with and without the extender (binpack), interleaved
  rounds; pods/s ratio (goal >= 0.8) and the extender's p50/p99 per call (client side, HTTPS).
  The nodes publish a static pool (pods created before the scheduler starts); the fake API server
  and the nodes run as their own processes in both rounds, so this process runs only the
  scheduler and its HTTPS client to the extender (``--one-process``: the API server and the nodes
  in this one, the former setup).
* ``templates``: 240 pods on 40 nodes x 8 dies with the ordering on: hard-split templates from a
  mode-``all`` pool (128 devices a node) against plain whole dies (8 devices a node, no counters),
  interleaved; pods/s ratio (goal >= 0.8). ``--kinds templates,shares,whole`` measures share and
  whole-die pods on the mode-``all`` pool too (goal >= 0.8 for every kind). The fake API server
  and the 40 nodes run as their own processes, as in a cluster (``--one-process``: all in this
  one, where the nodes' work takes the scheduler's interpreter time); the republishes (and the
  orders kept as first-fit equivalent) are counted per round, and the CPU each process used a pod
  placed (this one: the scheduler; medians of the rounds).

Figures are printed (``--json`` for machine reading) and never asserted. The pictures
(``--pictures FILE``) are what docs/placement.md shows.

    PYTHONPATH=. .venv/bin/python bench/bench_placement.py [--only binpack,spread] [--rounds 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dra_driver.devices import DieMode  # noqa: E402
from dra_driver.placement import Placement  # noqa: E402
from flexnpu_testing.placement_cluster import PlacementCluster  # noqa: E402

Result = dict[str, Any]


def _cluster(tmp: Path, **kw: Any) -> PlacementCluster:
    d = Path(tempfile.mkdtemp(dir=tmp))
    return PlacementCluster(d, **{"extender_process": True, **kw})


def _spread_of(c: PlacementCluster, pods: list[str]) -> tuple[int, int]:
    """Distinct nodes and distinct dies the pods' claims landed on."""
    bound = {p: c.scheduler.bound.get(f"placement/{p}") for p in pods}
    nodes = {n for n in bound.values() if n}
    items, _ = c._kubes[0].list_claims()
    dies = set()
    for claim in items:
        name = claim["metadata"]["name"].removesuffix("-claim")
        if name not in bound:
            continue
        for res in (
            ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        ):
            dies.add((res["pool"], res["device"].split("-")[1]))
    return len(nodes), len(dies)


def today(tmp: Path) -> Result:
    with _cluster(tmp, extender=False, writes_per_second=0) as c:
        c.scheduler.run([(i * 0.2, c.share_pod(f"s{i}")) for i in range(64)])
        used = c.dies_used()
        return {
            "bound": len(c.scheduler.bound),
            "dies": len(used),
            "nodes": len({n for n, _ in used}),
            "picture": c.picture(),
        }


def binpack(tmp: Path) -> Result:
    with _cluster(tmp, policy=Placement.BINPACK) as c:
        c.scheduler.run([(i * 0.2, c.share_pod(f"s{i}")) for i in range(64)])
        used = c.dies_used()
        out: Result = {
            "bound": len(c.scheduler.bound),
            "dies": len(used),
            "nodes": len({n for n, _ in used}),
            "picture": c.picture(),
            "republishes": sum(n.ordering.republishes for n in c.nodes.values()),
        }
        c.scheduler.run([(0.0, c.whole_pod(f"w{i}")) for i in range(48)], deadline=180)
        out["whole_bound"] = sum(1 for k in c.scheduler.bound if k.startswith("placement/w"))
        out["picture_after_whole"] = c.picture()
        return out


def spread(tmp: Path) -> Result:
    out: Result = {}
    with _cluster(tmp, policy=Placement.SPREAD) as c:
        c.scheduler.run([(i * 0.2, c.share_pod(f"s{i}")) for i in range(24)])
        out["first8_nodes"], out["first8_dies"] = _spread_of(c, [f"s{i}" for i in range(8)])
        out["all24_nodes"], out["all24_dies"] = _spread_of(c, [f"s{i}" for i in range(24)])
        out["picture"] = c.picture()
    with _cluster(tmp, policy=Placement.SPREAD) as c:
        pods = [c.share_pod(f"p{i}", node="node-00") for i in range(8)]
        out["republish_visible_ms"], out["republish_missed_next_arrival"] = _pinned(c, pods, 0.5)
        out["pinned_nodes"], out["pinned_dies"] = _spread_of(c, [f"p{i}" for i in range(8)])
        out["pinned_picture"] = c.picture().splitlines()[0]
    return out


def _first_share(c: PlacementCluster, node: str) -> str:
    """The node's first share device as the scheduler's informer sees it."""
    for s in sorted(c.scheduler.slices.items(), key=lambda s: s["metadata"]["name"]):
        if s["spec"].get("nodeName") == node:
            for d in s["spec"].get("devices") or []:
                if d.get("allowMultipleAllocations"):
                    return str(d["name"])
    return ""


def _pinned(c: PlacementCluster, pods: list[Any], every: float) -> tuple[list[float | None], int]:
    """Schedule ``pods`` one per ``every`` seconds on a strict clock; a watcher thread times, after
    each allocation, how long until the scheduler sees the node's new order (the republish latency
    end to end: claim watch, republish, slice write, the scheduler's informer). Returns the latencies
    (None: not seen within 3 s) and how many were not seen by the next arrival."""
    latencies: list[float | None] = []
    missed = 0
    watchers: list[threading.Thread] = []
    allocated_at: list[float] = []
    start = time.monotonic()

    def watch(before: str, allocated: float, slot: int) -> None:
        while time.monotonic() < allocated + 3:
            if _first_share(c, "node-00") != before:
                latencies[slot] = round((time.monotonic() - allocated) * 1000, 1)
                return
            time.sleep(0.002)

    for i, pod in enumerate(pods):
        while time.monotonic() < start + i * every:
            time.sleep(0.002)  # the arrival clock
        before = _first_share(c, "node-00")
        c.scheduler.schedule(pod)
        if i < len(pods) - 1:
            latencies.append(None)
            allocated_at.append(time.monotonic())
            t = threading.Thread(target=watch, args=(before, allocated_at[-1], i), daemon=True)
            t.start()
            watchers.append(t)
    for t in watchers:
        t.join()
    for i, ms in enumerate(latencies):
        missed += ms is None or allocated_at[i] + ms / 1000 > start + (i + 1) * every
    return latencies, missed


def burst(tmp: Path) -> Result:
    out: Result = {}
    for policy in Placement:
        with _cluster(tmp, policy=policy) as c:
            started = time.monotonic()
            c.scheduler.run([(0.0, c.share_pod(f"b{i}")) for i in range(64)])
            seconds = time.monotonic() - started
            nodes, dies = _spread_of(c, [f"b{i}" for i in range(64)])
            ideal = (2, 16) if policy is Placement.BINPACK else (8, 64)
            out[str(policy)] = {
                "bound": len(c.scheduler.bound),
                "seconds": round(seconds, 2),
                "nodes": nodes,
                "dies": dies,
                "ideal_nodes": ideal[0],
                "ideal_dies": ideal[1],
                "picture": c.picture(),
            }
    return out


def down(tmp: Path) -> Result:
    with _cluster(tmp, policy=Placement.BINPACK) as c:
        c.stop_extender()
        c.scheduler.run([(0.0, c.share_pod(f"d{i}")) for i in range(16)], deadline=60)
        return {
            "bound": len(c.scheduler.bound),
            "of": 16,
            "extender_errors": sum(d.extender_errors for d in c.scheduler.decisions),
        }


def _rate(
    tmp: Path, *, pods: int, nodes: int, make: Callable[[PlacementCluster, int], Any], **kw: Any
) -> Result:
    with _cluster(tmp, nodes=nodes, **kw) as c:
        arrivals = [(0.0, make(c, i)) for i in range(pods)]
        children = {"apiserver": c.server_proc, "nodes": c.nodes_proc}

        def cpu_now() -> dict[str, float]:
            used = {name: _cpu_seconds(p.pid) for name, p in children.items() if p is not None}
            return {**used, "scheduler": time.process_time()}

        before = cpu_now()
        started = time.monotonic()
        c.scheduler.run(arrivals, deadline=900)
        seconds = time.monotonic() - started
        after = cpu_now()
        cpu = {name: after[name] - before[name] for name in before}
        calls = [s for e in c.scheduler.extenders for s in e.seconds]
        stats = c.node_stats().values()
        bound = len(c.scheduler.bound)
        return {
            "bound": bound,
            "pods_per_s": bound / seconds,
            "calls": calls,
            "republishes": sum(n["republishes"] for n in stats),
            "equivalent": sum(n["equivalent"] for n in stats),
            "cpu_ms_per_pod": {name: 1000 * used / max(1, bound) for name, used in cpu.items()},
        }


def _cpu_seconds(pid: int) -> float:
    """CPU (user + system) a process has used so far, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def throughput(tmp: Path, rounds: int, pods: int, nodes: int, *, processes: bool = True) -> Result:
    """Pods/s with the extender against without it, interleaved rounds. With ``processes`` the fake
    API server and the nodes run as their own processes in both (this process runs the scheduler
    and its HTTPS client to the extender only)."""
    rates: dict[str, list[float]] = {"with": [], "without": []}
    calls: list[float] = []
    for _ in range(rounds):
        for key in ("without", "with"):  # interleaved
            r = _rate(
                tmp, pods=pods, nodes=nodes, make=lambda c, i: c.share_pod(f"t{i}"),
                extender=key == "with", publishing=False, processes=processes,
            )  # fmt: skip
            rates[key].append(r["pods_per_s"])
            calls += r["calls"]
    w, wo = statistics.median(rates["with"]), statistics.median(rates["without"])
    return {
        "pods": pods,
        "nodes": nodes,
        "with_pods_per_s": round(w, 2),
        "without_pods_per_s": round(wo, 2),
        "ratio": round(w / wo, 3),
        "processes": processes,
        "rounds": rates,
        "extender_calls": len(calls),
        "extender_p50_ms": round(_pct(calls, 0.5) * 1000, 2),
        "extender_p99_ms": round(_pct(calls, 0.99) * 1000, 2),
    }


_MAKERS: dict[str, Callable[[PlacementCluster, int], Any]] = {
    "plain": lambda c, i: c.whole_pod(f"h{i}"),
    "templates": lambda c, i: c.template_pod(f"h{i}"),
    "shares": lambda c, i: c.share_pod(f"h{i}"),
    "whole": lambda c, i: c.whole_pod(f"h{i}"),
}


def templates(
    tmp: Path,
    rounds: int,
    pods: int,
    nodes: int,
    kinds: tuple[str, ...] = ("templates",),
    *,
    processes: bool = True,
) -> Result:
    """Pods/s of each kind of pod on mode-``all`` nodes against whole-die pods on plain nodes,
    interleaved. With ``processes`` the fake API server and the nodes run as their own processes
    (as in a cluster; this process runs the scheduler only), for the baseline and every kind."""
    rates: dict[str, list[float]] = {k: [] for k in ("plain", *kinds)}
    writes: dict[str, list[tuple[int, int]]] = {k: [] for k in rates}
    cpu: dict[str, list[dict[str, float]]] = {k: [] for k in rates}
    for _ in range(rounds):
        for key, got in rates.items():
            mode = DieMode.WHOLE if key == "plain" else DieMode.ALL
            r = _rate(
                tmp,
                pods=pods,
                nodes=nodes,
                make=_MAKERS[key],
                mode=mode,
                extender=False,
                writes_per_second=4.0,
                processes=processes,
            )
            got.append(r["pods_per_s"])
            writes[key].append((r["republishes"], r["equivalent"]))
            cpu[key].append(r["cpu_ms_per_pod"])
    p = statistics.median(rates["plain"])
    out: Result = {
        "pods": pods,
        "nodes": nodes,
        "processes": processes,
        "plain_pods_per_s": round(p, 2),
        "rounds": rates,
        "republishes_and_equivalent_per_round": writes,
        "cpu_ms_per_pod": {  # medians over the rounds; this process is the scheduler
            k: {name: round(statistics.median(r[name] for r in runs), 2) for name in runs[0]}
            for k, runs in cpu.items()
        },
    }
    for kind in kinds:
        out[f"{kind}_pods_per_s"] = round(statistics.median(rates[kind]), 2)
        out[f"{kind}_ratio"] = round(statistics.median(rates[kind]) / p, 3)
    if "templates" in kinds:
        out["ratio"] = out["templates_ratio"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default="today,binpack,spread,burst,down,throughput,templates")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pods", type=int, default=240)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument(
        "--kinds",
        default="templates",
        help="for templates: pod kinds on mode-all nodes (templates,shares,whole)",
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="for throughput and templates: run the API server and the nodes in the scheduler's "
        "process (as before)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--pictures", type=Path, help="write the ASCII pictures here")
    args = parser.parse_args(argv)
    results: Result = {"load_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in args.only.split(","):
            started = time.monotonic()
            if name == "throughput":
                results[name] = throughput(
                    tmp, args.rounds, args.pods, args.nodes, processes=not args.one_process
                )
            elif name == "templates":
                kinds = tuple(k for k in args.kinds.split(",") if k)
                if unknown := [k for k in kinds if k not in _MAKERS or k == "plain"]:
                    parser.error(
                        f"--kinds: unknown kind(s) {', '.join(unknown)}; use templates, shares, whole"
                    )
                results[name] = templates(
                    tmp, args.rounds, args.pods, args.nodes, kinds, processes=not args.one_process
                )
            else:
                results[name] = globals()[name](tmp)
            results[name]["wall_s"] = round(time.monotonic() - started, 1)
            if not args.json:
                print(
                    f"== {name}: "
                    + json.dumps({k: v for k, v in results[name].items() if "picture" not in k})
                )
                for k, v in results[name].items():
                    if "picture" in k and isinstance(v, str):
                        print(f"-- {k}\n{v}")
            sys.stdout.flush()
    results["load_after"] = os.getloadavg()
    if args.json:
        json.dump(results, sys.stdout, indent=2, default=str)
        print()
    if args.pictures:
        lines = []
        for name in ("today", "binpack", "spread"):
            if name in results:
                lines.append(f"{name}:\n{results[name].get('picture', '')}")
        args.pictures.write_text("\n\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: what the published pools cost the real v1.36 structured allocator (issue 27).

The fake scheduler (``flexnpu_testing/scheduler.py``) charges as v1.36 does, but its cost per device
is Python's. This bench times the allocator kube-scheduler itself runs: ``bench/go_allocator``, a
small Go program linked against ``k8s.io/dynamic-resource-allocation`` v0.36 (its ``structured``
package), which places the pods as the DynamicResources plugin does — one allocator per pod built
from every ResourceSlice and the claims allocated so far (PreFilter), one ``Allocate`` per node
(Filter; every node, as fewer than 100 are always all filtered) — and reports the nanoseconds of each
call. This script writes what it reads: every node's ResourceSlices as the node process publishes
them (``dra_driver/slices.py``'s pool in the order the placement policy gives an empty node, the
slice specs of the helper in ``dra_kubeletplugin``), the DeviceClasses and the claim of each kind of pod of
``bench/bench_placement.py`` (``flexnpu_testing/placement_cluster.py``):

* ``plain``: whole-die pods on mode-``whole`` nodes (8 devices, no counters): the baseline;
* ``templates``, ``shares`` (25 % compute), ``whole``: pods on mode-``all`` nodes (whole, shares
  and template instances, 128 devices a node);
* ``both-shares``, ``both-whole``: share and whole-die pods on mode-``both`` nodes (the default
  mode: whole and share devices, 32 a node).

Kinds are interleaved (one Go process per kind and round, the order rotating each round), and
each run places ``--pods`` pods on ``--nodes`` nodes x 8 dies. Printed per kind: ns per Allocate
(median, p99), per pod over all nodes (median), and a **model** of the real scheduler's pods/s
ratio to plain, two ways, as ``T`` (the real scheduler's time per plain pod: 71 ms, about 14 pods/s,
dra-contracts section 7) and ``P`` (the allocator's time per pod) may add or overlap: *serial*
``T / (T + P_kind - P_plain)`` (the allocator's time adds to each pod's) and *overlap*
``T / max(T, P_kind)`` (the scheduling cycle overlaps the binding of earlier pods, which holds plain
pods to ``T``; it costs only once it is the longer).
``--pools former`` runs the pool of before the counter change (``dra_driver/slices.py`` at
``ca24f39^``: a slot counter per template instance; measured 0.32x for templates on a real
kube-scheduler) and ``former112`` the pool of before three share devices a die (``a8a325e^``,
112 devices; measured 0.65x for templates): the model is checked against those.

``--exclusion`` instead checks the pool's rules with the real allocator: pods of every kind in a
random order on a few mode-``all`` nodes, more than fit (e.g. ``--nodes 2 --pods 120``); each die must
then hold one whole die, or shares of one share device, or template instances within its AI Cores and
memory (exit 1 and the breaches listed otherwise).

The Go program is not built here: pass it with ``--allocator-bin`` (or ``FLEXNPU_GO_ALLOCATOR``);
docs/placement.md ("The real allocator's walk") says what it links. Without it the script exits
with a message. A bench: figures are printed, never asserted.

    PYTHONPATH=. .venv/bin/python bench/bench_real_allocator.py --allocator-bin PATH [--rounds 3]
        [--kinds templates,shares,whole] [--pools current,former] [--features default|all] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from io import BytesIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from dra_driver import discovery, placement  # noqa: E402
from dra_driver.devices import DieMode  # noqa: E402
from dra_driver.placement import Placement  # noqa: E402
from dra_kubeletplugin.resourceslice import pools, sync  # noqa: E402
from flexnpu_testing import placement_cluster as pc  # noqa: E402

Obj = dict[str, Any]

T_POD_MS = 1000 / 14
"""The real kube-scheduler's time per plain pod: about 14 pods/s (dra-contracts section 7)."""
FORMER = {"former": "ca24f39^", "former112": "a8a325e^"}
"""Pools of earlier commits: before the vnpus counter change; before three share devices a die."""
KINDS: dict[str, tuple[DieMode, Obj]] = {
    "plain": (DieMode.WHOLE, pc.whole_request()),
    "templates": (DieMode.ALL, pc.template_request()),
    "shares": (DieMode.ALL, pc.share_request(25)),
    "whole": (DieMode.ALL, pc.whole_request()),
    "both-shares": (DieMode.BOTH, pc.share_request(25)),
    "both-whole": (DieMode.BOTH, pc.whole_request()),
}

_FORMER_BUILD = """
import json, sys
from pathlib import Path
from dra_driver import discovery, slices
from dra_driver.devices import DieMode
inventory = discovery.from_config(inventory=Path(sys.argv[1]), npu_smi="npu-smi").discover()
mode = DieMode(sys.argv[2])
out = {}
for node in sys.argv[4:]:
    pool = slices.build_pool(inventory, driver_name=sys.argv[3], node_name=node, mode_of=lambda _d: mode)
    out[node] = list(pool.slices)
print(json.dumps(out))
"""


def resource_slices(node: str, fragments: Sequence[Obj]) -> list[Obj]:
    """A node's ResourceSlice objects from its pool's ``spec`` fragments, as the helper writes them."""
    pool = pools.Pool(name=node, slices=list(fragments), generation=1)
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": sync.generate_name(i, driver_name=pc.DRIVER, node_name=node) + "bench"},
            "spec": sync.desired_spec(pool, i, driver_name=pc.DRIVER, node_name=node, generation=1),
        }
        for i in range(len(pool.slices))
    ]


def current_fragments(nodes: Sequence[str], mode: DieMode, order: str) -> dict[str, list[Obj]]:
    """Each node's slice fragments from this tree: the static pool, or (``binpack``/``spread``) the
    order the node publishes on an empty node with the placement ordering on."""
    inventory = discovery.from_config(inventory=pc.INVENTORY, npu_smi="npu-smi").discover()
    out = {}
    for node in nodes:
        pool = pc.build_base(inventory, node, mode)
        if order != "static":
            pool = placement.order_pool(pool, {}, Placement.parse(order))
        out[node] = list(pool.slices)
    return out


def former_fragments(commit: str, nodes: Sequence[str], mode: DieMode, workdir: Path) -> dict[str, list[Obj]]:
    """Each node's slice fragments as ``dra_driver/slices.py`` of ``commit`` built them (static order),
    from that commit's tree unpacked under ``workdir`` and run with this interpreter."""
    tree = workdir / commit.replace("^", "-parent")
    if not tree.exists():
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
        ).stdout
        tree.mkdir(parents=True)
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tree, filter="data")
    inventory = tree / "flexnpu_testing" / "inventories" / "eight-910b4.yaml"
    if not inventory.exists():
        inventory = pc.INVENTORY
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _FORMER_BUILD, str(inventory), str(mode), pc.DRIVER, *nodes],
        cwd=tree, env=env, check=True, capture_output=True, text=True,
    )  # fmt: skip
    return dict(json.loads(done.stdout))


def keep_attributes(fragments: dict[str, list[Obj]], keep: frozenset[str]) -> dict[str, list[Obj]]:
    """An experiment, not what a node publishes: every device with only the attributes in ``keep``."""
    return {
        node: [
            {**f, "devices": [{**d, "attributes": {k: v for k, v in d.get("attributes", {}).items() if k in keep}}
                              for d in f["devices"]]} if "devices" in f else f
            for f in frags
        ]
        for node, frags in fragments.items()
    }  # fmt: skip


def scenario(fragments: dict[str, list[Obj]], request: Obj, pods: int) -> Obj:
    return {
        "classes": [pc.device_class(name) for name in pc.CLASSES],
        "slices": [s for node, frags in fragments.items() for s in resource_slices(node, frags)],
        "nodes": list(fragments),
        # as the API server stores it: allocationMode and count defaulted
        "claimSpec": {
            "devices": {
                "requests": [
                    {"name": "npu", "exactly": {"allocationMode": "ExactCount", "count": 1, **request}}
                ]
            }
        },
        "pods": pods,
    }


def exclusion(binary: str, work: Path, nodes: int, pods: int, seed: int) -> Obj:
    """Mixed kinds on mode-``all`` nodes through the real allocator; what each die ends up holding."""
    names = [f"node-{i:02d}" for i in range(nodes)]
    frags = current_fragments(names, DieMode.ALL, "binpack")
    kinds = ["templates", "shares", "whole"]
    order = random.Random(seed).choices(kinds, k=pods)
    doc = scenario(frags, KINDS["plain"][1], pods)
    doc["claimSpecs"] = [scenario(frags, KINDS[k][1], pods)["claimSpec"] for k in order]
    path = work / "exclusion.json"
    path.write_text(json.dumps(doc))
    report = run_go(binary, path, "exclusion", "default", seed)
    inventory = discovery.from_config(inventory=pc.INVENTORY, npu_smi="npu-smi").discover()
    infos = {n: placement.device_infos(pc.build_base(inventory, n, DieMode.ALL)) for n in names}
    totals = {n: placement.die_totals(pc.build_base(inventory, n, DieMode.ALL)) for n in names}
    dies: dict[tuple[str, int], list[placement.DeviceInfo]] = {}
    share_devices: dict[tuple[str, int], set[str]] = {}
    for where in report["placements"]:
        for dev in where["devices"]:
            info = infos[where["node"]][dev]
            dies.setdefault((where["node"], info.phy), []).append(info)
            if info.kind is placement.Kind.SHARE:
                share_devices.setdefault((where["node"], info.phy), set()).add(dev)
    problems = []
    for (node, phy), held in sorted(dies.items()):
        kinds_held = {i.kind for i in held}
        total = totals[node][phy]
        if placement.Kind.WHOLE in kinds_held and len(held) > 1:
            problems.append(f"{node} die {phy}: a whole die with {len(held) - 1} more")
        if {placement.Kind.SHARE, placement.Kind.TEMPLATE} <= kinds_held:
            problems.append(f"{node} die {phy}: shares and templates together")
        if len(share_devices.get((node, phy), ())) > 1:
            problems.append(f"{node} die {phy}: shares on {len(share_devices[(node, phy)])} share devices")
        templates = [i for i in held if i.kind is placement.Kind.TEMPLATE]
        if sum(i.aicore for i in templates) > total.aicore or sum(i.memory for i in templates) > total.memory:
            problems.append(f"{node} die {phy}: templates over the die's AI Cores or memory")
    placed = {k: 0 for k in kinds}
    for where in report["placements"]:
        placed[order[where["spec"]]] += 1
    return {
        "nodes": nodes,
        "pods": pods,
        "asked": {k: order.count(k) for k in kinds},
        "placed": placed,
        "dies": {
            "whole": sum(1 for h in dies.values() if h[0].kind is placement.Kind.WHOLE),
            "shares": sum(1 for h in dies.values() if h[0].kind is placement.Kind.SHARE),
            "templates": sum(1 for h in dies.values() if h[0].kind is placement.Kind.TEMPLATE),
        },
        "problems": problems,
    }


def run_go(binary: str, path: Path, kind: str, features: str, seed: int) -> Obj:
    done = subprocess.run(
        [binary, "--scenario", str(path), "--kind", kind, "--features", features, "--seed", str(seed)],
        check=False, capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{binary} failed for {kind} (exit {done.returncode}): {done.stderr.strip()}")
    return dict(json.loads(done.stdout))


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(runs: list[Obj]) -> Obj:
    """One kind's runs: medians over runs of the per-run median/p99 Allocate and median per pod."""
    alloc_med = [statistics.median(r["allocateNs"]) for r in runs]
    alloc_p99 = [_p(r["allocateNs"], 0.99) for r in runs]
    pod_med = [statistics.median(r["podNs"]) for r in runs]
    new_med = [statistics.median(r["newAllocatorNs"]) for r in runs]
    return {
        "devices_per_node": runs[0]["devices"] // runs[0]["nodes"],
        "slices_per_node": runs[0]["slices"] / runs[0]["nodes"],
        "placed": [r["placed"] for r in runs],
        "allocate_us_median": round(statistics.median(alloc_med) / 1e3, 1),
        "allocate_us_p99": round(statistics.median(alloc_p99) / 1e3, 1),
        "new_allocator_us_median": round(statistics.median(new_med) / 1e3, 1),
        "pod_ms_median": round(statistics.median(pod_med) / 1e6, 3),
        "pod_ms_rounds": [round(v / 1e6, 3) for v in pod_med],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--allocator-bin", default=os.environ.get("FLEXNPU_GO_ALLOCATOR", ""))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pods", type=int, default=240)
    parser.add_argument("--nodes", type=int, default=40)
    parser.add_argument("--kinds", default="templates,shares,whole")
    parser.add_argument("--pools", default="current", help="current, former (ca24f39^), former112 (a8a325e^)")
    parser.add_argument("--order", default="binpack", help="current pool: binpack, spread or static")
    parser.add_argument("--features", default="default", help="default (v1.36 default gates) or all")
    parser.add_argument("--t-pod-ms", type=float, default=T_POD_MS)
    parser.add_argument(
        "--keep-attributes",
        default="",
        help="an experiment: publish only these device attributes (comma-separated, e.g. mode,template,policy)",
    )
    parser.add_argument(
        "--exclusion",
        action="store_true",
        help="check the dies' exclusion with mixed kinds (--nodes nodes, --pods pods) instead of timing",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    binary = args.allocator_bin
    if not binary or not Path(binary).is_file() or not os.access(binary, os.X_OK):
        print(
            "bench_real_allocator: no allocator binary: pass --allocator-bin PATH (or FLEXNPU_GO_ALLOCATOR), "
            "bench/go_allocator built against k8s.io/dynamic-resource-allocation v0.36 "
            '(docs/placement.md, "The real allocator\'s walk")',
            file=sys.stderr,
        )
        return 2
    kinds = ["plain", *(k for k in args.kinds.split(",") if k and k != "plain")]
    if unknown := [k for k in kinds if k not in KINDS]:
        parser.error(f"--kinds: unknown kind(s) {', '.join(unknown)}; use {', '.join(KINDS)}")
    pool_names = [p for p in args.pools.split(",") if p]
    if unknown := [p for p in pool_names if p != "current" and p not in FORMER]:
        parser.error(f"--pools: unknown pool(s) {', '.join(unknown)}; use current, {', '.join(FORMER)}")
    if args.exclusion:
        with tempfile.TemporaryDirectory() as d:
            checked = exclusion(binary, Path(d), args.nodes, args.pods, seed=1)
        print(json.dumps(checked, indent=None if args.json else 2))
        return 1 if checked["problems"] else 0
    nodes = [f"node-{i:02d}" for i in range(args.nodes)]
    results: Obj = {
        "load_before": os.getloadavg(),
        "features": args.features,
        "t_pod_ms": args.t_pod_ms,
        "keep_attributes": args.keep_attributes,
    }
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        paths: dict[tuple[str, str], Path] = {}
        for pool_name in pool_names:
            for kind in kinds:
                mode, request = KINDS[kind]
                if pool_name == "current":
                    frags = current_fragments(nodes, mode, args.order)
                else:
                    frags = former_fragments(FORMER[pool_name], nodes, mode, work)
                if args.keep_attributes:
                    frags = keep_attributes(frags, frozenset(args.keep_attributes.split(",")))
                path = work / f"{pool_name}-{kind}.json"
                path.write_text(json.dumps(scenario(frags, request, args.pods)))
                paths[(pool_name, kind)] = path
        runs: dict[tuple[str, str], list[Obj]] = {key: [] for key in paths}
        keys = list(paths)
        for r in range(args.rounds):
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                runs[key].append(run_go(binary, paths[key], key[1], args.features, seed=r + 1))
    results["load_after"] = os.getloadavg()
    for pool_name in pool_names:
        out: Obj = {k: summarize(runs[(pool_name, k)]) for k in kinds}
        plain = out["plain"]["pod_ms_median"]
        for kind in kinds:
            extra = out[kind]["pod_ms_median"] - plain
            out[kind]["model_ratio"] = round(args.t_pod_ms / (args.t_pod_ms + extra), 3)
            overlap = args.t_pod_ms / max(args.t_pod_ms, out[kind]["pod_ms_median"])
            out[kind]["model_ratio_overlap"] = round(overlap, 3)
        results[pool_name] = out
    if args.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return 0
    print(f"load {results['load_before']} -> {results['load_after']}; features {args.features}; "
          f"models (T = {args.t_pod_ms:.1f} ms): serial T/(T + P - P_plain), overlap T/max(T, P)")  # fmt: skip
    for pool_name in pool_names:
        print(f"== pool {pool_name}")
        print(
            "kind         dev/node  Allocate us p50     p99  NewAllocator us  per pod ms  serial  overlap  placed"
        )
        for kind in kinds:
            s = results[pool_name][kind]
            print(
                f"{kind:<12} {s['devices_per_node']:>8} {s['allocate_us_median']:>16} {s['allocate_us_p99']:>7}"
                f" {s['new_allocator_us_median']:>16} {s['pod_ms_median']:>11} {s['model_ratio']:>7}"
                f" {s['model_ratio_overlap']:>8}  {s['placed']}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: hard-split templates — publishing a large node, and preparing a hard vNPU.

Publish (16 Atlas A3 dies, mode ``all``: whole + soft + every template instance per die; the
baseline is the same node in mode ``both``, measured in the same run, interleaved):

* ``build``: ``slices.build_pool`` + the helper's ``pools.validate`` (pure);
* ``publish``: the real slice controller (``dra_kubeletplugin/resourceslice/``) writing the pool into an
  empty fake API server (every slice created), and a re-sync with nothing to change;
* slice bytes: the JSON of every slice as the API server stores it.

Prepare (only with ``--prepare``): hard vNPU prepare / unprepare p50 / p99 with the emulated
vNPU backend, through the real node process and the kubelet simulator, against whole-die
prepare / unprepare on the same node, interleaved. Goal: hard within 1.5x of whole.

    .venv/bin/python bench/bench_hard.py [-n 20] [--prepare]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import logging  # noqa: E402

from _node import ms, pct  # noqa: E402
from kubernetes import client  # noqa: E402

from controller.kube import Kube  # noqa: E402
from dra_driver import logs, slices  # noqa: E402
from dra_driver.devices import Die, DieMode, Inventory  # noqa: E402
from dra_kubeletplugin.resourceslice import pools  # noqa: E402
from dra_kubeletplugin.resourceslice.controller import SliceController  # noqa: E402
from dra_kubeletplugin.resourceslice.pools import DriverResources  # noqa: E402
from flexnpu_testing.fake_apiserver import FakeAPIServer  # noqa: E402

DRIVER = "npu.flexnpu.io"
NODE = "bench-node"


def a3_node(dies: int = 16) -> Inventory:
    return Inventory(
        dies=tuple(
            Die(
                vdie_id=f"{p:08X}-00000000-00000000-00000000-00000000",
                model="Ascend910",
                card_id=p // 2,
                chip_id=p % 2,
                phy_id=p,
                logic_id=p,
                pci_bus_id=f"0000:{p + 0x10:02x}:00.0",
                numa_node=p // 8,
                memory_mib=65536,
                aicore=24,
                aicpu=7,
                die_index=p % 2,
                npu_name="9392",
            )
            for p in range(dies)
        ),
        driver_version="25.0.rc1.1",
        firmware_version="7.7.0.1.231",
    )


def build(inv: Inventory, mode: DieMode) -> slices.DesiredPool:
    pool = slices.build_pool(inv, driver_name=DRIVER, node_name=NODE, mode_of=lambda d: mode)
    pools.validate(pool)
    return pool


def publish_once(inv: Inventory, mode: DieMode) -> tuple[float, float, int, int]:
    """(first sync seconds, no-op resync seconds, slice count, stored bytes) on a fresh server."""
    with FakeAPIServer() as srv:
        api_client = srv.api_client()
        core: Any = client.CoreV1Api(api_client)
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        pub = SliceController(
            Kube(api_client),
            driver_name=DRIVER,
            node_name=NODE,
            resources=DriverResources.single(build(inv, mode)),
            log=logs.claim_logger("-", base=logging.getLogger("bench")),
        )
        t0 = time.perf_counter()
        first = pub.sync()
        t1 = time.perf_counter()
        again = pub.sync()
        t2 = time.perf_counter()
        if first.created == 0 or (again.created, again.updated, again.deleted) != (0, 0, 0):
            raise SystemExit(f"unexpected sync results: {first} then {again}")
        items, _ = Kube(api_client).list_slices(driver=DRIVER, node=NODE)
        size = sum(len(json.dumps(i, separators=(",", ":"))) for i in items)
        api_client.close()
        return t1 - t0, t2 - t1, len(items), size


def bench_publish(n: int) -> None:
    inv = a3_node()
    timings: dict[str, dict[str, list[float]]] = {
        m: {"build": [], "publish": [], "resync": []} for m in ("both", "all")
    }
    facts: dict[str, tuple[int, int, int]] = {}
    for _ in range(n):
        for mode in (DieMode.BOTH, DieMode.ALL):  # interleaved: same load for both
            t0 = time.perf_counter()
            pool = build(inv, mode)
            timings[mode]["build"].append(time.perf_counter() - t0)
            first, resync, count, size = publish_once(inv, mode)
            timings[mode]["publish"].append(first)
            timings[mode]["resync"].append(resync)
            facts[mode] = (len(pool.device_names), count, size)
    print(f"publish: 16 A3 dies, {n} rounds each, interleaved")
    for mode in ("both", "all"):
        devices, count, size = facts[mode]
        print(f"  mode {mode:<4}: {devices:3d} devices in {count} slices, {size / 1024:7.1f} KiB stored")
        for what, values in timings[mode].items():
            print(f"    {what:<8} p50 {ms(statistics.median(values))}  p99 {ms(pct(values, 0.99))}")
    for what in ("build", "publish", "resync"):
        ratio = statistics.median(timings["all"][what]) / statistics.median(timings["both"][what])
        print(f"  all / both, {what:<8}: {ratio:5.2f}x")
    print(f"  all / both, bytes   : {facts['all'][2] / facts['both'][2]:5.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=20, help="rounds per measurement (default 20)")
    parser.add_argument("--prepare", action="store_true", help="also measure hard vNPU prepare/unprepare")
    args = parser.parse_args(argv)
    bench_publish(args.n)
    if args.prepare:
        from bench import _hard_prepare  # the node-level part needs the prepare integration

        _hard_prepare.run(args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())

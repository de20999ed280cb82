"""Benchmark: what the cluster's ResourceClaim churn costs one node's residual reconciler.

Real node process (``whole`` mode, eight emulated 910B4 dies, 8 whole-die claims of its own
prepared through the kubelet simulator), a fake API server in this process. For each scale of
*foreign* claims (claims of other nodes: 0, 5,000, 20,000 by default) it

1. creates them while the node runs (each one is two watch events the node receives: the
   creation and the allocation's status write) and reports
   the node's CPU per creation event and its RSS afterwards (vs. before: the baseline);
2. churns them (status updates, deletions and re-creations, picked at random) at each rate
   (50 and 200 ops/s by default) in windows of ``--window`` seconds, interleaved with idle
   windows (0 ops/s, the baseline) so machine drift cancels: node CPU per foreign event
   (window CPU minus the idle windows' mean rate), % of a core, and the *event lag*: every
   second one of the node's own claims loses its consumer, and the lag is the time until the
   node GETs that claim (a pass it started from the watch event; includes the 0.5 s
   coalescing delay of passes, which is by design).

Targets (issue 10): a foreign event costs <= 50 us of node CPU; RSS with 5,000 foreign claims
<= baseline + 5 MiB; the lag does not grow with the churn rate.

    .venv/bin/python bench/bench_reconcile_churn.py [--scales 0,5000,20000] [--rates 50,200] [--window 10]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from kubernetes import client  # noqa: E402

from dra_driver import netlink  # noqa: E402
from dra_kubeletplugin.claims import ClaimRef  # noqa: E402
from flexnpu_testing.fake_apiserver import FakeAPIServer  # noqa: E402
from flexnpu_testing.waiting import wait_for  # noqa: E402
from tests.integration.conftest import DRIVER, NAMESPACE, NODE, WHOLE_CEL, Node, make_node  # noqa: E402

FOREIGN_NS = "elsewhere"
PAGE = os.sysconf("SC_PAGE_SIZE")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of ``pid``, in ns resolution (schedstat), not 10 ms ticks."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue  # a thread that just ended
    return total / 1e9


def rss_mib(pid: int) -> float:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20


def foreign_claim(i: int, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": f"f{i}", "namespace": FOREIGN_NS, "uid": str(uuid.uuid4())},
        "spec": {
            "devices": {"requests": [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}]}
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [{"request": "npu", "driver": DRIVER, "pool": node, "device": "npu-0"}]
                }
            },
            "reservedFor": [{"resource": "pods", "name": f"pod-f{i}", "uid": str(uuid.uuid4())}],
        },
    }


@contextlib.contextmanager
def cluster(root: Path) -> Iterator[Node]:
    with FakeAPIServer(watch_history=100_000) as srv:
        core: Any = client.CoreV1Api(srv.api_client())
        core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
        for ns in (NAMESPACE, FOREIGN_NS):
            core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        res: Any = client.ResourceV1Api(srv.api_client())
        res.create_device_class(
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "npu.flexnpu.io"},
                "spec": {"selectors": [{"cel": {"expression": WHOLE_CEL}}]},
            }
        )
        node = make_node(
            srv,
            root / "n0",
            "eight-910b4.yaml",
            FLEXNPU_DEFAULT_MODE="whole",
            FLEXNPU_LOG_LEVEL="INFO",
            FLEXNPU_CONTROL_LINK="",
            FLEXNPU_RESIDUAL_GRACE_SECONDS="3600",
            FLEXNPU_REDISCOVER_SECONDS="0",
        )
        try:
            node.start()
            wait_for(node.devices, what="published devices", timeout=30)
            yield node
        finally:
            node.stop()
            with contextlib.suppress(Exception):
                if node.env.get("FLEXNPU_CONTROL_LINK"):
                    netlink.remove_link(node.env["FLEXNPU_CONTROL_LINK"])


def prepare_own(node: Node, count: int) -> list[str]:
    assert node.kubelet is not None
    names = []
    for i in range(count):
        name = f"own{i}"
        uid = node.create_claim(name, [{"name": "npu", "exactly": {"deviceClassName": "npu.flexnpu.io"}}])
        node.scheduler.allocate(
            NAMESPACE, name, NODE, reserved_for=[{"resource": "pods", "name": f"p{i}", "uid": f"pod-{i}"}]
        )
        err = node.kubelet.prepare([ClaimRef(NAMESPACE, uid, name)])[uid].error
        if err:
            raise SystemExit(f"prepare {name}: {err}")
        names.append(name)
    return names


class Churner:
    """Random status updates, deletions and re-creations of foreign claims at a rate."""

    def __init__(self, srv: FakeAPIServer, count: int) -> None:
        self.srv = srv
        self.live = list(range(count))
        self.next = count
        self.events = 0
        self.rng = random.Random(7)

    def op(self) -> None:
        if not self.live:
            self.srv.put_object("resourceclaims", foreign_claim(self.next, "node-x"))
            self.live.append(self.next)
            self.next += 1
            self.events += 2  # a creation and its status write
            return
        roll = self.rng.random()
        i = self.rng.choice(self.live)
        if roll < 0.6:
            obj = self.srv.get_object("resourceclaims", f"f{i}", FOREIGN_NS)
            if obj is not None:
                obj["status"]["reservedFor"] = [
                    {"resource": "pods", "name": f"pod-f{i}", "uid": str(uuid.uuid4())}
                ]
                self.srv.put_object("resourceclaims", obj)
                self.events += 1
        else:
            self.srv.delete_object("resourceclaims", f"f{i}", FOREIGN_NS)
            self.live.remove(i)
            self.srv.put_object("resourceclaims", foreign_claim(self.next, "node-x"))
            self.live.append(self.next)
            self.next += 1
            self.events += 3  # a deletion, a creation and its status write

    def run(self, rate: float, seconds: float) -> int:
        start_events = self.events
        if rate <= 0:
            threading.Event().wait(seconds)
            return 0
        t0 = time.monotonic()
        n = 0
        tick = threading.Event()
        while (now := time.monotonic()) - t0 < seconds:
            due = int((now - t0) * rate)
            while n < due:
                self.op()
                n += 1
            tick.wait(0.005)
        return self.events - start_events


class LagProbe:
    """Every second, one of the node's own claims loses its consumer; lag = time to the node's GET."""

    def __init__(self, node: Node, names: list[str]) -> None:
        self.node = node
        self.names = names
        self.lags: list[float] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LagProbe:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(timeout=30)

    def _run(self) -> None:
        srv = self.node.api
        i = 0
        while not self.stop.wait(1.0):
            name = self.names[i % len(self.names)]
            i += 1
            path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims/{name}"
            before = len(srv.request_log())
            obj = srv.get_object("resourceclaims", name, NAMESPACE)
            if obj is None:
                continue
            consumers = obj["status"].get("reservedFor") or []
            obj["status"]["reservedFor"] = []
            t0 = time.monotonic()
            srv.put_object("resourceclaims", obj)
            seen = False
            while time.monotonic() - t0 < 10 and not self.stop.is_set():
                log = srv.request_log()[before:]
                if any(m == "GET" and p == path for m, p in log):
                    seen = True
                    break
                self.stop.wait(0.002)
            if seen:
                self.lags.append(time.monotonic() - t0)
            fresh = srv.get_object("resourceclaims", name, NAMESPACE)
            if fresh is not None:
                fresh["status"]["reservedFor"] = consumers
                srv.put_object("resourceclaims", fresh)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scales", default="0,5000,20000", help="foreign claim counts (default 0,5000,20000)"
    )
    parser.add_argument("--rates", default="50,200", help="churn rates in ops/s (default 50,200)")
    parser.add_argument(
        "--window", type=float, default=10.0, help="seconds per measuring window (default 10)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds per scale (default 2)")
    parser.add_argument("--own", type=int, default=8, help="claims prepared on the node (default 8)")
    args = parser.parse_args()
    scales = [int(s) for s in args.scales.split(",")]
    rates = [float(r) for r in args.rates.split(",")]
    root = Path(tempfile.mkdtemp(prefix="brc", dir="/tmp"))
    try:
        with cluster(root) as node:
            own = prepare_own(node, args.own)
            assert node.proc is not None
            pid = node.proc.pid
            churn = Churner(node.api, 0)
            print(
                f"node pid {pid}: {len(own)} own claims prepared; window {args.window:g}s x {args.repeats} rounds"
            )
            print(
                f"{'foreign':>8} {'phase':>14} {'events':>8} {'cpu/event':>10} {'core %':>7} {'RSS MiB':>8} {'lag p50':>8} {'lag p99':>8}"
            )
            base_rss = rss_mib(pid)
            created = 0
            for scale in scales:
                added = max(0, scale - created)
                cpu0, t0 = cpu_seconds(pid), time.monotonic()
                rss_before = rss_mib(pid)
                for _ in range(added):
                    node.api.put_object("resourceclaims", foreign_claim(churn.next, "node-x"))
                    churn.live.append(churn.next)
                    churn.next += 1
                created += added
                threading.Event().wait(2.0)  # let the node drain the creation events
                cpu1 = cpu_seconds(pid)
                per = f"{(cpu1 - cpu0) / (2 * added) * 1e6:>8.1f}us" if added else f"{'-':>10}"
                print(
                    f"{scale:>8} {'create':>14} {2 * added:>8} {per} "
                    f"{100 * (cpu1 - cpu0) / (time.monotonic() - t0):>6.1f}% "
                    f"{rss_mib(pid):>8.1f} {'':>8} {'':>8}   (RSS before {rss_before:.1f}, at start {base_rss:.1f})"
                )
                samples: dict[float, list[tuple[int, float, float, list[float]]]] = {
                    r: [] for r in [0.0, *rates]
                }
                for _ in range(args.repeats):
                    for rate in [0.0, *rates]:
                        with LagProbe(node, own) as probe:
                            c0, w0 = cpu_seconds(pid), time.monotonic()
                            events = churn.run(rate, args.window)
                            c1, w1 = cpu_seconds(pid), time.monotonic()
                        samples[rate].append((events, c1 - c0, w1 - w0, probe.lags))
                idle_rate = statistics.mean(c / w for _, c, w, _ in samples[0.0])
                for rate, rows in samples.items():
                    events = sum(r[0] for r in rows)
                    cpu = sum(r[1] for r in rows)
                    wall = sum(r[2] for r in rows)
                    lags = [x for r in rows for x in r[3]]
                    extra = cpu - idle_rate * wall
                    per_event = f"{extra / events * 1e6:>8.1f}us" if events else f"{'(idle)':>10}"
                    print(
                        f"{len(churn.live):>8} {f'churn {rate:g}/s':>14} {events:>8} {per_event} "
                        f"{100 * cpu / wall:>6.1f}% {rss_mib(pid):>8.1f} "
                        f"{pct(lags, 0.5) * 1000:>6.0f}ms {pct(lags, 0.99) * 1000:>6.0f}ms"
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: a restart of flexnpu-daemon's container with live claims — how long until it serves again.

The chart's daemon DaemonSet is rendered (``emulated.enabled``) and its container run with podman exactly as
rendered (``tests/e2e/podspec.py``: hostPID, privileged, the node's directories under a temp root, the host's
cgroup file system), from the image ``scripts/build-image.sh`` builds. Two such "nodes" run side by side: one
with N live claims (default 16), each with a client session calling ``get_mem_info`` in a loop from the host,
and one with none (the baseline). Their containers are restarted in turn, interleaved, R times (default 20):
SIGTERM (``podman stop``), then ``podman start``, as the kubelet restarts a pod's container. Per restart:

* **control plane back**: from the stop until the new daemon answers ``Health`` having adopted (and, with
  claims, lists all N aclservers Running with their old PIDs) — register and unregister wait this long;
* **sessions**: the longest interval between two answered calls of any session across the restart, and every
  failed call (the aclservers live outside the container: they should not notice);
* the same PIDs after every restart (re-adopted, not restarted).

Printed: p50 / p99 of each, and the ratio of the loaded node's control-plane time to the baseline's. Needs root
and podman; never asserted in tests.

    .venv/bin/python bench/bench_daemon_restart.py [-n 16] [-r 20] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from _node import ms, pct  # noqa: E402

from dra_driver.daemon_api.client import DaemonClient  # noqa: E402
from dra_driver.daemon_api.values import RegisterRequest  # noqa: E402
from flexnpu_client.session import Session  # noqa: E402
from flexnpu_testing.daemon import remove_cgroups  # noqa: E402
from flexnpu_wire import clientconf  # noqa: E402
from flexnpu_wire.codes import Policy  # noqa: E402
from flexnpu_wire.shares import Share  # noqa: E402
from tests.e2e import image as img  # noqa: E402
from tests.e2e import podspec  # noqa: E402
from tests.unit.test_manifests import RELEASE, chart_values, render_chart  # noqa: E402

MI = 1024 * 1024
TOKEN = "cd" * 16


@dataclass
class Node:
    """One daemon container on a node rooted in a temp directory."""

    root: Path
    pod: podspec.RunningPod
    parent: str
    api: DaemonClient
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def socket(self) -> Path:
        return self.root / "var/run/flexnpu/daemon.sock"

    def adopted(self) -> bool:
        """The new daemon answers, has adopted, and runs every claim's aclserver as before."""
        try:
            if not self.api.health().adopted:
                return False
            ents = {e.entity_id: e for e in self.api.list()}
        except Exception:
            return False
        return {k: v.pid for k, v in ents.items() if str(v.state) == "Running"} == self.pids


class Caller:
    """One client session calling its share in a loop; records when each call was answered."""

    def __init__(self, conf: Path) -> None:
        self.session = Session.open(conf)
        self.session.init()
        self.session.set_device(0)
        self.answered: list[float] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.session.get_mem_info()
                self.answered.append(time.monotonic())
            except Exception:
                self.failures += 1
            self._stop.wait(0.01)  # the client's own pacing

    def longest_gap(self, start: float, end: float) -> float:
        times = [t for t in self.answered if start <= t <= end]
        return max((b - a for a, b in itertools.pairwise(times)), default=end - start)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.session.close()


@contextlib.contextmanager
def node(base: Path, image: str, name: str) -> Iterator[Node]:
    root = base / name
    parent = f"flexnpu-bench-{uuid.uuid4().hex[:8]}"
    repo, tag = image.rsplit(":", 1)
    values = chart_values(
        {
            "emulated.enabled": True,
            "image.repository": repo,
            "image.tag": tag,
            "image.pullPolicy": "Never",
            "daemon.cgroupParent": parent,
            "emulated.inventory": {
                "driverVersion": "24.1.rc3",
                "firmwareVersion": "7.5.0.1.129",
                "chips": [{"model": "910B3", "card": i, "mode": "soft"} for i in range(8)],
            },
        }
    )
    docs = {f"{d['kind']}/{d['metadata']['name']}": d for d in render_chart(values)}
    configmaps = {d["metadata"]["name"]: d for d in docs.values() if d["kind"] == "ConfigMap"}
    shm = root / "dev/shm"
    shm.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4g,mode=1777", "fx-bench-shm", str(shm)], check=True)
    subprocess.run(["mount", "--make-shared", str(shm)], check=True)
    cgroup_fs = root / "sys/fs/cgroup"
    cgroup_fs.mkdir(parents=True)
    subprocess.run(["mount", "--rbind", "/sys/fs/cgroup", str(cgroup_fs)], check=True)
    subprocess.run(["mount", "--make-rprivate", str(cgroup_fs)], check=True)
    sa = podspec.write_service_account(root / "sa", b"", RELEASE["Namespace"])
    pod: podspec.RunningPod | None = None
    try:
        where = podspec.NodeRoot(root, "bench-node", "127.0.0.1", 1, sa)
        pod = podspec.start_pod(
            docs["DaemonSet/flexnpu-daemon"], where, configmaps, namespace=RELEASE["Namespace"]
        )
        n = Node(root, pod, parent, DaemonClient(root / "var/run/flexnpu/daemon.sock", timeout=5))
        wait(n.adopted, 120, f"{name}: daemon ready")
        yield n
    finally:
        if pod is not None:
            pod.remove()
        with contextlib.suppress(Exception):
            remove_cgroups(parent)
        podspec.unmount_under(root)


def register(n: Node, count: int) -> list[Path]:
    """``count`` one-share claims; the host-side client.conf of each."""
    confs = []
    for i in range(count):
        uid = str(uuid.uuid4())
        share = Share(0, i % 8, 128 * MI, 5, "fixed")
        res = n.api.register(RegisterRequest(uid, "bench", f"c{i}", TOKEN, (share,)))
        n.pids[uid] = res.pid
        host_shm = n.root / res.endpoints.shm_dir.lstrip("/")
        conf = clientconf.ClientConf(
            claim_uid=uid,
            token=TOKEN,
            endpoints=clientconf.Endpoints(unix=str(host_shm / Path(res.endpoints.unix_socket).name)),
            shm_dir=str(host_shm),
            shares=(clientconf.ShareInfo(0, 128 * MI, 5, Policy.FIXED),),
        )
        path = n.root / f"client-{uid}.conf"
        path.write_text(clientconf.render(conf))
        confs.append(path)
    return confs


def wait(cond: Any, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise SystemExit(f"timed out: {what}")
        time.sleep(0.005)  # polling a condition for the measurement, not a test synchronisation
    return time.monotonic() - t0


def restart(n: Node) -> float:
    """Stop the daemon container (SIGTERM), start it again; seconds until it serves and has adopted."""
    t0 = time.monotonic()
    n.pod.stop()
    n.pod.start_again("daemon")
    try:
        wait(n.adopted, 120, "re-adoption")
    except SystemExit:
        print(n.pod.logs("daemon")[-3000:], file=sys.stderr)
        raise
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("-n", type=int, default=16, help="live claims on the loaded node")
    parser.add_argument("-r", type=int, default=20, help="restarts of each node's daemon container")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    built = img.build()
    base = Path(tempfile.mkdtemp(prefix="fxr", dir="/tmp"))
    loaded_t: list[float] = []
    empty_t: list[float] = []
    gaps: list[float] = []
    failures = 0
    same_pids = True
    try:
        with node(base, built.image, "loaded") as loaded, node(base, built.image, "empty") as empty:
            callers = [Caller(c) for c in register(loaded, args.n)]
            try:
                wait(lambda: all(c.answered for c in callers), 30, "every session answering")
                for _ in range(args.r):
                    empty_t.append(restart(empty))
                    start = time.monotonic()
                    loaded_t.append(restart(loaded))
                    mark = time.monotonic()
                    wait(
                        lambda m=mark: all(c.answered and c.answered[-1] > m for c in callers),
                        30,
                        "calls after",
                    )
                    end = time.monotonic()
                    gaps.append(max(c.longest_gap(start, end) for c in callers))
                    same_pids &= loaded.adopted()
                failures = sum(c.failures for c in callers)
            finally:
                for c in callers:
                    c.close()
                with contextlib.suppress(Exception):
                    for uid in loaded.pids:
                        loaded.api.unregister(uid)
                loaded.api.close()
                empty.api.close()
    finally:
        shutil.rmtree(base, ignore_errors=True)
    base_p50 = statistics.median(empty_t)
    figures = {
        "claims": args.n,
        "restarts": args.r,
        "control_plane_p50_ms": round(statistics.median(loaded_t) * 1000, 1),
        "control_plane_p99_ms": round(pct(loaded_t, 0.99) * 1000, 1),
        "baseline_p50_ms": round(base_p50 * 1000, 1),
        "baseline_p99_ms": round(pct(empty_t, 0.99) * 1000, 1),
        "ratio_p50": round(statistics.median(loaded_t) / base_p50, 2),
        "session_gap_p50_ms": round(statistics.median(gaps) * 1000, 1),
        "session_gap_p99_ms": round(pct(gaps, 0.99) * 1000, 1),
        "failed_calls": failures,
        "same_pids": same_pids,
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    print(f"daemon container restart (stop + start), {args.r} times, interleaved with an empty node's:")
    print(
        f"  {args.n} live claims: served again p50 {ms(statistics.median(loaded_t))}, p99 {ms(pct(loaded_t, 0.99))}"
    )
    print(
        f"  no claims (baseline): p50 {ms(base_p50)}, p99 {ms(pct(empty_t, 0.99))}; ratio p50 {figures['ratio_p50']}x"
    )
    print(
        f"  sessions: longest interval between answered calls p50 {ms(statistics.median(gaps))},"
        f" p99 {ms(pct(gaps, 0.99))}; failed calls {failures}; same aclserver PIDs throughout: {same_pids}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

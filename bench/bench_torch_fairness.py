"""Two PyTorch tenants on one die, fixed 30 % and 70 %, both looping matmuls (issue 24, "Done when").

Two aclservers (separate processes, as flexnpu-daemon runs one per share) serve one share each of the same
emulated die, fixed policy, 30 % and 70 %, through one die ledger. In each, an unmodified torch program
(``bench/_torch_tenant.py``, torch 2.13.0 CPU + torch-npu 2.13.0 from ``scripts/torch-venv.sh``) multiplies
two N x N float32 matrices in a loop (default N 384: 2.3 ms of modelled die time per product,
``operators/cost.py``), synchronizing every K products. Where the programs run:

* default (host): the bench starts the two aclservers itself (``aclserver_harness``) and runs each program on
  the host with the share's client libraries preloaded (as the CDI spec's ``/etc/ld.so.preload`` does) and
  its ``client.conf``;
* ``--podman`` (two pods): the real node process and flexnpu-daemon (``bench/_node.py``'s cluster: fake API
  server, scheduler stand-in, kubelet simulator over the plugin's gRPC socket) prepare two claims of the
  ``vnpu-fixed`` class on the same die, compute 30 and 70 with a ``VnpuConfig`` of policy ``fixed``; the
  daemon starts their aclservers and the node writes their CDI specs. Each program runs in its own podman
  container given only its claim's CDI device, in the image ``tests/e2e/test_podman_torch.py`` builds
  (busybox, the system Python, the torch venv and stdlib bind-mounted read-only).

After a warm-up, the die time each share consumed is read from the ledger (``consumed_us`` of each aclserver's
entry) at the edges of consecutive windows; per window, each tenant's share of die time is its consumed die
time over the window's wall time, and the split is its part of the two tenants' sum. Products completed (the
programs' own counts after each synchronize) are reported per window too. Prints medians, min and max over the
windows against 30/70 +- 3 points, and the load average.
Usage: ``PYTHONPATH=. .venv/bin/python bench/bench_torch_fairness.py [--podman] [--size 384] [--k 128]
[--windows 10] [--window 2]`` (``--podman``: as root, with podman, runc and busybox-static).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from _aclbench import med, workdir
from bench_torch import SOC, preload, torch_python

from flexnpu_runtime.aclserver import ledger
from flexnpu_runtime.aclserver.operators import cost
from flexnpu_testing import aclserver_harness
from flexnpu_wire import clientconf
from flexnpu_wire.codes import Policy

HERE = Path(__file__).resolve().parent
MIB = 1 << 20
QUOTAS = (30, 70)
TOLERANCE = 0.03
TENANT = HERE / "_torch_tenant.py"


class Tenant:
    """One torch program looping matmuls on a share (``argv``: on the host or a podman run of it); its
    (products done, monotonic time) samples, from the lines it prints."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.samples: list[tuple[float, int]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            parts = line.split()
            if len(parts) == 2 and parts[0].isdigit():  # torch_npu prints warnings on stdout too
                with self._lock:
                    self.samples.append((float(parts[1]), int(parts[0])))

    def done(self) -> int:
        with self._lock:
            return self.samples[-1][1] if self.samples else -1

    def ops(self, t0: float, t1: float) -> float:
        """Products completed between t0 and t1 (from the last sample at or before each)."""
        with self._lock:
            samples = list(self.samples)

        def at(t: float) -> int:
            before = [d for s, d in samples if s <= t]
            return before[-1] if before else 0

        return at(t1) - at(t0)

    def check(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"a tenant ended (rc {self.proc.returncode}): {Path(self.log.name).read_text()[-3000:]}"
            )

    def stop(self) -> None:
        """Kill the program (a podman run: ``unshare --kill-child`` takes podman, conmon and the
        container's processes with it; ``Podman.close`` then removes the container)."""
        self.proc.kill()
        self.proc.wait(timeout=30)
        self.log.close()


@dataclasses.dataclass
class Window:
    seconds: float
    die_us: tuple[int, ...]
    kernels: tuple[int, ...]
    ops: tuple[float, ...]

    def share(self, i: int) -> float:
        return self.die_us[i] / 1e6 / self.seconds

    def split(self, i: int) -> float:
        return self.die_us[i] / max(1, sum(self.die_us))


@dataclasses.dataclass
class Setup:
    """Running tenants, one per quota, and how to read their shares' ledger entries."""

    tenants: list[Tenant]
    read: Callable[[], dict[object, ledger.LedgerEntry]]
    """The ledger entries of the die, keyed as ``keys``."""
    keys: list[object]
    """Each tenant's ledger key, in quota order."""


@contextlib.contextmanager
def on_host(
    python: str, work: Path, quotas: Sequence[int], *, kind: str, size: int, k: int
) -> Iterator[Setup]:
    """One aclserver per quota (fixed) on die 0, and the torch program on the host with its conf."""
    ledger_dir = str(work / "ledger")
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(
                aclserver_harness.running_aclserver(
                    work,
                    ledger_dir=ledger_dir,
                    shares=[
                        aclserver_harness.share(0, die=0, memory=1024 * MIB, compute=pct, policy=Policy.FIXED)
                    ],
                )
            )
            for pct in quotas
        ]
        tenants = []
        for pct, server in zip(quotas, servers, strict=True):
            conf = work / f"share-{pct}.conf"
            conf.write_text(clientconf.render(dataclasses.replace(server.conf(tcp=False), soc_name=SOC)))
            env = {**os.environ, "FLEXNPU_CONF": str(conf), "LD_PRELOAD": preload()}
            argv = [python, str(TENANT), kind, str(size), str(k)]
            tenants.append(Tenant(argv, env, work / f"share-{pct}.torch.log"))
            stack.callback(tenants[-1].stop)

        def read() -> dict[object, ledger.LedgerEntry]:
            return {e.pid: e for e in ledger.read_entries(ledger_dir, 0)}

        yield Setup(tenants, read, [s.proc.pid for s in servers])


@contextlib.contextmanager
def in_podman(
    python: str, work: Path, quotas: Sequence[int], *, kind: str, size: int, k: int
) -> Iterator[Setup]:
    """Two pods: claims prepared by the real node process + daemon, one podman container per claim."""
    from _node import CLASSES, cluster  # the node side: only for --podman

    from dra_driver.daemon_api.values import LEDGER_DIR_NAME
    from flexnpu_testing import clibrary
    from flexnpu_testing.podman import Podman
    from tests.e2e.test_podman_models import _phy, _prepare
    from tests.e2e.test_podman_torch import _image
    from tests.integration.conftest import CLASSES as TEST_CLASSES

    reason = Podman.ensure_available()
    if reason is not None:
        raise SystemExit(f"--podman: {reason}")
    venv = Path(python).parent.parent
    stdlib = f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}"
    memory = f"{max(256, 2 * size + 128) if kind == 'gather' else 256}Mi"  # a gather's table must fit
    classes = (*CLASSES, ("vnpu-fixed.flexnpu.io", TEST_CLASSES["vnpu-fixed.flexnpu.io"]))
    library = clibrary.build_library()
    with contextlib.ExitStack() as stack:
        node = stack.enter_context(
            cluster(
                work / "node",
                classes=classes,
                FLEXNPU_DEFAULT_MODE="both",
                FLEXNPU_CLIENT_LIBRARY=str(library),
            )
        )
        assert node.daemon is not None
        podman = stack.enter_context(Podman())
        _image(podman, venv, work / "image")
        (podman.rootfs / "app" / TENANT.name).write_text(TENANT.read_text())
        phy = _phy(node)
        claims = [_prepare(node, f"tenant-{pct}", compute=pct, phy=phy, memory=memory) for pct in quotas]
        command = f"exec env HOME=/tmp {python} /app/{TENANT.name} {kind} {size} {k}"
        tenants = []
        for pct, (uid, cdi_ids) in zip(quotas, claims, strict=True):
            print(f"  pod of the {pct} % claim ({uid}): podman run --device {' --device '.join(cdi_ids)}")
            argv = podman.command(
                podman.run_args(cdi_ids=cdi_ids, command=command, read_only=[str(venv), stdlib]),
                cdi_spec_dir=node.dirs["cdi"].resolve(),
            )
            tenants.append(Tenant(argv, podman.env(), work / f"share-{pct}.torch.log"))
            stack.callback(tenants[-1].stop)
        ledger_dir = node.daemon.shm_root / LEDGER_DIR_NAME
        uids = [uid for uid, _ids in claims]
        dies = {
            int(f.name.removeprefix("die-").removesuffix(".ledger")) for f in ledger_dir.glob("die-*.ledger")
        }
        (die,) = [
            d for d in dies if set(uids) <= {e.claim_uid for e in ledger.read_entries(str(ledger_dir), d)}
        ]
        print(
            f"  die {die}: its ledger holds the entry of every claim's aclserver ({len(uids)}), started by the daemon"
        )

        def read() -> dict[object, ledger.LedgerEntry]:
            return {e.claim_uid: e for e in ledger.read_entries(str(ledger_dir), die)}

        yield Setup(tenants, read, list(uids))


def measure(
    setup: Setup, *, k: int, windows: int, window: float, warm: float, start_timeout: float
) -> list[Window]:
    """Wait for every tenant's first batch and the warm-up; then the windows, from the ledger."""
    pause = threading.Event()
    tenants = setup.tenants
    deadline = time.monotonic() + start_timeout
    while min(t.done() for t in tenants) < k:  # both started and completed a first batch
        for t in tenants:
            t.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the tenants did not start within {start_timeout:.0f} s")
        pause.wait(0.2)
    pause.wait(warm)

    def read() -> tuple[float, dict[object, ledger.LedgerEntry]]:
        return time.monotonic(), setup.read()

    out = []
    t0, e0 = read()
    for _ in range(windows):
        pause.wait(window)
        for t in tenants:
            t.check()
        t1, e1 = read()
        out.append(
            Window(
                t1 - t0,
                tuple(e1[p].consumed_us - e0[p].consumed_us for p in setup.keys),
                tuple(e1[p].kernels - e0[p].kernels for p in setup.keys),
                tuple(t.ops(t0, t1) for t in tenants),
            )
        )
        t0, e0 = t1, e1
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--op", choices=("matmul", "gather"), default="matmul")
    parser.add_argument(
        "--size", type=int, default=0, help="matmul: N (default 384); gather: table MiB (default 384)"
    )
    parser.add_argument("--k", type=int, default=128, help="products per synchronize")
    parser.add_argument("--windows", type=int, default=10)
    parser.add_argument("--window", type=float, default=2.0, help="seconds")
    parser.add_argument("--warm", type=float, default=2.0, help="seconds after both tenants started")
    parser.add_argument(
        "--podman",
        action="store_true",
        help="two pods: claims prepared by the node process + daemon, each program in podman with its CDI device",
    )
    parser.add_argument("--no-alone", action="store_true", help="skip the one-tenant (demand) run")
    args = parser.parse_args()
    python = torch_python()
    size = args.size or 384
    if args.op == "matmul":
        what = f"{size}x{size} float32 matmul"
        op_us = cost.die_time_ns(3 * size * size * 4, 2 * size**3) / 1e3
    else:
        what = f"embedding of 8 rows from a {size} MiB table"
        op_us = cost.die_time_ns((size << 20) + 8 * 8 + 8 * 4096, 0) / 1e3
    load0 = os.getloadavg()
    start = in_podman if args.podman else on_host
    timing = {"k": args.k, "windows": args.windows, "window": args.window, "warm": args.warm}
    start_timeout = 300.0 if args.podman else 180.0

    def run(quotas: tuple[int, ...]) -> list[Window]:
        with workdir() as work, start(python, work, quotas, kind=args.op, size=size, k=args.k) as setup:
            return measure(setup, start_timeout=start_timeout, **timing)

    got = run(QUOTAS)
    alone = [] if args.no_alone else run((100,))  # what one tenant uses of a die it has alone: its demand
    load1 = os.getloadavg()
    where = (
        "two pods in podman, each given only its claim's CDI device (claims prepared by the node process + daemon)"
        if args.podman
        else "two programs on the host with their shares' client.conf (no podman)"
    )
    print(
        f"fixed 30/70, two torch tenants on one die, {where}: {what} ({op_us / 1e3:.2f} ms of modelled"
        f" die time each), K {args.k}, {args.windows} windows of {args.window:.1f} s; load average {load0[0]:.1f} before,"
        f" {load1[0]:.1f} after (1 min), {os.cpu_count()} cores"
    )
    for i, pct in enumerate(QUOTAS):
        shares = [w.share(i) for w in got]
        splits = [w.split(i) for w in got]
        ops = sum(w.ops[i] for w in got) / sum(w.seconds for w in got)  # a sample per K: whole run
        per_op = [w.die_us[i] / w.kernels[i] / 1e3 for w in got if w.kernels[i]]
        err = (med(shares) - pct / 100) * 100
        print(
            f"  share {pct}%: die time p50 {med(shares) * 100:5.1f}% (min {min(shares) * 100:5.1f}, max {max(shares) * 100:5.1f})"
            f" {err:+.1f} pts {'within' if abs(err) <= TOLERANCE * 100 else 'OUTSIDE'} +-3;"
            f" split p50 {med(splits) * 100:5.1f}%; products/s {ops:6.1f};"
            f" ledger die time per kernel p50 {med(per_op) if per_op else 0:.2f} ms"
        )
    ratio = sum(w.ops[1] for w in got) / max(1.0, sum(w.ops[0] for w in got))
    print(
        f"  products ratio (70/30) over the run {ratio:.2f}"
        f" (7/3 = {7 / 3:.2f}); die busy p50 {med([sum(w.die_us) / 1e6 / w.seconds for w in got]) * 100:.1f}%"
    )
    if not alone:
        return
    demand = [w.share(0) for w in alone]
    print(
        f"  one tenant alone on a fixed 100 % share (its demand): die time p50 {med(demand) * 100:5.1f}%"
        f" (min {min(demand) * 100:5.1f}, max {max(demand) * 100:5.1f}); products/s {sum(w.ops[0] for w in alone) / sum(w.seconds for w in alone):6.1f}"
    )


if __name__ == "__main__":
    main()

"""Two PyTorch tenants on one die, fixed 30 % and 70 %, both looping matmuls (issue 24, "Done when").

Two aclservers (separate processes, as flexnpu-daemon runs one per share) serve one share each of the same
emulated die, fixed policy, 30 % and 70 %, through one die ledger. In each, an unmodified torch program
(``bench/_torch_matmul.py``, torch 2.13.0 CPU + torch-npu 2.13.0 from ``scripts/torch-venv.sh``) runs on the
host with the share's client libraries preloaded (as the CDI spec's ``/etc/ld.so.preload`` does) and its
``client.conf``, not in podman: it multiplies two N x N float32 matrices in a loop (default N 384: 2.3 ms of
modelled die time per product, ``operators/cost.py``), synchronizing every K products.

After a warm-up, the die time each share consumed is read from the ledger (``consumed_us`` of each aclserver's
entry) at the edges of consecutive windows; per window, each tenant's share of die time is its consumed die
time over the window's wall time, and the split is its part of the two tenants' sum. Products completed (the
programs' own counts after each synchronize) are reported per window too. Prints medians, min and max over the
windows against 30/70 +- 3 points, and the load average.
Usage: ``.venv/bin/python bench/bench_torch_fairness.py [--n 384] [--k 4] [--windows 10] [--window 2]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import subprocess
import threading
import time
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


class Tenant:
    """One torch program looping matmuls on a share; its (products done, monotonic time) samples."""

    def __init__(self, python: str, conf: Path, kind: str, size: int, k: int) -> None:
        self.log = (conf.parent / f"{conf.stem}.torch.log").open("w")
        env = {**os.environ, "FLEXNPU_CONF": str(conf), "LD_PRELOAD": preload()}
        self.proc = subprocess.Popen(
            [python, str(HERE / "_torch_tenant.py"), kind, str(size), str(k)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )  # fmt: skip
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


def measure(
    python: str,
    work: Path,
    quotas: tuple[int, ...],
    *,
    kind: str,
    size: int,
    k: int,
    windows: int,
    window: float,
    warm: float,
) -> list[Window]:
    """One aclserver and one tenant per quota (fixed), all on die 0; the windows after the warm-up."""
    ledger_dir = str(work / "ledger")
    pause = threading.Event()
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
            tenants.append(Tenant(python, conf, kind, size, k))
            stack.callback(tenants[-1].stop)
        deadline = time.monotonic() + 180
        while min(t.done() for t in tenants) < k:  # both started and completed a first batch
            for t in tenants:
                t.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the tenants did not start within 180 s")
            pause.wait(0.2)
        pause.wait(warm)
        pids = [s.proc.pid for s in servers]

        def read() -> tuple[float, dict[int, ledger.LedgerEntry]]:
            return time.monotonic(), {e.pid: e for e in ledger.read_entries(ledger_dir, 0)}

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
                    tuple(e1[p].consumed_us - e0[p].consumed_us for p in pids),
                    tuple(e1[p].kernels - e0[p].kernels for p in pids),
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
    opts = {
        "kind": args.op,
        "size": size,
        "k": args.k,
        "windows": args.windows,
        "window": args.window,
        "warm": args.warm,
    }
    with workdir() as work:
        got = measure(python, work, QUOTAS, **opts)  # type: ignore[arg-type]
    with workdir() as work:  # what one such tenant uses of a die it has alone (fixed 100 %): its demand
        alone = measure(python, work, (100,), **opts)  # type: ignore[arg-type]
    load1 = os.getloadavg()
    print(
        f"fixed 30/70, two torch tenants on one die: {what} ({op_us / 1e3:.2f} ms of modelled"
        f" die time each), {args.windows} windows of {args.window:.1f} s; load average {load0[0]:.1f} before,"
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
    demand = [w.share(0) for w in alone]
    print(
        f"  one tenant alone on a fixed 100 % share (its demand): die time p50 {med(demand) * 100:5.1f}%"
        f" (min {min(demand) * 100:5.1f}, max {max(demand) * 100:5.1f}); products/s {sum(w.ops[0] for w in alone) / sum(w.seconds for w in alone):6.1f}"
    )


if __name__ == "__main__":
    main()
